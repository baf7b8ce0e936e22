"""Acceptance model: per (method, sparsity, context bucket, workload, temperature) from traces.

Data: acceptance.parquet, one row per (request, iteration). A *run* is the sequence of
iterations one traced request went through at one grid point (method, gamma, sparsity,
temperature, workload, request); rows of a run are in file order with increasing iteration and
context (a reset of either starts a new run, so a request id reused at another context is a
different run). A run belongs to the context bucket of its first iteration's context.

Context buckets are made per workload (a workload with ≤ 12 distinct prompt lengths, like
longdoc's 1K, 2K, 4K, ... 7.5K, keeps them exact; more → log2-wide bins), so the many short
prompts of one workload do not merge another's 4K and 7K prompts, between which acceptance
still rises markedly.

A *cell* is all runs of one (method, temperature, workload, sparsity, bucket, traced γ).

Smoothing: each cell's per-position rates are a local-linear kernel fit over the cells of its
(method, temperature, workload, γ_t) in (log s, log C) (`smoother_matrix`; why and how it was
chosen: docs/DESIGN.md, "Acceptance: smoothing, rates and replay").
A lookup picks cells and turns them into an `AcceptanceDist`:

- γ ≤ traced γ_t (the smallest traced γ_t ≥ γ is used): the γ_t runs walked again at γ
  (`acceptance_walk.rewalk`: each run read as the tokens it generated, an iteration at γ
  accepting the consecutive accepted tokens from where it starts, at most γ), a cell as if
  traced at γ, smoothed like one; at γ_t the cell itself. Truncating each iteration instead
  (min(accepted, γ)) counts an easy stretch that one γ_t iteration accepts whole as one
  iteration, where γ takes several, and under-states acceptance where it comes in stretches
  (docs/RESULTS.md, "Acceptance at a smaller γ than traced").
- γ > max traced γ: every all-accepted iteration is extended position by position with
  conditional rates a_i = r_i / r_{i−1} extrapolated by a decay fitted to the last traced
  positions (log a_i linear in i, slope ≤ 0, clamped to [0, 1]). Marked extrapolated.
- sparsity between traced values: a mixture of the two neighbouring cells with a weight linear
  in log budget (`sim.sparsity_trend.budget_weight`): acceptance depends on the draft's budget
  clamp(s·C, min_tokens, C), not on s, and is close to linear in its log (a budget that
  doubles helps about equally wherever it starts). Both cells' budgets and the budget of s are
  means over the same iterations (the two cells' contexts; `AcceptanceModel.min_tokens`): a
  long prompt's budget is ∝ s (the weight is linear in log s), a short prompt's stays at the
  floor until s·C passes it (the weight stays 0: acceptance flat in s there); two cells at the
  floor are one draft, weighted linearly in log s. Above the max traced: its cell moved
  along the sparsity trend of its (method, temperature, workload, γ_t, bucket) in log budget
  (`sim.sparsity_trend`: a logit shift per doubling of the budget over every traced sparsity,
  shrunk by its standard error, capped, never falling, held past twice the span fitted; where
  every traced sparsity drafts at the floor, the cell has seen nothing and takes the mean slope
  of the cells of its method, temperature and γ_t that saw their budget change:
  `sparsity_trend.borrowed_trend`), marked with a note that names the trend, the budget
  doublings and the shift. At s = 1 the draft is the target: all accepted. Below the min
  traced: its cell moved down the same trend (the donors' where its own is flat) by the
  budget doublings the request loses at its own context, followed without a hold (acceptance
  never stays flat while the draft's budget, and its cost, fall; where both budgets are the
  floor the draft is the same and so is its acceptance), marked. Checked by
  `benchmarks/sparsity_extrapolation.py` (the SmolLM2 real set cut by sparsity, against a
  weight linear in s and a mix toward s = 1; docs/RESULTS.md). Short prompts beyond the
  traced sparsities are still under-predicted: the slope they borrow is mostly the long
  prompts'.
- context: the two neighbouring buckets, weights linear in log-context. (Before smoothing, a
  leave-one-prompt-out CV found no context kernel clearly better than this interpolation of
  the raw cells.) Above the last bucket (a prompt longer than any traced, even where the
  traced runs' iterations reached its length): the last bucket moved along the context trend
  of its (method, temperature, workload, γ_t) (`sim.context_trend`: a logit shift per
  doubling, shrunk by its standard error, capped, its own slope followed for OWN_SPAN_FACTOR
  traced spans, then the slope of the evidence that covers the contexts beyond, held past
  all evidence), marked with a note
  that says "context trend" and the shift, its sd in `AcceptanceDist.context_trend_sd_pct`
  (prediction intervals). Below them: the first bucket held, marked (the budget floor makes a
  short context's draft see more of it, against the trend). Past the predicted model's native
  positions (`past_window`: it runs RoPE-scaled there), a workload the proxy's RoPE-scaled set
  traced is looked up in that set instead, and one it did not trace is looked up where the
  native evidence ends and moved as the traced ones move from there into the scaled set
  (`_scaled_shift`; docs/DESIGN.md, "Past the model's native window").
- output length (`lookup(..., output_len=)`): each run keeps only the iterations a request of
  that many tokens runs (tokens generated before the iteration < output_len), a prefix of the
  run. Acceptance rises along a generation (text turns repetitive): on the SmolLM2 longdoc
  traces at T 0.6, the mean over whole 32-iteration runs exceeds the first-128-token mean by
  2 / 5 / 8 % at γ 4 / 8 / 12. Longer than the traced runs → every iteration, marked.
- temperature: nearest traced (0 = greedy), marked when not exact.

Rates and replay (Rao-Blackwellised rates, a bootstrap of whole runs thinned to them): docs/
DESIGN.md, "Acceptance: smoothing, rates and replay".
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from vegas_sim.errors import TraceSetError, UserInputError
from vegas_sim.methods import METHODS, MIN_TOKENS, VANILLA, check_gamma, check_sparsity
from vegas_sim.sim.acceptance_cells import (
    ACCEPTANCE_WHERE,
    BucketKey,
    CellKey,
    GroupKey,
    make_cell,
    pool_cells,
    replay_stretch,
    smoother_matrix,
    split_runs,
    validate_rows,
    workload_buckets,
)
from vegas_sim.sim.acceptance_dist import AcceptanceDist, DrawSource, TracedCell, extend_rates
from vegas_sim.sim.acceptance_pack import pack_state, unpack_state
from vegas_sim.sim.acceptance_walk import rewalk_cells
from vegas_sim.sim.context_trend import (
    OWN_SPAN_FACTOR,
    TREND_SD_SCALE,
    Z95,
    ContextTrend,
    TrendShift,
    bucket_se,
    covering_trend,
    fit_trend,
    flat_trend,
    pool_trends,
    run_lengths,
    covering_peers,
    delta_to_length,
    shift_dist,
    shift_source,
    shifted_dist_sd_pct,
    trend_note,
    trend_sd_logit,
    trend_sd_pct,
)
from vegas_sim.sim.metrics import t_quantile
from vegas_sim.sim.sparsity_trend import (
    IterationContexts,
    borrowed_trend,
    budget_doublings,
    budget_weight,
    fit_sparsity_trend,
    informs_slope,
    below_note,
    mean_budget,
    sparsity_note,
)

@dataclass
class PastWindow:
    """Where a model's lookups come from past the predicted model's native positions: the same
    real-weights model traced running past its own trained window with RoPE scaling (YaRN), as
    the predicted model runs there. `load` fits it on first use (a picklable callable)."""

    window: int  # the predicted model's native positions: beyond, it runs RoPE-scaled
    load: Callable[[], AcceptanceModel]
    name: str  # the scaled set's name
    predicted: str  # the predicted model's name
    model: AcceptanceModel | None = field(default=None, repr=False)

    def scaled(self) -> AcceptanceModel:
        if self.model is None:
            self.model = self.load()
        return self.model


def step_sd(steps: np.ndarray) -> float:
    """The logit sd of a workload's level step predicted as the mean of `steps` (one per
    workload traced both ways): the predictive sd of one more draw, sd·√(1 + 1/k), widened by
    Student's t with k − 1 degrees of freedom over the Z95 the interval takes (k = 4: ×1.8);
    one step: its own size."""
    k = len(steps)
    if k < 2:
        return abs(float(steps.mean())) if k else 0.0
    return float(steps.std(ddof=1) * math.sqrt(1.0 + 1.0 / k) * t_quantile(k - 1, 0.975) / Z95)


class AcceptanceModel:
    """Acceptance per traced configuration; `lookup` answers any (method, γ, s, C, ...)."""

    # Name of the trace set the acceptance was fitted from ('' if unknown), and what the rows'
    # `acceptance_source` says (empty: "trace set <trace_set>").
    trace_set: str = ""
    source: str = ""
    # the context trend's sd scale (`sim.context_trend`, Calibration): the trace set's own
    # hold-out's where it carries one, and where it came from ('' = the default)
    trend_sd_scale: float = TREND_SD_SCALE
    trend_sd_scale_from: str = ""
    _past_window: PastWindow | None = None  # lookups past the predicted model's window

    def __init__(self, runs: pd.DataFrame, cells: dict[CellKey, TracedCell],
                 contexts: dict[CellKey, IterationContexts], smooth: bool = True,
                 min_tokens: int = MIN_TOKENS) -> None:
        self._runs = runs  # one row per run: keys, bucket, start context
        self._contexts = contexts  # per cell: its iterations' contexts (the budget axis)
        # the draft budget floor the traces were run with: a prediction that replays this
        # acceptance drafts with the same floor (at short contexts it sets what drafts see)
        self.min_tokens = min_tokens
        # key: (method, temperature, workload, sparsity, bucket, gamma)
        self._cells = cells
        self._buckets = sorted({k.bucket for k in cells})
        self.smooth = smooth
        # per (method, temperature, workload, γ_t): its cells and the [K, K] linear smoother
        self._groups: dict[GroupKey, tuple[list[CellKey], np.ndarray]] = {}
        for key in sorted(cells):
            self._groups.setdefault(key.group, ([], np.zeros(0)))[0].append(key)
        for g, (members, _) in self._groups.items():
            coords = np.array([[math.log(k.sparsity), math.log(max(k.bucket, 1.0))]
                               for k in members])
            n_runs = np.array([len(np.unique(cells[k].run_start)) for k in members], dtype=float)
            op = smoother_matrix(coords, n_runs) if smooth else np.eye(len(members))
            self._groups[g] = (members, op)
        # (group, output_len, γ walked at) → {cell key: smoothed rates}; filled lazily
        self._smoothed: dict[tuple[GroupKey, int | None, int], dict[CellKey, np.ndarray]] = {}
        # (cell key, γ) → the cell's runs walked at γ below its traced γ (`acceptance_walk`)
        self._walks: dict[tuple[CellKey, int], TracedCell] = {}
        # (group, edge bucket) → its context trend (`sim.context_trend`); filled lazily
        self._trends: dict[tuple[GroupKey, float], ContextTrend] = {}
        # (method, temperature, workload, bucket, γ_t) → its sparsity trend; filled lazily
        self._sparsity_trends: dict[BucketKey, ContextTrend] = {}
        # the same cells' trends as used: own, or borrowed where own saw no budget change
        self._borrowed_trends: dict[BucketKey, ContextTrend] = {}
        self._coverage: dict[str, object] | None = None  # `coverage`, made once
        self._spreads: dict[GroupKey, float] = {}  # `run_spread` per group; filled lazily

    def __getstate__(self) -> dict[str, object]:
        """Pickled (the fit cache) with its many small arrays in columns (`acceptance_pack`):
        a large set's fit reads back as a few buffers, each cell's arrays widened on use."""
        return pack_state(self.__dict__)

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(unpack_state(state))

    def __copy__(self) -> AcceptanceModel:
        """A shallow copy (sharing cells and caches), without the columns of a pickle."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    @classmethod
    def from_traces(cls, acceptance: pd.DataFrame, weights_kind: str, *,
                    smooth: bool = True, min_tokens: int = MIN_TOKENS) -> AcceptanceModel:
        """Raises TraceSetError for random-weight traces (their acceptance is meaningless).

        smooth=False keeps every cell's own rates (no pooling over neighbouring sparsities and
        contexts): the model the smoothing was validated against.
        """
        validate_rows(acceptance, weights_kind)
        df = split_runs(acceptance)
        first = df.groupby("run", sort=True).head(1)  # first iteration of each run
        run_bucket = workload_buckets(first)  # [runs] bucket centre of each run
        df["bucket"] = run_bucket[df["run"].to_numpy()]
        cells: dict[CellKey, TracedCell] = {}
        contexts: dict[CellKey, IterationContexts] = {}
        keys = ["method", "temperature", "workload", "sparsity", "bucket", "gamma"]
        for key, rows in df.groupby(keys, sort=True):
            m, temp, wl, s, b, g = (str(v) for v in key)  # type: ignore[union-attr]
            cell_key = CellKey(m, float(temp), wl, float(s), float(b), int(g))
            cells[cell_key] = make_cell(rows, int(g), float(s), float(b))
            contexts[cell_key] = IterationContexts.of(rows["context"].to_numpy())
        runs = first.assign(bucket=run_bucket)[keys + ["run", "context"]]
        return cls(runs.reset_index(drop=True), cells, contexts, smooth, min_tokens)

    def _cell_rates(self, key: CellKey, output_len: int | None,
                    gamma: int | None = None) -> np.ndarray:
        """[γ] the (smoothed) rates of one cell, its runs cut to `output_len` tokens, walked at
        `gamma` where that is below the traced γ (`_walked`; None or above: the traced γ_t)."""
        group = key.group
        walk = key.gamma if gamma is None else min(gamma, key.gamma)
        cached = self._smoothed.get((group, output_len, walk))
        if cached is None:
            members, op = self._groups[group]
            self._walk_group(members, walk)
            raw = np.stack([self._cut(self._walked(k, walk), output_len).rates()
                            for k in members])
            smoothed = np.minimum.accumulate(np.clip(op @ raw, 0.0, 1.0), axis=1)  # [K, γ]
            cached = dict(zip(members, smoothed))
            self._smoothed[(group, output_len, walk)] = cached
        return cached[key]

    def _walk_group(self, members: list[CellKey], gamma: int) -> None:
        """Walk the cells of one group at `gamma` together (`_walked`, cached)."""
        todo = [k for k in members if gamma < k.gamma and (k, gamma) not in self._walks]
        for k, walked in zip(todo, rewalk_cells([self._cells[k] for k in todo], gamma)):
            self._walks[(k, gamma)] = walked

    def _walked(self, key: CellKey, gamma: int) -> TracedCell:
        """The cell's runs as drafting `gamma` ≤ its traced γ would have accepted them
        (`acceptance_walk.rewalk`; the cell itself at its traced γ), cached."""
        if gamma >= key.gamma:
            return self._cells[key]
        if (key, gamma) not in self._walks:  # its group's cells are smoothed together
            self._walk_group(self._groups[key.group][0], gamma)
        return self._walks[(key, gamma)]

    @staticmethod
    def _cut(cell: TracedCell, output_len: int | None) -> TracedCell:
        return cell if output_len is None else cell.head(output_len)

    def past_window(self, past: PastWindow) -> AcceptanceModel:
        """A copy whose lookups of a context past `past.window`, for a workload (and method)
        the scaled set traced, come from the scaled set (`lookup`)."""
        out = copy.copy(self)
        out._past_window = past
        return out

    @property
    def past_window_key(self) -> tuple[int, str] | None:
        """(window, scaled set) when lookups past a window come from a scaled set, else None:
        part of any cache key of fits made through `lookup`."""
        past = self._past_window
        return None if past is None else (past.window, past.name)

    @property
    def workloads(self) -> list[str]:
        """The workloads some cell was traced on, sorted."""
        return sorted({k.workload for k in self._cells})

    def traces(self, method: str, workload: str | None) -> bool:
        """Whether some cell of `method` was traced on `workload` (None: on any workload)."""
        return any(k.method == method and workload in (None, k.workload) for k in self._cells)

    def _scaled_lookup(self, method: str, context: int, workload: str | None
                       ) -> AcceptanceModel | None:
        """The scaled set that answers this lookup (`past_window`), or None."""
        past = self._past_window
        if past is None or context <= past.window:
            return None
        scaled = past.scaled()  # a pooled lookup (workload None) pools the scaled set's own
        return scaled if scaled.traces(method, workload) else None

    # -- lookup --
    def lookup(
        self,
        method: str,
        gamma: int,
        sparsity: float,
        context: int,
        workload: str | None = None,
        temperature: float = 0.0,
        output_len: int | None = None,
    ) -> AcceptanceDist:
        """The acceptance distribution of one configuration (see the module docstring).

        `output_len` (tokens each request generates) restricts every traced run to the
        iterations such a request runs (tokens generated before the iteration < output_len):
        acceptance rises along a generation (the text turns repetitive), so the traced runs'
        later iterations over-state a short output's acceptance. None uses every iteration.
        """
        if method == VANILLA:
            return AcceptanceDist(VANILLA, 0, np.zeros(0))
        scaled = self._scaled_lookup(method, context, workload)
        if scaled is not None:
            past = self._past_window
            assert past is not None
            dist = scaled.lookup(method, gamma, sparsity, context, workload, temperature,
                                 output_len)
            dist.extrapolated.insert(0, (
                f"context {context} past {past.predicted}'s native {past.window} positions, "
                f"where it runs RoPE-scaled: acceptance from {past.name}, traced past its own "
                "trained window with YaRN" + ("" if workload else
                                              f" (its workloads pooled: "
                                              f"{', '.join(scaled.workloads)})")))
            return dist
        past = self._past_window
        if past is None or context <= past.window or workload is None:
            return self._native_lookup(method, gamma, sparsity, context, workload, temperature,
                                       output_len)
        return self._scaled_shift(past, method, gamma, sparsity, context, workload,
                                  temperature, output_len)

    def _scaled_shift(self, past: PastWindow, method: str, gamma: int, sparsity: float,
                      context: int, workload: str, temperature: float,
                      output_len: int | None) -> AcceptanceDist:
        """A workload the scaled set did not trace, past the predicted model's window: its native
        lookup where the native evidence ends (the longest context the peers traced natively,
        or `context` if nearer) moved as the peers moved into the RoPE-scaled regime. Per
        workload V both sets traced, δ_V is the logit shift from this set's acceptance of V at
        its longest traced context to the scaled set's at `context`; their mean moves the
        lookup, their spread (one more workload's predictive sd, `step_sd`) joins its context
        sd. So past the window the workload follows the scaled set's evidence, never the
        native set's own trend: the RoPE-scaled model accepts less than the native one and
        its acceptance is flat over 12–31K where the native trend rises (docs/RESULTS.md,
        Context extrapolation)."""
        scaled = past.scaled()
        peers = [v for v in scaled.workloads
                 if scaled.traces(method, v) and self.traces(method, v)]
        if not peers:
            return self._native_lookup(method, gamma, sparsity, context, workload,
                                       temperature, output_len)
        edge = min(context, max(self.traced_contexts(method, v)[1] for v in peers))
        dist = self._native_lookup(method, gamma, sparsity, edge, workload, temperature,
                                   output_len)
        if dist.gamma == 0:
            return dist
        deltas = np.array([self._level_step(scaled, method, gamma, sparsity, context, v,
                                            temperature, output_len) for v in peers])
        delta = float(deltas.mean())
        sd = step_sd(deltas)
        note = (f"context {context} past {past.predicted}'s native {past.window} positions, "
                f"where it runs RoPE-scaled; {workload} not traced so in {past.name}: its "
                f"acceptance at {edge} moved by δ {delta:+.2f} logit (sd {sd:.2f}), the mean "
                f"step from this set's longest traced context to the scaled set's at {context} "
                "on " + ", ".join(f"{v} {d:+.2f}" for v, d in zip(peers, deltas)))
        out = shift_dist(dist, delta)
        out.extrapolated.insert(0, note)
        out.context_trend_sd_pct = math.hypot(dist.context_trend_sd_pct,
                                              shifted_dist_sd_pct(out, sd))
        out.context_trend_sd_logit = math.hypot(dist.context_trend_sd_logit, sd)
        return out

    def _level_step(self, scaled: AcceptanceModel, method: str, gamma: int, sparsity: float,
                    context: int, workload: str, temperature: float,
                    output_len: int | None) -> float:
        """δ from this set's lookup of `workload` at its longest traced context to the scaled
        set's at `context` (`_scaled_shift`)."""
        native = self._native_lookup(method, gamma, sparsity,
                                     self.traced_contexts(method, workload)[1], workload,
                                     temperature, output_len)
        target = scaled.lookup(method, gamma, sparsity, context, workload, temperature,
                               output_len)
        return delta_to_length([native.rates], target.mean_length)

    def _native_lookup(self, method: str, gamma: int, sparsity: float, context: int,
                       workload: str | None, temperature: float, output_len: int | None
                       ) -> AcceptanceDist:
        """`lookup` from this set's own cells (module docstring), past any window."""
        traced = sorted({k.method for k in self._cells})
        if method not in METHODS or method not in traced:
            raise TraceSetError(
                f"method {method!r} has no acceptance traces (traced: {', '.join(traced)})",
                where=f"{ACCEPTANCE_WHERE}, column method",
                fix=f"calibrate {method!r} with real weights, or use one of: {', '.join(traced)}")
        check_gamma(gamma)
        check_sparsity(sparsity)
        if output_len is not None and output_len < 1:
            raise UserInputError(f"output length must be >= 1, got {output_len}",
                                 where="--output-len", fix="give the tokens each request generates")
        notes: list[str] = []
        keys = [k for k in self._cells if k.method == method]
        temps = sorted({k.temperature for k in keys})
        temp = min(temps, key=lambda t: (abs(t - temperature), t))
        if temp != temperature:
            notes.append(f"temperature {temperature:g} not traced for {method}: using {temp:g}")
        keys = [k for k in keys if k.temperature == temp]
        wls = sorted({k.workload for k in keys})
        if workload is not None:
            if workload not in wls:
                raise UserInputError(
                    f"unknown workload {workload!r} for {method} at temperature {temp:g}",
                    where="--workload", fix=f"use one of: {', '.join(wls)} (or none to pool all)")
            keys = [k for k in keys if k.workload == workload]
        comps: list[DrawSource] = []
        w: list[float] = []
        shifts: list[TrendShift | None] = []  # per component: the context trend it followed
        for bucket, bucket_w, doublings, note in self._context_mixture(keys, context):
            if note:
                notes.append(note)
            b_comps, b_w, s_notes, b_shifts = self._sparsity_mixture(
                [k for k in keys if k.bucket == bucket], sparsity, gamma, output_len,
                context if doublings else None, context)
            if doublings:
                notes.append(self._trend_note(keys, context, bucket, b_w, b_shifts, gamma))
            notes.extend(n for n in s_notes if n not in notes)
            comps += b_comps
            w += [bucket_w * x for x in b_w]
            shifts += b_shifts
        rates = sum((wi * c.rates for wi, c in zip(w, comps)), np.zeros(gamma))
        dist = AcceptanceDist(method, gamma, np.asarray(rates), notes, comps, np.asarray(w))
        dist.context_trend_sd_pct = trend_sd_pct(dist.weights, shifts)
        dist.context_trend_sd_logit = trend_sd_logit(dist.weights, shifts)
        return dist

    def _context_mixture(self, keys: list[CellKey],
                         context: int) -> list[tuple[float, float, float, str]]:
        """(bucket, weight, doublings, note): inside the traced buckets, the two neighbours
        with weights linear in log-context (a monotone interpolation of the rates); outside,
        the nearest bucket alone, labelled extrapolated: above the traced contexts followed
        `doublings` (log2 of context / bucket) along its context trend, below them held (the
        budget floor makes a short context's draft see more of it, against the trend)."""
        buckets = sorted({k.bucket for k in keys})
        logc = math.log(max(context, 1))
        if len(buckets) == 1 or not (buckets[0] < context < buckets[-1]):
            return [self._pick_bucket(keys, context)]
        j = int(np.searchsorted(buckets, context))
        lo, hi = buckets[j - 1], buckets[j]
        w = (logc - math.log(lo)) / (math.log(hi) - math.log(lo))
        return [(b, bw, 0.0, "") for b, bw in ((lo, 1.0 - w), (hi, w)) if bw > 0.0]

    def _traced_range(self, keys: list[CellKey]) -> tuple[int, int]:
        cells = [self._cells[k] for k in keys]
        return min(c.ctx_min for c in cells), max(c.ctx_max for c in cells)

    def _pick_bucket(self, keys: list[CellKey],
                     context: int) -> tuple[float, float, float, str]:
        buckets = sorted({k.bucket for k in keys})
        logc = math.log(max(context, 1))
        bucket = min(buckets, key=lambda b: abs(math.log(max(b, 1.0)) - logc))
        lo, hi = self._traced_range(keys)
        if context > buckets[-1]:  # a prompt longer than any traced (its iterations may not be)
            return bucket, 1.0, math.log2(context / max(bucket, 1.0)), ""
        if context < lo:
            return bucket, 1.0, 0.0, self._held_note(keys, context, bucket)
        return bucket, 1.0, 0.0, ""

    def _held_note(self, keys: list[CellKey], context: int, bucket: float) -> str:
        lo, hi = self._traced_range(keys)
        return (f"context {context} outside traced {lo}..{hi}: using the nearest traced bucket "
                f"({bucket:.0f})")

    def _trend_note(self, keys: list[CellKey], context: int, bucket: float,
                    weights: list[float], shifts: list[TrendShift | None], gamma: int) -> str:
        """What a lookup outside the traced contexts did (`context_trend.trend_note`), and
        the workload's long twin where one was traced at the asked context."""
        lo, hi = self._traced_range(keys)
        if context <= hi:  # inside the iterations' contexts, past the longest traced prompt
            note = trend_note(context, (lo, int(bucket)), bucket, weights, shifts, gamma,
                              "traced prompts")
        else:
            note = trend_note(context, (lo, hi), bucket, weights, shifts, gamma)
        return note + self._scale_note() + self._long_twin(keys, context)

    def _scale_note(self) -> str:
        """Which calibration scaled the trend's sd (`sim.context_trend`, Calibration)."""
        source = self.trend_sd_scale_from or "the default: the packaged sets' hold-outs pooled"
        return f", its sd x{self.trend_sd_scale:g} ({source})"

    def _long_twin(self, keys: list[CellKey], context: int) -> str:
        """', W-long ... traced at lo..hi: --workload W-long' when the lookup's one workload W
        has a twin of long prompts of its kind (code-long for HumanEval's code, chat-long for
        MT-Bench's chat) traced from below `context`: the trend stands in for what the twin
        measured."""
        workloads = {k.workload for k in keys}
        if len(workloads) != 1:
            return ""
        twin = f"{next(iter(workloads))}-long"
        twin_keys = [k for k in self._cells if k.workload == twin]
        if not twin_keys:
            return ""
        lo, hi = self._traced_range(twin_keys)
        if context < lo:
            return ""
        return (f", while {twin}, long prompts of the same kind, was traced at {lo}..{hi}: "
                f"--workload {twin} predicts this context from them")

    def context_trend(self, group: GroupKey, edge: float) -> ContextTrend:
        """The context trend of one (method, temperature, workload, traced γ) beyond its
        bucket `edge` (its first or last; `sim.context_trend.fit_trend`), cached. Beyond the
        last bucket every group's slope is partially pooled with its workload and
        temperature's (`sim.context_trend.pool_trends`), so the first such call fits them all."""
        if (group, edge) in self._trends:
            return self._trends[(group, edge)]
        last = {g: max(k.bucket for k in members) for g, (members, _) in self._groups.items()}
        if edge != last[group]:
            self._trends[(group, edge)] = self._own_trend(group, edge)
        else:  # no last-bucket trend is cached yet: pool them all at once
            own = {g: replace(self._own_trend(g, b), reach_spans=OWN_SPAN_FACTOR)
                   for g, b in last.items()}
            pooled = pool_trends(own, cell_of=lambda g: (g.temperature, g.workload))
            for g, t in pooled.items():
                peers = covering_peers(g, pooled)
                self._trends[(g, last[g])] = covering_trend(
                    t, [pooled[h] for h in peers], [h.workload for h in peers])
        return self._trends[(group, edge)]

    def _own_trend(self, group: GroupKey, edge: float) -> ContextTrend:
        """One group's trend fitted on its own buckets alone."""
        members = self._groups[group][0]
        buckets = sorted({k.bucket for k in members})
        at = {b: {k.sparsity: k for k in members if k.bucket == b} for b in buckets}
        common = sorted(set.intersection(*(set(v) for v in at.values())))
        if not common or edge not in (buckets[0], buckets[-1]):
            return flat_trend(edge, "no sparsity traced at every context bucket")
        rates = [[self._cell_rates(at[b][s], None) for s in common] for b in buckets]
        ses = [bucket_se([run_lengths(self._cells[at[b][s]]) for s in common]) for b in buckets]
        # where a bucket's iterations are: its start context + the mean tokens generated
        generated = [float(np.mean([self._cells[at[b][s]].gen.mean() for s in common]))
                     for b in buckets]
        return fit_trend(buckets, rates, ses, buckets.index(edge), generated)

    def context_trends(self) -> list[dict[str, object]]:
        """One row per (method, temperature, workload, traced γ): the trend beyond its last
        traced bucket (what `traces show` and the report print)."""
        rows: list[dict[str, object]] = []
        for group in sorted(self._groups):
            members = self._groups[group][0]
            last = max(k.bucket for k in members)
            t = self.context_trend(group, last)
            rows.append({"method": group.method, "temperature": group.temperature,
                         "workload": group.workload, "gamma": group.gamma,
                         "buckets": len(t.buckets),
                         "context_lo": int(min(t.buckets)), "context_hi": int(last),
                         "length_lo": t.lengths[0], "length_hi": t.lengths[-1],
                         "slope_per_doubling": t.slope, "fitted_slope": t.fitted_slope,
                         "slope_se": t.slope_se, "pct_per_doubling": t.pct_per_doubling,
                         "note": t.reason})
        return rows

    def _sparsity_mixture(
        self, keys: list[CellKey], sparsity: float, gamma: int,
        output_len: int | None = None, beyond: int | None = None, context: int | None = None,
    ) -> tuple[list[DrawSource], list[float], list[str], list[TrendShift | None]]:
        """(sources, weights, notes, context shifts) at `sparsity`: between traced sparsities
        the two neighbours, weights linear in log budget (`sim.sparsity_trend.budget_weight`);
        above the traced max its cell moved along the sparsity trend (`sim.sparsity_trend`); at
        s = 1 all accepted; below the traced min the min's cell moved down the same trend by
        the budget doublings lost at the request's `context` (`_below_source`)."""
        sps = sorted({k.sparsity for k in keys})
        if sparsity >= 1.0 > sps[-1]:  # the draft is the target: every draft is accepted
            note = f"sparsity 1 above traced max {sps[-1]:g}: draft = target, all accepted"
            return [DrawSource(None, np.ones(gamma))], [1.0], [note], [None]
        if sparsity > sps[-1]:
            src, src_notes, shift = self._trend_source(keys, sparsity, gamma, output_len,
                                                       beyond)
            return [src], [1.0], src_notes, [shift]
        if sparsity < sps[0]:
            src, src_notes, shift = self._below_source(keys, sparsity, gamma, output_len,
                                                       beyond, context)
            return [src], [1.0], src_notes, [shift]
        notes: list[str] = []
        j = int(np.searchsorted(sps, sparsity))
        if sps[j] == sparsity:
            points = [(sps[j], 1.0)]
        else:
            lo, hi = sps[j - 1], sps[j]
            at = self._iteration_contexts(self._members(keys, lo, gamma)
                                          + self._members(keys, hi, gamma))
            w = budget_weight(sparsity, lo, hi, at, self.min_tokens)
            points = [(lo, 1.0 - w), (hi, w)]
        sources, weights, shifts = [], [], []
        for s, w in points:
            if w <= 0.0:
                continue
            src, src_notes, shift = self._source(keys, s, gamma, output_len, beyond)
            sources.append(src)
            notes.extend(n for n in src_notes if n not in notes)
            weights.append(w)
            shifts.append(shift)
        total = sum(weights)
        return sources, [w / total for w in weights], notes, shifts

    def _trend_source(self, keys: list[CellKey], sparsity: float, gamma: int,
                      output_len: int | None, beyond: int | None,
                      ) -> tuple[DrawSource, list[str], TrendShift | None]:
        """The traced max sparsity's source moved along the sparsity trend of its cells
        (workloads pooled: their shifts weighted by iterations), noted."""
        edge = max(k.sparsity for k in keys)
        src, notes, shift = self._source(keys, edge, gamma, output_len, beyond)
        members = self._members(keys, edge, gamma)
        n_it = np.array([len(self._cells[k].acc) for k in members], dtype=float)
        share = n_it / n_it.sum()
        trends = [self.sparsity_trend(k) for k in members]
        ds = [budget_doublings(sparsity, edge, self._contexts[k], self.min_tokens)
              for k in members]
        delta = float(sum(w * t.shift(d) for w, t, d in zip(share, trends, ds)))
        moved = shift_source(src, delta)
        before, after = 1.0 + float(src.rates.sum()), 1.0 + float(moved.rates.sum())
        note = sparsity_note(sparsity, edge, trends, list(share), float(np.dot(share, ds)),
                             delta, before, after)
        return moved, [note] + notes, shift

    def _below_source(self, keys: list[CellKey], sparsity: float, gamma: int,
                      output_len: int | None, beyond: int | None, context: int | None,
                      ) -> tuple[DrawSource, list[str], TrendShift | None]:
        """The traced min sparsity's source moved down its cells' sparsity trend (`falling_trend`:
        never flat while some cell saw the budget matter) by the doublings of draft budget the
        request loses at its own context: log2(b(s, C) / b(s_min, C)) ≤ 0, followed all the way
        (no hold: a smaller budget keeps drafting worse; the logit shift keeps every rate in
        (0, 1)); 0 where both budgets are the floor (the same draft, at the same cost), noted."""
        edge = min(k.sparsity for k in keys)
        src, notes, shift = self._source(keys, edge, gamma, output_len, beyond)
        members = self._members(keys, edge, gamma)
        n_it = np.array([len(self._cells[k].acc) for k in members], dtype=float)
        share = n_it / n_it.sum()
        at = IterationContexts.of(np.array([context])) if context is not None else \
            self._iteration_contexts(members)
        lost = budget_doublings(sparsity, edge, at, self.min_tokens)  # ≤ 0
        trends = [self.falling_trend(k) for k in members]
        delta = float(sum(w * t.slope * lost for w, t in zip(share, trends)))
        moved = shift_source(src, delta)
        before, after = 1.0 + float(src.rates.sum()), 1.0 + float(moved.rates.sum())
        note = below_note(sparsity, edge, trends, list(share), lost, delta, before, after)
        return moved, [note] + notes, shift

    def falling_trend(self, key: CellKey) -> ContextTrend:
        """The trend below the traced sparsities of cell `key`: its sparsity trend
        (`sparsity_trend`) where that rises with the budget, else the donors' (the cells of its
        method, temperature and traced γ that saw the budget change, `borrowed_trend`), so
        acceptance falls with the budget wherever any traced cell saw it matter."""
        own = self.sparsity_trend(key)
        return own if own.slope > 0.0 else borrowed_trend(own, self._slope_donors(key))

    def _slope_donors(self, key: CellKey) -> list[ContextTrend]:
        """The own sparsity trends of the cells of `key`'s method, temperature and traced γ
        that saw their budget change (any workload, any context bucket)."""
        return [t for t in (self._own_sparsity_trend(
                                BucketKey(g.method, g.temperature, g.workload, b, g.gamma))
                            for g, (members, _) in self._groups.items()
                            if (g.method, g.temperature, g.gamma)
                            == (key.method, key.temperature, key.gamma)
                            for b in sorted({k.bucket for k in members}))
                if informs_slope(t)]

    def sparsity_trend(self, key: CellKey) -> ContextTrend:
        """The trend above the traced sparsities of the cell `key`'s (method, temperature,
        workload, traced γ, context bucket) in log budget (`sim.sparsity_trend`; every
        sparsity's budget over the top cell's iterations); where its traced sparsities all
        drafted at one budget, borrowed from the cells of its method, temperature and traced
        γ that saw the budget change (`borrowed_trend`), cached."""
        at = key.at_bucket
        if at not in self._borrowed_trends:
            own = self._own_sparsity_trend(at)
            donors = [] if informs_slope(own) else self._slope_donors(key)
            self._borrowed_trends[at] = borrowed_trend(own, donors)
        return self._borrowed_trends[at]

    def _own_sparsity_trend(self, at: BucketKey) -> ContextTrend:
        """One (method, temperature, workload, context bucket, traced γ)'s trend fitted on
        its own traced sparsities, cached."""
        if at not in self._sparsity_trends:
            cells = sorted((k for k in self._groups[at.group][0] if k.bucket == at.bucket),
                           key=lambda k: k.sparsity)
            top = self._contexts[cells[-1]]
            self._sparsity_trends[at] = fit_sparsity_trend(
                [k.sparsity for k in cells],
                [mean_budget(k.sparsity, top, self.min_tokens) for k in cells],
                [self._cell_rates(k, None) for k in cells],
                [bucket_se([run_lengths(self._cells[k])]) for k in cells])
        return self._sparsity_trends[at]

    def _iteration_contexts(self, members: list[CellKey]) -> IterationContexts:
        """The contexts of the iterations of these cells, pooled."""
        return IterationContexts.pooled([self._contexts[k] for k in members])

    def _members(self, keys: list[CellKey], s: float, gamma: int) -> list[CellKey]:
        """The cells a source at sparsity s pools: every workload's, at the smallest traced
        γ_t ≥ γ (else the largest)."""
        at_s = [k for k in keys if k.sparsity == s]
        gts = sorted({k.gamma for k in at_s})
        above = [g for g in gts if g >= gamma]
        gt = above[0] if above else gts[-1]
        return [k for k in at_s if k.gamma == gt]

    def _source(self, keys: list[CellKey], s: float,
                gamma: int, output_len: int | None = None, beyond: int | None = None,
                ) -> tuple[DrawSource, list[str], TrendShift | None]:
        """Pool the cells at sparsity s (workloads pooled) at the best traced γ for `gamma`,
        restricted to the first `output_len` generated tokens of every run when given; moved
        to context `beyond` (given when above the traced contexts) along the context trend of
        their (method, temperature, workload, γ) (workloads pooled: their trends' shifts
        weighted by iterations)."""
        members = self._members(keys, s, gamma)
        gt = members[0].gamma
        cuts = [self._cut(self._walked(k, gamma), output_len) for k in members]
        cell = pool_cells(cuts)
        notes: list[str] = []
        if output_len is not None:
            last = np.unique(cell.run_start + cell.run_len - 1)  # [runs] last kept iteration
            traced = int(np.median(cell.gen[last] + np.minimum(cell.acc[last], cell.gamma) + 1))
            if output_len > traced:
                notes.append(f"output length {output_len} beyond the {traced} tokens traced per "
                             "request (median): past its run, a request replays it again")
        # pooled workloads: the iteration-weighted mean, as the pooled raw estimate would be
        n_it = np.array([len(c.acc) for c in cuts], dtype=float)
        cell_rates = np.stack([self._cell_rates(k, output_len, gamma)
                               for k in members])  # [W, min(γ, γ_t)]
        pooled = np.minimum.accumulate(n_it @ cell_rates / n_it.sum())
        rates, _ = extend_rates(pooled, gamma)
        if gamma > gt:
            notes.append(f"gamma {gamma} above traced max {gt}: positions {gt + 1}..{gamma} "
                         "extrapolated by a fitted decay")
        stretch = replay_stretch(cell, rates)
        spread = float(n_it @ [self.run_spread(k.group) for k in members] / n_it.sum())
        source = DrawSource(cell, rates, cell.outcome_cond(gamma), stretch, spread)
        if beyond is None:
            return source, notes, None
        trends = [self.context_trend(k.group, k.bucket) for k in members]
        share = n_it / n_it.sum()
        shift = TrendShift.of(trends, [k.workload for k in members], share, beyond, rates,
                              self.trend_sd_scale)
        return shift_source(source, shift.delta), notes, shift

    def run_spread(self, group: GroupKey) -> float:
        """Relative sd of one run's acceptance length about its cell's mean in `group`
        (method, temperature, workload, γ_t), for a cell of too few runs to measure its own
        (`uncertainty.acceptance_sampling_pct`): pooled over the group's
        cells of several runs; where every cell holds one run (a workload whose buckets are
        one prompt each, e.g. competitive's problems), over the buckets at each sparsity (the
        prompts' spread, with the little context trend between them). 0 with one run in all."""
        if group not in self._spreads:
            members = self._groups[group][0]
            runs = [run_lengths(self._cells[k]) for k in members]
            several = [x for x in runs if len(x) > 1]
            if not several:  # one run per cell: the runs at one sparsity, across buckets
                by_s: dict[float, list[float]] = {}
                for k, x in zip(members, runs):
                    by_s.setdefault(k.sparsity, []).extend(x.tolist())
                several = [np.array(v) for v in by_s.values() if len(v) > 1]
            dev = [x / x.mean() - 1.0 for x in several]
            dof = sum(len(d) - 1 for d in dev)
            self._spreads[group] = (math.sqrt(sum(float(d @ d) for d in dev) / dof)
                                    if dof else 0.0)
        return self._spreads[group]

    def traced_contexts(self, method: str, workload: str | None = None) -> tuple[int, int]:
        """(min, max) context the traces of `method` on `workload` (None: any) cover."""
        keys = [k for k in self._cells if k.method == method and workload in (None, k.workload)]
        return self._traced_range(keys or list(self._cells))

    def coverage(self) -> dict[str, object]:
        """Traced ranges: methods, gamma max, sparsities, context range, workloads, temperatures
        (made once per model, and cached with its fit; each call gets its own copy)."""
        if getattr(self, "_coverage", None) is None:
            self._coverage = self._traced_coverage()
        return copy.deepcopy(self._coverage)  # type: ignore[arg-type]

    def _traced_coverage(self) -> dict[str, object]:
        keys = list(self._cells)
        per_method: dict[str, dict[str, object]] = {}
        for m in sorted({k.method for k in keys}):
            mk = [k for k in keys if k.method == m]
            per_method[m] = {
                "gamma": sorted({k.gamma for k in mk}),
                "sparsity": sorted({k.sparsity for k in mk}),
                "temperature": sorted({k.temperature for k in mk}),
            }
        cells = list(self._cells.values())
        return {
            "methods": sorted(per_method),
            "gamma_max": max(k.gamma for k in keys),
            "sparsities": sorted({k.sparsity for k in keys}),
            "context_range": (min(c.ctx_min for c in cells), max(c.ctx_max for c in cells)),
            "context_buckets": [float(b) for b in self._buckets],
            "workloads": sorted({k.workload for k in keys}),
            "temperatures": sorted({k.temperature for k in keys}),
            "per_method": per_method,
            "n_runs": len(self._runs),
            "n_iterations": int(sum(len(c.acc) for c in cells)),
        }
