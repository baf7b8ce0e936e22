"""Selection on the GPU: score → weight → mean, batched top-k, StreamingLLM and Quest indices.

- `score_weights`: one Triton pass over the collected scores: exp2(scale·log2e·s − lse·log2e)
  of bf16 scores, or exp2(d + m − lse·log2e) of the fp8 format (`reference.LogScores`, 0 where
  d is masked), averaged over heads (and rows), floored at WEIGHT_FLOOR inside rank_len, 0
  outside.
- `topk_select`: one top-k over [L, B, S] (batched over layers): `topk.radix_topk` on a GPU
  when all budgets are equal, else torch.topk; measured in
  benchmarks/kernels.py against the verify iteration.
Quest's ops are in `quest.py`.
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl
from torch import Tensor

from vegas_sim.kernels import reference
from vegas_sim.kernels.reference import SCORE_TILE, WEIGHT_FLOOR, LogScores
from vegas_sim.kernels.topk import radix_topk
from vegas_sim.kernels.verify_attention import LOG2E
from vegas_sim.kernels.verify_launch import OVERRIDES, next_pow2


@triton.jit
def _score_weights_kernel(
    SCORES, SCORE_MAX, LSE, RANK, ROWS, OUT, qk_scale2, R, HQ, S_MAX, inv_count,
    ONE_ROW: tl.constexpr, FLOOR: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_R: tl.constexpr,
    EVEN_S: tl.constexpr, FP8: tl.constexpr, SCORE_TILE: tl.constexpr,
):
    """One program = BLOCK_S keys of one request; steps over the request's (row, head) lines
    BLOCK_R at a time ([BLOCK_R, BLOCK_S] bf16 tile per step). The lines are contiguous:
    [r0·HQ, r0·HQ + n_lines) with r0 = rows[b] (one row) or 0 (all).

    No per-key load mask: keys past rank_len are read and discarded (they are valid memory),
    because a mask `offs < rank` (rank loaded at run time) stops Triton from vectorising the
    loads (docs/KERNELS.md, Score weights). Blocks entirely past rank_len skip the loads.
    FP8: SCORES holds d (float8 e4m3) and SCORE_MAX the m of every SCORE_TILE keys, read by a
    gather (SCORE_TILE keys share an address)."""
    b = tl.program_id(0)
    block0 = tl.program_id(1) * BLOCK_S
    offs = tl.max_contiguous(tl.multiple_of(block0 + tl.arange(0, BLOCK_S), BLOCK_S), BLOCK_S)
    rank = tl.load(RANK + b)
    if ONE_ROW:
        first = tl.load(ROWS + b).to(tl.int32) * HQ
        n_lines = HQ
    else:
        first = 0
        n_lines = R * HQ
    n_end = tl.where(block0 < rank, n_lines, 0)
    acc = tl.zeros([BLOCK_S], tl.float32)
    for j0 in range(0, n_end, BLOCK_R):
        j = j0 + tl.arange(0, BLOCK_R)
        ok = j < n_lines
        line = b * R * HQ + first + j  # [BLOCK_R] index into [B·R·HQ]
        lse2 = tl.load(LSE + line, mask=ok, other=float("inf")) * 1.4426950408889634
        ptr = SCORES + line.to(tl.int64)[:, None] * S_MAX + offs[None, :]
        if EVEN_S:
            mask = ok[:, None]
        else:
            mask = ok[:, None] & (offs < S_MAX)[None, :]
        if FP8:
            n_t = tl.cdiv(S_MAX, SCORE_TILE)
            d = tl.load(ptr, mask=mask, other=-448.0).to(tl.float32)
            mt = tl.load(SCORE_MAX + line.to(tl.int64)[:, None] * n_t
                         + (offs // SCORE_TILE)[None, :], mask=mask, other=0.0)
            x = tl.where(d > -448.0, d + mt - lse2[:, None], float("-inf"))
            acc += tl.sum(tl.exp2(x), 0)
        else:
            s = tl.load(ptr, mask=mask, other=float("-inf"))
            acc += tl.sum(tl.exp2(s.to(tl.float32) * qk_scale2 - lse2[:, None]), 0)
    w = tl.where(offs < rank, tl.maximum(acc * inv_count, FLOOR), 0.0)
    if EVEN_S:
        tl.store(OUT + b.to(tl.int64) * S_MAX + offs, w)
    else:
        tl.store(OUT + b.to(tl.int64) * S_MAX + offs, w, mask=offs < S_MAX)


def weights_blocks(s_max: int, n_lines: int) -> tuple[int, int, int]:
    """(BLOCK_S, BLOCK_R, warps): 2048-key rows (4 KB contiguous per (row, head) line), 16
    lines per step, 8 warps — a [16, 2048] bf16 tile (64 KB in flight per step), the best
    measured (docs/KERNELS.md, Score weights). The last block is masked against S_max (an
    argument Triton specialises as
    a multiple of 16, so the mask keeps 16-byte loads; only masks on *loaded* values, like
    rank_len, stop vectorisation). Short rows (tests) get a tile of <= 32768 elements."""
    block_s = min(2048, max(128, next_pow2(s_max)))
    block_r = min(max(1, 32768 // block_s), max(1, next_pow2(n_lines)))
    return block_s, block_r, 8 if block_s * block_r >= 16384 else 4


def score_weights(
    scores: Tensor | LogScores,
    lse: Tensor,
    scale: float,
    rank_len: Tensor,
    rows: Tensor | None = None,
    *,
    block_s: int | None = None,
    block_r: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    out: Tensor | None = None,
) -> Tensor:
    """Triton launcher; same contract as `reference.score_weights` (API.md); `out` a
    contiguous fp32 [B, S_max] that receives the weights."""
    fp8 = isinstance(scores, LogScores)
    d, m = (scores.d, scores.m) if isinstance(scores, LogScores) else (scores, None)
    B, R, Hq, S_max = d.shape
    assert d.is_contiguous() and (m is None or m.is_contiguous())
    lse = lse.float().contiguous()
    rank = rank_len.to(device=d.device, dtype=torch.int32).contiguous()
    if out is None:
        out = torch.empty(B, S_max, dtype=torch.float32, device=d.device)
    one_row = rows is not None
    row_t = rows.to(device=d.device, dtype=torch.int64).contiguous() if rows is not None else rank
    count = Hq if one_row else R * Hq
    auto_s, auto_r, auto_w = weights_blocks(S_max, count)
    block_s = auto_s if block_s is None else block_s
    block_r = auto_r if block_r is None else block_r
    num_warps = auto_w if num_warps is None else num_warps
    _score_weights_kernel[(B, triton.cdiv(S_max, block_s))](
        d, m if m is not None else lse, lse, rank, row_t, out, scale * LOG2E, R, Hq, S_max,
        1.0 / count, ONE_ROW=one_row, FLOOR=WEIGHT_FLOOR, BLOCK_S=block_s, BLOCK_R=block_r,
        EVEN_S=S_max % block_s == 0, FP8=fp8, SCORE_TILE=SCORE_TILE, num_warps=num_warps,
        **({} if num_stages is None else {"num_stages": num_stages}),
    )
    return out


# `topk.radix_topk` (sampled bracket + radix select, 3 launches, no atomics) for equal budgets
# on a GPU. Its index order is the same on every run: the sparse draft kernel sums the selected
# keys in index order, so drafts stay reproducible (calibration and the eager-vs-graphed GPU
# tests rely on it); ties at the k-th value go by position. It is faster than torch.topk and
# than atomic-order or fully sorted variants (docs/KERNELS.md, Radix top-k).
# VEGAS_SIM_RADIX_TOPK=0 goes back to torch.topk (verify_launch.Overrides).


def topk_select(weights: Tensor, budget: Tensor) -> Tensor:
    """[L, B, S] → [L, B, max(budget)] int32, batched over layers and requests.

    One host sync (K = max budget, as the reference). When every request has the same
    budget the top-K need not be sorted by value: on a GPU `radix_topk`, its index order
    fixed (unless VEGAS_SIM_RADIX_TOPK=0), else torch.topk(sorted=False), which skips a segmented
    sort of K entries per row; otherwise the reference's sorted top-K keeps the first
    budget[b] per row.
    """
    B = weights.shape[1]
    if B == 0:
        return reference.topk_select(weights, budget)
    lo, hi = (int(x) for x in torch.stack([budget.min(), budget.max()]).tolist())
    if lo != hi or hi == 0:
        return reference.topk_select(weights, budget)
    if OVERRIDES.radix_topk and weights.is_cuda and weights.dtype == torch.float32:
        return radix_topk(weights.contiguous(), hi)  # a fixed order
    return torch.topk(weights, hi, dim=-1, sorted=False).indices.to(torch.int32)


def stream_indices(context: Tensor, budget: Tensor, sink: int) -> tuple[Tensor, Tensor]:
    return reference.stream_indices(context, budget, sink)
