"""The library API behind ``vegas-sim predict``: scenarios in, one table row per scenario out.

    >>> table = predict([Scenario("vegas", 7, 0.07, batch=4, context=32768, output_len=1024)],
    ...                 latency, acceptance)                                # doctest: +SKIP

Each scenario runs ``replications`` times (seeds spawned from ``seed`` by
``np.random.SeedSequence``); vanilla at the same batch/context/output/arrivals runs with the same
seeds (common random numbers), so the speedup's confidence interval is over per-replication
ratios. Everything here is module-level and takes plain picklable arguments, so it can run in a
process pool or on Dask.

Defaults and rules:
- ``requests`` None → closed loop: 4 × batch (four waves of a full batch: enough for a steady
  state, since every user resubmits at once). Open loop (Poisson): max(200, 20 × batch). The
  open-loop window drops the first 10 % of arrivals and ends at the last one
  (`metrics`), so 200 requests leave 180 in it: the served rate's Poisson noise is then
  1/√180, small against the 10 % shortfall (and 2√n noise) that flags saturation, and
  20 × batch lets the batch turn over 20 times. A saturated run serves its requests at the
  capacity for the whole horizon, so these counts also bound predict's time
  (docs/RESULTS.md, Simulator). A trace's requests are its arrival times.
- Open loop (Poisson arrivals): the rows' throughput is the served rate (min(offered,
  capacity)), so under light load the throughput ratio is ≈ 1 for every method;
  ``tpot_speedup`` (vanilla TPOT p50 / the method's, paired per replication) is the
  latency gain there. Rows add TTFT (queueing included), E2E, the queue length, the offered
  and served rates and ``saturated`` (metrics docstring). The analytic engine is sim-only
  for open loops: it is refused (its closed form has no queue); use the sim engine.
- SLOs (``slo_tpot_ms``, ``slo_ttft_ms``): ``goodput_tok_s``, output tokens per second of the
  requests that meet them (`metrics.Slo`). The analytic engine's requests are all alike: its
  goodput is its throughput when its TPOT and TTFT (one iteration: a closed loop does not
  queue) meet the SLOs, else 0.
- ``kv_capacity_tokens`` None → (share of GPU memory − resident weight bytes in the latency
  model's weight format − sliding-window blocks) / full-attention KV bytes per token, GPU
  memory from the latency model's GPU (the what-if target's datasheet memory for a what-if).
  Sliding-window layers hold only their window (vLLM's hybrid KV cache manager), reserved for
  ``batch`` requests. No activation or fragmentation reserve is subtracted. The engine uses
  it in whole blocks of ``kv_block_size`` tokens and admits/preempts as vLLM V1 does (see
  `engine`); ``batch`` is the maximum number of running sequences (vLLM's max_num_seqs). A
  scenario is refused only when one request — prompt + its longest output + γ + 1 — cannot
  fit the cache alone.
- ``output_dist`` None → every request generates ``output_len`` tokens; else the draws come
  from it (``output_len`` is then its mean, used for the acceptance lookup and the analytic
  engine). A lognormal is clipped to the model's positions left after the prompt.
- Recompute of a preempted request costs one prefill of its prompt + generated tokens on the
  decode instance, timed like co-located prefill (below), in both prefill modes.
- The analytic engine under a binding KV cache runs at the mean running batch the cache
  holds (`analytic.kv_limited_batch`); preemption's recompute time is not in it.
- Co-located prefill: one request's prefill time is the latency model's 'prefill' phase at
  n_query = kv_read = input length when the trace set measured it, else a roofline estimate
  (``roofline_prefill_ms``); the admitted requests are prefilled one after another.
- Acceptance follows each request's running context (prompt + generated so far): looked up
  at the prompt, and again each time the context doubles (`acceptance_dist.running_stages`,
  `RunningLengthDist`); a request enters the next stage at the iteration its generated
  tokens reach it.
- Roofline columns (``roofline_*``, ``verify_compute_batch``; `sim.roofline`): the iteration's
  bound from its bytes and FLOPs at the latency model's GPU rates, at the mean running batch
  with every request halfway through its output, beside the latency model's own prediction at
  that point.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from vegas_sim.bounds import check_options, check_simulated_requests
from vegas_sim.errors import TraceSetError, UserInputError
from vegas_sim.methods import MIN_TOKENS, PHASES, VANILLA, drafts
from vegas_sim.models import ModelSpec
from vegas_sim.progress import Progress
from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.acceptance_dist import AcceptanceDist, RunningLengthDist, running_stages
from vegas_sim.sim.analytic import analytic_throughput, kv_limited_batch
from vegas_sim.sim.anchored import AnchoredAcceptance
from vegas_sim.sim.engine import EngineConfig, Lengths, PrefillFn, simulate
from vegas_sim.sim.kv_selection import kv_selection_columns
from vegas_sim.sim.latency import IterationCost, LatencyModel, sampling_mode
from vegas_sim.sim.metrics import RunMetrics, mean_ci, summarize
from vegas_sim.sim.roofline import roofline_columns
from vegas_sim.sim.scenario import (
    Scenario,
    gpu_memory,
    kv_slack,
    resolve_output,
    scenario_kv_capacity,
    validate_scenario,
    weight_format_of,
)
from vegas_sim.sim.uncertainty import interval_columns

ENGINES = ("sim", "analytic")


# ---------------------------------------------------------------------------- prefill
def roofline_prefill_ms(model: ModelSpec, bandwidth_gbs: float, tflops: float,
                        input_len: int) -> float:
    """Roofline time of prefilling one prompt: GEMMs (the weights the prompt's tokens touch
    read once, 2·active params·L FLOPs) plus causal attention (L²/2 query-key pairs; min(W,
    L/2) on a sliding-window layer) and writing the prompt's KV, each max(bytes/BW,
    FLOPs/rate). No fixed overhead: a lower bound, used only when prefill was not traced."""
    bw, fl = bandwidth_gbs * 1e9, tflops * 1e12
    gemm = max(model.weight_bytes(input_len) / bw, model.gemm_flops(input_len) / fl)
    window_share = model.n_window_layers / model.n_layers
    attn_flops = ((1.0 - window_share) * model.attn_flops(input_len, input_len / 2.0)
                  + window_share * model.attn_flops(input_len,
                                                    min(model.sliding_window, input_len / 2.0)))
    attn = max(input_len * model.kv_bytes_per_token() / bw, attn_flops / fl)
    return 1000.0 * (gemm + attn)


@dataclass(frozen=True)
class _PrefillTime:
    """Prefill time of a list of prompts, prefilled one after another (picklable)."""

    latency: LatencyModel
    method: str
    traced: bool

    def __call__(self, input_lens: np.ndarray) -> float:
        return float(sum(self.one(int(n)) for n in input_lens))

    def one(self, n: int) -> float:
        if self.traced:
            return self.latency.phase_ms("prefill", self.method, n, np.array([n], np.int64))
        gpu = self.latency.gpu
        return (roofline_prefill_ms(self.latency.gpu_model, gpu.copy_bandwidth_gbs,
                                    gpu.bf16_tflops, n)
                + self.latency.comm_ms("prefill", n)[0])


def prefill_fn(latency: LatencyModel, method: str) -> PrefillFn:
    """The co-located prefill time: traced 'prefill' phase if present, else the roofline."""
    try:
        latency.phase_ms("prefill", method, 1, np.array([1], np.int64))
        traced = True
    except TraceSetError:
        traced = False
    return _PrefillTime(latency, method, traced)


# ---------------------------------------------------------------------------- running
def engine_config(sc: Scenario, kv_capacity_tokens: int | None,
                  model: ModelSpec | None = None) -> EngineConfig:
    return EngineConfig(
        method=sc.method, gamma=sc.gamma, max_batch=sc.batch, n_requests=sc.n_requests,
        lengths=Lengths(sc.context, sc.output_len, output=sc.output_dist),
        arrivals=sc.arrival, kv_capacity_tokens=kv_capacity_tokens,
        prefill=sc.prefill, kv_block_size=sc.kv_block_size, prefill_gpus=sc.prefill_gpus,
        kv_transfer_ms_per_token=0.0 if model is None else transfer_ms_per_token(sc, model),
    )


def transfer_ms_per_token(sc: Scenario, model: ModelSpec) -> float:
    """ms to move one prompt token's KV (its full-attention layers' K and V) from the prefill
    GPU to the decode GPU over `kv_link_gbs`; 0 when co-located."""
    if sc.prefill != "disaggregated":
        return 0.0
    return model.full_kv_bytes_per_token() / (sc.kv_link_gbs * 1e9) * 1e3


def ttft_includes(sc: Scenario) -> str:
    """What a row's TTFT is made of, in words (the `ttft_includes` column)."""
    if sc.prefill == "co-located":
        return "queueing + the prompt's prefill on the decode GPU (the prefill's token)"
    gpus = f"{sc.prefill_gpus} prefill GPU" + ("s" if sc.prefill_gpus > 1 else "")
    hand = f"prefill on {gpus} + KV transfer at {sc.kv_link_gbs:g} GB/s"
    if sc.is_open_loop:
        return (f"queueing at the prefill stage + {hand} + the wait for a decode slot "
                f"(the prefill's token)")
    return (f"the wait for decode admission + {hand}, the prefill run ahead of the decode "
            f"(closed loop; the prefill's token)")


