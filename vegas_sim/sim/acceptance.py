"""Acceptance model (STUB: interface only; the sim-models helper implements it).

Per (method, sparsity, context bucket, workload, temperature) from acceptance.parquet.
γ below traced: truncate (exact: the first γ drafts are the same tokens). γ above traced:
extend with per-position conditional rates from a fitted decay. Other sparsities / contexts:
monotone interpolation between traced points. Replay is a block bootstrap of real request
sequences, which keeps the correlation between consecutive iterations.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd


@dataclass
class AcceptanceDist:
    """Acceptance of one configuration, ready to replay."""

    method: str
    gamma: int
    rates: np.ndarray  # [gamma] per-position rates r_i = P(at least i drafts accepted)
    extrapolated: list[str] = field(default_factory=list)  # human-readable reasons; [] = inside

    @property
    def mean_length(self) -> float:
        """Mean acceptance length, bonus token included: 1 + Σ r_i."""
        return 1.0 + float(np.sum(self.rates))

    def sample(self, rng: np.random.Generator, n_requests: int, n_iterations: int) -> np.ndarray:
        """[n_requests, n_iterations] accepted drafts (0..gamma), block-bootstrapped."""
        raise NotImplementedError


class AcceptanceModel:
    @classmethod
    def from_traces(cls, acceptance: pd.DataFrame, weights_kind: str) -> AcceptanceModel:
        """Raises TraceSetError for random-weight traces (their acceptance is meaningless)."""
        raise NotImplementedError

    def lookup(
        self,
        method: str,
        gamma: int,
        sparsity: float,
        context: int,
        workload: str | None = None,
        temperature: float = 0.0,
    ) -> AcceptanceDist:
        raise NotImplementedError

    def coverage(self) -> dict[str, object]:
        """Traced ranges: methods, gamma max, sparsities, context range, workloads, temperatures."""
        raise NotImplementedError
