"""Anchored acceptance: a real-weights trace set's *shape*, carried to measured anchors' *level*.

A shape set (`AcceptanceModel` of, e.g., SmolLM2-135M) says how acceptance moves with γ, draft
position, sparsity, context and workload; acceptance anchors (`traces.anchors`, e.g. the Vegas
paper's Qwen3-8B figures) say how much the model of interest accepts at a few configurations.

Transform. For each method, one number δ shifts the conditional per-position acceptance
c_i = r_i / r_{i−1} (r_0 = 1) of every looked-up distribution in logit space:

    c_i' = σ(logit(c_i) + δ),    r_i' = Π_{j ≤ i} c_j'

so a draft position that is nearly always accepted stays so, the decay along the positions
keeps its form, and δ = 0 is the shape itself. Per-position rates, acceptance lengths and the
mean acceptance length 1 + Σ r_i' all rise monotonically with δ. A logit shift is what a
uniformly better draft does to a Bernoulli acceptance (a constant change of the log-odds of
the draft agreeing with the target), and it keeps every rate in (0, 1) for any δ.

Fit. δ of a method minimises, with scipy's least squares over all anchors of that method,

    Σ_a [(L_a(δ) − L*_a) / L*_a]²  +  Σ_a Σ_i [(R_ai(δ) − r*_ai) / L*_a]²   (rates when given)

where L*_a, r*_a are the anchor's mean acceptance length and per-position rates and L_a(δ),
R_a(δ) the shape's, shifted by δ, at the anchor's configuration. An anchor's context is the
prompt length of the requests its counts cover (a range [lo, hi]: prompts spread over it), the
context a prediction looks acceptance up at: the anchor is evaluated at N_CONTEXT_NODES
contexts spread evenly over its range, each looked up as a prediction of that prompt looks it
up (whole traced runs; beyond the traced contexts along the context trend), its mean
acceptance length the harmonic mean of the nodes' (tokens / iterations, as vLLM's counters
pool them), its rates iteration-weighted. So a prediction of an anchor's own setting gives the
anchor back (for outputs as long as the traced runs; a shorter one replays their first
tokens). An anchor's empty field is evaluated at: sparsity DEFAULT_SPARSITY, temperature 0,
workload pooled, context the prompt contexts the shape set traced the method's workload over
(all its workloads when none is named). δ adds to the context trend in logit space. One
anchor of a method is matched exactly (up to reachability: a length of γ + 1 needs δ = ∞).
When a method's anchors name two or more workloads, each of those workloads gets its own δ
(fitted on its anchors); other workloads use the method's joint δ.
Anchors that follow their own context: when a method's (or workload's) anchors sit at contexts
at least CONTEXT_SLOPE_RATIO apart, δ is a line in log2 context, δ(c) = δ_0 + β (log2 c − m),
fitted jointly (δ_0 at the middle m of the anchored contexts, β per doubling) and held at its
end values outside them, so the anchored acceptance follows the anchors' context dependence
over their span instead of the shape's, and the shape's own trend beyond it.

Replay. `AcceptanceDist.sample` replays whole traced runs and thins / extends each iteration
position by position to its sources' target rates (`acceptance_dist.match_rates`); the transform
replaces each traced source's target rates by the shifted ones, so the replay keeps the runs'
correlation along a generation and reaches the anchored level in expectation. Each source's
`stretch` (traced iterations per replayed one) is divided by the shifted over the unshifted
acceptance length, so a request still walks through its run at its own tokens' pace. The
all-accepted source (s = 1: the draft is the target) stays all-accepted.

Outputs. A method without an anchor keeps the shape set's level, and its rows say so in
`extrapolated`. A configuration far from every anchor of its method (another workload or
temperature, γ more than GAMMA_NEAR away, sparsity more than SPARSITY_RATIO× away, a context
more than CONTEXT_RATIO× outside the anchored range: the prompts' range, to the prompt plus
the generated tokens where the anchor gives `output_len`) is marked extrapolated, naming the
anchor set and the nearest anchor. `source_for(method)` is the rows' `acceptance_source`.

Uncertainty. The shape set is another model's: how far its workload, temperature, sparsity
and context dependence carries to the anchored model is measured, not assumed. Between two
real models (each predicted from the other's shape and one anchor per method), the error of
a configuration is mostly a level the anchored model needs beyond δ, the same at every γ
(it is a logit shift, so in acceptance length it grows with γ), and it grows with the ways
the configuration differs from the anchor: another workload (a sparse draft on one model
loses what it loses on another: a recall prompt's cue far back, a reasoning chain), another
temperature, sparsity or context beyond the near radius. `TRANSFER_SD` holds a logit sd per
axis (`transfer_axes`; from the nearest anchor, the axes in quadrature); a lookup turns it
into a relative sd of its mean acceptance length (`AcceptanceDist.transfer_sd_pct`: the
larger move of the length under ±1.96 sd, over 1.96) with its share per axis
(`transfer_axes_pct`), which the prediction interval adds as the 'anchors: <axis>'
extrapolation terms (`sim.uncertainty`). A level that is not the predicted model's own —
anchors measured on another model (a sibling's, `api.anchor_acceptance`), or no anchor for the
method (the shape set's level stands in, another model's) — adds the `model` axis
(`anchor_model`, `shape_model`): how far two real models' levels lie apart at one setting
(`benchmarks/model_level.py`). Where the shape reached an anchor's contexts along its context
trend, δ took up that trend's error there: a lookup on the anchor's trend (its workload and
temperature) counts the trend's sd from the anchor's (`relative_to_anchor`), held out by
`benchmarks/context_extrapolation.py --anchor-at`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from vegas_sim.errors import UserInputError
from vegas_sim.methods import DEFAULT_SPARSITY, VANILLA
from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.acceptance_dist import AcceptanceDist, RunningLengthDist, running_stages
from vegas_sim.sim.context_trend import (
    DELTA_BOUND,
    shift_dist,
    shift_rates,
    shifted_dist_sd_pct,
    source_parts,
)
from vegas_sim.traces.anchors import Anchor, AnchorSet

N_CONTEXT_NODES = 8  # contexts an anchor's context range is evaluated at
# How far from an anchor a configuration may be and still count as anchored.
GAMMA_NEAR = 6  # |γ − γ_anchor|: γ 2..12 around an anchor at 6 transfer within 1 % (median) on
# SmolLM2 (benchmarks/anchor_transfer.py)
SPARSITY_RATIO = 2.0  # max(s / s_a, s_a / s)
CONTEXT_RATIO = 2.0  # lo / ratio ≤ context ≤ hi × ratio
CONTEXT_SLOPE_RATIO = 2.0  # anchors this far apart in context fit δ's slope in log2 context
TEMPERATURE_NEAR = 0.05
REACH_TOLERANCE = 1e-3  # relative: an anchor matched worse than this is reported


@dataclass(frozen=True)
class TransferSd:
    """Shape-transfer uncertainty: the sd (logit) of the level shift a configuration may need
    beyond its method's fitted δ, per way it differs from its nearest anchor (module
    docstring, Uncertainty)."""

    near: float = 0.0  # at the anchor's own configuration's neighbourhood
    workload: float = 0.0  # another workload than the anchor's
    temperature: float = 0.0  # another temperature
    per_sparsity_octave: float = 0.0  # per octave of sparsity beyond SPARSITY_RATIO
    per_context_octave: float = 0.0  # per octave of context beyond CONTEXT_RATIO
    model: float = 0.0  # the level measured on another model than the one predicted


# Measured between two real models, each predicted from the other's shape and a handful of its
# own anchors (benchmarks/cross_model_transfer.py --calibrate, docs/RESULTS.md); `model`: the
# root mean square of the two models' level difference at 70 common settings
# (benchmarks/model_level.py).
TRANSFER_SD = TransferSd(near=0.23, workload=0.68, temperature=0.90, per_sparsity_octave=0.0,
                         per_context_octave=0.47, model=0.99)
TRANSFER_AXES = ("anchor", "workload", "temperature", "sparsity", "context", "model")


# ------------------------------------------------------------------------------ transform
# ------------------------------------------------------------------------------------ fit
_Node = tuple[tuple[float, np.ndarray, bool], ...]  # one context's (weight, rates, shiftable)


def nodes_rates(nodes: Sequence[_Node], gamma: int, deltas: Sequence[float]) -> np.ndarray:
    """[γ] per-position rates over context nodes, node k shifted by deltas[k], iteration-
    weighted (a node of acceptance length L spends 1 / L iterations per token): what vLLM's
    counters give."""
    per_node = np.stack([
        sum((w * (shift_rates(r, d) if ok else r) for w, r, ok in node), np.zeros(gamma))
        for node, d in zip(nodes, deltas)])  # [nodes, γ]
    inv_len = 1.0 / (1.0 + per_node.sum(axis=1))  # iterations per token at each node
    return np.asarray(inv_len @ per_node / inv_len.sum())


@dataclass(frozen=True)
class ContextShift:
    """δ as a function of the context: δ_0 at the middle of the anchored log2 contexts
    `span`, `slope` per doubling between them, held at the ends (module docstring)."""

    delta: float
    slope: float = 0.0
    span: tuple[float, float] = (0.0, 0.0)  # log2 contexts of the outermost anchors

    def at(self, context: float) -> float:
        if self.slope == 0.0:
            return self.delta
        lo, hi = self.span
        x = min(max(math.log2(max(context, 1.0)), lo), hi)
        return self.delta + self.slope * (x - (lo + hi) / 2.0)

    def describe(self) -> str:
        if self.slope == 0.0:
            return f"δ {self.delta:+.2f}"
        lo, hi = (round(2.0 ** v) for v in self.span)
        return f"δ {self.delta:+.2f} {self.slope:+.3f} per doubling over contexts {lo}..{hi}"


@dataclass(frozen=True)
class _AnchorTarget:
    """One anchor, evaluated on the shape set: its context nodes' mixture components."""

    anchor: Anchor
    nodes: tuple[_Node, ...]
    contexts: tuple[int, ...]  # the context of each node
    note: str = ""  # how an anchor field the shape set lacks was evaluated
    trend_sd: float = 0.0  # the shape's context-trend sd (logit) over the nodes, their mean

    def deltas(self, shift: ContextShift) -> list[float]:
        return [shift.at(c) for c in self.contexts]

    def length(self, shift: ContextShift) -> float:
        """Mean acceptance length (bonus included) over the nodes, shifted."""
        return 1.0 + float(np.sum(nodes_rates(self.nodes, self.anchor.gamma,
                                              self.deltas(shift))))

    def residuals(self, shift: ContextShift) -> np.ndarray:
        a = self.anchor
        rates = nodes_rates(self.nodes, a.gamma, self.deltas(shift))
        res = [(1.0 + float(rates.sum()) - a.mean_acceptance_length) / a.mean_acceptance_length]
        if a.per_position_rates is not None:
            res += list((rates - np.asarray(a.per_position_rates)) / a.mean_acceptance_length)
        return np.asarray(res)


