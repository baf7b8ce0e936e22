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

import dataclasses
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

LATENCY_WHERE = "latency.parquet"

FEATURES: tuple[str, ...] = ("const", "gemm", "logits", "kv", "attn", "collect", "rank",
                             "tokens", "batched", "rows")
_F = {name: i for i, name in enumerate(FEATURES)}

PHASE_FEATURES: dict[str, tuple[str, ...]] = {
    "decode": ("const", "gemm", "kv", "tokens", "batched"),
    "draft_step": ("const", "gemm", "kv", "tokens", "batched"),
    "verify": ("const", "gemm", "kv", "attn", "collect", "tokens", "batched", "rows"),
    "prefill": ("const", "gemm", "kv", "attn"),
    "collect": ("const", "collect"),
    "select": ("const", "collect", "rank"),
    "quest_meta": ("const", "kv"),
    "sample": ("const", "logits"),
    "other": ("const", "gemm", "kv", "tokens", "batched"),
}
# Kernel-level GPU features (sum form only, no roofline prior): fitted when a group is GPU-bound.
#   tokens   B·n_query · gemm_flops(1) / F: GEMM FLOP time that does not hide under the weight
#            stream (small-M GEMMs run far from peak), so a step grows with batch even while the
#            roofline GEMM term is still weight-bound
#   batched  weight_bytes / BW when B·n_query > 1, else 0: the tensor-core GEMM path costs more
#            than the GEMV kernels a single-row step runs (measured: decode B=1 8.26 ms, B=2
#            8.82 ms on the graphed H200 set)
#   rows     collect_rows, per call: a fixed cost per collected score row (the verify kernel's
#            extra score stores per row, per layer: vegas-all at 16 rows +3.2 ms at C=1024)
KERNEL_FEATURES = ("tokens", "batched", "rows")
# A sum-form fixed cost s up to this many weight streams (weight_bytes / BW) is folded into the
# `batched` weight-read term when every point takes the batched path (see _sum_group).
FOLD_WEIGHT_STREAMS = 4.0
# Upper bounds of the kernel features' coefficients (1 / efficiency): a per-token GEMM cost runs
# at ≥ 5 % of the measured bf16 rate, the batched path's extra cost (or a fixed cost folded
# into it) is at most FOLD_WEIGHT_STREAMS weight streams. They keep the sum form from passing a
# host floor that grows with batch (an eager or launch-bound small model: 135M parameters) off
# as GPU work; the max form's batch-dependent floor explains such data instead.
KERNEL_MAX = {"tokens": 20.0, "batched": FOLD_WEIGHT_STREAMS}
# Phases whose kernel does not depend on the method: may borrow a fit pooled over methods.
METHOD_INDEPENDENT_PHASES = ("sample", "prefill")
# Phases of methods.iteration_plan a trace set may lack: 'other' (once-per-iteration draft
# work); a set without it has that work spread over draft_step and quest_meta.
OPTIONAL_PHASES = ("other",)
ANY_METHOD = "any"
_POOLED = "*"

# Roofline priors (not fits): the efficiency a phase reaches on its GPU work when the trace set
# cannot tell (no GPU-bound point). Bandwidth-bound streams (KV, scores, logits, ranking) reach
# ~0.9 of the measured copy bandwidth; GEMMs ~0.7 of the measured bf16 rate (or of the copy
# bandwidth while weight-bound).
PRIOR_ETA_KV = 0.9
PRIOR_ETA_GEMM = 0.7
# The max form's prior penalty on each log-coefficient, in points: a coefficient moves away from
# its prior only when more than this many (share-weighted) GPU-bound points ask for it.
PRIOR_WEIGHT = 2.0
# Robust loss scale of the max form (|log error| above it counts linearly, like a median).
MAX_FIT_F_SCALE = 0.05
# The max form's GPU log-coefficients stay within ± this of their prior (keeps exp() finite).
MAX_FIT_LOG_RANGE = 30.0
# The sum form is kept when its median |log error| ≤ this × the max form's.
SUM_MODE_MARGIN = 0.9
# The sum form's GPU coefficients are bounded below by 1 / ROOFLINE_SLACK: no kernel beats the
# measured copy bandwidth / bf16 rate by more than this factor. Without it, on host-bound data the
# const would absorb the GPU work and leave sub-roofline (or zero, i.e. flat) slopes.
ROOFLINE_SLACK = 1.25
# Starting points of the max fit: every coefficient at prior × each scale (the max has zero
# gradient where all points are host-bound, so one start would stay where it began).
_MAX_FIT_STARTS = (1.0 / 64, 1.0 / 8, 1.0, 8.0, 64.0, 512.0)
SOURCES = ("FITTED", "PRIOR", "CAPPED", "BOUND")