def iteration_cost(latency: LatencyModel, sc: Scenario) -> IterationCost:
    """The scenario's iteration cost (an unresolved budget floor is the default one)."""
    floor = MIN_TOKENS if sc.min_tokens is None else sc.min_tokens
    return latency.for_temperature(sc.temperature).iteration_cost(sc.method, sc.gamma,
                                                                  sc.sparsity, floor)


def _dist(acceptance: AcceptanceModel, sc: Scenario) -> AcceptanceDist | None:
    if not drafts(sc.method):
        return None
    # Acceptance rises along a generation (the traces' later iterations accept more), so the
    # traced runs are cut to the iterations a request of this output length runs; it follows
    # the request's running context (prompt + generated), a lookup per doubling of it.
    stages = running_stages(sc.context, sc.output_len)
    dists = [acceptance.lookup(sc.method, sc.gamma, sc.sparsity, context, sc.workload,
                               sc.temperature, output_len=sc.output_len)
             for _, context in stages]
    if len(dists) == 1:
        return dists[0]
    return RunningLengthDist.of([g for g, _ in stages], dists, sc.output_len,
                                [c for _, c in stages])


def _simulate_runs(sc: Scenario, latency: LatencyModel, dist: AcceptanceDist | None,
                   seeds: list[np.random.SeedSequence]) -> list[RunMetrics]:
    cfg = engine_config(sc, scenario_kv_capacity(sc, latency), latency.model)
    cost = iteration_cost(latency, sc)
    # co-located: on the decode GPU; disaggregated: the prefill stage's GPUs (the same model
    # of one prompt's prefill); also the recompute of preempted requests
    prefill = prefill_fn(latency, sc.method)
    return [summarize(simulate(cfg, cost, dist, seed=s, prefill_fn=prefill,
                               recompute_fn=prefill), sc.slo) for s in seeds]