@dataclass(frozen=True)
class MethodShift:
    """The fitted level shift of one method."""

    method: str
    delta: float  # joint fit over all the method's anchors (at their middle context)
    by_workload: dict[str, float]  # per anchored workload, when anchors name two or more
    anchors: tuple[Anchor, ...]
    shape_lengths: tuple[float, ...]  # the shape set's mean acceptance length at each anchor
    fitted_lengths: tuple[float, ...]  # after the shift (by_workload's δ where it has one)
    notes: tuple[str, ...] = ()
    trend_sds: tuple[float, ...] = ()  # per anchor: `_AnchorTarget.trend_sd`
    # The context-following shifts ("" the joint one), where the anchors span contexts
    in_context: dict[str, ContextShift] = dataclasses.field(default_factory=dict)

    def anchors_for(self, workload: str | None) -> tuple[int, ...]:
        """Indices of the anchors whose fit set `shift_for(workload)`."""
        if workload is not None and workload in self.by_workload:
            return tuple(i for i, a in enumerate(self.anchors) if a.workload == workload)
        return tuple(range(len(self.anchors)))

    def shift_for(self, workload: str | None) -> ContextShift:
        key = workload if workload is not None and workload in self.by_workload else ""
        return self.in_context.get(key, ContextShift(self.by_workload.get(key, self.delta)))

    def delta_for(self, workload: str | None, context: float | None = None) -> float:
        shift = self.shift_for(workload)
        return shift.delta if context is None else shift.at(context)


