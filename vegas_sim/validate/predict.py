"""The simulator's side of a validation row: the models of the trace sets, the scenario of a
held-out configuration, and its predictions (from the acceptance model, or replayed from the
run's own accept counts). CPU only."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vegas_sim import api
from vegas_sim.gpus import datasheet_for_device, get_gpu
from vegas_sim.methods import drafts
from vegas_sim.sim.acceptance_dist import FixedSequences
from vegas_sim.sim.engine import simulate
from vegas_sim.sim.metrics import steady_window
from vegas_sim.sim.metrics import summarize as run_summary
from vegas_sim.sim.parallel import TensorParallel
from vegas_sim.sim.predict import Scenario, engine_config, iteration_cost, scenario_kv_capacity
from vegas_sim.traces import catalog
from vegas_sim.validate.heldout import HeldOut, grid_of
from vegas_sim.validate.results import Measurement


@dataclasses.dataclass
class Models:
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
                log: Callable[[str], None] | None = None,
                acceptance_anchors: Sequence[str | Path] = (),
                tensor_parallel: int = 1, gpu: str | None = None) -> Models:
    """Latency model of `traces`; acceptance model of `acceptance_traces`, by default of
    `traces` when it has real-weights acceptance, else of the packaged real-weights set (as
    `predict` does; `notes` say which, and go to `log` as "note: ..." lines).

    acceptance_anchors: anchors that set the acceptance level (`api.anchor_acceptance`). Only
    when given: unlike `predict`, validation applies no packaged anchors by default, because
    a real-weights run measures the acceptance set's own model, and a random-weights run
    replays acceptance drawn from the same model the prediction uses.

    tensor_parallel: the group size the run decodes at (`validate --tp`): a latency set
    measured at it is used as measured; one measured on one GPU is priced at it as a what-if
    (`sim.parallel`, noted); any other is refused.

    gpu: a --gpu datasheet name: `traces` priced on that GPU by datasheet ratios (as `predict
    --gpu` prices a what-if), unless it was measured there (noted either way)."""
    latency_set, acc_set, notes = catalog.resolve(None, traces, acceptance=acceptance_traces)
    acceptance, anchor_notes = api.anchor_acceptance(
        api.fit_acceptance(acc_set), acc_set, latency_set.model_name,
        tuple(acceptance_anchors) or (api.NO_ANCHORS,))
    notes = [*notes, *anchor_notes]
    latency = api.fit_latency(latency_set)
    if gpu is not None and catalog.measured_on(latency_set, gpu):
        notes = [*notes, f"GPU {gpu}: measured ({latency_set.name})"]
    elif gpu is not None:
        latency = latency.what_if(get_gpu(gpu))
        notes = [*notes, f"GPU {gpu}: what-if by datasheet ratios from {latency_set.name} "
                         f"({latency_set.gpu_name}) — NOT measured"]
    if tensor_parallel != latency.tensor_parallel.size:
        group = TensorParallel.of(latency.model, tensor_parallel,
                                  datasheet_for_device(latency.measured_gpu.name))
        latency = latency.with_tensor_parallel(group)
        notes = [*notes, group.label]
    elif latency.tensor_parallel.measured:
        notes = [*notes, latency.tensor_parallel.label]
    if log is not None:
        for note in notes:
            log(f"note: {note}")
    grid = latency_set.info.grid
    return Models(
        latency=latency,
        acceptance=acceptance,
        min_tokens=acc_set.info.grid.min_tokens,
        latency_temperature=grid.latency_temperature,
        sampling=grid.sampling,
        grid=grid_of(latency_set.meta), latency_meta=latency_set.meta,
        traced_temperatures=tuple(sorted(float(t) for t in acc_set.acceptance["temperature"]
                                         .unique())),
        notes=tuple(notes))


def other_gpu_note(models: Models, run_gpu: str) -> str | None:
    """A note when the GPU a validation runs on is not the one its latency set measured (by
    datasheet): the predictions are then that GPU's, and every error carries the gap."""
    measured = models.latency.measured_gpu.name
    # by datasheet where both are known, else by name: two unknown cards are not the same
    if (datasheet_for_device(run_gpu) or run_gpu) == (datasheet_for_device(measured) or measured):
        return None
    return (f"runs on {run_gpu}, the latency set was measured on {measured}: the predictions "
            f"are that GPU's (pass --traces a set measured on this GPU, e.g. `vegas-sim "
            f"calibrate` here)")


