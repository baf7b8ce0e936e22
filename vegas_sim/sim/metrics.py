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
- **TPOT** per request: (finish − first token) / (output tokens − 1), requests with > 1 token;
  first token = end of the request's first iteration (its first streamed chunk).
- **ITL**: gaps between consecutive chunks of a request = gaps between consecutive iteration
  ends, one sample per request per iteration after its first. A preempted request's wait
  until it resumes is in its TPOT but not in the ITL samples (the gap is counted as the one
  iteration before its resumed chunk).
- **Mean running batch**: running requests per iteration, averaged over the window's
  iterations (vLLM's num_requests_running, sampled per step). **Preemptions**: requests taken
  out of the running batch over the whole run. **KV peak**: most KV blocks held in one
  iteration.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vegas_sim.sim.engine import EngineResult


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


def summarize(res: EngineResult) -> RunMetrics:
    """The metrics of one run."""
    g0, g1 = steady_window(res)
    ends = res.iter_end_ms
    span_ms = float(ends[g1] - res.iter_start_ms[g0])
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
    tpot = (res.finish_ms - res.first_token_ms)[multi] / (res.output_len[multi] - 1)
    tp = np.percentile(tpot, [50, 90, 99]) if tpot.size else np.full(3, math.nan)
    gaps = np.diff(ends)  # [I-1] gap before iteration g+1's chunk
    itl = weighted_percentiles(gaps, (res.iter_batch - res.iter_new)[1:], (50, 90, 99))

    breakdown = dict(res.breakdown_ms)
    if res.config.prefill == "co-located" and res.iterations:
        breakdown["prefill"] = res.prefill_ms_total / res.iterations
    return RunMetrics(
        throughput_tok_s=thr, window_ms=(float(res.iter_start_ms[g0]), float(ends[g1])),
        window_tokens=win_tokens, generated_tokens=int(res.iter_tokens.sum()),
        acceptance_length=acc_len, rates=rates, window_acceptance_length=win_acc,
        tpot_ms_p50=float(tp[0]), tpot_ms_p90=float(tp[1]), tpot_ms_p99=float(tp[2]),
        itl_ms_p50=itl[0], itl_ms_p90=itl[1], itl_ms_p99=itl[2],
        iter_ms=float(res.iter_ms.mean()), breakdown_ms=breakdown, iterations=res.iterations,
        sim_time_s=res.sim_time_ms / 1000.0, wall_s=res.wall_s,
        mean_running_batch=running / (g1 - g0 + 1) if g1 >= g0 else math.nan,
        preemptions=float(res.preemptions),
        kv_peak_blocks=float(res.iter_kv_blocks.max()) if res.iterations else 0.0,
    )


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): Student-t confidence interval over replications.

    One value: the interval is that value (no spread can be estimated); identical values give
    a zero-width interval.
    """
    x = np.asarray(values, dtype=np.float64)
    m = float(x.mean())
    if x.size < 2:
        return m, m, m
    # The Student-t quantile from scipy.special: importing scipy.stats would cost ~0.4 s of
    # every CLI start.
    from scipy.special import stdtrit

    half = float(stdtrit(x.size - 1, 0.5 + level / 2) * x.std(ddof=1) / math.sqrt(x.size))
    return m, m - half, m + half