def anchored_span(targets: Sequence[_AnchorTarget]) -> tuple[float, float] | None:
    """log2 of the lowest and highest anchor context (each range's geometric middle), when
    they are CONTEXT_SLOPE_RATIO or more apart; else None (one δ)."""
    mids = [0.5 * (math.log2(max(t.anchor.context[0], 1)) + math.log2(max(t.anchor.context[1], 1)))
            for t in targets if t.anchor.context is not None]
    if len(mids) < 2 or max(mids) - min(mids) < math.log2(CONTEXT_SLOPE_RATIO):
        return None
    return min(mids), max(mids)


def _fit_shift(targets: Sequence[_AnchorTarget]) -> ContextShift:
    """δ (and its slope in log2 context where the anchors span contexts) from `targets`."""
    from scipy.optimize import least_squares  # only when anchoring: `traces show` skips it

    span = anchored_span(targets)

    def shift(x: np.ndarray) -> ContextShift:
        if span is None:
            return ContextShift(float(x[0]))
        return ContextShift(float(x[0]), float(x[1]), span)

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.concatenate([t.residuals(shift(x)) for t in targets])

    n = 1 if span is None else 2
    fit = least_squares(residuals, x0=np.zeros(n), bounds=(-DELTA_BOUND, DELTA_BOUND),
                        xtol=1e-12, ftol=1e-12, gtol=1e-12)
    return shift(fit.x)


