"""Closed-form throughput for a fixed batch (fast sweeps; cross-check of the engine).

Setting: B requests always running (closed loop, a finished request is replaced at once), each
starting at context C and generating L tokens; per iteration a request accepts i.i.d. drafts
with per-position rates r_1..r_γ, so its acceptance length A ∈ {1..γ+1} has
P(A = k+1) = r_k − r_{k+1} (r_0 = 1, r_{γ+1} = 0).

- Iterations per request N(L): the renewal function m(L) = E[N(L)], with m(x) = 0 for x ≤ 0 and
  m(x) = 1 + Σ_k P(A = k) m(x − k). This *truncates at the output*: the last iteration's extra
  accepted tokens are discarded.
- Tokens per iteration = B · L / m(L) (renewal–reward: each slot yields L tokens per m(L)
  iterations on average).
- Iteration time = cost at the batch's average context over the generation. Context at a
  request's j-th iteration is C + (tokens so far); averaged over iterations that is
  C + (L − L/m(L)) / 2 (exact for deterministic acceptance). ``integrate=True`` instead averages
  the cost over the context growth with Gauss–Legendre nodes (all B requests at the same
  context, as in lockstep), which matters when the cost is not linear in context (e.g. the
  draft budget floor).
- Throughput = tokens per iteration / iteration time.
- **KV-limited batch** (`kv_limited_batch`). When the KV cache cannot hold B requests at
  once, vLLM-style admission keeps it about full, so the mean running batch is
  capacity ÷ the KV a running request holds on average. A request's KV grows from C to
  C + L over its life and a running request is caught at a uniformly random point of it,
  weighted by its length, so its mean is C + E[L²] / (2·E[L]) tokens (= C + L/2 for a fixed
  L; (1 + CV²)·E[L]/2 for a distribution), plus the step's slack and half a block of
  rounding. The batch is then min(B, that quotient), fractional (the cost is interpolated
  between the neighbouring integer batches). What it leaves out: preemption's recompute
  time and the fluctuation of the batch around its mean, so it is optimistic when KV binds;
  the sim engine models both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vegas_sim.sim.engine import CostFn

EXACT_MAX_LEN = 20_000  # beyond this, m(L) is extended linearly (renewal theorem): error < 1 iter


@dataclass(frozen=True)
class AnalyticResult:
    throughput_tok_s: float
    iter_ms: float
    tokens_per_iter: float
    acceptance_length: float  # untruncated mean, bonus included: 1 + Σ r_i
    iterations_per_request: float  # m(L)


def length_pmf(rates: np.ndarray) -> np.ndarray:
    """[γ+1] P(acceptance length = k+1), k = 0..γ, from per-position rates r_1..r_γ."""
    r = np.concatenate([[1.0], np.asarray(rates, dtype=np.float64), [0.0]])  # [γ+2]
    pmf = np.clip(r[:-1] - r[1:], 0.0, None)
    return pmf / pmf.sum()


def expected_iterations(rates: np.ndarray, output_len: int) -> float:
    """m(L): expected iterations for one request to produce `output_len` tokens."""
    pmf = length_pmf(rates)  # pmf[k] = P(A = k + 1)
    mean = float(np.dot(np.arange(1, pmf.shape[0] + 1), pmf))
    n = min(output_len, EXACT_MAX_LEN)
    m = [0.0] * (n + 1)
    steps = [(k + 1, float(p)) for k, p in enumerate(pmf) if p > 0]
    for x in range(1, n + 1):
        m[x] = 1.0 + sum(p * m[x - a] for a, p in steps if x > a)
    return m[n] + (output_len - n) / mean


def kv_limited_batch(batch: int, capacity_tokens: int, context: int, mean_output: float,
                     output_second_moment: float, slack: int, block: int) -> float:
    """Mean running batch the KV cache holds (module docstring); ``batch`` when it holds all."""
    per_request = (context + output_second_moment / (2.0 * mean_output) + slack
                   + (block - 1) / 2.0)
    return float(min(float(batch), max(capacity_tokens / per_request, 1.0)))


def analytic_throughput(
    cost: CostFn,
    rates: np.ndarray,
    batch: float,
    context: int,
    output_len: int,
    *,
    integrate: bool = False,
    points: int = 8,
) -> AnalyticResult:
    """Steady-state throughput of B always-running requests (see module docstring).

    ``rates`` is empty for vanilla (one token per iteration). A fractional ``batch`` (the
    KV-limited mean) interpolates the iteration cost between the neighbouring integers.
    """
    rates = np.asarray(rates, dtype=np.float64)
    iters = expected_iterations(rates, output_len)
    per_iter = output_len / iters  # tokens per request per iteration, truncation included
    growth = output_len - per_iter  # context gained between the first and last iteration
    if integrate:
        nodes, weights = np.polynomial.legendre.leggauss(points)  # on [-1, 1]
        u = (nodes + 1.0) / 2.0
        times = [_cost_at(cost, batch, context + x * growth) for x in u]
        iter_ms = float(np.dot(weights, times) / 2.0)
    else:
        iter_ms = _cost_at(cost, batch, context + growth / 2)
    tokens = batch * per_iter
    return AnalyticResult(
        throughput_tok_s=tokens / (iter_ms / 1000.0), iter_ms=iter_ms, tokens_per_iter=tokens,
        acceptance_length=1.0 + float(rates.sum()), iterations_per_request=iters,
    )


def _cost_at(cost: CostFn, batch: float, context: float) -> float:
    """Cost of B requests at a fractional context (and batch): linear between the
    neighbouring integers."""
    b_lo = math.floor(batch)
    if batch != b_lo:
        w = batch - b_lo
        lo_part = _cost_at(cost, b_lo, context) if b_lo >= 1 else 0.0
        return (1.0 - w) * lo_part + w * _cost_at(cost, b_lo + 1, context)
    return _cost_at_int(cost, int(batch), context)


def _cost_at_int(cost: CostFn, batch: int, context: float) -> float:
    lo = math.floor(context)
    frac = context - lo
    t_lo = float(cost(np.full(batch, lo, np.int64)))
    if frac == 0.0:
        return t_lo
    return (1.0 - frac) * t_lo + frac * float(cost(np.full(batch, lo + 1, np.int64)))
