"""Sparse draft attention: one query row per request over gathered KV positions, split over K.

Positions attended by request b: indices[b, :n_idx[b]] (page size 1, shared by all heads), then
the forced tail [tail_start[b], cache_lens[b]). Virtual position j < n_idx maps to indices[b, j],
j >= n_idx to tail_start + (j − n_idx). One program = (request, KV head, split of j); the G query
heads of a KV head are packed into an M tile of 16 rows (tensor cores; the padding costs FLOPs,
not bytes). Each gathered token moves D contiguous elements per KV head. Partials are merged by
the same `combine` as verify attention.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from vegas_sim.kernels.verify_attention import (
    LOG2E,
    _next_pow2,
    combine,
    interpreted,
    num_sms,
    splits_per_sm,
)


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
    # Only the G real rows: the combine never reads the M tile's padding, which at G 4 was 3/4
    # of the partials' bytes. H200 run 46 (benchmarks/results/sparse_probe_store_h200_run46.csv):
    # 0.7-3.5 % faster at its 8 shapes (B 1 C 32K s 0.2: 14.84 -> 14.57 µs).
    part = (pid_bh * SPLITS + split).to(tl.int64) * BLOCK_M + offs_m
    tl.store(O_PART + part[:, None] * BLOCK_D + offs_d[None, :], acc / l_safe[:, None],
             mask=row_ok[:, None])
    tl.store(LSE_PART + part, tl.where(has, m_i + tl.log2(l_safe), float("-inf")), mask=row_ok)


@triton.jit
def _sparse_attention_heads_kernel(
    Q, K, V, IDX, N_IDX, TAIL, LENS, O_PART, LSE_PART,
    qk_scale2, HQ, HKV, SPLITS, stride_ib, stride_kb, stride_ks,
    G: tl.constexpr, D: tl.constexpr, HPP: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """`_sparse_attention_kernel` for HPP consecutive KV heads per program: one index load
    serves HPP heads, and a selected token's keys of those heads (HPP·D contiguous elements,
    DESIGN's token-major gather) move as one run. Batched dots over the head axis; the
    partials land where the one-head kernel puts them, so the same combine merges them."""
    pid = tl.program_id(0)  # request × head group
    split = tl.program_id(1)
    groups = HKV // HPP
    b = pid // groups
    kvh0 = (pid % groups) * HPP
    n_sel, tail, lo, hi = _split_span(N_IDX, TAIL, LENS, b, split, SPLITS, BLOCK_N)

    offs_h = tl.arange(0, HPP)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_N)
    row_ok = offs_m < G
    # q [B, HQ, D] -> [HPP, BLOCK_M, D]: head kvh0 + h's G query heads, padded to BLOCK_M
    q_row = (b * HQ + (kvh0 + offs_h)[:, None] * G + offs_m[None, :]).to(tl.int64)
    q = tl.load(Q + q_row[:, :, None] * D + offs_d[None, None, :],
                mask=row_ok[None, :, None], other=0.0)
    if UPCAST:  # the CPU interpreter's tl.dot is wrong on bf16
        q = q.to(tl.float32)

    # [HPP, 1, D] offsets of the group's heads inside a token's row
    head_off = (kvh0 + offs_h)[:, None, None] * D + offs_d[None, None, :]
    kv_base = b.to(tl.int64) * stride_kb

    m_i = tl.full([HPP, BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([HPP, BLOCK_M], tl.float32)
    acc = tl.zeros([HPP, BLOCK_M, D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        j_ok, pos = _tile_positions(IDX, b.to(tl.int64) * stride_ib, start + offs_n, hi, n_sel,
                                    tail)
        kv_off = kv_base + pos.to(tl.int64)[None, :, None] * stride_ks + head_off  # [HPP, N, D]
        k = tl.load(K + kv_off, mask=j_ok[None, :, None], other=0.0)
        v = tl.load(V + kv_off, mask=j_ok[None, :, None], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.permute(k, (0, 2, 1)), input_precision=INPUT_PRECISION) * qk_scale2
        s = tl.where(j_ok[None, None, :], s, float("-inf"))  # [HPP, BLOCK_M, BLOCK_N]
        m_new = tl.maximum(m_i, tl.max(s, 2))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, :, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 2)
        acc = acc * alpha[:, :, None] + tl.dot(p.to(v.dtype), v, input_precision=INPUT_PRECISION)
        m_i = m_new

    has = l_i > 0.0
    l_safe = tl.where(has, l_i, 1.0)
    # the one-head kernel's partial rows: ((b·HKV + kvh) · SPLITS + split) · BLOCK_M + m
    part = (((b * HKV + kvh0 + offs_h)[:, None] * SPLITS + split) * BLOCK_M
            + offs_m[None, :]).to(tl.int64)  # [HPP, BLOCK_M]
    keep = row_ok[None, :] & (offs_h[:, None] >= 0)  # the G real rows, broadcast over heads
    tl.store(O_PART + part[:, :, None] * D + offs_d[None, None, :], acc / l_safe[:, :, None],
             mask=keep[:, :, None])
    tl.store(LSE_PART + part, tl.where(has, m_i + tl.log2(l_safe), float("-inf")), mask=keep)


# A split may be a single tile: small selections (s = 1 %: ~1.3K keys at 128K) then spread over
# ~2 waves instead of 4-tile chains of dependent index loads + gathers, so the op's latency
# stays near the 2-key "launch" time that the target allows for.
MIN_TILES_DEFAULT = 1


def choose_splits(batch: int, hkv: int, max_keys: int, n_sms: int, block_n: int,
                  min_tiles: int = MIN_TILES_DEFAULT) -> int:
    """~2 waves of programs, each split >= `min_tiles` tiles so the partials stay small."""
    want = max(1, math.ceil(2 * n_sms / max(1, batch * hkv)))
    return int(min(want, max(1, max_keys // (min_tiles * block_n))))


# Small and mid-size selections (B · keys per request up to SMALL_SELECTION) take 32-key tiles
# and ~4 programs per SM, with the split count fitted to whole tiles so that every split gets
# keys (`choose_splits` rounds each split up to whole tiles and can leave a fifth of them
# empty). H200 run 32 (benchmarks/results/sparse_probe_h200_run32.csv), against the 64-key
# default: B 1 C 32K s 0.01 6.68 -> 5.36 µs, B 1 C 32K s 0.2 15.94 -> 14.88, B 4 C 128K s 0.01
# 13.86 -> 13.08, B 16 C 32K s 0.01 12.58 -> 12.06, B 4 C 32K s 0.2 36.55 -> 35.40; B 4 C 32K
# s 0.05 14.73 -> 15.04 (worse); above it (B 16 C 128K s 0.05) 108.7 -> 112.9, so the 64-key
# launch stays there.
SMALL_SELECTION = 2**15
SMALL_BLOCK_N = 32
SMALL_PER_SM = 4


def whole_tile_splits(tiles: int, want: int) -> int:
    """At most `want` splits of `tiles` tiles, each whole tiles and none empty."""
    return math.ceil(tiles / math.ceil(tiles / want))


def launch_shape(batch: int, hkv: int, max_keys: int, n_sms: int,
                 min_tiles: int = MIN_TILES_DEFAULT) -> tuple[int, int]:
    """(splits, BLOCK_N) of one call: see SMALL_SELECTION."""
    if batch * max_keys <= SMALL_SELECTION:
        want = splits_per_sm(max(1, batch * hkv), n_sms, SMALL_PER_SM)
        return whole_tile_splits(math.ceil(max_keys / SMALL_BLOCK_N), want), SMALL_BLOCK_N
    return choose_splits(batch, hkv, max_keys, n_sms, 64, min_tiles), 64


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
    num_warps: int = 4,
    num_stages: int = 3,
    min_tiles: int = MIN_TILES_DEFAULT,
    heads_per_program: int = 1,
) -> Tensor:
    """Triton launcher; same contract as `reference.sparse_draft_attention` (API.md).
    `splits` / `block_n` None: `launch_shape`'s (a split count for a given block_n comes
    from `choose_splits`). heads_per_program > 1 (a power of two dividing Hkv, with D a power
    of two): `_sparse_attention_heads_kernel`, that many KV heads per program (`splits` is
    then per head group)."""
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
    BLOCK_M = max(16, _next_pow2(G))
    BLOCK_D = max(16, _next_pow2(D))
    # keys per request without a host sync: K + a typical tail (the launch shape only affects
    # speed; the kernel sizes each split from the true count)
    max_keys = int(indices.shape[1]) + 32
    groups = Hkv // heads_per_program  # programs per request and split
    if block_n is None:
        auto_splits, block_n = launch_shape(B, groups, max_keys, num_sms(q.device), min_tiles)
        splits = auto_splits if splits is None else splits
    elif splits is None:
        splits = choose_splits(B, groups, max_keys, num_sms(q.device), block_n, min_tiles)
    out = torch.empty_like(q)
    lse = torch.empty(B, Hq, dtype=torch.float32, device=q.device)
    n_part = B * Hkv * splits * BLOCK_M
    o_part = torch.empty(n_part, BLOCK_D, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(n_part, dtype=torch.float32, device=q.device)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    if heads_per_program > 1:
        hpp = heads_per_program
        assert Hkv % hpp == 0 and hpp & (hpp - 1) == 0 and BLOCK_D == D
        kernel, programs, shape = _sparse_attention_heads_kernel, B * groups, {"HPP": hpp}
    else:
        kernel, programs, shape = _sparse_attention_kernel, B * Hkv, {"BLOCK_D": BLOCK_D}
    kernel[(programs, splits)](
        q, k_cache, v_cache, indices, n_idx, tail, lens, o_part, lse_part,
        scale * LOG2E, Hq, Hkv, splits, indices.stride(0), k_cache.stride(0), k_cache.stride(1),
        G=G, D=D, BLOCK_M=BLOCK_M, BLOCK_N=block_n, INPUT_PRECISION=precision,
        UPCAST=interpreted(q), num_warps=num_warps, num_stages=num_stages, **shape,
    )
    combine(out.view(B, 1, Hq, D), lse.view(B, 1, Hq), o_part, lse_part, 1, Hkv, splits, BLOCK_M)
    return out
