"""Verify attention: NQ (1..16) causal rows × GQA over a per-request KV cache, split-KV.

One program = one (request, KV head, KV split). All NQ·G query rows that share a KV head
(G = Hq/Hkv) are packed into one M tile (padded to >= 16) so that `tl.dot` runs on tensor
cores and every K/V tile is read once per KV head — the kernel is bound by KV bytes.
Splits write fp32 partials (output normalised by the split's own softmax sum, plus the
split's log2-sum-exp); `_combine_kernel` merges them. With one split the main kernel writes
the final output directly.

Score write-out (Collect-2-Query / collect-all): the raw q·k (fp32 accumulate → bf16) of the
collected rows, -inf where masked, for every position in [0, S_max): keys beyond cache_lens
are filled by the same programs after their main loop (a store-only pass).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from vegas_sim.kernels.reference import collect_row_ids

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
COLLECT_CODE = {"none": 0, "first_last": 1, "all": 2}
NUM_SMS_DEFAULT = 132  # H200; read off the device when there is one


@triton.jit
def _verify_attention_kernel(
    Q, K, V, LENS, OUT, LSE, O_PART, LSE_PART, SCORES,
    qk_scale2,  # scale * log2(e): softmax in base 2
    S_MAX, HQ, HKV, NQ, SPLITS, R,
    stride_kb, stride_ks,  # cache strides (elements) of request and token; head stride = D
    G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, COLLECT: tl.constexpr, SINGLE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    b = pid_bh // HKV
    kvh = pid_bh % HKV
    L = tl.load(LENS + b)

    offs_m = tl.arange(0, BLOCK_M)  # packed row m = nq * G + g
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    nq = offs_m // G
    head = kvh * G + offs_m % G
    row_ok = offs_m < NQ * G
    d_ok = offs_d < D
    limit = L - NQ + nq  # last key row m may see (causal inside the new rows)

    # q [B, NQ, HQ, D] contiguous -> tile [BLOCK_M, BLOCK_D]
    q_off = ((b * NQ + nq) * HQ + head).to(tl.int64) * D
    q = tl.load(Q + q_off[:, None] + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :],
                other=0.0)
    if UPCAST:  # the CPU interpreter's tl.dot is wrong on bf16; fp32 holds bf16 products exactly
        q = q.to(tl.float32)

    # this split's key range [lo, hi), a whole number of BLOCK_N tiles
    chunk = tl.cdiv(tl.cdiv(L, SPLITS), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, L)

    kv_base = b.to(tl.int64) * stride_kb + kvh * D
    if COLLECT == 1:
        # first_last: rows 0 -> r 0, NQ-1 -> r 1 (R == 1 when NQ == 1)
        r_idx = tl.where(nq == 0, 0, 1)
        collected = row_ok & ((nq == 0) | (nq == NQ - 1))
    else:
        r_idx = nq
        collected = row_ok
    s_row = ((b * R + r_idx) * HQ + head).to(tl.int64) * S_MAX  # [BLOCK_M] scores row start

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        n = start + offs_n
        n_ok = n < hi
        kv_off = kv_base + n.to(tl.int64)[:, None] * stride_ks + offs_d[None, :]
        k = tl.load(K + kv_off, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        v = tl.load(V + kv_off, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION)  # [BLOCK_M, BLOCK_N]
        visible = (n[None, :] <= limit[:, None]) & n_ok[None, :]
        s = tl.where(visible, s, float("-inf"))
        if COLLECT != 0:
            tl.store(SCORES + s_row[:, None] + n[None, :], s.to(tl.bfloat16),
                     mask=collected[:, None] & n_ok[None, :])
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale2)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s * qk_scale2 - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=INPUT_PRECISION)
        m_i = m_new

    if COLLECT != 0:
        # -inf for keys [L, S_MAX): each split fills its share, store-only
        fill = tl.cdiv(tl.cdiv(S_MAX - L, SPLITS), BLOCK_N) * BLOCK_N
        f_lo = L + split * fill
        f_hi = tl.minimum(f_lo + fill, S_MAX)
        neg = tl.full([BLOCK_M, BLOCK_N], float("-inf"), tl.bfloat16)
        for start in range(f_lo, f_hi, BLOCK_N):
            n = start + offs_n
            tl.store(SCORES + s_row[:, None] + n[None, :], neg,
                     mask=collected[:, None] & (n < f_hi)[None, :])

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
        tl.store(O_PART + part[:, None] * BLOCK_D + offs_d[None, :], o)
        tl.store(LSE_PART + part, lse2)


@triton.jit
def _combine_kernel(
    OUT, LSE, O_PART, LSE_PART, HQ, HKV, NQ, SPLITS,
    G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Merge the split partials of one (request, KV head): out = Σ_s 2^(lse_s − lse) o_s."""
    pid_bh = tl.program_id(0)
    b = pid_bh // HKV
    kvh = pid_bh % HKV
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_run = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_run = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for split in range(0, SPLITS):
        part = (pid_bh * SPLITS + split).to(tl.int64) * BLOCK_M + offs_m
        lse_s = tl.load(LSE_PART + part)
        o_s = tl.load(O_PART + part[:, None] * BLOCK_D + offs_d[None, :])
        m_new = tl.maximum(m_run, lse_s)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_run - m_safe)
        w = tl.exp2(lse_s - m_safe)
        l_run = l_run * alpha + w
        acc = acc * alpha[:, None] + w[:, None] * o_s
        m_run = m_new
    nq = offs_m // G
    head = kvh * G + offs_m % G
    row_ok = offs_m < NQ * G
    l_safe = tl.where(l_run > 0.0, l_run, 1.0)
    o_off = ((b * NQ + nq) * HQ + head).to(tl.int64) * D
    tl.store(OUT + o_off[:, None] + offs_d[None, :], (acc / l_safe[:, None]).to(OUT.dtype.element_ty),
             mask=row_ok[:, None] & (offs_d < D)[None, :])
    lse = (m_run + tl.log2(l_safe)) * 0.6931471805599453
    tl.store(LSE + (b * NQ + nq) * HQ + head, lse, mask=row_ok)


