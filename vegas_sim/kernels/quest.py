"""Quest on the GPU: page metadata update and page selection.

- `quest_update_meta`: one program per (request, KV head) recomputes the touched pages.
- `quest_select` scores the pages, then picks them. `_quest_score_wide_kernel` (the default)
  reads each full page's min/max once, every KV head of a block of pages in one load, spread
  over (request, page block) programs, and writes one fp32 score per page; it is bound by the
  metadata bytes (read with the evict-first policy: used once). `_quest_score_kernel`
  (looped over the KV heads, kept for comparison) has fewer bytes in flight per program. The
  pick finds the take-th largest score on its order-preserving 32-bit integer key, exactly,
  then writes the chosen pages' token positions in ascending page order, the partial page
  after them and -1 past n_idx. Ties at the take-th score go to the smaller page index, as
  `reference.quest_select` does. Three picks:
  - "radix" (the default): a radix select of three digits (11, 11 and 10 bits of the key),
    each level a histogram counted by atomics (integer counts: the same on every run) over
    (request, chunk of pages) programs, so that every launch spreads over the GPU at any
    batch. The scoring launch counts the first digit of every full page's key (the histograms
    are zeroed before it); `_quest_level_kernel` twice: every program resolves the previous
    level from its histogram (the digit where the count at or above first reaches take) and
    counts the next digit of its chunk's keys that share the prefix so far; the second also
    stores a summary of its chunk against the 22-bit prefix it resolved (`_chunk_summary`).
    `_quest_write_sum_kernel` resolves the last level — the take-th key t and the count
    above it — and each program writes its chunk's chosen pages at their slots, which it
    finds by summing the summaries of the chunks before its own (counting those chunks'
    keys only where a summary cannot tell). Five launches (the zeroing included), each
    short and wide; a program's work grows with the pages of a request only by the
    summaries it sums (or the chunks it must count).
  - "radix_rescan" (runtime revision 7's default, kept for comparison): the same levels
    (chunks of 256 pages) without the summaries; `_quest_write_kernel` finds the slots by
    counting the keys > t and == t of every page before its chunk, work that grows with
    the pages before it.
  - "search": `_quest_pick_kernel`, one program per request, finds the key by a bitwise
    search (the row held in registers, or read chunk by chunk from the L2), then writes the
    list. Two launches in all, but at a small batch the pick is a few programs on the whole
    GPU, bound by their instructions; kept for comparison (docs/KERNELS.md, Quest).

Score of page p: Σ_h Σ_d max(q_hd·kmax_pd, q_hd·kmin_pd) over the query heads h of each KV
head. Since kmax >= kmin, max(q·kmax, q·kmin) = max(q, 0)·kmax + min(q, 0)·kmin, so per KV head
the G query heads fold into two vectors Σ_g max(q, 0) and Σ_g min(q, 0) first: each page costs
2·D multiply-adds per KV head and its metadata is read once. fp32 throughout; the sums run in
another order than the reference's, so scores agree to fp32 rounding (identical pages give
bit-identical scores in both).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from vegas_sim.kernels import reference
from vegas_sim.kernels.reference import QUEST_PAGE
from vegas_sim.kernels.verify_launch import next_pow2, num_sms

PICK_WARPS = 8
SCORE_WARPS = 4
# Pages a request's scores may span for the pick kernel to hold them in registers (64 keys a
# thread at 8 warps); longer rows are searched chunk by chunk from the L2.
PICK_WHOLE_MAX = 16384
PICK_CHUNK = 1024  # pages per step of the chunked search and of the index write-out
SCORE_PROGRAMS_PER_SM = 4  # target programs per SM of the looped scoring launch
# quest_select's scoring kernel: the wide one (every KV head of a page block in one tile),
# faster than the looped one at every shape timed (docs/KERNELS.md, Quest selection).
SCORE_WIDE = True
# Metadata elements per tensor in one wide program's tile [pages, Hkv, D]: 8 pages at
# Qwen3-8B's 8 x 128, the best page count timed there.
WIDE_TILE = 8192
# quest_select's picks, the default first: the radix levels with per-chunk counts, the same
# levels whose write re-counts the pages before its chunk (runtime revision 7's), the search
PICKS = ("radix", "radix_rescan", "search")
RADIX_CHUNK = 128  # pages per program of the radix pick's launches (docs/KERNELS.md, Quest)
RESCAN_CHUNK = 256  # the same for "radix_rescan"
# The wide scoring kernel loads the metadata, read once, with the evict-first policy: the L2
# keeps what the pick and the layer read again (docs/KERNELS.md, Quest, chunk summaries).
EVICT_FIRST = True
RADIX_WARPS = 4
# The radix pick's three levels over the 32-bit order key: digits of 11, 11 and 10 bits.
RADIX_LEVELS = tl.constexpr(3)
RADIX_BINS = tl.constexpr(2048)  # bins per level's histogram (the widest digit)
RADIX_SHIFT0 = tl.constexpr(21)  # the first digit: key >> 21
RADIX_SHIFT1 = tl.constexpr(10)  # the second: (key >> 10) & 2047; the third: key & 1023
RADIX_LOW = tl.constexpr(1023)  # the third digit's mask
RADIX_FILL = 1024  # columns per step of the -1 fill ("radix_rescan")
RADIX_FILL_MAX = 8192  # the "radix" write's -1 fill: one step of its share, up to this wide
RADIX_ROW = 2048  # pages per step of the write's count of the pages before its chunk
# The "radix" write's chunk summaries (`_chunk_summary`), read in blocks of up to this many
RADIX_SUMMARY_BLOCK = 1024


@triton.jit
def _quest_meta_kernel(
    KMIN, KMAX, K, START, END, HKV, P, stride_kb, stride_ks,
    D: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    start = tl.load(START + b)
    end = tl.load(END + b)
    offs_t = tl.arange(0, PAGE)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    for page in range(start // PAGE, (end + PAGE - 1) // PAGE):
        pos = page * PAGE + offs_t
        ok = (pos < end)[:, None] & d_ok[None, :]
        off = b.to(tl.int64) * stride_kb + pos.to(tl.int64)[:, None] * stride_ks + kvh * D
        k = tl.load(K + off + offs_d[None, :], mask=ok, other=0.0).to(tl.float32)
        hi = tl.max(tl.where(ok, k, float("-inf")), 0)
        lo = tl.min(tl.where(ok, k, float("inf")), 0)
        m_off = ((b * P + page) * HKV + kvh).to(tl.int64) * D + offs_d
        tl.store(KMAX + m_off, hi.to(KMAX.dtype.element_ty), mask=d_ok)
        tl.store(KMIN + m_off, lo.to(KMIN.dtype.element_ty), mask=d_ok)


def quest_update_meta(
    kmin: Tensor, kmax: Tensor, k_cache: Tensor, start: Tensor, end: Tensor
) -> None:
    """Triton launcher; same contract as `reference.quest_update_meta` (no host sync)."""
    B, P, Hkv, D = kmin.shape
    assert kmin.is_contiguous() and kmax.is_contiguous() and k_cache.stride(3) == 1
    start = start.to(device=k_cache.device, dtype=torch.int32).contiguous()
    end = end.to(device=k_cache.device, dtype=torch.int32).contiguous()
    _quest_meta_kernel[(B, Hkv)](
        kmin, kmax, k_cache, start, end, Hkv, P, k_cache.stride(0), k_cache.stride(1),
        D=D, BLOCK_D=max(16, next_pow2(D)), PAGE=QUEST_PAGE, num_warps=4,
    )


@triton.jit
def _quest_score_kernel(
    Q, KMIN, KMAX, CTX, OUT, HIST, HQ, HKV, P,
    G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_P: tl.constexpr, PAGE: tl.constexpr, NB: tl.constexpr, WITH_HIST: tl.constexpr,
):
    """OUT[b, p] = page p's score for the full pages of [0, ctx); -inf for the others, whose
    metadata is not read (a block past the last full page loads nothing). WITH_HIST: also
    counts the full pages' first radix digit into HIST[b, 0] (the radix pick's first level)."""
    b = tl.program_id(0)
    p0 = tl.program_id(1) * BLOCK_P
    pages = p0 + tl.arange(0, BLOCK_P)
    full = tl.minimum(tl.load(CTX + b) // PAGE, P)
    offs_d = tl.arange(0, BLOCK_D)
    offs_g = tl.arange(0, BLOCK_G)
    d_ok = offs_d < D
    ok = (pages < full)[:, None] & d_ok[None, :]
    acc = tl.zeros([BLOCK_P], tl.float32)
    n_heads = tl.where(p0 < full, HKV, 0)
    for kvh in range(n_heads):
        q_off = (b * HQ + kvh * G + offs_g) * D  # [BLOCK_G] rows of q [B, HQ, D]
        qg = tl.load(Q + q_off[:, None] + offs_d[None, :],
                     mask=(offs_g < G)[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        q_pos = tl.sum(tl.maximum(qg, 0.0), 0)  # [BLOCK_D] Σ_g max(q, 0)
        q_neg = tl.sum(tl.minimum(qg, 0.0), 0)  # [BLOCK_D] Σ_g min(q, 0)
        m_off = ((b * P + pages) * HKV + kvh).to(tl.int64)[:, None] * D + offs_d[None, :]
        hi = tl.load(KMAX + m_off, mask=ok, other=0.0).to(tl.float32)
        lo = tl.load(KMIN + m_off, mask=ok, other=0.0).to(tl.float32)
        acc += tl.sum(hi * q_pos[None, :] + lo * q_neg[None, :], 1)
    _store_scores(OUT, HIST, b, P, pages, full, acc, NB, WITH_HIST)


@triton.jit
def _store_scores(OUT, HIST, b, P, pages, full, acc, NB: tl.constexpr,
                  WITH_HIST: tl.constexpr):
    """OUT[b, pages] = acc on the full pages, -inf on the others; WITH_HIST: the full pages'
    first radix digits counted into HIST[b, 0]."""
    tl.store(OUT + b * P + pages, tl.where(pages < full, acc, float("-inf")), mask=pages < P)
    if WITH_HIST:
        digit = _order_key(acc) >> RADIX_SHIFT0
        tl.atomic_add(HIST + b * (RADIX_LEVELS * NB) + digit, 1, mask=pages < full,
                      sem="relaxed")


@triton.jit
def _quest_score_wide_kernel(
    Q, KMIN, KMAX, CTX, OUT, HIST, HQ, P,
    HKV: tl.constexpr, BLOCK_H: tl.constexpr, G: tl.constexpr, BLOCK_G: tl.constexpr,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr, PAGE: tl.constexpr,
    NB: tl.constexpr, WITH_HIST: tl.constexpr, EVICT: tl.constexpr,
):
    """`_quest_score_kernel`'s scores with every KV head of a page block in one tile
    [BLOCK_P, HKV, D] (one load of all its metadata, no loop over heads): short programs,
    many bytes in flight each."""
    b = tl.program_id(0)
    p0 = tl.program_id(1) * BLOCK_P
    pages = p0 + tl.arange(0, BLOCK_P)
    full = tl.minimum(tl.load(CTX + b) // PAGE, P)
    offs_h = tl.arange(0, BLOCK_H)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    hd_ok = (offs_h < HKV)[:, None] & (offs_d < D)[None, :]  # [BLOCK_H, BLOCK_D]
    # q [B, HQ, D] as [BLOCK_H, BLOCK_G, BLOCK_D]: query head kvh * G + g
    q_off = ((b * HQ + offs_h[:, None, None] * G + offs_g[None, :, None]) * D
             + offs_d[None, None, :])
    q_ok = hd_ok[:, None, :] & (offs_g < G)[None, :, None]
    qg = tl.load(Q + q_off, mask=q_ok, other=0.0).to(tl.float32)
    q_pos = tl.sum(tl.maximum(qg, 0.0), 1)  # [BLOCK_H, BLOCK_D] Σ_g max(q, 0)
    q_neg = tl.sum(tl.minimum(qg, 0.0), 1)  # [BLOCK_H, BLOCK_D] Σ_g min(q, 0)
    m_off = (((b * P + pages) * HKV).to(tl.int64)[:, None, None] * D
             + (offs_h[:, None] * D + offs_d[None, :])[None, :, :])
    ok = (pages < full)[:, None, None] & hd_ok[None, :, :]
    if EVICT:  # read once: leave the L2 to what the later launches and the layer reuse
        hi = tl.load(KMAX + m_off, mask=ok, other=0.0, eviction_policy="evict_first")
        lo = tl.load(KMIN + m_off, mask=ok, other=0.0, eviction_policy="evict_first")
    else:
        hi = tl.load(KMAX + m_off, mask=ok, other=0.0)
        lo = tl.load(KMIN + m_off, mask=ok, other=0.0)
    hi = hi.to(tl.float32)
    lo = lo.to(tl.float32)
    acc = tl.sum(tl.sum(hi * q_pos[None, :, :] + lo * q_neg[None, :, :], 2), 1)
    _store_scores(OUT, HIST, b, P, pages, full, acc, NB, WITH_HIST)


@triton.jit
def _order_key(s):
    """fp32 [N] -> int64 keys in [0, 2^32) that order like the floats (negatives reversed)."""
    bits = s.to(tl.int32, bitcast=True)
    signed = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return signed.to(tl.int64) + 2147483648


@triton.jit
def _row_keys(ROW, offs, full):
    """Keys of the pages `offs` of one request's score row; -1 (below every key) past full."""
    s = tl.load(ROW + offs, mask=offs < full, other=0.0)
    return tl.where(offs < full, _order_key(s), -1)


