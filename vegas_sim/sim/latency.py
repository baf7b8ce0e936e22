"""Latency model: per-phase time of an asynchronous host + GPU pipeline, fitted to latency.parquet.

One call of a phase on a batch of B requests (uniform n_query, per-request kv_read) costs

    t = s + max(h, g),    g = Σ_f c_f · x_f

- g, the GPU work: a non-negative combination of roofline *features*, each in milliseconds on
  the measured GPU (copy bandwidth BW, bf16 matmul rate F from meta.json 'gpu'); a coefficient
  c_f is 1 / efficiency:

    gemm     max(weight_bytes / BW, gemm_flops(B·n_query) / F)   dense layers + LM head
    logits   B·n_query·vocab·4 / BW                       fp32 logits read by sampling
    kv       Σ_b kv_read_b · bytes_per_entry / BW         KV (or Quest page metadata) read
    attn     Σ_b attn_flops(n_query, kv_read_b) / F       QK^T and PV FLOPs
    collect  Σ_b kv_read_b · collect_rows · Hq · L · 2 / BW   bf16 scores written / read
    rank     Σ_b kv_read_b · L · 4 / BW                   fp32 per-layer weights ranked by top-k

  plus KERNEL_FEATURES (sum form only, coefficients bounded by KERNEL_MAX), which the measured
  graphed H200 set needs (each lowers its phases' leave-one-out error):

    tokens   B·n_query · gemm_flops(1) / F      GEMM FLOPs not hidden under the weight stream
    batched  weight_bytes / BW · [B·n_query > 1]  the batched GEMM path vs batch-1 GEMVs
    rows     collect_rows                       per collected score row, per call (vegas-all)

- h, the host floor: the CPU time to issue the phase's kernels (Python + launch overhead of an
  eager runtime, or launch-latency-bound tiny kernels). The host runs ahead of the GPU, so the
  step takes whichever is longer. It may grow with the batch: h = h0 + h_batched·[B·n_query > 1]
  + h_per_token·B·n_query (a per-token term only where no GPU feature of the group is ∝ tokens),
  except in the GRAPHED_PHASES of a set that replays them from CUDA graphs (`graphed`): the
  same launches whatever the batch, so h = h0 there and growth with the batch is GPU work.
- s (the `const` coefficient), a serial fixed cost added on top (launch + sync that does not
  overlap GPU work).

Two forms are fitted per (phase, method) group and one is kept (`mode`):

- "sum": h = 0, s and every c_f fitted by NNLS on relative error — the GPU-bound form (the old
  model: t = const + Σ c_f x_f). Collinear features are dropped by `_identifiable_mask`.
- "max": s = 0, h and c fitted jointly by `scipy.optimize.least_squares` on log error with a
  robust (soft-L1) loss, the max taken exactly. Each log-coefficient is pulled toward a roofline
  PRIOR (`PRIOR_ETA_KV` of the measured copy bandwidth for KV / score / logits bytes,
  `PRIOR_ETA_GEMM` of the measured bf16 rate / copy bandwidth for GEMMs) by a penalty worth
  `PRIOR_WEIGHT` points: points above the host floor (GPU-bound) move it, host-bound points
  cannot. So when no point is GPU-bound, g keeps the roofline prior and still grows with bytes.

Rule: the "sum" form is kept when the max form finds no host-bound point (then h is not
identified and the sum form nests it) or when its in-sample median |log error| is at most
`SUM_MODE_MARGIN` × that of the "max" form (each with its refinements: kernel features,
batch-dependent floor) (a serial fixed cost explains the data clearly better
than a host floor, e.g. synthetic roofline sets or sampling); otherwise "max". On a host-bound
trace set (eager runtime: every step takes the same time whatever B and context) an
unconstrained sum form learns that time as a constant with near-zero noise slopes and
extrapolates flat; the max form extrapolates
along the physics: beyond the grid, once g exceeds h, time grows linearly with KV bytes. The sum
form's GPU coefficients are also bounded below by 1 / ROOFLINE_SLACK (no kernel beats the
measured rates by more than that), so it cannot go flat either; it counts the GPU work as serial
on top of the host time, which some eager phases do (a sync inside verify).

Every coefficient carries a source (see `coefficients()`): FITTED (the GPU-bound points outweigh
the prior: Σ over GPU-bound points of the feature's share of g ≥ PRIOR_WEIGHT), PRIOR (no point
informs it: the roofline prior), or CAPPED (the prior was lowered so the GPU time stays under
the measured host floor: the data give only an upper bound), or BOUND (sum form: held at the
1 / ROOFLINE_SLACK lower bound, the data would have it faster). `host_bound_share()` is the
fraction of measured points where h > g.

Residual by batch. The form misses a shape that the measured sets share (in-sample, vanilla
decode on the H200 runs a little slower than the fit at the smallest and largest batches and
faster in between; draft steps and verify alike). On the measured GPU a prediction is
multiplied by the
group's residual at its batch: exp of the median log(measured / fit) over that batch's measured
points, shrunk toward 0 by its standard error (noisy phases keep ≈ none), linear in log B
between measured batches, fading to none over the octave beyond the measured range (there the
fitted physics alone extrapolates). What-if GPUs and `without_host_overhead` get none: the
residual describes the measured GPU and host. Leave-one-out with it computes the residual
without the left-out point.

Leave-one-out (`loo_errors`) leaves a whole measured (batch, context) point out (all its rows:
the gammas and sparsities measured there share a session), refits and predicts its rows.

Grouping: one fit per (phase, method) because the kernels differ by method (index construction,
number of collected rows, Quest paging). A phase the trace set recorded under method "any"
serves every method lacking its own rows; the method-independent phases (sample, prefill)
fall back further to a fit pooled over all methods. Anything else missing is a TraceSetError:
calibrate that method — except `other` (OPTIONAL_PHASES), which older sets lack.

`what_if` rescales the GPU terms by datasheet ratios and keeps h and s (CPU time);
`without_host_overhead(launch_ms)` replaces them by a per-call launch cost (what a CUDA-graph
engine would see); `with_weight_format` rescales the weight bytes (fp8, mxfp4: a what-if along
the fitted roofline). Mixture-of-experts weight streams and sliding-window layers are in the
features (`latency_features.Physics`). Every GPU feature except gemm/logits is linear in
Σ kv_read, so `IterationCost` (`iteration_cost`) evaluates a whole iteration with a few numpy
reductions of the context array and a max per phase call (closed form over the γ draft steps).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from vegas_sim.errors import TraceSetError, UserInputError
from vegas_sim.gpus import GpuSpec, datasheet_for_device
from vegas_sim.methods import (
    METHODS,
    MIN_TOKENS,
    PHASES,
    check_gamma,
    check_sparsity,
    drafts,
    iteration_plan,
    window_kv_read,
)
from vegas_sim.models import WEIGHT_FORMATS, ModelSpec
from vegas_sim.sim.iteration_cost import (
    IterationCost,
    _steps_max_sum,  # noqa: F401 (re-exported: tests)
)
from vegas_sim.sim.latency_features import (
    ANY_METHOD,
    FEATURES,
    LATENCY_WHERE,
    METHOD_INDEPENDENT_PHASES,
    OPTIONAL_PHASES,
    PHASE_FEATURES,
    POOLED,
    PRIOR_ETA_GEMM,
    PRIOR_ETA_KV,
    SOURCES,
    MeasuredGpu,
    Physics,
    prior_coef,
)
from vegas_sim.sim.parallel import TensorParallel, shard_physics
from vegas_sim.sim.latency_fit import (
    FittedGroup,
    fit_group,
    validate_latency_rows,
    with_host,
)
from vegas_sim.traces.meta import GridMeta
from vegas_sim.traces.schema import (
    GREEDY,
    SAMPLED,
    SAMPLING_PHASES,
    UNRECORDED_TEMPERATURE,
    sampling_mode,
)

def row_temperatures(latency: pd.DataFrame, latency_temperature: float) -> np.ndarray:
    """Each latency row's sampling temperature: its own, or the grid's latency_temperature
    where the set did not record one (the column's unrecorded marker, or no column)."""
    if "temperature" not in latency.columns:
        return np.full(len(latency), float(latency_temperature))
    t = latency["temperature"].to_numpy(dtype=float)
    return np.where(t == UNRECORDED_TEMPERATURE, float(latency_temperature), t)


def _fit_groups(phys: Physics, latency: pd.DataFrame, graphed: bool
                ) -> dict[tuple[str, str], FittedGroup]:
    """One fit per (phase, method) of `latency`, plus the pooled fits of the
    method-independent phases."""
    groups: dict[tuple[str, str], FittedGroup] = {}
    for (phase, method), rows in latency.groupby(["phase", "method"], sort=True):
        groups[(str(phase), str(method))] = fit_group(phys, str(phase), str(method), rows,
                                                      graphed)
    for phase in METHOD_INDEPENDENT_PHASES:
        rows = latency[latency["phase"] == phase]
        if len(rows):
            groups[(phase, POOLED)] = fit_group(phys, phase, POOLED, rows)
    return groups


def _what_if_memory_gb(measured: MeasuredGpu, source: GpuSpec, target: GpuSpec) -> float:
    """The target's capacity in the measured set's units. A datasheet's capacity is the vendor's
    "GB" (an H100's 80 is 85.0e9 bytes as torch reports it), a trace set's is 1e9 bytes: the
    measured capacity scaled by the datasheet ratio, like the rates; the datasheet figure as it
    is when the set recorded none."""
    if measured.memory_gb <= 0:
        return target.memory_gb
    return measured.memory_gb * target.memory_gb / source.memory_gb


class LatencyModel:
    """Per-(phase, method) roofline fits. Build with `LatencyModel.fit` (or `from_meta`)."""

    # Name of the trace set the model was fitted from ('' if unknown): every prediction row
    # carries it as `latency_traces`, so a shared table still says where its latency came from.
    trace_set: str = ""

    def __init__(
        self, model: ModelSpec, measured: MeasuredGpu, groups: dict[tuple[str, str], FittedGroup],
        what_if: GpuSpec | None = None, effective: MeasuredGpu | None = None,
        launch_ms: float | None = None, envelope: tuple[tuple[int, int], ...] = (),
        weight_format: str = "bf16", host_phases_in_loop: bool = True,
        tensor_parallel: TensorParallel | None = None, measured_model: ModelSpec | None = None,
        mode: str = GREEDY, temperatures: dict[str, float] | None = None,
        mode_groups: dict[str, dict[tuple[str, str], FittedGroup]] | None = None,
    ) -> None:
        self._model = model
        # the sampling mode `groups` price (`sampling_mode`), the temperature each measured
        # mode ran at, and, when the set measured both, every mode's whole set of fits
        self.mode = mode
        self._temperatures = dict(temperatures) if temperatures else {mode: 0.0}
        self._mode_groups = dict(mode_groups or {})
        self._mode_variants: dict[str, LatencyModel] = {}
        self._measured_model = measured_model or model  # the model the set measured
        self._tp = tensor_parallel or TensorParallel(1, 0.0, 0.0)
        # whether the set timed the host-bound phases after verify (sample, select) inside
        # whole iterations, as the decoding loop meets them (calibrate's verify_after_draft)
        self.host_phases_in_loop = host_phases_in_loop
        self._weight_format = weight_format  # models.WEIGHT_FORMATS; not bf16: a what-if
        self._envelope = envelope  # (batch, longest context measured at it), by batch
        self._measured = measured  # what the trace set measured
        self._gpu = effective or measured  # what the features are computed for
        self._groups = groups  # as fitted (LOO and coefficients() report these)
        self._what_if = what_if
        self._launch_ms = launch_ms
        # what predictions use: the fitted groups, host terms replaced when launch_ms is given
        self._effective = groups if launch_ms is None else {
            key: with_host(grp, launch_ms) for key, grp in groups.items()}
        self._physics = shard_physics(model, self._tp.size, self._gpu.copy_bandwidth_gbs,
                                      self._gpu.bf16_tflops, weight_format)
        self._loo: pd.DataFrame | None = None
        self._loo_quantiles: tuple[pd.DataFrame, dict[tuple[str, str, float], float]] | None = None
        # the fit's residual by batch describes the measured GPU and host: not a what-if's
        self._use_residual = (what_if is None and launch_ms is None and weight_format == "bf16"
                              and not self._tp.what_if and model == self._measured_model)

    # -- construction --
    @classmethod
    def fit(cls, latency: pd.DataFrame, model: ModelSpec, gpu: MeasuredGpu,
            host_phases_in_loop: bool = True, graphed: bool = False,
            tensor_parallel: TensorParallel | None = None, latency_temperature: float = 0.0
            ) -> LatencyModel:
        """Fit every (phase, method) group of `latency` (rows of traces.schema.LATENCY_SCHEMA).

        `model` must be the model the rows were measured on; `gpu` is meta.json's 'gpu';
        `host_phases_in_loop`: the grid's verify_after_draft (sample and select timed inside
        whole iterations; False: after verify alone, see `sim.uncertainty`); `graphed`: the
        grid's cuda_graphs (the forward phases replayed from CUDA graphs: constant floors);
        `tensor_parallel`: the group the rows were measured on (`TensorParallel.measured_at`;
        None: one GPU): the features are its shard's; `latency_temperature`: the grid's
        (meta.json), the temperature of rows that record none.

        The rows at the grid's latency_temperature (its mode, `sampling_mode`) make the
        model's fits; the sampling phases' rows in the other mode (calibrate's second pass,
        `schema.SAMPLING_PHASES`) are fitted on their own and replace those phases' fits when
        a scenario runs in that mode (`for_temperature`).
        """
        latency = validate_latency_rows(latency)
        tp = tensor_parallel or TensorParallel(1, 0.0, 0.0)
        phys = shard_physics(model, tp.size, gpu.copy_bandwidth_gbs, gpu.bf16_tflops, "bf16")
        temps = row_temperatures(latency, latency_temperature)
        base = sampling_mode(latency_temperature)
        # rows of the other mode price only the phases sampling touches (a merged set's other
        # phases, timed at another temperature, run the same kernels: they join the fits)
        apart = (np.array([sampling_mode(t) for t in temps]) != base) & latency[
            "phase"].isin(list(SAMPLING_PHASES)).to_numpy()
        own = latency[~apart]
        groups = _fit_groups(phys, own, graphed)
        temperatures = {base: float(latency_temperature)}
        mode_groups: dict[str, dict[tuple[str, str], FittedGroup]] = {}
        other = latency[apart]
        if len(other):
            second = GREEDY if base == SAMPLED else SAMPLED
            temperatures[second] = float(temps[apart].max())
            mode_groups = {base: groups, second: {**groups, **_fit_groups(phys, other, graphed)}}
        longest = own.groupby("batch")["context"].max().sort_index()
        envelope = tuple(zip(longest.index.astype(int).tolist(), longest.astype(int).tolist()))
        return cls(model, gpu, groups, envelope=envelope,
                   host_phases_in_loop=host_phases_in_loop, tensor_parallel=tp, mode=base,
                   temperatures=temperatures, mode_groups=mode_groups)

    @classmethod
    def from_meta(cls, latency: pd.DataFrame, meta: dict[str, Any]) -> LatencyModel:
        """Fit from a trace set's latency rows and meta.json (model spec and measured GPU)."""
        try:
            model = ModelSpec.from_dict(meta["model"])
        except (KeyError, TypeError) as exc:
            raise TraceSetError(f"model entry is malformed ({exc!r})", where="meta.json, key model",
                                fix="write ModelSpec.to_dict() under 'model'") from None
        if "gpu" not in meta:
            raise TraceSetError("no gpu entry", where="meta.json, key gpu",
                                fix="record the measured GPU in meta.json")
        return cls.fit(latency, model, MeasuredGpu.from_meta(meta["gpu"]),
                       host_phases_in_loop(meta), forward_phases_graphed(meta),
                       measured_group(meta), GridMeta.from_meta(meta).latency_temperature)

    # -- sampling mode --
    @property
    def measured_modes(self) -> tuple[str, ...]:
        """The sampling modes the set timed its sampling phases in (one or both)."""
        return tuple(sorted(self._mode_groups)) or (self.mode,)

    def prices_mode(self, temperature: float | None) -> bool:
        """Whether a run at `temperature` is priced in its own sampling mode."""
        return sampling_mode(temperature) in self.measured_modes

    def for_temperature(self, temperature: float | None) -> LatencyModel:
        """The model that prices a run at `temperature`: its mode's fits when the set measured
        that mode (greedy: no top-k / top-p filter and no draw), else this model."""
        want = sampling_mode(temperature)
        if want == self.mode or want not in self._mode_groups:
            return self
        if want not in self._mode_variants:
            self._mode_variants[want] = self._variant(groups=self._mode_groups[want], mode=want)
        return self._mode_variants[want]

    def mode_label(self, temperature: float | None) -> str:
        """Which measured mode prices a run at `temperature`: 'greedy', 'sampled at T 0.6',
        or the mode with '(run greedy: not measured)' when the set lacks the run's."""
        priced = self.for_temperature(temperature)
        label = priced.mode if priced.mode == GREEDY else (
            f"{SAMPLED} at T {self._temperatures.get(SAMPLED, 0.0):g}")
        if sampling_mode(temperature) != priced.mode:
            label += f" (run {sampling_mode(temperature)}: not measured)"
        return label

    # -- prediction --
    def fitted_group(self, phase: str, method: str) -> FittedGroup:
        """The fit that prices `phase` for `method`: its own, the method-independent one, or
        the pooled one (`TraceSetError` when none was measured)."""
        for key in ((phase, method), (phase, ANY_METHOD)):
            if key in self._effective:
                return self._effective[key]
        if phase in METHOD_INDEPENDENT_PHASES and (phase, POOLED) in self._effective:
            return self._effective[(phase, POOLED)]
        measured = sorted({m for (p, m) in self._groups if p == phase and m != POOLED})
        raise TraceSetError(
            f"phase {phase!r} was not measured for method {method!r}"
            + (f" (measured for: {', '.join(measured)})" if measured else ""),
            where=f"{LATENCY_WHERE}, columns phase/method",
            fix=f"calibrate method {method!r} (it records every phase of its iteration)",
        )

    def measures(self, phase: str, method: str) -> bool:
        """Whether the trace set measured `phase` for `method` (or a fit it may borrow)."""
        try:
            self.fitted_group(phase, method)
        except TraceSetError:
            return False
        return True

    def phase_ms(
        self, phase: str, method: str, n_query: int, kv_read: np.ndarray, collect_rows: int = 0,
        contexts: np.ndarray | None = None,
    ) -> float:
        """Predicted ms of one call of `phase` for a batch with per-request `kv_read`.

        `contexts` (C per request) sets the sliding-window layers' read of a hybrid model
        (methods.window_kv_read); without it C is taken as kv_read − n_query (exact for decode
        and verify)."""
        if phase not in PHASE_FEATURES:
            raise UserInputError(f"unknown phase {phase!r}", fix=f"use one of: {', '.join(PHASES)}")
        grp = self.fitted_group(phase, method)
        kv = np.asarray(kv_read)
        x = self._physics.intercept_features(int(kv.shape[0]), n_query, collect_rows)
        x += self._physics.slope_features(phase, n_query, collect_rows,
                                          int(kv.shape[0])) * float(kv.sum())
        if self._physics.window:
            c = kv - n_query if contexts is None else np.asarray(contexts)
            x += self._physics.window_features(phase, n_query) * float(
                window_kv_read(self._physics.window, c, n_query).sum())
        comm, comm_per_key = self.comm_ms(phase, int(kv.shape[0]) * n_query)
        gpu = float(x @ grp.gpu_coef) + comm + comm_per_key * float(kv.sum())
        ms = grp.serial + max(grp.floor(int(kv.shape[0]) * n_query), gpu)
        return ms * self.batch_factor(grp, int(kv.shape[0]))

    def comm_ms(self, phase: str, rows: int) -> tuple[float, float]:
        """Tensor-parallel collectives of one call of `phase` over `rows` query rows: (ms per
        call, ms per key of Σ kv_read); (0, 0) on one GPU (`parallel.TensorParallel`)."""
        return self._tp.phase_comm(phase, self._model, rows)

    def batch_factor(self, grp: FittedGroup, batch: int) -> float:
        """The group's residual factor at this batch (1 for a what-if GPU or launch cost)."""
        return grp.batch_factor(batch) if self._use_residual else 1.0

    def iteration_cost(
        self, method: str, gamma: int, sparsity: float, min_tokens: int = MIN_TOKENS
    ) -> IterationCost:
        """Evaluator of one whole iteration of `methods.iteration_plan` (vanilla: one decode)."""
        if drafts(method):
            check_gamma(gamma)
            check_sparsity(sparsity)
        return IterationCost(self, method, gamma, sparsity, min_tokens)

    def plan_ms(
        self, method: str, gamma: int, contexts: np.ndarray, sparsity: float,
        min_tokens: int = MIN_TOKENS,
    ) -> float:
        """Reference (slow) path: Σ phase_ms · repeats over methods.iteration_plan."""
        plan = iteration_plan(method, gamma, contexts, sparsity, self._model.max_positions,
                              min_tokens)
        return sum(
            p.repeats * self.phase_ms(p.phase, method, p.n_query, p.kv_read, p.collect_rows,
                                      contexts)
            for p in plan
            if p.phase not in OPTIONAL_PHASES or self.measures(p.phase, method)
        )

    # -- diagnostics --
    def loo_errors(self, by_method: bool = False) -> pd.DataFrame:
        """Leave-one-out relative error per phase: columns phase, n_points, median_pct, max_pct.

        Each measured point is predicted by its group's fit without that point. With
        `by_method=True` there is one row per fitted (phase, method) group and a method column.
        """
        if self._loo is None:
            recs = []
            for (phase, method), grp in sorted(self._groups.items()):
                if method == POOLED:
                    continue
                for e in grp.loo_rel_errors():
                    recs.append({"phase": phase, "method": method, "err": e})
            self._loo = pd.DataFrame(recs, columns=["phase", "method", "err"])
        keys = ["phase", "method"] if by_method else ["phase"]
        out = (
            self._loo.groupby(keys, sort=True)["err"]
            .agg(n_points="size", median_pct="median", max_pct="max")
            .reset_index()
        )
        out["median_pct"] *= 100.0
        out["max_pct"] *= 100.0
        return out

    def coefficients(self) -> pd.DataFrame:
        """One row per fitted group: phase, method ('*' = pooled), n_points, mode ('sum' or
        'max'), host_ms (h), host_bound_share, fitted (the features whose coefficient the points
        determine), source (per coefficient: 'host=FITTED,gemm=PRIOR,...', see module doc), then
        one coefficient column per feature (const = the serial fixed cost s)."""
        recs = []
        for (phase, method), grp in sorted(self._groups.items()):
            active = [(f, s) for f, s in zip(FEATURES, grp.source) if s]
            source = ([f"host={grp.host_source}"] if grp.mode == "max" else []) + [
                f"{f}={s}" for f, s in active]
            rec: dict[str, Any] = {
                "phase": phase, "method": method, "n_points": len(grp.t), "mode": grp.mode,
                "host_ms": grp.host, "host_batched_ms": grp.host_batched,
                "host_per_token_ms": grp.host_per_token,
                "host_bound_share": float(grp.host_bound().mean()),
                "fitted": ",".join(f for f, s in active if s == "FITTED"),
                "source": ",".join(source),
            }
            rec.update({name: float(grp.coef[i]) for i, name in enumerate(FEATURES)})
            recs.append(rec)
        return pd.DataFrame(recs)

    def host_bound_share(self) -> float:
        """Fraction of the measured points (pooled fits excluded) where the host side (h, or the
        serial cost s) exceeds the fitted GPU work: near 1 for an eager, launch-bound runtime."""
        flags = [grp.host_bound() for (_, m), grp in self._groups.items() if m != POOLED]
        return float(np.concatenate(flags).mean()) if flags else 0.0

    def what_if(self, target: GpuSpec) -> LatencyModel:
        """Rescale to an unmeasured GPU by datasheet bandwidth/FLOP ratios (a spec file's
        measured copy_bandwidth_gbs, when it has one, replaces the bandwidth ratio).

        Only the GPU terms change: the roofline features are recomputed for a GPU whose
        bandwidth / FLOP rate are the measured ones times (target datasheet / measured GPU's
        datasheet), with the fitted (or prior) efficiencies kept. The host floor h and the serial
        cost s are CPU time and are kept as they are (or as `without_host_overhead` set them).
        """
        base = self._measured  # a what-if of a what-if still scales from what was measured
        source = datasheet_for_device(base.name)
        if source is None:
            raise TraceSetError(
                f"the measured GPU {base.name!r} has no datasheet entry, so a what-if cannot be "
                "scaled from it",
                where="meta.json, key gpu.name",
                fix="predict on the measured GPU (drop --gpu) or add its datasheet to gpus.py",
            )
        scaled = MeasuredGpu(
            name=target.name,
            copy_bandwidth_gbs=(target.copy_bandwidth_gbs  # a measured copy rate, as is
                                if target.copy_bandwidth_gbs is not None else
                                base.copy_bandwidth_gbs * target.bandwidth_gbs
                                / source.bandwidth_gbs),
            bf16_tflops=base.bf16_tflops * target.bf16_tflops / source.bf16_tflops,
            memory_gb=_what_if_memory_gb(base, source, target),
        )
        return self._variant(what_if=target, effective=scaled)

    def without_host_overhead(self, launch_ms: float) -> LatencyModel:
        """The same model with every group's host term replaced by `launch_ms` per phase call.

        What an engine without per-kernel host overhead (CUDA-graph replay) would see: in a
        "max" group the host floor h becomes launch_ms (t = max(launch_ms, g)); in a "sum" group
        the fitted serial cost s becomes launch_ms (t = launch_ms + g). Known limit: a sum group
        whose const was folded into a weight-bound GEMM (`identifiable_mask`) keeps that share.
        GPU terms, what-if scaling and the fits (LOO, coefficients()) are unchanged.
        """
        if not (math.isfinite(launch_ms) and launch_ms >= 0.0):
            raise UserInputError(f"launch cost must be a finite number of ms >= 0, got {launch_ms}",
                                 where="--graph-launch-ms",
                                 fix="give the per-step CUDA-graph launch cost, e.g. 0.02")
        return self._variant(launch_ms=float(launch_ms))

    def with_weight_format(self, weight_format: str) -> LatencyModel:
        """The same fits with the weight bytes of `weight_format` (models.WEIGHT_FORMATS): the
        weight-stream features (gemm, batched) are recomputed from the rescaled bytes and
        priced at the fitted (or prior) efficiencies, i.e. moved along the fitted roofline.
        A what-if: the trace set measured the model's own dtype; dequantisation cost, FLOP
        rate and host terms are unchanged. "bf16" gives the measured model back."""
        if weight_format not in WEIGHT_FORMATS:
            raise UserInputError(f"unknown weight format {weight_format!r}",
                                 where="--weight-format",
                                 fix=f"use one of: {', '.join(WEIGHT_FORMATS)}")
        if weight_format == "mxfp4" and not self.model.is_moe:
            raise UserInputError(f"mxfp4 quantises expert weights; {self.model.name} is dense "
                                 "and has none, so the what-if would change nothing",
                                 where="--weight-format",
                                 fix="use --weight-format fp8 for a dense model, or a MoE "
                                     "model (gpt-oss-20b, qwen3-30b-a3b)")
        return self._variant(weight_format=weight_format)

    def with_tensor_parallel(self, tp: TensorParallel) -> LatencyModel:
        """The same fits priced for one GPU of a tensor-parallel group (`parallel`): the
        features of the model's shard at the fitted efficiencies, plus the group's modelled
        collectives. A what-if unless `tp.size` is 1. Refused on a set measured at another
        size > 1 (its collectives are in its fits)."""
        if self._tp.measured and tp.size != self._tp.size:
            raise UserInputError(
                f"the latency set was measured at tensor-parallel size {self._tp.size}; its "
                f"collectives are in its fits, so it cannot price size {tp.size}",
                where="--tp", fix=f"pass --tp {self._tp.size} (measured), or a set measured "
                "on one GPU for a what-if at another size")
        return self._variant(tensor_parallel=tp)

    def for_model(self, target: ModelSpec) -> LatencyModel:
        """Another model's shape priced at these fits: its roofline features (weights, KV,
        FLOPs, heads) at the efficiencies measured on this set's model; host floors kept.
        A what-if for a model of the same kind that was not measured (a dense GQA model from a
        dense GQA set); refused across kinds (dense / MoE, with / without window layers)."""
        base = self._measured_model
        if (target.is_moe != base.is_moe or bool(target.window_layers)
                != bool(base.window_layers)):
            raise UserInputError(
                f"{target.name} is not of the kind of {base.name}, whose set would price it",
                where="--model-what-if", fix="price a dense model from a dense model's set, a "
                "mixture of experts from a mixture of experts', hybrid attention from hybrid")
        return self._variant(model=target)

    @property
    def shape_what_if(self) -> bool:
        """Whether the model priced is not the one the set measured (`for_model`)."""
        return self._model != self._measured_model

    def _variant(self, **changes: Any) -> LatencyModel:
        """This model with some of its what-if settings changed (the fits are shared)."""
        args: dict[str, Any] = dict(
            model=self._model, measured=self._measured, groups=self._groups,
            what_if=self._what_if, effective=self._gpu, launch_ms=self._launch_ms,
            envelope=self._envelope, weight_format=self._weight_format,
            host_phases_in_loop=self.host_phases_in_loop, tensor_parallel=self._tp,
            measured_model=self._measured_model, mode=self.mode,
            temperatures=self._temperatures, mode_groups=self._mode_groups)
        args.update(changes)
        out = LatencyModel(**args)
        out.trace_set = self.trace_set
        return out

    @property
    def weight_format(self) -> str:
        return self._weight_format

    def loo_pct(self, phase: str, method: str) -> float:
        """Median leave-one-out |error| (%) of the group that predicts `phase` for `method`
        (NaN when no point can be left out). Computed once per model (`loo_errors`)."""
        grp = self.fitted_group(phase, method)
        loo = self.loo_errors(by_method=True)
        hit = loo[(loo["phase"] == grp.phase) & (loo["method"] == grp.method)]
        if hit.empty:  # a pooled fit: the phase's errors over every method
            hit = loo[loo["phase"] == grp.phase]
        return float(hit["median_pct"].median()) if len(hit) else math.nan

    def loo_quantile_pct(self, phase: str, method: str, q: float) -> float:
        """The q-quantile of the leave-one-out |error| (%) of the group that predicts `phase`
        for `method` (a pooled fit: over the phase's groups; NaN when none)."""
        grp = self.fitted_group(phase, method)
        if self._loo is None:
            self.loo_errors()
        loo = self._loo
        assert loo is not None
        # memo per leave-one-out table (a sweep asks once per row and phase); a refit makes a
        # new table, so a copy of the model never answers from a stale one
        memo = getattr(self, "_loo_quantiles", None)  # absent from models cached before it
        if memo is None or memo[0] is not loo:
            memo = (loo, dict[tuple[str, str, float], float]())
            self._loo_quantiles = memo
        key = (grp.phase, grp.method, q)
        quantiles: dict[tuple[str, str, float], float] = memo[1]
        if key not in quantiles:
            hit = loo[(loo["phase"] == grp.phase) & (loo["method"] == grp.method)]["err"]
            hit = hit.dropna()
            if hit.empty:
                hit = loo[loo["phase"] == grp.phase]["err"].dropna()
            quantiles[key] = 100.0 * float(hit.quantile(q)) if len(hit) else math.nan
        return quantiles[key]

    def fill_loo_quantiles(self, q: float) -> None:
        """`loo_quantile_pct` at `q` of every fitted group, computed now: a fit cached with
        them gives each predict row's interval without filtering the leave-one-out table."""
        for phase, method in sorted(self._effective):
            self.loo_quantile_pct(phase, method, q)

    def octaves_outside(self, batch: int, longest_context: int, n_query: int = 1
                        ) -> dict[str, float]:
        """How far (log2) a decode instance lies beyond the measured points: 'batch' past the
        largest measured batch, 'context' past the longest context measured at this batch or
        more, 'n_query' past the most query rows a verify point measured (0 inside)."""
        if not self._envelope:
            return {"batch": 0.0, "context": 0.0, "n_query": 0.0}
        top_batch = max(b for b, _ in self._envelope)
        longest = max(c for b, c in self._envelope if b >= min(batch, top_batch))
        rows = [grp.tokens / grp.batch for (ph, _), grp in self._groups.items()
                if ph == "verify" and grp.tokens is not None and grp.batch is not None]
        top_nq = float(max(r.max() for r in rows)) if rows else float(n_query)
        return {"batch": max(0.0, math.log2(batch / top_batch)),
                "context": max(0.0, math.log2(max(longest_context, 1) / longest)),
                "n_query": max(0.0, math.log2(n_query / top_nq))}

    def what_if_octaves(self) -> float:
        """How far (log2) a GPU what-if lies from the measured GPU: the larger of its copy
        bandwidth's and its bf16 rate's ratio to the measured ones (0 without a GPU what-if)."""
        if self._what_if is None:
            return 0.0
        return max(abs(math.log2(self._gpu.copy_bandwidth_gbs / self._measured.copy_bandwidth_gbs)),
                   abs(math.log2(self._gpu.bf16_tflops / self._measured.bf16_tflops)))

    def outside_measured(self, batch: int, longest_context: int) -> list[str]:
        """Why a decode instance of `batch` requests whose KV grows to `longest_context` tokens
        lies outside the measured (batch, context) points, where the fitted roofline alone
        extrapolates ([] inside: some measured point has at least this batch and context)."""
        if not self._envelope:
            return []
        top_batch = max(b for b, _ in self._envelope)
        if batch > top_batch:
            why = (f"batch {batch} beyond the latency set's measured batches (up to "
                   f"{top_batch})")
        else:
            longest = max(c for b, c in self._envelope if b >= batch)
            if longest_context <= longest:
                return []
            why = (f"context up to {longest_context} at batch {batch} beyond the latency set's "
                   f"measured {longest} at batch >= {batch}")
        return [f"{why}: latency from the fitted roofline alone"]

    @property
    def launch_ms(self) -> float | None:
        """The per-call launch cost set by `without_host_overhead` (None: measured host terms)."""
        return self._launch_ms

    @property
    def model(self) -> ModelSpec:
        return self._model

    @property
    def physics(self) -> Physics:
        """The roofline constants the features are computed with (this GPU's rates)."""
        return self._physics

    @property
    def measured_gpu(self) -> MeasuredGpu:
        """The GPU the trace set measured (unchanged by what-ifs)."""
        return self._measured

    @property
    def gpu(self) -> MeasuredGpu:
        """The GPU the model predicts for (scaled numbers for a what-if)."""
        return self._gpu

    @property
    def tensor_parallel(self) -> TensorParallel:
        return self._tp

    @property
    def gpu_model(self) -> ModelSpec:
        """What one GPU holds: the model, or its tensor shard (`ModelSpec.tensor_shard`)."""
        return self._model.tensor_shard(self._tp.size)

    @property
    def is_what_if(self) -> bool:
        return (self._what_if is not None or self._weight_format != "bf16"
                or self._tp.what_if or self.shape_what_if)

    @property
    def gpu_label(self) -> str:
        """E.g. 'NVIDIA H200 (measured)' or 'h100-sxm (what-if, not measured)'."""
        label = (f"{self._what_if.name} (what-if, not measured)" if self._what_if is not None
                 else f"{self._gpu.name} (measured)")
        if self._launch_ms is not None:
            label += f", host overhead replaced by {self._launch_ms:g} ms launch"
        if self._weight_format != "bf16":
            label += f", {self._weight_format} weights (what-if, not measured)"
        if self._tp.measured:
            label += (f", ×{self._tp.size} tensor parallel (measured, "
                      f"{self._tp.interconnect or 'interconnect unknown'})")
        elif self._tp.size > 1:
            label += f", ×{self._tp.size} tensor parallel (what-if, not measured)"
        if self.shape_what_if:
            label += (f", {self._model.name} priced at {self._measured_model.name}'s fits "
                      "(what-if, not measured)")
        return label

    def methods_covered(self) -> list[str]:
        """Methods whose whole iteration can be predicted from the measured phases."""
        out = []
        for m in METHODS:
            try:
                self.iteration_cost(m, 2, 0.1)
            except TraceSetError:
                continue
            out.append(m)
        return out


def host_phases_in_loop(meta: dict[str, Any]) -> bool:
    """Whether a set's grid timed sample and select inside whole iterations (meta.json grid
    'verify_after_draft', `GridMeta`)."""
    return GridMeta.from_meta(meta).verify_after_draft


def measured_group(meta: dict[str, Any]) -> TensorParallel:
    """The tensor-parallel group a set's latency was measured on (meta.json
    `tensor_parallel`; a set without it: one GPU)."""
    tp = meta.get("tensor_parallel")
    if not isinstance(tp, dict):
        return TensorParallel(1, 0.0, 0.0)
    return TensorParallel.measured_at(int(tp.get("size", 1)), str(tp.get("interconnect", "")))


def forward_phases_graphed(meta: dict[str, Any]) -> bool:
    """Whether a set's grid replayed its forward phases from CUDA graphs (meta.json grid
    'cuda_graphs', `GridMeta`: the floor may grow with the batch when not)."""
    return GridMeta.from_meta(meta).cuda_graphs


LatencyFn = Callable[[np.ndarray], float]


__all__ = [
    "FEATURES",
    "PHASE_FEATURES",
    "PRIOR_ETA_GEMM",
    "PRIOR_ETA_KV",
    "SOURCES",
    "IterationCost",
    "LatencyFn",
    "LatencyModel",
    "MeasuredGpu",
    "prior_coef",
]
