"""Prediction intervals: how far a measured throughput may fall from the predicted one.

`throughput_ci_low/high` (predict) and `ci_low/high` (validate) are the simulation's own
Monte-Carlo confidence interval: the spread over replications of the simulator, nothing
else. The prediction interval `pi_low/pi_high` adds the model's uncertainty, as relative
standard deviations (%) combined in quadrature:

- latency-fit: each phase's leave-one-out |error| of the latency fit, its empirical 95th
  percentile (`LatencyModel.loo_quantile_pct`; LOO_QUANTILE) / 1.96 as a standard deviation,
  weighted by the phase's share of the iteration;
- acceptance-sampling: the acceptance model's mean is the mean of the traced runs it draws
  on; their spread (prompt to prompt, at the scenario's γ) over √runs; a cell of one run (one
  prompt: competitive's buckets are a problem each) takes the prompt-to-prompt spread of its
  group's other runs (`DrawSource.run_spread`), since its one prompt's mean stands for
  prompts it never saw, and a cell of 2-3 runs the larger of its own and that (`run_sd`:
  an sd of 1-2 degrees of freedom may be a sixth of the true one). A validation row adds
  its own run's sampling error (`acceptance_se_pct`: a run of few prompts measures those),
  widened by Student's t for the prompts it was measured on (`validate.results.run_error_pct`);
- extrapolation-distance: grows with how far the scenario lies beyond what was measured —
  EXTRAP_PCT_PER_OCTAVE per octave of batch, KV length or verify query rows past the latency
  set's points, WHAT_IF_PCT_PER_OCTAVE per octave from the measured GPU to a what-if's
  (--gpu, --gpu-spec: axis 'gpu'), EXTRAP_PCT_PER_GAMMA per γ past the traced γ,
  EXTRAP_PCT_PER_SPARSITY_OCTAVE
  per octave of sparsity outside the traced ones, and beyond the traced contexts the
  context trend's own sd (`AcceptanceDist.context_trend_sd_pct`, `sim.context_trend`), and
  where an anchored acceptance carries a shape set to anchors the scenario is far from, the
  shape-transfer term (`AcceptanceDist.transfer_sd_pct`, `sim.anchored`), its axes named
  'anchors: workload' and so on (distances add);
- simulation: the Monte-Carlo CI's half-width / 1.96;
- host-protocol (one-sided: slower only), for a latency set whose grid timed sample and select
  after verify alone (`LatencyModel.host_phases_in_loop` False: calibrate without
  --verify-after-draft): the decoding loop meets these host-bound phases after the γ draft
  steps' long device wait, and there they cost more: on SmolLM2, timed both ways, up to
  about the phases' own time again (calibrate.measure_latency, `_verify_samples`), so the
  term is HOST_PROTOCOL_SHARE × their predicted share of the
  iteration, taken as a 95 % bound;
- sampling-mode (one-sided, `pi_sampling_mode_pct`), for a run whose sampling mode (greedy at
  temperature 0, else sampled) the latency set did not time (`LatencyModel.prices_mode`
  False: a set calibrated at one temperature, priced in that one): the sampling phases
  (schema.SAMPLING_PHASES) cost GREEDY_OVER_SAMPLED of their sampled time when greedy, at
  most GREEDY_SAVED_MS_PER_CALL less per call (the skipped filter and draw: launches and
  small kernels, a fixed cost per call that a small model's host-bound step shows as a large
  share and a large model's forward does not), so a greedy run priced as sampled may be
  faster (> 0: pi_high raised) and a sampled run priced as greedy slower (< 0: pi_low
  lowered) by that time over the iteration's: the median shift measured, taken as the bound
  and combined in quadrature with the symmetric half-width, like host-protocol (rows whose
  acceptance is also off can fall outside: docs/RESULTS.md). A set that timed both modes
  prices each run in its own and has no such term.

`pi_transfer_pct` is the shape-transfer part of the acceptance extrapolation and `pi_low_shape`
the low end without it and without the GPU what-if's term: what the interval would be were the
anchors' model's acceptance shaped like the shape set's and the target GPU the measured one
(tune ranks by it: each term moves every configuration of a method together, vanilla's too for
the GPU, so it cannot tell them apart; `sim.tune_rules.lower_score`).

pi = predicted × (1 ± 1.96 σ / 100), a 95 % interval, its low end then lowered by the
host-protocol term (in quadrature with the symmetric half-width), either end moved likewise by
the sampling-mode term, then clipped into [every draft rejected, every draft accepted]: at
most `physical_bound` (γ + 1 tokens per iteration), at least `rejected_floor` (1 token per
iteration, lowered by the interval's latency, simulation, host-protocol and sampling-mode
terms, which acceptance does not bound; never below 0), so that an acceptance known to lie in
[1, γ + 1] gives a throughput inside the interval however far it is extrapolated;
`pi_dominant` names the largest part, and when that is the extrapolation distance the axis
whose term is largest: 'extrapolation-distance (context)' (axes: batch, kv_length, n_query,
gamma, sparsity, context, and the anchors' transfer axes).
The per-octave rates are the error growth seen in the range hold-outs of the packaged sets
(`benchmarks/extrapolation.py`, docs/RESULTS.md: the error of rows beyond a cut range grows
per octave of batch, context and sparsity past the traced ones); a scenario inside every
measured range has no extrapolation term.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vegas_sim.methods import VANILLA, drafts, query_rows
from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.acceptance_dist import AcceptanceDist
from vegas_sim.sim.context_trend import Z95
from vegas_sim.sim.latency import GREEDY, LatencyModel, sampling_mode
from vegas_sim.traces.schema import SAMPLING_PHASES

# The latency-fit part takes each phase's empirical LOO quantile, not a normal sd from the
# median (× 1.4826): the LOO errors are heavier-tailed than a normal's (q95 / median 2.2-6.5 over the packaged sets'
# groups against 2.9; draft_step and verify, most of an iteration, 3.0-6.5).
LOO_QUANTILE = 0.95
# A cell's own sd of its runs' lengths is used from this many runs (3 degrees of freedom); with
# fewer, a sample sd of 1-2 degrees of freedom can be several times too small, so the
# group's pooled spread bounds it from below (`run_sd`)
OWN_SPREAD_MIN_RUNS = 4
EXTRAP_PCT_PER_OCTAVE = 4.0
EXTRAP_PCT_PER_GAMMA = 1.5
EXTRAP_PCT_PER_SPARSITY_OCTAVE = 8.0
# A GPU what-if's error per octave between the measured and the target GPU
# (`LatencyModel.what_if_octaves`): the 95th percentile of the H200 set's misses priced as an
# H100 SXM, on rows run on an H100, over 1.96 and the 0.52 octave between them
# (docs/RESULTS.md, "Three models on an H100").
WHAT_IF_PCT_PER_OCTAVE = 13.0
# The host-protocol term's bound, in units of the predicted sample + select time (see above).
HOST_PROTOCOL_SHARE = 1.0
HOST_PROTOCOL_PHASES = ("sample", "select")
HOST_PROTOCOL = "host-protocol"
# A sampling phase's greedy ms over its sampled ms, and the ms a greedy call saves (the
# sampling-mode term): measured by benchmarks/sampling_mode.py on the SmolLM2 held-out
# validation of docs/RESULTS.md (greedy and sampled rows against one grid timed sampled),
# its figures there.
GREEDY_OVER_SAMPLED = {"draft_step": 0.785, "sample": 0.671}
GREEDY_SAVED_MS_PER_CALL = {"draft_step": 0.267, "sample": 0.368}
SAMPLING_MODE = "sampling-mode"
PARTS = ("latency-fit", "acceptance-sampling", "extrapolation-distance", "simulation")
COLUMNS = ("pi_low", "pi_high", "pi_dominant", "pi_latency_fit_pct", "pi_acceptance_pct",
           "pi_extrapolation_latency_pct", "pi_extrapolation_acceptance_pct",
           "pi_simulation_pct", "pi_host_protocol_pct", "pi_sampling_mode_pct",
           "pi_transfer_pct", "pi_low_shape")


def latency_fit_pct(latency: LatencyModel, method: str, breakdown: dict[str, float]) -> float:
    """Relative sd (%) of the iteration time from the phases' leave-one-out errors: each
    phase's LOO_QUANTILE of |error| / Z95 (its 95 % half-width as an sd), weighted by its
    share of the iteration, the phases in quadrature."""
    total = sum(breakdown.values())
    if total <= 0:
        return 0.0
    var = 0.0
    for phase, ms in breakdown.items():
        if ms <= 0 or not latency.measures(phase, method):  # e.g. a roofline prefill
            continue
        loo = latency.loo_quantile_pct(phase, method, LOO_QUANTILE)
        if math.isfinite(loo):
            var += (ms / total * loo / Z95) ** 2
    return math.sqrt(var)


def host_protocol_pct(latency: LatencyModel, method: str, breakdown: dict[str, float]
                      ) -> float:
    """The one-sided host-protocol bound (%, 95 %) of a speculative iteration's time: 0 when
    the set timed sample and select in whole iterations (or for vanilla, whose grid steps
    chain decodes as the loop does)."""
    total = sum(breakdown.values())
    if latency.host_phases_in_loop or not drafts(method) or total <= 0:
        return 0.0
    return 100.0 * HOST_PROTOCOL_SHARE * sum(
        breakdown.get(p, 0.0) for p in HOST_PROTOCOL_PHASES) / total


def sampling_mode_pct(latency: LatencyModel, temperature: float, gamma: int,
                      breakdown: dict[str, float]) -> float:
    """The signed one-sided sampling-mode bound (%) on a run's throughput: > 0 how much
    faster a greedy run priced as sampled may be, < 0 how much slower a sampled run priced as
    greedy may be; 0 when the set timed the run's mode (see the module docstring). `gamma`:
    draft steps per iteration (0 for vanilla)."""
    total = sum(breakdown.values())
    if latency.prices_mode(temperature) or total <= 0:
        return 0.0
    greedy = sampling_mode(temperature) == GREEDY
    moved = 0.0
    for phase in SAMPLING_PHASES:
        ratio, ms = GREEDY_OVER_SAMPLED[phase], breakdown.get(phase, 0.0)
        calls = gamma if phase == "draft_step" else 1
        gap = ms * (1.0 - ratio) if greedy else ms * (1.0 / ratio - 1.0)
        moved += min(gap, GREEDY_SAVED_MS_PER_CALL[phase] * calls) if ms > 0 else 0.0
    if greedy:  # priced sampled: the phases shrink
        return 100.0 * moved / max(total - moved, 1e-12)
    return -100.0 * moved / (total + moved)


def _run_lengths(acc: np.ndarray, run_start: np.ndarray, gamma: int) -> np.ndarray:
    """[runs] each traced run's acceptance length at γ (1 + mean of min(accepted, γ))."""
    starts = np.unique(run_start)
    cut = np.minimum(acc, gamma).astype(np.float64)
    lengths = np.diff(np.append(starts, len(cut)))
    return np.asarray(1.0 + np.add.reduceat(cut, starts) / lengths)


