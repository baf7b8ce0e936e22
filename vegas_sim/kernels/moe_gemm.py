"""Mixture-of-experts FFN in Triton: routing into expert blocks, and one grouped expert GEMM
per projection (kernels/moe.py has the layout and the torch reference).

Why kernels: decode routes a few tokens to each expert, so an FFN step is a read of the
touched experts' weights plus a tail of small ops; at gpt-oss-20b's shape the tail (≈ 30
routing ops, the activation, the combine) took longer than the weight read
(benchmarks/moe_ffn.py). Here routing is 3 launches, the gate/up GEMM applies the activation
in its epilogue (it loads the gate and the up slice of the same columns), and the down GEMM
scales each pair by its router weight, so combining is one sum over k.

- `_count_kernel`: every pair takes its rank in its expert's group by an atomic increment
  (the order inside a group is not deterministic, the results are: each row's product
  depends only on its own row and expert);
- `_offsets_kernel` (one program): padded group starts, and the expert of every block;
- `_place_kernel`: each pair into its slot;
- `_moe_gemm_kernel`: one BLOCK_M block of one expert × one BLOCK_N slice of its weight,
  rows written in pair order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from vegas_sim.kernels.moe import (
    ACTIVATIONS,
    GPT_OSS_ALPHA,
    GPT_OSS_LIMIT,
    MoeRouting,
    block_m_for,
    max_blocks,
)
from vegas_sim.kernels.verify_launch import interpreted

PAIR_BLOCK = 1024  # pairs per program of the count and place kernels


@triton.jit
def _count_kernel(experts_ptr, counts_ptr, rank_ptr, P, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < P
    e = tl.load(experts_ptr + offs, mask=ok, other=0)
    rank = tl.atomic_add(counts_ptr + e, tl.full([BLOCK], 1, tl.int32), mask=ok)
    tl.store(rank_ptr + offs, rank, mask=ok)


@triton.jit
def _offsets_kernel(counts_ptr, start_ptr, block_expert_ptr, E, n_blocks,
                    E_POW2: tl.constexpr, BLOCK_M: tl.constexpr, BLOCKS: tl.constexpr):
    e = tl.arange(0, E_POW2)
    counts = tl.load(counts_ptr + e, mask=e < E, other=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    end = tl.cumsum(padded, 0)
    tl.store(start_ptr + e, end - padded, mask=e < E)
    end = tl.where(e < E, end, 2147483647)
    for b0 in range(0, n_blocks, BLOCKS):
        b = b0 + tl.arange(0, BLOCKS)
        # the expert of block b: how many groups end at or before its first slot
        owner = tl.sum((end[None, :] <= (b * BLOCK_M)[:, None]).to(tl.int32), 1)
        tl.store(block_expert_ptr + b, tl.where(owner < E, owner, -1), mask=b < n_blocks)


@triton.jit
def _place_kernel(experts_ptr, rank_ptr, start_ptr, pair_rows_ptr, P, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < P
    e = tl.load(experts_ptr + offs, mask=ok, other=0)
    slot = tl.load(start_ptr + e, mask=ok, other=0) + tl.load(rank_ptr + offs, mask=ok, other=0)
    tl.store(pair_rows_ptr + slot, offs.to(tl.int32), mask=ok)


def moe_routing(experts: Tensor, n_experts: int, block_m: int | None = None) -> MoeRouting:
    """`kernels.moe.moe_routing` in three launches (plus two fills); same layout."""
    top_k = experts.shape[-1]
    flat = experts.reshape(-1).to(torch.int32)  # [P]
    n_pairs = flat.numel()
    bm = block_m or block_m_for(n_pairs, n_experts)
    n_blocks = max_blocks(n_pairs, n_experts, bm)
    counts = torch.zeros(n_experts, dtype=torch.int32, device=flat.device)
    rank = torch.empty_like(flat)
    start = torch.empty_like(counts)
    block_expert = torch.empty(n_blocks, dtype=torch.int32, device=flat.device)
    pair_rows = torch.full((n_blocks * bm,), -1, dtype=torch.int32, device=flat.device)
    grid = (triton.cdiv(max(n_pairs, 1), PAIR_BLOCK),)
    _count_kernel[grid](flat, counts, rank, n_pairs, BLOCK=PAIR_BLOCK)
    _offsets_kernel[(1,)](counts, start, block_expert, n_experts, n_blocks,
                          E_POW2=triton.next_power_of_2(n_experts), BLOCK_M=bm,
                          BLOCKS=max(16, min(64, 8192 // triton.next_power_of_2(n_experts))))
    _place_kernel[grid](flat, rank, start, pair_rows, n_pairs, BLOCK=PAIR_BLOCK)
    return MoeRouting(pair_rows, block_expert, experts.reshape(-1), bm, top_k, n_experts)


@triton.jit
def _activate(gate, up, ACT: tl.constexpr, ALPHA: tl.constexpr, LIMIT: tl.constexpr):
    """kernels.moe.expert_activation on fp32 tiles: 1 SwiGLU, 2 gpt-oss's clamped SwiGLU."""
    if ACT == 2:
        gate = tl.minimum(gate, LIMIT)
        up = tl.minimum(tl.maximum(up, -LIMIT), LIMIT)
        return (up + 1.0) * gate * tl.sigmoid(gate * ALPHA)
    return gate * tl.sigmoid(gate) * up


