"""Public kernel ops (API.md): Triton on CUDA tensors, the pure-torch reference otherwise.

Backend choice, per call:
- env `VEGAS_SIM_KERNELS=reference` forces the reference (e.g. to compare on the GPU);
- env `VEGAS_SIM_KERNELS=triton` forces Triton (CPU tests set it with `TRITON_INTERPRET=1`);
- otherwise Triton when the first tensor argument is on CUDA.

Triton is imported lazily (inside the launcher modules, which are imported here lazily), so
`import vegas_sim.kernels.ops` works without triton installed.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any, TypeAlias

import torch
from torch import Tensor

from vegas_sim.errors import UserInputError
from vegas_sim.kernels import moe, reference
from vegas_sim.kernels.reference import LogScores
from vegas_sim.methods import MAX_VERIFY_ROWS

ENV = "VEGAS_SIM_KERNELS"
# The collected-score format of the spec-decode runtime when its config names none
# (calibrate/spec_state.SpecConfig): "bf16" (default) or "fp8" (reference.LogScores).
SCORE_FORMAT_ENV = "VEGAS_SIM_SCORE_FORMAT"
COLLECT_MODES = ("none", "first_last", "all")
# rows of verify_attention's q whose scores are written for a collect mode; index lse with it
# (lse[:, collect_row_ids(NQ, mode)]) to get the lse that score_weights wants
collect_row_ids = reference.collect_row_ids
WEIGHT_FLOOR = reference.WEIGHT_FLOOR
# collected-score formats (reference.py): "bf16" raw q·k, "fp8" `LogScores`
SCORE_FORMATS = reference.SCORE_FORMATS
Scores: TypeAlias = Tensor | LogScores
empty_scores = reference.empty_scores
score_tiles = reference.score_tiles
FP8_DTYPE = reference.FP8_DTYPE


def backend(t: Tensor) -> str:
    """'triton' or 'reference' for an op whose main input is `t` (see module docstring)."""
    forced = os.environ.get(ENV, "").strip().lower()
    if forced in ("triton", "reference"):
        return forced
    if forced:
        raise UserInputError(
            f"unknown kernel backend {forced!r}", where=f"env {ENV}",
            fix="set it to 'triton' or 'reference', or unset it",
        )
    return "triton" if t.is_cuda else "reference"


def default_score_format() -> str:
    """The score format from env VEGAS_SIM_SCORE_FORMAT (read at each call), "bf16" unset."""
    value = os.environ.get(SCORE_FORMAT_ENV, "").strip().lower() or "bf16"
    if value not in SCORE_FORMATS:
        raise UserInputError(f"unknown score format {value!r}", where=f"env {SCORE_FORMAT_ENV}",
                             fix=f"set it to one of {', '.join(SCORE_FORMATS)}, or unset it")
    return value


def _triton_module(name: str) -> ModuleType:
    return importlib.import_module(f"vegas_sim.kernels.{name}")


def _check(cond: bool, op: str, arg: str, problem: str, fix: str) -> None:
    if not cond:
        raise UserInputError(problem, where=f"{op}({arg})", fix=fix)


def _check_sinks(op: str, q_heads: int, sinks: Tensor | None) -> None:
    _check(sinks is None or (sinks.dim() == 1 and sinks.shape[0] == q_heads
                             and sinks.is_floating_point()), op, "sinks",
           f"sinks must be a float [Hq] = [{q_heads}], got "
           f"{None if sinks is None else (tuple(sinks.shape), sinks.dtype)}",
           "pass the layer's attention-sink logits (one per query head) or None")


def _check_kv(op: str, q_heads: int, d: int, k_cache: Tensor, v_cache: Tensor) -> None:
    _check(k_cache.dim() == 4 and k_cache.shape == v_cache.shape, op, "k_cache, v_cache",
           f"caches must both be [B, S_max, Hkv, D], got {tuple(k_cache.shape)} and "
           f"{tuple(v_cache.shape)}", "pass one layer's caches in the API.md layout")
    hkv = k_cache.shape[2]
    _check(k_cache.shape[3] == d, op, "k_cache", f"head_dim {k_cache.shape[3]} != q's {d}",
           "use caches of the same model as q")
    _check(hkv > 0 and q_heads % hkv == 0, op, "q", f"Hq={q_heads} is not a multiple of "
           f"Hkv={hkv}", "grouped-query attention needs Hq divisible by Hkv")


def verify_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_lens: Tensor,
    scale: float,
    collect: str = "none",
    scores_out: Scores | None = None,
    sinks: Tensor | None = None,
    window: int = 0,
    score_format: str = "bf16",
) -> tuple[Tensor, Tensor, Scores | None]:
    """Causal attention of NQ (1..16) new rows per request; optional score write-out.

    q [B, NQ, Hq, D]; k_cache/v_cache [B, S_max, Hkv, D] with the NQ new tokens written;
    cache_lens [B] int32 (including them). Row i attends keys [0, cache_lens − NQ + i].
    sinks [Hq] (gpt-oss's attention-sink logits) or None: exp(sink_h) joins every row's
    softmax denominator, with no value. window > 0 (a sliding-window layer): row i attends
    only keys [cache_lens − NQ + i − window + 1, cache_lens − NQ + i]; no collection.
    Returns out [B, NQ, Hq, D], lse [B, NQ, Hq] fp32 (natural log of Σ exp(scale·q·k), plus
    exp(sink) with sinks),
    scores [B, R, Hq, S_max] bf16 raw q·k (-inf where masked) or None; R = 2 (rows 0 and
    NQ−1; 1 if NQ == 1) for collect="first_last", NQ for "all". `scores_out` (contiguous,
    that shape and dtype) receives the scores instead of a new tensor, e.g. one layer's slice
    of a buffer that holds every layer's. score_format "fp8": the scores are a
    `LogScores` (reference.py: base-2 d = x − m as float8 e4m3 plus fp32 m per SCORE_TILE
    keys), and `scores_out` one of those (`empty_scores`).
    """
    op = "verify_attention"
    _check(q.dim() == 4, op, "q", f"q must be [B, NQ, Hq, D], got {tuple(q.shape)}",
           "stack the new rows as [B, NQ, Hq, D]")
    _check(1 <= q.shape[1] <= MAX_VERIFY_ROWS, op, "q",
           f"NQ={q.shape[1]} outside 1..{MAX_VERIFY_ROWS}",
           "verify at most 16 rows (gamma <= 15) per call")
    _check(collect in COLLECT_MODES, op, "collect", f"unknown collect mode {collect!r}",
           f"use one of {', '.join(COLLECT_MODES)}")
    _check_kv(op, q.shape[2], q.shape[3], k_cache, v_cache)
    _check_sinks(op, q.shape[2], sinks)
    _check(window >= 0, op, "window", f"window={window} is negative",
           "pass 0 for full attention or the layer's sliding-window size")
    _check(window == 0 or collect == "none", op, "collect",
           f"collect={collect!r} with window={window}: sliding-window layers collect no scores",
           "pass collect='none' with a window")
    _check(score_format in SCORE_FORMATS, op, "score_format",
           f"unknown score format {score_format!r}", f"use one of {', '.join(SCORE_FORMATS)}")
    if scores_out is not None:
        B, NQ, Hq, _ = q.shape
        want = (B, len(collect_row_ids(NQ, collect)), Hq, k_cache.shape[1])
        _check(want[1] > 0, op, "scores_out", f"scores_out with collect={collect!r}",
               "pass scores_out only when rows are collected")
        _check_scores(op, "scores_out", scores_out, want, score_format)
    if backend(q) == "triton":
        mod = _triton_module("verify_attention")
        return mod.verify_attention(  # type: ignore[no-any-return]
            q, k_cache, v_cache, cache_lens, scale, collect, scores_out=scores_out, sinks=sinks,
            window=window, score_format=score_format)
    out, lse, scores = reference.verify_attention(q, k_cache, v_cache, cache_lens, scale, collect,
                                                  sinks, window, score_format)
    if scores_out is not None and scores is not None:
        scores = _copy_scores(scores_out, scores)
    return out, lse, scores


def _copy_scores(dst: Scores, src: Scores) -> Scores:
    if isinstance(dst, LogScores) and isinstance(src, LogScores):
        dst.d.copy_(src.d)
        dst.m.copy_(src.m)
        return dst
    assert isinstance(dst, Tensor) and isinstance(src, Tensor)
    return dst.copy_(src)


def _check_scores(op: str, arg: str, scores: object, want: tuple[int, ...] | None,
                  score_format: str) -> None:
    """scores is a contiguous buffer of `score_format` (of shape `want` unless None)."""
    if score_format == "bf16":
        ok = (isinstance(scores, Tensor) and scores.dim() == 4 and scores.is_contiguous()
              and scores.dtype == torch.bfloat16
              and (want is None or tuple(scores.shape) == want))
        got = (f"{tuple(scores.shape)} {scores.dtype}" if isinstance(scores, Tensor)
               else type(scores).__name__)
        _check(ok, op, arg, f"{arg} must be a contiguous bf16 {want or '[B, R, Hq, S_max]'}, "
               f"got {got}", "allocate it for this call's collect mode and shapes "
               "(ops.empty_scores), or pass score_format='fp8' with a LogScores")
        return
    ok = isinstance(scores, LogScores)
    if isinstance(scores, LogScores):
        d, m = scores
        lead = tuple(d.shape[:-1])
        ok = (d.dim() == 4 and d.dtype == reference.FP8_DTYPE and m.dtype == torch.float32
              and d.is_contiguous() and m.is_contiguous() and tuple(m.shape[:-1]) == lead
              and m.shape[-1] == reference.score_tiles(d.shape[-1])
              and (want is None or tuple(d.shape) == want))
        got = f"d {tuple(d.shape)} {d.dtype}, m {tuple(m.shape)} {m.dtype}"
    else:
        got = type(scores).__name__
    _check(ok, op, arg, f"{arg} of the fp8 format must be a contiguous LogScores: d "
           f"{want or '[B, R, Hq, S_max]'} float8_e4m3fn and m [B, R, Hq, "
           f"ceil(S_max / {reference.SCORE_TILE})] fp32, got {got}",
           "allocate it with ops.empty_scores(..., 'fp8')")


def sparse_draft_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    indices: Tensor,
    n_idx: Tensor,
    tail_start: Tensor,
    cache_lens: Tensor,
    scale: float,
    sinks: Tensor | None = None,
) -> Tensor:
    """One query row per request over indices[b, :n_idx[b]] + positions [tail_start, cache_lens).

    q [B, Hq, D]; caches [B, S_max, Hkv, D]; indices [B, K] int32 (all < tail_start, shared by
    the heads of a request); sinks [Hq] or None (as verify_attention). Returns [B, Hq, D] in
    q's dtype.
    """
    op = "sparse_draft_attention"
    _check(q.dim() == 3, op, "q", f"q must be [B, Hq, D], got {tuple(q.shape)}",
           "pass one query row per request")
    _check(indices.dim() == 2 and indices.shape[0] == q.shape[0], op, "indices",
           f"indices must be [B, K], got {tuple(indices.shape)}", "pass one index row per request")
    _check_kv(op, q.shape[1], q.shape[2], k_cache, v_cache)
    _check_sinks(op, q.shape[1], sinks)
    impl: Any = reference
    if backend(q) == "triton":
        impl = _triton_module("sparse_attention")
    return impl.sparse_draft_attention(  # type: ignore[no-any-return]
        q, k_cache, v_cache, indices, n_idx, tail_start, cache_lens, scale, sinks=sinks
    )


def score_weights(
    scores: Scores,
    lse: Tensor,
    scale: float,
    rank_len: Tensor,
    rows: Tensor | None = None,
    out: Tensor | None = None,
) -> Tensor:
    """Mean over heads (and collected rows) of exp(scale·s − lse): [B, S_max] fp32 — with the
    lse of a verify_attention with sinks, the model's sink-normalised probabilities.

    scores [B, R, Hq, S_max] bf16 (or the fp8 format's `LogScores`: weights
    exp2(d + m − lse·log2(e)), 0 where d is masked) and lse [B, R, Hq] from
    verify_attention; rank_len [B]:
    positions >= rank_len get 0 (inside: >= reference.WEIGHT_FLOOR, so top-k never prefers the
    outside); rows [B]: one row per request (SpecExtend) instead of the mean over R; `out`
    (contiguous fp32 [B, S_max]) receives the weights instead of a new tensor.
    """
    op = "score_weights"
    if isinstance(scores, LogScores):
        _check_scores(op, "scores", scores, None, "fp8")
    _check(len(scores.shape) == 4 and lse.shape == scores.shape[:3], op, "scores, lse",
           f"scores {tuple(scores.shape)} / lse {tuple(lse.shape)} do not match",
           "pass the scores and lse of the same verify_attention call")
    if out is not None:
        want = (scores.shape[0], scores.shape[3])
        _check(tuple(out.shape) == want and out.is_contiguous()
               and out.dtype == torch.float32, op, "out",
               f"out must be a contiguous fp32 {want}, got {tuple(out.shape)} {out.dtype}",
               "allocate [B, S_max] fp32")
    if backend(scores.d if isinstance(scores, LogScores) else scores) == "triton":
        mod = _triton_module("selection")
        return mod.score_weights(scores, lse, scale, rank_len, rows,  # type: ignore[no-any-return]
                                 out=out)
    w = reference.score_weights(scores, lse, scale, rank_len, rows)
    return w if out is None else out.copy_(w)


def topk_select(weights: Tensor, budget: Tensor) -> Tensor:
    """Top-budget[b] positions per (layer, request): [L, B, max(budget)] int32, -1 past budget."""
    _check(weights.dim() == 3, "topk_select", "weights",
           f"weights must be [L, B, S_max], got {tuple(weights.shape)}",
           "stack score_weights of all layers along dim 0")
    impl: Any = reference
    if backend(weights) == "triton":
        impl = _triton_module("selection")
    return impl.topk_select(weights, budget)  # type: ignore[no-any-return]


def stream_indices(context: Tensor, budget: Tensor, sink: int) -> tuple[Tensor, Tensor]:
    """StreamingLLM indices [B, max budget] int32 (sink + recent window of [0, context)), n_idx.

    Pure tensor arithmetic: the same code serves CPU and GPU.
    """
    return reference.stream_indices(context, budget, sink)


def quest_update_meta(
    kmin: Tensor, kmax: Tensor, k_cache: Tensor, start: Tensor, end: Tensor
) -> None:
    """Recompute in place the Quest min/max of pages touched by [start, end); end = cache length."""
    impl: Any = reference
    if backend(k_cache) == "triton":
        impl = _triton_module("quest")
    impl.quest_update_meta(kmin, kmax, k_cache, start, end)


def quest_select(
    q: Tensor, kmin: Tensor, kmax: Tensor, context: Tensor, n_pages: Tensor,
    max_pages: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Quest top n_pages full pages of [0, context) + the partial page: indices [B, K], n_idx.

    K = 16·(max n_pages + 1), read from the device (a host sync) unless `max_pages`
    (>= every n_pages) is given: then K = 16·(max_pages + 1) and the op is capturable in a
    CUDA graph whose n_pages change between replays."""
    impl: Any = reference
    if backend(q) == "triton":
        impl = _triton_module("quest")
    return impl.quest_select(q, kmin, kmax, context, n_pages,  # type: ignore[no-any-return]
                             max_pages)


# ---- the runtime's per-layer glue (layer_ops.py) -------------------------------------------


def add_rms_norm(x: Tensor, delta: Tensor | None, weight: Tensor, eps: float
                 ) -> tuple[Tensor, Tensor]:
    """(RMSNorm(x + delta) · weight, x + delta) for x, delta [..., H], weight [H]; no add
    when delta is None (the sum returned is then x)."""
    _check(weight.shape == x.shape[-1:], "add_rms_norm", "weight",
           f"weight {tuple(weight.shape)} does not match rows of {x.shape[-1]}",
           "pass the norm weight of this hidden size")
    _check(delta is None or delta.shape == x.shape, "add_rms_norm", "delta",
           f"delta {None if delta is None else tuple(delta.shape)} != x {tuple(x.shape)}",
           "add a residual of x's shape")
    impl: Any = _triton_module("layer_ops") if backend(x) == "triton" else reference
    return impl.add_rms_norm(x, delta, weight, eps)  # type: ignore[no-any-return]


def silu_mul(gate_up: Tensor) -> Tensor:
    """silu(gate) · up of gate_up [..., 2F] (gate | up) -> [..., F]."""
    _check(gate_up.shape[-1] % 2 == 0, "silu_mul", "gate_up",
           f"last dim {gate_up.shape[-1]} is odd", "pass gate and up concatenated")
    impl: Any = _triton_module("layer_ops") if backend(gate_up) == "triton" else reference
    return impl.silu_mul(gate_up)  # type: ignore[no-any-return]


def qkv_rope_append(
    qkv: Tensor, n_heads: int, q_norm: Tensor | None, k_norm: Tensor | None, eps: float,
    cos_table: Tensor, sin_table: Tensor, cache_lens: Tensor, k_cache: Tensor, v_cache: Tensor,
) -> Tensor:
    """q [B, NQ, Hq, D] from the fused projection qkv [B, NQ, (Hq + 2·Hkv)·D] (q | k | v):
    q and k per-head RMSNormed when q_norm/k_norm are given (Qwen3), both rotated (half-split
    RoPE at positions cache_lens[b] + i from cos/sin_table [positions, D/2] fp32), and k, v
    written into one layer's k_cache/v_cache [B, S_max, Hkv, D] at those positions.
    cache_lens [B] int32 counts the tokens *before* these."""
    op = "qkv_rope_append"
    _check_kv(op, n_heads, k_cache.shape[3], k_cache, v_cache)
    Hkv, D = k_cache.shape[2], k_cache.shape[3]
    _check(qkv.dim() == 3 and qkv.shape[2] == (n_heads + 2 * Hkv) * D, op, "qkv",
           f"qkv {tuple(qkv.shape)} is not [B, NQ, (Hq + 2·Hkv)·D] = [B, NQ, "
           f"{(n_heads + 2 * Hkv) * D}]", "pass the output of the fused q|k|v projection")
    _check(cos_table.shape == sin_table.shape and cos_table.shape[-1] == D // 2, op,
           "cos_table", f"rope tables {tuple(cos_table.shape)} are not [positions, {D // 2}]",
           "build them with runtime.rope_table")
    # Triton's aranges are powers of two; other head sizes keep the torch path
    fusable = D >= 2 and (D & (D - 1)) == 0 and k_cache.stride(3) == 1 \
        and k_cache.stride(2) == D and v_cache.stride() == k_cache.stride()
    impl: Any = reference
    if backend(qkv) == "triton" and fusable:
        impl = _triton_module("layer_ops")
    return impl.qkv_rope_append(  # type: ignore[no-any-return]
        qkv, n_heads, q_norm, k_norm, eps, cos_table, sin_table, cache_lens, k_cache, v_cache)


def moe_routing(experts: Tensor, n_experts: int) -> moe.MoeRouting:
    """The router's top-k experts [T, k] sorted into expert blocks (kernels/moe.py), once per
    layer and step, shared by both expert GEMMs."""
    _check(experts.dim() == 2 and not experts.is_floating_point(), "moe_routing", "experts",
           f"experts must be an int [T, k], got {tuple(experts.shape)} {experts.dtype}",
           "pass the indices of the router's top-k")
    impl: Any = _triton_module("moe_gemm") if backend(experts) == "triton" else moe
    return impl.moe_routing(experts, n_experts)  # type: ignore[no-any-return]


def moe_gemm(x: Tensor, w: Tensor, bias: Tensor | None, routing: moe.MoeRouting, gather: bool,
             activation: str | None = None, row_scale: Tensor | None = None) -> Tensor:
    """Every routed pair p times its expert's weight: x [T, K] (gather: pair p = t·k + j reads
    token t) or [P, K] (rows are pairs); w [E, N, K] (rows as F.linear); bias [E, N] or None
    -> [P, N] in pair order. `activation` ("silu" or "gpt_oss"): w's rows are gate | up and
    the output is the activation of both, [P, N/2]; `row_scale` [P] fp32 multiplies each
    pair's row (the router weight) last."""
    op = "moe_gemm"
    rows = x.shape[0] * routing.top_k if gather else x.shape[0]
    _check(x.dim() == 2 and w.dim() == 3 and w.shape[2] == x.shape[1]
           and w.shape[0] == routing.n_experts, op, "x, w",
           f"x {tuple(x.shape)} and w {tuple(w.shape)} are not [rows, K] and "
           f"[{routing.n_experts}, N, K]", "pass the expert weights stacked [E, N, K]")
    _check(rows == routing.experts.numel(), op, "x",
           f"{rows} pairs from x against {routing.experts.numel()} routed",
           "gather=True for token rows, False for pair rows")
    _check(bias is None or bias.shape == w.shape[:2], op, "bias",
           f"bias {None if bias is None else tuple(bias.shape)} is not [E, N]",
           "pass one bias row per expert or None")
    _check(activation in (None, *moe.ACTIVATIONS[1:]) and (not activation or w.shape[1] % 2 == 0),
           op, "activation", f"activation {activation!r} with {w.shape[1]} weight rows",
           f"use one of {moe.ACTIVATIONS[1:]} on gate | up rows, or None")
    _check(row_scale is None or row_scale.shape == (rows,), op, "row_scale",
           f"row_scale {None if row_scale is None else tuple(row_scale.shape)} is not [{rows}]",
           "pass one weight per routed pair")
    impl: Any = moe.moe_gemm_reference
    if backend(x) == "triton" and x.stride(1) == 1 and routing.pair_rows.is_cuda == x.is_cuda:
        impl = _triton_module("moe_gemm").moe_gemm
    return impl(x, w, bias, routing, gather, activation, row_scale)  # type: ignore[no-any-return]
