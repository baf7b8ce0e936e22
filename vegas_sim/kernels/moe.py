"""Routing of a mixture-of-experts step into expert blocks, and the torch reference of the
grouped expert GEMM (the Triton kernel is kernels/moe_gemm.py).

The T·k routed pairs of a step are numbered p = t·k + j (token t's j-th expert, in the
router's top-k order). `moe_routing` sorts them by expert and pads each expert's group to a
multiple of `block_m`, so every block of `block_m` slots belongs to one expert
(`block_expert`, −1 past the last group) and `pair_rows` holds each slot's pair (−1 for
padding). Every step is a device op with shapes fixed by (T, k, E): no host sync, so a CUDA
graph captures it. Both GEMMs write their rows in pair order, so combining the experts is a
reshape and a weighted sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

ACTIVATIONS = ("none", "silu", "gpt_oss")  # the kernel's ACT codes 0, 1, 2
GPT_OSS_ALPHA = 1.702  # gpt-oss's clamped SwiGLU: gate · sigmoid(alpha · gate) · (up + 1)
GPT_OSS_LIMIT = 7.0


@dataclass(frozen=True)
class MoeRouting:
    """pair_rows [n_blocks·block_m] int32; block_expert [n_blocks] int32; experts [P] the
    flat top-k (the reference reads it)."""

    pair_rows: Tensor
    block_expert: Tensor
    experts: Tensor
    block_m: int
    top_k: int
    n_experts: int

    @property
    def n_blocks(self) -> int:
        return int(self.block_expert.shape[0])


def block_m_for(n_pairs: int, n_experts: int) -> int:
    """Rows per block: 16 while experts see few rows each (decode reads weights), 64 once
    the groups fill them (each block re-reads its expert's weight slice); the crossover
    measured on the H200 (benchmarks/moe_ffn.py --sweep)."""
    return 16 if n_pairs / max(n_experts, 1) <= 24 else 64


def max_blocks(n_pairs: int, n_experts: int, block_m: int) -> int:
    """Blocks of `block_m` slots that any routing of `n_pairs` pairs over `n_experts` experts
    fits in: every group padded by at most block_m − 1 slots."""
    return (n_pairs + n_experts * (block_m - 1) + block_m - 1) // block_m


def expert_counts(flat: Tensor, n_experts: int) -> Tensor:
    """[E] pairs routed to each expert, by scatter_add (bincount syncs with the host to size
    its output, which a CUDA graph capture refuses)."""
    return torch.zeros(n_experts, dtype=flat.dtype, device=flat.device).scatter_add_(
        0, flat, torch.ones_like(flat))


def moe_routing(experts: Tensor, n_experts: int, block_m: int | None = None) -> MoeRouting:
    """experts [T, k] int (the router's top-k) -> MoeRouting."""
    top_k = experts.shape[-1]
    flat = experts.reshape(-1)  # [P]
    n_pairs = flat.numel()
    bm = block_m or block_m_for(n_pairs, n_experts)
    counts = expert_counts(flat, n_experts)  # [E]
    padded = (counts + bm - 1) // bm * bm
    pad_end = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)  # [P] pairs grouped by expert
    sorted_e = flat[order]
    rank = torch.arange(n_pairs, device=flat.device) - (torch.cumsum(counts, 0) - counts)[sorted_e]
    n_blocks = max_blocks(n_pairs, n_experts, bm)
    pair_rows = torch.full((n_blocks * bm,), -1, dtype=torch.int32, device=flat.device)
    pair_rows[(pad_end - padded)[sorted_e] + rank] = order.to(torch.int32)
    starts = torch.arange(n_blocks, device=flat.device, dtype=pad_end.dtype) * bm
    block_expert = torch.searchsorted(pad_end, starts, right=True)
    block_expert = torch.where(block_expert < n_experts, block_expert, -1).to(torch.int32)
    return MoeRouting(pair_rows, block_expert, flat, bm, top_k, n_experts)


def expert_activation(gate_up: Tensor, kind: str) -> Tensor:
    """[N, 2F] (gate | up) -> [N, F]: SwiGLU ("silu") or gpt-oss's clamped variant."""
    gate, up = gate_up.chunk(2, dim=-1)
    if kind == "gpt_oss":
        gate = gate.clamp(max=GPT_OSS_LIMIT)
        up = up.clamp(-GPT_OSS_LIMIT, GPT_OSS_LIMIT)
        return (up + 1) * gate * torch.sigmoid(gate * GPT_OSS_ALPHA)
    return F.silu(gate) * up


def moe_gemm_reference(x: Tensor, w: Tensor, bias: Tensor | None, routing: MoeRouting,
                       gather: bool, activation: str | None = None,
                       row_scale: Tensor | None = None) -> Tensor:
    """`ops.moe_gemm` in torch: one grouped GEMM over the expert-sorted pairs, then the bias,
    the activation (fp32) and the row scale; rows in pair order."""
    out = _grouped_pairs(x, w, routing, gather)
    if bias is not None:
        out = out + bias[routing.experts]
    if activation:
        out = expert_activation(out.float(), activation).to(x.dtype)
    if row_scale is not None:
        out = (out.float() * row_scale[:, None]).to(x.dtype)
    return out


def _grouped_pairs(x: Tensor, w: Tensor, routing: MoeRouting, gather: bool) -> Tensor:
    """x's pair rows times their experts' weights, [P, N] in pair order."""
    flat = routing.experts
    rows = x.repeat_interleave(routing.top_k, dim=0) if gather else x  # [P, K]
    order = torch.argsort(flat, stable=True)
    offsets = torch.cumsum(expert_counts(flat, routing.n_experts), 0).to(torch.int32)
    out = torch.empty(rows.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
    out[order] = grouped_matmul(rows[order], w, offsets)
    return out


def grouped_matmul(x: Tensor, w: Tensor, offsets: Tensor) -> Tensor:
    """x [N, K] sorted by group, w [E, N_out, K] (rows as F.linear), offsets [E] int32 end of
    each group in x -> [N, N_out]: group e's rows times w[e]^T — torch._grouped_mm, or one
    matmul per group where that op is missing or the strides miss its 16-byte rule (eager
    only: that reads the group sizes on the host)."""
    wt = w.transpose(1, 2)  # [E, K, N_out] view
    if _grouped_mm_fits(x, w):
        return torch._grouped_mm(x, wt, offs=offsets)
    out = x.new_empty(x.shape[0], w.shape[1])
    start = 0
    for e, end in enumerate(offsets.tolist()):
        if end > start:
            out[start:end] = x[start:end] @ wt[e]
        start = end
    return out


def _grouped_mm_fits(x: Tensor, w: Tensor) -> bool:
    """torch._grouped_mm exists for this device and dtype and the rows are 16-byte aligned."""
    if not hasattr(torch, "_grouped_mm") or x.dtype not in (torch.bfloat16, torch.float32):
        return False
    if x.is_cuda and x.dtype != torch.bfloat16:
        return False
    size = x.element_size()
    return all(d * size % 16 == 0 for d in (x.shape[1], w.shape[1], w.shape[2]))
