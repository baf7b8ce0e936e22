"""Top-k by sampled bracket + radix select on the fp32 bit pattern: `radix_topk` replaces
`torch.topk(weights, k, dim=-1, sorted=False)` for selection, with no host synchronisation and
no atomics: each row's indices come out in the same order on every run.

Weights are >= 0, so their int32 bit patterns order like the values. Three launches, all
capturable in a CUDA graph (their times, and torch.topk's: docs/KERNELS.md, Radix top-k):

  1. `_sample_kernel`, one program per row: a stratified sample of SAMPLE patterns (one at a
     jittered position in each of SAMPLE equal strata) and its order statistics a few
     standard deviations either side of the k-th largest's expected rank: t_lo <= t_hi. With
     high probability the row has < k patterns above t_hi and >= k at or above t_lo. (A row
     of S <= SAMPLE is sampled whole: t_lo = t_hi = the k-th value.)
  2. `_compact_kernel`, `split` programs (parts) per row: the only full read of the rows.
     Each part writes, into its own region of two scratch lists, the positions of patterns
     > t_hi (winners) and the patterns in [t_lo, t_hi] (candidates, pattern << 32 |
     position, a small share of a row), both in position order, and counts them.
  3. `_refine_kernel`, one program per row: checks the bracket with the two counts (a row
     whose bracket missed — rare by the normal tail, or adversarial data — takes its whole
     row as the list: still correct, slower), then radix-selects the k - n_won
     largest of the candidates, part by part: each pass histograms (tl.histogram, 64
     buckets) the patterns in the current range [lo, hi] (the k-th largest is in it), bucket
     0 holding exactly lo and the others 2^sh patterns each, and keeps the bucket where the
     count at or above first reaches the k_rem still wanted, until the range is one pattern
     or all of it is wanted. When more than k_rem copies of one pattern remain, the k_rem
     smallest positions are taken, found by the same radix passes over key = S−1−position.
     Then it writes the winners part by part, and the candidates it selected in list
     order: every row's output is three ascending runs — the winners, the candidates above
     the k-th value, the candidates tied at it (a missed bracket: the last two only).

Reserving list slots by atomics makes the index order vary from run to run, and
`topk_select` must then sort the indices; a fully sorted output (a count per part, then a
second full-row pass that writes the selected positions in order) pays for that extra pass
and its per-part counting. Both are slower than these three runs.

Why it is built so (the measurements: docs/KERNELS.md, Radix top-k):
- a classic radix select over the full rows (a 64-bucket tl.histogram pass per digit, split
  over programs, histograms combined by atomics) is slow per pass: tl.histogram is
  instruction-bound (ballots and popcounts per element), several times a plain read. The
  sample finds a bracket from a small share of the row.
- tl.sort of the sample is much slower than the bitwise binary search (_sample_kernel). A
  smaller sample is faster to take but leaves more candidates a row; SAMPLE was the best
  total.
- the compaction's per-block atomic with the default acq_rel semantics fences each block
  behind the previous block's scattered stores; it is relaxed. One atomic per program
  (counting first, then re-reading from L2) was slower.
- one row per program for the full-row pass leaves some SMs with two rows: it is split over
  PROGRAMS_PER_SM programs per SM in all (`split`).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from vegas_sim.kernels.verify_launch import next_pow2

LOG2_BINS = 6  # 64 buckets a radix pass: tl.histogram's cost grows with the bucket count
SAMPLE = 4096  # sampled patterns per row (a power of 2: tl.arange)
SAMPLE_SIGMAS = 5.0  # bracket half-width in binomial standard deviations of the sample rank
# Launch settings; the alternatives measured: docs/KERNELS.md, Radix top-k.
BLOCK_DEFAULT = 1024  # elements per step of the full-row pass
WARPS_DEFAULT = 4
SAMPLE_WARPS = 8
REFINE_BLOCK = 512  # elements per step of the refinement (a part's list: ~360 at 15 parts)
REFINE_WARPS = 4
PROGRAMS_PER_SM = 16  # target programs per SM of the full-row pass
# Parts (programs) per row of the full-row pass, at most; also the kernels' PARTS constexpr,
# fixed so that one compiled kernel serves every row length and row count. With PARTS =
# next_pow2(parts of this call), every new context of a calibration at B = 1 would compile
# the kernels again (docs/KERNELS.md, Radix top-k).
MAX_PARTS = 64
MAX_PATTERN = tl.constexpr(0x7FFFFFFF)  # the largest int32: +inf and NaN patterns included


# The budget-dependent integers are not specialised (Triton compiles a kernel again for each
# new pattern of "== 1" / "divisible by 16" among its integer arguments): a calibration meets
# a new budget at every context, and _refine_kernel is slow to compile (docs/KERNELS.md,
# Radix top-k).
@triton.jit(do_not_specialize=["r_hi", "r_lo"])
def _sample_kernel(BITS, STATE, S, r_hi, r_lo, NS: tl.constexpr, WHOLE: tl.constexpr):
    """Program row: STATE[row] = (t_lo, t_hi), t_hi the r_hi-th largest sampled pattern
    (MAX_PATTERN when r_hi = 0: nothing is surely in), t_lo the r_lo-th.
    Sample i is at i·S/NS plus a jitter inside its stratum (spread, and no aliasing with
    periodic rows). Both order statistics by one bitwise binary search (the r-th largest is
    the largest T with count(x >= T) >= r): 31 packed count reductions over the sample in
    registers, faster than tl.sort (docs/KERNELS.md, Radix top-k)."""
    row = tl.program_id(0)
    i = tl.arange(0, NS)
    if WHOLE:  # S <= NS: the whole row, padded with -1 (below every pattern)
        bits = tl.load(BITS + row.to(tl.int64) * S + i, mask=i < S, other=-1)
    else:
        jitter = (((i * 40503) & 0xFFFF).to(tl.int64) * (S // NS)) >> 16
        pos = (i.to(tl.int64) * S) // NS + jitter  # [NS] inside [i·S/NS, (i+1)·S/NS)
        bits = tl.load(BITS + row.to(tl.int64) * S + pos)
    t_hi = row * 0
    t_lo = row * 0
    for b in tl.static_range(30, -1, -1):
        c_hi = t_hi | (1 << b)
        c_lo = t_lo | (1 << b)
        both = tl.sum((bits >= c_hi).to(tl.int32) + ((bits >= c_lo).to(tl.int32) << 16), 0)
        t_hi = tl.where((both & 0xFFFF) >= r_hi, c_hi, t_hi)
        t_lo = tl.where((both >> 16) >= r_lo, c_lo, t_lo)
    tl.store(STATE + row * 2, t_lo)
    tl.store(STATE + row * 2 + 1, tl.where(r_hi == 0, MAX_PATTERN, t_hi))


@triton.jit
def _split_counts(win, cand):
    """Exclusive in-block positions and totals of two predicates [BLOCK] with one scan: the
    counts share an int32 (winners in the low 16 bits; BLOCK <= 16384 keeps both exact)."""
    packed = win.to(tl.int32) | (cand.to(tl.int32) << 16)
    incl = tl.cumsum(packed, 0)
    tot = tl.sum(packed, 0)
    w_pos = (incl & 0xFFFF) - win.to(tl.int32)
    c_pos = (incl >> 16) - cand.to(tl.int32)
    return w_pos, c_pos, tot & 0xFFFF, tot >> 16


@triton.jit
def _compact_kernel(
    BITS, STATE, WINS, CANDS, WIN_POS, SCRATCH, S, n_blocks, blocks_per_prog,
    BLOCK: tl.constexpr, PARTS: tl.constexpr,
):
    """Program (row, part) over blocks [part·bpp, (part + 1)·bpp) — the part's region of the
    row, and of the row's two scratch lists: positions of patterns > t_hi → WIN_POS, patterns
    in [t_lo, t_hi] → SCRATCH as pattern << 32 | position, both in position order from the
    region's start; the counts → WINS / CANDS[row, part]. No atomics: every list is the same
    on every run (slots reserved by atomics would make the output order vary)."""
    row = tl.program_id(0)
    part = tl.program_id(1)
    t_lo = tl.load(STATE + row * 2)
    t_hi = tl.load(STATE + row * 2 + 1)
    base = BITS + row.to(tl.int64) * S
    b0 = part * blocks_per_prog
    region = row.to(tl.int64) * S + b0 * BLOCK
    n_win = t_lo * 0
    n_cand = t_lo * 0
    for blk in range(b0, tl.minimum(b0 + blocks_per_prog, n_blocks)):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        bits = tl.load(base + offs, mask=offs < S, other=-1)
        win = bits > t_hi
        cand = (bits >= t_lo) & (bits <= t_hi)
        w_pos, c_pos, tw, tc = _split_counts(win, cand)
        tl.store(WIN_POS + region + n_win + w_pos, offs, mask=win)
        tl.store(SCRATCH + region + n_cand + c_pos,
                 (bits.to(tl.int64) << 32) | offs.to(tl.int64), mask=cand)
        n_win += tw
        n_cand += tc
    tl.store(WINS + row * PARTS + part, n_win)
    tl.store(CANDS + row * PARTS + part, n_cand)


@triton.jit
def _shift(lo, hi, NB: tl.constexpr):
    """A pass buckets (bits - lo - 1) >> sh + 1 for bits in (lo, hi]: the smallest sh with
    (hi - lo - 1) >> sh <= NB - 2 (a static loop: no clz in long-stable triton.language)."""
    span = hi - lo - 1
    sh = span * 0
    for j in tl.static_range(31):
        sh += ((span >> j) > NB - 2).to(tl.int32)
    return sh


@triton.jit
def _digit(bits, lo, hi, sh):
    """Bucket of each pattern [BLOCK]: 0 for lo itself (a tie class found in one pass, e.g.
    the 0.0 past rank_len), 1 + (bits - lo - 1) >> sh for (lo, hi], 0 for patterns outside
    the range (bucket 0 is only ever over-counted, which cannot move the choice: _pick)."""
    return tl.where((bits > lo) & (bits <= hi), ((bits - lo - 1) >> sh) + 1, 0)


@triton.jit
def _pick(hist, k_rem, NB: tl.constexpr):
    """hist [NB] → (d, gt, cnt): d the highest bucket with >= k_rem patterns at or above it,
    gt the count above d, cnt the count in d. Bucket 0 may also hold patterns outside the
    range (and padding): counts at or above d > 0 are exact, and d = 0 is chosen iff the exact
    count above 0 is < k_rem, so only cnt can be too large, and only when d = 0."""
    idx = tl.arange(0, NB)
    ge = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist  # [NB] patterns in buckets >= idx
    d = tl.max(tl.where(ge >= k_rem, idx, 0), 0)
    gt = tl.sum(tl.where(idx > d, hist, 0), 0)
    cnt = tl.sum(tl.where(idx == d, hist, 0), 0)
    return d, gt, cnt


@triton.jit
def _advance(lo, hi, k_rem, done, hist, sh, NB: tl.constexpr):
    """One pass's choice: the range shrinks to the chosen bucket, k_rem drops by the count
    above it. done: the range is one pattern, or all of it is wanted (cnt == k_rem; a cnt
    over-counted in bucket 0 is moot: that bucket is one pattern). A done state stays."""
    d, gt, cnt = _pick(hist, k_rem, NB)
    lo_n = tl.where(d == 0, lo, lo + 1 + ((d - 1) << sh))
    width = tl.minimum(hi - lo_n, ((sh * 0 + 1) << sh) - 1)  # hi - lo_n: no int32 overflow
    hi_n = tl.where(d == 0, lo, lo_n + width)
    k_n = k_rem - gt
    lo = tl.where(done, lo, lo_n)
    hi = tl.where(done, hi, hi_n)
    k_rem = tl.where(done, k_rem, k_n)
    done = done | (lo == hi) | (cnt == k_n)
    return lo, hi, k_rem, done


@triton.jit
def _segment(CANDS, row, p, valid, S, part_len, PARTS: tl.constexpr):
    """(start, length) of segment p of the row's list: the candidates of part p in SCRATCH,
    or, for a row whose bracket missed, one segment that is the whole row."""
    n = tl.load(CANDS + row * PARTS + p)
    return tl.where(valid, p * part_len, 0), tl.where(valid, n, S)


@triton.jit
def _list_item(SCR, ROW, offs, n, valid):
    """Patterns and positions [BLOCK] at `offs` of a segment of length n: SCRATCH's packed
    entries (valid) or the row itself; -1 patterns past n."""
    v = tl.load(SCR + offs, mask=offs < tl.where(valid, n, 0), other=-1)
    r = tl.load(ROW + offs, mask=offs < tl.where(valid, 0, n), other=-1)
    bits = tl.where(valid, (v >> 32).to(tl.int32), r)
    pos = tl.where(valid, (v & 0xFFFFFFFF).to(tl.int32), offs)
    return bits, pos


@triton.jit
def _histogram(SCR, ROW, CANDS, row, valid, n_seg, S, part_len, lo, hi, sh, lo2, hi2, sh2,
               TIES: tl.constexpr, NB: tl.constexpr, BLOCK: tl.constexpr,
               PARTS: tl.constexpr):
    """One radix pass's histogram over the list, segment by segment: of the patterns'
    digits in (lo, hi] (TIES False), or of key = S-1-pos over the patterns equal to lo,
    digits in (lo2, hi2] (TIES True)."""
    hist = tl.zeros([NB], dtype=tl.int32)
    for p in range(n_seg):
        start, n = _segment(CANDS, row, p, valid, S, part_len, PARTS)
        for j in range(0, n, BLOCK):
            offs = j + tl.arange(0, BLOCK)
            bits, pos = _list_item(SCR + start, ROW, offs, n, valid)
            if TIES:
                key = tl.where(bits == lo, S - 1 - pos, -1)
                hist += tl.histogram(_digit(key, lo2, hi2, sh2), NB)
            else:
                hist += tl.histogram(_digit(bits, lo, hi, sh), NB)
    return hist


@triton.jit(do_not_specialize=["S", "k", "n_parts", "part_len"])
def _refine_kernel(
    BITS, STATE, WINS, CANDS, WIN_POS, OUT, SCRATCH, S, k, n_parts, part_len,
    PASSES: tl.constexpr, NB: tl.constexpr, BLOCK: tl.constexpr, PARTS: tl.constexpr,
):
    """Program row: radix-selects the k_rem = k - n_won largest of the row's list (its
    candidates, part by part, or the whole row if the bracket missed), in at most PASSES
    passes (they always finish), then writes OUT[row]: the winners (> t_hi) of each part in
    turn, then the list's patterns > hi and the k_rem patterns in [lo, hi] — the smallest
    positions among ties at the k-th — in list order. Every step reads lists in a fixed
    order, so OUT is the same on every run."""
    row = tl.program_id(0)
    t_lo = tl.load(STATE + row * 2)
    t_hi = tl.load(STATE + row * 2 + 1)
    parts = tl.arange(0, PARTS)
    n_won = tl.sum(tl.load(WINS + row * PARTS + parts, mask=parts < n_parts, other=0), 0)
    n_cand = tl.sum(tl.load(CANDS + row * PARTS + parts, mask=parts < n_parts, other=0), 0)
    valid = (n_won <= k) & (k <= n_won + n_cand)
    scr = SCRATCH + row.to(tl.int64) * S
    src = BITS + row.to(tl.int64) * S
    n_seg = tl.where(valid, n_parts, 1)
    n = tl.where(valid, n_cand, S)  # a missed bracket: the whole row, from the top
    lo = tl.where(valid, t_lo, 0)
    hi = tl.where(valid, t_hi, MAX_PATTERN)
    w_next = tl.where(valid, n_won, 0)
    k_rem = k - w_next
    done = (lo == hi) | (k_rem == 0) | (k_rem == n)
    for _p in tl.static_range(PASSES):
        sh = _shift(lo, hi, NB)
        hist = _histogram(scr, src, CANDS, row, valid, tl.where(done, 0, n_seg), S, part_len,
                          lo, hi, sh, lo, hi, sh, False, NB, BLOCK, PARTS)
        lo, hi, k_rem, done = _advance(lo, hi, k_rem, done, hist, sh, NB)
    # The k_rem to take from the tie class [lo, hi]: all of it unless the range is one pattern
    # with more than k_rem copies; then the smallest positions, by the same radix select over
    # key = S-1-pos (unique).
    lo2, hi2 = lo * 0 - 1, lo * 0 + (S - 1)  # keys in (lo2, hi2]; non-ties are -1 (bucket 0)
    k2 = k_rem
    done2 = (lo != hi) | (k_rem == 0)
    for q in tl.static_range(PASSES):
        sh2 = _shift(lo2, hi2, NB)
        hist2 = _histogram(scr, src, CANDS, row, valid, tl.where(done2, 0, n_seg), S,
                           part_len, lo, hi, sh2, lo2, hi2, sh2, True, NB, BLOCK, PARTS)
        if q == 0:  # exactly k_rem ties: take them all (lo2 stays -1)
            n_tie = tl.sum(tl.where(tl.arange(0, NB) > 0, hist2, 0), 0)
            done2 = done2 | (n_tie == k2)
        lo2, hi2, k2, done2 = _advance(lo2, hi2, k2, done2, hist2, sh2, NB)
    out = OUT + row.to(tl.int64) * k
    # the compaction's winners, part by part (none when the bracket missed)
    w_at = w_next * 0
    for p in range(tl.where(valid, n_parts, 0)):
        cnt = tl.load(WINS + row * PARTS + p)
        wsrc = WIN_POS + row.to(tl.int64) * S + p * part_len
        for j in range(0, cnt, BLOCK):
            offs = j + tl.arange(0, BLOCK)
            tl.store(out + w_at + offs, tl.load(wsrc + offs, mask=offs < cnt), mask=offs < cnt)
        w_at += cnt
    t_next = k_rem * 0
    for p in range(n_seg):
        start, n_p = _segment(CANDS, row, p, valid, S, part_len, PARTS)
        for j in range(0, n_p, BLOCK):
            offs = j + tl.arange(0, BLOCK)
            bits, pos = _list_item(scr + start, src, offs, n_p, valid)
            win = bits > hi
            tie = (bits >= lo) & (bits <= hi) & (S - 1 - pos >= lo2)
            w_pos, t_pos, n_w, n_t = _split_counts(win, tie)
            t_pos += t_next
            tl.store(out + w_next + w_pos, pos, mask=win)
            tl.store(out + (k - k_rem) + t_pos, pos, mask=tie & (t_pos < k_rem))
            w_next += n_w
            t_next += n_t


def _passes(log2_bins: int) -> int:
    """Radix passes that always finish, from the widest range [0, 2^31 - 1] (as _shift)."""
    nb, span, passes = 1 << log2_bins, MAX_PATTERN.value, 0
    while span > 0:
        sh = next(j for j in range(32) if (span - 1) >> j <= nb - 2)
        span, passes = min(span - 1, (1 << sh) - 1), passes + 1
    return passes


def _ranks(k: int, S: int, ns: int) -> tuple[int, int]:
    """Sample ranks (1 = largest) bracketing the k-th largest of S: SAMPLE_SIGMAS binomial
    standard deviations of the sample count above it, plus 2. Exact when the sample is S."""
    if S <= ns:
        return k, k
    k_s = k * ns / S
    m = SAMPLE_SIGMAS * math.sqrt(max(k_s * (1 - k / S), 1.0)) + 2
    return min(max(math.floor(k_s - m), 0), ns), min(max(math.ceil(k_s + m), 1), ns)


def _split(rows: int, n_blocks: int, device: torch.device) -> int:
    """Programs per row for the full-row pass: ~PROGRAMS_PER_SM per SM over all rows, so that
    144 rows on 132 SMs do not leave a second wave of whole rows."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count \
        if device.type == "cuda" else 4
    return max(1, min(n_blocks, triton.cdiv(PROGRAMS_PER_SM * sms, rows)))