def prior_coef(phase: str) -> np.ndarray:
    """[n_features] the roofline prior coefficient (1 / efficiency) of each feature of `phase`.

    const has no prior (0: a host or serial cost is always fitted). attn's prior is 0 except
    for prefill: with ≤ ~40 query rows attention is bandwidth-bound on any current GPU
    (Hq/Hkv FLOPs per KV byte per row, far below the FLOP/byte ridge), so its FLOPs overlap the
    KV read counted by `kv`.
    """
    c = np.zeros(len(FEATURES))
    c[_F["gemm"]] = 1.0 / PRIOR_ETA_GEMM
    for name in ("logits", "kv", "collect", "rank"):
        c[_F[name]] = 1.0 / PRIOR_ETA_KV
    if phase == "prefill":
        c[_F["attn"]] = 1.0 / PRIOR_ETA_GEMM
    return c * _mask(phase)


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

    def intercept_features(self, batch: int, n_query: int, rows: int = 0) -> np.ndarray:
        """[n_features] the part of the features that does not depend on kv_read."""
        f = np.zeros(len(FEATURES))
        tokens = batch * n_query
        f[_F["const"]] = 1.0
        f[_F["gemm"]] = float(self.gemm_ms(tokens))
        f[_F["logits"]] = tokens * self.logits_ms_per_row
        f[_F["tokens"]] = tokens * self.gemm_flop_ms_per_token
        f[_F["batched"]] = self.weight_ms if tokens > 1 else 0.0
        f[_F["rows"]] = float(rows)
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
        tokens = batch * n_query
        x[:, _F["tokens"]] = tokens * self.gemm_flop_ms_per_token
        x[:, _F["batched"]] = np.where(tokens > 1, self.weight_ms, 0.0)
        x[:, _F["rows"]] = rows
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
    for name in ("tokens", "batched", "rows"):  # one value only: a constant, already counted
        if mask[_F[name]] and _constant(col[name]):
            mask[_F[name]] = False
    return mask


def _fit_nnls(x: np.ndarray, t: np.ndarray, lb: np.ndarray | None = None,
              ub: np.ndarray | None = None) -> np.ndarray:
    """lb ≤ c ≤ ub (default 0 ≤ c) minimising Σ ((x·c − t) / t)²; x [n, k], t [n], lb/ub [k].

    Solved as NNLS in u = c − lb ≥ 0 (bounded least squares when an upper bound is finite).
    """
    from scipy.optimize import lsq_linear, nnls  # fitting only: a cached model never imports it

    a = x / t[:, None]  # relative error: each row weighted by 1/t
    lo = np.zeros(a.shape[1]) if lb is None else lb
    rhs = np.ones(len(t)) - a @ lo
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0  # an all-zero feature gets coefficient 0 anyway
    if ub is None or not np.isfinite(ub).any():
        u, _ = nnls(a / scale, rhs, maxiter=50 * a.shape[1])
    else:
        u = lsq_linear(a / scale, rhs, bounds=(0.0, (ub - lo) * scale), method="bvls").x
    return np.asarray(lo + u / scale)


def _sum_lower_bounds(phase: str, mask: np.ndarray) -> np.ndarray:
    """[mask.sum()] the sum form's lower bounds: a GPU feature cannot run faster than
    1 / ROOFLINE_SLACK × the measured rate (0 for const and prior-less features)."""
    return np.asarray(np.where(prior_coef(phase) > 0, 1.0 / ROOFLINE_SLACK, 0.0)[mask])