@triton.jit
def _count_ge(ROW, keys, c, full, WHOLE: tl.constexpr, CHUNK: tl.constexpr):
    """Pages whose key is >= c: from the keys in registers (WHOLE) or chunk by chunk."""
    if WHOLE:
        n = tl.sum((keys >= c).to(tl.int32), 0)
    else:
        n = full * 0
        for c0 in range(0, full, CHUNK):
            k = _row_keys(ROW, c0 + tl.arange(0, CHUNK), full)
            n += tl.sum((k >= c).to(tl.int32), 0)
    return n


# max_take changes with every calibration grid's largest budget: not specialised (== 1,
# divisible by 16), so that one compiled kernel serves them all
@triton.jit(do_not_specialize=["max_take"])
def _quest_pick_kernel(
    SCORES, CTX, N_PAGES, OUT, N_OUT, P, K_COLS, max_take,
    BLOCK: tl.constexpr, WHOLE: tl.constexpr, CHUNK: tl.constexpr, PAGE: tl.constexpr,
):
    """Program b: the take = min(n_pages, full, max_take) pages of the highest score among the
    full pages [0, full), ties at the take-th score by smaller page index; OUT[b] = their
    token positions (16 a page, ascending pages), then the partial page [16·full, ctx), then
    -1 up to K_COLS; N_OUT[b] = the count of positions."""
    b = tl.program_id(0)
    ctx = tl.load(CTX + b)
    full = tl.minimum(ctx // PAGE, P)
    take = tl.minimum(tl.minimum(tl.load(N_PAGES + b), full), max_take)
    row = SCORES + b.to(tl.int64) * P
    if WHOLE:
        keys = _row_keys(row, tl.arange(0, BLOCK), full)
    else:
        keys = tl.zeros([BLOCK], tl.int64)  # unused: _count_ge reads the row chunk by chunk
    # t = the largest key with at least `take` keys >= t (the take-th largest), bit by bit.
    # One count a pass: three counts packed in one int64 reduction (16 passes) measured
    # slower (docs/KERNELS.md, Quest).
    t = take.to(tl.int64) * 0
    for bit in tl.static_range(31, -1, -1):
        c = t | (1 << bit)
        t = tl.where(_count_ge(row, keys, c, full, WHOLE, CHUNK) >= take, c, t)
    t = tl.where(take > 0, t, 1 << 32)  # take 0: no key qualifies
    n_above = _count_ge(row, keys, t + 1, full, WHOLE, CHUNK)
    ties_left = take - n_above  # of the keys equal to t, the first ties_left pages
    out = OUT + b.to(tl.int64) * K_COLS
    offs_t = tl.arange(0, PAGE)
    slot = take * 0
    for c0 in range(0, full, CHUNK):
        pages = c0 + tl.arange(0, CHUNK)
        k = _row_keys(row, pages, full)
        tie = k == t
        tie_rank = tl.cumsum(tie.to(tl.int32), 0) - tie.to(tl.int32)
        sel = (k > t) | (tie & (tie_rank < ties_left))
        pos = slot + tl.cumsum(sel.to(tl.int32), 0) - sel.to(tl.int32)  # [CHUNK] output page slot
        tok = pages[:, None] * PAGE + offs_t[None, :]  # [CHUNK, PAGE]
        tl.store(out + pos[:, None] * PAGE + offs_t[None, :], tok, mask=sel[:, None])
        slot += tl.sum(sel.to(tl.int32), 0)
        ties_left -= tl.sum(tie.to(tl.int32), 0)
    # the current partial page [16·full, ctx), then -1
    n_part = ctx - full * PAGE
    tl.store(out + take * PAGE + offs_t, full * PAGE + offs_t, mask=offs_t < n_part)
    n_out = take * PAGE + n_part
    for c0 in range(n_out, K_COLS, CHUNK):
        col = c0 + tl.arange(0, CHUNK)
        tl.store(out + col, tl.full([CHUNK], -1, tl.int32), mask=col < K_COLS)
    tl.store(N_OUT + b, n_out)


@triton.jit
def _resolve(HIST, prefix, above, take, BITS: tl.constexpr, NB: tl.constexpr):
    """One radix level: among the keys whose higher digits are `prefix` (`above` keys lie
    above them), the digit d holding the take-th largest key, from the level's histogram
    HIST[NB] of their next BITS bits: d is the highest digit with at least take - above keys
    at or above it. Returns (prefix << BITS | d, above + the keys of digits above d)."""
    d = tl.arange(0, NB)
    h = tl.load(HIST + d)
    ge = tl.sum(h, 0) - tl.cumsum(h, 0) + h  # keys at digit >= d
    pick = tl.max(tl.where(ge >= take - above, d, 0), 0)
    gt = tl.sum(tl.where(d > pick, h, 0), 0)
    return (prefix << BITS) | pick.to(tl.int64), above + gt.to(tl.int64)


@triton.jit
def _take(CTX, N_PAGES, b, P, max_take, PAGE: tl.constexpr):
    """(ctx, full, take) of request b: full pages of [0, ctx), pages to choose."""
    ctx = tl.load(CTX + b)
    full = tl.minimum(ctx // PAGE, P)
    take = tl.minimum(tl.minimum(tl.load(N_PAGES + b), full), max_take)
    return ctx, full, take


@triton.jit(do_not_specialize=["max_take"])
def _quest_level_kernel(
    SCORES, CTX, N_PAGES, HIST, STATE, SUMMARY, P, max_take, n_chunks,
    LEVEL: tl.constexpr, PREV_BITS: tl.constexpr, SHIFT: tl.constexpr, WIDTH: tl.constexpr,
    NB: tl.constexpr, CH: tl.constexpr, PAGE: tl.constexpr, SUMMARIZE: tl.constexpr,
):
    """Program (b, chunk), LEVEL 1 or 2: resolves level LEVEL - 1 (its digit PREV_BITS wide)
    from its histogram, every program alike; program 0 keeps the result in STATE[b, LEVEL - 1].
    Then counts the digit of level LEVEL ((key >> SHIFT) & (2^WIDTH - 1)) of its chunk's keys
    that share the resolved prefix into HIST[b, LEVEL]. SUMMARIZE (the "radix" pick): the
    chunk's keys are loaded first, beside the histogram, and level 2 stores the chunk's
    `_chunk_summary` in SUMMARY[b, chunk] for the write."""
    b = tl.program_id(0)
    c = tl.program_id(1)
    _, full, take = _take(CTX, N_PAGES, b, P, max_take, PAGE)
    pages = c * CH + tl.arange(0, CH)
    if SUMMARIZE:
        k = _row_keys(SCORES + b.to(tl.int64) * P, pages, full)
    hist = HIST + b * (RADIX_LEVELS * NB)
    zero = take.to(tl.int64) * 0
    if LEVEL == 1:
        prev_prefix = zero
        prev_above = zero
    else:
        prev_prefix = tl.load(STATE + b * 4 + 2 * (LEVEL - 2))
        prev_above = tl.load(STATE + b * 4 + 2 * (LEVEL - 2) + 1)
    prefix, above = _resolve(hist + (LEVEL - 1) * NB, prev_prefix, prev_above, take,
                             PREV_BITS, NB)
    if c == 0:
        tl.store(STATE + b * 4 + 2 * (LEVEL - 1), prefix)
        tl.store(STATE + b * 4 + 2 * (LEVEL - 1) + 1, above)
    if not SUMMARIZE:
        k = _row_keys(SCORES + b.to(tl.int64) * P, pages, full)
    match = (k >= 0) & ((k >> (SHIFT + WIDTH)) == prefix)
    digit = (k >> SHIFT) & ((1 << WIDTH) - 1)
    tl.atomic_add(hist + LEVEL * NB + digit, 1, mask=match, sem="relaxed")
    if SUMMARIZE:
        if LEVEL == 2:
            tl.store(SUMMARY + b * n_chunks + c, _chunk_summary(k, prefix))


@triton.jit
def _chunk_summary(k, prefix):
    """What the write needs of a chunk's keys k once the 22-bit prefix of the take-th key is
    known: the keys above the prefix (all above the take-th key), the keys on it, and the
    lowest and highest of their last 10 bits, packed 16 bits each in one int64. With at most
    two keys on the prefix, or none between those bounds and the last digit, the counts > t
    and == t follow from it; otherwise the write counts the chunk's keys."""
    hi = k >> RADIX_SHIFT1
    on = (k >= 0) & (hi == prefix)
    n_gt_on = tl.sum(((k >= 0) & (hi > prefix)).to(tl.int32) + (on.to(tl.int32) << 16), 0)
    low = k & RADIX_LOW
    lo_min = tl.min(tl.where(on, low, RADIX_LOW), 0)
    lo_max = tl.max(tl.where(on, low, 0), 0)
    return n_gt_on.to(tl.int64) | (lo_min.to(tl.int64) << 32) | (lo_max.to(tl.int64) << 48)


@triton.jit
def _summed_counts(summary, d):
    """Over chunk summaries [S] (0 for none) and the take-th key's last digit d: the keys > t,
    the keys == t, and the chunks whose summary cannot tell (three or more keys on the
    prefix, with d between the lowest and highest of their last digits), packed 21 bits
    each in one int64 sum."""
    n_gt = summary & 0xFFFF
    n_on = (summary >> 16) & 0xFFFF
    lo_min = (summary >> 32) & 0xFFFF
    lo_max = summary >> 48
    above = lo_min > d
    below = lo_max < d
    flat = lo_min == lo_max  # every key on the prefix has one last digit (d, if not above)
    gt = n_gt + tl.where(above, n_on, tl.where(below | flat, 0, (lo_max > d).to(tl.int64)))
    two = (lo_min == d).to(tl.int64) + (lo_max == d).to(tl.int64)
    eq = tl.where(above | below, 0, tl.where(flat, n_on, two))
    unknown = (n_on >= 3) & ~(above | below | flat)
    return tl.sum(gt + (eq << 21) + (unknown.to(tl.int64) << 42), 0)


@triton.jit(do_not_specialize=["max_take"])
def _quest_write_kernel(
    SCORES, CTX, N_PAGES, HIST, STATE, OUT, N_OUT, P, K_COLS, max_take, n_chunks,
    NB: tl.constexpr, CH: tl.constexpr, PAGE: tl.constexpr, ROW: tl.constexpr,
    FILL: tl.constexpr,
):
    """Program (b, chunk): resolves the last level (t = the take-th largest key, exactly, and
    the count of keys above it), then writes the token positions of its chunk's chosen pages
    at their slots of the ascending list: pages with key > t, and of those tied at t the
    first take - above by page index; the slots before the chunk come from counting the keys
    of the pages before it. Program 0 writes the partial page and N_OUT[b]; the -1 past
    n_idx is shared out among the chunk programs."""
    b = tl.program_id(0)
    c = tl.program_id(1)
    ctx, full, take = _take(CTX, N_PAGES, b, P, max_take, PAGE)
    t, above = _resolve(HIST + b * (RADIX_LEVELS * NB) + 2 * NB, tl.load(STATE + b * 4 + 2),
                        tl.load(STATE + b * 4 + 3), take, RADIX_SHIFT1, NB)
    t = tl.where(take > 0, t, 1 << 32)  # take 0: no key qualifies
    ties_left = tl.where(take > 0, take - above, 0)  # the first ties_left keys equal to t
    row = SCORES + b.to(tl.int64) * P
    n_gt, n_eq = _count_before(row, t, tl.minimum(full, c * CH), ROW)
    pages = c * CH + tl.arange(0, CH)
    out = OUT + b.to(tl.int64) * K_COLS
    _write_pages(out, pages, _row_keys(row, pages, full), t, n_gt, n_eq, ties_left, PAGE)
    _write_tail(out, N_OUT, b, c, ctx, full, take, K_COLS, n_chunks, PAGE, FILL)


@triton.jit(do_not_specialize=["max_take"])
def _quest_write_sum_kernel(
    SCORES, CTX, N_PAGES, HIST, STATE, SUMMARY, OUT, N_OUT, P, K_COLS, max_take, n_chunks,
    NB: tl.constexpr, CH: tl.constexpr, PAGE: tl.constexpr, ROW: tl.constexpr,
    FILL: tl.constexpr, SB: tl.constexpr,
):
    """`_quest_write_kernel`'s list (the "radix" pick), with the keys > t and == t before the
    chunk summed from the summaries of the chunks before it (`_chunk_summary`, stored by the
    last level) instead of counted from their pages, which it does only where a summary
    cannot tell. Every load that does not need t (the chunk's keys, the summaries, the
    last level's state) comes first, then the writes that do not either (the partial page,
    N_OUT[b], the program's share of the -1 fill, one step of FILL columns)."""
    b = tl.program_id(0)
    c = tl.program_id(1)
    ctx, full, take = _take(CTX, N_PAGES, b, P, max_take, PAGE)
    row = SCORES + b.to(tl.int64) * P
    pages = c * CH + tl.arange(0, CH)
    k = _row_keys(row, pages, full)
    offs_s = tl.arange(0, SB)
    summary = tl.load(SUMMARY + b * n_chunks + offs_s, mask=offs_s < c, other=0)
    prefix = tl.load(STATE + b * 4 + 2)
    prev_above = tl.load(STATE + b * 4 + 3)
    out = OUT + b.to(tl.int64) * K_COLS
    _write_tail(out, N_OUT, b, c, ctx, full, take, K_COLS, n_chunks, PAGE, FILL)
    t, above = _resolve(HIST + b * (RADIX_LEVELS * NB) + 2 * NB, prefix, prev_above, take,
                        RADIX_SHIFT1, NB)
    t = tl.where(take > 0, t, 1 << 32)  # take 0: no key qualifies
    ties_left = tl.where(take > 0, take - above, 0)  # the first ties_left keys equal to t
    d = t & RADIX_LOW
    packed = _summed_counts(summary, d)
    for s0 in range(SB, c, SB):  # more chunks before this one than a block holds
        more = tl.load(SUMMARY + b * n_chunks + s0 + offs_s, mask=s0 + offs_s < c, other=0)
        packed += _summed_counts(more, d)
    field = (1 << 21) - 1
    n_gt = (packed & field).to(tl.int32)
    n_eq = ((packed >> 21) & field).to(tl.int32)
    if (packed >> 42) > 0:  # a chunk before this one holds keys its summary cannot order
        n_gt, n_eq = _count_before(row, t, tl.minimum(full, c * CH), ROW)
    _write_pages(out, pages, k, t, n_gt, n_eq, ties_left, PAGE)


@triton.jit
def _write_tail(out, N_OUT, b, c, ctx, full, take, K_COLS, n_chunks, PAGE: tl.constexpr,
                FILL: tl.constexpr):
    """The list's columns that do not depend on which pages are chosen: program 0 writes the
    partial page [16·full, ctx) at take·16 and N_OUT[b]; every program its share of the -1
    past n_idx."""
    n_part = ctx - full * PAGE
    n_out = take * PAGE + n_part
    if c == 0:
        offs_t = tl.arange(0, PAGE)
        tl.store(out + take * PAGE + offs_t, full * PAGE + offs_t, mask=offs_t < n_part)
        tl.store(N_OUT + b, n_out)
    span = tl.cdiv(K_COLS - n_out, n_chunks)
    lo = n_out + c * span
    hi = tl.minimum(lo + span, K_COLS)
    for j in range(lo, hi, FILL):
        col = j + tl.arange(0, FILL)
        tl.store(out + col, tl.full([FILL], -1, tl.int32), mask=col < hi)


@triton.jit
def _count_before(row, t, before, ROW: tl.constexpr):
    """The keys > t and == t among a request's pages [0, before), ROW pages a step."""
    n_gt = before * 0
    n_eq = before * 0
    for s0 in range(0, before, ROW):
        k = _row_keys(row, s0 + tl.arange(0, ROW), before)
        n_gt += tl.sum((k > t).to(tl.int32), 0)
        n_eq += tl.sum((k == t).to(tl.int32), 0)
    return n_gt, n_eq


@triton.jit
def _write_pages(out, pages, k, t, n_gt, n_eq, ties_left, PAGE: tl.constexpr):
    """The token positions of a chunk's chosen pages (keys k) at their slots of the list:
    pages with key > t, and of those tied at t the first ties_left by page index, after the
    n_gt keys > t and n_eq keys == t of the pages before the chunk. One prefix sum of both
    counts, packed: a chunk's page j sits at slot (keys > t before it) + min(keys == t
    before it, ties_left)."""
    gt = (k > t).to(tl.int32)
    eq = (k == t).to(tl.int32)
    both = gt + (eq << 16)
    before = tl.cumsum(both, 0) - both
    eq_before = n_eq + (before >> 16)
    sel = (gt > 0) | ((eq > 0) & (eq_before < ties_left))
    slot = n_gt + (before & 0xFFFF) + tl.minimum(eq_before, ties_left)
    offs_t = tl.arange(0, PAGE)
    tl.store(out + slot[:, None] * PAGE + offs_t[None, :], pages[:, None] * PAGE + offs_t[None, :],
             mask=sel[:, None])


def quest_select(
    q: Tensor, kmin: Tensor, kmax: Tensor, context: Tensor, n_pages: Tensor,
    max_pages: int | None = None, *, score_block_p: int | None = None,
    score_warps: int = SCORE_WARPS, score_wide: bool = SCORE_WIDE, pick: str = PICKS[0],
    pick_warps: int = PICK_WARPS, radix_chunk: int | None = None,
    evict_first: bool | None = None,
) -> tuple[Tensor, Tensor]:
    """Same contract as `reference.quest_select`: indices [B, K] int32, n_idx [B] int32; one
    host sync (K depends on max n_pages) unless `max_pages` is given (then capturable in a
    CUDA graph). `pick` chooses how the pages are picked from the scores: "radix" (the
    scoring launch counts the first radix digit, then `quest_pick_radix`'s three launches of
    (request, chunk) programs), "radix_rescan" (the same, its write re-counting the pages
    before each chunk) or "search" (`quest_pick`, one program per request). The other
    keywords are launch settings (None / defaults: `wide_block` or `score_block`, SCORE_WARPS,
    PICK_WARPS for the search, RADIX_CHUNK pages a radix program); score_wide: which scoring
    kernel (`quest_scores`' wide); evict_first: the wide scoring kernel's metadata loads
    (None: EVICT_FIRST, but not for "radix_rescan", which runs as revision 7 did)."""
    assert pick in PICKS, pick
    n_max = reference.quest_page_bound(n_pages, max_pages)
    ctx = context.to(device=q.device, dtype=torch.int32).contiguous()
    rescan = pick == "radix_rescan"  # runtime revision 7's selection, kept as it ran
    evict = (EVICT_FIRST and not rescan) if evict_first is None else evict_first
    if pick == "search":
        scores = quest_scores(q, kmin, kmax, ctx, block_p=score_block_p, num_warps=score_warps,
                              wide=score_wide, evict_first=evict)
        return quest_pick(scores, ctx, n_pages, n_max, num_warps=pick_warps)
    hist = radix_histograms(q.shape[0], q.device)
    scores = quest_scores(q, kmin, kmax, ctx, block_p=score_block_p, num_warps=score_warps,
                          hist=hist, wide=score_wide, evict_first=evict)
    return quest_pick_radix(scores, hist, ctx, n_pages, n_max, chunk=radix_chunk,
                            rescan=rescan)


def radix_histograms(batch: int, device: torch.device) -> Tensor:
    """Zeroed [B, RADIX_LEVELS, RADIX_BINS] int32 counts for one radix pick."""
    return torch.zeros(batch, RADIX_LEVELS.value, RADIX_BINS.value, dtype=torch.int32,
                       device=device)


def quest_scores(q: Tensor, kmin: Tensor, kmax: Tensor, context: Tensor, *,
                 block_p: int | None = None, num_warps: int = SCORE_WARPS,
                 hist: Tensor | None = None, wide: bool = SCORE_WIDE,
                 evict_first: bool = EVICT_FIRST) -> Tensor:
    """[B, P] fp32 page scores of the full pages of [0, context), -inf past them; with `hist`
    (`radix_histograms`), their first radix digits are counted into hist[:, 0]. `wide` (the
    default, SCORE_WIDE): the kernel that loads every KV head of its pages at once
    (`_quest_score_wide_kernel`; block_p then defaults to `wide_block`; evict_first: with
    the evict-first policy), else the one looped over the KV heads (block_p: `score_block`)."""
    B, Hq, D = q.shape
    P, Hkv = kmin.shape[1], kmin.shape[2]
    assert kmin.is_contiguous() and kmax.is_contiguous()
    ctx = context.to(device=q.device, dtype=torch.int32).contiguous()
    scores = torch.empty(B, P, dtype=torch.float32, device=q.device)
    if B == 0:
        return scores
    G = Hq // Hkv
    counts = scores if hist is None else hist
    if wide:
        block_p = wide_block(Hkv, D) if block_p is None else block_p
        _quest_score_wide_kernel[(B, triton.cdiv(P, block_p))](
            q.contiguous(), kmin, kmax, ctx, scores, counts, Hq, P, HKV=Hkv,
            BLOCK_H=next_pow2(Hkv), G=G, BLOCK_G=next_pow2(G), D=D,
            BLOCK_D=max(16, next_pow2(D)), BLOCK_P=block_p, PAGE=QUEST_PAGE, NB=RADIX_BINS,
            WITH_HIST=hist is not None, EVICT=evict_first, num_warps=num_warps,
        )
        return scores
    block_p = score_block(B, P, num_sms(q.device)) if block_p is None else block_p
    _quest_score_kernel[(B, triton.cdiv(P, block_p))](
        q.contiguous(), kmin, kmax, ctx, scores, counts, Hq, Hkv, P,
        G=G, BLOCK_G=next_pow2(G), D=D, BLOCK_D=max(16, next_pow2(D)), BLOCK_P=block_p,
        PAGE=QUEST_PAGE, NB=RADIX_BINS, WITH_HIST=hist is not None, num_warps=num_warps,
    )
    return scores


def quest_pick(scores: Tensor, context: Tensor, n_pages: Tensor, n_max: int, *,
               num_warps: int = PICK_WARPS) -> tuple[Tensor, Tensor]:
    """The index list of `quest_select` from the page scores [B, P]: K = 16·(n_max + 1)
    columns, n_max >= every n_pages. One program per request (the "search" pick)."""
    B, P = scores.shape
    dev = scores.device
    out, n_out = _index_buffers(B, n_max, dev)
    if B == 0:
        return out, n_out
    whole = P <= PICK_WHOLE_MAX
    _quest_pick_kernel[(B,)](
        scores, context.to(device=dev, dtype=torch.int32).contiguous(),
        n_pages.to(device=dev, dtype=torch.int32).contiguous(), out, n_out, P, out.shape[1],
        n_max, BLOCK=max(16, next_pow2(P)) if whole else 16, WHOLE=whole, CHUNK=PICK_CHUNK,
        PAGE=QUEST_PAGE, num_warps=num_warps,
    )
    return out, n_out


def quest_pick_radix(scores: Tensor, hist: Tensor, context: Tensor, n_pages: Tensor,
                     n_max: int, *, chunk: int | None = None,
                     rescan: bool = False) -> tuple[Tensor, Tensor]:
    """`quest_pick`'s list from the scores and `hist`, whose first level the scoring launch
    counted: two launches count the second and third digits of the keys under the prefix
    resolved so far, a third writes the list; each over (request, chunk of `chunk` pages)
    programs, so every launch spreads over the GPU whatever the batch. The write finds each
    chunk's first slot from the last level's chunk summaries, or (`rescan`, the
    "radix_rescan" pick) by counting the keys of every page before the chunk."""
    B, P = scores.shape
    dev = scores.device
    out, n_out = _index_buffers(B, n_max, dev)
    if B == 0:
        return out, n_out
    chunk = (RESCAN_CHUNK if rescan else RADIX_CHUNK) if chunk is None else chunk
    assert chunk == next_pow2(chunk) and chunk <= 16384 and P < 1 << 21, (chunk, P)
    ctx = context.to(device=dev, dtype=torch.int32).contiguous()
    n_pg = n_pages.to(device=dev, dtype=torch.int32).contiguous()
    state = torch.empty(B, 2, 2, dtype=torch.int64, device=dev)  # (prefix, above) per level
    n_chunks = triton.cdiv(P, chunk)
    summary = state if rescan else torch.empty(B, n_chunks, dtype=torch.int64, device=dev)
    grid = (B, n_chunks)
    wide = RADIX_SHIFT0.value - RADIX_SHIFT1.value
    for level, prev_bits, shift, width in ((1, 32 - RADIX_SHIFT0.value, RADIX_SHIFT1.value,
                                            wide), (2, wide, 0, RADIX_SHIFT1.value)):
        _quest_level_kernel[grid](
            scores, ctx, n_pg, hist, state, summary, P, n_max, n_chunks, LEVEL=level,
            PREV_BITS=prev_bits, SHIFT=shift, WIDTH=width, NB=RADIX_BINS, CH=chunk,
            PAGE=QUEST_PAGE, SUMMARIZE=not rescan, num_warps=RADIX_WARPS,
        )
    if rescan:
        _quest_write_kernel[grid](
            scores, ctx, n_pg, hist, state, out, n_out, P, out.shape[1], n_max, n_chunks,
            NB=RADIX_BINS, CH=chunk, PAGE=QUEST_PAGE, ROW=RADIX_ROW, FILL=RADIX_FILL,
            num_warps=RADIX_WARPS,
        )
        return out, n_out
    _quest_write_sum_kernel[grid](
        scores, ctx, n_pg, hist, state, summary, out, n_out, P, out.shape[1], n_max, n_chunks,
        NB=RADIX_BINS, CH=chunk, PAGE=QUEST_PAGE, ROW=RADIX_ROW,
        FILL=min(RADIX_FILL_MAX, max(16, next_pow2(triton.cdiv(out.shape[1], n_chunks)))),
        SB=min(RADIX_SUMMARY_BLOCK, max(2, next_pow2(n_chunks))), num_warps=RADIX_WARPS,
    )
    return out, n_out


def _index_buffers(batch: int, n_max: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """The uninitialised index list [B, 16·(n_max + 1)] and n_idx [B], both int32."""
    K = QUEST_PAGE * (n_max + 1) if batch else 0
    return (torch.empty(batch, K, dtype=torch.int32, device=device),
            torch.empty(batch, dtype=torch.int32, device=device))


def wide_block(n_kv_heads: int, head_dim: int) -> int:
    """Pages per wide scoring program: WIDE_TILE metadata elements a tile, 1 to 64 pages (a
    power of two)."""
    per_page = next_pow2(n_kv_heads) * max(16, next_pow2(head_dim))
    return min(64, next_pow2(max(1, WIDE_TILE // per_page)))


def score_block(batch: int, pages: int, n_sms: int) -> int:
    """Pages per scoring program: SCORE_PROGRAMS_PER_SM programs per SM over the batch's
    pages, 16 to 64 pages a program (a power of two)."""
    want = max(1, batch * pages // (SCORE_PROGRAMS_PER_SM * n_sms))
    return min(64, max(16, next_pow2(want)))
