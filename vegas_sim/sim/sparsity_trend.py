"""Sparsity trend: how acceptance moves with log-sparsity above the traced sparsities.

Inside the traced sparsities the acceptance model mixes the two neighbouring cells with a weight
linear in log s (a budget that doubles helps about equally wherever it starts). Above the
largest traced sparsity s_max it continues the cell of s_max along the trend its own top traced
sparsities show, with the machinery of the context trend (`sim.context_trend`), sparsity in
place of context:

    c_i' = σ(logit(c_i) + δ(s)),  δ(s) = slope × min(d, MAX_SPAN_MULTIPLE × span),
    d = log2(s / s_max)

- statistic: per traced sparsity s_k of one (method, temperature, workload, traced γ, context
  bucket), the logit shift δ_k of the s_max cell's conditional per-position rates that gives
  s_k's (smoothed) mean acceptance length; its standard error from the cell's runs;
- the slope: a weighted least-squares line of δ_k on log2(s_k / s_max) over the top
  TREND_SPARSITIES traced sparsities, capped at their span's average change per doubling, flat
  when its sign disagrees with that change, shrunk toward flat by its own standard error
  (`context_trend.fit_trend`), and held flat when it falls (a larger budget attends to a
  superset of the tokens: in expectation it does not draft worse);
- followed for at most MAX_SPAN_MULTIPLE times the span it was fitted over, held beyond.

So the s_max cell's shape over draft positions and its traced runs are kept, every rate stays in
(0, 1) (the mean acceptance length stays below γ + 1) and it rises monotonically with s. At
s = 1 the draft is the target: every draft is accepted (`AcceptanceModel._sparsity_mixture`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from vegas_sim.sim.context_trend import MAX_SPAN_MULTIPLE, ContextTrend, fit_trend, flat_trend

# The trend is fitted over the top traced sparsities only: at short contexts the low ones sit at
# the draft budget's floor, where acceptance is flat in s (SmolLM2 real set: chat, code and
# reasoning change < 2 % from s 0.01 to 0.07, then rise 10-25 % by 0.2), so a line through
# every traced sparsity under-states the slope at the top. Three points: the fewest that
# give a line with a residual.
TREND_SPARSITIES = 3


def fit_sparsity_trend(sparsities: Sequence[float], rates: Sequence[np.ndarray],
                       ses: Sequence[float]) -> ContextTrend:
    """The trend above the largest of `sparsities` (ascending, traced at one context bucket of
    one group): rates[k] the per-position rates [γ_t] at sparsities[k], ses[k] the standard
    error of its mean acceptance length. `ContextTrend.buckets` holds the sparsities fitted."""
    top = list(sparsities)[-TREND_SPARSITIES:]
    edge = top[-1]
    if len(top) < 2:
        return flat_trend(edge, "one traced sparsity")
    n = len(top)
    trend = fit_trend(top, [[np.asarray(r)] for r in rates[-n:]], list(ses)[-n:], n - 1)
    reason = trend.reason.replace("traced buckets", "traced sparsities")
    if trend.slope < 0.0:
        return replace(trend, slope=0.0, reason=f"falls with sparsity ({trend.slope:+.2f}): "
                       "held (a larger budget does not draft worse)")
    return replace(trend, reason=reason)


def sparsity_doublings(sparsity: float, edge: float) -> float:
    """log2 distance of `sparsity` above the traced max `edge`."""
    return math.log2(sparsity / edge)


def sparsity_note(sparsity: float, edge: float, trends: Sequence[ContextTrend],
                  share: Sequence[float], delta: float, before: float, after: float) -> str:
    """The `extrapolated` note of a lookup above the traced sparsities: the trend it followed
    (slope, the sparsities it was fitted on, distance, shift and the mean acceptance length
    before -> after), or why it held the traced max."""
    head = f"sparsity {sparsity:g} above traced max {edge:g}:"
    if delta == 0.0:
        why = "; ".join(sorted({t.reason for t in trends if t.reason})) or "none fitted"
        return f"{head} sparsity trend flat ({why}): held at {edge:g}"
    slope = float(sum(w * t.slope for w, t in zip(share, trends)))
    first = next(t for t in trends if t.slope)
    d = sparsity_doublings(sparsity, edge)
    reach = MAX_SPAN_MULTIPLE * first.span
    held = f" (held beyond {reach:.2f}: {MAX_SPAN_MULTIPLE:g}x the fitted span)" if d > reach \
        else ""
    return (f"{head} extrapolated along the sparsity trend, {slope:+.2f} logit per doubling "
            f"(fitted on {min(first.buckets):g}..{edge:g}), {d:+.2f} doublings{held}: shift "
            f"{delta:+.2f}, mean acceptance length {before:.2f} -> {after:.2f}")
