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
  graphed H200 set needs (leave-one-out of decode 3.8 → 1.3 %, draft_step 5.6 → 1.2 %, verify
  3.8 → 1.7 %):

    tokens   B·n_query · gemm_flops(1) / F      GEMM FLOPs not hidden under the weight stream
    batched  weight_bytes / BW · [B·n_query > 1]  the batched GEMM path vs batch-1 GEMVs
    rows     collect_rows                       per collected score row, per call (vegas-all)

- h, the host floor: the CPU time to issue the phase's kernels (Python + launch overhead of an
  eager runtime, or launch-latency-bound tiny kernels). The host runs ahead of the GPU, so the
  step takes whichever is longer. It may grow with the batch: h = h0 + h_batched·[B·n_query > 1]
  + h_per_token·B·n_query (a per-token term only where no GPU feature of the group is ∝ tokens).
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
trace set (eager runtime: every step ≈ 35 ms whatever B and context) an unconstrained sum form
learns const ≈ 35 ms with near-zero noise slopes and extrapolates flat; the max form extrapolates
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

Residual by batch. The form misses a shape that the measured sets share (vanilla decode on the
H200, in-sample per batch: +2.6 % at B 1, −2.9 % at B 16, +2.3 % at B 64 for SmolLM2; ±2 % for
Qwen3-8B; draft steps and verify alike). On the measured GPU a prediction is multiplied by the
group's residual at its batch: exp of the median log(measured / fit) over that batch's measured
points, shrunk toward 0 by its standard error (noisy phases keep ≈ none), linear in log B
between measured batches, fading to none over the octave beyond the measured range (there the
fitted physics alone extrapolates). What-if GPUs and `without_host_overhead` get none: the
residual describes the measured GPU and host. Leave-one-out with it (decode 2.5 → 1.0 %, draft
step 1.4 → 0.8 % on the SmolLM2 H200 set) computes the residual without the left-out point.

Leave-one-out (`loo_errors`) leaves a whole measured (batch, context) point out (all its rows:
the gammas and sparsities measured there share a session), refits and predicts its rows.

Grouping: one fit per (phase, method) because the kernels differ by method (index construction,
number of collected rows, Quest paging). A phase the trace set recorded under method "any"
serves every method lacking its own rows; the method-independent phases (sample, prefill)
fall back further to a fit pooled over all methods. Anything else missing is a TraceSetError:
calibrate that method — except `other` (OPTIONAL_PHASES), which older sets lack.

`what_if` rescales the GPU terms by datasheet ratios and keeps h and s (CPU time);
`without_host_overhead(launch_ms)` replaces them by a per-call launch cost (what a CUDA-graph
engine would see). Every GPU feature except gemm/logits is linear in Σ kv_read, so
`IterationCost` evaluates a whole iteration with a few numpy reductions of the context array and
a max per phase call (closed form over the γ draft steps).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from vegas_sim.errors import TraceSetError, UserInputError
from vegas_sim.gpus import GpuSpec, datasheet_for_device
from vegas_sim.methods import (
    METHODS,
    MIN_TOKENS,
    PHASES,
    QUEST_PAGE,
    check_gamma,
    check_method,
    check_sparsity,
    collect_rows,
    iteration_plan,
)
from vegas_sim.models import ModelSpec
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
from vegas_sim.sim.latency_fit import (
    FittedGroup,
    fit_group,
    validate_latency_rows,
    with_host,
)


def _steps_max_sum(h: float, a: float, b: float, n: int) -> float:
    """Σ_{k=1..n} max(h, a + b·k) in closed form (b ≥ 0): the first k* steps sit on the floor."""
    if b <= 0.0:
        return n * max(h, a)
    k_star = min(max(math.floor((h - a) / b), 0), n)  # a + b·k ≤ h  ⇔  k ≤ (h − a) / b
    return k_star * h + (n - k_star) * a + b * (n * (n + 1) - k_star * (k_star + 1)) / 2


