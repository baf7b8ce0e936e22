"""`vegas-sim validate`: measure and predict every held-out configuration, and write the
result table as it goes (nothing is lost if the run is interrupted; `resume` continues it)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from vegas_sim.calibrate import loading, tp_run
from vegas_sim.calibrate.measure_latency import oom_types
from vegas_sim.calibrate.runner import check_device
from vegas_sim.calibrate.tp_run import RankGroup
from vegas_sim.errors import UserInputError
from vegas_sim.methods import METHODS, VANILLA
from vegas_sim.progress import LabelledProgress, Say
from vegas_sim.sim.predict import predict
from vegas_sim.sim.scenario import kv_capacity
from vegas_sim.validate.heldout import (
    HeldOut,
    check_outside_grid,
    heldout_from_record,
    random_heldout,
    read_heldout,
    write_heldout,
)
from vegas_sim.validate.measure import measure_config
from vegas_sim.validate.predict import (
    load_models,
    other_gpu_note,
    predict_replayed,
    predicted_phases,
    prediction_replications,
    resolve_temperature,
    scenario,
)
from vegas_sim.validate.results import (
    PROMPT_CUT,
    Measurement,
    pass_columns,
    passes_from_row,
    pct_error,
    phase_line,
    pool_passes,
    read_results,
    recorded_prompt_cut,
    recorded_workload_size,
    result_row,
)

# Share of the device's memory for weights and KV cache when drawing random held-out
# configurations (vLLM's gpu_memory_utilization, below its 0.9 for the runtime's buffers)
HELDOUT_MEMORY_SHARE = 0.8


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


def run_validation(
    *, traces: Path, acceptance_traces: Path | None, heldout_file: Path | None,
    n_random: int | None, model: str, weights: str, max_batch: int,
    contexts: tuple[int, int], output_len: int, device: str, seed: int, out: Path,
    progress: LabelledProgress | None = None, replications: int = 5,
    time_budget_s: float | None = None, log: Say | None = None,
    phase_wave: bool = True, acceptance_anchors: Sequence[str | Path] = (),
    passes: int = 1, resume: bool = False, tensor_parallel: int = 1,
) -> pd.DataFrame:
    """Measure and predict every held-out configuration; write and return the result table.

    `passes`: the held-out list is measured this many times in turn (every configuration
    once, then every configuration again, ...), with the same prompts and seeds each pass;
    a row's `measured` pools its passes. The host a small model's loop is bound by can run
    slower for stretches (docs/RESULTS.md, Validation); passes spread each configuration
    over them instead of letting one stretch land whole on one row, and their spread
    (`measured_pass_se_pct`) is the measurement's own timing noise.

    `resume`: keep the passes an earlier, interrupted run wrote to `out` (the same held-out
    configurations) and measure only the rest.

    `phase_wave`: one more wave per configuration with per-phase timers (not part of the
    measured throughput), compared phase by phase with the latency model in the table's
    `measured_phase_ms` / `predicted_phase_ms` — which phase a miss comes from.

    `time_budget_s`: no new configuration starts after this many seconds (the ones done are
    written; the rest are logged as skipped), so a bounded GPU call still ends with a table.

    `tensor_parallel` N > 1: the model is sharded over N processes as `calibrate --tp N`
    shards it (calibrate/tp_run.py), every rank decoding every configuration, rank 0
    measuring, predicting and writing; the latency set is used as measured at N, or, measured
    on one GPU, priced at N as a what-if (`sim.parallel`).
    """
    settings = {k: v for k, v in locals().items() if k not in ("progress", "log")}
    if tensor_parallel > 1:
        tp_run.check_group(model, device, tensor_parallel)
        check_device(device)
        table: pd.DataFrame = tp_run.run_ranks(tensor_parallel, device, _validate_rank,
                                               (settings,), progress=progress,
                                               say=log or (lambda _line: None))
        return table
    led = _validate(**settings, progress=progress, log=log)
    assert led is not None  # one process leads itself
    return led


def _validate_rank(group: RankGroup, settings: dict[str, Any]) -> pd.DataFrame | None:
    """One rank of `validate --tp N`: the same loop as the others, rank 0 writing."""
    return _validate(**settings, progress=group.progress if group.lead else None,
                     log=group.say if group.lead else None, group=group)


def _validate(
    *, traces: Path, acceptance_traces: Path | None, heldout_file: Path | None,
    n_random: int | None, model: str, weights: str, max_batch: int,
    contexts: tuple[int, int], output_len: int, device: str, seed: int, out: Path,
    progress: LabelledProgress | None, replications: int, time_budget_s: float | None,
    log: Say | None, phase_wave: bool,
    acceptance_anchors: Sequence[str | Path], passes: int, resume: bool,
    tensor_parallel: int, group: RankGroup | None = None,
) -> pd.DataFrame | None:
    """`run_validation` in one process, or on one rank of a group (`group`)."""
    lead = group is None or group.lead
    t_start = time.perf_counter()
    models = load_models(traces, acceptance_traces, log, acceptance_anchors, tensor_parallel)
    heldout = _heldout_for(models, heldout_file, n_random, weights=weights, seed=seed,
                           max_batch=max_batch, contexts=contexts, output_len=output_len,
                           device=device)
    if lead:
        write_heldout(heldout, out.with_suffix(".heldout.csv"))
    resolved = [resolve_temperature(h0, models) for h0 in heldout]
    done = resumed_passes(out, [h for h, _ in resolved]) if resume else {}
    if device == "cuda" and lead and log is not None:
        note = other_gpu_note(models, torch.cuda.get_device_name())
        if note:
            log(f"note: {note}")
    if group is None:
        runtime_model: Any = loading.load_model(model, weights=weights, device=device,
                                                seed=seed)[0]
    else:
        done = group.from_lead(done)
        runtime_model = tp_run.load_shard(group, model, weights=weights, dtype=None, seed=seed,
                                          device=device)[0]
    runs = {i: done.get(i) or _ConfigRun(h, note, passes=[])
            for i, (h, note) in enumerate(resolved)}
    rows: dict[int, dict[str, Any]] = {}

    def row_of(run: _ConfigRun) -> dict[str, Any]:
        return run.row(models, weights, seed, replications)

    total, step = len(runs) * passes, 0
    for p, (i, run) in ((p, item) for p in range(passes) for item in runs.items()):
        if len(run.passes) > p:  # measured by the run this one resumes
            if i not in rows and lead:
                rows[i] = row_of(run)
            step += 1
            continue
        spent = time_budget_s is not None and time.perf_counter() - t_start > time_budget_s
        if group is not None:
            spent = group.from_lead(spent)  # the ranks stop together
        if spent:
            if log:
                log(f"time budget {time_budget_s:g} s spent: {total - step} of {total} "
                    f"measurements not started (from {run.h.label}, pass {p + 1}); --resume "
                    "continues")
            break
        label = run.h.label + (f" (pass {p + 1})" if passes > 1 else "")
        if progress:
            progress(step, total, label)
        t_cfg = time.perf_counter()
        try:
            m, prompt_note = measure_config(runtime_model, run.h, models.acceptance, weights,
                                            seed, i, models, phase_wave and p == 0)
        except oom_types():
            if group is not None:  # the ranks would part ways: stop them all
                raise
            torch.cuda.empty_cache()
            step += 1
            if log:
                log(f"{label}: skipped, out of GPU memory (the row is not in the table; a "
                    "GPU with more memory, or a smaller batch or context, measures it)")
            continue
        run.add(m, prompt_note, time.perf_counter() - t_cfg)
        step += 1
        if not lead:
            continue
        rows[i] = row_of(run)
        if log:
            log(f"{label}: measured {m.throughput:.1f} tok/s, predicted "
                f"{rows[i]['predicted']:.1f} ({pct_error(rows[i]['predicted'], m.throughput):+.1f}"
                f" %), {time.perf_counter() - t_cfg:.1f} s"
                + (phase_line(rows[i]) if p == 0 else ""))
        _write(rows, out)  # nothing lost if interrupted
    if progress:
        progress(total, total, "done")
    return _write(rows, out) if lead else None


def _heldout_for(models: Any, heldout_file: Path | None, n_random: int | None, *,
                 weights: str, seed: int, max_batch: int, contexts: tuple[int, int],
                 output_len: int, device: str) -> list[HeldOut]:
    """The held-out configurations of a run: a file's, or drawn within what the device's memory
    holds and both sets can predict (a method neither calibrated would fail mid-run)."""
    latency, acceptance = models.latency, models.acceptance
    spec = latency.model
    lo, hi = contexts[0], min(contexts[1], int(spec.max_positions) - output_len - 64)
    # Real runs decode real prompts: the acceptance predicted is that workload's. Random
    # weights replay acceptance pooled over the traced workloads.
    traced = [str(w) for w in acceptance.coverage()["workloads"]]
    workloads: list[str | None] = (
        [None] if weights == "random" else list(traced) or ["longdoc"])
    torch_device = check_device(device)
    mem = (torch.cuda.get_device_properties(torch_device).total_memory
           if torch_device.type == "cuda" else 16 << 30)
    # one GPU's shard at TP > 1; the KV cache predict would give it at HELDOUT_MEMORY_SHARE
    max_tokens = kv_capacity(latency.gpu_model, mem / 1e9, HELDOUT_MEMORY_SHARE,
                             running=max_batch)
    acc_methods = {VANILLA, *(str(m) for m in acceptance.coverage()["methods"])}
    covered = [m for m in latency.methods_covered() if m in acc_methods]
    return choose_heldout(heldout_file, n_random, models.grid, seed=seed,
                          max_batch=max_batch, contexts=(lo, hi), output_len=output_len,
                          max_tokens=max_tokens, workloads=workloads, methods=covered)


def resumed_passes(out: Path, configs: Sequence[HeldOut]) -> dict[int, _ConfigRun]:
    """What an interrupted `validate --out OUT` measured, by configuration index (nothing if
    OUT does not exist yet). Refuses a table written for other configurations."""
    if not out.exists():
        return {}
    index = {dataclasses.astuple(h): i for i, h in enumerate(configs)}
    done = {}
    for rec in read_results(out).to_dict(orient="records"):
        row = {str(k): v for k, v in rec.items()}
        h = heldout_from_record(row)
        if dataclasses.astuple(h) not in index:
            raise UserInputError(
                f"the table holds {h.label}, which is not among the held-out configurations "
                "of this run", where=str(out),
                fix="resume with the --heldout (or --random and --seed) of the run that wrote "
                    "it, or name a new --out")
        notes = row.get("notes")
        done[index[dataclasses.astuple(h)]] = _ConfigRun(
            h, "" if not isinstance(notes, str) else notes, passes_from_row(row),
            wall_s=float(np.nan_to_num(row.get("wall_s", 0.0))),
            workload_prompts=recorded_workload_size(row), prompt_cut=recorded_prompt_cut(row))
    return done


def _write(rows: dict[int, dict[str, Any]], out: Path) -> pd.DataFrame:
    """The result table in held-out order, written whole."""
    table = pd.DataFrame([rows[i] for i in sorted(rows)])
    table.to_csv(out, index=False)
    return table


@dataclasses.dataclass
class _ConfigRun:
    """One held-out configuration: its passes so far, and its result row from them. Both
    predictions are made once, on the first row asked for: the replayed one replays the first
    pass's accept counts, which later passes (same prompts and seeds) do not change."""

    h: HeldOut
    note: str
    passes: list[Measurement]
    prompt_note: str = ""
    wall_s: float = 0.0
    # how its real prompts were picked (a resumed row keeps its table's: results.PROMPT_CUT)
    workload_prompts: int | None = None
    prompt_cut: str = PROMPT_CUT
    pred: pd.Series | None = None
    replayed: tuple[float, float] | None = None  # (throughput, iteration ms)

    def add(self, m: Measurement, prompt_note: str, wall_s: float) -> None:
        self.passes.append(m)
        self.prompt_note = self.prompt_note or prompt_note
        self.wall_s += wall_s

    def row(self, models: Any, weights: str, seed: int, replications: int) -> dict[str, Any]:
        latency = models.latency
        sc = scenario(self.h, weights, models.min_tokens)
        if self.pred is None:
            self.pred = predict([sc], latency, models.acceptance, seed=seed,
                                replications=prediction_replications(self.h, replications)
                                ).iloc[0]
        m = pool_passes(self.passes)
        if self.replayed is None:
            self.replayed = predict_replayed(sc, latency, m.accepted, self.h.waves, seed)
        rep, rep_iter = self.replayed
        notes = ";".join(n for n in (self.note, self.prompt_note) if n)
        row = result_row(self.h, self.pred, m, weights, rep, rep_iter, notes, self.wall_s,
                         predicted_phases(self.h, latency, m, models.min_tokens),
                         self.workload_prompts, self.prompt_cut)
        return {**row, **pass_columns(self.passes, row["predicted"])}
