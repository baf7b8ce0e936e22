"""`vegas-sim validate`: real decoding at held-out configurations vs the simulator's prediction.

Both regimes of DESIGN.md run through `run_validation`:
- real weights (SmolLM2): prompts from a workload, real acceptance, end to end;
- random weights (Qwen3-8B shape): the KV cache starts at the held-out context with random
  entries (no 128K prefill), and the accept/reject decisions are replayed from block-bootstrapped
  *real* traces (the same sampler the simulator uses), so the real kernels, batching and
  rollback run at scale with realistic acceptance.

Each configuration runs `waves` closed batches one after the other (other prompts, or other
replayed draws) and pools them. Every result row carries three predictions:
- `predicted_sim`: `predict` from the trace sets alone (acceptance from the acceptance model);
- `predicted_replay`: the simulator fed the run's own accept counts (`measured_accepted`,
  hex-encoded): acceptance identical, so its error is the latency model's and the batching's;
- `predicted`: the one the targets are judged on — `predicted_sim` for real weights,
  `predicted_replay` for the replay regime, whose acceptance is itself a draw from the
  acceptance model (an input, like an arrival trace).
`acceptance_error_pct` and `iter_time_error_pct` split the error into its two factors, and
one extra timed wave per configuration (`phase_wave`) splits the iteration time by phase
(`measured_phase_ms` vs the latency model's `predicted_phase_ms`). Predictions simulate at
least MIN_SIMULATED_REQUESTS requests, so that they estimate the expected throughput rather
than another draw of a run as small as the measured one.
`repredict` recomputes every prediction of an old table with the current simulator.

Throughput is measured the way the simulator defines it for a closed batch of B requests that
start together (sim/metrics.py: steady-state window = from the first iteration to the end of
the iteration in which the first request finishes; tokens emitted in that window / its time).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from vegas_sim.errors import UserInputError
from vegas_sim.methods import INDEX_PREP_METHODS, METHODS, MIN_TOKENS, QUEST_PAGE
from vegas_sim.sim.heldout import (
    HeldOut,
    check_outside_grid,
    grid_of,
    heldout_from_record,
    random_heldout,
    read_heldout,
    write_heldout,
)

ProgressFn = Callable[[int, int, str], None]


@dataclasses.dataclass
class Measurement:
    """One (or several pooled) steady-state windows of a real run.

    `accepted` holds, per wave and per request, the accepted-draft counts of the window's
    iterations in order (before truncation at the output length): the acceptance the run
    really had, which `predict_replayed` feeds back into the simulator.
    """

    tokens: int
    seconds: float
    iterations: int
    acceptance_length: float  # 1 + mean accepted drafts per (request, iteration), pre-truncation
    accepted: list[list[list[int]]] = dataclasses.field(default_factory=list)
    phase_ms: dict[str, float] = dataclasses.field(default_factory=dict)  # see phase_means

    @property
    def throughput(self) -> float:
        return self.tokens / self.seconds


def pool(measurements: Sequence[Measurement]) -> Measurement:
    """Waves pooled: tokens and seconds summed (a ratio of sums, like one longer window)."""
    waves = [w for m in measurements for w in m.accepted]
    return Measurement(sum(m.tokens for m in measurements),
                       sum(m.seconds for m in measurements),
                       sum(m.iterations for m in measurements), acceptance_length(waves), waves)


def acceptance_length(waves: Sequence[Sequence[Sequence[int]]]) -> float:
    """1 + mean accepted drafts over every (wave, request, iteration); 1 with none (vanilla
    records nothing)."""
    draws = [a for wave in waves for req in wave for a in req]
    return 1.0 + float(np.mean(draws)) if draws else 1.0


def acceptance_se_pct(waves: Sequence[Sequence[Sequence[int]]],
                      prompts: Sequence[Sequence[int]] | None = None) -> float:
    """Sampling error of a run's acceptance length, % of it: the standard deviation of the
    per-prompt acceptance lengths / √prompts. `prompts` [wave][request] names each request's
    prompt (requests of one prompt are averaged first: at B 64 and C ≥ 4K the 32 longdoc
    prompts give 8–16 distinct ones, so the requests are not independent); None = every
    request its own. Acceptance varies from prompt to prompt (≈ 18 % per prompt for SmolLM2
    on longdoc), so a run of few prompts measures those prompts, not the workload the
    prediction describes: an acceptance error within ~2 of these is noise. NaN with fewer
    than 2 prompts (and for vanilla)."""
    by_prompt: dict[int, list[float]] = {}
    for w, wave in enumerate(waves):
        for r, req in enumerate(wave):
            if len(req):
                key = prompts[w][r] if prompts is not None else len(by_prompt)
                by_prompt.setdefault(key, []).append(1.0 + float(np.mean(req)))
    if len(by_prompt) < 2:
        return float("nan")
    x = np.asarray([np.mean(v) for v in by_prompt.values()])
    return float(100.0 * x.std(ddof=1) / math.sqrt(len(x)) / x.mean())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def phase_means(summary: dict[str, list[float]], iterations: int, wall_ms: float,
                method: str = "") -> dict[str, float]:
    """ms per iteration of each phase of a timed window (CUDA events: device time). The
    device's idle time (wall − Σ phases: host work, syncs) is charged to 'sample', as the
    calibration grid charges it (grid.with_host_gap), so both sides compare phase by phase.
    Quest's per-step page scoring runs inside the graphed draft step here, while the grid
    times it apart (quest_meta): compare Quest's draft_step + quest_meta. The quest_meta timed
    here is its metadata update after acceptance, once-per-iteration work that the grid
    records under 'other' (with the draft's index preparation), so it is moved there."""
    n = max(iterations, 1)
    per = {name: float(sum(ms)) / n for name, ms in summary.items()}
    if "quest_meta" in per:
        per["other"] = per.get("other", 0.0) + per.pop("quest_meta")
    if "other" in per and method not in INDEX_PREP_METHODS:  # no index to prepare: the
        per["draft_step"] = per.get("draft_step", 0.0) + per.pop("other")  # timer's own cost
    gap = max(wall_ms / n - sum(per.values()), 0.0)
    per["sample"] = per.get("sample", 0.0) + gap
    return per


def format_phases(phases: dict[str, float]) -> str:
    """'decode=2.81;sample=0.31' (ms per iteration), phases in methods.PHASES order."""
    from vegas_sim.methods import PHASES

    return ";".join(f"{p}={phases[p]:.4g}" for p in PHASES if p in phases)


def parse_phases(text: Any) -> dict[str, float]:
    if not isinstance(text, str) or not text:
        return {}
    return {k: float(v) for k, v in (item.split("=") for item in text.split(";"))}


def phase_line(row: dict[str, Any]) -> str:
    """'; ms/iteration measured/predicted: verify 5.1/5.0 sample 0.62/0.55' ('' untimed)."""
    meas, pred = parse_phases(row.get("measured_phase_ms")), parse_phases(
        row.get("predicted_phase_ms"))
    if not meas:
        return ""
    parts = [f"{k} {meas.get(k, 0.0):.3g}/{pred.get(k, 0.0):.3g}"
             for k in dict.fromkeys([*pred, *meas])]
    return "; ms/iteration measured/predicted: " + " ".join(parts)


def _window_run(decoder: Any, state: Any, device: torch.device) -> Measurement:
    """Run iterations until the first request finishes; tokens and time of that window (and,
    when the decoder's timer is enabled, its phases per iteration)."""
    emitted = lambda: sum(len(e) for e in state.emitted)
    start_tokens, iterations, first_record = emitted(), 0, len(state.records)
    decoder.timer.reset()
    _sync(device)
    t0 = time.perf_counter()
    while not state.done.any():
        decoder.step(state)
        iterations += 1
    _sync(device)
    seconds = time.perf_counter() - t0
    tokens = emitted() - start_tokens
    seqs: list[list[int]] = [[] for _ in range(state.batch)]
    for r in state.records[first_record:]:
        seqs[r.request].append(int(r.accepted))
    waves = [seqs] if any(seqs) else []  # vanilla records nothing
    phases = (phase_means(decoder.timer.summary(), iterations, 1e3 * seconds,
                          decoder.config.method)
              if decoder.timer.enabled else {})
    return Measurement(tokens, seconds, iterations, acceptance_length(waves), waves, phases)


def measure_real(model: Any, h: HeldOut, prompts: list[torch.Tensor], seed: int,
                 min_tokens: int = MIN_TOKENS, warm: bool = True,
                 sampling: tuple[float, int] = (1.0, 0), timed: bool = False) -> Measurement:
    """Prefill real prompts (cut to h.context tokens), then decode with real acceptance;
    sampling = (top_p, top_k) of sampled runs; `timed`: also time the window's phases."""
    device = next(model.parameters()).device
    decoder = _decoder(model, h, min_tokens, sampling, timed)
    gen = torch.Generator(device).manual_seed(seed)
    state = decoder.prefill_state(prompts, h.output_len, generator=gen)
    if warm:
        _warm(decoder, h, device)
    decoder.prepare_graphs(state)  # graph capture stays out of the measured window
    return _window_run(decoder, state, device)


def measure_replayed(model: Any, h: HeldOut, sequences: np.ndarray, seed: int,
                     min_tokens: int = MIN_TOKENS, warm: bool = True,
                     sampling: tuple[float, int] = (1.0, 0), timed: bool = False
                     ) -> Measurement:
    """Random KV at h.context, acceptance replayed from `sequences` [B, iterations]."""
    from vegas_sim.calibrate.replay import AcceptanceReplay

    device = next(model.parameters()).device
    decoder = _decoder(model, h, min_tokens, sampling, timed)
    if warm:
        _warm(decoder, h, device)
    replay = AcceptanceReplay([list(map(int, row)) for row in sequences])
    max_seq = h.context + h.output_len + 2 * h.gamma + QUEST_PAGE + 2
    state = decoder.init_state(h.batch, h.context, max_seq, seed=seed, replay=replay,
                               max_new_tokens=h.output_len)
    decoder.prepare_graphs(state)
    return _window_run(decoder, state, device)


def _decoder(model: Any, h: HeldOut, min_tokens: int, sampling: tuple[float, int],
             timed: bool) -> Any:
    """h's SpecDecoder; `timed`: with an enabled PhaseTimer (CUDA events per phase, a few µs
    of host time each — kept out of the waves whose throughput is measured)."""
    from vegas_sim.calibrate.specdec import SpecDecoder
    from vegas_sim.calibrate.timers import PhaseTimer

    device = next(model.parameters()).device
    return SpecDecoder(model, _spec_config(h, min_tokens, *sampling),
                       PhaseTimer(device) if timed else None)


def _spec_config(h: HeldOut, min_tokens: int, top_p: float = 1.0, top_k: int = 0) -> Any:
    """Sampled runs filter like the calibration did (its top-p / top-k, e.g. Qwen3's 0.95 / 20):
    the filter costs a vocabulary sort per sampled row, and it changes acceptance."""
    from vegas_sim.calibrate.sampling import sampling_args
    from vegas_sim.calibrate.specdec import SpecConfig

    temperature, top_p, top_k = sampling_args(h.temperature or 0.0, top_p, top_k)
    return SpecConfig(method=h.method, gamma=h.gamma, sparsity=h.sparsity,
                      temperature=temperature, top_p=top_p, top_k=top_k, min_tokens=min_tokens)


def _warm(decoder: Any, h: HeldOut, device: torch.device) -> None:
    """One short synthetic run so that Triton compilation stays out of the measurement."""
    ctx = min(h.context, 1024)
    state = decoder.init_state(h.batch, ctx, ctx + 4 * h.gamma + QUEST_PAGE + 8, seed=1)
    for _ in range(2):
        decoder.step(state)
    _sync(device)
    del state


def long_prompts(h: HeldOut, workload_prompts: Sequence[Sequence[int]]
                 ) -> tuple[list[list[int]], str]:
    """The prompts h's requests take in turn, and a note ('' if natural): those at least
    h.context long, or (when none is) every prompt, to be repeated up to the context."""
    long = [list(p) for p in workload_prompts if len(p) >= h.context]
    if long:
        return long, ""
    return [list(p) for p in workload_prompts if len(p) >= 2], (
        f"no workload prompt has {h.context} tokens: prompts repeated to reach it "
        "(acceptance not the traced workload's)")


def prompt_index(h: HeldOut, n_prompts: int, waves: int | None = None) -> list[list[int]]:
    """[wave][request] index of the prompt each request takes, (w·B + b) mod n: waves see
    other prompts. `waves` defaults to h's."""
    return [[(w * h.batch + b) % n_prompts for b in range(h.batch)]
            for w in range(h.waves if waves is None else waves)]


def prompts_for(h: HeldOut, workload_prompts: Sequence[Sequence[int]], wave: int = 0
                ) -> tuple[list[torch.Tensor], str]:
    """B prompts of exactly h.context tokens for wave `wave`, and a note ('' if natural).

    Natural text only: prompts at least h.context long, cut to their first h.context tokens,
    taken in turn (wave w, request b → long prompt (w·B + b) mod n), so that waves see other
    prompts. Repeating a short prompt to reach the context (the old behaviour) makes
    degenerate, copyable text whose acceptance is not the traced workload's; it is done only
    when no prompt is long enough, and the note says so.
    """
    long, note = long_prompts(h, workload_prompts)
    out = []
    for k in prompt_index(h, len(long), wave + 1)[wave]:
        ids = long[k]
        while len(ids) < h.context:
            ids = ids + ids
        out.append(torch.tensor(ids[: h.context], dtype=torch.long))
    return out, note


def choose_heldout(
    heldout_file: Path | None, n_random: int | None, grid: dict[str, list[Any]], *,
    seed: int, max_batch: int, contexts: tuple[int, int], output_len: int,
    max_tokens: int | None, workloads: Sequence[str | None],
    methods: Sequence[str] = METHODS,
) -> list[HeldOut]:
    """The held-out configurations: a file's, or `n_random` drawn over `methods`."""
    if heldout_file is not None:
        chosen = read_heldout(heldout_file)
    else:
        assert n_random is not None
        rng = np.random.default_rng(seed)
        chosen = random_heldout(n_random, grid, rng, methods=methods, batches=(1, max_batch),
                                contexts=contexts, output_len=output_len,
                                max_tokens=max_tokens, workloads=workloads)
    check_outside_grid(chosen, grid)
    return chosen


@dataclasses.dataclass
class _Models:
    """What predictions need, loaded once per validation (or re-prediction)."""

    latency: Any  # sim.latency.LatencyModel
    acceptance: Any  # sim.acceptance.AcceptanceModel
    min_tokens: int  # the budget floor the acceptance was traced with
    latency_temperature: float  # the temperature the latency grid sampled at
    grid: dict[str, list[Any]]
    sampling: tuple[float, int]  # (top_p, top_k) the calibration sampled with
    latency_meta: dict[str, Any]
    traced_temperatures: tuple[float, ...] = ()  # of the acceptance set
    notes: tuple[str, ...] = ()  # which sets were used


def load_models(traces: Path, acceptance_traces: Path | None,
                log: Callable[[str], None] | None = None) -> _Models:
    """Latency model of `traces`; acceptance model of `acceptance_traces`, by default of
    `traces` when it has real-weights acceptance, else of the packaged real-weights set (as
    `predict` does; `notes` say which, and go to `log` as "note: ..." lines)."""
    from vegas_sim import api
    from vegas_sim.traces import catalog

    latency_set, acc_set, notes = catalog.resolve(None, traces, acceptance=acceptance_traces)
    if log is not None:
        for note in notes:
            log(f"note: {note}")
    grid = latency_set.meta.get("grid", {})
    return _Models(
        latency=api.fit_latency(latency_set),
        acceptance=api.fit_acceptance(acc_set),
        min_tokens=int(acc_set.meta.get("grid", {}).get("min_tokens", MIN_TOKENS)),
        latency_temperature=float(grid.get("latency_temperature", 0.0)),
        sampling=(float(grid.get("top_p", 1.0)), int(grid.get("top_k", 0))),
        grid=grid_of(latency_set.meta), latency_meta=latency_set.meta,
        traced_temperatures=tuple(sorted(float(t) for t in acc_set.acceptance["temperature"]
                                         .unique())),
        notes=tuple(notes))


def resolve_temperature(h: HeldOut, models: _Models) -> tuple[HeldOut, str]:
    """An empty temperature becomes the latency grid's when the acceptance set traced it
    (else the traced one nearest to it); a temperature other than the latency grid's is
    noted: the sample phase and sampled draft steps cost more than greedy argmax, and the
    latency model only knows the cost at the temperature it was measured at."""
    if h.temperature is None:
        want, traced = models.latency_temperature, models.traced_temperatures
        temp = want if not traced or any(abs(t - want) < 1e-9 for t in traced) else min(
            traced, key=lambda t: (abs(t - want), t))
        h = dataclasses.replace(h, temperature=temp)
    run_temp = float(h.temperature or 0.0)
    if abs(run_temp - models.latency_temperature) > 1e-9:
        return h, (f"latency traced at temperature {models.latency_temperature:g}, run at "
                   f"{run_temp:g}: sampling cost differs")
    return h, ""


# Requests the simulator runs for one prediction, at least (replications × batch): the
# prediction is the configuration's expected throughput, so its own Monte-Carlo error must sit
# well under the run's. With only as many simulated requests as the run measures (e.g. 5
# replications of 1-8 requests), a B = 1 prediction has a ±17 % CI and two acceptance sets'
# predictions differ by 3.2 % sd per configuration (1.9 % at ≥ 256 requests).
MIN_SIMULATED_REQUESTS = 256


def prediction_replications(h: HeldOut, replications: int) -> int:
    """Replications of h's closed batch: at least `replications`, h.waves, and enough for
    MIN_SIMULATED_REQUESTS requests."""
    return max(replications, h.waves, math.ceil(MIN_SIMULATED_REQUESTS / h.batch))


def _scenario(h: HeldOut, weights: str, min_tokens: int) -> Any:
    from vegas_sim.sim.predict import Scenario

    # A real run's first token comes from the prefill; the simulator's decode instance
    # (disaggregated prefill) generates all output_len tokens in iterations.
    out_len = h.output_len if weights == "random" else h.output_len - 1
    return Scenario(method=h.method, gamma=h.gamma, sparsity=h.sparsity, batch=h.batch,
                    context=h.context, output_len=out_len, requests=h.batch,
                    workload=h.workload, temperature=h.temperature or 0.0,
                    min_tokens=min_tokens)


def predict_replayed(sc: Any, latency: Any, accepted: Sequence[Sequence[Sequence[int]]],
                     waves: int, seed: int) -> tuple[float, float]:
    """(throughput, mean window iteration ms) the simulator gives with the run's own accept
    counts (one closed batch per wave, pooled like the measurement). Vanilla: `accepted` is
    empty and `waves` identical runs are pooled (its prediction has no randomness)."""
    from vegas_sim.sim.acceptance import FixedSequences
    from vegas_sim.sim.engine import simulate
    from vegas_sim.sim.metrics import steady_window
    from vegas_sim.sim.metrics import summarize as run_summary
    from vegas_sim.sim.predict import _capacity, engine_config, iteration_cost

    cfg = engine_config(sc, _capacity(sc, latency))
    cost = iteration_cost(latency, sc)
    tokens, ms, iters = 0, 0.0, 0
    per_wave: list[Sequence[Sequence[int]] | None] = (
        [None] * waves if sc.method == "vanilla" else list(accepted))
    for w, seqs in enumerate(per_wave):
        dist = None if seqs is None else FixedSequences(sc.gamma, [list(r) or [0] for r in seqs])
        res = simulate(cfg, cost, dist, seed=np.random.SeedSequence([seed, w]))
        m = run_summary(res)
        g0, g1 = steady_window(res)
        tokens += m.window_tokens
        ms += m.window_ms[1] - m.window_ms[0]
        iters += g1 - g0 + 1
    return tokens / (ms / 1000.0), ms / max(iters, 1)


def encode_accepted(accepted: Sequence[Sequence[Sequence[int]]]) -> str:
    """Per wave '|', per request ',', one hex digit per iteration (γ ≤ 15)."""
    return "|".join(",".join("".join(format(a, "x") for a in req) for req in wave)
                    for wave in accepted)


def decode_accepted(text: Any) -> list[list[list[int]]]:
    if not isinstance(text, str) or not text:
        return []
    return [[[int(c, 16) for c in req] for req in wave.split(",")] for wave in text.split("|")]


def run_validation(
    *, traces: Path, acceptance_traces: Path | None, heldout_file: Path | None,
    n_random: int | None, model: str, weights: str, max_batch: int,
    contexts: tuple[int, int], output_len: int, device: str, seed: int, out: Path,
    progress: ProgressFn | None = None, replications: int = 5,
    time_budget_s: float | None = None, log: Callable[[str], None] | None = None,
    phase_wave: bool = True,
) -> pd.DataFrame:
    """Measure and predict every held-out configuration; write and return the result table.

    `phase_wave`: one more wave per configuration with per-phase timers (not part of the
    measured throughput), compared phase by phase with the latency model in the table's
    `measured_phase_ms` / `predicted_phase_ms` — which phase a miss comes from.

    `time_budget_s`: no new configuration starts after this many seconds (the ones done are
    written; the rest are logged as skipped), so a bounded GPU call still ends with a table.
    """
    from vegas_sim.calibrate.grid import check_device
    from vegas_sim.calibrate.runtime import load_model
    from vegas_sim.sim.predict import predict

    t_start = time.perf_counter()
    models = load_models(traces, acceptance_traces, log)
    latency, acceptance = models.latency, models.acceptance
    spec_max = int(latency.model.max_positions)
    lo, hi = contexts[0], min(contexts[1], spec_max - output_len - 64)
    # Real runs decode real prompts: the acceptance predicted is that workload's. Random
    # weights replay acceptance pooled over the traced workloads.
    traced = [str(w) for w in acceptance.coverage()["workloads"]]
    workloads: list[str | None] = (
        [None] if weights == "random" else list(traced) or ["longdoc"])
    torch_device = check_device(device)
    mem = (torch.cuda.get_device_properties(torch_device).total_memory
           if torch_device.type == "cuda" else 16 << 30)
    spec = latency.model
    max_tokens = int(0.8 * (mem - spec.weight_bytes()) / spec.kv_bytes_per_token())
    # draw only what both sets can predict: a method neither calibrated would fail mid-run
    acc_methods = {"vanilla", *(str(m) for m in acceptance.coverage()["methods"])}
    covered = [m for m in latency.methods_covered() if m in acc_methods]
    heldout = choose_heldout(heldout_file, n_random, models.grid, seed=seed,
                             max_batch=max_batch, contexts=(lo, hi), output_len=output_len,
                             max_tokens=max_tokens, workloads=workloads, methods=covered)
    write_heldout(heldout, out.with_suffix(".heldout.csv"))

    runtime_model, _tokenizer, _ = load_model(model, weights=weights, device=device, seed=seed)
    rows: list[dict[str, Any]] = []
    for i, h0 in enumerate(heldout):
        if time_budget_s is not None and time.perf_counter() - t_start > time_budget_s:
            if log:
                log(f"time budget {time_budget_s:g} s spent: skipped {len(heldout) - i} "
                    f"configuration(s) from {h0.label}")
            break
        h, note = resolve_temperature(h0, models)
        if progress:
            progress(i, len(heldout), h.label)
        sc = _scenario(h, weights, models.min_tokens)
        pred = predict([sc], latency, acceptance, seed=seed,
                       replications=prediction_replications(h, replications)).iloc[0]
        t_cfg = time.perf_counter()
        m, prompt_note = _measure(runtime_model, h, acceptance, weights, seed, i, models,
                                  phase_wave)
        rep, rep_iter = predict_replayed(sc, latency, m.accepted, h.waves, seed)
        notes = ";".join(n for n in (note, prompt_note) if n)
        rows.append(_result_row(h, pred, m, weights, rep, rep_iter, notes,
                                time.perf_counter() - t_cfg,
                                predicted_phases(h, latency, m, models.min_tokens)))
        if log:
            log(f"{h.label}: measured {m.throughput:.1f} tok/s, predicted "
                f"{rows[-1]['predicted']:.1f} ({rows[-1]['error_pct']:+.1f} %), "
                f"{rows[-1]['wall_s']:.1f} s" + phase_line(rows[-1]))
        pd.DataFrame(rows).to_csv(out, index=False)  # nothing lost if interrupted
    if progress:
        progress(len(heldout), len(heldout), "done")
    table = pd.DataFrame(rows)
    table.to_csv(out, index=False)
    return table


def _measure(runtime_model: Any, h: HeldOut, acceptance: Any, weights: str, seed: int,
             i: int, models: _Models, phase_wave: bool = False) -> tuple[Measurement, str]:
    """All waves of one configuration, pooled; the first wave pays the warm-up. `phase_wave`:
    one more wave (other prompts / draws) with per-phase timers, not pooled: its phases per
    iteration go to the pooled measurement's `phase_ms`."""
    waves = [_wave(runtime_model, h, acceptance, weights, seed, i, w, models)
             for w in range(h.waves)]
    note = waves[0][1]
    m = pool([w for w, _ in waves])
    if phase_wave:
        timed, _ = _wave(runtime_model, h, acceptance, weights, seed, i, h.waves, models,
                         timed=True)
        m.phase_ms = timed.phase_ms
    return m, note


def _wave(runtime_model: Any, h: HeldOut, acceptance: Any, weights: str, seed: int, i: int,
          w: int, models: _Models, timed: bool = False) -> tuple[Measurement, str]:
    """Wave w of configuration i: its own prompts (real) or accept draws (replay)."""
    run_seed = seed + 1000 * i + w
    if weights == "random":
        rng = np.random.default_rng([seed, i, w])
        dist = acceptance.lookup(h.method, h.gamma, h.sparsity, h.context, h.workload,
                                 h.temperature or 0.0, output_len=h.output_len
                                 ) if h.method != "vanilla" else None
        n_iter = h.output_len + 1
        seqs = (dist.sample(rng, h.batch, n_iter) if dist is not None
                else np.zeros((h.batch, n_iter), dtype=np.int64))
        return measure_replayed(runtime_model, h, seqs, run_seed, models.min_tokens,
                                warm=w == 0, sampling=models.sampling, timed=timed), ""
    from vegas_sim.calibrate.workloads import load_workload

    prompts, note = prompts_for(h, load_workload(h.workload or "longdoc"), w)
    return measure_real(runtime_model, h, prompts, run_seed, models.min_tokens, warm=w == 0,
                        sampling=models.sampling, timed=timed), note


def predicted_phases(h: HeldOut, latency: Any, m: Measurement, min_tokens: int
                     ) -> dict[str, float]:
    """The latency model's ms per iteration of each phase, at the context the requests had
    halfway through the measured window (the comparison for `Measurement.phase_ms`; {} when
    no phase wave ran)."""
    if not m.phase_ms:
        return {}
    per_request = m.tokens / max(h.batch * h.waves, 1)
    contexts = np.full(h.batch, h.context + int(per_request / 2), dtype=np.int64)
    cost = latency.iteration_cost(h.method, h.gamma, h.sparsity, min_tokens)
    return {k: float(v) for k, v in cost.breakdown(contexts).items()}


def _pct(a: float, b: float) -> float:
    return 100.0 * (a - b) / b if b else float("nan")


def _request_prompts(h: HeldOut, weights: str, workload_prompts: int | None
                     ) -> tuple[list[list[int]] | None, int | None]:
    """([wave][request] prompt of each request of a real run, the workload's prompt count it
    assumes): the run decoded the first `workload_prompts` prompts of h's workload (None:
    all of today's). (None, None) for replay, where every request draws on its own."""
    if weights == "random":
        return None, None
    from vegas_sim.calibrate.workloads import load_workload

    workload = load_workload(h.workload or "longdoc")
    n = len(workload) if workload_prompts is None else workload_prompts
    return prompt_index(h, len(long_prompts(h, workload[:n])[0])), n


def _result_row(h: HeldOut, pred: pd.Series, m: Measurement, weights: str,
                replayed: float, replayed_iter_ms: float, notes: str,
                wall_s: float, predicted_phase_ms: dict[str, float] | None = None,
                workload_prompts: int | None = None) -> dict[str, Any]:
    """One result row. `predicted` is what the issue's targets are judged on: the simulator
    from the trace sets alone for real weights; for the replay regime the simulator fed the
    same replayed accept counts as the run (the acceptance there is an input drawn from the
    acceptance model, like an arrival trace; the regime validates the performance model).
    `workload_prompts`: how many prompts the workload had when the run was measured (default
    today's), which fixes the prompt each request decoded."""
    prompts, workload_prompts = _request_prompts(h, weights, workload_prompts)
    sim = float(pred["throughput_tok_s"])
    primary = sim if weights == "real" else replayed
    measured_iter_ms = 1000.0 * m.seconds / max(m.iterations, 1)
    return {
        **dataclasses.asdict(h),
        "regime": "real-weights" if weights == "real" else "random-weights+replay",
        "predicted": primary,
        "measured": m.throughput,
        "error_pct": _pct(primary, m.throughput),
        "predicted_sim": sim,
        "error_sim_pct": _pct(sim, m.throughput),
        "predicted_replay": replayed,
        "error_replay_pct": _pct(replayed, m.throughput),
        "ci_low": float(pred["throughput_ci_low"]),
        "ci_high": float(pred["throughput_ci_high"]),
        "predicted_acceptance_length": float(pred["window_acceptance_length"]),
        "measured_acceptance_length": m.acceptance_length,
        "acceptance_error_pct": _pct(float(pred["window_acceptance_length"]),
                                     m.acceptance_length),
        "acceptance_se_pct": acceptance_se_pct(m.accepted, prompts),
        "workload_prompts": math.nan if workload_prompts is None else workload_prompts,
        "measured_iterations": m.iterations,
        "measured_seconds": m.seconds,
        "measured_tokens": m.tokens,
        "predicted_iter_ms": replayed_iter_ms,
        "measured_iter_ms": measured_iter_ms,
        "iter_time_error_pct": _pct(replayed_iter_ms, measured_iter_ms),
        "measured_phase_ms": format_phases(m.phase_ms),
        "predicted_phase_ms": format_phases(predicted_phase_ms or {}),
        "extrapolated": str(pred.get("extrapolated") or ""),
        "notes": notes,
        "wall_s": wall_s,
        "measured_accepted": encode_accepted(m.accepted),
    }


REQUIRED_RESULT_COLUMNS = ("method", "gamma", "sparsity", "batch", "context", "output_len",
                           "regime", "measured")


def read_results(path: Path) -> pd.DataFrame:
    """A result table written by `run_validation` (any version with the required columns)."""
    if not path.is_file():
        raise UserInputError("file not found", where=str(path),
                             fix="pass the CSV written by `vegas-sim validate --out`")
    table = pd.read_csv(path, keep_default_na=True)
    missing = [c for c in REQUIRED_RESULT_COLUMNS if c not in table.columns]
    if missing:
        raise UserInputError(f"missing columns {missing}", where=str(path),
                             fix="pass the CSV written by `vegas-sim validate --out`")
    if table.empty:
        raise UserInputError("the result table has no rows", where=str(path),
                             fix="pass a validation run that measured something")
    return table


def repredict(results: Path, *, traces: Path, acceptance_traces: Path | None, out: Path,
              seed: int = 0, replications: int = 5,
              log: Callable[[str], None] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Re-predict every row of an earlier result table with the *current* simulator.

    The measured columns (throughput, iterations, accept counts, time) are kept; every
    predicted column and error is recomputed from `traces` / `acceptance_traces`. Writes the
    new table to `out` and returns (old table, new table); `compare` summarises the two.
    A table from before accept counts were recorded gets NaN for the replay columns (and for
    `predicted` in the replay regime).
    """
    from vegas_sim.sim.predict import predict

    old = read_results(results)
    models = load_models(traces, acceptance_traces, log)
    rows = []
    for i, rec in enumerate(old.to_dict(orient="records")):
        row = {str(k): v for k, v in rec.items()}
        weights = "real" if str(row["regime"]).startswith("real") else "random"
        h = heldout_from_record(row)
        if h.temperature is None:  # an unresolved row (should not happen): resolve now
            h = resolve_temperature(h, models)[0]
        sc = _scenario(h, weights, models.min_tokens)
        try:
            pred = predict([sc], models.latency, models.acceptance, seed=seed,
                           replications=prediction_replications(h, replications)).iloc[0]
        except UserInputError as e:  # its option names are predict's, not this command's
            raise UserInputError(
                f"row {i + 1} ({h.method}, batch {h.batch}, context {h.context}) cannot be "
                f"predicted with {models.latency.model.name}'s latency set: {e.problem}",
                where=str(results),
                fix="pass as --traces the latency set these rows were measured against") from None
        accepted = decode_accepted(row.get("measured_accepted"))
        rep, rep_iter = (predict_replayed(sc, models.latency, accepted, h.waves, seed)
                         if accepted or h.method == "vanilla" else (math.nan, math.nan))
        m = Measurement(int(row.get("measured_tokens", 0) or 0),
                        float(row.get("measured_seconds", math.nan)),
                        int(row.get("measured_iterations", 0) or 0),
                        float(row.get("measured_acceptance_length", math.nan)), accepted,
                        parse_phases(row.get("measured_phase_ms")))
        notes = row.get("notes")
        new = _result_row(h, pred, m, weights, rep, rep_iter,
                          "" if notes is None or pd.isna(notes) else str(notes),
                          float(row.get("wall_s", math.nan)),
                          predicted_phases(h, models.latency, m, models.min_tokens),
                          _recorded_workload_size(row))
        new["measured"] = float(row["measured"])  # as measured, not recomputed from the parts
        for pred_col, err_col in (("predicted", "error_pct"), ("predicted_sim", "error_sim_pct"),
                                  ("predicted_replay", "error_replay_pct")):
            new[err_col] = _pct(new[pred_col], new["measured"])
        if "measured_iter_ms" in row and not pd.isna(row["measured_iter_ms"]):
            new["measured_iter_ms"] = float(row["measured_iter_ms"])
            new["iter_time_error_pct"] = _pct(rep_iter, new["measured_iter_ms"])
        rows.append(new)
    table = pd.DataFrame(rows)
    table.to_csv(out, index=False)
    return old, table


def _recorded_workload_size(row: dict[str, Any]) -> int | None:
    """The row's `workload_prompts`, or None (today's) for a table from before the column."""
    n = row.get("workload_prompts")
    return None if n is None or pd.isna(n) else int(n)


def summarize(table: pd.DataFrame, column: str = "error_pct") -> str:
    """Per regime: configurations, median and max |error| (NaN errors are not counted)."""
    lines = []
    for regime, g in table.groupby("regime"):
        err = g[column].abs().dropna() if column in g else pd.Series(dtype=float)
        if err.empty:
            lines.append(f"{regime}: {len(g)} configurations, no {column}")
            continue
        lines.append(f"{regime}: {len(err)} configurations, |error| median {err.median():.1f} %, "
                     f"max {err.max():.1f} %")
        for extra in ("error_sim_pct", "error_replay_pct", "acceptance_error_pct",
                      "iter_time_error_pct"):
            if extra != column and extra in g and g[extra].notna().any():
                e = g[extra].abs().dropna()
                lines.append(f"  {extra}: median {e.median():.1f} %, max {e.max():.1f} %")
        if "acceptance_se_pct" in g and g["acceptance_se_pct"].notna().any():
            se = g["acceptance_se_pct"].dropna()
            within = (g["acceptance_error_pct"].abs() <= 2 * g["acceptance_se_pct"]).sum()
            lines.append(f"  acceptance sampling error of the runs (prompt-to-prompt): median "
                         f"{se.median():.1f} %; {within} of {len(se)} acceptance errors "
                         "within 2 of it")
    return "\n".join(lines)


def compare(before: pd.DataFrame, after: pd.DataFrame) -> str:
    """Before/after |error| per regime (median, max) and the rows that moved most."""
    lines = []
    for regime in sorted(set(before["regime"]) | set(after["regime"])):
        b = before[before["regime"] == regime]["error_pct"].abs().dropna()
        a = after[after["regime"] == regime]["error_pct"].abs().dropna()
        fmt = lambda e: (f"median {e.median():.1f} %, max {e.max():.1f} %"
                         if len(e) else "no errors")
        lines.append(f"{regime}: before {fmt(b)} ({len(b)}) -> after {fmt(a)} ({len(a)})")
    return "\n".join(lines)