def run_sd(lengths: np.ndarray, group_spread: float) -> float:
    """The sd of one run's acceptance length in a cell of these runs' `lengths`: their own
    sd from OWN_SPREAD_MIN_RUNS runs on; below, the larger of it and the group's pooled
    relative spread (`DrawSource.run_spread`) × their mean (one run: the group's alone)."""
    mean = float(lengths.mean())
    if len(lengths) < 2:
        return group_spread * mean
    own = float(lengths.std(ddof=1))
    return own if len(lengths) >= OWN_SPREAD_MIN_RUNS else max(own, group_spread * mean)


def acceptance_sampling_pct(dist: AcceptanceDist | None) -> float:
    """Relative standard error (%) of the acceptance model's mean length: per mixture
    component, the traced runs' spread / √runs, weighted like the mixture."""
    if dist is None or dist.gamma == 0 or not dist.sources:
        return 0.0
    var, mean = 0.0, 0.0
    for w, src in zip(dist.weights, dist.sources):
        if src.cell is None or len(src.cell.acc) == 0:  # all-accepted: no sampling error
            mean += w * (1.0 + dist.gamma)
            continue
        x = _run_lengths(src.cell.acc, src.cell.run_start, dist.gamma)
        mean += w * float(x.mean())
        var += (w * run_sd(x, src.run_spread) / math.sqrt(len(x))) ** 2
    return 100.0 * math.sqrt(var) / mean if mean > 0 else 0.0


