"""Metrics of engine runs, with vLLM's conventions.

- **Throughput**: generated tokens per second over the steady-state window. The window starts
  at the first decode iteration (every closed-loop user submits at t = 0, so the batch is as
  full as max batch and KV room allow from then on; a co-located prefill of the first wave
  happens before it and is excluded) and ends when the first request of the final drain leaves:
  the first departure strictly after the last admission, readmissions of preempted requests
  included (from then on nobody replaces a finished request, so the batch only shrinks). Tokens counted are those of the iterations in
  the window; the time includes co-located prefill stalls inside it. Same rule for open loops.
- **Acceptance length**: 1 + mean accepted drafts per (request, iteration), bonus included.
  Counted as the verifier accepted them, before truncation at the output length (vLLM counts
  acceptance in the rejection sampler, before max_tokens truncation).
- **Per-position rate r_i**: fraction of (request, iteration) drafts with at least i accepted.
- **TPOT** per request: (finish − first decode chunk) / (output tokens − 1), requests with > 1
  token; first decode chunk = end of the request's first decode iteration (the decode's pace,
  without the prefill's first token or the wait for admission).
- **ITL**: gaps between consecutive chunks of a request = gaps between consecutive iteration
  ends, one sample per request per iteration after its first. A preempted request's wait
  until it resumes is in its TPOT but not in the ITL samples (the gap is counted as the one
  iteration before its resumed chunk).
- **Open loop** (Poisson or trace arrivals, `Arrivals.is_open`). Two windows in time, both
  from the arrival of request ⌊``WARMUP_FRACTION``·N⌋ (the empty-system warm-up is left out).
  The *arrival period* ends at the last arrival; the *service window* ends at the later of
  the last arrival and the closed-loop rule's end (the first departure after the last
  admission: past it the batch only drains). Under light load both end near the last
  arrival; past capacity the queue keeps the batch full long after it, and the service
  window covers that busy period. Throughput is the tokens of the iterations that end in
  the service window per second of it: the *served* rate, min(offered load, capacity) —
  under light load it equals the offered load for every method, so a throughput ratio near
  1 says nothing about the method. ``served_rate``: requests finishing in the service window
  per second; ``offered_rate``: the Poisson rate or the trace's mean rate. **Saturated**:
  over the arrival period, completions fall short of arrivals by more than
  ``SATURATION_SHORTFALL`` of them and by more than twice their Poisson noise (2·√arrivals):
  the backlog grew, so the offered rate exceeds the capacity and queueing delay grows
  without bound with the horizon. Runs with fewer than two distinct arrival times use the
  closed-loop rule.
- **TTFT** per request, as engines report it: the time its first token exists (the
  prefill's own token, no draft waits for it: `engine` docstring) − arrival. Co-located:
  queueing + its prefill on the decode GPU. Disaggregated: queueing at the prefill stage +
  prefill + KV transfer + the wait for a decode slot; in a closed loop (the prefill stage
  runs ahead) the wait for decode admission + prefill + transfer. **E2E latency**: finish − arrival (+ the hand-over run
  ahead, closed loop disaggregated). Percentiles over the requests arriving in the window
  (open loop) or all requests (closed loop). **Queue length**: requests that arrived and wait
  for their first admission, time-averaged over the window (vLLM's num_requests_waiting
  without the preempted ones waiting to resume).
- **Goodput** (`Slo`): the throughput times the share of the output tokens of the requests
  finishing in the window that belong to requests meeting every SLO given (TTFT ≤
  ``ttft_ms``, TPOT ≤ ``tpot_ms``; a one-token request has no TPOT and meets that one): the
  tokens/s of good requests, ≤ the throughput, equal when all meet; NaN without an SLO.
- **Mean running batch**: running requests per iteration, averaged over the window's
  iterations (vLLM's num_requests_running, sampled per step). **Preemptions**: requests taken
  out of the running batch over the whole run. **KV peak**: most KV blocks held in one
  iteration.
"""

from __future__ import annotations

import functools
import importlib.metadata
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vegas_sim import fitcache
from vegas_sim.sim.engine import EngineResult

WARMUP_FRACTION = 0.1  # open loop: the first 10 % of arrivals warm the empty system up
SATURATION_SHORTFALL = 0.1  # open loop: completions this far below arrivals → saturated


@dataclass(frozen=True)
class Slo:
    """Service-level objectives of goodput (None: that one is not asked for)."""

    tpot_ms: float | None = None
    ttft_ms: float | None = None

    @property
    def given(self) -> bool:
        return self.tpot_ms is not None or self.ttft_ms is not None

    def met(self, ttft_ms: np.ndarray, tpot_ms: np.ndarray) -> np.ndarray:
        """[R] bool: the request meets every SLO given (NaN TPOT: one token, met)."""
        ok = np.ones(ttft_ms.shape[0], bool)
        if self.ttft_ms is not None:
            ok &= ttft_ms <= self.ttft_ms
        if self.tpot_ms is not None:
            ok &= ~(tpot_ms > self.tpot_ms)
        return ok


