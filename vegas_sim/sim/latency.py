"""Latency model (STUB: interface only; the sim-models helper implements it).

Per phase, time = fixed overhead + GEMM roofline term (weight bytes vs FLOPs for the B·n_query
tokens in flight) + KV-bytes term (Σ over requests of kv_read) + score-collection / selection
terms, each feature expressed in roofline seconds on the measured GPU, coefficients fitted with
non-negative least squares to latency.parquet. Linear in bytes, so it extrapolates along the
physics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from vegas_sim.gpus import GpuSpec
from vegas_sim.models import ModelSpec


@dataclass(frozen=True)
class MeasuredGpu:
    """What the trace set measured (meta.json 'gpu')."""

    name: str
    copy_bandwidth_gbs: float
    bf16_tflops: float
    memory_gb: float


class IterationCost:
    """Fast evaluator of one iteration's time for a fixed (method, gamma, sparsity).

    Called once per simulated iteration: must take only a few microseconds at batch 128.
    """

    def __call__(self, contexts: np.ndarray) -> float:
        """Total iteration time in ms for a batch whose requests hold `contexts` tokens."""
        raise NotImplementedError

    def breakdown(self, contexts: np.ndarray) -> dict[str, float]:
        """ms per phase (draft_step summed over the γ steps, etc.)."""
        raise NotImplementedError


class LatencyModel:
    @classmethod
    def fit(cls, latency: pd.DataFrame, model: ModelSpec, gpu: MeasuredGpu) -> LatencyModel:
        raise NotImplementedError

    def phase_ms(
        self, phase: str, method: str, n_query: int, kv_read: np.ndarray, collect_rows: int = 0
    ) -> float:
        """Predicted ms of one call of `phase` for a batch with per-request `kv_read`."""
        raise NotImplementedError

    def iteration_cost(
        self, method: str, gamma: int, sparsity: float, min_tokens: int = 256
    ) -> IterationCost:
        raise NotImplementedError

    def loo_errors(self) -> pd.DataFrame:
        """Leave-one-out relative error per phase: columns phase, n_points, median_pct, max_pct."""
        raise NotImplementedError

    def what_if(self, target: GpuSpec) -> LatencyModel:
        """Rescale to an unmeasured GPU by datasheet bandwidth/FLOP ratios."""
        raise NotImplementedError

    @property
    def model(self) -> ModelSpec:
        raise NotImplementedError

    @property
    def gpu_label(self) -> str:
        """E.g. 'NVIDIA H200 (measured)' or 'h100-sxm (what-if, not measured)'."""
        raise NotImplementedError


LatencyFn = Callable[[np.ndarray], float]