def radix_topk(
    weights: Tensor,
    k: int,
    *,
    block: int | None = None,
    num_warps: int | None = None,
    split: int | None = None,
    sample: int = SAMPLE,
    refine_block: int | None = None,
    log2_bins: int = LOG2_BINS,
) -> Tensor:
    """weights [..., S] fp32 contiguous, every value >= 0 (non-negative floats order like their
    int32 bit patterns), k a host int with 0 <= k <= S. Returns int32 indices [..., k]: for every
    row, the k positions whose values are the k largest of the row (of the values tied at the
    k-th, the smallest positions), in an order that is the same on every run: at most three
    ascending runs (above the sample bracket; above the k-th value; tied at it). No host
    synchronisation (capturable in a CUDA graph).

    Tuning (the defaults are for [144, 131200] on the H200): block, num_warps, split: the
    full-row pass's elements per step (a power of 2, <= 16384), warps and programs per row
    (at most MAX_PARTS);
    sample: sampled patterns per row (a power of 2, <= 16384); refine_block: the refinement's
    elements per step (<= 16384); log2_bins: bits per radix pass (5..8)."""
    assert weights.dtype == torch.float32 and weights.is_contiguous()
    *lead, S = weights.shape
    assert 0 <= k <= S, (k, S)
    dev = weights.device
    rows = math.prod(lead)
    if k == 0 or rows == 0:
        return torch.empty(*lead, k, dtype=torch.int32, device=dev)
    if k == S:  # every position
        return torch.arange(S, dtype=torch.int32, device=dev).expand(*lead, S).contiguous()
    block = min(BLOCK_DEFAULT, max(128, next_pow2(S))) if block is None else block
    refine_block = min(REFINE_BLOCK, max(128, next_pow2(S))) if refine_block is None \
        else refine_block
    for b in (block, refine_block, sample):  # the sampler's counts are 16-bit halves
        assert b <= 16384 and b == next_pow2(b), b
    assert 5 <= log2_bins <= 8, log2_bins
    warps = WARPS_DEFAULT if num_warps is None else num_warps
    n_blocks = triton.cdiv(S, block)
    per_prog = triton.cdiv(n_blocks, min(split or _split(rows, n_blocks, dev), MAX_PARTS))
    n_parts = triton.cdiv(n_blocks, per_prog)  # <= MAX_PARTS
    bits = weights.view(torch.int32).reshape(rows, S)  # the patterns, no copy
    state = torch.empty(rows, 2, dtype=torch.int32, device=dev)  # t_lo, t_hi
    # per part (fixed MAX_PARTS columns, so one compile serves every row shape)
    wins = torch.empty(rows, MAX_PARTS, dtype=torch.int32, device=dev)  # > t_hi
    cands = torch.empty(rows, MAX_PARTS, dtype=torch.int32, device=dev)  # in [t_lo, t_hi]
    win_pos = torch.empty(rows, S, dtype=torch.int32, device=dev)  # per-part regions
    scratch = torch.empty(rows, S, dtype=torch.int64, device=dev)  # pattern << 32 | position
    out = torch.empty(rows, k, dtype=torch.int32, device=dev)
    r_hi, r_lo = _ranks(k, S, sample)
    _sample_kernel[(rows,)](bits, state, S, r_hi, r_lo, NS=sample, WHOLE=S <= sample,
                            num_warps=SAMPLE_WARPS)
    _compact_kernel[(rows, n_parts)](bits, state, wins, cands, win_pos, scratch, S, n_blocks,
                                     per_prog, BLOCK=block, PARTS=MAX_PARTS, num_warps=warps)
    _refine_kernel[(rows,)](bits, state, wins, cands, win_pos, out, scratch, S, k, n_parts,
                            per_prog * block, PASSES=_passes(log2_bins), NB=1 << log2_bins,
                            BLOCK=refine_block, PARTS=MAX_PARTS, num_warps=REFINE_WARPS)
    return out.reshape(*lead, k)