def resolve_temperature(h: HeldOut, models: Models) -> tuple[HeldOut, str]:
    """An empty temperature becomes the latency grid's when the acceptance set traced it
    (else the traced one nearest to it); a run whose sampling mode (greedy at T 0, else
    sampled) the latency set did not time is noted: the sample phase and sampled draft steps
    cost more than greedy argmax, and it is priced in the mode the set measured (the interval
    carries the sampling-mode term, sim.uncertainty). A set that timed both modes prices the
    run in its own: the note says which."""
    if h.temperature is None:
        want, traced = models.latency_temperature, models.traced_temperatures
        temp = want if not traced or any(abs(t - want) < 1e-9 for t in traced) else min(
            traced, key=lambda t: (abs(t - want), t))
        h = dataclasses.replace(h, temperature=temp)
    run_temp = float(h.temperature or 0.0)
    if not models.latency.prices_mode(run_temp):
        return h, (f"latency traced at temperature {models.latency_temperature:g}, run at "
                   f"{run_temp:g}: sampling cost differs (priced "
                   f"{models.latency.mode_label(run_temp)})")
    if abs(run_temp - models.latency_temperature) > 1e-9:
        return h, f"sampling phases priced {models.latency.mode_label(run_temp)}"
    return h, ""


# Requests the simulator runs for one prediction, at least (replications × batch): the
# prediction is the configuration's expected throughput, so its own Monte-Carlo error must sit
# well under the run's. With only as many simulated requests as the run measures (e.g. 5
# replications of 1-8 requests), a B = 1 prediction's CI is wide and two acceptance sets'
# predictions differ by more than at 256 requests. A workload whose prompts differ widely in
# acceptance (recall: a prompt the model copies from, or not) needs more: a short closed-batch
# window ends at its first finisher, so each batch is one noisy draw (docs/RESULTS.md, the
# held-out draw across every workload).
MIN_SIMULATED_REQUESTS = 1000  # the most replications predict takes (at batch 1)


def prediction_replications(h: HeldOut, replications: int) -> int:
    """Replications of h's closed batch: at least `replications`, h.waves, and enough for
    MIN_SIMULATED_REQUESTS requests."""
    return max(replications, h.waves, math.ceil(MIN_SIMULATED_REQUESTS / h.batch))


def scenario(h: HeldOut, weights: str, min_tokens: int) -> Any:
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
    cfg = engine_config(sc, scenario_kv_capacity(sc, latency))
    cost = iteration_cost(latency, sc)
    tokens, ms, iters = 0, 0.0, 0
    per_wave: list[Sequence[Sequence[int]] | None] = (
        [None] * waves if not drafts(sc.method) else list(accepted))
    for w, seqs in enumerate(per_wave):
        dist = None if seqs is None else FixedSequences(sc.gamma, [list(r) or [0] for r in seqs])
        res = simulate(cfg, cost, dist, seed=np.random.SeedSequence([seed, w]))
        m = run_summary(res)
        g0, g1 = steady_window(res)
        tokens += m.window_tokens
        ms += m.window_ms[1] - m.window_ms[0]
        iters += g1 - g0 + 1
    return tokens / (ms / 1000.0), ms / max(iters, 1)


def predicted_phases(h: HeldOut, latency: Any, m: Measurement, min_tokens: int
                     ) -> dict[str, float]:
    """The latency model's ms per iteration of each phase, at the context the requests had
    halfway through the measured window (the comparison for `Measurement.phase_ms`; {} when
    no phase wave ran)."""
    if not m.phase_ms:
        return {}
    per_request = m.tokens / max(h.batch * h.waves, 1)
    contexts = np.full(h.batch, h.context + int(per_request / 2), dtype=np.int64)
    cost = latency.for_temperature(h.temperature).iteration_cost(h.method, h.gamma, h.sparsity,
                                                                 min_tokens)
    return {k: float(v) for k, v in cost.breakdown(contexts).items()}
