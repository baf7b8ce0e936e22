"""Verify attention: NQ (1..16) causal rows × GQA over a per-request KV cache, split-KV.

One program = one (request, KV head, KV split). All NQ·G query rows that share a KV head
(G = Hq/Hkv) are packed into one M tile (padded to >= 16) so that `tl.dot` runs on tensor
cores and every K/V tile is read once per KV head — the kernel is bound by KV bytes.
Splits write fp32 partials (output normalised by the split's own softmax sum, plus the
split's log2-sum-exp); `_combine_kernel` merges them, one program per (request, KV head,
packed row), so the merge is one load round trip. With one split the main kernel writes
the final output directly.

Score write-out (Collect-2-Query / collect-all), for every position in [0, S_max) of the
collected rows, in one of two formats (`score_format`; DESIGN.md, score contract):
- "bf16": the raw q·k (fp32 accumulate → bf16), -inf where masked.
- "fp8" (`reference.LogScores`): the online softmax's own exponent d = x − m_new (x the
  base-2 logit, m_new the split's running maximum after the tile, so d <= 0) as float8 e4m3,
  −448 where masked (e4m3fn has no inf), plus m_new as fp32 once per SCORE_TILE keys
  ([B, R, Hq, ceil(S_max / SCORE_TILE)]; a BLOCK_N tile writes BLOCK_N / SCORE_TILE equal
  entries; SCORE_TILE is the smallest collecting BLOCK_N, so the consumer never depends on
  the launch). 1 + 4/SCORE_TILE bytes per key instead of 2: the score bytes compete with the
  KV read stream (docs/KERNELS.md, Collect-2-Query). The fill pass past cache_lens writes
  d = −448, m = −inf.
- The packed rows are ordered row 0, row NQ−1, then rows 1..NQ−2 (`_packed_row`), so the
  first_last rows are the first R·G rows of the M tile: the kernel stores those rows of the
  main score tile (row mask constant along keys → 16-byte stores). A separate dot of the
  collected rows and a dense store of the leading rows cut out of the tile were measured
  slower or no faster (docs/KERNELS.md) and are gone.
- M tile minimum (`default_min_m`): 64 (wgmma on Hopper) for Collect-2-Query with NQ·G > 16,
  else 16. ptxas for sm_90a: M 32 × N 128 with a score store spills at 255 registers and
  adds a shared-memory layout conversion (7 more barriers per tile); M 64 × N 64 uses 196
  registers without spills and one more barrier. On the H200 that halves the first_last
  overhead at NQ 8; without collection and at NQ·G <= 16, M 16 is as fast or faster.
- Every split works on whole BLOCK_N tiles aligned to multiples of BLOCK_N, so the score
  stores need no per-key mask (the tile past cache_lens is -inf by the causal mask); only
  the S_max end needs one, and only when S_max is not a multiple of BLOCK_N (EVEN_S). Keys
  from round_up(cache_lens, BLOCK_N) to S_max are filled with -inf by a store-only pass.
  Allocate S_max as a multiple of 128 for the fast path.
- Hot-loop addresses are an int64 base pointer per program plus int32 tile offsets (the
  launcher refuses caches whose offsets would overflow int32).
- K/V loads: per-thread async copies, or TMA (`VerifyConfig.tma`: host tensor descriptors
  over the [B, S_max, Hkv·D] view) for the whole tiles of a split; the tile that holds the
  last key (slots past cache_lens may hold anything, NaN included, and 0·NaN would poison
  the P·V product) always goes by masked pointer loads.
Attention sinks (gpt-oss, `sinks` [Hq]): one logit per query head in the softmax denominator,
with no value. Added once per row where the softmax ends: in the epilogue of a single-split
launch, else in `_combine_kernel` (m = max(m, sink), l = l·2^(m_old − m) + 2^(sink − m), base
2). HAS_SINKS is a constexpr: without sinks the compiled kernels are the ones before.
Sliding window (gpt-oss's even layers, `window` W > 0): row m also masks keys below
limit − W + 1, and the splits cover only [round_down(L − NQ − W + 1, BLOCK_N), L), so a
window layer reads W + NQ − 1 keys (plus tile alignment), whatever the context. HAS_WINDOW is
a constexpr: without a window the compiled kernels are the ones before.
The launch policy (tile sizes, splits, stages, TMA) is `verify_launch`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from vegas_sim.errors import UserInputError
from vegas_sim.kernels.fit import launch_fitted
from vegas_sim.kernels.reference import SCORE_TILE, LogScores, collect_row_ids, empty_scores
from vegas_sim.kernels.verify_launch import (
    VerifyConfig,
    interpreted,
    kv_descriptor,
    launch_config,
    next_pow2,
    num_sms,
    smaller_configs,
    tma_usable,
)

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
COLLECT_CODE = {"none": 0, "first_last": 1, "all": 2}


@triton.jit
def _packed_row(q_idx, NQ):
    """Query row (0..NQ-1) of packed row group q_idx = m // G: the collected rows first
    (group 0 = row 0, group 1 = row NQ-1), then rows 1..NQ-2, so the Collect-2-Query rows are
    the first R·G rows of the M tile. Groups >= NQ are padding (masked by the caller)."""
    return tl.where(q_idx == 0, 0, tl.where(q_idx == 1, NQ - 1, q_idx - 1))


@triton.jit
def _store_scores(sc_base, row_off, row_ok, n, vals, S_MAX, EVEN_S: tl.constexpr):
    """vals [rows, BLOCK_N] (bf16) to score rows row_off (element offsets from sc_base) at
    keys n; the key mask only where S_max is not a multiple of BLOCK_N (EVEN_S false)."""
    if EVEN_S:
        tl.store(sc_base + row_off[:, None] + n[None, :], vals, mask=row_ok[:, None])
    else:
        tl.store(sc_base + row_off[:, None] + n[None, :], vals,
                 mask=row_ok[:, None] & (n < S_MAX)[None, :])


@triton.jit
def _to_e4m3(x, GRID_FIRST: tl.constexpr):
    """x (fp32, in [−448, 0]) as float8 e4m3, rounded to nearest. GRID_FIRST (the CPU
    interpreter): round to e4m3's grid in fp32 first: Triton 3.9's interpreter cast drops the
    carry of a mantissa that rounds up into the next power of two."""
    if GRID_FIRST:
        e = tl.maximum(tl.floor(tl.log2(tl.maximum(tl.abs(x), 1e-30))), -6.0)
        step = tl.exp2(e - 3.0)
        x = tl.floor(x / step + 0.5) * step
    return x.to(tl.float8e4nv)


@triton.jit
def _store_tile_max(mx_base, mx_row, row_ok, start, m_new, S_MAX, BLOCK_N: tl.constexpr,
                    TILE: tl.constexpr, EVEN_S: tl.constexpr):
    """The fp8 format's m: m_new [rows] (base 2) to every TILE-key entry of the BLOCK_N tile
    at keys start.. of rows mx_row (element offsets from mx_base); ceil(S_max / TILE) entries
    per row."""
    n_t = tl.cdiv(S_MAX, TILE)
    if BLOCK_N == TILE:
        t = start // TILE
        if EVEN_S:
            tl.store(mx_base + mx_row + t, m_new, mask=row_ok)
        else:
            tl.store(mx_base + mx_row + t, m_new, mask=row_ok & (mx_row * 0 + t < n_t))
    else:
        t = start // TILE + tl.arange(0, BLOCK_N // TILE)
        vals = m_new[:, None] + tl.zeros([1, BLOCK_N // TILE], tl.float32)
        if EVEN_S:
            tl.store(mx_base + mx_row[:, None] + t[None, :], vals, mask=row_ok[:, None])
        else:
            tl.store(mx_base + mx_row[:, None] + t[None, :], vals,
                     mask=row_ok[:, None] & (t < n_t)[None, :])


@triton.jit
def _attend_tile(q, k, v, start, limit, floor, m_i, l_i, acc, sc_base, m_row, m_ok,
                 mx_base, mx_row, qk_scale2, S_MAX, BLOCK_N: tl.constexpr,
                 COLLECT: tl.constexpr, EVEN_S: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                 UPCAST: tl.constexpr, HAS_WINDOW: tl.constexpr, FP8: tl.constexpr,
                 SCORE_TILE: tl.constexpr):
    """One K/V tile (keys start..start+BLOCK_N) of the online softmax, plus the score store
    of the collected rows: returns the new (m_i, l_i, acc). Row m sees keys [floor, limit]
    (floor only with a sliding window). FP8: the collected rows store d = x − m_new (the
    exponent of p, clamped at e4m3's −448) as float8 e4m3 and m_new per SCORE_TILE keys."""
    offs_n = tl.arange(0, BLOCK_N)
    n = tl.max_contiguous(tl.multiple_of(start + offs_n, BLOCK_N), BLOCK_N)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    kt = tl.trans(k)
    s = tl.dot(q, kt, input_precision=INPUT_PRECISION)  # [BLOCK_M, BLOCK_N]
    # n <= limit < L also masks the tile's keys past hi (only the split holding L-1 has any)
    s = tl.where(n[None, :] <= limit[:, None], s, float("-inf"))
    if HAS_WINDOW:
        s = tl.where(n[None, :] >= floor[:, None], s, float("-inf"))
    if COLLECT != 0 and not FP8:
        _store_scores(sc_base, m_row, m_ok, n, s.to(tl.bfloat16), S_MAX, EVEN_S)
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale2)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    dx = s * qk_scale2 - m_safe[:, None]  # <= 0: max(s)·c is the largest s·c (c > 0)
    p = tl.exp2(dx)
    if COLLECT != 0 and FP8:
        _store_scores(sc_base, m_row, m_ok, n, _to_e4m3(tl.maximum(dx, -448.0), UPCAST),
                      S_MAX, EVEN_S)
        _store_tile_max(mx_base, mx_row, m_ok, start, m_new, S_MAX, BLOCK_N, SCORE_TILE,
                        EVEN_S)
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=INPUT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _add_sink(m_i, l_i, SINKS, head, row_ok):
    """Fold the sink logits of rows' heads into their online softmax (base 2): (m, l, alpha),
    alpha the factor the rows' accumulators are rescaled by."""
    sink2 = tl.load(SINKS + head, mask=row_ok, other=0.0).to(tl.float32) * 1.4426950408889634
    m_new = tl.maximum(m_i, sink2)
    alpha = tl.exp2(m_i - m_new)  # 0 where no key was seen (m_i -inf)
    return m_new, l_i * alpha + tl.exp2(sink2 - m_new), alpha


