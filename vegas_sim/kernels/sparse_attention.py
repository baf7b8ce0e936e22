"""Sparse draft attention: one query row per request over gathered KV positions, split over K.

Positions attended by request b: indices[b, :n_idx[b]] (page size 1, shared by all heads), then
the forced tail [tail_start[b], cache_lens[b]). Virtual position j < n_idx maps to indices[b, j],
j >= n_idx to tail_start + (j − n_idx). One program = (request, KV head, split of j); the G query
heads of a KV head are packed into an M tile of 16 rows (tensor cores; the padding costs FLOPs,
not bytes). Each gathered token moves D contiguous elements per KV head. Partials are merged by
the same `combine` as verify attention, which also adds the attention sinks (gpt-oss) when given.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from vegas_sim.kernels.verify_attention import LOG2E, combine
from vegas_sim.kernels.verify_launch import interpreted, next_pow2, num_sms


@triton.jit
def _split_span(N_IDX, TAIL, LENS, b, split, SPLITS, BLOCK_N: tl.constexpr):
    """Request b's selected count, tail start, and split `split`'s virtual positions [lo, hi)
    (whole BLOCK_N tiles of n_idx selected + the tail)."""
    n_sel = tl.load(N_IDX + b)
    tail = tl.load(TAIL + b)
    total = n_sel + tl.maximum(tl.load(LENS + b) - tail, 0)
    chunk = tl.cdiv(tl.cdiv(total, SPLITS), BLOCK_N) * BLOCK_N
    lo = split * chunk
    return n_sel, tail, lo, tl.minimum(lo + chunk, total)


@triton.jit
def _tile_positions(IDX, idx_row, j, hi, n_sel, tail):
    """(j < hi, cache positions) of virtual positions j: indices[b, j] below n_sel, then the
    tail; idx_row is request b's offset into IDX."""
    j_ok = j < hi
    sel = tl.load(IDX + idx_row + j, mask=j_ok & (j < n_sel), other=0)
    return j_ok, tl.where(j < n_sel, sel, tail + (j - n_sel))