def interpreted(t: Tensor) -> bool:
    """True when Triton runs in its CPU interpreter (tensors off the GPU)."""
    return t.device.type != "cuda"


def num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return NUM_SMS_DEFAULT


def choose_splits(batch: int, hkv: int, max_len: int, rows: int, n_sms: int,
                  block_n: int) -> int:
    """KV splits per (request, KV head): about one wave of programs over the SMs (measured on
    the H200: 1 wave beat 2 and 4, benchmarks/KERNELS_NOTES.md), each split long enough
    (>= 32 keys per packed row, >= 4 tiles) that the fp32 partials stay a few percent of the KV
    bytes (partial bytes / KV bytes ≈ rows / keys per split)."""
    want = max(1, math.ceil(n_sms / max(1, batch * hkv)))
    min_keys = max(4 * block_n, 32 * rows)
    most = max(1, max_len // min_keys)
    return int(min(want, most))


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


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
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Triton launcher; same contract as `reference.verify_attention` (API.md).

    Keyword-only knobs (None = heuristics) exist for the benchmark; `max_len` (a host-side
    bound on cache_lens, default S_max) sizes the split count without a device sync.
    """
    B, NQ, Hq, D = q.shape
    S_max, Hkv = k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hkv
    assert k_cache.stride(3) == 1 and k_cache.stride(2) == D and k_cache.stride() == v_cache.stride()
    q = q.contiguous()
    rows = collect_row_ids(NQ, collect)
    R = len(rows)
    BLOCK_M = max(16, _next_pow2(NQ * G))
    BLOCK_D = max(16, _next_pow2(D))
    if block_n is None:
        # H200 sweep: 128-key tiles for M <= 32, 64 for M = 64 (shared memory), 32 beyond
        block_n = 128 if BLOCK_M <= 32 else (64 if BLOCK_M <= 64 else 32)
    if max_len is None:
        max_len = S_max  # no .item() sync; splits only affect speed, never the result
    if splits is None:
        splits = choose_splits(B, Hkv, max_len, NQ * G, num_sms(q.device), block_n)
    if num_warps is None:
        num_warps = 4 if BLOCK_M <= 64 else 8  # 4 beat 8 at M = 32 and 64 on the H200
    if num_stages is None:
        num_stages = 3
    out = torch.empty_like(q)
    lse = torch.empty(B, NQ, Hq, dtype=torch.float32, device=q.device)
    scores = (torch.empty(B, R, Hq, S_max, dtype=torch.bfloat16, device=q.device)
              if R else None)
    single = splits == 1
    n_part = 1 if single else B * Hkv * splits * BLOCK_M
    o_part = torch.empty(n_part, BLOCK_D, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(n_part, dtype=torch.float32, device=q.device)
    lens = cache_lens.to(device=q.device, dtype=torch.int32).contiguous()
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _verify_attention_kernel[(B * Hkv, splits)](
        q, k_cache, v_cache, lens, out, lse, o_part, lse_part,
        scores if scores is not None else lse,  # dummy pointer when nothing is collected
        scale * LOG2E, S_max, Hq, Hkv, NQ, splits, max(R, 1),
        k_cache.stride(0), k_cache.stride(1),
        G=G, D=D, BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_D=BLOCK_D,
        COLLECT=COLLECT_CODE[collect], SINGLE=single, INPUT_PRECISION=precision,
        UPCAST=interpreted(q),
        num_warps=num_warps, num_stages=num_stages,
    )
    if not single:
        _combine_kernel[(B * Hkv,)](
            out, lse, o_part, lse_part, Hq, Hkv, NQ, splits,
            G=G, D=D, BLOCK_M=BLOCK_M, BLOCK_D=BLOCK_D, num_warps=4,
        )
    return out, lse, scores