@dataclass
class _Term:
    """One plan entry: `repeats` calls of a phase, each costing serial + max(host, gpu).

    gpu of one call = intercept(B) + slope · kv_sum where, per kind,
      "single": kv_sum = a·ΣC + d·B                      (decode, verify, select, sample)
      "steps":  kv_sum of step k = Σsel + B·k, k=1..γ    (draft_step)
      "quest":  kv_sum of step k = Σ_b (C_b + k)//16 + B (quest_meta)
    """

    phase: str
    group: FittedGroup
    kind: str
    repeats: int
    n_query: int
    rows: int
    slope: float  # ms per unit Σ kv_read
    a: float
    d: float


class IterationCost:
    """Fast evaluator of one iteration's time for a fixed (method, gamma, sparsity).

    Called once per simulated iteration: a few numpy reductions over the context array, a
    per-batch-size cache of the GEMM part, and one max(host, gpu) per phase call (closed form
    over the γ draft steps). Agrees with summing `phase_ms` over `methods.iteration_plan` to
    rounding.
    """

    def __init__(
        self, model: LatencyModel, method: str, gamma: int, sparsity: float, min_tokens: int,
    ) -> None:
        self.method = method
        self.gamma = gamma if method != "vanilla" else 1
        self.sparsity = sparsity
        self.min_tokens = min_tokens
        self._model = model
        max_len = model.model.max_positions
        self._hi = max(math.ceil(sparsity * max_len - 1e-9), min_tokens)
        assert QUEST_PAGE == 16  # _quest_steps uses >> 4 and & 15
        # [16, γ] (r + k) // 16 for r = C % 16 and draft step k
        self._quest_m = (
            (np.arange(QUEST_PAGE)[:, None] + np.arange(1, gamma + 1)[None, :]) // QUEST_PAGE
        ).astype(np.float64) if method == "magicdec-quest" else None
        self._terms = self._build_terms()
        # per batch size, per term: (GPU ms independent of kv_read, host floor ms)
        self._base: dict[int, list[tuple[float, float]]] = {}
        self._fast: dict[int, list[tuple[_Term | None, float, float, float, float, float]]] = {}
        self._selects = method != "vanilla"
        self._sel_buf = np.empty(0, dtype=np.float64)  # _selected_sum's scratch [>= B]

    def _build_terms(self) -> list[_Term]:
        g, m = self.gamma, self.method
        terms: list[_Term] = []

        def add(phase: str, kind: str, repeats: int, nq: int, rows: int, a: float,
                d: float) -> None:
            grp = self._model._group(phase, m)
            slope = float(self._model._physics.slope_features(phase, nq, rows) @ grp.gpu_coef)
            terms.append(_Term(phase, grp, kind, repeats, nq, rows, slope, a, d))

        if m == "vanilla":
            add("decode", "single", 1, 1, 0, 1.0, 1.0)  # kv_read = C + 1
            add("sample", "single", 1, 1, 0, 1.0, 1.0)
            return terms
        if self._model.measures("other", m):
            add("other", "single", 1, 1, 0, 1.0, 0.0)  # once per iteration, kv_read = C
        add("draft_step", "steps", g, 1, 0, 0.0, 0.0)  # step k reads sel + k
        if m == "magicdec-quest":
            add("quest_meta", "quest", g, 1, 0, 0.0, 0.0)  # step k scores (C + k)//16 + 1 pages
        rows = collect_rows(m, g)
        add("verify", "single", 1, g + 1, rows, 1.0, float(g + 1))
        if rows:
            add("select", "single", 1, 1, rows, 1.0, 1.0)
        add("sample", "single", 1, g + 1, 0, 1.0, float(g + 1))
        return terms

    def _intercepts(self, batch: int) -> list[tuple[float, float]]:
        """Per term, (ms of the GPU work that does not depend on kv_read (GEMMs, logits), the
        host floor of one call at this batch)."""
        base = self._base.get(batch)
        if base is None:
            phys = self._model._physics
            base = [(float(phys.intercept_features(batch, t.n_query, t.rows) @ t.group.gpu_coef),
                     t.group.floor(batch * t.n_query)) for t in self._terms]
            self._base[batch] = base
        return base

    def _selected_sum(self, c: np.ndarray) -> float:
        """Σ over requests of the draft's selected entries (methods.draft_kv_read minus step).

        Same arithmetic as methods.budget (ceil(s·len − 1e-9), floor, cap, ≤ len) written with
        in-place ufuncs: this runs once per simulated iteration.
        """
        m = self.method
        if self._sel_buf.shape[0] < c.shape[0]:
            self._sel_buf = np.empty(c.shape[0], dtype=np.float64)
        x = self._sel_buf[: c.shape[0]]  # [B] float64, reused: no allocation per iteration
        np.multiply(c, self.sparsity, out=x)
        # rankable length c + 1 for the Vegas family (s·(c + 1) = s·c + s), else c
        x += (self.sparsity if m in ("vegas", "vegas-all", "specextend") else 0.0) - 1e-9
        np.ceil(x, out=x)
        np.maximum(x, self.min_tokens, out=x)
        np.minimum(x, self._hi, out=x)
        np.minimum(x, c, out=x)  # ≤ len, and the t0 of Vegas/SpecExtend sits in the tail
        if m == "magicdec-quest":
            np.floor_divide(x, QUEST_PAGE, out=x)  # top pages + the current page
            np.maximum(x, 1, out=x)
            x += 1
            x *= QUEST_PAGE
            np.minimum(x, c, out=x)
        return float(np.add.reduce(x))

    def _quest_steps(self, c: np.ndarray) -> np.ndarray:
        """[γ] pages scored by quest_meta at draft step k: Σ_b ((C_b + k) // 16 + 1)."""
        assert self._quest_m is not None
        hist = np.bincount(c & 15, minlength=QUEST_PAGE).astype(np.float64)  # [16]
        return np.asarray(float(np.add.reduce(c >> 4) + c.shape[0]) + hist @ self._quest_m)

    def _term_ms(self, t: _Term, base: float, h: float, batch: int, csum: float, c: np.ndarray,
                 sel: float) -> float:
        """GPU-or-host part of all `repeats` calls of one term (serial part excluded); h is the
        host floor of one call."""
        if t.kind == "single":
            return max(h, base + t.slope * (t.a * csum + t.d * batch))
        if t.kind == "steps":
            return _steps_max_sum(h, base + t.slope * sel, t.slope * batch, t.repeats)
        # step k scores Σ_b ((C_b + k)//16 + 1) pages, between p16 + B and p16 + B·(1 + ⌈γ/16⌉)
        p16 = float(np.add.reduce(c >> 4)) + batch
        if base + t.slope * (p16 + batch * ((t.repeats + 15) // 16)) <= h:
            return t.repeats * h  # every step host-bound (the usual case: a tiny kernel)
        gpu = base + t.slope * self._quest_steps(c)  # [γ]
        return float(np.add.reduce(np.maximum(gpu, h)))

    def __call__(self, contexts: np.ndarray) -> float:
        """Total iteration time in ms for a batch whose requests hold `contexts` tokens.

        `contexts` must be an integer numpy array [B] (the engine's per-request contexts).
        """
        c = contexts  # [B] int64
        batch = c.shape[0]
        fast = self._fast.get(batch)
        if fast is None:
            fast = self._fast_terms(batch)
        csum = float(np.add.reduce(c))
        sel = self._selected_sum(c) if self._selects else 0.0
        total = 0.0
        for t, g0, h, per_c, serial, f in fast:
            if t is None:  # a "single" term, inlined: this is the hot path
                total += f * (serial + max(g0 + per_c * csum, h))
            else:
                total += f * (serial + self._term_ms(t, g0, h, batch, csum, c, sel))
        return total

    def _fast_terms(self, batch: int
                    ) -> list[tuple[_Term | None, float, float, float, float, float]]:
        """Per term at this batch size: (None for a "single" term, else the term; its GPU ms
        without the Σ C part (single) or its intercept (others); host floor; ms per unit ΣC;
        serial ms of its repeats; batch residual factor)."""
        out: list[tuple[_Term | None, float, float, float, float, float]] = []
        for t, (b, h) in zip(self._terms, self._intercepts(batch)):
            serial = t.repeats * t.group.serial
            f = self._model.batch_factor(t.group, batch)
            if t.kind == "single":
                out.append((None, b + t.slope * t.d * batch, h, t.slope * t.a, serial, f))
            else:
                out.append((t, b, h, 0.0, serial, f))
        self._fast[batch] = out
        return out

    def breakdown(self, contexts: np.ndarray) -> dict[str, float]:
        """ms per phase (draft_step summed over the γ steps, etc.)."""
        c = np.asarray(contexts, dtype=np.int64)
        batch = c.shape[0]
        base = self._intercepts(batch)
        csum = float(c.sum())
        sel = self._selected_sum(c) if self.method != "vanilla" else 0.0
        out: dict[str, float] = {}
        for t, (b, h) in zip(self._terms, base):
            ms = t.repeats * t.group.serial + self._term_ms(t, b, h, batch, csum, c, sel)
            out[t.phase] = out.get(t.phase, 0.0) + ms * self._model.batch_factor(t.group, batch)
        return out


class LatencyModel:
    """Per-(phase, method) roofline fits. Build with `LatencyModel.fit` (or `from_meta`)."""

    # Name of the trace set the model was fitted from ('' if unknown): every prediction row
    # carries it as `latency_traces`, so a shared table still says where its latency came from.
    trace_set: str = ""

    def __init__(
        self, model: ModelSpec, measured: MeasuredGpu, groups: dict[tuple[str, str], FittedGroup],
        what_if: GpuSpec | None = None, effective: MeasuredGpu | None = None,
        launch_ms: float | None = None, envelope: tuple[tuple[int, int], ...] = (),
    ) -> None:
        self._model = model
        self._envelope = envelope  # (batch, longest context measured at it), by batch
        self._measured = measured  # what the trace set measured
        self._gpu = effective or measured  # what the features are computed for
        self._groups = groups  # as fitted (LOO and coefficients() report these)
        self._what_if = what_if
        self._launch_ms = launch_ms
        # what predictions use: the fitted groups, host terms replaced when launch_ms is given
        self._effective = groups if launch_ms is None else {
            key: with_host(grp, launch_ms) for key, grp in groups.items()}
        self._physics = Physics.of(model, self._gpu.copy_bandwidth_gbs, self._gpu.bf16_tflops)
        self._loo: pd.DataFrame | None = None
        # the fit's residual by batch describes the measured GPU and host: not a what-if's
        self._use_residual = what_if is None and launch_ms is None

    # -- construction --
    @classmethod
    def fit(cls, latency: pd.DataFrame, model: ModelSpec, gpu: MeasuredGpu) -> LatencyModel:
        """Fit every (phase, method) group of `latency` (rows of traces.schema.LATENCY_SCHEMA).

        `model` must be the model the rows were measured on; `gpu` is meta.json's 'gpu'.
        """
        latency = validate_latency_rows(latency)
        phys = Physics.of(model, gpu.copy_bandwidth_gbs, gpu.bf16_tflops)
        groups: dict[tuple[str, str], FittedGroup] = {}
        for (phase, method), rows in latency.groupby(["phase", "method"], sort=True):
            groups[(str(phase), str(method))] = fit_group(phys, str(phase), str(method), rows)
        for phase in METHOD_INDEPENDENT_PHASES:
            rows = latency[latency["phase"] == phase]
            if len(rows):
                groups[(phase, POOLED)] = fit_group(phys, phase, POOLED, rows)
        longest = latency.groupby("batch")["context"].max().sort_index()
        envelope = tuple(zip(longest.index.astype(int).tolist(), longest.astype(int).tolist()))
        return cls(model, gpu, groups, envelope=envelope)

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
        return cls.fit(latency, model, MeasuredGpu.from_meta(meta["gpu"]))

    # -- prediction --
    def _group(self, phase: str, method: str) -> FittedGroup:
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
            self._group(phase, method)
        except TraceSetError:
            return False
        return True

    def phase_ms(
        self, phase: str, method: str, n_query: int, kv_read: np.ndarray, collect_rows: int = 0
    ) -> float:
        """Predicted ms of one call of `phase` for a batch with per-request `kv_read`."""
        if phase not in PHASE_FEATURES:
            raise UserInputError(f"unknown phase {phase!r}", fix=f"use one of: {', '.join(PHASES)}")
        grp = self._group(phase, method)
        kv = np.asarray(kv_read)
        x = self._physics.intercept_features(int(kv.shape[0]), n_query, collect_rows)
        x += self._physics.slope_features(phase, n_query, collect_rows) * float(kv.sum())
        ms = grp.serial + max(grp.floor(int(kv.shape[0]) * n_query), float(x @ grp.gpu_coef))
        return ms * self.batch_factor(grp, int(kv.shape[0]))

    def batch_factor(self, grp: FittedGroup, batch: int) -> float:
        """The group's residual factor at this batch (1 for a what-if GPU or launch cost)."""
        return grp.batch_factor(batch) if self._use_residual else 1.0

    def iteration_cost(
        self, method: str, gamma: int, sparsity: float, min_tokens: int = MIN_TOKENS
    ) -> IterationCost:
        """Evaluator of one whole iteration of `methods.iteration_plan` (vanilla: one decode)."""
        check_method(method)
        if method != "vanilla":
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
            p.repeats * self.phase_ms(p.phase, method, p.n_query, p.kv_read, p.collect_rows)
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
        """Rescale to an unmeasured GPU by datasheet bandwidth/FLOP ratios.

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
            copy_bandwidth_gbs=base.copy_bandwidth_gbs * target.bandwidth_gbs / source.bandwidth_gbs,
            bf16_tflops=base.bf16_tflops * target.bf16_tflops / source.bf16_tflops,
            memory_gb=target.memory_gb,
        )
        out = LatencyModel(self._model, self._measured, self._groups, target, scaled,
                           self._launch_ms, self._envelope)
        out.trace_set = self.trace_set
        return out

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
        out = LatencyModel(self._model, self._measured, self._groups, self._what_if, self._gpu,
                           float(launch_ms), self._envelope)
        out.trace_set = self.trace_set
        return out

    def loo_pct(self, phase: str, method: str) -> float:
        """Median leave-one-out |error| (%) of the group that predicts `phase` for `method`
        (NaN when no point can be left out). Computed once per model (`loo_errors`)."""
        grp = self._group(phase, method)
        loo = self.loo_errors(by_method=True)
        hit = loo[(loo["phase"] == grp.phase) & (loo["method"] == grp.method)]
        if hit.empty:  # a pooled fit: the phase's errors over every method
            hit = loo[loo["phase"] == grp.phase]
        return float(hit["median_pct"].median()) if len(hit) else math.nan

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
    def measured_gpu(self) -> MeasuredGpu:
        """The GPU the trace set measured (unchanged by what-ifs)."""
        return self._measured

    @property
    def gpu(self) -> MeasuredGpu:
        """The GPU the model predicts for (scaled numbers for a what-if)."""
        return self._gpu

    @property
    def is_what_if(self) -> bool:
        return self._what_if is not None

    @property
    def gpu_label(self) -> str:
        """E.g. 'NVIDIA H200 (measured)' or 'h100-sxm (what-if, not measured)'."""
        label = (f"{self._what_if.name} (what-if, not measured)" if self._what_if is not None
                 else f"{self._gpu.name} (measured)")
        if self._launch_ms is not None:
            label += f", host overhead replaced by {self._launch_ms:g} ms launch"
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