@dataclass(frozen=True)
class RunMetrics:
    throughput_tok_s: float
    window_ms: tuple[float, float]
    window_tokens: int
    generated_tokens: int
    acceptance_length: float
    rates: tuple[float, ...]  # r_1..r_γ (empty for vanilla)
    # tokens per running request per iteration in the steady window: what a closed batch's
    # window measures (it ends at the first finish, so it sees early iterations only)
    window_acceptance_length: float
    tpot_ms_p50: float
    tpot_ms_p90: float
    tpot_ms_p99: float
    itl_ms_p50: float
    itl_ms_p90: float
    itl_ms_p99: float
    iter_ms: float  # mean iteration time
    breakdown_ms: dict[str, float]  # mean ms per iteration by phase (+ 'prefill' if co-located)
    iterations: int
    sim_time_s: float
    wall_s: float
    mean_running_batch: float = math.nan
    preemptions: float = 0.0
    kv_peak_blocks: float = math.nan
    ttft_ms_p50: float = math.nan
    ttft_ms_p90: float = math.nan
    ttft_ms_p99: float = math.nan
    e2e_ms_p50: float = math.nan
    e2e_ms_p90: float = math.nan
    queue_len_mean: float = math.nan
    offered_rate: float = math.nan  # requests/s offered (open loop)
    served_rate: float = math.nan  # requests/s finishing in the window
    saturated: bool = False
    goodput_tok_s: float = math.nan


def steady_window(res: EngineResult) -> tuple[int, int]:
    """(first, last) global iteration of the steady-state window, inclusive (rule above)."""
    n_it = res.iterations
    last_admit = float(np.nanmax(res.admit_ms))
    if res.preemptions:  # a resumed request is readmitted: the batch refills until then
        last_admit = max(last_admit, res.last_admission_ms)
    drain = res.finish_ms > last_admit
    g_end = int(res.last_iter[drain].min()) if np.any(drain) else n_it - 1
    return 0, g_end


def weighted_percentiles(values: np.ndarray, weights: np.ndarray,
                         qs: Sequence[float]) -> list[float]:
    """Inverted-CDF percentiles (q in [0, 100]) of `values` with integer-like `weights`."""
    keep = weights > 0
    if not np.any(keep):
        return [math.nan for _ in qs]
    order = np.argsort(values[keep], kind="stable")
    v, cw = values[keep][order], np.cumsum(weights[keep][order])
    return [float(v[min(np.searchsorted(cw, q / 100.0 * cw[-1], side="left"), len(v) - 1)])
            for q in qs]


def open_window(res: EngineResult) -> tuple[float, float, float] | None:
    """(start, end of the arrival period, end of the service window) in ms of an open loop
    (rule above); None when the arrival period has no length."""
    arr = res.arrival_ms
    if not res.config.arrivals.is_open or arr.size < 2:
        return None
    t0, t_arr = float(arr[int(WARMUP_FRACTION * arr.size)]), float(arr.max())
    if not t_arr > t0:
        return None
    drain = float(res.iter_end_ms[steady_window(res)[1]])
    return t0, t_arr, max(t_arr, drain)


def _iteration_window(res: EngineResult, span: tuple[float, float, float] | None
                      ) -> tuple[int, int]:
    """(first, last) iteration of the window: the closed-loop rule, or the iterations that end
    inside the open loop's service window."""
    if span is None:
        return steady_window(res)
    ends = res.iter_end_ms
    g0 = int(np.searchsorted(ends, span[0], side="right"))
    return g0, int(np.searchsorted(ends, span[2], side="right")) - 1


def summarize(res: EngineResult, slo: Slo | None = None) -> RunMetrics:
    """The metrics of one run (goodput under ``slo`` when given)."""
    span = open_window(res)
    g0, g1 = _iteration_window(res, span)
    ends = res.iter_end_ms
    if span is None:
        span_ms = float(ends[g1] - res.iter_start_ms[g0])
        window = (float(res.iter_start_ms[g0]), float(ends[g1]))
        arrival_end = window[1]
    else:
        span_ms, window, arrival_end = span[2] - span[0], (span[0], span[2]), span[1]
    win_tokens = int(res.iter_tokens[g0: g1 + 1].sum())
    thr = win_tokens / (span_ms / 1000.0) if span_ms > 0 else math.nan
    running = int(res.iter_batch[g0: g1 + 1].sum())
    win_acc = win_tokens / running if running else math.nan

    hist = res.accepted_hist.astype(np.float64)  # [γ+1]
    draws = hist.sum()
    vanilla = res.config.is_vanilla
    acc_len = 1.0 if vanilla else 1.0 + float(np.dot(np.arange(hist.shape[0]), hist) / draws)
    # r_i = P(accepted >= i): reverse cumulative sum of the histogram, i = 1..γ
    rates = () if vanilla else tuple(float(x) for x in (np.cumsum(hist[::-1])[::-1][1:] / draws))

    multi = res.output_len > 1
    with np.errstate(divide="ignore", invalid="ignore"):  # one-token requests: NaN
        tpot_all = (res.finish_ms - res.first_token_ms) / (res.output_len - 1.0)
    tpot_all[~multi] = math.nan
    tpot = tpot_all[multi]
    tp = np.percentile(tpot, [50, 90, 99]) if tpot.size else np.full(3, math.nan)
    gaps = np.diff(ends)  # [I-1] gap before iteration g+1's chunk
    itl = weighted_percentiles(gaps, (res.iter_batch - res.iter_new)[1:], (50, 90, 99))

    breakdown = dict(res.breakdown_ms)
    if res.config.prefill == "co-located" and res.iterations:
        breakdown["prefill"] = res.prefill_ms_total / res.iterations
    return RunMetrics(
        throughput_tok_s=thr, window_ms=window,
        window_tokens=win_tokens, generated_tokens=int(res.iter_tokens.sum()),
        acceptance_length=acc_len, rates=rates, window_acceptance_length=win_acc,
        tpot_ms_p50=float(tp[0]), tpot_ms_p90=float(tp[1]), tpot_ms_p99=float(tp[2]),
        itl_ms_p50=itl[0], itl_ms_p90=itl[1], itl_ms_p99=itl[2],
        iter_ms=float(res.iter_ms.mean()), breakdown_ms=breakdown, iterations=res.iterations,
        sim_time_s=res.sim_time_ms / 1000.0, wall_s=res.wall_s,
        mean_running_batch=running / (g1 - g0 + 1) if g1 >= g0 else math.nan,
        preemptions=float(res.preemptions),
        kv_peak_blocks=float(res.iter_kv_blocks.max()) if res.iterations else 0.0,
        **_serving_metrics(res, window, arrival_end, span is not None, tpot_all,
                           slo or Slo(), thr),
    )


