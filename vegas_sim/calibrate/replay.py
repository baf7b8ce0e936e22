"""Acceptance replay: take accept/reject decisions from a recorded real trace.

A random-weight model (8B shape, 128K context) has meaningless acceptance, so its latency runs
replay the *accepted counts* of a real model's trace: per request and iteration, the number of
drafts to accept. The loop still drafts, verifies, rolls back and emits with the real kernels
and batching; only the decision comes from here. Request r of the run replays recorded
sequence r mod n, and a request that runs longer than its recording wraps around.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from vegas_sim.errors import UserInputError


class AcceptanceReplay:
    """Per-request sequences of accepted-draft counts (one int per iteration)."""

    def __init__(self, sequences: list[list[int]]) -> None:
        if not sequences:
            raise UserInputError("acceptance replay needs at least one request sequence",
                                 where="AcceptanceReplay(sequences)",
                                 fix="pass the accepted counts of a recorded real trace")
        for r, seq in enumerate(sequences):
            if not seq:
                raise UserInputError(f"request {r} has no iterations",
                                     where="AcceptanceReplay(sequences)",
                                     fix="drop empty requests from the recorded trace")
            if min(seq) < 0:
                raise UserInputError(f"request {r} has a negative accepted count",
                                     where="AcceptanceReplay(sequences)",
                                     fix="accepted counts are 0..gamma")
        self.sequences = [[int(a) for a in seq] for seq in sequences]

    def accepted(self, request: int, iteration: int, gamma: int) -> int:
        """Drafts to accept for `request` at its `iteration`, capped at `gamma`."""
        seq = self.sequences[request % len(self.sequences)]
        return min(seq[iteration % len(seq)], gamma)

    def batch(self, iterations: Sequence[int], gamma: int) -> np.ndarray:
        """[B] int64 accepted counts; iterations[b] is request b's own iteration index."""
        return np.array([self.accepted(b, it, gamma) for b, it in enumerate(iterations)],
                        dtype=np.int64)

    @classmethod
    def from_frame(cls, frame: Any, **filters: Any) -> AcceptanceReplay:
        """From an acceptance table (trace set's acceptance.parquet as a pandas DataFrame).

        `filters` select rows by column value, e.g. method="vegas", gamma=6, workload="gsm8k".
        Each distinct (workload, request) becomes one sequence, ordered by iteration.
        """
        df = frame
        for col, val in filters.items():
            if col not in df.columns:
                raise UserInputError(f"no column {col!r}", where="acceptance table",
                                     fix=f"filter on one of: {', '.join(map(str, df.columns))}")
            df = df[df[col] == val]
        if len(df) == 0:
            raise UserInputError(f"no acceptance rows match {filters}", where="acceptance table",
                                 fix="choose filters present in the recorded trace")
        keys = [c for c in ("workload", "request") if c in df.columns]
        seqs = [list(g.sort_values("iteration")["accepted"].astype(int))
                for _, g in df.groupby(keys, sort=True)]
        return cls(seqs)

    @classmethod
    def from_records(cls, records: Sequence[Any]) -> AcceptanceReplay:
        """From specdec IterationRecords (request, iteration, accepted)."""
        by_req: dict[int, list[tuple[int, int]]] = {}
        for r in records:
            by_req.setdefault(int(r.request), []).append((int(r.iteration), int(r.accepted)))
        return cls([[a for _, a in sorted(v)] for _, v in sorted(by_req.items())])
