"""Mixture-of-experts FFN and sliding-window attention for the runtime (runtime.Layer).

MoE FFN (Qwen3-MoE, gpt-oss): a router scores every expert per token, the top-k are kept and
their softmax over the k logits weights the experts' outputs (Qwen3-MoE's norm_topk_prob and
gpt-oss's router agree on this). The experts run grouped: the T·k (token, expert) pairs are
sorted by expert and each expert multiplies its own contiguous group, so the step costs what
the routed tokens cost — on the GPU one Triton launch per projection (kernels/moe_gemm.py:
each program streams a slice of one expert's weight once for all its rows), elsewhere the
torch reference (torch._grouped_mm or a matmul per expert). Routing is device ops only, so
a CUDA graph captures the whole FFN.

Sliding-window attention (gpt-oss's even layers): row i of a request whose cache holds
`cache_lens` tokens (the NQ new ones included) attends the `window` newest keys up to its own
position, [p_i − window + 1, p_i] with p_i = cache_lens − NQ + i, plus the layer's attention
sinks when the model has them (a learned logit per query head in the softmax denominator,
with no value). It reads only the last window + NQ − 1 positions of the cache, so a draft
step reads the same bytes as verify, and never a key outside the window: on the GPU with
NQ <= 16 the verify kernel with its `window` mask (one launch, bf16 K/V read once per KV
head), else (prefill chunks, CPU) a gather of those positions and a masked softmax in torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from vegas_sim.kernels import ops
from vegas_sim.kernels.moe import expert_activation
from vegas_sim.methods import MAX_VERIFY_ROWS


def route(h: Tensor, router: Tensor, router_bias: Tensor | None, k: int
          ) -> tuple[Tensor, Tensor]:
    """h [T, H] -> (weights [T, k] fp32 softmax over the top-k logits, experts [T, k] int64)."""
    logits = F.linear(h, router, router_bias).float()  # [T, E]
    top, experts = logits.topk(k, dim=-1)
    return torch.softmax(top, dim=-1), experts


def moe_ffn(
    h: Tensor, router: Tensor, router_bias: Tensor | None, w13: Tensor, b13: Tensor | None,
    w2: Tensor, b2: Tensor | None, k: int, activation: str,
) -> Tensor:
    """h [..., H] normed -> [..., H]: Σ over the top-k experts of weight · expert(h).

    router [E, H]; w13 [E, 2F, H] (gate | up rows), b13 [E, 2F]; w2 [E, H, F], b2 [E, H]."""
    shape = h.shape
    x = h.reshape(-1, shape[-1])  # [T, H]
    weights, experts = route(x, router, router_bias, k)  # [T, k]
    routing = ops.moe_routing(experts, w13.shape[0])
    act = ops.moe_gemm(x, w13, b13, routing, gather=True, activation=activation)  # [T·k, F]
    down = ops.moe_gemm(act, w2, b2, routing, gather=False,
                        row_scale=weights.reshape(-1))  # [T·k, H], pair order, router-weighted
    out = down.view(-1, k, shape[-1]).sum(1, dtype=torch.float32).to(h.dtype)
    return out.reshape(shape)


def moe_ffn_reference(
    h: Tensor, router: Tensor, router_bias: Tensor | None, w13: Tensor, b13: Tensor | None,
    w2: Tensor, b2: Tensor | None, k: int, activation: str,
) -> Tensor:
    """`moe_ffn` one token at a time (a dense loop over its chosen experts): the test oracle."""
    x = h.reshape(-1, h.shape[-1])
    weights, experts = route(x, router, router_bias, k)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(k):
            e = int(experts[t, j])
            gu = F.linear(x[t], w13[e], None if b13 is None else b13[e])
            y = F.linear(expert_activation(gu, activation), w2[e], None if b2 is None else b2[e])
            out[t] += weights[t, j].to(y.dtype) * y
    return out.reshape(h.shape)


def window_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_lens: Tensor, scale: float, window: int,
    sinks: Tensor | None = None, use_kernel: bool | None = None,
) -> Tensor:
    """q [B, NQ, Hq, D]; k_cache/v_cache [B, S_max, Hkv, D] with the NQ new tokens written;
    cache_lens [B] includes them; sinks [Hq] or None -> [B, NQ, Hq, D] (see module doc).
    use_kernel None: the kernel on CUDA; True forces ops (e.g. the CPU interpreter)."""
    kernel = q.is_cuda if use_kernel is None else use_kernel
    if kernel and q.shape[1] <= MAX_VERIFY_ROWS:
        out, _lse, _ = ops.verify_attention(q, k_cache, v_cache, cache_lens, scale,
                                            sinks=sinks, window=window)
        return out
    return gathered_window_attention(q, k_cache, v_cache, cache_lens, scale, window, sinks)


def gathered_window_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_lens: Tensor, scale: float, window: int,
    sinks: Tensor | None = None,
) -> Tensor:
    """`window_attention` in torch for any NQ: the union of the rows' windows gathered, fp32
    scores, each row's mask. Same shapes."""
    B, NQ, Hq, D = q.shape
    hkv = k_cache.shape[2]
    span = window + NQ - 1  # the union of the rows' windows
    first = cache_lens.long()[:, None] - NQ - window + 1  # [B, 1] oldest key of row 0
    pos = first + torch.arange(span, device=q.device)  # [B, span] key positions
    idx = pos.clamp(0, k_cache.shape[1] - 1)
    k = torch.gather(k_cache, 1, idx[:, :, None, None].expand(B, span, hkv, D))
    v = torch.gather(v_cache, 1, idx[:, :, None, None].expand(B, span, hkv, D))
    group = Hq // hkv
    k = k.repeat_interleave(group, dim=2).float()  # [B, span, Hq, D]
    v = v.repeat_interleave(group, dim=2).float()
    scores = torch.einsum("bqhd,bshd->bhqs", q.float(), k) * scale  # [B, Hq, NQ, span]
    row = cache_lens.long()[:, None] - NQ + torch.arange(NQ, device=q.device)  # [B, NQ]
    keep = ((pos[:, None, :] <= row[:, :, None]) & (pos[:, None, :] > row[:, :, None] - window)
            & (pos[:, None, :] >= 0))  # [B, NQ, span]
    scores = scores.masked_fill(~keep[:, None], float("-inf"))
    if sinks is not None:  # one more logit per head, whose value is zero
        sink = sinks.float()[None, :, None, None].expand(B, Hq, NQ, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhqs,bshd->bqhd", probs, v)
    return out.to(q.dtype)