@triton.jit
def _moe_gemm_kernel(
    x_ptr, w_ptr, bias_ptr, scale_ptr, out_ptr, pair_rows_ptr, block_expert_ptr,
    N, K,
    stride_xm, stride_we, stride_wn, stride_wk, stride_be, stride_om,
    TOP_K: tl.constexpr, GATHER: tl.constexpr, HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr, SCALE_ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr, ALPHA: tl.constexpr, LIMIT: tl.constexpr,
):
    """N: output columns (with ACT, the gate rows are w[:, :N] and the up rows w[:, N:2N])."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    pair = tl.load(pair_rows_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))  # [BM]
    row_ok = pair >= 0
    x_row = pair // TOP_K if GATHER else pair  # the token's hidden state, or the pair's row
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)  # [BK]
    x_ptrs = x_ptr + x_row[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    w_ptrs = (w_ptr + expert.to(tl.int64) * stride_we + offs_n[:, None] * stride_wn
              + offs_k[None, :] * stride_wk)  # [BN, BK]
    up_step = N * stride_wn  # the up rows sit N rows below the gate rows
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k + k0 < K
        a = tl.load(x_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)  # [BM, BK]
        b = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)  # [BN, BK]
        if UPCAST:  # the CPU interpreter's tl.dot is wrong on bf16; fp32 holds bf16 exactly
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, tl.trans(b), acc)
        if ACT != 0:
            bu = tl.load(w_ptrs + up_step, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            if UPCAST:
                bu = bu.to(tl.float32)
            acc_up = tl.dot(a, tl.trans(bu), acc_up)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K * stride_wk
    if HAS_BIAS:
        bias_row = bias_ptr + expert.to(tl.int64) * stride_be + offs_n
        acc += tl.load(bias_row, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if ACT != 0:
            acc_up += tl.load(bias_row + N, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if ACT != 0:
        acc = _activate(acc, acc_up, ACT, ALPHA, LIMIT)
    if SCALE_ROWS:
        acc *= tl.load(scale_ptr + pair, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    out_ptrs = out_ptr + pair[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


Config = tuple[int, int, int, int]  # BLOCK_N, BLOCK_K, num_warps, num_stages


def launch_config(block_m: int, fused_activation: bool) -> Config:
    """Measured best on the H200 at gpt-oss-20b's shape (benchmarks/moe_ffn.py --sweep;
    the figures: docs/KERNELS.md, MoE FFN)."""
    if block_m <= 16:
        return (64, 128, 4, 4) if fused_activation else (64, 128, 4, 5)
    return (64, 64, 4, 4) if fused_activation else (128, 64, 4, 3)


def moe_gemm(x: Tensor, w: Tensor, bias: Tensor | None, routing: MoeRouting, gather: bool,
             activation: str | None = None, row_scale: Tensor | None = None,
             config: Config | None = None) -> Tensor:
    """See ops.moe_gemm; `config` overrides `launch_config` (benchmarks/moe_ffn.py sweeps it)."""
    n_pairs = x.shape[0] * routing.top_k if gather else x.shape[0]
    n_out = w.shape[1] // 2 if activation else w.shape[1]
    out = x.new_empty(n_pairs, n_out)
    if n_pairs == 0:
        return out
    block_n, block_k, warps, stages = config or launch_config(routing.block_m,
                                                              activation is not None)
    block_n = min(block_n, triton.next_power_of_2(n_out))
    block_k = min(block_k, triton.next_power_of_2(w.shape[2]))
    if interpreted(x):  # the CPU interpreter: small tiles keep it fast, stages mean nothing
        block_n, block_k, stages = min(block_n, 32), min(block_k, 32), 1
    grid = (routing.n_blocks, triton.cdiv(n_out, block_n))
    _moe_gemm_kernel[grid](
        x, w, w if bias is None else bias, w if row_scale is None else row_scale, out,
        routing.pair_rows, routing.block_expert,
        n_out, w.shape[2],
        x.stride(0), w.stride(0), w.stride(1), w.stride(2),
        0 if bias is None else bias.stride(0), out.stride(0),
        TOP_K=routing.top_k, GATHER=gather, HAS_BIAS=bias is not None,
        ACT=ACTIVATIONS.index(activation) if activation else 0,
        SCALE_ROWS=row_scale is not None,
        BLOCK_M=routing.block_m, BLOCK_N=block_n, BLOCK_K=block_k, UPCAST=interpreted(x),
        ALPHA=GPT_OSS_ALPHA, LIMIT=GPT_OSS_LIMIT,
        num_warps=warps, num_stages=stages,
    )
    return out
