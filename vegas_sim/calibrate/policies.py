"""Attention policies of the spec-decode loop (runtime.AttentionPolicy), one per role.

- `SparseDraftAttention`: one draft row per request over a per-(layer, request) index list plus
  the forced tail [tail_start, cache_lens) — magicdec-stream (same list for every layer), vegas,
  vegas-all and specextend (one list per layer from the last selection).
- `QuestDraftAttention`: magicdec-quest; selects pages inside every layer from that layer's
  query (ops.quest_select), then attends them plus the tail from C.
- `CollectingVerifyAttention`: the verify pass (full causal attention, ops.verify_attention)
  that also turns the collected raw scores into per-position weights (ops.score_weights): for
  Vegas (first_last) every layer's raw scores in one buffer, folded in one launch after the
  last layer; for vegas-all and SpecExtend (all rows) right after each layer's attention,
  so their up-to-16-row scores are never kept for all layers.

All attention and selection math goes through kernels.ops (Triton on CUDA, reference on CPU).
Every `attend` takes the layer's attention sinks ([Hq] logits, gpt-oss; None for models
without) and hands them to the kernels, so drafts and verify use the model's softmax; the
collected weights are then normalised with the sink too (kernels/API.md).
Buffers are allocated once with a fixed capacity and updated in place, so a captured CUDA graph
(runtime.GraphedForward) keeps reading the current values.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import Tensor

from vegas_sim.kernels import ops

PhaseFn = Callable[[str], AbstractContextManager[None]]


def _no_phase(name: str) -> AbstractContextManager[None]:
    return nullcontext()


class SparseDraftAttention:
    """indices[layer or 0, b, :n_idx[b]] + positions [tail_start[b], cache_lens[b])."""

    def __init__(self, n_layers: int, batch: int, capacity: int, device: torch.device,
                 shared: bool) -> None:
        # shared: one index list for all layers (StreamingLLM); else one per layer.
        self.shared = shared
        layers = 1 if shared else n_layers
        self.indices = torch.full((layers, batch, max(capacity, 1)), -1, dtype=torch.int32,
                                  device=device)  # [L or 1, B, K_cap]
        self.n_idx = torch.zeros(batch, dtype=torch.int32, device=device)  # [B]
        self.tail_start = torch.zeros(batch, dtype=torch.int32, device=device)  # [B]
        # Bumped when `indices` is reallocated: a CUDA graph captured before reads the old
        # tensor, so its owner must capture again (SpecDecoder checks this).
        self.generation = 0

    def set(self, indices: Tensor, n_idx: Tensor, tail_start: Tensor) -> None:
        """indices [L or 1, B, K] (or [B, K] when shared), -1 past n_idx; all < tail_start."""
        if indices.dim() == 2:
            indices = indices[None]
        k = indices.shape[-1]
        if k > self.indices.shape[-1]:  # grow; graphs that read the old tensor are stale
            self.indices = torch.full(self.indices.shape[:2] + (k,), -1, dtype=torch.int32,
                                      device=self.indices.device)
            self.generation += 1
        self.indices.fill_(-1)
        self.indices[:, :, :k].copy_(indices.expand(self.indices.shape[0], -1, -1))
        self.n_idx.copy_(n_idx)
        self.tail_start.copy_(tail_start)

    def attend(self, layer: int, q: Tensor, k_cache: Tensor, v_cache: Tensor,
               cache_lens: Tensor, scale: float, sinks: Tensor | None = None) -> Tensor:
        # q [B, 1, Hq, D] -> [B, 1, Hq, D]
        idx = self.indices[0 if self.shared else layer]  # [B, K_cap]
        out = ops.sparse_draft_attention(q[:, 0], k_cache, v_cache, idx, self.n_idx,
                                         self.tail_start, cache_lens, scale, sinks)
        return out[:, None]


class QuestDraftAttention:
    """Quest drafting: per layer, top n_pages pages of [0, C) by the page bound + partial page."""

    def __init__(self, kmin: Tensor, kmax: Tensor, batch: int, device: torch.device,
                 phase: PhaseFn = _no_phase, max_pages: int | None = None) -> None:
        self.kmin, self.kmax = kmin, kmax  # [L, B, P, Hkv, D] page channel-wise min / max
        # A fixed bound on n_pages keeps ops.quest_select free of host syncs (CUDA graphs).
        self.max_pages = max_pages
        self.context = torch.zeros(batch, dtype=torch.int32, device=device)  # [B] C, tail start
        self.n_pages = torch.ones(batch, dtype=torch.int32, device=device)  # [B]
        self.phase = phase  # times page scoring as "quest_meta" (off inside CUDA graphs)

    def set(self, context: Tensor, n_pages: Tensor) -> None:
        self.context.copy_(context)
        self.n_pages.copy_(n_pages)

    def attend(self, layer: int, q: Tensor, k_cache: Tensor, v_cache: Tensor,
               cache_lens: Tensor, scale: float, sinks: Tensor | None = None) -> Tensor:
        q1 = q[:, 0]  # [B, Hq, D]
        with self.phase("quest_meta"):
            idx, n_idx = ops.quest_select(q1, self.kmin[layer], self.kmax[layer], self.context,
                                          self.n_pages, self.max_pages)
        out = ops.sparse_draft_attention(q1, k_cache, v_cache, idx, n_idx, self.context,
                                         cache_lens, scale, sinks)
        return out[:, None]


def collected_rows(x: Tensor, collect: str) -> Tensor:
    """x [B, NQ, ...] -> its rows of `collect` (reference.collect_row_ids) by slicing: an
    index list would be copied to the device, which a CUDA graph capture does not allow."""
    nq = x.shape[1]
    if collect == "first_last" and nq > 1:
        return x[:, :: nq - 1]  # rows 0 and NQ-1
    if collect == "first_last":
        return x[:, :1]
    if collect == "all":
        return x
    raise ValueError(f"no rows are collected with collect={collect!r}")


class CollectingVerifyAttention:
    """Full causal attention of the NQ rows; collected scores → weights.

    collect: "none" | "first_last" (vegas; also the one-row prefill collection) | "all".
    per_row: keep one weight vector per collected row ([L, B, R, S_max], SpecExtend picks the
    last accepted row after acceptance) instead of their mean ([L, B, S_max]).
    n_heads > 0 with first_last means: batch the fold — every layer writes its raw scores
    (≤ 2 rows) into one buffer, and the last layer folds all layers in one score_weights
    launch instead of one launch a layer (benchmarks/kernels.py times both); the buffer costs
    2·Hq bf16 per (layer, request, slot), small beside the KV cache's 2·Hkv·D per token.
    Otherwise each layer folds its own scores right after its attention.
    score_format: the collected scores' format (ops.SCORE_FORMATS): "bf16" raw q·k, or "fp8"
    (base-2 d = x − m in float8 e4m3 plus fp32 m per SCORE_TILE keys; the batched fold's
    buffer then holds 1 + 4/SCORE_TILE bytes per score instead of 2).
    """

    def __init__(self, n_layers: int, batch: int, max_seq: int, device: torch.device,
                 collect: str, per_row: bool = False, max_rows: int = 1,
                 n_heads: int = 0, fold_layer: int | None = None,
                 score_format: str = "bf16") -> None:
        if score_format not in ops.SCORE_FORMATS:
            raise ValueError(f"score_format must be one of {ops.SCORE_FORMATS}, "
                             f"got {score_format!r}")
        self.collect = collect
        self.score_format = score_format
        # the layer after whose attention the batched fold runs: the last layer that calls the
        # policy (a hybrid model's sliding-window layers attend without it)
        self.fold_layer = n_layers - 1 if fold_layer is None else fold_layer
        self.per_row = per_row
        self.n_layers = n_layers
        self.rank_len = torch.zeros(batch, dtype=torch.int32, device=device)  # [B]
        shape = (n_layers, batch, max_rows, max_seq) if per_row else (n_layers, batch, max_seq)
        self.weights = torch.zeros(shape if collect != "none" else (0,), dtype=torch.float32,
                                   device=device)
        fold_all = collect == "first_last" and not per_row and n_heads > 0
        # [L, B, R, Hq, S_max] bf16 (fp8: d [L, B, R, Hq, S_max] e4m3 and m [L, B, R, Hq,
        # tiles] fp32) and [L, B, R, Hq] fp32 for R <= 2, viewed per call's R; zeroed: layers
        # that never call the policy (window layers) fold to finite weights
        lines = n_layers * batch * 2 * n_heads if fold_all else 0
        fp8 = score_format == "fp8"
        self.all_scores = torch.zeros(lines * max_seq, device=device,
                                      dtype=ops.FP8_DTYPE if fp8 else torch.bfloat16)
        self.all_score_max = torch.zeros(lines * ops.score_tiles(max_seq) if fp8 else 0,
                                         dtype=torch.float32, device=device)
        self.all_lse = torch.zeros(n_layers * batch * 2 * n_heads if fold_all else 0,
                                   dtype=torch.float32, device=device)

    def attend(self, layer: int, q: Tensor, k_cache: Tensor, v_cache: Tensor,
               cache_lens: Tensor, scale: float, sinks: Tensor | None = None) -> Tensor:
        if self.all_scores.numel():
            return self._attend_fold_all(layer, q, k_cache, v_cache, cache_lens, scale, sinks)
        out, lse, scores = ops.verify_attention(q, k_cache, v_cache, cache_lens, scale,
                                                self.collect, sinks=sinks,
                                                score_format=self.score_format)
        if scores is not None:
            lse_rows = collected_rows(lse, self.collect)  # [B, R, Hq] of the collected rows
            if self.per_row:
                self._per_row_weights(layer, scores, lse_rows, scale)
            else:
                self.weights[layer].copy_(ops.score_weights(scores, lse_rows, scale,
                                                            self.rank_len))
        return out

    def _attend_fold_all(self, layer: int, q: Tensor, k_cache: Tensor, v_cache: Tensor,
                         cache_lens: Tensor, scale: float, sinks: Tensor | None) -> Tensor:
        """Scores into layer `layer`'s slice of all_scores; after the last layer, one
        score_weights over [L·B, R, Hq, S] → weights [L, B, S] (viewed as [L·B, S])."""
        B, NQ, Hq, _ = q.shape
        S, L = k_cache.shape[1], self.n_layers
        R = len(ops.collect_row_ids(NQ, self.collect))  # first_last: rows 0 and NQ-1
        lines = L * B * R * Hq
        d = self.all_scores[: lines * S].view(L, B, R, Hq, S)
        lse_all = self.all_lse[:lines].view(L, B, R, Hq)
        layer_out: ops.Scores = d[layer]
        every: ops.Scores = d.view(L * B, R, Hq, S)
        if self.score_format == "fp8":
            n_t = ops.score_tiles(S)
            m = self.all_score_max[: lines * n_t].view(L, B, R, Hq, n_t)
            layer_out = ops.LogScores(d[layer], m[layer])
            every = ops.LogScores(d.view(L * B, R, Hq, S), m.view(L * B, R, Hq, n_t))
        out, lse, _ = ops.verify_attention(q, k_cache, v_cache, cache_lens, scale, self.collect,
                                           scores_out=layer_out, sinks=sinks,
                                           score_format=self.score_format)
        lse_all[layer].copy_(collected_rows(lse, self.collect))
        if layer == self.fold_layer:
            ops.score_weights(every, lse_all.view(L * B, R, Hq), scale,
                              self.rank_len.repeat(L), out=self.weights.view(L * B, S))
        return out

    def _per_row_weights(self, layer: int, scores: ops.Scores, lse_rows: Tensor,
                         scale: float) -> None:
        # Fold rows into the batch so one score_weights call gives each row its own head-mean:
        # [B, R, Hq, S] -> [B·R, 1, Hq, S] -> weights [B·R, S] -> [B, R, S].
        B, R, Hq, S = scores.shape
        rank_len = self.rank_len[:, None].expand(B, R).reshape(B * R)  # no host sync
        w = ops.score_weights(scores.reshape(B * R, 1, Hq, S), lse_rows.reshape(B * R, 1, Hq),
                              scale, rank_len)
        self.weights[layer, :, :R].copy_(w.view(B, R, S))