def fit_method(method: str, targets: Sequence[_AnchorTarget]) -> MethodShift:
    """δ of one method from its anchors' targets (module docstring, Fit)."""
    joint = _fit_shift(targets)
    workloads = sorted({t.anchor.workload for t in targets if t.anchor.workload is not None})
    per_wl: dict[str, ContextShift] = {}
    if len(workloads) >= 2:
        per_wl = {w: _fit_shift([t for t in targets if t.anchor.workload == w])
                  for w in workloads}
    in_context = {k: v for k, v in [("", joint), *per_wl.items()] if v.slope != 0.0}
    fitted = tuple(t.length(per_wl.get(t.anchor.workload or "", joint)) for t in targets)
    notes = [t.note for t in targets if t.note]
    errors = [abs(got - t.anchor.mean_acceptance_length) / t.anchor.mean_acceptance_length
              for t, got in zip(targets, fitted)]
    if joint.slope and len(targets) > 2:  # least squares over more anchors than parameters
        notes.append(f"{method}: {len(targets)} anchors fitted by a shift and its slope in "
                     f"context, |error| at most {100 * max(errors):.1f} %")
    else:
        for t, got, err in zip(targets, fitted, errors):
            if err > REACH_TOLERANCE:
                notes.append(f"{method}: anchor {t.anchor.describe()} matched only to "
                             f"{got:.3f} (the shape set cannot reach it with one shift per "
                             "method)")
    return MethodShift(method, joint.delta, {w: v.delta for w, v in per_wl.items()},
                       tuple(t.anchor for t in targets),
                       tuple(t.length(ContextShift(0.0)) for t in targets), fitted,
                       tuple(notes), tuple(t.trend_sd for t in targets), in_context)


