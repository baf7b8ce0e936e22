"""Greedy vs sampled latency: a set that timed the sampling phases in both modes prices a run
in its own; a set of one mode prices as before and widens the interval for the other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vegas_sim import api
from vegas_sim.errors import TraceSetError
from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.latency import LatencyModel
from vegas_sim.sim.predict import Scenario, predict
from vegas_sim.sim.uncertainty import interval, parts_of
from vegas_sim.traces.io import load_trace_set
from vegas_sim.traces.schema import LATENCY_FILE, UNRECORDED_TEMPERATURE
from vegas_sim.traces.synthetic import make_synthetic_trace_set
from vegas_sim.traces.validation import validate_latency

# greedy ms / sampled ms the synthetic set of both modes is written with
RATIO = {"draft_step": 0.5, "sample": 0.25}
GRID: dict[str, Any] = dict(model="smollm2-135m", seed=0, methods=("vanilla", "vegas"),
                            gammas=(2, 4), sparsities=(0.05, 0.1), contexts=(1024, 4096),
                            batches=(1, 4, 16), requests=4, iterations=16, noise=0.0,
                            temperatures=(0.0, 0.6))


def _models(path: Path, **kw: Any) -> tuple[Any, AcceptanceModel]:
    ts = make_synthetic_trace_set(path, **{**GRID, **kw})
    return api.fit_latency(ts), AcceptanceModel.from_traces(ts.acceptance, ts.weights_kind)


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, AcceptanceModel]:
    return _models(tmp_path_factory.mktemp("both") / "ts", latency_temperature=0.6,
                   greedy_over_sampled=RATIO)


@pytest.fixture(scope="module")
def sampled_only(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, AcceptanceModel]:
    return _models(tmp_path_factory.mktemp("one") / "ts", latency_temperature=0.6)


def _scenarios(temperature: float) -> list[Scenario]:
    return [Scenario(m, 4, 0.05, batch=4, context=2048, output_len=64, temperature=temperature)
            for m in ("vanilla", "vegas")]


def test_a_set_of_both_modes_prices_a_greedy_run_by_its_greedy_rows(both: Any) -> None:
    latency = both[0]
    assert latency.measured_modes == ("greedy", "sampled")
    contexts = np.full(4, 2048, dtype=np.int64)
    greedy = latency.for_temperature(0.0).iteration_cost("vegas", 4, 0.05).breakdown(contexts)
    sampled = latency.for_temperature(0.6).iteration_cost("vegas", 4, 0.05).breakdown(contexts)
    for phase, ratio in RATIO.items():  # the fits reproduce the rows' ratio
        assert greedy[phase] / sampled[phase] == pytest.approx(ratio, rel=0.05)
    assert greedy["verify"] == pytest.approx(sampled["verify"])  # not a sampling phase
    rows = predict([*_scenarios(0.0), *_scenarios(0.6)], *both, replications=2)
    g, s = rows.iloc[:2], rows.iloc[2:]
    assert (g["throughput_tok_s"].to_numpy() > s["throughput_tok_s"].to_numpy()).all()
    assert list(rows["latency_sampling"]) == ["greedy"] * 2 + ["sampled at T 0.6"] * 2
    assert (rows["pi_sampling_mode_pct"] == 0.0).all()


def test_a_one_mode_set_prices_every_run_in_its_mode_and_widens_the_other(
        sampled_only: Any, both: Any) -> None:
    latency = sampled_only[0]
    # the same iteration cost at either temperature: priced as sampled, as before
    assert latency.for_temperature(0.0) is latency and not latency.prices_mode(0.0)
    rows = predict([*_scenarios(0.0), *_scenarios(0.6)], *sampled_only, replications=2)
    g, s = rows.iloc[:2].reset_index(), rows.iloc[2:].reset_index()
    assert (s["pi_sampling_mode_pct"] == 0.0).all()
    assert (g["pi_sampling_mode_pct"] > 0.0).all()
    assert g["latency_sampling"].iloc[0] == "sampled at T 0.6 (run greedy: not measured)"
    # the term raises pi_high only, over what the row's symmetric parts give
    for _, r in g.iterrows():
        lo, hi, _ = interval(r["throughput_tok_s"], parts_of(dict(r)), r["pi_host_protocol_pct"])
        assert r["pi_low"] == pytest.approx(lo)
        assert r["pi_high"] > hi or r["pi_high"] == pytest.approx(
            r["throughput_tok_s"] * 5 / r["acceptance_length"])  # the physical bound
    # a greedy-only set prices a sampled run slower: pi_low lowered
    greedy_only = both[0].for_temperature(0.0)
    greedy_only._mode_groups = {}  # the greedy fits alone: a set timed greedy
    row = predict(_scenarios(0.6)[:1], greedy_only, both[1], replications=2).iloc[0]
    assert row["pi_sampling_mode_pct"] < 0.0
    lo = interval(row["throughput_tok_s"], parts_of(dict(row)), row["pi_host_protocol_pct"])[0]
    assert row["pi_low"] < lo


def test_a_one_mode_set_predicts_as_a_set_without_the_column(tmp_path: Path,
                                                             sampled_only: Any) -> None:
    """Rows recording the grid's temperature and rows from before the column (unrecorded)
    fit the same model: same-seed predictions identical."""
    path = tmp_path / "ts"
    make_synthetic_trace_set(path, **GRID, latency_temperature=0.6,
                             greedy_over_sampled=RATIO)
    ts = load_trace_set(path)
    sampled = ts.latency[ts.latency["temperature"] > 0].drop(columns=["temperature"])
    old = LatencyModel.from_meta(sampled, ts.meta)
    assert old.measured_modes == ("sampled",)
    a = predict(_scenarios(0.0), old, sampled_only[1], replications=2, seed=3)
    b = predict(_scenarios(0.0), sampled_only[0], sampled_only[1], replications=2, seed=3)
    cols = [c for c in a.columns if c not in ("wall_s", "latency_traces")]
    pd.testing.assert_frame_equal(a[cols], b[cols])


def test_latency_temperature_round_trips_and_old_tables_read_unrecorded(tmp_path: Path) -> None:
    path = tmp_path / "ts"
    make_synthetic_trace_set(path, **GRID, latency_temperature=0.6, greedy_over_sampled=RATIO)
    lat = load_trace_set(path).latency
    assert set(lat["temperature"]) == {0.0, 0.6}
    assert set(lat[lat["temperature"] == 0.0]["phase"]) == set(RATIO)
    old = tmp_path / "old"
    make_synthetic_trace_set(old, **GRID)
    table = pq.read_table(old / LATENCY_FILE)
    assert "temperature" in table.column_names  # the reader fills it: unrecorded
    assert set(load_trace_set(old).latency["temperature"]) == {UNRECORDED_TEMPERATURE}
    no_column = table.drop(["temperature"])
    assert "temperature" not in no_column.column_names
    back = validate_latency(no_column, "old")
    assert set(back.column("temperature").to_pylist()) == {UNRECORDED_TEMPERATURE}
    col = back.schema.get_field_index("temperature")
    bad = back.set_column(col, "temperature", pa.array([-2.0] * back.num_rows))
    with pytest.raises(TraceSetError, match="temperature"):
        validate_latency(bad, "bad")


def test_a_drafting_rows_vanilla_baseline_is_in_its_own_mode(both: Any) -> None:
    """On a set of both modes a greedy vanilla runs faster, so a sampled row's speedup is over
    the sampled vanilla whatever ran before it in the call."""
    alone = predict(_scenarios(0.6), *both, replications=2, seed=1)
    after_greedy = predict([*_scenarios(0.0), *_scenarios(0.6)], *both, replications=2, seed=1)
    assert after_greedy["speedup_vs_vanilla"].iloc[3] == pytest.approx(
        alone["speedup_vs_vanilla"].iloc[1], rel=1e-12)