def _analytic_run(sc: Scenario, latency: LatencyModel, dist: AcceptanceDist | None
                  ) -> RunMetrics:
    """The closed form dressed as a RunMetrics (no spread; TPOT/ITL from the mean iteration)."""
    t0 = time.perf_counter()
    cost = iteration_cost(latency, sc)
    rates = np.zeros(0) if dist is None else np.asarray(dist.rates, dtype=np.float64)
    batch = _analytic_batch(sc, latency)
    res = analytic_throughput(cost, rates, batch, sc.context, sc.output_len, integrate=True)
    iters = res.iterations_per_request  # m(L), computed once (it is a loop over L)
    tpot = (iters - 1) * res.iter_ms / (sc.output_len - 1) if sc.output_len > 1 else math.nan
    mid = np.full(max(round(batch), 1), sc.context + sc.output_len // 2, np.int64)
    bd = cost.breakdown(mid)
    scale = res.iter_ms / sum(bd.values()) if sum(bd.values()) > 0 else 0.0
    # the prefill's token: a full closed batch does not queue, the prefill runs ahead
    ttft = (prefill_fn(latency, sc.method)(np.array([sc.context], np.int64))
            + transfer_ms_per_token(sc, latency.model) * sc.context)
    meets = sc.slo.met(np.array([ttft]), np.array([tpot]))[0]
    return RunMetrics(
        throughput_tok_s=res.throughput_tok_s, window_ms=(math.nan, math.nan), window_tokens=0,
        generated_tokens=0, acceptance_length=res.acceptance_length,
        rates=tuple(float(r) for r in rates), window_acceptance_length=res.acceptance_length,
        tpot_ms_p50=tpot, tpot_ms_p90=tpot, tpot_ms_p99=tpot,
        itl_ms_p50=res.iter_ms, itl_ms_p90=res.iter_ms, itl_ms_p99=res.iter_ms, iter_ms=res.iter_ms,
        breakdown_ms={k: v * scale for k, v in bd.items()}, iterations=0, sim_time_s=0.0,
        wall_s=time.perf_counter() - t0, mean_running_batch=batch, preemptions=math.nan,
        ttft_ms_p50=ttft, ttft_ms_p90=ttft, ttft_ms_p99=ttft,
        goodput_tok_s=(res.throughput_tok_s if meets else 0.0) if sc.slo.given else math.nan,
    )


def _analytic_batch(sc: Scenario, latency: LatencyModel) -> float:
    """The running batch the closed form uses: ``batch``, or the mean the KV cache holds."""
    cap = scenario_kv_capacity(sc, latency)
    if cap is None:
        return float(sc.batch)
    mean, second = (float(sc.output_len), float(sc.output_len) ** 2) if sc.output_dist is None \
        else sc.output_dist.moments()
    return kv_limited_batch(sc.batch, cap // sc.kv_block_size * sc.kv_block_size, sc.context,
                            mean, second, kv_slack(sc), sc.kv_block_size)


def _runs(sc: Scenario, latency: LatencyModel, dist: AcceptanceDist | None, engine: str,
          seeds: list[np.random.SeedSequence]) -> list[RunMetrics]:
    if engine == "analytic":
        return [_analytic_run(sc, latency, dist)]
    return _simulate_runs(sc, latency, dist, seeds)


def _seeds(seed: int, replications: int) -> list[np.random.SeedSequence]:
    return np.random.SeedSequence(seed).spawn(replications)


def acceptance_source(acceptance: AcceptanceModel, method: str) -> str:
    """Where a row's acceptance comes from: the shape set, and the anchors that set its level
    ('' for vanilla, and for a bare AcceptanceModel, which does not know its set's name)."""
    if isinstance(acceptance, AnchoredAcceptance):
        return acceptance.source_for(method)
    return ""


def _tpot_ratio(base: RunMetrics, run: RunMetrics) -> float:
    """Vanilla's TPOT over the method's; NaN where the method's is 0 (every request's tokens
    came in its first decode chunk, so it has no time per output token to compare)."""
    return base.tpot_ms_p50 / run.tpot_ms_p50 if run.tpot_ms_p50 > 0 else math.nan


def _row(sc: Scenario, engine: str, runs: list[RunMetrics], base: list[RunMetrics],
         dist: AcceptanceDist | None, latency: LatencyModel, wall_s: float,
         source: str) -> dict[str, Any]:
    thr = [r.throughput_tok_s for r in runs]
    m, lo, hi = mean_ci(thr)
    sp, sp_lo, sp_hi = mean_ci([a.throughput_tok_s / b.throughput_tok_s
                                for a, b in zip(runs, base)])
    rates = np.mean([r.rates for r in runs], axis=0) if runs[0].rates else np.zeros(0)
    tp, tp_lo, tp_hi = mean_ci([_tpot_ratio(b, a) for a, b in zip(runs, base)])
    row: dict[str, Any] = {
        "method": sc.method, "gamma": sc.gamma, "sparsity": sc.sparsity, "batch": sc.batch,
        "context": sc.context, "output_len": sc.output_len, "output_dist": sc.output_label,
        "requests": sc.n_requests,
        "arrival": sc.arrival.text, "prefill": sc.prefill, "workload": sc.workload or "",
        "temperature": sc.temperature, "min_tokens": sc.min_tokens, "engine": engine,
        "replications": len(runs),
        "throughput_tok_s": m, "throughput_ci_low": lo, "throughput_ci_high": hi,
        "speedup_vs_vanilla": sp, "speedup_ci_low": sp_lo, "speedup_ci_high": sp_hi,
        "acceptance_length": float(np.mean([r.acceptance_length for r in runs])),
        "window_acceptance_length": float(np.mean([r.window_acceptance_length for r in runs])),
        "rates": " ".join(f"{r:.4f}" for r in rates),
    }
    for name in ("tpot_ms_p50", "tpot_ms_p90", "tpot_ms_p99", "itl_ms_p50", "itl_ms_p90",
                 "itl_ms_p99", "iter_ms"):
        row[name] = float(np.mean([getattr(r, name) for r in runs]))
    for phase in PHASES:
        row[f"ms_{phase}"] = float(np.mean([r.breakdown_ms.get(phase, 0.0) for r in runs]))
    reasons = [*(dist.extrapolated if dist is not None else []),
               *latency.outside_measured(sc.batch, sc.context + sc.output_len)]
    row["extrapolated"] = ";".join(reasons)
    row["acceptance_source"] = source
    cap = scenario_kv_capacity(sc, latency)
    row["kv_block_size"] = sc.kv_block_size
    row["kv_capacity_blocks"] = cap // sc.kv_block_size if cap is not None else math.nan
    for name in ("mean_running_batch", "preemptions", "kv_peak_blocks"):
        row[name] = float(np.mean([getattr(r, name) for r in runs]))
    row["gpu"] = latency.gpu_label
    row["iterations_simulated"] = int(sum(r.iterations for r in runs))
    row["sim_time_s"] = float(np.mean([r.sim_time_s for r in runs]))
    row["wall_s"] = wall_s
    row.update(tpot_speedup=tp, tpot_speedup_ci_low=tp_lo, tpot_speedup_ci_high=tp_hi)
    row.update(_serving_columns(sc, runs))
    # what the first token costs before any queueing: one prompt's prefill, its KV's transfer
    row["prefill_gpus"], row["kv_link_gbs"] = sc.prefill_gpus, sc.kv_link_gbs
    row["prefill_ms"] = float(prefill_fn(latency, sc.method)(np.array([sc.context], np.int64)))
    row["kv_transfer_ms"] = transfer_ms_per_token(sc, latency.model) * sc.context
    return row


def midpoint(sc: Scenario, row: dict[str, Any]) -> tuple[int, int]:
    """(batch, context) where a row's per-point columns are taken: its mean running batch,
    every request halfway through its output (the closed form's midpoint)."""
    running = float(row.get("mean_running_batch", math.nan))
    batch = max(1, round(running)) if math.isfinite(running) else sc.batch
    return batch, int(sc.context + sc.output_len // 2)


def roofline_at(sc: Scenario, latency: LatencyModel, cost: IterationCost,
                row: dict[str, Any]) -> dict[str, Any]:
    """The roofline columns (sim.roofline) of `cost`, the scenario's iteration, at the row's
    midpoint."""
    return roofline_columns(latency, cost, *midpoint(sc, row))


def kv_selection_at(sc: Scenario, latency: LatencyModel, row: dict[str, Any]
                    ) -> dict[str, Any]:
    """The KV-selection columns (sim.kv_selection), the score write-out's share of verify
    taken at the row's midpoint."""
    return kv_selection_columns(latency, sc.method, sc.gamma, *midpoint(sc, row), row)


def draft_step_vs_decode(sc: Scenario, latency: LatencyModel, cost: IterationCost,
                         row: dict[str, Any]) -> float:
    """One draft step's time over one vanilla decode step's at the same point, the row's
    midpoint (NaN for vanilla): the ceiling on what sparse drafting saves (the Vegas paper:
    0.48 for gpt-oss-20b, whose window layers draft at full cost). Both are priced at the
    method's running batch: vanilla's own runs hold another batch where the KV cache binds or
    requests arrive (a larger one draws the ratio down). `cost`: the scenario's iteration."""
    if not drafts(sc.method):
        return math.nan
    batch, context = midpoint(sc, row)
    contexts = np.full(batch, context, np.int64)  # [B]
    draft = cost.breakdown(contexts).get("draft_step", 0.0)
    decode = iteration_cost(latency, replace(sc, method=VANILLA)).breakdown(contexts).get(
        "decode", 0.0)
    return draft / sc.gamma / decode if draft > 0 and decode > 0 else math.nan


def provenance(latency: LatencyModel, acceptance: AcceptanceModel, temperature: float
               ) -> dict[str, str]:
    """The provenance columns of a row: the trace sets the latency and the acceptance were
    fitted from, the sampling mode that priced the row's sampling phases (`latency_sampling`,
    `LatencyModel.mode_label`), and where the acceptance level comes from (a trace set, or
    anchors)."""
    acc_set = str(getattr(acceptance, "trace_set", "") or "")
    source = str(getattr(acceptance, "source", "") or "")
    return {"latency_traces": str(getattr(latency, "trace_set", "") or ""),
            "latency_sampling": latency.mode_label(temperature),
            "acceptance_traces": acc_set,
            "acceptance_source": source or (f"trace set {acc_set}" if acc_set else "")}


def _serving_columns(sc: Scenario, runs: list[RunMetrics]) -> dict[str, Any]:
    """Latency under queueing, rates, saturation (most replications) and goodput."""
    out: dict[str, Any] = {
        name: float(np.mean([getattr(r, name) for r in runs]))
        for name in ("ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99", "e2e_ms_p50", "e2e_ms_p90",
                     "queue_len_mean", "offered_rate", "served_rate", "goodput_tok_s")}
    out["saturated"] = bool(2 * sum(r.saturated for r in runs) > len(runs))
    out["ttft_includes"] = ttft_includes(sc)
    out["slo_tpot_ms"] = math.nan if sc.slo_tpot_ms is None else float(sc.slo_tpot_ms)
    out["slo_ttft_ms"] = math.nan if sc.slo_ttft_ms is None else float(sc.slo_ttft_ms)
    return out


def _check_analytic(sc: Scenario) -> None:
    """The closed form models a saturated closed loop: B requests always running (or the mean
    the KV cache holds), prompt already in the cache (disaggregated)."""
    arr = sc.arrival
    if (arr.kind != "closed" or (arr.users is not None and arr.users < sc.batch)
            or sc.prefill != "disaggregated"):
        raise UserInputError(
            "the analytic engine models a full closed-loop batch (users >= batch) with "
            "disaggregated prefill",
            where="--engine",
            fix="use the sim engine for Poisson arrivals (open-loop rows are sim-only), fewer "
                "users or co-located prefill")


def _base_key(sc: Scenario) -> tuple[Any, ...]:
    """What a vanilla baseline depends on: the sampling mode too, since a latency set timed in
    both modes prices a greedy vanilla step cheaper than a sampled one."""
    return (sc.batch, sc.context, sc.output_len, sc.n_requests, sc.arrival, sc.prefill,
            sc.kv_capacity_tokens, sc.output_dist, sc.kv_block_size, sc.prefill_gpus,
            sc.kv_link_gbs, sampling_mode(sc.temperature))


def _drafting_baseline(scenario: Scenario, latency: LatencyModel, engine: str,
                       seeds: list[np.random.SeedSequence], key: tuple[Any, ...],
                       shared: dict[tuple[Any, ...], list[RunMetrics]] | None
                       ) -> list[RunMetrics]:
    """The vanilla runs a drafting row's speedup is over, or those `shared` keeps from
    earlier calls. `seeds` are fresh (unspawned) copies of the row's own, so vanilla draws
    the row's lengths and arrivals (common random numbers), as a vanilla row run first would."""
    if shared is not None and key in shared:
        return shared[key]
    runs = _runs(scenario.vanilla(), latency, None, engine, seeds)
    if shared is not None:
        shared[key] = runs
    return runs


def predict_one(
    scenario: Scenario, latency: LatencyModel, acceptance: AcceptanceModel, *, seed: int = 0,
    replications: int = 5, engine: str = "sim",
    _baseline: dict[tuple[Any, ...], list[RunMetrics]] | None = None,
    _shared: dict[tuple[Any, ...], list[RunMetrics]] | None = None,
) -> dict[str, Any]:
    """One scenario's row (the columns of `predict`). Validates the scenario first."""
    if engine not in ENGINES:
        raise UserInputError(f"unknown engine {engine!r}", where="--engine",
                             fix=f"use one of: {', '.join(ENGINES)}")
    if replications < 1:
        raise UserInputError(f"replications must be >= 1, got {replications}",
                             where="--replications", fix="pass --replications 1 or more")
    check_options({"seed": seed, "replications": replications})
    t0 = time.perf_counter()
    if scenario.min_tokens is None:
        scenario = replace(scenario, min_tokens=acceptance.min_tokens)
    scenario = resolve_output(scenario, latency.model)
    validate_scenario(scenario, latency.gpu_model, gpu_memory(latency),
                      weight_format_of(latency))
    if engine == "analytic":
        _check_analytic(scenario)
    else:
        longest = scenario.max_output if scenario.max_output > 0 else scenario.output_len
        check_simulated_requests(scenario.n_requests, longest, scenario.requests is not None)
    seeds = _seeds(seed, replications)
    dist = _dist(acceptance, scenario)
    runs = _runs(scenario, latency, dist, engine, seeds)
    cache = _baseline if _baseline is not None else {}
    key = (*_base_key(scenario), engine, seed, replications)
    if not drafts(scenario.method):
        cache.setdefault(key, runs)
        base = runs
    else:
        if key not in cache:
            cache[key] = _drafting_baseline(scenario, latency, engine,
                                            _seeds(seed, replications), key, _shared)
        base = cache[key]
    row = _row(scenario, engine, runs, base, dist, latency, time.perf_counter() - t0,
               acceptance_source(acceptance, scenario.method))
    row.update(interval_columns(row, latency, acceptance, dist,
                                {p: row[f"ms_{p}"] for p in PHASES}))
    cost = iteration_cost(latency, scenario)
    row.update(roofline_at(scenario, latency, cost, row))
    row.update(kv_selection_at(scenario, latency, row))
    row["draft_step_vs_decode"] = draft_step_vs_decode(scenario, latency, cost, row)
    # a column the row already has (an anchored acceptance's own source) is kept
    return {**row, **{k: v for k, v in provenance(latency, acceptance, scenario.temperature).items()
                     if k not in row}}


def predict(
    scenarios: Sequence[Scenario],
    latency: LatencyModel,
    acceptance: AcceptanceModel,
    *,
    seed: int = 0,
    replications: int = 5,
    engine: str = "sim",
    progress: Progress | None = None,
    baselines: dict[tuple[Any, ...], list[RunMetrics]] | None = None,
) -> pd.DataFrame:
    """Predict every scenario; one row each (columns documented in the module docstring).

    All scenarios are validated before any is run, so a bad one fails fast. Vanilla baselines
    are shared between scenarios with the same batch/context/output/arrivals and sampling
    mode (greedy or sampled); the ones a
    drafting row runs (no vanilla scenario before it in the call) also with earlier calls
    that pass the same `baselines` dict (for the same latency model: a sweep's chunks), which
    would run the same. ``progress(done, total)`` is called after each scenario.
    """
    mem = gpu_memory(latency)
    for sc in scenarios:
        validate_scenario(sc, latency.gpu_model, mem, weight_format_of(latency))
    cache: dict[tuple[Any, ...], list[RunMetrics]] = {}
    rows = []
    for i, sc in enumerate(scenarios):
        rows.append(predict_one(sc, latency, acceptance, seed=seed, replications=replications,
                                engine=engine, _baseline=cache, _shared=baselines))
        if progress is not None:
            progress(i + 1, len(scenarios))
    return pd.DataFrame(rows)


PROVENANCE_COLUMNS = ("latency_traces", "latency_sampling", "acceptance_traces",
                      "acceptance_source")


def is_extrapolated(value: Any) -> bool:
    """predict writes '' or the reasons; validate may write a bool; CSV turns '' into NaN."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return False
    if isinstance(value, str):
        return value.strip().lower() not in ("", "false", "0", "no")
    return bool(value)