def _floor_design(tokens: np.ndarray) -> np.ndarray:
    """[n, 3] the host floor's regressors per row: 1, [B·n_query > 1], B·n_query.

    The floor is h0 + h_batched·[tokens > 1] + h_token·tokens: per-step host (or launch-latency)
    work grows with the requests in the batch, and a single-row step runs other kernels.
    """
    tok = np.asarray(tokens, dtype=float)
    return np.stack([np.ones_like(tok), (tok > 1).astype(float), tok], axis=1)


def _floor_free(z: np.ndarray, xf: np.ndarray | None = None) -> np.ndarray:
    """[3] bool: the floor regressors the rows can identify: h0 always; the others must vary,
    and the per-token slope must not be proportional to a GPU feature of xf [n, k] (sampling's
    logits are ∝ B·n_query: GPU work that a per-token floor would pass off as host time)."""
    free = np.array([True, not _constant(z[:, 1]), not _constant(z[:, 2])])
    if free[2] and xf is not None:
        tok = z[:, 2]
        free[2] = not any(_constant(xf[:, j] / tok) for j in range(xf.shape[1]))
    return free


def _sum_upper_bounds(mask: np.ndarray) -> np.ndarray:
    """[mask.sum()] the sum form's upper bounds: KERNEL_MAX for the kernel features, else ∞."""
    ub = np.array([KERNEL_MAX.get(f, np.inf) for f in FEATURES])
    return np.asarray(ub[mask])


def _max_residuals(
    p: np.ndarray, x: np.ndarray, z: np.ndarray, logt: np.ndarray, prior: np.ndarray,
) -> np.ndarray:
    """[n + k] log(max(h, g)) − log t for the points, then PRIOR_WEIGHT·φ for the priors.

    p = [a_1..a_m, φ_1..φ_k]: the floor h = z · a (ms, a ≥ 0), the GPU work g = x · c with
    c = prior · exp(φ); x [n, k] the GPU features of the free columns, z [n, m] the floor's.
    """
    m = z.shape[1]
    h = z @ p[:m]  # [n]
    g = x @ (prior * np.exp(p[m:]))  # [n]
    return np.concatenate([np.log(np.maximum(np.maximum(h, g), 1e-300)) - logt,
                           PRIOR_WEIGHT * p[m:]])


def _max_jacobian(
    p: np.ndarray, x: np.ndarray, z: np.ndarray, logt: np.ndarray, prior: np.ndarray,
) -> np.ndarray:
    """[n + k, m + k] d residual / d p (the max picks which parameters a point depends on)."""
    m = z.shape[1]
    h = z @ p[:m]  # [n]
    c = prior * np.exp(p[m:])  # [k]
    g = x @ c  # [n]
    n, k = x.shape
    jac = np.zeros((n + k, m + k))
    gpu = g > h
    jac[:n, :m] = np.where(gpu[:, None], 0.0, z / np.maximum(h, 1e-300)[:, None])
    jac[:n, m:] = np.where(gpu[:, None], x * c / np.maximum(g, 1e-300)[:, None], 0.0)
    jac[n:, m:] = PRIOR_WEIGHT * np.eye(k)
    return jac


def _solve_max(x: np.ndarray, z: np.ndarray, t: np.ndarray, prior: np.ndarray,
               p0: np.ndarray) -> np.ndarray:
    from scipy.optimize import least_squares  # fitting only (see _fit_nnls)

    m, k = z.shape[1], x.shape[1]
    # floor terms ≥ 0 (h0 > 0); each GPU coefficient within e^±MAX_FIT_LOG_RANGE of its prior
    lo = np.concatenate([[1e-9], np.zeros(m - 1), np.full(k, -MAX_FIT_LOG_RANGE)])
    hi = np.concatenate([np.full(m, np.inf), np.full(k, MAX_FIT_LOG_RANGE)])
    res = least_squares(
        _max_residuals, np.clip(p0, lo, hi), jac=_max_jacobian, args=(x, z, np.log(t), prior),
        bounds=(lo, hi), loss="soft_l1", f_scale=MAX_FIT_F_SCALE, method="trf", max_nfev=200,
    )
    return np.asarray(res.x)