def context_nodes(lo: int, hi: int, n: int = N_CONTEXT_NODES) -> list[int]:
    """n contexts at the midpoints of n equal parts of [lo, hi] (one when lo == hi)."""
    if hi <= lo:
        return [max(lo, 1)]
    step = (hi - lo) / n
    return sorted({max(1, round(lo + (k + 0.5) * step)) for k in range(n)})


# ---------------------------------------------------------------------------------- model
def far_reasons(anchor: Anchor, gamma: int, sparsity: float, context: int,
                workload: str | None, temperature: float) -> list[str]:
    """Why (γ, s, C, workload, T) is not near `anchor` ([] = near)."""
    out = []
    if anchor.workload is not None and workload != anchor.workload:
        out.append(f"workload {workload or 'all'} vs {anchor.workload}")
    if anchor.temperature is not None and abs(temperature - anchor.temperature) > TEMPERATURE_NEAR:
        out.append(f"temperature {temperature:g} vs {anchor.temperature:g}")
    if abs(gamma - anchor.gamma) > GAMMA_NEAR:
        out.append(f"γ {gamma} vs {anchor.gamma}")
    if anchor.sparsity is not None and max(sparsity / anchor.sparsity,
                                           anchor.sparsity / sparsity) > SPARSITY_RATIO:
        out.append(f"sparsity {sparsity:g} vs {anchor.sparsity:g}")
    if anchor.context is not None:
        lo, hi = anchor_span(anchor)
        if context < lo / CONTEXT_RATIO or context > hi * CONTEXT_RATIO:
            out.append(f"context {context} vs {lo}..{hi}")
    return out


def anchor_span(anchor: Anchor) -> tuple[int, int]:
    """The contexts an anchor's counts cover: its prompts' range, its top raised by the
    tokens each request generated (`output_len`: the counts pool whole generations, whose
    running context grows from the prompt)."""
    assert anchor.context is not None
    lo, hi = anchor.context
    return lo, hi + (anchor.output_len or 0)


def _octaves_beyond(ratio: float, near: float) -> float:
    """Octaves of `ratio` (≥ 1) past `near`."""
    return max(0.0, math.log2(max(ratio, 1.0)) - math.log2(near))


def transfer_axes(anchor: Anchor, gamma: int, sparsity: float, context: int,
                  workload: str | None, temperature: float,
                  sds: TransferSd = TRANSFER_SD) -> dict[str, float]:
    """{axis: logit sd} of the shape-transfer uncertainty of (γ, s, C, workload, T) carried
    from `anchor` (TRANSFER_AXES; module docstring, Uncertainty). γ adds none: the shift
    moves every draft position alike."""
    del gamma
    out = dict.fromkeys(TRANSFER_AXES, 0.0)  # `model`: the anchored model's (`anchor_model`)
    out["anchor"] = sds.near
    if anchor.workload is not None and workload != anchor.workload:
        out["workload"] = sds.workload
    if anchor.temperature is not None and abs(temperature - anchor.temperature) > TEMPERATURE_NEAR:
        out["temperature"] = sds.temperature
    if anchor.sparsity is not None and sparsity > 0:
        ratio = max(sparsity / anchor.sparsity, anchor.sparsity / sparsity)
        out["sparsity"] = sds.per_sparsity_octave * _octaves_beyond(ratio, SPARSITY_RATIO)
    if anchor.context is not None:
        lo, hi = anchor_span(anchor)
        ratio = max(max(lo, 1) / max(context, 1), context / max(hi, 1), 1.0)
        out["context"] = sds.per_context_octave * _octaves_beyond(ratio, CONTEXT_RATIO)
    return out


def same_trend(anchor: Anchor, workload: str | None, temperature: float) -> bool:
    """Whether a lookup at (workload, T) follows the context trend `anchor` was evaluated on
    (its workload, its temperature or T 0 where it names none)."""
    anchored_t = anchor.temperature if anchor.temperature is not None else 0.0
    return anchor.workload == workload and abs(temperature - anchored_t) <= TEMPERATURE_NEAR


