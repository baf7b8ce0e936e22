"""Fitting one (phase, method) group of the latency model (`fit_group`): the non-negative least
squares of the sum form, the max form's robust fit from several starts, the host floor, and
the priors that hold a coefficient the data cannot identify near physics. The features are in
`latency_features`; the model and its predictions in `latency`."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from vegas_sim.errors import TraceSetError
from vegas_sim.methods import (
    PHASES,
    window_kv_read,
)
from vegas_sim.sim.latency_features import (
    FEATURE_INDEX,
    FEATURES,
    FOLD_WEIGHT_STREAMS,
    GRAPHED_PHASES,
    KERNEL_FEATURES,
    KERNEL_MAX,
    LATENCY_WHERE,
    MAX_FIT_F_SCALE,
    MAX_FIT_LOG_RANGE,
    MAX_FIT_STARTS,
    PHASE_FEATURES,
    PRIOR_WEIGHT,
    REQUIRED_COLUMNS,
    ROOFLINE_SLACK,
    SUM_MODE_MARGIN,
    TILE_FEATURES,
    Physics,
    constant_feature,
    feature_mask,
    prior_coef,
)


def identifiable_mask(phase: str, x: np.ndarray) -> np.ndarray:
    """The phase's features minus those the group's points cannot separate from another.

    Collinear pairs would get an arbitrary split, which only matters for a what-if (the two
    sides scale differently), so the rule is fixed and physical:
    - GEMM never leaves the weight-bound regime (small batch) → no separate const: the fixed
      overhead is folded into the weight-read term and scales with bandwidth in a what-if.
    - one n_query only, or collected rows = n_query → no attn term (attention counted as
      memory-bound reads).
    - one collect_rows only → collect folded into kv (select: rank folded into collect).
    """
    mask = feature_mask(phase)
    col = {name: x[:, i] for i, name in enumerate(FEATURES)}
    if mask[FEATURE_INDEX["gemm"]] and constant_feature(col["gemm"]):
        mask[FEATURE_INDEX["const"]] = False
    if mask[FEATURE_INDEX["attn"]] and mask[FEATURE_INDEX["kv"]] and constant_feature(col["attn"] / np.maximum(col["kv"], 1e-300)):
        mask[FEATURE_INDEX["attn"]] = False
    if mask[FEATURE_INDEX["attn"]] and mask[FEATURE_INDEX["collect"]] and constant_feature(
            col["attn"] / np.maximum(col["collect"], 1e-300)):
        mask[FEATURE_INDEX["attn"]] = False  # rows collected = n_query (specextend, vegas-all)
    if mask[FEATURE_INDEX["collect"]] and mask[FEATURE_INDEX["kv"]] and constant_feature(
            col["collect"] / np.maximum(col["kv"], 1e-300)):
        mask[FEATURE_INDEX["collect"]] = False
    if mask[FEATURE_INDEX["rank"]] and mask[FEATURE_INDEX["collect"]] and constant_feature(
            col["rank"] / np.maximum(col["collect"], 1e-300)):
        mask[FEATURE_INDEX["rank"]] = False
    for name in TILE_FEATURES:  # every point (or none) on that M tile: the kv feature's
        if mask[FEATURE_INDEX[name]] and constant_feature(
                col[name] / np.maximum(col["kv"], 1e-300)):
            mask[FEATURE_INDEX[name]] = False
    if mask[FEATURE_INDEX["per_request"]] and constant_feature(  # one batch only: it is kv
            col["per_request"] / np.maximum(col["kv"], 1e-300)):
        mask[FEATURE_INDEX["per_request"]] = False
    for name in ("tokens", "batched", "rows"):  # one value only: a constant, already counted
        if mask[FEATURE_INDEX[name]] and constant_feature(col[name]):
            mask[FEATURE_INDEX[name]] = False
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
    free = np.array([True, not constant_feature(z[:, 1]), not constant_feature(z[:, 2])])
    if free[2] and xf is not None:
        tok = z[:, 2]
        free[2] = not any(constant_feature(xf[:, j] / tok) for j in range(xf.shape[1]))
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
    out = [np.concatenate([a, np.full(k, math.log(s))]) for s in MAX_FIT_STARTS]
    if extra is not None:
        out.append(np.concatenate([a, extra]))
    return out


@dataclass(frozen=True)
class FittedGroup:
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
        return float(self.coef[FEATURE_INDEX["const"]])

    @property
    def gpu_coef(self) -> np.ndarray:
        """[n_features] the coefficients of the GPU features (const zeroed)."""
        c = self.coef.copy()
        c[FEATURE_INDEX["const"]] = 0.0
        return c

    def predict_points(self) -> np.ndarray:
        """[n_points] ms the fit predicts for the measured rows (before the batch residual)."""
        return np.asarray(self.serial + np.maximum(self.floors(), self.x @ self.gpu_coef))

    def with_batch_residual(self) -> FittedGroup:
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
    a noisy phase (sampling, selection) is not bent to its noise.

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
    """The log residual at `batch` (see FittedGroup.batch_factor)."""
    x, xs = math.log2(batch), np.log2(res_batch)
    if xs[0] <= x <= xs[-1]:
        return float(np.interp(x, xs, res_log))
    edge, beyond = (res_log[0], xs[0] - x) if x < xs[0] else (res_log[-1], x - xs[-1])
    return float(edge) * max(0.0, 1.0 - beyond)


def _kernel_index(phase: str) -> list[int]:
    """Indices (into FEATURES) of the KERNEL_FEATURES the phase is fitted with."""
    return [FEATURE_INDEX[f] for f in KERNEL_FEATURES if f in PHASE_FEATURES[phase]]


def _max_free(phase: str, mask: np.ndarray) -> np.ndarray:
    """[n_features] bool: the GPU features the max form fits (identifiable, prior > 0)."""
    return np.asarray(mask & (prior_coef(phase) > 0))


def sum_group(phase: str, method: str, x: np.ndarray, t: np.ndarray,
               kernel_terms: bool = True) -> FittedGroup:
    """The sum form; kernel_terms=False leaves out KERNEL_FEATURES (roofline features only)."""
    mask = identifiable_mask(phase, x)
    if not kernel_terms:
        mask &= ~np.isin(FEATURES, KERNEL_FEATURES)
    coef = np.zeros(len(FEATURES))
    lb = _sum_lower_bounds(phase, mask)
    coef[mask] = _fit_nnls(x[:, mask], t, lb, _sum_upper_bounds(mask))
    w = x[:, FEATURE_INDEX["batched"]]  # [n] weight_bytes / BW where B·n_query > 1
    if (kernel_terms and mask[FEATURE_INDEX["const"]] and FEATURE_INDEX["batched"] in _kernel_index(phase)
            and not mask[FEATURE_INDEX["batched"]] and w.min() > 0
            and coef[FEATURE_INDEX["const"]] <= FOLD_WEIGHT_STREAMS * w.min()):
        # every point runs the batched path (verify): a fixed cost of the size of a few weight
        # streams is GPU work of the forward pass (norms, RoPE, small kernels), so it is folded
        # into the weight-read term, as for a weight-bound GEMM: it scales with bandwidth in a
        # what-if and does not count as host time. A larger one (an eager small model) stays s.
        mask[FEATURE_INDEX["const"]], mask[FEATURE_INDEX["batched"]] = False, True
        lb = _sum_lower_bounds(phase, mask)
        coef[:] = 0.0
        coef[mask] = _fit_nnls(x[:, mask], t, lb, _sum_upper_bounds(mask))
    at_bound = np.zeros(len(FEATURES), dtype=bool)
    at_bound[mask] = (lb > 0) & (coef[mask] <= lb * (1 + 1e-9))
    source = tuple("" if not m else "BOUND" if b else "FITTED" for m, b in zip(mask, at_bound))
    return FittedGroup(phase, method, coef, mask, x, t, "sum", source=source, host_source="FITTED")


def _max_group(phase: str, method: str, x: np.ndarray, t: np.ndarray,
               nnls_coef: np.ndarray, tokens: np.ndarray, floor_terms: bool = True) -> FittedGroup:
    """The max form: robust, prior-regularised least squares on log error (see module doc).

    tokens [n] = B·n_query of each row (the host floor's regressor); floor_terms=False fits a
    constant floor h0 only."""
    mask = identifiable_mask(phase, x)
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
    return FittedGroup(phase, method, coef, mask, x, t, "max", float(terms[0]), float(terms[1]),
                  float(terms[2]), tuple(source), host_source, tokens=tokens)


def with_host(grp: FittedGroup, launch_ms: float) -> FittedGroup:
    """`grp` with its host term (h in the max form, a fitted s in the sum form) = launch_ms."""
    if grp.mode == "max":
        return dataclasses.replace(grp, host=launch_ms, host_batched=0.0, host_per_token=0.0)
    if not grp.mask[FEATURE_INDEX["const"]]:
        return grp  # const folded into the GEMM: nothing separate to replace
    coef = grp.coef.copy()
    coef[FEATURE_INDEX["const"]] = launch_ms
    return dataclasses.replace(grp, coef=coef)


def _median_log_error(grp: FittedGroup) -> float:
    return float(np.median(np.abs(np.log(np.maximum(grp.predict_points(), 1e-300) / grp.t))))


def validate_latency_rows(latency: pd.DataFrame) -> pd.DataFrame:
    missing = [c for c in REQUIRED_COLUMNS if c not in latency.columns]
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


def fit_group(phys: Physics, phase: str, method: str, rows: pd.DataFrame,
              graphed: bool = False) -> FittedGroup:
    """Fit one group in both forms and keep one by the SUM_MODE_MARGIN rule (module doc).

    Rows are measured points with a uniform batch (kv_read per request); `graphed`: the set
    replayed GRAPHED_PHASES from CUDA graphs, whose max-form floor is then a constant.
    """
    batch = rows["batch"].to_numpy(dtype=float)
    n_query = rows["n_query"].to_numpy(dtype=float)
    kv_sum = batch * rows["kv_read"].to_numpy(dtype=float)  # Σ_b kv_read_b, uniform batch
    window_sum = None
    if phys.window:  # a hybrid model's window layers read min(W + n_query − 1, C + n_query)
        window_sum = batch * window_kv_read(
            phys.window, rows["context"].to_numpy(dtype=np.int64),
            rows["n_query"].to_numpy(dtype=np.int64)).astype(float)
    x = phys.features(phase, batch, n_query, kv_sum, rows["collect_rows"].to_numpy(dtype=float),
                      window_sum)
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
    roofline = dataclasses.replace(sum_group(phase, method, x, t, kernel_terms=False),
                                   tokens=tokens)
    summed = dataclasses.replace(sum_group(phase, method, x, t), point=point, tokens=tokens)
    maxed = _max_group(phase, method, x, t, roofline.coef, tokens,
                       floor_terms=not (graphed and phase in GRAPHED_PHASES))
    if maxed.host == 0.0 or (  # no point on a host floor: the sum form nests the max form
            _median_log_error(summed) <= SUM_MODE_MARGIN * _median_log_error(maxed)):
        chosen = summed
    else:
        chosen = dataclasses.replace(maxed, point=point)
    return dataclasses.replace(chosen, batch=batch).with_batch_residual()
