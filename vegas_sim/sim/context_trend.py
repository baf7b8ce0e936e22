"""Context trend: how acceptance moves with log-context beyond the traced context buckets.

Inside the traced buckets the acceptance model interpolates in log-context; above them it
continues each (method, temperature, workload, traced γ) along the trend its own buckets show,
as a logit shift of the edge bucket's distribution (the transform anchors use, `shift_rates`):

    c_i' = σ(logit(c_i) + δ(C)),  δ(C) = slope × min(d, MAX_SPAN_MULTIPLE × span),
    d = log2((C + g) / (edge bucket + g))

(g: the mean tokens generated before a traced iteration of the edge bucket, so that prompt and
bucket are both placed at their iterations' mean context; span: the doublings the traced
buckets cover; beyond twice that the trend is held), so the edge bucket's shape over draft
positions and its traced runs are kept, every rate stays in (0, 1), and the mean acceptance
length moves monotonically with δ.

Fit (`fit_trend`, per group and edge). Statistic: the logit shift δ_k that carries the edge
bucket's per-sparsity rates to bucket k's mean acceptance length (mean over the sparsities
traced at every bucket; δ_edge = 0). Its standard error comes from the prompt-to-prompt spread
of bucket k's runs (`bucket_se`; the prompt is the sampling unit, its sparsities are
correlated), carried to δ through dL/dδ. The group's own slope is a weighted least-squares
line of δ_k on log2(C_k + g_k) (weights 1 / se²), then:

- capped at the traced span's average change per doubling, |δ_last − δ_first| / doublings
  spanned (an extrapolation never climbs faster than the data did over their whole range);
- flat when the line's sign disagrees with the net change from the first to the last bucket
  (no monotone trend in the data): no estimate, not pooled.

Pooling (`pool_trends`, beyond the last bucket). One group's slope from two buckets is noisy
(recall: ±0.3 logit per doubling from 12 prompts), so each group's own estimate b ± se is
partially pooled (normal empirical Bayes) with the groups fitted over the same span of context
(first to last traced bucket: a slope per doubling depends on where it is measured, so only
equal spans are compared; a bucket inside the span one group has and another lacks does not
move it):

- a cell (same workload and temperature: the methods and traced γ run on the same prompts)
  pools its groups: random-effects mean, τ² by DerSimonian-Laird's moment estimate from the
  estimates' own standard errors, its se as for fully correlated estimates (shared prompts:
  pooling methods adds no precision about the prompts' draw);
- the range pools its cells the same way (independent: other prompts or temperature), and
  its mean is shrunk toward flat by its own evidence: × max(0, 1 − 1/t²), t = mean / se (the
  moment estimate of the true slope's share of the estimate's variance: E[b²] = β² + se²), so
  a mean within one standard error of 0 gives a flat trend, and a clear one passes nearly whole;
- each level's posterior: prior + B (estimate − prior), B = τ² / (τ² + se²), sd
  √(B se² + (1 − B)² sd_prior²). A group alone over its buckets reduces to its own slope
  shrunk toward flat. No constant is tuned: τ² and every weight come from the standard errors.

Beyond the own reach (`covering_trend`) the groups of other workloads traced past it take
over; where they exist the own slope is first pooled with theirs (`toward_evidence`: the same
normal empirical Bayes, τ² over own and evidence together), so a slope measured over a short
span (chat traced at 49..61 tokens: ±0.4) moves to the evidence while one the evidence cannot
explain (short code's −1.4 ± 0.1 against the long prompts' +0.4) keeps its own.

A group with one traced bucket, or no sparsity traced at all its buckets, has a flat trend.

Uncertainty (`ContextTrend.shift_sd`): sd of δ at d doublings beyond the edge,
sqrt((se × d)² + (CURVATURE_SD × slope × d)²): the slope's sampling error and an allowance for
the curvature a line cannot see, both growing with the log-distance. CURVATURE_SD: on the
SmolLM2 real set's longdoc and recall groups (4 buckets, 1-7K) the slope of each single
doubling differs from the group's line by sd 0.19 of it (median |deviation| 0.16, sampling
noise included; greedy longdoc's rise per doubling halves from 1-2K to 2-4K); 0.25 allows for
the larger distances extrapolated. (Chosen on the whole 1-7K set, so in the ≤ 3K check of
`benchmarks/context_extrapolation.py` it has seen the held-out buckets: there it widens the
interval only, never moves the prediction.) The slope's sd se is the pooled posterior sd.
`AcceptanceDist` carries the sd as a relative sd of the mean
acceptance length (`context_trend_sd_pct`), linearised at the edge bucket (`TrendShift.sd_pct`:
it keeps growing where the shifted rates saturate), which the prediction interval adds to its
acceptance extrapolation term.

Calibration (the sd scale): the sd above is a model's, from the buckets' standard errors;
the context hold-outs measure how far the trend actually misses. Held out per workload (a
real-weights set, each workload fitted on its shortest third of buckets,
`benchmarks/acceptance_holdout.py`), the factor each held-out point needs on the trend's sd to
fall inside the 95 % interval (with its own measurement's error beside it) has a 95th
percentile above 1: the slopes of two or three buckets vary between workloads more than their
standard errors and the curvature allowance say, and by how much differs between models. So
the sd is scaled, split-conformal style: it widens the interval only, never moves the
prediction. A set that carries its own hold-out's factor (meta.json `acceptance_calibration`,
`calibrated_scale` of that quantile) is scaled by it; any other by TREND_SD_SCALE, the same
quantile over the packaged sets' hold-out points pooled. Scored per workload with the factor of
the set's other workloads alone, and per set with the factor of the other sets alone, the
intervals cover the held-out points at about the nominal rate (docs/RESULTS.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np

from vegas_sim.sim.acceptance_cells import GroupKey
from vegas_sim.sim.acceptance_dist import (
    AcceptanceDist,
    DrawSource,
    TracedCell,
    conditional_rates,
)

COND_EPS = 1e-6  # conditional rates are clipped into [ε, 1 − ε] before the logit
DELTA_BOUND = 12.0  # |δ| at most: logit shifts beyond this move every rate to 0 or 1
MAX_SPAN_MULTIPLE = 2.0  # the sparsity trend is followed for at most this many fitted spans
# A group's own context trend is followed for at most this many traced spans (doublings) past
# its edge: the farthest the packaged hold-outs reach (fit on 1-2K, predict 7K: 1.75 spans),
# where the own trend still beat the held bucket on every workload (docs/RESULTS.md)
OWN_SPAN_FACTOR = 1.75
CURVATURE_SD = 0.25  # relative sd of a shift: single doublings vs the line, 1-7K set
# the trend's sd × this for a set without its own calibration: the 95th percentile of the
# factor the packaged real sets' context hold-out points need, pooled (`calibrated_scale`)
TREND_SD_SCALE = 3.5
SCALE_STEP = 0.5  # a hold-out's quantile is rounded to this: a few hundred points fix no more
SE_FLOOR = 1e-3  # relative: a bucket of identical runs still has some sampling error

_K = TypeVar("_K")


def calibrated_scale(quantile: float) -> float:
    """The sd scale a hold-out's 95th-percentile factor gives: rounded to SCALE_STEP, at
    least 1 (the model's own sd is never narrowed)."""
    return max(1.0, round(quantile / SCALE_STEP) * SCALE_STEP)


def shift_rates(rates: np.ndarray, delta: float) -> np.ndarray:
    """Per-position rates with their conditional rates shifted by `delta` in logit space."""
    if delta == 0.0 or len(rates) == 0:
        return np.asarray(rates, dtype=float).copy()
    shifted = 1.0 / (1.0 + np.exp(-(_cond_logits(rates) + delta)))
    return np.cumprod(shifted)


def shift_source(source: DrawSource, delta: float) -> DrawSource:
    """`source` with its rates shifted by `delta` (`shift_rates`) and its pace moved with them:
    `stretch` (traced iterations per replayed one) times the unshifted over the shifted mean
    acceptance length, so a request still walks through its run at its own tokens' pace."""
    moved = shift_rates(source.rates, delta)
    pace = (1.0 + float(np.sum(source.rates))) / (1.0 + float(np.sum(moved)))
    return replace(source, rates=moved, stretch=source.stretch * pace)


def mean_length(rates: Sequence[np.ndarray], delta: float = 0.0) -> float:
    """Mean over components of the acceptance length 1 + Σ r_i, each shifted by δ."""
    return float(np.mean([1.0 + shift_rates(r, delta).sum() for r in rates]))


def delta_to_length(rates: Sequence[np.ndarray], target: float) -> float:
    """The δ whose shift of `rates` has mean acceptance length `target` (the length rises
    monotonically with δ: Brent's root), clamped to ±DELTA_BOUND."""
    lo, hi = -DELTA_BOUND, DELTA_BOUND
    if mean_length(rates, lo) >= target:
        return lo
    if mean_length(rates, hi) <= target:
        return hi
    from scipy.optimize import brentq  # fitting a trend only: a cached fit never imports it

    logits = [_cond_logits(r) for r in rates]  # fixed: only δ moves inside the search

    def excess(delta: float) -> float:
        return float(np.mean([1.0 + np.cumprod(1.0 / (1.0 + np.exp(-(z + delta)))).sum()
                              for z in logits])) - target
    return float(brentq(excess, lo, hi, xtol=1e-12))


Z95 = 1.96  # a normal's 97.5th percentile: 95 % intervals, and `shifted_sd_pct`'s ±Z95 sd


def shifted_sd_pct(length: Callable[[float], float], sd: float, z: float = Z95) -> float:
    """Relative sd (%) of a mean acceptance length `length(x)` (x: a further logit shift of
    its level) from a logit sd `sd`: the larger of its moves under x = ±z·sd, over z (a
    length near γ + 1 moves little up and much down; the interval takes the larger side)."""
    if sd <= 0.0:
        return 0.0
    base = length(0.0)
    move = max(length(z * sd) - base, base - length(-z * sd))
    return 100.0 * move / z / base


def shift_dist(dist: AcceptanceDist, delta: float) -> AcceptanceDist:
    """`dist` with every traced source's rates shifted by `delta` (`shift_source`; the
    all-accepted component of s = 1 stays: its draft is the target at any δ), the mixture's
    rates made again from them."""
    if delta == 0.0 or dist.gamma == 0:
        return replace(dist, extrapolated=list(dist.extrapolated))
    if not dist.sources:
        return replace(dist, rates=shift_rates(dist.rates, delta),
                       extrapolated=list(dist.extrapolated))
    sources = [src if src.cell is None else shift_source(src, delta) for src in dist.sources]
    rates = sum((w * s.rates for w, s in zip(dist.weights, sources)), np.zeros(dist.gamma))
    return replace(dist, rates=np.asarray(rates), extrapolated=list(dist.extrapolated),
                   sources=sources)


def source_parts(dist: AcceptanceDist) -> list[tuple[float, np.ndarray, bool]]:
    """(weight, rates, shiftable) of each mixture component (a hand-built dist: one)."""
    if not dist.sources:
        return [(1.0, np.asarray(dist.rates, dtype=float), True)]
    return [(float(w), np.asarray(s.rates, dtype=float), s.cell is not None)
            for w, s in zip(dist.weights, dist.sources)]


def shifted_dist_sd_pct(dist: AcceptanceDist, sd: float) -> float:
    """`shifted_sd_pct` of `dist`'s mean acceptance length, its shiftable sources moved."""
    if dist.gamma == 0:
        return 0.0
    parts = source_parts(dist)

    def length(delta: float) -> float:
        return 1.0 + float(sum(w * (shift_rates(r, delta) if ok else r).sum()
                               for w, r, ok in parts))

    return shifted_sd_pct(length, sd)


def _cond_logits(rates: np.ndarray) -> np.ndarray:
    """Logits of the conditional per-position rates, clipped as `shift_rates` clips them."""
    c = np.clip(conditional_rates(np.asarray(rates, dtype=float)), COND_EPS, 1.0 - COND_EPS)
    return np.asarray(np.log(c / (1.0 - c)))


def length_slope(rates: Sequence[np.ndarray], delta: float, eps: float = 1e-3) -> float:
    """dL/dδ of the mean acceptance length at δ (central difference)."""
    return (mean_length(rates, delta + eps) - mean_length(rates, delta - eps)) / (2 * eps)


def bucket_se(run_lengths: Sequence[np.ndarray]) -> float:
    """Standard error of a bucket's mean acceptance length from its runs' lengths, one array
    per sparsity. When every sparsity has the same runs (the same prompts, in the same order)
    the prompt is the unit: sd of the prompts' means over the sparsities / √prompts; else the
    mean of the sparsities' own standard errors (as if fully correlated)."""
    arrays = [np.asarray(x, dtype=float) for x in run_lengths if len(x)]
    if not arrays:
        return 0.0
    if len({len(x) for x in arrays}) == 1 and len(arrays[0]) > 1:
        per_prompt = np.mean(np.stack(arrays), axis=0)
        return float(per_prompt.std(ddof=1) / math.sqrt(len(per_prompt)))
    return float(np.mean([x.std(ddof=1) / math.sqrt(len(x)) if len(x) > 1 else 0.0
                          for x in arrays]))


def run_lengths(cell: TracedCell) -> np.ndarray:
    """[runs] each traced run's mean acceptance length at its traced γ (runs in request order)."""
    starts = np.unique(cell.run_start)
    lengths = np.diff(np.append(starts, len(cell.acc)))
    return np.asarray(1.0 + np.add.reduceat(cell.acc.astype(float), starts) / lengths)


@dataclass(frozen=True)
class ContextTrend:
    """The trend of one (method, temperature, workload, traced γ) beyond one edge bucket."""

    edge: float  # the edge bucket (start context) the shift is applied to
    slope: float  # δ per doubling of context used for extrapolation (0 = flat)
    fitted_slope: float  # the weighted least-squares slope before shrinkage and cap
    slope_se: float
    buckets: tuple[float, ...]  # traced buckets (start contexts), ascending
    lengths: tuple[float, ...]  # mean acceptance length per bucket (mean over sparsities)
    deltas: tuple[float, ...]  # δ per bucket relative to the edge bucket's shape
    reason: str = ""  # why the trend is flat, shrunk or capped ("" = fitted as is)
    pct_per_doubling: float = 0.0  # % change of the edge bucket's mean acceptance length
    # that one doubling along the trend gives
    generated: float = 0.0  # mean tokens generated before an iteration of the edge bucket
    span: float = 0.0  # doublings of context the traced buckets' iterations span
    # the group's own slope (after the monotone check and the cap; None: no estimate) and the
    # edge bucket's per-sparsity rates, which partial pooling (`pool_trends`) starts from
    estimate: float | None = None
    edge_rates: tuple[tuple[float, ...], ...] = ()
    reach_spans: float = MAX_SPAN_MULTIPLE  # own trend followed for this many spans, then...
    covering: CoveringTrend | None = None  # ...the evidence that covers the contexts beyond

    def doublings_to(self, context: int) -> float:
        """log2 distance of a request of prompt `context` from the edge bucket, both placed
        at their iterations' mean context (prompt + the tokens generated before them)."""
        return math.log2((context + self.generated) / (self.edge + self.generated))

    @property
    def flat(self) -> bool:
        return self.slope == 0.0

    @property
    def reach(self) -> float:
        """Doublings past the edge the own trend is followed (`reach_spans` traced spans)."""
        return self.reach_spans * self.span

    def shift(self, doublings: float) -> float:
        """δ at `doublings` (signed log2 distance from the edge bucket): the own slope for at
        most `reach` doublings; beyond, the covering evidence's slope (`covering`) up to where
        it ends, held past that (held past `reach` when nothing covers)."""
        own = self.slope * max(-self.reach, min(self.reach, doublings))
        if self.covering is None or doublings <= self.reach:
            return own
        return own + self.covering.slope * self.covering.followed(doublings)

    def shift_sd(self, doublings: float, scale: float = TREND_SD_SCALE) -> float:
        """sd of δ at `doublings` from the edge (module docstring, Uncertainty): the own
        slope's over the whole distance up to `reach`, the covering slope's (its spread
        included) beyond, added (both grow with the distance), × `scale` (Calibration)."""
        d = abs(doublings)
        near = min(d, self.reach) if self.covering is not None else d
        own = math.hypot(self.slope_se * near, CURVATURE_SD * self.slope * near)
        if self.covering is None or d <= self.reach:
            return scale * own
        far = d - self.reach
        cover = math.hypot(self.covering.sd * far, CURVATURE_SD * self.covering.slope * far)
        return scale * (own + cover)

    def source(self, doublings: float) -> str:
        """Which trend a shift at `doublings` followed: 'own' or 'own, then covering'."""
        if self.covering is None or doublings <= self.reach:
            return "own"
        return f"own for {self.reach:+.2f}, then {self.covering.describe()}"


@dataclass(frozen=True)
class CoveringTrend:
    """The context trend beyond a group's own reach, from evidence that covers those contexts:
    the slopes of the groups (other workloads, or another set of the same model's acceptance)
    traced at longer contexts, pooled (random effects) with their spread."""

    slope: float  # δ per doubling, the pooled mean
    sd: float  # predictive sd of the slope: the mean's se and the between-evidence spread τ
    start: float  # doublings past the edge where it takes over (the own trend's reach)
    end: float  # doublings past the edge where the evidence ends (its own reach): held beyond
    fitted_on: str  # "longdoc 1024..7168, recall 1024..7168"

    def followed(self, doublings: float) -> float:
        """Doublings followed along this slope at `doublings` past the edge."""
        return max(0.0, min(doublings, self.end) - self.start)

    def describe(self) -> str:
        return f"covering {self.slope:+.2f} ± {self.sd:.2f} ({self.fitted_on}, to {self.end:+.2f})"


def covering_trend(trend: ContextTrend, evidence: Sequence[ContextTrend],
                   labels: Sequence[str]) -> ContextTrend:
    """`trend` with the evidence beyond its own reach attached (`CoveringTrend`): of
    `evidence` (trends of independent prompts: other workloads, another set; `labels` name
    them), those whose last traced bucket lies past the contexts `trend` reaches, their slopes
    pooled as independent estimates, sd √(se² + τ²), followed up to the farthest of their last
    traced buckets (held beyond: their own extrapolation is no evidence); its own slope first
    pooled with theirs (`toward_evidence`). `trend` unchanged where none covers (it is then
    held past its reach)."""
    reach_ctx = (trend.edge + trend.generated) * 2.0 ** trend.reach - trend.generated
    cover = [(t, lab) for t, lab in zip(evidence, labels)
             if len(t.buckets) > 1 and max(t.buckets) > reach_ctx]  # traced there, not reached
    if not cover:
        return trend
    slopes = [(t.slope, t.slope_se) for t, _ in cover]
    pooled = random_effects(slopes, correlated=False)
    trend = toward_evidence(trend, slopes)
    end = max(math.log2((max(t.buckets) + t.generated) / (trend.edge + trend.generated))
              for t, _ in cover)  # the evidence's own last bucket: past it nothing covers
    names = ", ".join(f"{lab} {min(t.buckets):.0f}..{max(t.buckets):.0f}" for t, lab in cover)
    sd = math.hypot(pooled.se, math.sqrt(pooled.tau2))
    return replace(trend, covering=CoveringTrend(pooled.mean, sd, trend.reach, end, names))


def toward_evidence(trend: ContextTrend, evidence: Sequence[tuple[float, float]]
                    ) -> ContextTrend:
    """`trend`'s own slope partially pooled with the covering evidence's slopes (normal
    empirical Bayes over own + evidence: τ² by DerSimonian-Laird with the own estimate among
    them, `posterior` toward their random-effects mean). A slope measured over a short or noisy
    span (large se) moves to the evidence; one that differs from it by more than its se allows
    (a large τ²) keeps its own. Unchanged without an own estimate."""
    if trend.estimate is None or trend.slope_se <= 0.0 or not evidence:
        return trend
    own = (trend.slope, trend.slope_se)
    everyone = random_effects([own, *evidence], correlated=False)
    slope, sd = posterior(*own, everyone.tau2, everyone.mean, everyone.se)
    if abs(slope - trend.slope) < 1e-12:
        return trend
    return _with_pooled_slope(trend, slope, sd, (
        f"{trend.reason + '; ' if trend.reason else ''}toward the covering evidence: "
        f"{trend.slope:+.2f} ± {trend.slope_se:.2f} -> {slope:+.2f} ± {sd:.2f}"))


def flat_trend(edge: float, reason: str) -> ContextTrend:
    """No trend beyond `edge` (the nearest bucket is held), and why."""
    return ContextTrend(edge, 0.0, 0.0, 0.0, (edge,), (), (0.0,), reason)


def _flat(edge: float, buckets: Sequence[float], lengths: Sequence[float],
          deltas: Sequence[float], reason: str, fitted: float = 0.0,
          se: float = 0.0, generated: float = 0.0, span: float = 0.0) -> ContextTrend:
    return ContextTrend(edge, 0.0, fitted, se, tuple(buckets), tuple(lengths), tuple(deltas),
                        reason, 0.0, generated, span)


def fit_trend(buckets: Sequence[float], rates: Sequence[Sequence[np.ndarray]],
              ses: Sequence[float], edge: int,
              generated: Sequence[float] | None = None) -> ContextTrend:
    """The trend of a group beyond bucket index `edge` (0 or the last; module docstring).

    buckets [K] ascending start contexts; rates[k] the per-sparsity rates [γ_t] of bucket k (the
    same sparsities, in the same order, at every bucket); ses[k] the standard error of bucket
    k's mean acceptance length (`bucket_se`); generated[k] the mean tokens generated before
    an iteration of bucket k (the line is fitted at the iterations' mean contexts).
    """
    gen = list(generated) if generated is not None else [0.0] * len(buckets)
    edge_c = float(buckets[edge])
    lengths = [mean_length(r) for r in rates]
    if len(buckets) < 2:
        return _flat(edge_c, buckets, lengths, [0.0] * len(buckets), "one traced context bucket")
    ref = rates[edge]
    deltas = [0.0 if k == edge else delta_to_length(ref, lengths[k]) for k in range(len(rates))]
    x = np.log2((np.asarray(buckets, dtype=float) + gen) / (edge_c + gen[edge]))
    y = np.asarray(deltas)
    se_d = np.array([max(se, SE_FLOOR * lk) / max(length_slope(ref, d), 1e-9)
                     for se, lk, d in zip(ses, lengths, deltas)])
    w = 1.0 / se_d ** 2
    xm = float(np.sum(w * x) / w.sum())
    sxx = float(np.sum(w * (x - xm) ** 2))
    fitted = float(np.sum(w * (x - xm) * y) / sxx)
    se = 1.0 / math.sqrt(sxx)
    span = float(x[-1] - x[0])
    net = (deltas[-1] - deltas[0]) / span  # the traced span's average change per doubling
    args = (edge_c, buckets, lengths, deltas)
    if fitted == 0.0 or net == 0.0 or math.copysign(1.0, fitted) != math.copysign(1.0, net):
        return _flat(*args, "no monotone trend over the traced buckets", fitted, se,
                     gen[edge], span)
    capped = abs(fitted) > abs(net) * (1.0 + 1e-9)
    own = net if capped else fitted
    slope, sd = shrink_to_flat(own, se)
    reason = (f"capped at the traced span's change per doubling ({net:+.2f})"
              if capped and slope else _shrink_reason(own, se, slope))
    edge_rates = tuple(tuple(float(v) for v in r) for r in ref)
    pct = 100.0 * (mean_length(ref, slope) / lengths[edge] - 1.0)
    return ContextTrend(edge_c, slope, fitted, sd, tuple(buckets), tuple(lengths),
                        tuple(deltas), reason, pct, gen[edge], span, own, edge_rates)


def shrink_to_flat(estimate: float, se: float) -> tuple[float, float]:
    """A slope shrunk toward flat by its own evidence: estimate × max(0, 1 − 1/t²), t =
    estimate / se (module docstring), with its se kept as the sd (a slope shrunk to flat is
    still uncertain by its standard error)."""
    if se <= 0.0 or estimate == 0.0:
        return estimate, se
    return estimate * max(0.0, 1.0 - (se / estimate) ** 2), se


def _shrink_reason(estimate: float, se: float, slope: float) -> str:
    if slope == 0.0:
        return f"slope {estimate:+.2f} within one standard error ({se:.2f}) of 0"
    return f"shrunk by its standard error ({estimate:+.2f} ± {se:.2f})" if (
        estimate / se) ** 2 < 4 else ""


@dataclass(frozen=True)
class Pooled:
    """A random-effects mean of slope estimates: the mean, its se, the between-estimate
    variance τ² (DerSimonian-Laird) and how many estimates it pooled."""

    mean: float
    se: float
    tau2: float
    n: int


def random_effects(estimates: Sequence[tuple[float, float]], correlated: bool) -> Pooled:
    """Pool (estimate, se) pairs: τ² by DerSimonian-Laird's moment estimate (max(0, (Q − (k −
    1)) / (Σw − Σw²/Σw)), w = 1/se²; 0 for one estimate), the mean weighted by 1/(se² + τ²).
    `correlated`: the estimates' sampling errors are fully correlated (the same prompts), so
    the mean's variance is (Σ w*² τ² + (Σ w* se)²) / (Σ w*)², not 1 / Σ w*."""
    b = np.array([e for e, _ in estimates], dtype=float)
    se = np.maximum(np.array([s for _, s in estimates], dtype=float), 1e-9)
    w = 1.0 / se ** 2
    tau2 = 0.0
    if len(b) > 1:
        q = float(np.sum(w * (b - np.sum(w * b) / w.sum()) ** 2))
        tau2 = max(0.0, (q - (len(b) - 1)) / float(w.sum() - np.sum(w ** 2) / w.sum()))
    ws = 1.0 / (se ** 2 + tau2)
    mean = float(np.sum(ws * b) / ws.sum())
    var = (float(np.sum(ws ** 2)) * tau2 + float(np.sum(ws * se)) ** 2) / float(ws.sum()) ** 2 \
        if correlated else 1.0 / float(ws.sum())
    return Pooled(mean, math.sqrt(var), tau2, len(b))


def posterior(estimate: float, se: float, tau2: float, prior_mean: float,
              prior_sd: float) -> tuple[float, float]:
    """Normal partial pooling of one estimate toward a prior mean known to ±prior_sd: the mean
    prior + B (estimate − prior), B = τ² / (τ² + se²), and its sd √(B se² + (1 − B)² prior_sd²)."""
    b = tau2 / (tau2 + se ** 2) if tau2 + se ** 2 > 0.0 else 1.0
    return (prior_mean + b * (estimate - prior_mean),
            math.sqrt(b * se ** 2 + (1.0 - b) ** 2 * prior_sd ** 2))


def pool_trends(trends: Mapping[_K, ContextTrend],
                cell_of: Callable[[_K], Hashable]) -> dict[_K, ContextTrend]:
    """Partial pooling of the groups' own slopes (module docstring, Pooling). Groups fitted
    over the same span (first to last traced bucket) form a range; a cell (`cell_of`: e.g.
    workload and temperature) pools its groups as correlated estimates, the range pools its
    cells, and the
    range's mean is shrunk toward flat by its own evidence. Groups without an estimate keep
    their trend; a range of one group gets `shrink_to_flat` of its own slope."""
    out = dict(trends)
    ranges: dict[tuple[float, float], dict[Hashable, list[_K]]] = {}
    for k, t in trends.items():
        if t.estimate is not None:
            span = (min(t.buckets), max(t.buckets))
            ranges.setdefault(span, {}).setdefault(cell_of(k), []).append(k)
    for cells in ranges.values():
        own = {k: (float(trends[k].estimate or 0.0), trends[k].slope_se)
               for ks in cells.values() for k in ks}
        level = {c: random_effects([own[k] for k in ks], correlated=True)
                 for c, ks in cells.items()}
        top = random_effects([(e.mean, e.se) for e in level.values()], correlated=False)
        top_mean = shrink_to_flat(top.mean, top.se)[0]
        for c, ks in cells.items():
            cell_mean, cell_sd = posterior(level[c].mean, level[c].se, top.tau2, top_mean,
                                           top.se)
            for k in ks:
                slope, sd = posterior(*own[k], level[c].tau2, cell_mean, cell_sd)
                out[k] = _with_slope(trends[k], slope, sd, level[c].n, top.n, len(own))
    return out


def _with_slope(t: ContextTrend, slope: float, sd: float, in_cell: int, cells: int,
                groups: int) -> ContextTrend:
    if groups == 1:  # nothing to pool with: the group's own slope shrunk toward flat
        return t
    return _with_pooled_slope(t, slope, sd, (
        f"pooled: own {t.estimate:+.2f} ± {t.slope_se:.2f} -> {slope:+.2f} ± {sd:.2f} "
        f"(its cell's {in_cell} trends, {cells} cells over this span)"))


def _with_pooled_slope(t: ContextTrend, slope: float, sd: float, reason: str) -> ContextTrend:
    """`t` at a pooled slope: its % change per doubling made again from the edge bucket's
    rates (0 for a trend built without them)."""
    ref = [np.asarray(r) for r in t.edge_rates]
    pct = 100.0 * (mean_length(ref, slope) / mean_length(ref) - 1.0) if ref else 0.0
    return replace(t, slope=slope, slope_se=sd, pct_per_doubling=pct, reason=reason)


@dataclass(frozen=True)
class TrendShift:
    """The context-trend shift one lookup component got: pooled over its workloads."""

    delta: float  # δ applied
    sd: float  # sd of δ (`ContextTrend.shift_sd`)
    slope: float  # δ per doubling (iteration-weighted over the workloads)
    doublings: float  # log2 distance from the edge bucket (`ContextTrend.doublings_to`)
    length_before: float  # mean acceptance length of the component before / after the shift
    length_after: float
    fitted_on: str  # "longdoc 1024..7168 (4 buckets)", one per workload
    reason: str = ""  # why the (first) workload's trend is flat, shrunk or capped
    held_beyond: float | None = None  # doublings past which the trend is held (when reached)
    pct_per_delta: float = 0.0  # % of the edge bucket's mean acceptance length per unit δ
    covered_by: str = ""  # beyond the own reach: the covering evidence followed ('' = own)

    @classmethod
    def of(cls, trends: Sequence[ContextTrend], workloads: Sequence[str], share: np.ndarray,
           context: int, rates: np.ndarray, sd_scale: float = TREND_SD_SCALE) -> TrendShift:
        """The shift of a component pooling `workloads` (iteration shares `share`) at
        `context`, beyond their common edge bucket; its sd × `sd_scale` (Calibration)."""
        dist = [t.doublings_to(context) for t in trends]
        doublings = float(sum(w * d for w, d in zip(share, dist)))
        delta = float(sum(w * t.shift(d) for w, t, d in zip(share, trends, dist)))
        sd = float(sum(w * t.shift_sd(d, sd_scale) for w, t, d in zip(share, trends, dist)))
        slope = float(sum(w * t.slope for w, t in zip(share, trends)))
        seen: dict[str, ContextTrend] = {}
        for wl, t in zip(workloads, trends):
            seen.setdefault(wl, t)
        fitted_on = ", ".join(
            f"{wl} {min(t.buckets):.0f}..{max(t.buckets):.0f}, {len(t.buckets)} buckets"
            for wl, t in seen.items())
        reason = next((t.reason for t in trends if t.reason), "")
        after = 1.0 + float(shift_rates(rates, delta).sum())
        held = [_held_at(t) for t, d in zip(trends, dist) if _held_at(t) < d
                and (t.slope or (t.covering is not None and t.covering.slope))]
        covered = next((f"beyond {t.reach:+.2f} doublings ({t.reach_spans:g}x its traced span) "
                        f"the trend of the evidence that covers it, {t.covering.describe()}"
                        for t, d in zip(trends, dist) if t.covering is not None and d > t.reach),
                       "")
        before = 1.0 + float(rates.sum())
        return cls(delta, sd, slope, doublings, before, after, fitted_on, reason,
                   min(held) if held else None, 100.0 * length_slope([rates], 0.0) / before,
                   covered)

    @property
    def sd_pct(self) -> float:
        """The shift's sd as % of the mean acceptance length, linearised at the edge bucket
        (so it grows with the distance even where the shifted rates saturate)."""
        return self.sd * self.pct_per_delta


def _held_at(t: ContextTrend) -> float:
    """Doublings past the edge beyond which `t` is held: its covering evidence's end, else
    its own reach."""
    return t.covering.end if t.covering is not None else t.reach


def trend_note(context: int, traced: tuple[int, int], bucket: float, weights: Sequence[float],
               shifts: Sequence[TrendShift | None], gamma: int, label: str = "traced") -> str:
    """The `extrapolated` note of a lookup above the traced contexts: the context trend it
    followed (slope, the buckets it was fitted on, distance, shift and what the shift did to
    the mean acceptance length, over the mixture `weights`), or why it held the bucket.
    `parse_trend_note` reads it back (the report's context-trend table)."""
    head = f"context {context} outside {label} {traced[0]}..{traced[1]}: context trend"
    used = [sh for sh in shifts if sh is not None]
    if all(sh.delta == 0.0 for sh in used):
        why = "; ".join(sorted({sh.reason for sh in used if sh.reason})) or "none fitted"
        return f"{head} flat ({why}): using the nearest traced bucket ({bucket:.0f})"
    # the all-accepted component (sparsity toward 1) has no trend: γ + 1 before and after
    before = sum(w * (sh.length_before if sh else gamma + 1.0) for w, sh in zip(weights, shifts))
    after = sum(w * (sh.length_after if sh else gamma + 1.0) for w, sh in zip(weights, shifts))
    moved = [(w, sh) for w, sh in zip(weights, shifts) if sh is not None]
    delta = sum(w * sh.delta for w, sh in moved) / sum(w for w, _ in moved)
    first = next(sh for sh in used if sh.delta != 0.0)
    held = ("" if first.held_beyond is None else
            f" (held beyond {first.held_beyond:.2f}: past the evidence)")
    # (`extrapolated` joins notes with ';': none inside a note)
    covered = f", {first.covered_by}" if first.covered_by else ", own trend only"
    return (f"{head} {first.slope:+.2f} logit per doubling ({first.fitted_on}) from the "
            f"{bucket:.0f} bucket, {first.doublings:+.2f} doublings{held}: shift {delta:+.2f}, "
            f"mean acceptance length {before:.2f} -> {after:.2f}{covered}")


_NOTE_RE = re.compile(
    r"context trend (?P<slope>[+-][\d.]+) logit per doubling \((?P<fitted_on>[^)]*)\) from the "
    r"(?P<bucket>\d+) bucket, (?P<doublings>[+-][\d.]+) doublings(?: \([^)]*\))?: shift "
    r"(?P<shift>[+-][\d.]+), mean acceptance length (?P<before>[\d.]+) -> (?P<after>[\d.]+)")


# the calibration `AcceptanceModel` appends to a trend note (`_scale_note`)
_SCALE_RE = re.compile(r"its sd x(?P<scale>[\d.]+) \((?P<source>[^)]*)\)")


def parse_trend_note(text: str) -> dict[str, float | str] | None:
    """The numbers of a `trend_note` inside an `extrapolated` text (None: no trend followed)."""
    m = _NOTE_RE.search(text)
    if m is None:
        return None
    scale = _SCALE_RE.search(text, m.end())
    return {"slope_per_doubling": float(m["slope"]), "fitted_on": m["fitted_on"],
            "edge_bucket": float(m["bucket"]), "doublings": float(m["doublings"]),
            "shift": float(m["shift"]), "length_before": float(m["before"]),
            "length_after": float(m["after"]),
            "sd_scale": f"x{scale['scale']} ({scale['source']})" if scale else ""}


def covering_peers(group: GroupKey, trends: Mapping[GroupKey, ContextTrend]
                    ) -> list[GroupKey]:
    """The groups whose trends may cover the contexts beyond `group`'s reach: the other
    workloads of its method and temperature (other prompts: independent evidence), one group
    each, at the traced γ nearest its own."""
    best: dict[str, GroupKey] = {}
    for h in sorted(trends):
        if (h.method, h.temperature) != (group.method, group.temperature) or \
                h.workload == group.workload:
            continue
        if h.workload not in best or abs(h.gamma - group.gamma) < abs(
                best[h.workload].gamma - group.gamma):
            best[h.workload] = h
    return [best[w] for w in sorted(best)]


def trend_sd_pct(weights: Sequence[float] | np.ndarray, shifts: list[TrendShift | None]
                 ) -> float:
    """Relative sd (%) of a mixture's mean acceptance length from the context trends its
    components followed: each component's (`TrendShift.sd_pct`), weighted like the mixture
    (fully correlated)."""
    return float(sum(float(w) * sh.sd_pct for w, sh in zip(weights, shifts)
                     if sh is not None))


def trend_sd_logit(weights: Sequence[float] | np.ndarray, shifts: list[TrendShift | None]
                   ) -> float:
    """`trend_sd_pct` as a logit shift: the components' δ sds, weighted like the mixture."""
    return float(sum(float(w) * sh.sd for w, sh in zip(weights, shifts) if sh is not None))