def _serving_metrics(res: EngineResult, window: tuple[float, float], arrival_end: float,
                     open_loop: bool, tpot: np.ndarray, slo: Slo,
                     throughput: float) -> dict[str, Any]:
    """TTFT, E2E, queue length, offered/served rates, saturation and goodput (rules above)."""
    t0, t1 = window
    seconds = (t1 - t0) / 1000.0
    arr, fin = res.arrival_ms, res.finish_ms
    first = res.first_output_ms if res.first_output_ms.size else res.first_token_ms
    ahead = res.handoff_ms if res.handoff_ms.size else 0.0
    ttft, e2e = first - arr + ahead, fin - arr + ahead
    pick = arr >= t0 if open_loop else np.ones(arr.shape[0], bool)
    tt = np.percentile(ttft[pick], [50, 90, 99]) if pick.any() else np.full(3, math.nan)
    ee = np.percentile(e2e[pick], [50, 90]) if pick.any() else np.full(2, math.nan)
    queued = res.queued_ms if res.queued_ms.size else arr  # joined this instance's queue
    waited = np.clip(np.minimum(res.admit_ms, t1) - np.maximum(queued, t0), 0.0, None)
    done = (fin > t0) & (fin <= t1)
    served = float(done.sum())
    arrived = float(((arr > t0) & (arr <= arrival_end)).sum())
    shortfall = arrived - float(((fin > t0) & (fin <= arrival_end)).sum())
    saturated = open_loop and shortfall > max(SATURATION_SHORTFALL * arrived,
                                              2.0 * math.sqrt(arrived))
    good = math.nan
    finished_tokens = float(res.output_len[done].sum())
    if slo.given and finished_tokens > 0:
        ok = done & slo.met(ttft, tpot)
        good = throughput * float(res.output_len[ok].sum()) / finished_tokens
    return {
        "ttft_ms_p50": float(tt[0]), "ttft_ms_p90": float(tt[1]), "ttft_ms_p99": float(tt[2]),
        "e2e_ms_p50": float(ee[0]), "e2e_ms_p90": float(ee[1]),
        "queue_len_mean": float(waited.sum()) / (t1 - t0) if t1 > t0 else math.nan,
        "offered_rate": res.config.arrivals.offered_rate_per_s() if open_loop else math.nan,
        "served_rate": served / seconds if seconds > 0 else math.nan,
        "saturated": bool(saturated), "goodput_tok_s": good,
    }


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): Student-t confidence interval over replications.

    One value: the interval is that value (no spread can be estimated); identical values give
    a zero-width interval.
    """
    x = np.asarray(values, dtype=np.float64)
    m = float(x.mean())
    if x.size < 2:
        return m, m, m
    half = float(t_quantile(x.size - 1, 0.5 + level / 2) * x.std(ddof=1) / math.sqrt(x.size))
    return m, m - half, m + half


@functools.lru_cache(maxsize=64)
def t_quantile(dof: int, p: float) -> float:
    """scipy's Student-t quantile (`scipy.special.stdtrit`), kept in the fit cache under the
    installed scipy's version: importing scipy.special is a large share of a warm predict
    that needs nothing else from scipy (scipy.stats would cost more; docs/RESULTS.md,
    Simulator)."""

    def compute() -> float:
        from scipy.special import stdtrit

        return float(stdtrit(dof, p))

    ident = {"dof": dof, "p": p, "scipy": importlib.metadata.version("scipy")}
    return float(fitcache.cached(fitcache.key("student-t quantile", ident, ()), compute))
