"""The records the spec-decode loop (`specdec.SpecDecoder`) runs on: one decoding
configuration (`SpecConfig`), the per-batch state carried between its phases (`BatchState`),
what an iteration and a generation record, and the cache room a state needs."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from vegas_sim import methods
from vegas_sim.calibrate.policies import CollectingVerifyAttention
from vegas_sim.calibrate.replay import AcceptanceReplay
from vegas_sim.calibrate.runtime import GraphedForward, KVCache
from vegas_sim.calibrate.sampling import TokenProbs, check_sampling
from vegas_sim.errors import UserInputError
from vegas_sim.kernels import ops

MAX_GAMMA = 15  # verify_attention takes at most 16 query rows


def state_headroom(gamma: int) -> int:
    """Cache slots a state needs past its context C: 2·max(γ, 1) + 2 (an iteration writes
    [t0, d1..dγ] for the drafts and again for verify before rolling back; vanilla counts as
    γ = 1)."""
    return 2 * max(gamma, 1) + 2


@dataclass(frozen=True)
class SpecConfig:
    """One decoding configuration. temperature == 0 is greedy."""

    method: str
    gamma: int
    sparsity: float = methods.DEFAULT_SPARSITY
    min_tokens: int = methods.MIN_TOKENS
    sink: int = methods.SINK_TOKENS
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    # the verify pass's collected-score format (kernels/ops.SCORE_FORMATS); None: env
    # VEGAS_SIM_SCORE_FORMAT, else "bf16" (ops.default_score_format)
    score_format: str | None = None

    def __post_init__(self) -> None:
        if self.score_format is None:
            object.__setattr__(self, "score_format", ops.default_score_format())
        if self.score_format not in ops.SCORE_FORMATS:
            raise UserInputError(f"unknown score format {self.score_format!r}",
                                 where="score_format",
                                 fix=f"use one of {', '.join(ops.SCORE_FORMATS)}")
        if methods.drafts(self.method):
            methods.check_gamma(self.gamma)
        if self.gamma > MAX_GAMMA:
            raise UserInputError(f"gamma {self.gamma} > {MAX_GAMMA}", where="gamma",
                                 fix=f"verify at most 16 rows: use gamma <= {MAX_GAMMA}")
        methods.check_sparsity(self.sparsity)
        if self.min_tokens < 1 or self.sink < 0:
            raise UserInputError("min_tokens must be >= 1 and sink >= 0",
                                 where="min_tokens / sink", fix="use e.g. 256 and 16")
        check_sampling(self.temperature, self.top_p, self.top_k)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def spec(self) -> methods.Method:
        """The method's record (draft kind, selection phases, collection)."""
        return methods.method_of(self.method)

    @property
    def collect(self) -> str:
        """The verify pass's score collection mode."""
        return self.spec.collects


@dataclass
class IterationRecord:
    """One (request, iteration): acceptance.parquet's row without the run-level columns."""

    request: int
    iteration: int
    context: int  # C at the start of the iteration
    budget: int  # selected KV entries the drafts attended (before the forced tail)
    accepted: int  # 0..γ
    accept_prob: list[float]  # min(1, p/q) per drafted position (1/0 greedy), length γ
    emitted: int  # tokens emitted this iteration (a + 1, capped at max_new_tokens)


@dataclass
class GenerationResult:
    tokens: list[list[int]]  # new tokens per request (t0 from prefill first)
    records: list[IterationRecord]


@dataclass
class BatchState:
    """Everything one batch carries between phases. Tensors on the model's device."""

    cache: KVCache
    context: Tensor  # [B] int32 verified context C
    ctx_host: np.ndarray  # [B] int64 host mirror of `context` (budgets, records)
    t0: Tensor  # [B] int64 token at position C, not in the cache
    drafts: Tensor  # [B, γ] int64
    draft_probs: TokenProbs | None  # [B, γ] rows of q_j (sampling only)
    draft_policy: Any  # SparseDraftAttention | QuestDraftAttention | None (vanilla)
    verify_policy: CollectingVerifyAttention
    kmin: Tensor | None = None  # [L, B, P, Hkv, D] Quest page metadata
    kmax: Tensor | None = None
    target_logits: Tensor | None = None  # [B, γ+1, V] of the last verify
    # sampled rows whose tie group at the k-th logit ran past the slots (TopKProbs.overflow),
    # counted on the device: read once with SpecDecoder.tie_overflow_rows
    tie_overflows: Tensor | None = None
    accepted: Tensor | None = None  # [B] int64 of the last acceptance
    collect_ctx: np.ndarray | None = None  # [B] C of the last verify (selection rank_len − 1)
    budget_host: np.ndarray | None = None  # [B] budget of the current draft selection
    sparsity: np.ndarray | None = None  # [B] float64 per-request sparsity (None: config's)
    iteration: int = 0
    req_iteration: np.ndarray | None = None  # [B] iterations run while active
    done: np.ndarray | None = None  # [B] bool: emitted max_new_tokens, frozen
    emitted: list[list[int]] = field(default_factory=list)
    max_new_tokens: int = 0
    records: list[IterationRecord] = field(default_factory=list)
    synthetic: bool = False  # fixed context; emission bookkept, then forgotten, every iteration
    generator: torch.Generator | None = None
    replay: AcceptanceReplay | None = None
    # (role, n_query) -> (graph, the policy generation it was captured at)
    graphs: dict[tuple[str, int], tuple[GraphedForward, int]] = field(default_factory=dict)
    graph_pool: Any = None  # one memory pool for all graphs of this state

    @property
    def batch(self) -> int:
        return int(self.t0.shape[0])


def graphs_default(device: torch.device) -> bool:
    """CUDA graphs on CUDA unless VEGAS_SIM_CUDA_GRAPHS=0 (eager runs, e.g. for debugging)."""
    return device.type == "cuda" and os.environ.get("VEGAS_SIM_CUDA_GRAPHS", "1") != "0"
