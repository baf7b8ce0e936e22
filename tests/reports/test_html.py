"""Reports: CSV round trip, chart selection/skipping, and the HTML in a real headless Chromium."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.reports.browser import find_chromium, inspect_page
from vegas_sim.errors import UserInputError
from vegas_sim.reports import charts
from vegas_sim.reports.csv import read_table, write_table
from vegas_sim.reports.html import detect_kind, write_report

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def fake_sweep(rng: np.random.Generator) -> pd.DataFrame:
    """A sweep-shaped table (predict's columns) with plausible numbers: throughput peaks inside."""
    rows = []
    for method, gamma, s, batch, context in itertools.product(
        ("vanilla", "magicdec-stream", "vegas"), (2, 4, 6), (0.03, 0.07, 0.1), (1, 4), (4096, 32768)
    ):
        if method == "vanilla" and (gamma, s) != (2, 0.03):
            continue
        rates = [0.9 * (0.85 + s) ** i for i in range(1, gamma + 1)] if method != "vanilla" else []
        acc = 1 + sum(rates)
        draft = 0.3 * gamma * (1 + 10 * s)
        verify = 1.0 + context / 32768
        it = draft + verify + 0.1 if method != "vanilla" else verify
        thr = batch * acc / it * 1000 * rng.uniform(0.98, 1.02)
        rows.append({
            "method": method, "gamma": gamma, "sparsity": s, "batch": batch, "context": context,
            "output_len": 256, "engine": "analytic", "throughput_tok_s": thr,
            "throughput_ci_low": thr * 0.97, "throughput_ci_high": thr * 1.03,
            "acceptance_length": acc, "rates": rates, "iter_ms": it,
            "ms_draft_step": draft if method != "vanilla" else 0.0,
            "ms_verify": verify if method != "vanilla" else 0.0,
            "ms_decode": verify if method == "vanilla" else 0.0, "ms_sample": 0.1,
            "tpot_ms_p50": it / acc, "extrapolated": "" if context <= 4096 else
            "context beyond the traced contexts", "gpu": "NVIDIA H200 (measured)",
            "latency_traces": "qwen3-8b-h200", "acceptance_traces": "smollm2-135m-real",
            "acceptance_source": "trace set smollm2-135m-real",
        })
    df = pd.DataFrame(rows)
    keys = ["batch", "context"]
    van = df[df["method"] == "vanilla"].set_index(keys)["throughput_tok_s"]
    base = df.join(van.rename("van"), on=keys)["van"]
    return df.assign(speedup_vs_vanilla=df["throughput_tok_s"] / base,
                     speedup_ci_low=0.96 * df["throughput_tok_s"] / base,
                     speedup_ci_high=1.04 * df["throughput_tok_s"] / base)


def fake_validate(rng: np.random.Generator) -> pd.DataFrame:
    meas = rng.uniform(100, 1000, size=8)
    pred = meas * (1 + rng.normal(0, 0.03, size=8))
    return pd.DataFrame({
        "method": "vegas", "gamma": 6, "sparsity": 0.05, "batch": [1, 2, 4, 8] * 2,
        "context": 32768,
        "predicted": pred, "measured": meas, "error_pct": 100 * (pred - meas) / meas,
        "ci_low": pred * 0.98, "ci_high": pred * 1.02, "extrapolated": [False, True] * 4,
        "regime": ["real"] * 4 + ["random+replay"] * 4, "engine": "sim",
        "gpu": "NVIDIA H200 (measured)", "latency_traces": "smollm2-135m-h200",
        "acceptance_traces": "smollm2-135m-real", "acceptance_source": "trace set smollm2-135m-real"})


def test_csv_round_trip_spreads_rates(tmp_path: Path) -> None:
    df = fake_sweep(np.random.default_rng(0))
    for name in ("r.csv", "r.parquet"):
        back = read_table(write_table(df, tmp_path / name))
        assert "rates" not in back.columns
        assert [c for c in back.columns if c.startswith("rate_")] == ["rate_1", "rate_2",
                                                                        "rate_3", "rate_4",
                                                                        "rate_5", "rate_6"]
        g2 = back[(back["method"] == "vegas") & (back["gamma"] == 2)].iloc[0]
        assert np.isnan(g2["rate_3"]) and g2["rate_1"] > 0
        assert np.allclose(back["throughput_tok_s"], df["throughput_tok_s"])


def test_bad_suffix_names_option(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="--out"):
        write_table(pd.DataFrame({"a": [1]}), tmp_path / "r.xlsx")


def test_kind_detection() -> None:
    rng = np.random.default_rng(1)
    assert detect_kind(fake_sweep(rng)) == "sweep"
    assert detect_kind(fake_validate(rng)) == "validate"
    assert detect_kind(pd.DataFrame({"batch": [1], "speedup_vs_baseline": [1.2]})) == "tune"


def test_charts_skip_with_note_when_data_missing(tmp_path: Path) -> None:
    # One configuration per method, no phases, no rates: only the comparison can be drawn.
    df = fake_sweep(np.random.default_rng(2))
    df = df[(df["gamma"] == 2) & (df["sparsity"] == 0.03) & (df["batch"] == 1)
            & (df["context"] == 4096)]
    df = df.drop(columns=[c for c in df.columns if c.startswith("ms_")] + ["rates"])
    out = write_report(df, tmp_path / "r.html")
    assert out.charts == ["Speedup over vanilla, each method at its best (γ, s)"]
    # a heatmap per method, phases, rates, throughput and TPOT vs batch / context, trade-off
    assert len(out.skipped) == 9, out.skipped
    html = out.html.read_text()
    assert "skipped: needs at least 2 values of both γ and sparsity" in html
    assert "skipped: the results have a single batch" in html


def test_phase_table_shows_the_kv_selection_overhead() -> None:
    df = fake_sweep(np.random.default_rng(4))
    df = df.assign(ms_verify_collect=0.1 * df["ms_verify"],
                   kv_selection_pct=100 * 0.1 * df["ms_verify"] / df["iter_ms"])
    table = charts.phase_breakdown(df).table
    assert table is not None
    assert {"ms_verify_collect", "kv_selection_pct"} <= set(table.columns)
    assert "ms_verify_collect" not in {t.name for t in charts.phase_breakdown(df).fig.data}


def test_best_per_method_picks_max() -> None:
    df = fake_sweep(np.random.default_rng(3))
    best = charts.best_per_method(df)
    assert len(best) == 3 * 2 * 2  # methods × batch × context
    for _, r in best.iterrows():
        cell = df[(df["method"] == r["method"]) & (df["batch"] == r["batch"])
                  & (df["context"] == r["context"])]
        assert r["throughput_tok_s"] == cell["throughput_tok_s"].max()


def test_error_table_median_max_per_regime() -> None:
    df = fake_validate(np.random.default_rng(4))
    t = charts.error_table(df).set_index("regime")
    real = df[df["regime"] == "real"]["error_pct"].abs()
    assert t.loc["real", "median_abs_error_pct"] == pytest.approx(real.median())
    assert t.loc["real", "max_abs_error_pct"] == pytest.approx(real.max())
    assert t.loc["all", "n"] == 8


def test_a_table_measured_in_passes_shows_its_measurement_noise() -> None:
    """validate --passes: the summary adds the first pass alone and the pass-to-pass SE, the
    row table the pass columns, and the parity plot horizontal bars of ±2 SE."""
    from vegas_sim.reports import validate_tune

    df = fake_validate(np.random.default_rng(6))
    first = df["error_pct"] * 2
    df = df.assign(measured_passes=[3] * 7 + [1], measured_pass_se_pct=[1.0] * 7 + [np.nan],
                   error_first_pass_pct=first)
    t = charts.error_table(df).set_index("regime")
    assert t.loc["all", "max_abs_error_first_pass_pct"] == pytest.approx(first.abs().max())
    assert t.loc["all", "median_pass_se_pct"] == pytest.approx(1.0)
    rows = validate_tune.row_errors(df).table
    assert rows is not None and "measured_pass_se_pct" in rows.columns
    chart = validate_tune.parity(df)
    bars = [list(tr.error_x.array) for tr in chart.fig.data if tr.error_x.array is not None]
    assert sorted(np.round(np.concatenate(bars), 6))[0] == 0.0  # the one-pass row: no bar
    assert max(np.concatenate(bars)) == pytest.approx(2 * 0.01 * df["measured"][:7].max())
    assert "over its passes" in chart.caption
    plain = validate_tune.parity(fake_validate(np.random.default_rng(6)))
    assert "passes" not in plain.caption and "median_pass_se_pct" not in plain.table.columns


def test_report_writes_csvs_beside(tmp_path: Path) -> None:
    out = write_report(fake_validate(np.random.default_rng(5)), tmp_path / "v.html")
    names = [p.name for p in out.csvs]
    assert names == ["v.report.csv", "v.report-errors.csv", "v.report-row-errors.csv"]
    assert all(p.parent == tmp_path for p in out.csvs)
    errors = pd.read_csv(tmp_path / "v.report-errors.csv")
    assert set(errors["regime"]) == {"real", "random+replay", "all"}


def test_report_from_tune_json(tmp_path: Path) -> None:
    doc = {"model": "m", "method": "vegas", "cells": [
        {"batch": b, "context": c, "gamma": 6, "sparsity": 0.05, "speedup_vs_vanilla": 2.0,
         "speedup_ci_low": 1.9, "speedup_ci_high": 2.1, "speedup_vs_baseline": 1.2,
         "speedup_vs_baseline_ci_low": 1.1, "speedup_vs_baseline_ci_high": 1.3}
        for b in (1, 4) for c in (4096, 32768)]}
    (tmp_path / "t.json").write_text(json.dumps(doc))
    out = write_report(tmp_path / "t.json", tmp_path / "t.html")
    assert len(out.charts) == 2 and not out.skipped


def test_report_rejects_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="does not exist"):
        write_report(tmp_path / "nope.csv", tmp_path / "r.html")


