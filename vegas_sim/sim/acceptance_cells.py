"""Acceptance cells, the units `acceptance.AcceptanceModel` is built from: their keys
(`CellKey`, `GroupKey`, `BucketKey`), the traced rows checked and split into runs, runs
bucketed by start context per workload, one cell's flattened runs (`make_cell`) and cells
pooled across workloads, the stretch of a replayed γ, and the smoother over a group's cells.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from vegas_sim.errors import TraceSetError
from vegas_sim.sim.acceptance_dist import TracedCell
from vegas_sim.traces.schema import MAX_EXACT_BUCKETS  # more start contexts → log2-wide buckets

ACCEPTANCE_WHERE = "acceptance.parquet"


# Gaussian-kernel bandwidths of the local-linear smoother of cell rates, in natural-log units of
# sparsity and of context (chosen by cross-validation: the `acceptance` docstring, Smoothing)
SMOOTH_BW_LOG_SPARSITY = 0.4


SMOOTH_BW_LOG_CONTEXT = 0.5


_SLOPE_RIDGE = 1e-3  # ridge on the local slopes: a degenerate direction falls back to a mean


class CellKey(NamedTuple):
    """One acceptance cell: all runs of one traced configuration and context bucket."""

    method: str
    temperature: float
    workload: str
    sparsity: float
    bucket: float  # the runs' start-context bucket centre (tokens)
    gamma: int  # traced γ

    @property
    def group(self) -> GroupKey:
        """The smoothing / context-trend group the cell belongs to."""
        return GroupKey(self.method, self.temperature, self.workload, self.gamma)

    @property
    def at_bucket(self) -> BucketKey:
        """The (group, bucket) whose traced sparsities one sparsity trend is fitted over."""
        return BucketKey(self.method, self.temperature, self.workload, self.bucket, self.gamma)


class GroupKey(NamedTuple):
    """The cells of one (method, temperature, workload, traced γ): smoothed together in
    (log s, log C), one context trend."""

    method: str
    temperature: float
    workload: str
    gamma: int


class BucketKey(NamedTuple):
    """A group's cells at one context bucket: one sparsity trend."""

    method: str
    temperature: float
    workload: str
    bucket: float
    gamma: int

    @property
    def group(self) -> GroupKey:
        return GroupKey(self.method, self.temperature, self.workload, self.gamma)




_RUN_KEYS = ["method", "gamma", "sparsity", "temperature", "workload", "request"]


_REQUIRED = ("method", "gamma", "sparsity", "context", "temperature", "workload", "request",
             "iteration", "accepted", "accept_prob")


def split_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Sort rows into runs (stable: file order inside a key) and add a run id column."""
    df = (df.assign(_row=np.arange(len(df)))  # file order breaks ties: a stable sort
          .sort_values(_RUN_KEYS + ["_row"]).drop(columns="_row").reset_index(drop=True))
    new_key = np.zeros(len(df), dtype=bool)
    new_key[0] = True
    for k in _RUN_KEYS:
        v = df[k].to_numpy()
        new_key[1:] |= v[1:] != v[:-1]
    it = df["iteration"].to_numpy()
    ctx = df["context"].to_numpy()
    reset = np.zeros(len(df), dtype=bool)
    reset[1:] = (it[1:] <= it[:-1]) | (ctx[1:] < ctx[:-1])
    df["run"] = np.cumsum(new_key | reset) - 1
    return df


def _buckets(starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bucket centres [K], bucket of each start [n]) for run start contexts."""
    uniq = np.unique(starts)
    if len(uniq) <= MAX_EXACT_BUCKETS:
        return uniq.astype(float), np.searchsorted(uniq, starts)
    # many distinct prompt lengths: factor-of-2 bins, centre = geometric mean of the members
    b = np.floor(np.log2(np.maximum(starts, 1))).astype(np.int64)
    keys, inv = np.unique(b, return_inverse=True)
    centres = np.array([np.exp(np.mean(np.log(np.maximum(starts[inv == k], 1))))
                        for k in range(len(keys))])
    return centres, inv


def workload_buckets(first: pd.DataFrame) -> np.ndarray:
    """[runs] bucket centre of each run (rows of `first` in run order), bucketed per workload:
    a workload with few distinct prompt lengths (longdoc: 1K, 2K, 4K, ... 7.5K) keeps them
    exact instead of sharing the log2 bins that the many short prompts of another need."""
    out = np.empty(len(first))
    starts = first["context"].to_numpy()
    wl = first["workload"].to_numpy()
    for w in np.unique(wl):
        sel = wl == w
        centres, idx = _buckets(starts[sel])
        out[sel] = centres[idx]
    return out


