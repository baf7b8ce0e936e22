"""The report's context-trend table: built from the rows' own notes, absent without them."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from vegas_sim.reports.context_trend import context_trend_table
from vegas_sim.reports.html import write_report
from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.traces.io import load_trace_set


def _rows() -> pd.DataFrame:
    acc = load_trace_set("smollm2-135m-real").acceptance
    model = AcceptanceModel.from_traces(acc[acc.workload == "longdoc"], "real")
    rows = []
    for context in (4096, 32768, 65536):
        dist = model.lookup("vegas", 7, 0.07, context, "longdoc", 0.6)
        rows.append({"method": "vegas", "gamma": 7, "sparsity": 0.07, "batch": 4,
                     "context": context, "workload": "longdoc", "temperature": 0.6,
                     "throughput_tok_s": 100.0 + context / 1e3,
                     "acceptance_length": dist.mean_length,
                     "extrapolated": ";".join(dist.extrapolated)})
    return pd.DataFrame(rows)


def test_table_lists_the_trend_the_rows_followed() -> None:
    chart = context_trend_table(_rows())
    assert chart is not None and chart.table is not None and chart.table_only
    (row,) = chart.table.to_dict("records")
    assert row["workload"] == "longdoc" and row["rows"] == 2  # 4096 is inside the traces
    assert row["contexts"] == "32768 .. 65536"
    assert float(row["slope per doubling (logit)"]) > 0
    assert "longdoc 1024..7168" in row["fitted on"]


def test_no_table_without_a_trend() -> None:
    rows = _rows()
    assert context_trend_table(rows[rows.context == 4096]) is None
    assert context_trend_table(rows.drop(columns="extrapolated")) is None


def test_report_shows_the_table(tmp_path: Path) -> None:
    out = write_report(_rows(), tmp_path / "r.html", kind="sweep")
    assert any(p.name.endswith("context-trend.csv") for p in out.csvs)
    assert "Acceptance context trend beyond the traced contexts" in (
        tmp_path / "r.html").read_text()
