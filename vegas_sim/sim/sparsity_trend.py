"""Sparsity trend: how acceptance moves with the draft's budget above the traced sparsities.

Acceptance depends on the draft's budget, not on s itself: `methods.budget` selects
clamp(s·C, min_tokens, C) entries, so a short prompt drafts at the floor at low s (acceptance
flat in s) and rises only once s·C passes it, while a long prompt's budget is ∝ s. The budget
axis is `mean_budget`: the mean over a cell's iterations of what sparsity s selects at their
contexts (the floor the traces were run with, `AcceptanceModel.min_tokens`).

Inside the traced sparsities the acceptance model mixes the two neighbouring cells with a weight
linear in log budget (`budget_weight`; a budget that doubles helps about equally wherever it
starts; both cells at the floor are the same draft: linear in log s). Above the largest traced
sparsity s_max it continues the cell of s_max along the trend its traced sparsities show in log
budget, with the machinery of the context trend (`sim.context_trend`), budget in place of
context:

    c_i' = σ(logit(c_i) + δ(s)),  δ(s) = slope × min(d, MAX_SPAN_MULTIPLE × span),
    d = log2(b(s) / b(s_max))   (both over the s_max cell's iterations)

- statistic: per traced sparsity s_k of one (method, temperature, workload, traced γ, context
  bucket), the logit shift δ_k of the s_max cell's conditional per-position rates that gives
  s_k's (smoothed) mean acceptance length; its standard error from the cell's runs;
- the slope: a weighted least-squares line of δ_k on log2(b(s_k) / b(s_max)) over every traced
  sparsity (cells at the floor share one budget: replicates of one draft), capped at the
  span's average change per doubling, flat when its sign disagrees with that change, shrunk
  toward flat by its own standard error (`context_trend.fit_trend`), and held flat when it
  falls (a larger budget attends to a superset of the tokens: in expectation it does not draft
  worse). A cell whose traced sparsities all draft at one budget (the floor: a short prompt at
  low s) saw nothing to fit: it takes the random-effects mean slope of the cells of its
  method and temperature that did (`borrowed_trend`), with their spread as its sd;
- followed for at most MAX_SPAN_MULTIPLE times the span of budget doublings it was fitted over,
  held beyond.

So the s_max cell's shape over draft positions and its traced runs are kept, every rate stays in
(0, 1) (the mean acceptance length stays below γ + 1) and it rises monotonically with s. At
s = 1 the draft is the target: every draft is accepted (`AcceptanceModel._sparsity_mixture`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from vegas_sim.sim.context_trend import (
    MAX_SPAN_MULTIPLE,
    ContextTrend,
    fit_trend,
    flat_trend,
    random_effects,
)

# Budgets closer than this (relative) are the same draft: the floor for both, or a context too
# short for s·C to differ (a weight in log budget would divide by ~0).
SAME_BUDGET_RTOL = 1e-6


@dataclass(frozen=True)
class IterationContexts:
    """The contexts a cell's iterations ran at: distinct values and how many iterations each."""

    contexts: np.ndarray  # [U] int
    counts: np.ndarray  # [U] int

    @staticmethod
    def of(contexts: np.ndarray) -> IterationContexts:
        values, counts = np.unique(np.asarray(contexts, dtype=np.int64), return_counts=True)
        return IterationContexts(values, counts)

    @staticmethod
    def pooled(parts: Sequence[IterationContexts]) -> IterationContexts:
        values, which = np.unique(np.concatenate([p.contexts for p in parts]),
                                  return_inverse=True)
        counts = np.bincount(which, weights=np.concatenate([p.counts for p in parts]))
        return IterationContexts(values, counts.astype(np.int64))


def mean_budget(sparsity: float, at: IterationContexts, min_tokens: int) -> float:
    """Mean draft budget of sparsity s over iterations at these contexts: clamp(s·C, floor, C)
    (`methods.budget` without its ceil, so a budget ∝ s gives exactly the log-s rule, and
    without the max_len cap, which s·C never reaches)."""
    c = at.contexts.astype(float)
    per = np.minimum(np.maximum(sparsity * c, float(min_tokens)), c)
    return float(np.sum(per * at.counts) / np.sum(at.counts))


def same_budget(lo: float, hi: float) -> bool:
    return hi <= lo * (1.0 + SAME_BUDGET_RTOL)


def budget_weight(sparsity: float, lo: float, hi: float, at: IterationContexts,
                  min_tokens: int) -> float:
    """Weight of the cell at `hi` when mixing traced sparsities lo < sparsity < hi: linear in
    log budget (both cells' budgets over the same iterations); linear in log s where both draft
    at the same budget (at the floor: the two cells are the same draft, only their noise
    differs)."""
    b_lo, b_hi = (mean_budget(s, at, min_tokens) for s in (lo, hi))
    if same_budget(b_lo, b_hi):
        return math.log(sparsity / lo) / math.log(hi / lo)
    return math.log(mean_budget(sparsity, at, min_tokens) / b_lo) / math.log(b_hi / b_lo)


def budget_doublings(sparsity: float, edge: float, at: IterationContexts,
                     min_tokens: int) -> float:
    """log2 distance of `sparsity`'s budget above the traced max `edge`'s (same iterations)."""
    return math.log2(mean_budget(sparsity, at, min_tokens) / mean_budget(edge, at, min_tokens))