def latency_extrapolation_axes(latency: LatencyModel, batch: int, longest_context: int,
                               n_query: int) -> dict[str, float]:
    """{axis: % sd} of the latency extrapolation: EXTRAP_PCT_PER_OCTAVE per octave of batch,
    KV length ('kv_length') and verify query rows past the latency set's points, and
    WHAT_IF_PCT_PER_OCTAVE per octave from the measured GPU to a what-if's ('gpu')."""
    octaves = latency.octaves_outside(batch, longest_context, n_query)
    names = {"batch": "batch", "context": "kv_length", "n_query": "n_query"}
    return {**{names.get(k, k): EXTRAP_PCT_PER_OCTAVE * v for k, v in octaves.items()},
            "gpu": WHAT_IF_PCT_PER_OCTAVE * latency.what_if_octaves()}


def acceptance_extrapolation_axes(acceptance: AcceptanceModel, method: str, gamma: int,
                                  sparsity: float) -> dict[str, float]:
    """{axis: % sd} of the acceptance extrapolation on the γ and sparsity axes: γ past the
    method's traced γ, octaves of sparsity outside its traced ones (the context axis is the
    context trend's own sd, `AcceptanceDist.context_trend_sd_pct`)."""
    if not drafts(method):
        return {"gamma": 0.0, "sparsity": 0.0}
    cov = acceptance.coverage()["per_method"]
    traced: dict[str, list[float]] = cov.get(method, {})  # type: ignore[attr-defined]
    gammas, sparsities = traced.get("gamma", []), traced.get("sparsity", [])
    out = {"gamma": 0.0, "sparsity": 0.0}
    if gammas:
        out["gamma"] = EXTRAP_PCT_PER_GAMMA * max(0.0, gamma - max(gammas))
    if sparsities:
        lo, hi = min(sparsities), max(sparsities)
        outside = math.log2(sparsity / hi) if sparsity > hi else (
            math.log2(lo / sparsity) if sparsity < lo else 0.0)
        out["sparsity"] = EXTRAP_PCT_PER_SPARSITY_OCTAVE * outside
    return out