def _context_distance(anchor: Anchor, context: int) -> float:
    """Octaves from `context` to the anchor's span (0 inside it, or without a context)."""
    if anchor.context is None:
        return 0.0
    lo, hi = anchor_span(anchor)
    return max(math.log2(max(lo, 1) / max(context, 1)), math.log2(max(context, 1) / max(hi, 1)),
               0.0)


def trend_reference(shift: MethodShift, context: int, workload: str | None,
                    temperature: float) -> tuple[Anchor, float] | None:
    """The anchor whose fit took up this lookup's context-trend error, with the trend's sd
    (logit) over its contexts: among the anchors that set the lookup's δ, all on its trend
    (`same_trend`), the nearest in context. None where one of them is on another trend
    (another trend's error is not this one's) or the trend's sd there is 0."""
    used = shift.anchors_for(workload)
    if not all(same_trend(shift.anchors[i], workload, temperature) for i in used):
        return None
    i = min(used, key=lambda k: _context_distance(shift.anchors[k], context))
    return (shift.anchors[i], shift.trend_sds[i]) if shift.trend_sds[i] > 0.0 else None


def relative_to_anchor(dist: AcceptanceDist, anchor: Anchor, anchor_sd: float
                       ) -> AcceptanceDist:
    """`dist`'s context-trend sd counted from the anchor's. A trend's error is its slope's
    error times the distance followed, one error for every context; the anchor's δ was fitted
    to counts the shape reached along the same trend, so it took up the error there, and what
    is left at this lookup is the difference (signed: a request's stages on both sides of the
    anchor's distance cancel, `RunningLengthDist.of`)."""
    residual = dist.context_trend_sd_logit - anchor_sd
    dist.context_trend_sd_pct = shifted_dist_sd_pct(dist, abs(residual))
    dist.context_trend_sign = -1.0 if residual < 0.0 else 1.0
    span = "" if anchor.context is None else " {}..{}".format(*anchor_span(anchor))
    dist.extrapolated.append(
        f"context trend's sd counted from the anchor {anchor.describe()}, whose δ took up the "
        f"trend's error over its contexts{span} (sd {anchor_sd:.2f} logit there)")
    return dist


def transfer_sd(axes: Mapping[str, float]) -> float:
    """The axes' logit sds combined (in quadrature: independent)."""
    return math.sqrt(sum(v * v for v in axes.values()))