def _max_cost(p: np.ndarray, x: np.ndarray, z: np.ndarray, t: np.ndarray,
              prior: np.ndarray) -> float:
    r = (_max_residuals(p, x, z, np.log(t), prior) / MAX_FIT_F_SCALE) ** 2
    return float(np.sum(np.sqrt(1.0 + r) - 1.0))  # soft-L1, up to a constant factor


def _fit_max(
    x: np.ndarray, z: np.ndarray, t: np.ndarray, prior: np.ndarray, starts: list[np.ndarray],
) -> np.ndarray:
    """Best p = [a, φ] over the starting points; x [n, k], z [n, m], t [n], prior [k] > 0."""
    best, best_cost = starts[0], math.inf
    for p0 in starts:
        p = _solve_max(x, z, t, prior, p0)
        cost = _max_cost(p, x, z, t, prior)
        if cost < best_cost:
            best, best_cost = p, cost
    return best


def _max_starts(t: np.ndarray, z: np.ndarray, k: int,
                extra: np.ndarray | None = None) -> list[np.ndarray]:
    """Starting points: h0 at the median time and the floor's slopes near 0, every φ at
    log(scale) (+ an NNLS-derived φ)."""
    h0 = float(np.median(t))
    a = np.concatenate([[h0], 1e-3 * h0 / np.maximum(z[:, 1:].max(axis=0), 1.0)])  # [m]
    out = [np.concatenate([a, np.full(k, math.log(s))]) for s in _MAX_FIT_STARTS]
    if extra is not None:
        out.append(np.concatenate([a, extra]))
    return out


