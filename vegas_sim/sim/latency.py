"""Latency model: per-phase time grounded in the roofline, fitted to latency.parquet.

For one call of a phase on a batch of B requests (uniform n_query, per-request kv_read), the
predicted time is a non-negative combination of *features*, each in roofline milliseconds on
the measured GPU (copy bandwidth BW, bf16 matmul rate F from meta.json 'gpu'):

    const    1                                            fixed launch / CPU overhead
    gemm     max(weight_bytes / BW, gemm_flops(B·n_query) / F)   dense layers + LM head
    logits   B·n_query·vocab·4 / BW                       fp32 logits read by sampling
    kv       Σ_b kv_read_b · bytes_per_entry / BW         KV (or Quest page metadata) read
    attn     Σ_b attn_flops(n_query, kv_read_b) / F       QK^T and PV FLOPs
    collect  Σ_b kv_read_b · collect_rows · Hq · L · 2 / BW   bf16 scores written / read
    rank     Σ_b kv_read_b · L · 4 / BW                   fp32 per-layer weights ranked by top-k

Which features a phase uses is in `PHASE_FEATURES` (a feature that cannot vary inside a phase,
e.g. attn with one query row, is left out: it would only be collinear with kv). Coefficients are
fitted per (phase, method) group with `scipy.optimize.nnls` on relative error (rows weighted by
1/t), so every coefficient is a non-negative efficiency factor: physical by construction.

Grouping: one fit per (phase, method) because the kernels differ by method (index
construction, number of collected rows, Quest paging). A phase the trace set recorded under
method "any" serves every method lacking its own rows; the method-independent phases (sample,
prefill, other) fall back further to a fit pooled over all methods. Anything else missing is a
TraceSetError: calibrate that method.

Features a group's points cannot tell apart (e.g. const vs a GEMM that never leaves the
weight-bound regime) are dropped by a fixed physical rule, see `_identifiable_mask`.

Every feature except gemm/logits is linear in Σ kv_read, so outside the grid the model
extrapolates along the physics (twice the KV bytes → twice the KV term), never flat. That
linearity also makes `IterationCost` cheap: per phase, time = intercept(B) + slope · Σ kv_read,
and Σ kv_read over the plan is a few numpy reductions of the context array.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import nnls

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

LATENCY_WHERE = "latency.parquet"

FEATURES: tuple[str, ...] = ("const", "gemm", "logits", "kv", "attn", "collect", "rank")
_F = {name: i for i, name in enumerate(FEATURES)}

PHASE_FEATURES: dict[str, tuple[str, ...]] = {
    "decode": ("const", "gemm", "kv"),
    "draft_step": ("const", "gemm", "kv"),
    "verify": ("const", "gemm", "kv", "attn", "collect"),
    "prefill": ("const", "gemm", "kv", "attn"),
    "collect": ("const", "collect"),
    "select": ("const", "collect", "rank"),
    "quest_meta": ("const", "kv"),
    "sample": ("const", "logits"),
    "other": ("const", "gemm", "kv"),
}
# Phases whose kernel does not depend on the method: may borrow a fit pooled over methods.
METHOD_INDEPENDENT_PHASES = ("sample", "prefill", "other")
ANY_METHOD = "any"
_POOLED = "*"

_REQUIRED_COLUMNS = ("phase", "method", "batch", "context", "n_query", "kv_read",
                     "collect_rows", "ms_median")


@dataclass(frozen=True)
class MeasuredGpu:
    """What the trace set measured (meta.json 'gpu')."""

    name: str
    copy_bandwidth_gbs: float
    bf16_tflops: float
    memory_gb: float

    @classmethod
    def from_meta(cls, gpu: dict[str, Any]) -> MeasuredGpu:
        """Build from meta.json's 'gpu' object; TraceSetError names the missing key."""
        try:
            out = cls(
                name=str(gpu["name"]),
                copy_bandwidth_gbs=float(gpu["copy_bandwidth_gbs"]),
                bf16_tflops=float(gpu["bf16_tflops"]),
                memory_gb=float(gpu.get("memory_gb", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise TraceSetError(
                f"gpu entry is incomplete or malformed ({exc!r})",
                where="meta.json, key gpu",
                fix="record name, copy_bandwidth_gbs and bf16_tflops measured in the run",
            ) from None
        if out.copy_bandwidth_gbs <= 0 or out.bf16_tflops <= 0:
            raise TraceSetError(
                "measured copy_bandwidth_gbs and bf16_tflops must be positive",
                where="meta.json, key gpu", fix="re-run the hardware measurement of calibrate",
            )
        return out


# ---- features ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Physics:
    """Roofline constants of one (model, GPU): ms per byte / per FLOP and per-entry sizes."""

    ms_per_byte: float
    ms_per_flop: float
    weight_ms: float  # weight_bytes / BW
    gemm_flop_ms_per_token: float  # 2·matmul_params / F
    logits_ms_per_row: float  # vocab·4 / BW
    kv_ms_per_token: float  # kv_bytes_per_token / BW
    page_ms: float  # Quest page metadata (min+max keys, all layers/KV heads) / BW
    attn_ms_per_row_key: float  # 4·L·Hq·D / F
    collect_ms_per_row_key: float  # Hq·L·2 / BW
    rank_ms_per_key: float  # L·4 / BW

    @classmethod
    def of(cls, model: ModelSpec, bandwidth_gbs: float, tflops: float) -> _Physics:
        ms_per_byte = 1e3 / (bandwidth_gbs * 1e9)
        ms_per_flop = 1e3 / (tflops * 1e12)
        return cls(
            ms_per_byte=ms_per_byte,
            ms_per_flop=ms_per_flop,
            weight_ms=model.weight_bytes() * ms_per_byte,
            gemm_flop_ms_per_token=model.gemm_flops(1) * ms_per_flop,
            logits_ms_per_row=model.vocab * 4 * ms_per_byte,
            kv_ms_per_token=model.kv_bytes_per_token() * ms_per_byte,
            page_ms=2 * model.n_layers * model.n_kv_heads * model.head_dim * model.dtype_bytes
            * ms_per_byte,
            attn_ms_per_row_key=model.attn_flops(1, 1.0) * ms_per_flop,
            collect_ms_per_row_key=model.n_heads * model.n_layers * 2 * ms_per_byte,
            rank_ms_per_key=model.n_layers * 4 * ms_per_byte,
        )

    def gemm_ms(self, tokens: int | np.ndarray) -> Any:
        """Roofline GEMM time for `tokens` query rows in flight: weight- or FLOP-bound."""
        return np.maximum(self.weight_ms, self.gemm_flop_ms_per_token * np.asarray(tokens))

    def intercept_features(self, batch: int, n_query: int) -> np.ndarray:
        """[n_features] the part of the features that does not depend on kv_read."""
        f = np.zeros(len(FEATURES))
        f[_F["const"]] = 1.0
        f[_F["gemm"]] = float(self.gemm_ms(batch * n_query))
        f[_F["logits"]] = batch * n_query * self.logits_ms_per_row
        return f

    def slope_features(self, phase: str, n_query: int, rows: int) -> np.ndarray:
        """[n_features] features per unit of Σ kv_read (all linear in it)."""
        f = np.zeros(len(FEATURES))
        f[_F["kv"]] = self.page_ms if phase == "quest_meta" else self.kv_ms_per_token
        f[_F["attn"]] = n_query * self.attn_ms_per_row_key
        f[_F["collect"]] = rows * self.collect_ms_per_row_key
        f[_F["rank"]] = self.rank_ms_per_key
        return f

    def features(
        self, phase: str, batch: np.ndarray, n_query: np.ndarray, kv_sum: np.ndarray,
        rows: np.ndarray,
    ) -> np.ndarray:
        """[n_rows, n_features] for rows of measured points (kv_sum = Σ_b kv_read_b)."""
        x = np.zeros((len(batch), len(FEATURES)))
        x[:, _F["const"]] = 1.0
        x[:, _F["gemm"]] = self.gemm_ms(batch * n_query)
        x[:, _F["logits"]] = batch * n_query * self.logits_ms_per_row
        x[:, _F["kv"]] = kv_sum * (self.page_ms if phase == "quest_meta" else self.kv_ms_per_token)
        x[:, _F["attn"]] = kv_sum * n_query * self.attn_ms_per_row_key
        x[:, _F["collect"]] = kv_sum * rows * self.collect_ms_per_row_key
        x[:, _F["rank"]] = kv_sum * self.rank_ms_per_key
        return x


def _mask(phase: str) -> np.ndarray:
    """[n_features] bool: the features phase `phase` is fitted with."""
    active = PHASE_FEATURES[phase]
    return np.array([name in active for name in FEATURES])


def _constant(col: np.ndarray) -> bool:
    return bool(np.ptp(col) <= 1e-9 * max(float(np.abs(col).max()), 1e-300))


def _identifiable_mask(phase: str, x: np.ndarray) -> np.ndarray:
    """The phase's features minus those the group's points cannot separate from another.

    Collinear pairs would get an arbitrary split, which only matters for a what-if (the two
    sides scale differently), so the rule is fixed and physical:
    - GEMM never leaves the weight-bound regime (small batch) → no separate const: the fixed
      overhead is folded into the weight-read term and scales with bandwidth in a what-if.
    - one n_query only, or collected rows = n_query → no attn term (attention counted as
      memory-bound reads).
    - one collect_rows only → collect folded into kv (select: rank folded into collect).
    """
    mask = _mask(phase)
    col = {name: x[:, i] for i, name in enumerate(FEATURES)}
    if mask[_F["gemm"]] and _constant(col["gemm"]):
        mask[_F["const"]] = False
    if mask[_F["attn"]] and mask[_F["kv"]] and _constant(col["attn"] / np.maximum(col["kv"], 1e-300)):
        mask[_F["attn"]] = False
    if mask[_F["attn"]] and mask[_F["collect"]] and _constant(
            col["attn"] / np.maximum(col["collect"], 1e-300)):
        mask[_F["attn"]] = False  # rows collected = n_query (specextend, vegas-all)
    if mask[_F["collect"]] and mask[_F["kv"]] and _constant(
            col["collect"] / np.maximum(col["kv"], 1e-300)):
        mask[_F["collect"]] = False
    if mask[_F["rank"]] and mask[_F["collect"]] and _constant(
            col["rank"] / np.maximum(col["collect"], 1e-300)):
        mask[_F["rank"]] = False
    return mask


def _fit_nnls(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Non-negative c minimising Σ ((x·c − t) / t)²; x [n, k], t [n] → c [k]."""
    a = x / t[:, None]  # relative error: each row weighted by 1/t
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0  # an all-zero feature gets coefficient 0 anyway
    c, _ = nnls(a / scale, np.ones(len(t)), maxiter=50 * a.shape[1])
    return np.asarray(c / scale)


@dataclass(frozen=True)
class _Group:
    """One fitted (phase, method) group."""

    phase: str
    method: str
    coef: np.ndarray  # [n_features], zeros where the phase has no such feature
    mask: np.ndarray  # [n_features] bool, the features this group was fitted with
    x: np.ndarray  # [n_points, n_features] design matrix of the measured points
    t: np.ndarray  # [n_points] measured ms_median

    def loo_rel_errors(self) -> np.ndarray:
        """[n_points] |pred − t| / t with each point left out of its own fit."""
        mask = self.mask
        n = len(self.t)
        if n < 2:
            return np.full(n, np.nan)
        errs = np.empty(n)
        keep = np.ones(n, dtype=bool)
        for i in range(n):
            keep[i] = False
            c = _fit_nnls(self.x[keep][:, mask], self.t[keep])
            errs[i] = abs(float(self.x[i, mask] @ c) - self.t[i]) / self.t[i]
            keep[i] = True
        return errs


def _validate_latency(latency: pd.DataFrame) -> pd.DataFrame:
    missing = [c for c in _REQUIRED_COLUMNS if c not in latency.columns]
    if missing:
        raise TraceSetError(
            f"missing columns {missing}", where=LATENCY_WHERE,
            fix="write latency rows with the columns of traces.schema.LATENCY_SCHEMA",
        )
    if len(latency) == 0:
        raise TraceSetError("no latency rows", where=LATENCY_WHERE,
                            fix="run calibrate to measure the phases")
    bad_phase = sorted(set(latency["phase"]) - set(PHASES))
    if bad_phase:
        raise TraceSetError(f"unknown phases {bad_phase}", where=f"{LATENCY_WHERE}, column phase",
                            fix=f"use one of: {', '.join(PHASES)}")
    t = latency["ms_median"].to_numpy(dtype=float)
    if not np.all(np.isfinite(t) & (t > 0)):
        raise TraceSetError("ms_median must be finite and > 0",
                            where=f"{LATENCY_WHERE}, column ms_median",
                            fix="drop or re-measure the failed points")
    for col in ("batch", "n_query"):
        if (latency[col].to_numpy() < 1).any():
            raise TraceSetError(f"{col} must be >= 1", where=f"{LATENCY_WHERE}, column {col}",
                                fix="re-measure the point")
    for col in ("kv_read", "collect_rows", "context"):
        if (latency[col].to_numpy() < 0).any():
            raise TraceSetError(f"{col} must be >= 0", where=f"{LATENCY_WHERE}, column {col}",
                                fix="re-measure the point")
    return latency


# ---- iteration cost ----------------------------------------------------------------------


# g[r] = Σ_{k=1..γ} floor((r + k) / QUEST_PAGE) for r in 0..QUEST_PAGE-1, built per γ.
def _quest_offsets(gamma: int) -> np.ndarray:
    r = np.arange(QUEST_PAGE)[:, None]
    k = np.arange(1, gamma + 1)[None, :]
    return np.asarray(((r + k) // QUEST_PAGE).sum(axis=1), dtype=np.int64)


@dataclass
class _Term:
    """One plan entry reduced to intercept(B) + slope · (a·ΣC + b·Σsel + c·Σquest + d·B)."""

    phase: str
    group: _Group
    repeats: int
    n_query: int
    rows: int
    slope: float  # ms per unit Σ kv_read
    # Σ kv_read of this entry (over its repeats) = a·ΣC + b·Σsel + q·Σquest + d·B
    a: float
    b: float
    q: float
    d: float


class IterationCost:
    """Fast evaluator of one iteration's time for a fixed (method, gamma, sparsity).

    Called once per simulated iteration: a few numpy reductions over the context array plus a
    per-batch-size cache of the GEMM/overhead part. Agrees with summing `phase_ms` over
    `methods.iteration_plan` to rounding.
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
        assert QUEST_PAGE == 16  # _quest_sum uses >> 4 and & 15
        self._quest_g = _quest_offsets(gamma) if method == "magicdec-quest" else None
        self._terms = self._build_terms()
        self._a = sum(t.slope * t.a for t in self._terms)
        self._b = sum(t.slope * t.b for t in self._terms)
        self._q = sum(t.slope * t.q for t in self._terms)
        self._d = sum(t.slope * t.d for t in self._terms)
        self._base: dict[int, float] = {}

    def _build_terms(self) -> list[_Term]:
        g, m = self.gamma, self.method
        terms: list[_Term] = []

        def add(phase: str, repeats: int, nq: int, rows: int, a: float, b: float, q: float,
                d: float) -> None:
            grp = self._model._group(phase, m)
            slope = float(self._model._physics.slope_features(phase, nq, rows) @ grp.coef)
            terms.append(_Term(phase, grp, repeats, nq, rows, slope, a, b, q, d))

        if m == "vanilla":
            add("decode", 1, 1, 0, 1.0, 0.0, 0.0, 1.0)  # kv_read = C + 1
            add("sample", 1, 1, 0, 1.0, 0.0, 0.0, 1.0)
            return terms
        # draft step k reads sel + k: Σ over k = γ·Σsel + B·γ(γ+1)/2
        add("draft_step", g, 1, 0, 0.0, float(g), 0.0, g * (g + 1) / 2)
        if m == "magicdec-quest":
            # step k scores (C + k)//16 + 1 pages: Σ_k = γ·Σ(C//16) + Σ g[C%16] + B·γ
            add("quest_meta", g, 1, 0, 0.0, 0.0, 1.0, float(g))
        rows = collect_rows(m, g)
        add("verify", 1, g + 1, rows, 1.0, 0.0, 0.0, float(g + 1))
        if rows:
            add("select", 1, 1, rows, 1.0, 0.0, 0.0, 1.0)
        add("sample", 1, g + 1, 0, 1.0, 0.0, 0.0, float(g + 1))
        return terms

    def _intercept(self, batch: int) -> float:
        """ms of the kv-independent part (overheads, GEMMs, logits, B-linear kv) at `batch`."""
        base = self._base.get(batch)
        if base is None:
            phys = self._model._physics
            base = sum(
                t.repeats * float(phys.intercept_features(batch, t.n_query) @ t.group.coef)
                for t in self._terms
            ) + self._d * batch
            self._base[batch] = base
        return base

    def _selected_sum(self, c: np.ndarray) -> float:
        """Σ over requests of the draft's selected entries (methods.draft_kv_read minus step).

        Same arithmetic as methods.budget (ceil(s·len − 1e-9), floor, cap, ≤ len) written with
        in-place ufuncs: this runs once per simulated iteration.
        """
        m = self.method
        length = c + 1 if m in ("vegas", "vegas-all", "specextend") else c  # rankable length
        x = np.multiply(length, self.sparsity)  # [B] float64
        x -= 1e-9
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

    def _quest_sum(self, c: np.ndarray) -> float:
        """Σ_k Σ_b ((C_b + k) // 16) over draft steps k = 1..γ (quest_meta pages minus B·γ)."""
        assert self._quest_g is not None
        return float(self.gamma * np.add.reduce(c >> 4) + np.add.reduce(self._quest_g[c & 15]))

    def __call__(self, contexts: np.ndarray) -> float:
        """Total iteration time in ms for a batch whose requests hold `contexts` tokens.

        `contexts` must be an integer numpy array [B] (the engine's per-request contexts).
        """
        c = contexts  # [B] int64
        base = self._base.get(c.shape[0])
        if base is None:
            base = self._intercept(c.shape[0])
        total = base + self._a * float(np.add.reduce(c))
        if self._b:
            total += self._b * self._selected_sum(c)
        if self._quest_g is not None:
            total += self._q * self._quest_sum(c)
        return total

    def breakdown(self, contexts: np.ndarray) -> dict[str, float]:
        """ms per phase (draft_step summed over the γ steps, etc.)."""
        c = np.asarray(contexts, dtype=np.int64)
        batch = c.shape[0]
        sums = {"C": float(c.sum()), "sel": 0.0, "quest": 0.0}
        if any(t.b for t in self._terms):
            sums["sel"] = self._selected_sum(c)
        if self._quest_g is not None:
            sums["quest"] = self._quest_sum(c)
        phys = self._model._physics
        out: dict[str, float] = {}
        for t in self._terms:
            kv_sum = t.a * sums["C"] + t.b * sums["sel"] + t.q * sums["quest"] + t.d * batch
            ms = t.repeats * float(phys.intercept_features(batch, t.n_query) @ t.group.coef)
            out[t.phase] = out.get(t.phase, 0.0) + ms + t.slope * kv_sum
        return out


# ---- the model ---------------------------------------------------------------------------


class LatencyModel:
    """Per-(phase, method) roofline fits. Build with `LatencyModel.fit` (or `from_meta`)."""

    def __init__(
        self, model: ModelSpec, measured: MeasuredGpu, groups: dict[tuple[str, str], _Group],
        what_if: GpuSpec | None = None, effective: MeasuredGpu | None = None,
    ) -> None:
        self._model = model
        self._measured = measured  # what the trace set measured
        self._gpu = effective or measured  # what the features are computed for
        self._groups = groups
        self._what_if = what_if
        self._physics = _Physics.of(model, self._gpu.copy_bandwidth_gbs, self._gpu.bf16_tflops)
        self._loo: pd.DataFrame | None = None

    # -- construction --
    @classmethod
    def fit(cls, latency: pd.DataFrame, model: ModelSpec, gpu: MeasuredGpu) -> LatencyModel:
        """Fit every (phase, method) group of `latency` (rows of traces.schema.LATENCY_SCHEMA).

        `model` must be the model the rows were measured on; `gpu` is meta.json's 'gpu'.
        """
        latency = _validate_latency(latency)
        phys = _Physics.of(model, gpu.copy_bandwidth_gbs, gpu.bf16_tflops)
        groups: dict[tuple[str, str], _Group] = {}
        for (phase, method), rows in latency.groupby(["phase", "method"], sort=True):
            groups[(str(phase), str(method))] = _fit_group(phys, str(phase), str(method), rows)
        for phase in METHOD_INDEPENDENT_PHASES:
            rows = latency[latency["phase"] == phase]
            if len(rows):
                groups[(phase, _POOLED)] = _fit_group(phys, phase, _POOLED, rows)
        return cls(model, gpu, groups)

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
    def _group(self, phase: str, method: str) -> _Group:
        for key in ((phase, method), (phase, ANY_METHOD)):
            if key in self._groups:
                return self._groups[key]
        if phase in METHOD_INDEPENDENT_PHASES and (phase, _POOLED) in self._groups:
            return self._groups[(phase, _POOLED)]
        measured = sorted({m for (p, m) in self._groups if p == phase and m != _POOLED})
        raise TraceSetError(
            f"phase {phase!r} was not measured for method {method!r}"
            + (f" (measured for: {', '.join(measured)})" if measured else ""),
            where=f"{LATENCY_WHERE}, columns phase/method",
            fix=f"calibrate method {method!r} (it records every phase of its iteration)",
        )

    def phase_ms(
        self, phase: str, method: str, n_query: int, kv_read: np.ndarray, collect_rows: int = 0
    ) -> float:
        """Predicted ms of one call of `phase` for a batch with per-request `kv_read`."""
        if phase not in PHASE_FEATURES:
            raise UserInputError(f"unknown phase {phase!r}", fix=f"use one of: {', '.join(PHASES)}")
        grp = self._group(phase, method)
        kv = np.asarray(kv_read)
        x = self._physics.intercept_features(int(kv.shape[0]), n_query)
        x += self._physics.slope_features(phase, n_query, collect_rows) * float(kv.sum())
        return float(x @ grp.coef)

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
                if method == _POOLED:
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
        """One row per fitted group: phase, method ('*' = pooled), n_points, fitted (the
        features the points could identify), then one coefficient column per feature."""
        recs = []
        for (phase, method), grp in sorted(self._groups.items()):
            rec: dict[str, Any] = {
                "phase": phase, "method": method, "n_points": len(grp.t),
                "fitted": ",".join(f for f, m in zip(FEATURES, grp.mask) if m),
            }
            rec.update({name: float(grp.coef[i]) for i, name in enumerate(FEATURES)})
            recs.append(rec)
        return pd.DataFrame(recs)

    def what_if(self, target: GpuSpec) -> LatencyModel:
        """Rescale to an unmeasured GPU by datasheet bandwidth/FLOP ratios.

        The fitted efficiencies and the fixed overhead c0 are kept; the roofline features are
        recomputed for a GPU whose bandwidth / FLOP rate are the measured ones times
        (target datasheet / measured GPU's datasheet).
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
        return LatencyModel(self._model, self._measured, self._groups, target, scaled)

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
        if self._what_if is not None:
            return f"{self._what_if.name} (what-if, not measured)"
        return f"{self._gpu.name} (measured)"

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


def _fit_group(phys: _Physics, phase: str, method: str, rows: pd.DataFrame) -> _Group:
    """Fit one group; rows are measured points with a uniform batch (kv_read per request)."""
    batch = rows["batch"].to_numpy(dtype=float)
    n_query = rows["n_query"].to_numpy(dtype=float)
    kv_sum = batch * rows["kv_read"].to_numpy(dtype=float)  # Σ_b kv_read_b, uniform batch
    x = phys.features(phase, batch, n_query, kv_sum, rows["collect_rows"].to_numpy(dtype=float))
    t = rows["ms_median"].to_numpy(dtype=float)
    mask = _identifiable_mask(phase, x)
    coef = np.zeros(len(FEATURES))
    coef[mask] = _fit_nnls(x[:, mask], t)
    return _Group(phase, method, coef, mask, x, t)


LatencyFn = Callable[[np.ndarray], float]
__all__ = ["FEATURES", "IterationCost", "LatencyFn", "LatencyModel", "MeasuredGpu",
           "PHASE_FEATURES"]