def transfer_axes_of(dist: AcceptanceDist | None) -> dict[str, float]:
    """{'anchors: <axis>': % sd} of an anchored acceptance's shape-transfer term
    (`AcceptanceDist.transfer_axes_pct`, `sim.anchored`); {} without anchors."""
    if dist is None:
        return {}
    return {f"anchors: {k}": v for k, v in dist.transfer_axes_pct.items()}


def physical_bound(row: dict[str, Any]) -> float:
    """The most a speculative row's throughput can be: every draft accepted, acceptance length
    γ + 1 in the same iterations (throughput × (γ + 1) / its acceptance length); inf for
    vanilla and rows without an acceptance length (no acceptance bound applies)."""
    gamma = int(row.get("gamma", 0) or 0)
    length = float(row.get("acceptance_length", math.nan) or math.nan)
    if row.get("method") == VANILLA or gamma <= 0 or not (length >= 1.0):
        return math.inf
    return float(row["throughput_tok_s"]) * (gamma + 1.0) / length


def rejected_floor(row: dict[str, Any], out: dict[str, Any]) -> float:
    """The least a speculative row's throughput can be for its acceptance alone: every draft
    rejected, acceptance length 1 in the same iterations (throughput / its acceptance length),
    lowered by the interval's other parts (`out`'s latency, simulation, host-protocol and
    sampling-mode terms: the iterations may be slower too); 0 for vanilla and rows without an
    acceptance length."""
    length = float(row.get("acceptance_length", math.nan) or math.nan)
    if row.get("method") == VANILLA or not (length >= 1.0):
        return 0.0
    floor = interval(float(row["throughput_tok_s"]) / length, parts_of(out, acceptance=False),
                     out["pi_host_protocol_pct"], out["pi_sampling_mode_pct"])[0]
    return max(0.0, floor)


def bounded(lo: float, hi: float, lower: float, upper: float) -> tuple[float, float]:
    """An interval clipped into [lower, upper]: a throughput never below every draft rejected
    (`rejected_floor`, >= 0) nor above every draft accepted (`physical_bound`)."""
    return max(lower, lo), min(hi, upper)


def dominant_axis(dominant: str, axes: dict[str, float]) -> str:
    """`dominant` with the axis named when the extrapolation distance dominates:
    'extrapolation-distance (context)'."""
    if dominant != "extrapolation-distance" or not axes or max(axes.values()) <= 0.0:
        return dominant
    return f"{dominant} ({max(axes, key=lambda k: axes[k])})"


def simulation_pct(mean: float, low: float, high: float) -> float:
    """The Monte-Carlo CI's half-width / 1.96, % of the mean."""
    if not (mean > 0 and math.isfinite(low) and math.isfinite(high)):
        return 0.0
    return 100.0 * (high - low) / 2.0 / Z95 / mean