@dataclass(frozen=True)
class _Group:
    """One fitted (phase, method) group: t = coef[const] + max(floor, x_gpu · coef_gpu), the
    floor = host + host_batched·[B·n_query > 1] + host_per_token·B·n_query (max form)."""

    phase: str
    method: str
    coef: np.ndarray  # [n_features], zeros where the phase has no such feature; const = s
    mask: np.ndarray  # [n_features] bool, the features this group was fitted with
    x: np.ndarray  # [n_points, n_features] design matrix of the measured points
    t: np.ndarray  # [n_points] measured ms_median
    mode: str = "sum"  # "sum" (h = 0, const fitted) or "max" (h fitted, const = 0)
    host: float = 0.0  # h0, ms
    host_batched: float = 0.0  # ms added to the floor when B·n_query > 1
    host_per_token: float = 0.0  # ms per B·n_query row added to the floor
    source: tuple[str, ...] = ()  # per feature: FITTED / PRIOR / CAPPED / "" (unused)
    host_source: str = "FITTED"
    # [n_points] int: the measured (batch, context) point each row belongs to; LOO leaves a
    # whole point out (its rows share one measurement session). None: one row per point.
    point: np.ndarray | None = None
    tokens: np.ndarray | None = None  # [n_points] B·n_query of the measured rows
    batch: np.ndarray | None = None  # [n_points] B of the measured rows
    # the fit's residual by batch (see `with_batch_residual`): measured batches [K] and the
    # median log(measured / fit) of the group's rows at each
    res_batch: np.ndarray | None = None
    res_log: np.ndarray | None = None

    def floor(self, tokens: int) -> float:
        """The host floor (ms) of one call with B·n_query = tokens."""
        return self.host + self.host_batched * (tokens > 1) + self.host_per_token * tokens

    def floors(self) -> np.ndarray:
        """[n_points] the host floor of each measured row."""
        tok = np.ones(len(self.t)) if self.tokens is None else self.tokens
        return np.asarray(_floor_design(tok) @ self.floor_terms)

    @property
    def floor_terms(self) -> np.ndarray:
        """[3] (h0, h_batched, h_per_token), the coefficients of `_floor_design`."""
        return np.array([self.host, self.host_batched, self.host_per_token])

    @property
    def serial(self) -> float:
        return float(self.coef[_F["const"]])

    @property
    def gpu_coef(self) -> np.ndarray:
        """[n_features] the coefficients of the GPU features (const zeroed)."""
        c = self.coef.copy()
        c[_F["const"]] = 0.0
        return c

    def predict_points(self) -> np.ndarray:
        """[n_points] ms the fit predicts for the measured rows (before the batch residual)."""
        return np.asarray(self.serial + np.maximum(self.floors(), self.x @ self.gpu_coef))

    def with_batch_residual(self) -> _Group:
        """This group with its residual by batch recorded (`batch_factor` applies it)."""
        if self.batch is None:
            return self
        point = np.arange(len(self.t)) if self.point is None else self.point
        res_batch, res_log = _batch_residual(self.batch, np.log(self.t / self.predict_points()),
                                             point)
        return dataclasses.replace(self, res_batch=res_batch, res_log=res_log)

    def batch_factor(self, batch: int) -> float:
        """exp(the fit's log residual at this batch): the median over the measured rows of that
        batch, linear in log B between measured batches, fading to 1 over the octave beyond
        the measured range (outside it the fitted physics alone extrapolates)."""
        if self.res_batch is None or self.res_log is None:
            return 1.0
        return math.exp(_residual_at(self.res_batch, self.res_log, batch))

    def host_bound(self) -> np.ndarray:
        """[n_points] bool: the host side (floor, or s in the sum form) exceeds the GPU work."""
        g = self.x @ self.gpu_coef
        return np.asarray(np.maximum(self.floors(), self.serial) > g)

    def loo_rel_errors(self) -> np.ndarray:
        """[n_points] |pred − t| / t, each row predicted by a fit without its whole measured
        (batch, context) point (`point`; all of that point's rows go out together: same form, the
        max form restarts from the full fit's parameters only). NaN where nothing is left."""
        n = len(self.t)
        point = np.arange(n) if self.point is None else self.point
        errs = np.full(n, np.nan)
        if len(np.unique(point)) < 2:
            return errs
        mask = self.mask
        free = _max_free(self.phase, mask)
        prior = prior_coef(self.phase)[free]
        z = _floor_design(np.ones(n) if self.tokens is None else self.tokens)
        zfree = np.array([True, self.host_batched > 0.0, self.host_per_token > 0.0])
        z = z[:, zfree]  # [n, m]
        m = z.shape[1]
        p_full = np.concatenate([self.floor_terms[zfree],
                                 np.log(np.maximum(self.coef[free], 1e-300) / prior)])
        for key in np.unique(point):
            out = point == key  # [n] the rows of the left-out point
            if self.mode == "sum":
                c = _fit_nnls(self.x[~out][:, mask], self.t[~out],
                              _sum_lower_bounds(self.phase, mask), _sum_upper_bounds(mask))
                pred = self.x[:, mask] @ c  # [n] every row, by the fit without the point
            else:
                p = _solve_max(self.x[~out][:, free], z[~out], self.t[~out], prior, p_full)
                pred = np.maximum(z @ p[:m], self.x[:, free] @ (prior * np.exp(p[m:])))
            if self.batch is not None:  # times the batch residual of the other points' rows
                rb, rl = _batch_residual(self.batch[~out], np.log(self.t[~out] / pred[~out]),
                                         point[~out])
                batches, at = np.unique(self.batch, return_inverse=True)
                pred = pred * np.exp([_residual_at(rb, rl, int(b)) for b in batches])[at]
            errs[out] = np.abs(pred[out] - self.t[out]) / self.t[out]
        return errs