@triton.jit
def _sparse_attention_kernel(
    Q, K, V, IDX, N_IDX, TAIL, LENS, O_PART, LSE_PART,
    qk_scale2, HQ, HKV, SPLITS, stride_ib, stride_kb, stride_ks,
    G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    b = pid_bh // HKV
    kvh = pid_bh % HKV
    n_sel, tail, lo, hi = _split_span(N_IDX, TAIL, LENS, b, split, SPLITS, BLOCK_N)

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    row_ok = offs_m < G
    d_ok = offs_d < D
    q_off = (b * HQ + kvh * G + offs_m).to(tl.int64) * D  # q [B, HQ, D]
    q = tl.load(Q + q_off[:, None] + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :],
                other=0.0)
    if UPCAST:  # the CPU interpreter's tl.dot is wrong on bf16
        q = q.to(tl.float32)

    kv_base = b.to(tl.int64) * stride_kb + kvh * D

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        j_ok, pos = _tile_positions(IDX, b.to(tl.int64) * stride_ib, start + offs_n, hi, n_sel,
                                    tail)
        kv_off = kv_base + pos.to(tl.int64)[:, None] * stride_ks + offs_d[None, :]
        k = tl.load(K + kv_off, mask=j_ok[:, None] & d_ok[None, :], other=0.0)
        v = tl.load(V + kv_off, mask=j_ok[:, None] & d_ok[None, :], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale2
        s = tl.where(j_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=INPUT_PRECISION)
        m_i = m_new

    has = l_i > 0.0
    l_safe = tl.where(has, l_i, 1.0)
    # Only the G real rows: the combine never reads the M tile's padding, which at G 4 is 3/4
    # of the partials' bytes; faster than storing the whole tile (docs/KERNELS.md, Sparse
    # draft launch).
    part = (pid_bh * SPLITS + split).to(tl.int64) * BLOCK_M + offs_m
    tl.store(O_PART + part[:, None] * BLOCK_D + offs_d[None, :], acc / l_safe[:, None],
             mask=row_ok[:, None])
    tl.store(LSE_PART + part, tl.where(has, m_i + tl.log2(l_safe), float("-inf")), mask=row_ok)


# One launch rule for every selection: tiles of TILE_ELEMENTS (keys × dims; 16 keys at D 128,
# 32 at D 64: the same bytes a tile), one warp per program, PER_SM programs per SM (what an
# H200 SM holds at once: three stages of K and V tiles in its shared memory), the split count
# fitted to whole tiles so that no split is left without keys and rounded down to one wave (a
# second wave is slower). Many short 4-warp programs ramp the DRAM up slowly at the mid-size
# selections. Evidence: docs/KERNELS.md, Sparse draft launch.
TILE_ELEMENTS = 2048
NUM_WARPS = 1
PER_SM = 8


def tile_keys(block_d: int) -> int:
    """BLOCK_N of TILE_ELEMENTS / BLOCK_D keys, a power of two and at least tl.dot's 16."""
    return max(16, 1 << max(0, (TILE_ELEMENTS // block_d).bit_length() - 1))


def whole_tile_splits(tiles: int, want: int) -> int:
    """At most `want` splits of `tiles` tiles, each whole tiles and none empty."""
    return math.ceil(tiles / math.ceil(tiles / want))


def launch_shape(batch: int, hkv: int, max_keys: int, n_sms: int, *, block_d: int = 128,
                 block_n: int | None = None) -> tuple[int, int]:
    """(splits, BLOCK_N) of one call: see TILE_ELEMENTS. A caller's larger tile gets fewer
    programs per SM, in proportion to its shared memory."""
    block_n = tile_keys(block_d) if block_n is None else block_n
    per_sm = max(1, PER_SM * TILE_ELEMENTS // (block_n * block_d))
    want = max(1, per_sm * n_sms // max(1, batch * hkv))
    return whole_tile_splits(math.ceil(max_keys / block_n), want), block_n


def sparse_draft_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    indices: Tensor,
    n_idx: Tensor,
    tail_start: Tensor,
    cache_lens: Tensor,
    scale: float,
    *,
    splits: int | None = None,
    block_n: int | None = None,
    num_warps: int = NUM_WARPS,
    num_stages: int = 3,
    sinks: Tensor | None = None,
) -> Tensor:
    """Triton launcher; same contract as `reference.sparse_draft_attention` (API.md).
    `splits` / `block_n` None: `launch_shape`'s (for a given block_n too); `sinks` [Hq]
    attention-sink logits (any float dtype) or None, added in the combine."""
    B, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    G = Hq // Hkv
    assert k_cache.stride(3) == 1 and k_cache.stride(2) == D and k_cache.stride() == v_cache.stride()
    q = q.contiguous()
    indices = indices.to(torch.int32)
    if indices.stride(-1) != 1:
        indices = indices.contiguous()
    n_idx = n_idx.to(device=q.device, dtype=torch.int32).contiguous()
    tail = tail_start.to(device=q.device, dtype=torch.int32).contiguous()
    lens = cache_lens.to(device=q.device, dtype=torch.int32).contiguous()
    BLOCK_M = max(16, next_pow2(G))
    BLOCK_D = max(16, next_pow2(D))
    # keys per request without a host sync: K + a typical tail (the launch shape only affects
    # speed; the kernel sizes each split from the true count)
    max_keys = int(indices.shape[1]) + 32
    auto_splits, block_n = launch_shape(B, Hkv, max_keys, num_sms(q.device), block_d=BLOCK_D,
                                        block_n=block_n)
    splits = auto_splits if splits is None else splits
    out = torch.empty_like(q)
    lse = torch.empty(B, Hq, dtype=torch.float32, device=q.device)
    n_part = B * Hkv * splits * BLOCK_M
    o_part = torch.empty(n_part, BLOCK_D, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(n_part, dtype=torch.float32, device=q.device)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _sparse_attention_kernel[(B * Hkv, splits)](
        q, k_cache, v_cache, indices, n_idx, tail, lens, o_part, lse_part,
        scale * LOG2E, Hq, Hkv, splits, indices.stride(0), k_cache.stride(0), k_cache.stride(1),
        G=G, D=D, BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_D=BLOCK_D, INPUT_PRECISION=precision,
        UPCAST=interpreted(q), num_warps=num_warps, num_stages=num_stages,
    )
    combine(out.view(B, 1, Hq, D), lse.view(B, 1, Hq), o_part, lse_part, 1, Hkv, splits, BLOCK_M,
            None if sinks is None else sinks.contiguous())
    return out