@triton.jit
def _verify_attention_kernel(
    Q, K, V, K_DESC, V_DESC, LENS, OUT, LSE, O_PART, LSE_PART, SCORES, SCORE_MAX, SINKS,
    qk_scale2,  # scale * log2(e): softmax in base 2
    S_MAX, HQ, HKV, NQ, SPLITS, R, WINDOW,
    stride_kb, stride_ks,  # cache strides (elements) of request and token; head stride = D
    G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, COLLECT: tl.constexpr, SINGLE: tl.constexpr, EVEN_S: tl.constexpr, OFFS64: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr,
    HAS_SINKS: tl.constexpr, HAS_WINDOW: tl.constexpr, FP8: tl.constexpr,
    SCORE_TILE: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    b = pid_bh // HKV
    kvh = pid_bh % HKV
    L = tl.load(LENS + b)

    offs_m = tl.arange(0, BLOCK_M)  # packed row m = group * G + g, groups in _packed_row order
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    q_idx = offs_m // G
    nq = _packed_row(q_idx, NQ)
    head = kvh * G + offs_m % G
    row_ok = offs_m < NQ * G
    d_ok = offs_d < D
    limit = L - NQ + nq  # last key row m may see (causal inside the new rows)
    floor = limit - WINDOW + 1  # its first key in a sliding-window layer

    # q [B, NQ, HQ, D] contiguous -> tile [BLOCK_M, BLOCK_D]
    q_off = ((b * NQ + nq) * HQ + head).to(tl.int64) * D
    q = tl.load(Q + q_off[:, None] + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :],
                other=0.0)
    if UPCAST:  # the CPU interpreter's tl.dot is wrong on bf16; fp32 holds bf16 products exactly
        q = q.to(tl.float32)

    # Score rows: packed row m stores its own s row; collected = the first R·G packed rows for
    # first_last (score row r = group), all NQ·G for "all" (score row r = nq).
    # Scores [B, R, HQ, S_MAX].
    r_m = q_idx if COLLECT == 1 else nq
    # Hot-loop addresses are a per-program int64 base pointer + int32 tile offsets (64-bit
    # offset tensors cost two registers per element; at M 32 x N 128 the kernel spilled).
    # The launcher checks that the offsets fit in int32.
    sc_base = SCORES + (b * R * HQ + kvh * G).to(tl.int64) * S_MAX
    m_row = (r_m * HQ + offs_m % G) * S_MAX  # [BLOCK_M] int32, relative to sc_base
    m_ok = offs_m < R * G if COLLECT == 1 else row_ok
    # fp8 format: m per SCORE_TILE keys, [B, R, HQ, ceil(S_MAX / SCORE_TILE)] fp32
    n_tiles = tl.cdiv(S_MAX, SCORE_TILE)
    mx_base = SCORE_MAX + (b * R * HQ + kvh * G).to(tl.int64) * n_tiles
    mx_row = (r_m * HQ + offs_m % G) * n_tiles
    # this split's key range [lo, hi): whole BLOCK_N tiles aligned to multiples of BLOCK_N,
    # from the tile that holds row 0's first key (0 without a window)
    first = 0
    if HAS_WINDOW:
        first = tl.maximum(L - NQ - WINDOW + 1, 0) // BLOCK_N * BLOCK_N
    chunk = tl.cdiv(tl.cdiv(L - first, SPLITS), BLOCK_N) * BLOCK_N
    lo = first + split * chunk
    hi = tl.minimum(lo + chunk, L)

    k_base = K + (b.to(tl.int64) * stride_kb + kvh * D)
    v_base = V + (b.to(tl.int64) * stride_kb + kvh * D)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if TMA:  # whole tiles by TMA; the tile holding L-1 (keys past L unwritten) by pointers
        hi_tma = lo + (hi - lo) // BLOCK_N * BLOCK_N
        for start in range(lo, hi_tma, BLOCK_N):
            k = tl.reshape(K_DESC.load([b, start, kvh * D]), [BLOCK_N, BLOCK_D])
            v = tl.reshape(V_DESC.load([b, start, kvh * D]), [BLOCK_N, BLOCK_D])
            m_i, l_i, acc = _attend_tile(
                q, k, v, start, limit, floor, m_i, l_i, acc, sc_base, m_row, m_ok, mx_base,
                mx_row, qk_scale2, S_MAX, BLOCK_N, COLLECT, EVEN_S, INPUT_PRECISION, UPCAST,
                HAS_WINDOW, FP8, SCORE_TILE)
        lo_ptr = hi_tma
    else:
        lo_ptr = lo
    for start in range(lo_ptr, hi, BLOCK_N):
        n = tl.max_contiguous(tl.multiple_of(start + offs_n, BLOCK_N), BLOCK_N)
        n_ok = n < hi
        if OFFS64:  # the whole cache spans >= 2^31 elements (see the launcher)
            kv_off = n.to(tl.int64)[:, None] * stride_ks + offs_d[None, :]
        else:
            kv_off = n[:, None] * stride_ks + offs_d[None, :]  # [BLOCK_N, BLOCK_D] int32
        k = tl.load(k_base + kv_off, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        v = tl.load(v_base + kv_off, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        m_i, l_i, acc = _attend_tile(
            q, k, v, start, limit, floor, m_i, l_i, acc, sc_base, m_row, m_ok, mx_base,
            mx_row, qk_scale2, S_MAX, BLOCK_N, COLLECT, EVEN_S, INPUT_PRECISION, UPCAST,
            HAS_WINDOW, FP8, SCORE_TILE)

    if COLLECT != 0:
        # -inf for keys [round_up(L, BLOCK_N), S_MAX): each split fills its share, store-only
        f0 = tl.cdiv(L, BLOCK_N) * BLOCK_N
        fill = tl.cdiv(tl.cdiv(tl.maximum(S_MAX - f0, 0), SPLITS), BLOCK_N) * BLOCK_N
        f_lo = f0 + split * fill
        f_hi = tl.minimum(f_lo + fill, S_MAX)
        # -inf made in fp32 and cast: Triton 3.8's CPU interpreter has no bf16 scalar
        # constant (no get_bf16); the compiler folds the cast
        for start in range(f_lo, f_hi, BLOCK_N):
            n = tl.max_contiguous(tl.multiple_of(start + offs_n, BLOCK_N), BLOCK_N)
            if FP8:  # d = -448 (masked), m = -inf
                neg_d = tl.full([BLOCK_M, BLOCK_N], -448.0, tl.float32).to(tl.float8e4nv)
                _store_scores(sc_base, m_row, m_ok, n, neg_d, S_MAX, EVEN_S)
                _store_tile_max(mx_base, mx_row, m_ok, start,
                                tl.full([BLOCK_M], float("-inf"), tl.float32), S_MAX, BLOCK_N,
                                SCORE_TILE, EVEN_S)
            else:
                neg_m = tl.full([BLOCK_M, BLOCK_N], float("-inf"), tl.float32).to(tl.bfloat16)
                _store_scores(sc_base, m_row, m_ok, n, neg_m, S_MAX, EVEN_S)

    if SINGLE and HAS_SINKS:  # one split: the softmax ends here (else in the combine)
        m_i, l_i, alpha = _add_sink(m_i, l_i, SINKS, head, row_ok)
        acc = acc * alpha[:, None]
    has = l_i > 0.0
    l_safe = tl.where(has, l_i, 1.0)
    o = acc / l_safe[:, None]
    lse2 = tl.where(has, m_i + tl.log2(l_safe), float("-inf"))  # base-2 lse of scale*s
    if SINGLE:
        o_off = ((b * NQ + nq) * HQ + head).to(tl.int64) * D
        tl.store(OUT + o_off[:, None] + offs_d[None, :], o.to(OUT.dtype.element_ty),
                 mask=row_ok[:, None] & d_ok[None, :])
        tl.store(LSE + (b * NQ + nq) * HQ + head, lse2 * 0.6931471805599453, mask=row_ok)
    else:
        part = (pid_bh * SPLITS + split).to(tl.int64) * BLOCK_M + offs_m  # [BLOCK_M]
        tl.store(O_PART + part[:, None] * BLOCK_D + offs_d[None, :], o, mask=row_ok[:, None])
        tl.store(LSE_PART + part, lse2, mask=row_ok)


@triton.jit
def _combine_kernel(
    OUT, LSE, O_PART, LSE_PART, SINKS, HQ, HKV, NQ, SPLITS,
    G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr, HAS_SINKS: tl.constexpr,
):
    """Merge the split partials of one (request, KV head, packed row m):
    out = Σ_s 2^(lse_s − lse) o_s, all splits loaded at once ([BLOCK_S >= SPLITS, BLOCK_D]);
    with sinks, lse includes the row's head's sink, a split with no value."""
    pid_bh = tl.program_id(0)
    m = tl.program_id(1)
    b = pid_bh // HKV
    kvh = pid_bh % HKV
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < SPLITS
    part = (pid_bh * SPLITS + offs_s).to(tl.int64) * BLOCK_M + m  # [BLOCK_S]
    lse_s = tl.load(LSE_PART + part, mask=s_ok, other=float("-inf"))
    head = kvh * G + m % G
    top = tl.max(lse_s, 0)
    if HAS_SINKS:
        sink2 = tl.load(SINKS + head).to(tl.float32) * 1.4426950408889634
        top = tl.maximum(top, sink2)
    top_safe = tl.where(top == float("-inf"), 0.0, top)
    w = tl.exp2(lse_s - top_safe)  # 0 for empty splits (lse -inf)
    # every split stored its rows (0 where empty), so this load need not wait for lse_s
    o_s = tl.load(O_PART + part[:, None] * BLOCK_D + offs_d[None, :], mask=s_ok[:, None],
                  other=0.0)
    l_sum = tl.sum(w, 0)
    if HAS_SINKS:
        l_sum += tl.exp2(sink2 - top_safe)
    acc = tl.sum(w[:, None] * o_s, 0)  # [BLOCK_D]
    l_safe = tl.where(l_sum > 0.0, l_sum, 1.0)
    nq = _packed_row(m // G, NQ)
    o_off = ((b * NQ + nq) * HQ + head).to(tl.int64) * D
    tl.store(OUT + o_off + offs_d, (acc / l_safe).to(OUT.dtype.element_ty), mask=offs_d < D)
    lse = tl.where(l_sum > 0.0, (top_safe + tl.log2(l_safe)) * 0.6931471805599453,
                   float("-inf"))
    tl.store(LSE + (b * NQ + nq) * HQ + head, lse)


def combine(out: Tensor, lse: Tensor, o_part: Tensor, lse_part: Tensor, n_q: int, hkv: int,
            splits: int, block_m: int, sinks: Tensor | None = None) -> None:
    """Launch `_combine_kernel`: out [B, NQ, Hq, D] / lse [B, NQ, Hq] from the partials
    ([B·Hkv·splits·BLOCK_M, BLOCK_D] and [B·Hkv·splits·BLOCK_M]) of the NQ·G valid rows;
    sinks [Hq] (contiguous, any float dtype) or None."""
    B, _, Hq, D = out.shape
    G = Hq // hkv
    _combine_kernel[(B * hkv, n_q * G)](
        out, lse, o_part, lse_part, sinks if sinks is not None else lse, Hq, hkv, n_q, splits,
        G=G, D=D, BLOCK_M=block_m, BLOCK_D=o_part.shape[1], BLOCK_S=max(2, next_pow2(splits)),
        HAS_SINKS=sinks is not None, num_warps=4 if splits * o_part.shape[1] >= 4096 else 2,
    )


def _check_int32_offsets(request_elements: int, score_elements: int, score_shape: str) -> None:
    """The kernel's per-request cache and score offsets are int32."""
    if max(request_elements, score_elements) >= 2**31:
        raise UserInputError(
            f"one request's KV cache ({request_elements} elements) or score rows "
            f"({score_shape}) exceed 2^31 elements: the kernel's int32 offsets overflow",
            where="verify_attention(k_cache, collect)",
            fix="allocate a smaller S_max per request (or collect fewer rows)")


def verify_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_lens: Tensor,
    scale: float,
    collect: str = "none",
    *,
    splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    max_len: int | None = None,
    min_m: int | None = None,
    offs64: bool | None = None,
    scores_out: Tensor | LogScores | None = None,
    tma: bool | None = None,
    sinks: Tensor | None = None,
    window: int = 0,
    score_format: str = "bf16",
) -> tuple[Tensor, Tensor, Tensor | LogScores | None]:
    """Triton launcher; same contract as `reference.verify_attention` (API.md).

    Keyword-only knobs (None = `launch_config`'s defaults) exist for the benchmark;
    `max_len` (a host-side bound on cache_lens, default S_max) sizes the split count without
    a device sync. `min_m` the smallest M tile (default `default_min_m`); `offs64` forces the
    int64 (True) or int32 (False) hot-loop tile offsets (default: int64 only for caches of
    >= 2^31 elements; False there exists only for the benchmark's crash probe);
    `scores_out` a contiguous bf16 [B, R, Hq, S_max] (score_format "bf16") or `LogScores`
    ("fp8") that receives the scores (ops checks it); "fp8" launches only tiles of at least
    SCORE_TILE keys;
    `sinks` [Hq] attention-sink logits (any float dtype) or None; `window` > 0 a sliding
    window (each row its `window` newest keys; ops refuses collection with it), whose keys
    alone size the split count.
    """
    B, NQ, Hq, D = q.shape
    S_max, Hkv = k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hkv
    assert k_cache.stride(3) == 1 and k_cache.stride(2) == D and k_cache.stride() == v_cache.stride()
    q = q.contiguous()
    if sinks is not None:
        sinks = sinks.contiguous()
    R = len(collect_row_ids(NQ, collect))
    _check_int32_offsets(k_cache.stride(0), R * Hq * S_max, f"{R}x{Hq}x{S_max}")
    if max_len is None:
        max_len = S_max  # no .item() sync; splits only affect speed, never the result
    if window:
        max_len = min(max_len, window + NQ - 1)
    BLOCK_M, cfg = launch_config(B, Hkv, NQ, G, max_len, num_sms(q.device), collect,
                                 min_m=min_m, splits=splits, block_n=block_n,
                                 num_warps=num_warps, num_stages=num_stages, tma=tma)
    BLOCK_D = max(16, next_pow2(D))
    out = torch.empty_like(q)
    lse = torch.empty(B, NQ, Hq, dtype=torch.float32, device=q.device)
    fp8 = score_format == "fp8"
    scores: Tensor | LogScores | None = None
    if R:
        scores = (scores_out if scores_out is not None
                  else empty_scores((B, R, Hq), S_max, score_format, q.device))
    if fp8 and q.is_cuda and torch.cuda.get_device_capability(q.device) < (8, 9):
        raise UserInputError("the fp8 score format needs float8 e4m3 conversions (compute "
                             "capability 8.9 or newer: Ada, Hopper)",
                             where="verify_attention(score_format)",
                             fix="use score_format='bf16' on this GPU")
    if fp8 and block_n is not None and block_n < SCORE_TILE:
        raise UserInputError(f"block_n={block_n} with the fp8 score format",
                             where="verify_attention(block_n)",
                             fix=f"pass block_n >= {SCORE_TILE} (SCORE_TILE) or None")
    score_d: Tensor | None = scores.d if isinstance(scores, LogScores) else scores
    score_m: Tensor | None = scores.m if isinstance(scores, LogScores) else None
    single = cfg.splits == 1
    n_part = 1 if single else B * Hkv * cfg.splits * BLOCK_M
    o_part = torch.empty(n_part, BLOCK_D, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(n_part, dtype=torch.float32, device=q.device)
    lens = cache_lens.to(device=q.device, dtype=torch.int32).contiguous()
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    use_tma = cfg.tma and tma_usable(k_cache, v_cache, BLOCK_D)
    if tma and not use_tma:
        raise UserInputError("TMA K/V loads need Hopper, triton's TensorDescriptor and "
                             "16-byte aligned caches with a power-of-two head dim",
                             where="verify_attention(tma)", fix="pass tma=None or False")

    def launch(c: VerifyConfig) -> None:
        k_desc, v_desc = ((kv_descriptor(k_cache, c.block_n), kv_descriptor(v_cache, c.block_n))
                          if use_tma else (k_cache, v_cache))
        _verify_attention_kernel[(B * Hkv, c.splits)](
            q, k_cache, v_cache, k_desc, v_desc, lens, out, lse, o_part, lse_part,
            score_d if score_d is not None else lse,  # dummy pointer when nothing is collected
            score_m if score_m is not None else lse,  # fp8's m, else a dummy
            sinks if sinks is not None else lse,  # dummy pointer without sinks
            scale * LOG2E, S_max, Hq, Hkv, NQ, c.splits, max(R, 1), window,
            k_cache.stride(0), k_cache.stride(1),
            G=G, D=D, BLOCK_M=BLOCK_M, BLOCK_N=c.block_n, BLOCK_D=BLOCK_D,
            COLLECT=COLLECT_CODE[collect], SINGLE=single,
            EVEN_S=S_max % c.block_n == 0, INPUT_PRECISION=precision, UPCAST=interpreted(q),
            TMA=use_tma, HAS_SINKS=sinks is not None, HAS_WINDOW=window > 0,
            FP8=fp8 and R > 0, SCORE_TILE=SCORE_TILE,
            # int32 tile offsets crash (illegal address) on the H200 at B=16 C=128K, the
            # smallest measured cache of >= 2^31 elements, where int64 offsets work. Until it
            # is known where the int32 path overflows, such caches take int64 offsets.
            OFFS64=B * k_cache.stride(0) >= 2**31 if offs64 is None else offs64,
            num_warps=c.num_warps, num_stages=c.num_stages,
        )

    fit_key = ("verify", q.device, q.dtype, D, G, BLOCK_M, collect, single,
               use_tma, cfg, sinks is not None, window > 0, fp8)
    configs = [c for c in smaller_configs(cfg) if not fp8 or c.block_n >= SCORE_TILE]
    launch_fitted(fit_key, configs, launch, "verify attention")
    if not single:
        combine(out, lse, o_part, lse_part, NQ, Hkv, cfg.splits, BLOCK_M, sinks)
    return out, lse, scores
