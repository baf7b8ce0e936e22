"""Quest on the GPU: page metadata update and page selection, two launches per selection.

- `quest_update_meta`: one program per (request, KV head) recomputes the touched pages.
- `quest_select`: (1) `_quest_score_kernel` reads each full page's min/max once, spread over
  (request, page block) programs, and writes one fp32 score per page; (2) `_quest_pick_kernel`,
  one program per request, finds the take-th largest score by a bitwise search on its
  order-preserving integer key (the row held in registers), then writes the chosen pages'
  token positions in ascending page order, the partial page after them and -1 past n_idx.
  The first is bound by the metadata bytes; the second reads the [B, P] scores back from the
  L2 and writes the index list. Ties at the take-th score go to the smaller page index, as
  `reference.quest_select` does.

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
SCORE_PROGRAMS_PER_SM = 4  # target programs per SM of the scoring launch


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
    Q, KMIN, KMAX, CTX, OUT, HQ, HKV, P,
    G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_P: tl.constexpr, PAGE: tl.constexpr,
):
    """OUT[b, p] = page p's score for the full pages of [0, ctx); -inf for the others, whose
    metadata is not read (a block past the last full page loads nothing)."""
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
    tl.store(OUT + b * P + pages, tl.where(pages < full, acc, float("-inf")), mask=pages < P)


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


def quest_select(
    q: Tensor, kmin: Tensor, kmax: Tensor, context: Tensor, n_pages: Tensor,
    max_pages: int | None = None, *, score_block_p: int | None = None,
    score_warps: int = SCORE_WARPS, pick_warps: int = PICK_WARPS,
) -> tuple[Tensor, Tensor]:
    """Same contract as `reference.quest_select`: indices [B, K] int32, n_idx [B] int32; one
    host sync (K depends on max n_pages) unless `max_pages` is given (then capturable in a
    CUDA graph). Two launches (`quest_scores`, `quest_pick`); the keyword knobs are their
    launch settings (None / defaults: `score_block`, SCORE_WARPS, PICK_WARPS)."""
    n_max = reference.quest_page_bound(n_pages, max_pages)
    ctx = context.to(device=q.device, dtype=torch.int32).contiguous()
    scores = quest_scores(q, kmin, kmax, ctx, block_p=score_block_p, num_warps=score_warps)
    return quest_pick(scores, ctx, n_pages, n_max, num_warps=pick_warps)


def quest_scores(q: Tensor, kmin: Tensor, kmax: Tensor, context: Tensor, *,
                 block_p: int | None = None, num_warps: int = SCORE_WARPS) -> Tensor:
    """[B, P] fp32 page scores of the full pages of [0, context), -inf past them."""
    B, Hq, D = q.shape
    P, Hkv = kmin.shape[1], kmin.shape[2]
    assert kmin.is_contiguous() and kmax.is_contiguous()
    ctx = context.to(device=q.device, dtype=torch.int32).contiguous()
    scores = torch.empty(B, P, dtype=torch.float32, device=q.device)
    if B == 0:
        return scores
    G = Hq // Hkv
    block_p = score_block(B, P, num_sms(q.device)) if block_p is None else block_p
    _quest_score_kernel[(B, triton.cdiv(P, block_p))](
        q.contiguous(), kmin, kmax, ctx, scores, Hq, Hkv, P,
        G=G, BLOCK_G=next_pow2(G), D=D, BLOCK_D=max(16, next_pow2(D)), BLOCK_P=block_p,
        PAGE=QUEST_PAGE, num_warps=num_warps,
    )
    return scores


def quest_pick(scores: Tensor, context: Tensor, n_pages: Tensor, n_max: int, *,
               num_warps: int = PICK_WARPS) -> tuple[Tensor, Tensor]:
    """The index list of `quest_select` from the page scores [B, P]: K = 16·(n_max + 1)
    columns, n_max >= every n_pages."""
    B, P = scores.shape
    dev = scores.device
    K = QUEST_PAGE * (n_max + 1) if B else 0
    out = torch.empty(B, K, dtype=torch.int32, device=dev)
    n_out = torch.empty(B, dtype=torch.int32, device=dev)
    if B == 0:
        return out, n_out
    whole = P <= PICK_WHOLE_MAX
    _quest_pick_kernel[(B,)](
        scores, context.to(device=dev, dtype=torch.int32).contiguous(),
        n_pages.to(device=dev, dtype=torch.int32).contiguous(), out, n_out, P, K, n_max,
        BLOCK=max(16, next_pow2(P)) if whole else 16, WHOLE=whole, CHUNK=PICK_CHUNK,
        PAGE=QUEST_PAGE, num_warps=num_warps,
    )
    return out, n_out


def score_block(batch: int, pages: int, n_sms: int) -> int:
    """Pages per scoring program: SCORE_PROGRAMS_PER_SM programs per SM over the batch's
    pages, 16 to 64 pages a program (a power of two)."""
    want = max(1, batch * pages // (SCORE_PROGRAMS_PER_SM * n_sms))
    return min(64, max(16, next_pow2(want)))
