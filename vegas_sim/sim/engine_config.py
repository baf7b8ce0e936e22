"""What one simulated run takes and gives: the cost and acceptance interfaces the engine
calls (`CostFn`, `AcceptanceSampler`), `EngineConfig` (the run) and `EngineResult` (every
request's, iteration's and running segment's record). The run itself is `engine.simulate`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from vegas_sim.errors import UserInputError
from vegas_sim.methods import check_gamma, drafts, query_rows
from vegas_sim.sim.workload import Arrivals, Lengths

PREFILL_MODES = ("disaggregated", "co-located")


# ---------------------------------------------------------------------------- interfaces
class CostFn(Protocol):
    """What the engine needs of `iteration_cost.IterationCost`."""

    def __call__(self, contexts: np.ndarray) -> float: ...

    def breakdown(self, contexts: np.ndarray) -> dict[str, float]: ...


class AcceptanceSampler(Protocol):
    """What the engine needs of `acceptance.AcceptanceDist`."""

    gamma: int

    @property
    def mean_length(self) -> float: ...

    def sample(
        self, rng: np.random.Generator, n_requests: int, n_iterations: int
    ) -> np.ndarray: ...


PrefillFn = Callable[[np.ndarray], float]  # input lengths [k] -> ms to prefill them


def check_run_fields(*, gamma: int, batch: int, requests: int | None, prefill: str,
                     kv_block_size: int, prefill_gpus: int) -> None:
    """The checks a run's fields get, as a `Scenario` (`scenario.validate_scenario`) or an
    `EngineConfig` (`validate`) holds them: each a UserInputError naming the option and the
    fix. requests None is a scenario's default (a multiple of the batch)."""
    check_gamma(gamma)
    if batch < 1:
        raise UserInputError(f"batch must be >= 1, got {batch}", where="--batch",
                             fix="pass --batch 1 or more")
    if requests is not None and requests < 1:
        raise UserInputError(f"requests must be >= 1, got {requests}", where="--requests",
                             fix="pass --requests 1 or more, or leave it out")
    if prefill not in PREFILL_MODES:
        raise UserInputError(f"unknown prefill mode {prefill!r}", where="--prefill",
                             fix=f"use one of: {', '.join(PREFILL_MODES)}")
    if kv_block_size < 1:
        raise UserInputError(f"KV block size must be >= 1, got {kv_block_size}",
                             where="--kv-block-size", fix="use vLLM's 16, or e.g. 32")
    if prefill_gpus < 1:
        raise UserInputError(f"prefill GPUs must be >= 1, got {prefill_gpus}",
                             where="--prefill-gpus", fix="pass --prefill-gpus 1 or more")


@dataclass(frozen=True)
class EngineConfig:
    """One simulated run. ``kv_capacity_tokens`` None = unlimited KV cache."""

    method: str
    gamma: int
    max_batch: int
    n_requests: int
    lengths: Lengths = field(default_factory=Lengths)
    arrivals: Arrivals = field(default_factory=Arrivals)
    kv_capacity_tokens: int | None = None
    prefill: str = "disaggregated"
    kv_block_size: int = 16  # vLLM's default block size (tokens per KV block)
    prefill_gpus: int = 1  # disaggregated: GPUs of the prefill stage
    kv_transfer_ms_per_token: float = 0.0  # disaggregated: prefill → decode KV hand-over

    @property
    def kv_capacity_blocks(self) -> int | None:
        """Whole KV blocks in the cache (None: unlimited)."""
        if self.kv_capacity_tokens is None:
            return None
        return self.kv_capacity_tokens // self.kv_block_size

    def blocks(self, tokens: int) -> int:
        """KV blocks that hold ``tokens`` plus the slots one step reserves (``slack``)."""
        return -(-(tokens + self.slack) // self.kv_block_size)

    @property
    def is_vanilla(self) -> bool:
        return not drafts(self.method)

    @property
    def slack(self) -> int:
        """KV slots one step reserves beyond a request's context: the γ drafts and t0 (vanilla:
        the one new token)."""
        return query_rows(self.method, self.gamma)

    def validate(self) -> None:
        check_run_fields(gamma=self.gamma, batch=self.max_batch, requests=self.n_requests,
                         prefill=self.prefill, kv_block_size=self.kv_block_size,
                         prefill_gpus=self.prefill_gpus)
        if not self.kv_transfer_ms_per_token >= 0:
            raise UserInputError("the KV transfer time must be >= 0",
                                 where="--kv-link-gbs", fix="pass a positive bandwidth")
        self.lengths.validate()
        self.arrivals.validate(self.n_requests)


# ---------------------------------------------------------------------------- result
@dataclass
class EngineResult:
    """Everything one run produced. Times in ms; arrays indexed by request id or iteration."""

    config: EngineConfig
    # per request [R]
    input_len: np.ndarray
    output_len: np.ndarray
    arrival_ms: np.ndarray
    admit_ms: np.ndarray
    first_iter: np.ndarray  # global index of the request's first iteration
    last_iter: np.ndarray  # global index of its last iteration
    n_iters: np.ndarray  # iterations the request took part in (all its running segments)
    first_token_ms: np.ndarray  # end of its first decode iteration (first decode chunk)
    finish_ms: np.ndarray  # end of its last iteration
    emitted: np.ndarray  # tokens it produced, over all its segments (= output_len)
    # per iteration [I]
    iter_start_ms: np.ndarray
    iter_ms: np.ndarray
    iter_batch: np.ndarray  # running requests
    iter_tokens: np.ndarray  # tokens produced
    iter_new: np.ndarray  # requests in their first iteration
    iter_kv_blocks: np.ndarray  # KV blocks the running requests hold during the iteration
    # running segments [S]: a request runs in one segment, or several when it is preempted
    seg_request: np.ndarray
    seg_first_iter: np.ndarray  # global iteration the segment starts at
    seg_first_local: np.ndarray  # the request's own iteration index at the segment's start
    seg_iters: np.ndarray  # iterations in the segment
    # acceptance actually used (drawn, before truncation at the output length)
    accepted_hist: np.ndarray  # [gamma + 1] count of iterations with k accepted drafts
    breakdown_ms: dict[str, float]  # mean ms per iteration by phase (sampled)
    prefill_ms_total: float
    wall_s: float
    preemptions: int  # requests taken out of the running batch because the KV cache was full
    recompute_ms_total: float  # re-prefilling preempted requests (prompt + generated so far)
    last_admission_ms: float  # latest (re)admission, resumptions after preemption included
    # [R] when its first output token exists: the prefill's token (module docstring)
    first_output_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # [R] prefill + KV transfer counted before its arrival (closed loop, disaggregated)
    handoff_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # [R] when it joined this instance's queue (after the prefill stage, disaggregated)
    queued_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def iterations(self) -> int:
        return int(self.iter_ms.shape[0])

    @property
    def sim_time_ms(self) -> float:
        return float(self.finish_ms.max()) if self.finish_ms.size else 0.0

    @property
    def iter_end_ms(self) -> np.ndarray:
        return self.iter_start_ms + self.iter_ms