def _batch_residual(batch: np.ndarray, log_res: np.ndarray, point: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(measured batches [K], log residual at each [K]): the median over that batch's
    measured points (each point's rows first reduced to their median: rows of one point are
    one measurement session), shrunk toward 0 by its standard error (soft threshold), so that
    a noisy phase (sampling, selection: ±10–20 % a point) is not bent to its noise.

    numpy, not a pandas groupby (the leave-one-out calls this a thousand times); the standard
    deviation is Welford's over the points in order of first appearance, as pandas computes
    it, so the result is the same to the bit."""
    _, first, inv = np.unique(point, return_index=True, return_inverse=True)
    in_order = np.argsort(first)  # points in order of first appearance
    r_point, b_point = _group_medians(log_res, inv)[in_order], batch[first][in_order]
    batches, b_inv = np.unique(b_point, return_inverse=True)
    med, se = _group_medians(r_point, b_inv), np.full(len(batches), np.inf)
    for i in range(len(batches)):
        r = r_point[b_inv == i]
        if len(r) > 1:  # standard error of a median: 1.2533 σ / √n
            se[i] = 1.2533 * math.sqrt(_welford_var(r.tolist())) / np.sqrt(len(r))
    return batches, np.sign(med) * np.maximum(np.abs(med) - se, 0.0)


def _group_medians(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """[n_groups] the median of `values` in each group 0..n_groups-1 (as np.median: the middle
    value, or the mean of the two middle ones)."""
    ordered = values[np.lexsort((values, group))]
    counts = np.bincount(group)
    starts = np.cumsum(counts) - counts
    return np.asarray((ordered[starts + (counts - 1) // 2] + ordered[starts + counts // 2]) / 2)


def _welford_var(values: list[float]) -> float:
    """Sample variance (ddof 1) by Welford's update, in the order given."""
    mean = m2 = 0.0
    for n, v in enumerate(values, start=1):
        old = mean
        mean += (v - old) / n
        m2 += (v - mean) * (v - old)
    return m2 / (len(values) - 1)


def _residual_at(res_batch: np.ndarray, res_log: np.ndarray, batch: int) -> float:
    """The log residual at `batch` (see _Group.batch_factor)."""
    x, xs = math.log2(batch), np.log2(res_batch)
    if xs[0] <= x <= xs[-1]:
        return float(np.interp(x, xs, res_log))
    edge, beyond = (res_log[0], xs[0] - x) if x < xs[0] else (res_log[-1], x - xs[-1])
    return float(edge) * max(0.0, 1.0 - beyond)


def _kernel_index(phase: str) -> list[int]:
    """Indices (into FEATURES) of the KERNEL_FEATURES the phase is fitted with."""
    return [_F[f] for f in KERNEL_FEATURES if f in PHASE_FEATURES[phase]]


def _max_free(phase: str, mask: np.ndarray) -> np.ndarray:
    """[n_features] bool: the GPU features the max form fits (identifiable, prior > 0)."""
    return np.asarray(mask & (prior_coef(phase) > 0))


def _sum_group(phase: str, method: str, x: np.ndarray, t: np.ndarray,
               kernel_terms: bool = True) -> _Group:
    """The sum form; kernel_terms=False leaves out KERNEL_FEATURES (roofline features only)."""
    mask = _identifiable_mask(phase, x)
    if not kernel_terms:
        mask &= ~np.isin(FEATURES, KERNEL_FEATURES)
    coef = np.zeros(len(FEATURES))
    lb = _sum_lower_bounds(phase, mask)
    coef[mask] = _fit_nnls(x[:, mask], t, lb, _sum_upper_bounds(mask))
    w = x[:, _F["batched"]]  # [n] weight_bytes / BW where B·n_query > 1
    if (kernel_terms and mask[_F["const"]] and _F["batched"] in _kernel_index(phase)
            and not mask[_F["batched"]] and w.min() > 0
            and coef[_F["const"]] <= FOLD_WEIGHT_STREAMS * w.min()):
        # every point runs the batched path (verify): a fixed cost of the size of a few weight
        # streams is GPU work of the forward pass (norms, RoPE, small kernels), so it is folded
        # into the weight-read term, as for a weight-bound GEMM: it scales with bandwidth in a
        # what-if and does not count as host time. A larger one (an eager small model) stays s.
        mask[_F["const"]], mask[_F["batched"]] = False, True
        lb = _sum_lower_bounds(phase, mask)
        coef[:] = 0.0
        coef[mask] = _fit_nnls(x[:, mask], t, lb, _sum_upper_bounds(mask))
    at_bound = np.zeros(len(FEATURES), dtype=bool)
    at_bound[mask] = (lb > 0) & (coef[mask] <= lb * (1 + 1e-9))
    source = tuple("" if not m else "BOUND" if b else "FITTED" for m, b in zip(mask, at_bound))
    return _Group(phase, method, coef, mask, x, t, "sum", source=source, host_source="FITTED")


def _max_group(phase: str, method: str, x: np.ndarray, t: np.ndarray,
               nnls_coef: np.ndarray, tokens: np.ndarray, floor_terms: bool = True) -> _Group:
    """The max form: robust, prior-regularised least squares on log error (see module doc).

    tokens [n] = B·n_query of each row (the host floor's regressor); floor_terms=False fits a
    constant floor h0 only."""
    mask = _identifiable_mask(phase, x)
    free = _max_free(phase, mask)
    prior = prior_coef(phase)[free]  # [k] > 0
    xf = x[:, free]  # [n, k]
    z = _floor_design(tokens)
    zfree = _floor_free(z, xf) if floor_terms else np.array([True, False, False])
    zf = z[:, zfree]  # [n, m]
    m = zf.shape[1]
    # an extra start from the sum fit's slopes: a GPU-bound group begins near its answer
    extra = np.log(np.maximum(nnls_coef[free], 1e-3 * prior) / prior)
    p = _fit_max(xf, zf, t, prior, _max_starts(t, zf, int(free.sum()), extra))
    terms = np.zeros(3)
    terms[zfree] = p[:m]
    h = zf @ p[:m]  # [n] the floor per row
    c = prior * np.exp(p[m:])
    g = xf @ c  # [n]
    gpu = g > h
    coef = np.zeros(len(FEATURES))
    coef[free] = c
    # data weight of each coefficient: Σ over GPU-bound points of its share of g (= the sum of
    # |d log t̂ / d φ|); it is FITTED when that outweighs the prior's PRIOR_WEIGHT
    weight = (xf[gpu] * c / g[gpu, None]).sum(axis=0) if gpu.any() else np.zeros(len(c))
    source = [""] * len(FEATURES)
    for j, f in enumerate(np.flatnonzero(free)):
        if weight[j] >= PRIOR_WEIGHT:
            source[f] = "FITTED"
        elif p[m + j] < math.log(0.9):
            source[f] = "CAPPED"
        else:
            source[f] = "PRIOR"
    host_source = "FITTED"
    if gpu.all():  # no point sits on a floor: h is not identified; no host floor then
        terms, host_source = np.zeros(3), "PRIOR"
    return _Group(phase, method, coef, mask, x, t, "max", float(terms[0]), float(terms[1]),
                  float(terms[2]), tuple(source), host_source, tokens=tokens)


def _with_host(grp: _Group, launch_ms: float) -> _Group:
    """`grp` with its host term (h in the max form, a fitted s in the sum form) = launch_ms."""
    if grp.mode == "max":
        return dataclasses.replace(grp, host=launch_ms, host_batched=0.0, host_per_token=0.0)
    if not grp.mask[_F["const"]]:
        return grp  # const folded into the GEMM: nothing separate to replace
    coef = grp.coef.copy()
    coef[_F["const"]] = launch_ms
    return dataclasses.replace(grp, coef=coef)


def _median_log_error(grp: _Group) -> float:
    return float(np.median(np.abs(np.log(np.maximum(grp.predict_points(), 1e-300) / grp.t))))


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
    group: _Group
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


# ---- the model ---------------------------------------------------------------------------


class LatencyModel:
    """Per-(phase, method) roofline fits. Build with `LatencyModel.fit` (or `from_meta`)."""

    def __init__(
        self, model: ModelSpec, measured: MeasuredGpu, groups: dict[tuple[str, str], _Group],
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
            key: _with_host(grp, launch_ms) for key, grp in groups.items()}
        self._physics = _Physics.of(model, self._gpu.copy_bandwidth_gbs, self._gpu.bf16_tflops)
        self._loo: pd.DataFrame | None = None
        # the fit's residual by batch describes the measured GPU and host: not a what-if's
        self._use_residual = what_if is None and launch_ms is None

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
    def _group(self, phase: str, method: str) -> _Group:
        for key in ((phase, method), (phase, ANY_METHOD)):
            if key in self._effective:
                return self._effective[key]
        if phase in METHOD_INDEPENDENT_PHASES and (phase, _POOLED) in self._effective:
            return self._effective[(phase, _POOLED)]
        measured = sorted({m for (p, m) in self._groups if p == phase and m != _POOLED})
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

    def batch_factor(self, grp: _Group, batch: int) -> float:
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
        flags = [grp.host_bound() for (_, m), grp in self._groups.items() if m != _POOLED]
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
            memory_gb=target.memory_gb,
        )
        return LatencyModel(self._model, self._measured, self._groups, target, scaled,
                            self._launch_ms, self._envelope)

    def without_host_overhead(self, launch_ms: float) -> LatencyModel:
        """The same model with every group's host term replaced by `launch_ms` per phase call.

        What an engine without per-kernel host overhead (CUDA-graph replay) would see: in a
        "max" group the host floor h becomes launch_ms (t = max(launch_ms, g)); in a "sum" group
        the fitted serial cost s becomes launch_ms (t = launch_ms + g). Known limit: a sum group
        whose const was folded into a weight-bound GEMM (`_identifiable_mask`) keeps that share.
        GPU terms, what-if scaling and the fits (LOO, coefficients()) are unchanged.
        """
        if not (math.isfinite(launch_ms) and launch_ms >= 0.0):
            raise UserInputError(f"launch cost must be a finite number of ms >= 0, got {launch_ms}",
                                 where="--graph-launch-ms",
                                 fix="give the per-step CUDA-graph launch cost, e.g. 0.02")
        return LatencyModel(self._model, self._measured, self._groups, self._what_if, self._gpu,
                            float(launch_ms), self._envelope)

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


