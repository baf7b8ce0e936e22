"""`vegas-sim validate`: measure and predict every held-out configuration, and write the
result table as it goes (nothing is lost if the run is interrupted)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from vegas_sim.calibrate import loading
from vegas_sim.calibrate.runner import check_device
from vegas_sim.methods import METHODS
from vegas_sim.sim.predict import predict
from vegas_sim.validate.heldout import (
    HeldOut,
    check_outside_grid,
    random_heldout,
    read_heldout,
    write_heldout,
)
from vegas_sim.validate.measure import measure_config
from vegas_sim.validate.predict import (
    load_models,
    predict_replayed,
    predicted_phases,
    prediction_replications,
    resolve_temperature,
    scenario,
)
from vegas_sim.validate.results import phase_line, result_row

ProgressFn = Callable[[int, int, str], None]


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
    progress: ProgressFn | None = None, replications: int = 5,
    time_budget_s: float | None = None, log: Callable[[str], None] | None = None,
    phase_wave: bool = True, acceptance_anchors: Sequence[str | Path] = (),
) -> pd.DataFrame:
    """Measure and predict every held-out configuration; write and return the result table.

    `phase_wave`: one more wave per configuration with per-phase timers (not part of the
    measured throughput), compared phase by phase with the latency model in the table's
    `measured_phase_ms` / `predicted_phase_ms` — which phase a miss comes from.

    `time_budget_s`: no new configuration starts after this many seconds (the ones done are
    written; the rest are logged as skipped), so a bounded GPU call still ends with a table.
    """
    t_start = time.perf_counter()
    models = load_models(traces, acceptance_traces, log, acceptance_anchors)
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
    max_tokens = int(0.8 * (mem - spec.resident_weight_bytes()) / spec.kv_bytes_per_token())
    # draw only what both sets can predict: a method neither calibrated would fail mid-run
    acc_methods = {"vanilla", *(str(m) for m in acceptance.coverage()["methods"])}
    covered = [m for m in latency.methods_covered() if m in acc_methods]
    heldout = choose_heldout(heldout_file, n_random, models.grid, seed=seed,
                             max_batch=max_batch, contexts=(lo, hi), output_len=output_len,
                             max_tokens=max_tokens, workloads=workloads, methods=covered)
    write_heldout(heldout, out.with_suffix(".heldout.csv"))

    runtime_model, _tokenizer, _ = loading.load_model(model, weights=weights, device=device, seed=seed)
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
        sc = scenario(h, weights, models.min_tokens)
        pred = predict([sc], latency, acceptance, seed=seed,
                       replications=prediction_replications(h, replications)).iloc[0]
        t_cfg = time.perf_counter()
        m, prompt_note = measure_config(runtime_model, h, acceptance, weights, seed, i, models,
                                  phase_wave)
        rep, rep_iter = predict_replayed(sc, latency, m.accepted, h.waves, seed)
        notes = ";".join(n for n in (note, prompt_note) if n)
        rows.append(result_row(h, pred, m, weights, rep, rep_iter, notes,
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