def validate_rows(df: pd.DataFrame, weights_kind: str) -> None:
    fix_real = "calibrate acceptance with the real checkpoint (random weights are latency-only)"
    if weights_kind != "real":
        raise TraceSetError(
            f"acceptance was recorded with {weights_kind!r} weights; it is meaningless",
            where=f"{ACCEPTANCE_WHERE}, column model_weights", fix=fix_real)
    missing = [c for c in _REQUIRED if c not in df.columns]
    if missing:
        raise TraceSetError(f"missing columns {missing}", where=ACCEPTANCE_WHERE,
                            fix="write rows with the columns of traces.schema.ACCEPTANCE_SCHEMA")
    if len(df) == 0:
        raise TraceSetError("no acceptance rows", where=ACCEPTANCE_WHERE,
                            fix="calibrate with real weights to record acceptance")
    if "model_weights" in df.columns and (df["model_weights"] != "real").any():
        raise TraceSetError("rows recorded with random weights", fix=fix_real,
                            where=f"{ACCEPTANCE_WHERE}, column model_weights")
    acc, gam = df["accepted"].to_numpy(), df["gamma"].to_numpy()
    if ((acc < 0) | (acc > gam)).any():
        raise TraceSetError("accepted must be in 0..gamma",
                            where=f"{ACCEPTANCE_WHERE}, column accepted",
                            fix="re-record the grid point")


def smoother_matrix(coords: np.ndarray, weights: np.ndarray,
                    bandwidth: tuple[float, float] = (SMOOTH_BW_LOG_SPARSITY,
                                                      SMOOTH_BW_LOG_CONTEXT)) -> np.ndarray:
    """[K, K] local-linear Gaussian-kernel smoother: smoothed = S @ values.

    coords [K, 2] (log sparsity, log context) of the cells of one (method, temperature,
    workload, γ_t); weights [K] their numbers of runs (runs, not iterations, are the
    independent units). Row k fits a plane to the cells weighted by kernel × runs around
    cell k and evaluates it there, so a linear trend in (log s, log C) passes unchanged (no
    bias from pooling along a slope) and the weights sum to 1. A small ridge on the slopes
    turns a direction without spread (one traced sparsity or context) into a local mean.
    """
    k_cells = len(coords)
    out = np.empty((k_cells, k_cells))
    bw = np.asarray(bandwidth, dtype=float)
    for k in range(k_cells):
        d = coords - coords[k]  # [K, 2]
        kern = weights * np.exp(-0.5 * np.sum((d / bw) ** 2, axis=1))  # [K]
        design = np.column_stack([np.ones(k_cells), d])  # [K, 3]
        gram = (design.T * kern) @ design + np.diag([0.0, 1.0, 1.0]) * _SLOPE_RIDGE * kern.sum()
        # the intercept of the weighted fit, as a linear function of the values: e_0ᵀ G⁻¹ Xᵀ W
        out[k] = np.linalg.solve(gram, design.T * kern)[0]
    return out


def replay_stretch(cell: TracedCell, rates: np.ndarray) -> float:
    """Replayed iterations per traced iteration: the traced acceptance length over the
    replayed γ's (1 + Σ rates; exactly 1 when γ is the traced γ and nothing is thinned)."""
    traced = 1.0 + float(cell.acc.mean())
    replayed = 1.0 + float(np.minimum(cell.acc, len(rates)).mean()) if len(rates) <= cell.gamma \
        else 1.0 + float(rates.sum())
    return traced / replayed


def make_cell(rows: pd.DataFrame, gamma: int, sparsity: float, bucket: float) -> TracedCell:
    """Flatten the runs of one cell (rows already in run order)."""
    acc = rows["accepted"].to_numpy(dtype=np.int64)
    probs = rows["accept_prob"].to_numpy()  # [N] object: one array (or list) per row
    try:
        # one C-level concatenation (a Python-level asarray per row is far slower on large sets)
        prob = np.concatenate(list(probs)).astype(float).reshape(len(acc), gamma)
    except ValueError:
        raise TraceSetError(
            f"accept_prob lists must have gamma = {gamma} entries",
            where=f"{ACCEPTANCE_WHERE}, column accept_prob", fix="re-record the grid point",
        ) from None
    run = rows["run"].to_numpy()
    change = np.concatenate([[True], run[1:] != run[:-1]])
    starts = np.flatnonzero(change)  # [n_runs] flat index of each run's first iteration
    lens = np.diff(np.concatenate([starts, [len(acc)]]))
    run_idx = np.cumsum(change) - 1
    ctx = rows["context"].to_numpy()
    gen = ctx - ctx[starts][run_idx]  # [N] tokens generated before each iteration
    return TracedCell(gamma, sparsity, bucket, acc, prob, starts[run_idx], lens[run_idx],
                 int(ctx.min()), int(ctx.max()), gen)


def pool_cells(cells: list[TracedCell]) -> TracedCell:
    """Concatenate cells of the same γ (workloads pooled), re-basing run starts."""
    if len(cells) == 1:
        return cells[0]
    offsets = np.cumsum([0] + [len(c.acc) for c in cells[:-1]])
    return TracedCell(
        cells[0].gamma, cells[0].sparsity, cells[0].bucket,
        np.concatenate([c.acc for c in cells]),
        np.concatenate([c.prob for c in cells]),
        np.concatenate([c.run_start + o for c, o in zip(cells, offsets)]),
        np.concatenate([c.run_len for c in cells]),
        min(c.ctx_min for c in cells), max(c.ctx_max for c in cells),
        np.concatenate([c.gen for c in cells]),
    )