def _fit_group(phys: _Physics, phase: str, method: str, rows: pd.DataFrame) -> _Group:
    """Fit one group in both forms and keep one by the SUM_MODE_MARGIN rule (module doc).

    Rows are measured points with a uniform batch (kv_read per request).
    """
    batch = rows["batch"].to_numpy(dtype=float)
    n_query = rows["n_query"].to_numpy(dtype=float)
    kv_sum = batch * rows["kv_read"].to_numpy(dtype=float)  # Σ_b kv_read_b, uniform batch
    x = phys.features(phase, batch, n_query, kv_sum, rows["collect_rows"].to_numpy(dtype=float))
    t = rows["ms_median"].to_numpy(dtype=float)
    # the form is chosen on the roofline features alone: KERNEL_FEATURES describe GPU kernels,
    # so they must not explain a host floor away (an eager runtime's ~constant step time would
    # otherwise be fitted as a weight-stream or per-token cost and extrapolate wrongly)
    tokens = batch * n_query  # [n]
    # the measured (batch, context) point of each row, for an honest leave-one-out
    _, point = np.unique(rows[["batch", "context"]].to_numpy(dtype=np.int64), axis=0,
                         return_inverse=True)
    point = np.asarray(point).reshape(-1)
    # The sum form with its (bounded) kernel features against the max form with its
    # batch-dependent floor. On floor-bound points the two are alike (a per-token GEMM cost looks
    # like a floor that grows with batch): KERNEL_MAX keeps implausible GPU costs out of the sum
    # form, and _floor_free keeps GPU features ∝ tokens out of the floor.
    roofline = dataclasses.replace(_sum_group(phase, method, x, t, kernel_terms=False),
                                   tokens=tokens)
    summed = dataclasses.replace(_sum_group(phase, method, x, t), point=point, tokens=tokens)
    maxed = _max_group(phase, method, x, t, roofline.coef, tokens)
    if maxed.host == 0.0 or (  # no point on a host floor: the sum form nests the max form
            _median_log_error(summed) <= SUM_MODE_MARGIN * _median_log_error(maxed)):
        chosen = summed
    else:
        chosen = dataclasses.replace(maxed, point=point)
    return dataclasses.replace(chosen, batch=batch).with_batch_residual()


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