@pytest.mark.skipif(find_chromium() is None,
                    reason="chromium is not installed (apt-get install -y chromium)")
@pytest.mark.parametrize("kind", ["sweep", "validate"])
def test_report_in_headless_chromium(tmp_path: Path, kind: str) -> None:
    rng = np.random.default_rng(6)
    df = fake_sweep(rng) if kind == "sweep" else fake_validate(rng)
    out = write_report(df, tmp_path / f"{kind}.html")
    page = inspect_page(out.html, screenshot=ARTIFACTS / f"report_{kind}.png")
    assert page.console_errors == []
    assert page.network_requests == []
    assert page.requests and page.requests[0].startswith("file://")
    assert len(page.charts) == len(out.charts) > 0
    for chart in page.charts:
        assert chart["svg"] >= 1 and chart["svg_elements"] > 20, chart
        assert chart["marks"] > 0, chart
    assert page.screenshot is not None and page.screenshot.stat().st_size > 10_000
    assert "Provenance" in page.provenance and "NVIDIA H200 (measured)" in page.provenance
    if kind == "sweep":  # two methods: each has its heatmap chart, drawn
        ids = {c["id"] for c in page.charts}
        assert {"chart-heatmap-vegas", "chart-heatmap-magicdec-stream"} <= ids, ids
        assert "qwen3-8b-h200" in page.provenance
