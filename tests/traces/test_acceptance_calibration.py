"""A trace set's own context-trend calibration: meta.json `acceptance_calibration`
({context_trend_sd_scale, from}) scales the sd of that set's context trend in every prediction
from it, is checked by `traces check` and every loader, and is dropped by `traces merge` and
`traces subset` (their rows were not the ones the hold-out measured)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from click.testing import CliRunner

from tests.sim.test_context_trend import trend_traces
from tests.traces.conftest import SMALL_GRID, edit_meta, rewrite_table
from vegas_sim import api
from vegas_sim.cli import cli
from vegas_sim.sim.context_trend import TREND_SD_SCALE
from vegas_sim.traces.merge import merge_trace_sets
from vegas_sim.traces.reader import load_trace_set
from vegas_sim.traces.schema import ACCEPTANCE_SCHEMA, CALIBRATION_KEY, EXPECTED_ROWS_KEY
from vegas_sim.traces.subset import subset_trace_set
from vegas_sim.traces.synthetic import make_synthetic_trace_set
from vegas_sim.validate.context_holdout import needed_scale

OWN = {"context_trend_sd_scale": 4.5, "from": "a context hold-out of this set"}


def _calibrate(value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda m: m.__setitem__(CALIBRATION_KEY, value)


def test_a_set_without_calibration_takes_the_default(small_set: Path) -> None:
    model = api.fit_acceptance(load_trace_set(small_set))
    assert model.trend_sd_scale == TREND_SD_SCALE and model.trend_sd_scale_from == ""
    shown = CliRunner().invoke(cli, ["traces", "show", str(small_set)]).output
    assert f"context trend sd scale: {TREND_SD_SCALE:g} (the default; `traces trend-holdout" \
        in shown


def test_a_calibrated_set_scales_its_own_trend(small_set: Path) -> None:
    edit_meta(small_set, _calibrate(OWN))
    model = api.fit_acceptance(load_trace_set(small_set))
    assert model.trend_sd_scale == 4.5
    assert "this set's context hold-out" in model._scale_note()


@pytest.mark.parametrize(("value", "message"), [
    ({"context_trend_sd_scale": 0.5, "from": "x"}, "context_trend_sd_scale is 0.5"),
    ({"context_trend_sd_scale": 2.0}, "it must hold context_trend_sd_scale, from"),
    ([2.0], "it must hold context_trend_sd_scale, from"),
])
def test_a_malformed_calibration_is_refused(small_set: Path, value: Any, message: str) -> None:
    edit_meta(small_set, _calibrate(value))
    run = CliRunner().invoke(cli, ["traces", "check", str(small_set)])
    assert run.exit_code != 0 and message in run.output and CALIBRATION_KEY in run.output, \
        run.output


def test_merge_and_subset_drop_the_calibration(small_set: Path, tmp_path: Path) -> None:
    edit_meta(small_set, _calibrate(OWN))
    one = subset_trace_set(small_set, tmp_path / "one", "gamma<=2,batch<=1")
    assert CALIBRATION_KEY not in one.meta
    rest = subset_trace_set(small_set, tmp_path / "rest", "gamma>2,batch>1")
    edit_meta(one.path, _calibrate(OWN))
    merged = merge_trace_sets(tmp_path / "merged", [one.path, rest.path])
    assert CALIBRATION_KEY not in merged.meta


def _cli(*args: str) -> Any:
    return CliRunner().invoke(cli, ["traces", *args])


def _with_trend(path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The set with acceptance rising along five contexts (tests/sim/test_context_trend.py):
    the hold-out fits two and predicts three."""
    monkeypatch.setattr("tests.sim.test_context_trend.CONTEXTS", (1024, 2048, 4096, 8192, 16384))
    rows = trend_traces(0.4)
    rewrite_table(path, "acceptance.parquet",
                  pa.Table.from_pandas(rows, schema=ACCEPTANCE_SCHEMA, preserve_index=False))
    edit_meta(path, lambda m: m.pop(EXPECTED_ROWS_KEY, None))
    return path


def test_trend_holdout_writes_the_scale_its_points_need(small_set: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The command predicts each workload's longer buckets from the rest, prints the factor the
    points need and records it: the set then checks, shows and predicts with it."""
    _with_trend(small_set, monkeypatch)
    out = tmp_path / "holdout.csv"
    run = _cli("trend-holdout", str(small_set), "--write-scale", "--out", str(out))
    assert run.exit_code == 0, run.output
    points = pd.read_csv(out)
    assert len(points) > 0 and (points.context > points.fit_up_to).all()
    assert "trend sd scale the points need" in run.output
    recorded = load_trace_set(small_set).info
    assert recorded.context_trend_sd_scale == needed_scale(points) >= 1.0
    assert "trend-holdout" in recorded.calibrated_by
    assert _cli("check", str(small_set)).exit_code == 0
    shown = _cli("show", str(small_set)).output
    assert f"context trend sd scale: {recorded.context_trend_sd_scale:g} (vegas-sim" in shown


def test_trend_holdout_refuses_what_it_cannot_calibrate(small_set: Path, tmp_path: Path) -> None:
    workload = _cli("trend-holdout", str(small_set), "--design", "workload", "--write-scale")
    assert workload.exit_code != 0 and "--write-scale" in workload.output
    assert CALIBRATION_KEY not in load_trace_set(small_set).meta
    random = tmp_path / "random"
    make_synthetic_trace_set(random, seed=1, weights_kind="random", **SMALL_GRID)
    refused = _cli("trend-holdout", str(random))
    assert refused.exit_code != 0 and "random weights" in refused.output
    flat = _cli("trend-holdout", str(small_set), "--write-scale")  # two buckets, no trend
    assert flat.exit_code != 0 and "more than 5 % of the held-out points" in flat.output
    assert CALIBRATION_KEY not in load_trace_set(small_set).meta