def interval(predicted: float, parts: dict[str, float], slower_pct: float = 0.0,
             mode_pct: float = 0.0) -> tuple[float, float, str]:
    """(pi_low, pi_high, the dominant part) from the parts' relative sd (%), a one-sided
    95 % bound `slower_pct` (%) on how much lower the throughput may be (host-protocol) and
    the signed one-sided sampling-mode bound `mode_pct` (`sampling_mode_pct`)."""
    sd = math.sqrt(sum(v * v for v in parts.values() if math.isfinite(v)))
    half = Z95 * sd / 100.0 * predicted
    slower = slower_pct / 100.0 * predicted if math.isfinite(slower_pct) else 0.0
    mode = mode_pct / 100.0 * predicted if math.isfinite(mode_pct) else 0.0
    low = math.hypot(half, slower, min(mode, 0.0))
    high = math.hypot(half, max(mode, 0.0))
    sized = {**parts, HOST_PROTOCOL: slower_pct / Z95 if math.isfinite(slower_pct) else 0.0}
    if mode:
        sized[SAMPLING_MODE] = abs(mode_pct) / Z95
    dominant = max(sized, key=lambda k: sized[k] if math.isfinite(sized[k]) else -1.0)
    return predicted - low, predicted + high, dominant if low > 0 or high > 0 else ""


def parts_of(row: dict[str, Any], *, acceptance: bool = True, simulation: bool = True,
             extra_acceptance_pct: float = 0.0) -> dict[str, float]:
    """The four parts (PARTS) of a row carrying the pi_*_pct columns. `acceptance=False`
    (acceptance replayed): no acceptance term and no acceptance extrapolation;
    `simulation=False`: no Monte-Carlo term; `extra_acceptance_pct`: a run's own sampling
    error, added in quadrature to the model's."""
    acc = math.hypot(float(row["pi_acceptance_pct"]), extra_acceptance_pct) if acceptance else 0.0
    ext = float(row["pi_extrapolation_latency_pct"]) + (
        float(row["pi_extrapolation_acceptance_pct"]) if acceptance else 0.0)
    return {"latency-fit": float(row["pi_latency_fit_pct"]), "acceptance-sampling": acc,
            "extrapolation-distance": ext,
            "simulation": float(row["pi_simulation_pct"]) if simulation else 0.0}


def interval_columns(row: dict[str, Any], latency: LatencyModel, acceptance: AcceptanceModel,
                     dist: AcceptanceDist | None, breakdown: dict[str, float]) -> dict[str, Any]:
    """The pi_* columns of one predict row (see the module docstring)."""
    method, gamma = str(row["method"]), int(row["gamma"])
    temperature = float(row.get("temperature") or 0.0)
    n_query = query_rows(method, gamma)
    lat_axes = latency_extrapolation_axes(latency, int(row["batch"]),
                                          int(row["context"]) + int(row["output_len"]), n_query)
    acc_axes = {**acceptance_extrapolation_axes(acceptance, method, gamma,
                                                float(row["sparsity"])),
                "context": dist.context_trend_sd_pct if dist is not None else 0.0,
                **transfer_axes_of(dist)}
    axes = {**lat_axes, **acc_axes}
    transfer = transfer_axes_of(dist)
    out: dict[str, Any] = {
        "pi_latency_fit_pct": latency_fit_pct(latency.for_temperature(temperature), method,
                                              breakdown),
        "pi_acceptance_pct": acceptance_sampling_pct(dist),
        "pi_extrapolation_latency_pct": sum(lat_axes.values()),
        "pi_extrapolation_acceptance_pct": sum(acc_axes.values()),
        "pi_simulation_pct": simulation_pct(float(row["throughput_tok_s"]),
                                            float(row["throughput_ci_low"]),
                                            float(row["throughput_ci_high"])),
        "pi_host_protocol_pct": host_protocol_pct(latency, method, breakdown),
        "pi_sampling_mode_pct": sampling_mode_pct(latency, temperature,
                                                  gamma if drafts(method) else 0, breakdown),
    }
    lo, hi, dominant = interval(float(row["throughput_tok_s"]), parts_of(out),
                                out["pi_host_protocol_pct"], out["pi_sampling_mode_pct"])
    floor = rejected_floor(row, out)
    lo, hi = bounded(lo, hi, floor, physical_bound(row))
    out["pi_transfer_pct"] = sum(transfer.values())
    shape = {**out, "pi_extrapolation_acceptance_pct": sum(acc_axes.values())
             - out["pi_transfer_pct"],
             "pi_extrapolation_latency_pct": sum(lat_axes.values()) - lat_axes["gpu"]}
    lo_shape = interval(float(row["throughput_tok_s"]), parts_of(shape),
                        out["pi_host_protocol_pct"], out["pi_sampling_mode_pct"])[0]
    return {"pi_low": lo, "pi_high": hi, "pi_dominant": dominant_axis(dominant, axes), **out,
            "pi_low_shape": max(floor, lo_shape)}