class AnchoredAcceptance(AcceptanceModel):
    """An AcceptanceModel whose lookups are shifted to the anchors' level (module docstring).

    It shares the shape model's fitted cells (no refit) and answers everything else as the
    shape does; with no anchor sets it is the shape model itself, with names for the outputs.
    """

    def __init__(self, shape: AcceptanceModel, shape_name: str,
                 anchor_sets: Sequence[AnchorSet] = (),
                 shifts: Mapping[str, MethodShift] | None = None,
                 transfer: TransferSd = TRANSFER_SD, anchor_model: str | None = None,
                 shape_model: str | None = None) -> None:
        """shifts: the `shifts` an earlier model of the same shape and anchors fitted (a
        cached fit); None fits them. transfer: the shape-transfer uncertainty's sds.
        anchor_model / shape_model: the model the anchors / the shape set were measured on
        when it is not the predicted one (None when it is): an anchored method's lookups add
        the `model` axis for the first, an unanchored method's for the second."""
        if isinstance(shape, AnchoredAcceptance):
            raise UserInputError("an anchored model cannot be a shape set", where="anchors",
                                 fix="pass the plain AcceptanceModel of the shape set")
        self.__dict__.update(shape.__dict__)  # the shape's cells, smoother, caches
        self.shape_name = shape_name
        self.anchor_sets = tuple(anchor_sets)
        self.transfer = transfer
        self.anchor_model = anchor_model
        self.shape_model = shape_model
        self.shifts: dict[str, MethodShift] = {}
        if shifts is not None:
            self.shifts = dict(shifts)
            return
        anchors = [a for s in self.anchor_sets for a in s.anchors]
        for method in sorted({a.method for a in anchors}):
            targets = [self._target(a) for a in anchors if a.method == method]
            self.shifts[method] = fit_method(method, targets)

    # -- naming --
    @property
    def anchors_name(self) -> str:
        return "+".join(s.name() for s in self.anchor_sets)

    def source_for(self, method: str) -> str:
        """The `acceptance_source` of a row of `method` ('' for vanilla, which drafts nothing)."""
        if method == VANILLA:
            return ""
        if not self.anchor_sets:
            return f"trace set {self.shape_name}"
        if method in self.shifts:
            return f"anchors {self.anchors_name} on shape {self.shape_name}"
        return f"trace set {self.shape_name} (no {method} anchor in {self.anchors_name})"

    def notes(self) -> list[str]:
        """What the anchors did, one line per anchor set plus fit warnings."""
        if not self.anchor_sets:
            return []
        out = []
        for s in self.anchor_sets:
            what = f"model {s.model}, " if s.model else ""
            out.append(f"acceptance anchors {s.name()} ({what}{len(s.anchors)} anchors; "
                       f"source: {s.source or 'not given'})")
        shifts = ", ".join(
            f"{m} {sh.shift_for(None).describe()} (" + ", ".join(
                f"γ{a.gamma} {b:.2f} → {f:.2f}, anchor {a.mean_acceptance_length:.2f}"
                for a, b, f in zip(sh.anchors, sh.shape_lengths, sh.fitted_lengths)) + ")"
            for m, sh in self.shifts.items())
        out.append(f"acceptance level set by the anchors on the shape of {self.shape_name}: "
                   f"logit shift δ of the conditional per-position acceptance, mean "
                   f"acceptance length shape → anchored: {shifts}")
        for sh in self.shifts.values():
            out.extend(sh.notes)
        return out

    # -- fit --
    def _nodes(self, method: str, gamma: int, sparsity: float | None,
               context: tuple[int, int] | None, workload: str | None,
               temperature: float | None, output_len: int | None = None
               ) -> tuple[list[_Node], list[int], str, float]:
        """The shape's unshifted components at the context nodes of a configuration given as
        an anchor gives it (empty fields: module docstring), and a note on a workload the
        shape set lacks. With `output_len` each node is a request of that prompt generating
        that many tokens, its acceptance following its running context as a prediction's
        does (`acceptance_dist.running_stages`). Also the nodes' contexts, and the mean of
        their context-trend sds (logit)."""
        cov = self.coverage()
        workloads = [str(w) for w in cov["workloads"]]  # type: ignore[attr-defined]
        note = ""
        if workload is not None and workload not in workloads:
            note = (f"workload {workload!r} is not in {self.shape_name} "
                    f"({', '.join(workloads)}): fitted on its pooled workloads")
            workload = None
        span = context if context is not None else self.traced_contexts(method, workload)
        nodes, trend_sds = [], []
        s = sparsity if sparsity is not None else DEFAULT_SPARSITY
        t = temperature if temperature is not None else 0.0
        contexts = context_nodes(int(span[0]), int(span[1]))
        for c in contexts:
            if output_len is None:
                dist = AcceptanceModel.lookup(self, method, gamma, s, c, workload, t)
            else:
                stages = running_stages(c, output_len)
                dists = [AcceptanceModel.lookup(self, method, gamma, s, ctx, workload, t,
                                                output_len=output_len) for _, ctx in stages]
                dist = dists[0] if len(dists) == 1 else RunningLengthDist.of(
                    [g for g, _ in stages], dists, output_len, [ctx for _, ctx in stages])
            nodes.append(tuple(source_parts(dist)))
            trend_sds.append(dist.context_trend_sd_logit)
        return nodes, contexts, note, float(np.mean(trend_sds))

    def _target(self, a: Anchor) -> _AnchorTarget:
        nodes, contexts, note, trend_sd = self._nodes(a.method, a.gamma, a.sparsity,
                                                      a.context, a.workload, a.temperature,
                                                      a.output_len)
        return _AnchorTarget(a, tuple(nodes), tuple(contexts),
                             f"anchor {a.describe()}: {note}" if note else "", trend_sd)

    def range_length(self, method: str, gamma: int, sparsity: float | None,
                     context: tuple[int, int] | None, workload: str | None = None,
                     temperature: float | None = None) -> float:
        """The anchored mean acceptance length over a context range, evaluated as an anchor
        over that range is fitted (the number to compare with a vLLM count over it)."""
        return self.range_length_fn(method, gamma, sparsity, context, workload, temperature)(0.0)

    def range_length_fn(self, method: str, gamma: int, sparsity: float | None,
                        context: tuple[int, int] | None, workload: str | None = None,
                        temperature: float | None = None) -> Callable[[float], float]:
        """`range_length` as a function of a further logit shift x of the level (x = 0: the
        anchored length), the shape looked up once."""
        nodes, contexts, _, _ = self._nodes(method, gamma, sparsity, context, workload,
                                            temperature)
        shift = self.shifts.get(method)
        deltas = np.array([0.0 if shift is None else shift.delta_for(workload, c)
                           for c in contexts])

        def length(x: float) -> float:
            return 1.0 + float(np.sum(nodes_rates(nodes, gamma, list(deltas + x))))

        return length

    def transfer_axes_for(self, method: str, gamma: int, sparsity: float, context: int,
                          workload: str | None, temperature: float) -> dict[str, float]:
        """`transfer_axes` from the method's nearest anchor (the smallest combined sd); {}
        for a method without anchors."""
        shift = self.shifts.get(method)
        if shift is None:
            return {}
        return min((transfer_axes(a, gamma, sparsity, context, workload, temperature,
                                  self.transfer) for a in shift.anchors), key=transfer_sd)

    def _model_sd(self, model: str | None) -> float:
        return self.transfer.model if model is not None else 0.0

    @staticmethod
    def _with_transfer(dist: AcceptanceDist, axes: Mapping[str, float]) -> AcceptanceDist:
        """`dist` with the shape-transfer term of `axes` (logit sds) as a relative sd of its
        mean acceptance length, and each axis's share."""
        sd = transfer_sd(axes)
        if sd <= 0.0:
            return dist
        dist.transfer_sd_pct = shifted_dist_sd_pct(dist, sd)
        dist.transfer_axes_pct = {k: dist.transfer_sd_pct * v * v / (sd * sd)
                                  for k, v in axes.items() if v > 0.0}
        return dist

    # -- lookup --
    def lookup(self, method: str, gamma: int, sparsity: float, context: int,
               workload: str | None = None, temperature: float = 0.0,
               output_len: int | None = None) -> AcceptanceDist:
        """The shape's distribution, shifted by the method's δ and marked where the
        configuration is far from every anchor (module docstring)."""
        dist = super().lookup(method, gamma, sparsity, context, workload, temperature,
                              output_len=output_len)
        if method == VANILLA:
            return dist
        shift = self.shifts.get(method)
        if shift is None:
            if self.anchor_sets:
                dist.extrapolated.append(f"{method} has no acceptance anchor in "
                                         f"{self.anchors_name}: the level is "
                                         f"{self.shape_name}'s")
            return self._with_transfer(dist, {"model": self._model_sd(self.shape_model)})
        out = shift_dist(dist, shift.delta_for(workload, context))
        reference = trend_reference(shift, context, workload, temperature)
        if reference is not None:
            out = relative_to_anchor(out, *reference)
        axes = self.transfer_axes_for(method, gamma, sparsity, context, workload, temperature)
        axes["model"] = self._model_sd(self.anchor_model)
        out = self._with_transfer(out, axes)
        far = [far_reasons(a, gamma, sparsity, context, workload, temperature)
               for a in shift.anchors]
        if all(far):
            nearest = min(range(len(far)), key=lambda i: len(far[i]))
            out.extrapolated.append(
                f"{method} far from every anchor of {self.anchors_name}: nearest "
                f"({shift.anchors[nearest].describe()}) differs in {', '.join(far[nearest])}")
        return out

