"""`vegas-sim validate --repredict`: new predictions for an earlier result table, with the
measured columns kept. CPU only: no GPU run."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from vegas_sim.errors import UserInputError
from vegas_sim.methods import drafts
from vegas_sim.sim.predict import predict
from vegas_sim.validate.heldout import heldout_from_record
from vegas_sim.validate.predict import (
    load_models,
    predict_replayed,
    predicted_phases,
    prediction_replications,
    resolve_temperature,
    scenario,
)
from vegas_sim.validate.results import (
    pass_columns,
    passes_from_row,
    pct_error,
    pool_passes,
    read_results,
    recorded_prompt_cut,
    recorded_workload_size,
    result_row,
)


def repredict(results: Path, *, traces: Path, acceptance_traces: Path | None, out: Path,
              seed: int = 0, replications: int = 5,
              log: Callable[[str], None] | None = None,
              acceptance_anchors: Sequence[str | Path] = (), gpu: str | None = None,
              ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Re-predict every row of an earlier result table with the *current* simulator.

    The measured columns (throughput, iterations, accept counts, time) are kept; every
    predicted column and error is recomputed from `traces` / `acceptance_traces`. Writes the
    new table to `out` and returns (old table, new table); `compare` summarises the two.
    A table from before accept counts were recorded gets NaN for the replay columns (and for
    `predicted` in the replay regime). gpu: price the rows on that GPU (a --gpu datasheet
    name) from `traces` measured on another: how far the what-if lands from runs made there.
    """
    old = read_results(results)
    models = load_models(traces, acceptance_traces, log, acceptance_anchors, gpu=gpu)
    rows = []
    for i, rec in enumerate(old.to_dict(orient="records")):
        row = {str(k): v for k, v in rec.items()}
        weights = "real" if str(row["regime"]).startswith("real") else "random"
        h = heldout_from_record(row)
        if h.temperature is None:  # an unresolved row (should not happen): resolve now
            h = resolve_temperature(h, models)[0]
        sc = scenario(h, weights, models.min_tokens)
        try:
            pred = predict([sc], models.latency, models.acceptance, seed=seed,
                           replications=prediction_replications(h, replications)).iloc[0]
        except UserInputError as e:  # its option names are predict's, not this command's
            raise UserInputError(
                f"row {i + 1} ({h.method}, batch {h.batch}, context {h.context}) cannot be "
                f"predicted with {models.latency.model.name}'s latency set: {e.problem}",
                where=str(results),
                fix="pass as --traces the latency set these rows were measured against") from None
        passes = passes_from_row(row)
        m = pool_passes(passes)
        rep, rep_iter = (predict_replayed(sc, models.latency, m.accepted, h.waves, seed)
                         if m.accepted or not drafts(h.method) else (math.nan, math.nan))
        notes = row.get("notes")
        new = result_row(h, pred, m, weights, rep, rep_iter,
                          "" if notes is None or pd.isna(notes) else str(notes),
                          float(row.get("wall_s", math.nan)),
                          predicted_phases(h, models.latency, m, models.min_tokens),
                          recorded_workload_size(row), recorded_prompt_cut(row))
        new["measured"] = float(row["measured"])  # as measured, not recomputed from the parts
        for pred_col, err_col in (("predicted", "error_pct"), ("predicted_sim", "error_sim_pct"),
                                  ("predicted_replay", "error_replay_pct")):
            new[err_col] = pct_error(new[pred_col], new["measured"])
        if "measured_passes" in row:
            new.update(pass_columns(passes, new["predicted"]))
        if "measured_iter_ms" in row and not pd.isna(row["measured_iter_ms"]):
            new["measured_iter_ms"] = float(row["measured_iter_ms"])
            new["iter_time_error_pct"] = pct_error(rep_iter, new["measured_iter_ms"])
        rows.append(new)
    table = pd.DataFrame(rows)
    table.to_csv(out, index=False)
    return old, table

