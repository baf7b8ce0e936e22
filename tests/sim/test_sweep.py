"""Sweep: grid expansion, determinism across workers/chunks/order/Dask, output files, errors."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vegas_sim import api
from vegas_sim.errors import DoesNotFitError, UserInputError
from vegas_sim.reports.csv import read_table, write_table
from vegas_sim.sim import sweep as sweep_module
from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.latency import LatencyModel
from vegas_sim.sim.predict import Scenario
from vegas_sim.sim.sweep import SweepGrid, SweepRunner, sweep
from vegas_sim.traces.synthetic import make_synthetic_trace_set

# Timing columns: wall-clock, legitimately different between runs.
TIMING = ["wall_s"]
Models = tuple[LatencyModel, AcceptanceModel]


def synthetic_models(path: Path) -> Models:
    """Latency + acceptance fitted on a synthetic set (qwen3-8b shape, known ground truth)."""
    ts = make_synthetic_trace_set(
        path, model="qwen3-8b", seed=0, gammas=(2, 4, 8, 12),
        sparsities=(0.01, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2), contexts=(4096, 32768),
        batches=(1, 4, 16), requests=8, iterations=32, noise=0.0)
    return api.fit_latency(ts), AcceptanceModel.from_traces(ts.acceptance, ts.weights_kind)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    return synthetic_models(tmp_path_factory.mktemp("sweep") / "ts")


GRID = SweepGrid(methods=("vegas", "magicdec-stream"), gamma=(2, 4, 6),
                 sparsity=(0.03, 0.07), batch=(1, 4), context=(4096, 32768), output_len=(128,))


def strip(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=TIMING).reset_index(drop=True)


def test_grid_expansion_and_parse() -> None:
    scen = GRID.scenarios()
    assert len(scen) == len(GRID) == 4 * (1 + 2 * 3 * 2)
    assert [s.method for s in scen[:2]] == ["vanilla", "vegas"]
    assert sum(s.method == "vanilla" for s in scen) == 4  # one baseline per cell
    parsed = SweepGrid.parse(methods=("vegas,magicdec-stream",), gamma="2..6:2",
                             sparsity="3%,0.07", batch="1,4", context="4K,32K", output_len="128")
    assert parsed == GRID
    with pytest.raises(UserInputError, match="--gamma"):
        SweepGrid.parse(methods=("vegas",), gamma="0..3", sparsity="0.1", batch="1",
                        context="1K", output_len="8")
    with pytest.raises(UserInputError, match="--method"):
        SweepGrid.parse(methods=("eagle",), gamma="2", sparsity="0.1", batch="1",
                        context="1K", output_len="8")


def test_rows_in_grid_order_with_metrics_and_ci(models: Models) -> None:
    df = sweep(GRID, *models, engine="analytic", workers=1)
    assert len(df) == len(GRID)
    keys = ["method", "gamma", "sparsity", "batch", "context"]
    expected = [(s.method, s.gamma, s.sparsity, s.batch, s.context) for s in GRID.scenarios()]
    assert list(df[keys].itertuples(index=False, name=None)) == expected
    for col in ("throughput_tok_s", "throughput_ci_low", "throughput_ci_high",
                "speedup_vs_vanilla", "speedup_ci_low", "speedup_ci_high", "iter_ms"):
        assert df[col].notna().all() and (df[col] > 0).all(), col
    assert (df["throughput_ci_low"] <= df["throughput_tok_s"]).all()
    # Speedup really is over the vanilla row of the same cell.
    van = df[df["method"] == "vanilla"].set_index(["batch", "context"])["throughput_tok_s"]
    spec = df[df["method"] != "vanilla"]
    ratio = spec["throughput_tok_s"].to_numpy() / van.loc[
        list(zip(spec["batch"], spec["context"]))].to_numpy()
    np.testing.assert_allclose(spec["speedup_vs_vanilla"], ratio, rtol=1e-9)


def test_same_rows_whatever_workers_chunks_or_order(models: Models) -> None:
    one = sweep(GRID, *models, engine="sim", replications=2, workers=1)
    pooled = sweep(GRID, *models, engine="sim", replications=2, workers=2, chunk_size=5)
    pd.testing.assert_frame_equal(strip(one), strip(pooled))
    rev = sweep(list(reversed(GRID.scenarios())), *models, engine="sim", replications=2,
                workers=1, chunk_size=7)
    pd.testing.assert_frame_equal(strip(one), strip(rev.iloc[::-1]))
    other_seed = sweep(GRID, *models, engine="sim", replications=2, workers=1, seed=1)
    spec = one["method"] != "vanilla"
    assert not np.allclose(one.loc[spec, "throughput_tok_s"],
                           other_seed.loc[spec, "throughput_tok_s"])


def test_dask_local_cluster_identical(models: Models) -> None:
    distributed = pytest.importorskip("dask.distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None, silence_logs=40) as cluster:
        done: list[int] = []
        remote = sweep(GRID, *models, engine="sim", replications=2, scheduler=cluster,
                       chunk_size=4, progress=lambda d, t: done.append(d))
    local = sweep(GRID, *models, engine="sim", replications=2, workers=1)
    pd.testing.assert_frame_equal(strip(local), strip(remote))
    assert done[-1] == len(GRID)


def test_both_engines_two_rows_that_agree(models: Models) -> None:
    grid = SweepGrid(methods=("vegas",), gamma=(4,), sparsity=(0.07,), batch=(4,),
                     context=(4096,), output_len=(256,))
    df = sweep(grid, *models, engine="both", replications=3, workers=1)
    assert list(df["engine"]) == ["analytic", "sim", "analytic", "sim"]
    thr = df.set_index(["method", "engine"])["throughput_tok_s"]
    assert thr[("vegas", "sim")] == pytest.approx(thr[("vegas", "analytic")], rel=0.1)


def test_progress_and_output_files(models: Models, tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    df = sweep(GRID, *models, workers=1, chunk_size=10,
               progress=lambda d, t: seen.append((d, t)))
    write_table(df, tmp_path / "s.parquet")
    assert seen == [(10, 52), (20, 52), (30, 52), (40, 52), (50, 52), (52, 52)]
    back = read_table(tmp_path / "s.parquet")
    assert len(back) == len(df) and "rate_1" in back.columns and "rates" not in back.columns
    row = back[(back["method"] == "vegas") & (back["gamma"] == 2)].iloc[0]
    assert np.isnan(row["rate_3"]) and 0 < row["rate_2"] <= row["rate_1"] <= 1
    with pytest.raises(UserInputError, match="--out"):
        write_table(df, tmp_path / "s.txt")


def test_configurations_that_do_not_fit_are_skipped_and_named(models: Models) -> None:
    """A grid's corners that the model (positions) cannot hold are left out and named, one
    note per cell; the rest of the grid still runs. A batch whose KV outgrows the GPU runs
    (admitted by the KV in use, preempted as vLLM does), with fewer sequences running."""
    grid = SweepGrid(methods=("vegas",), gamma=(4,), sparsity=(0.07,), batch=(1, 64),
                     context=(4096, 65536, 131072), output_len=(128,))
    table = sweep(grid, *models, workers=1)
    assert set(zip(table["batch"], table["context"])) == {(1, 4096), (64, 4096), (1, 65536),
                                                          (64, 65536)}
    big = table[(table["batch"] == 64) & (table["context"] == 65536)]
    assert (big["mean_running_batch"] < 64).all()
    notes = table.attrs["skipped"]
    assert len(notes) == 2
    assert sum("exceeds qwen3-8b's 131072 positions" in n for n in notes) == 2
    assert "(2 configurations)" in notes[0]  # vanilla and vegas of the cell


def test_bad_scenario_and_engine_are_user_errors(models: Models) -> None:
    too_long = [Scenario("vegas", 4, 0.07, batch=1, context=10**7, output_len=64)]
    with pytest.raises(DoesNotFitError, match="exceeds qwen3-8b's 131072 positions"):
        sweep(too_long, *models, workers=2)
    with pytest.raises(UserInputError, match="--engine"):
        sweep(GRID, *models, engine="fast", workers=1)


def test_runner_reuses_pool(models: Models) -> None:
    with SweepRunner(*models, workers=2) as runner:
        a = runner.run(GRID.scenarios()[:8], chunk_size=2)
        pool = runner._pool
        b = runner.run(GRID.scenarios()[:8], chunk_size=4)
        assert pool is not None and runner._pool is pool
    pd.testing.assert_frame_equal(strip(a), strip(b))


def test_estimate_leaves_out_each_points_one_time_work(
        models: Models, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first configuration at a (batch, context) pays that point's baselines and the
    process's warm-up, which a run pays once per point and worker: the estimate times the
    others, as many as the sample has."""
    seen: set[tuple[int, int]] = set()

    def fake_chunk(items, *args, **kwargs):  # type: ignore[no-untyped-def]
        sc = items[0][1]
        time.sleep(0.01 if (sc.batch, sc.context) in seen else 0.3)
        seen.add((sc.batch, sc.context))
        return pd.DataFrame({"_order": [items[0][0]]})

    monkeypatch.setattr(sweep_module, "run_chunk", fake_chunk)
    lat, acc = models
    sample = [Scenario("vegas", g, 0.05, b, 4096, 64) for b in (1, 8) for g in (2, 4)]
    with SweepRunner(lat, acc, workers=1) as runner:
        per, rows = runner.timed_sample(sample, budget_s=10.0)
    assert 0.005 < per < 0.1 and len(rows) == 2