def fit_sparsity_trend(sparsities: Sequence[float], budgets: Sequence[float],
                       rates: Sequence[np.ndarray], ses: Sequence[float]) -> ContextTrend:
    """The trend above the largest of `sparsities` (ascending, traced at one context bucket of
    one group): budgets[k] the mean budget of sparsities[k] over the top cell's iterations
    (`mean_budget`), rates[k] its per-position rates [γ_t], ses[k] the standard error of its
    mean acceptance length. `ContextTrend.buckets` holds the budgets fitted (ascending)."""
    edge = float(budgets[-1])
    if len(sparsities) < 2:
        return flat_trend(edge, "one traced sparsity")
    if same_budget(float(budgets[0]), edge):
        return flat_trend(edge, f"every traced sparsity drafts at the budget floor ({edge:.0f})")
    n = len(sparsities)
    # every traced sparsity: in log budget the floor cells are replicates of one draft at one
    # point, not a flat stretch of the line (the reason a fit in log s kept only the top ones)
    trend = fit_trend(list(budgets), [[np.asarray(r)] for r in rates], list(ses), n - 1)
    reason = trend.reason.replace("traced buckets", "traced budgets")
    if trend.slope < 0.0:
        return replace(trend, slope=0.0, reason=f"falls with the budget ({trend.slope:+.2f}): "
                       "held (a larger budget does not draft worse)")
    return replace(trend, reason=reason)


def informs_slope(trend: ContextTrend) -> bool:
    """Whether a cell's own fit saw its budget change (at least two traced budgets)."""
    return trend.span > 0.0


def borrowed_trend(own: ContextTrend, donors: Sequence[ContextTrend]) -> ContextTrend:
    """The trend of a cell whose traced sparsities all draft at one budget (`own`: flat,
    nothing seen) from the cells of its method and temperature that did see the budget change
    (`donors`): their random-effects mean slope (held at 0 if it falls), its predictive sd
    (the mean's se and the between-cell spread τ), followed for their median span. A short
    prompt traced only at the floor still drafts with more keys once s·C passes it; how much
    that helps is what the other cells measured. `own` unchanged without donors."""
    if not donors:
        return own
    pooled = random_effects([(t.slope, t.slope_se) for t in donors], correlated=False)
    slope = max(0.0, pooled.mean)
    span = float(np.median([t.span for t in donors]))
    reason = (f"{own.reason}: slope of the {pooled.n} cells of this method and temperature "
              f"that saw the budget change ({pooled.mean:+.2f} ± {math.sqrt(pooled.tau2):.2f}"
              " between cells)")
    return replace(own, slope=slope, slope_se=math.hypot(pooled.se, math.sqrt(pooled.tau2)),
                   reason=reason, span=span)


def sparsity_note(sparsity: float, edge: float, trends: Sequence[ContextTrend],
                  share: Sequence[float], doublings: float, delta: float, before: float,
                  after: float) -> str:
    """The `extrapolated` note of a lookup above the traced sparsities: the trend it followed
    (slope per doubling of the budget, the budgets it was fitted on, the budget doublings
    followed, shift and the mean acceptance length before -> after), or why it held the
    traced max."""
    head = f"sparsity {sparsity:g} above traced max {edge:g}:"
    if delta == 0.0:
        why = "; ".join(sorted({t.reason for t in trends if t.reason})) or "none fitted"
        return f"{head} sparsity trend flat ({why}): held at {edge:g}"
    slope = float(sum(w * t.slope for w, t in zip(share, trends)))
    first = next(t for t in trends if t.slope)
    reach = MAX_SPAN_MULTIPLE * first.span
    held = f" (held beyond {reach:.2f}: {MAX_SPAN_MULTIPLE:g}x the fitted span)" \
        if doublings > reach else ""
    fitted = (f"fitted on budgets {min(first.buckets):.0f}..{first.edge:.0f}"
              if len(first.buckets) > 1 else first.reason)
    return (f"{head} extrapolated along the sparsity trend, {slope:+.2f} logit per doubling of "
            f"the draft budget ({fitted}), {doublings:+.2f} budget doublings{held}: shift "
            f"{delta:+.2f}, mean acceptance length {before:.2f} -> {after:.2f}")


def below_note(sparsity: float, edge: float, trends: Sequence[ContextTrend],
               share: Sequence[float], doublings: float, delta: float, before: float,
               after: float) -> str:
    """The `extrapolated` note of a lookup below the traced sparsities: the budget doublings
    lost at the request's context, the trend followed down and what it did to the mean
    acceptance length, or why it held the traced min (the same draft budget: the floor)."""
    head = f"sparsity {sparsity:g} below traced min {edge:g}:"
    if doublings == 0.0:
        return f"{head} the same draft budget (the floor) at this context: held at {edge:g}"
    if delta == 0.0:
        why = "; ".join(sorted({t.reason for t in trends if t.reason})) or "none fitted"
        return (f"{head} draft budget {doublings:+.2f} doublings, no traced cell saw the budget "
                f"matter ({why}): held at {edge:g}")
    slope = float(sum(w * t.slope for w, t in zip(share, trends)))
    return (f"{head} extrapolated down the sparsity trend, {slope:+.2f} logit per doubling of "
            f"the draft budget, {doublings:+.2f} budget doublings at this context: shift "
            f"{delta:+.2f}, mean acceptance length {before:.2f} -> {after:.2f}")
