"""`report` on plausible but awkward tables (handled, or refused with a clear error), the page's
provenance and caveats, and never replacing an HTML file it did not write."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from tests.reports.test_html import fake_sweep, fake_validate
from vegas_sim.cli.explore import report
from vegas_sim.errors import UserInputError
from vegas_sim.reports import charts, heatmaps, provenance, validate_tune
from vegas_sim.reports.csv import write_table
from vegas_sim.reports.html import write_report
from vegas_sim.reports.style import METHOD_COLORS, PHASE_COLORS
from vegas_sim.reports.terminal import extrapolation_reasons


@pytest.fixture()
def sweep() -> pd.DataFrame:
    return fake_sweep(np.random.default_rng(0))


# ---- tables that used to crash ---------------------------------------------------------------
def test_vanilla_only_sweep_draws_what_it_can(tmp_path: Path, sweep: pd.DataFrame) -> None:
    csv = write_table(sweep[sweep["method"] == "vanilla"], tmp_path / "van.csv")
    out = write_report(csv, tmp_path / "van.html")
    assert "Throughput vs batch size" in out.charts
    skipped = " | ".join(out.skipped)
    assert "Throughput over γ × sparsity: no speculative method" in skipped
    assert "Speedup over vanilla, each method at its best (γ, s): no speculative" in skipped


@pytest.mark.parametrize("method", ["vanilla", "vegas"])
def test_one_row_sweep(tmp_path: Path, sweep: pd.DataFrame, method: str) -> None:
    csv = write_table(sweep[sweep["method"] == method].iloc[[0]], tmp_path / "one.csv")
    out = write_report(csv, tmp_path / "one.html")
    assert out.html.is_file() and out.skipped
    assert any("single batch" in s for s in out.skipped)


def test_non_numeric_cell_names_column_and_line(tmp_path: Path, sweep: pd.DataFrame) -> None:
    bad = sweep.assign(throughput_tok_s=sweep["throughput_tok_s"].astype(object))
    bad.loc[bad.index[3], "throughput_tok_s"] = "fast"
    csv = write_table(bad, tmp_path / "bad.csv")
    with pytest.raises(UserInputError, match=r"column 'throughput_tok_s', line 5, holds 'fast'"):
        write_report(csv, tmp_path / "bad.html")
    assert not (tmp_path / "bad.html").exists() and not (tmp_path / "bad.report.csv").exists()
    with pytest.raises(UserInputError, match=r"column 'gamma', row 2"):
        write_report(sweep.assign(gamma=["x" if i == 1 else g for i, g in
                                         enumerate(sweep["gamma"])]), tmp_path / "b.html")


def test_truncated_csv_is_refused_with_the_line(tmp_path: Path, sweep: pd.DataFrame) -> None:
    csv = write_table(sweep, tmp_path / "s.csv")
    lines = csv.read_text().splitlines()
    cut = "\n".join(lines[:10]) + "\n" + lines[10][: len(lines[10]) // 2] + "\n"
    csv.write_text(cut)
    res = CliRunner().invoke(report, [str(csv), "--out", str(tmp_path / "s.html")])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "line 11 has" in res.output and "truncated" in res.output


def test_report_never_replaces_an_html_it_did_not_write(tmp_path: Path,
                                                        sweep: pd.DataFrame) -> None:
    mine = tmp_path / "x.html"
    mine.write_text("<html><body>my notes</body></html>")
    res = CliRunner().invoke(report, [str(write_table(sweep, tmp_path / "s.csv")),
                                      "--out", str(mine)])
    assert res.exit_code == 1 and "is not a vegas-sim report" in res.output
    assert "choose another --out" in res.output
    assert mine.read_text() == "<html><body>my notes</body></html>"
    assert not (tmp_path / "x.report.csv").exists()
    # its own report it replaces
    (tmp_path / "y.html").unlink(missing_ok=True)
    write_report(sweep, tmp_path / "y.html")
    write_report(sweep, tmp_path / "y.html")


def test_older_report_is_recognised_as_ours(tmp_path: Path, sweep: pd.DataFrame) -> None:
    old = tmp_path / "r.html"
    old.write_text('<html><head><meta name="generator" content="vegas-sim 0.1.0">\n'
                   '<meta name="vegas-sim-companions" content="[]"></head></html>')
    assert write_report(sweep, old).html == old


# ---- provenance and caveats ------------------------------------------------------------------
def test_provenance_block_names_sets_gpu_engine_source(tmp_path: Path,
                                                       sweep: pd.DataFrame) -> None:
    html = write_report(sweep, tmp_path / "r.html").html.read_text()
    block = html[html.index('<section id="provenance">'):]
    block = block[: block.index("</section>")]
    for text in ("qwen3-8b-h200", "smollm2-135m-real", "trace set smollm2-135m-real",
                 "NVIDIA H200 (measured)", "analytic", "no interval (analytic engine)"):
        assert text in block, text
    # extrapolation notes name the method
    assert "vegas: 18 of 36 rows extrapolated — context beyond the traced contexts" in block


def test_older_table_says_provenance_unknown(tmp_path: Path, sweep: pd.DataFrame) -> None:
    old = sweep.drop(columns=["latency_traces", "acceptance_traces", "acceptance_source"])
    html = write_report(old, tmp_path / "r.html").html.read_text()
    assert provenance.UNKNOWN in html


def test_what_if_gpu_is_a_warning(sweep: pd.DataFrame) -> None:
    prov = provenance.provenance(sweep.assign(gpu="h100-sxm (what-if, not measured)"))
    assert any("what-if" in w and "NOT measured" in w for w in prov.warnings)
    assert not provenance.provenance(sweep).warnings[:0]  # measured: no GPU warning
    assert not any("GPU" in w for w in provenance.provenance(sweep).warnings)


def test_interval_captions_say_what_the_interval_is(sweep: pd.DataFrame) -> None:
    analytic = charts.method_comparison(sweep)
    assert "no interval (analytic engine)" in analytic.caption
    sim = charts.method_comparison(sweep.assign(engine="sim"))
    assert provenance.SIM_INTERVAL in sim.caption
    assert sim.fig is not None and sim.fig.data[0].error_y.array is not None
    flat = sweep.assign(engine="analytic", speedup_ci_low=sweep["speedup_vs_vanilla"],
                        speedup_ci_high=sweep["speedup_vs_vanilla"])
    fig = charts.method_comparison(flat).fig
    assert fig is not None and all(t.error_y.array is None for t in fig.data)


# ---- heatmaps, colours, marks ----------------------------------------------------------------
def test_a_heatmap_for_every_method_and_cell(sweep: pd.DataFrame) -> None:
    maps = heatmaps.heatmaps(sweep)
    assert [c.slug for c in maps] == ["heatmap-magicdec-stream", "heatmap-vegas"]
    for chart in maps:
        assert chart.fig is not None
        assert len([t for t in chart.fig.data if t.type == "heatmap"]) == 4  # 2 batch × 2 ctx
        assert len(chart.fig.layout.shapes) == 4  # the best square of each cell, outlined
        assert chart.table is not None and len(chart.table) == 4


def test_edge_warning_only_when_best_sits_on_the_edge() -> None:
    best = pd.Series({"gamma": 6, "sparsity": 0.05})
    assert heatmaps.edge_warnings(best, [2, 4, 6], [0.03, 0.05, 0.1]) == [
        "γ=6 is the largest γ swept"]
    assert heatmaps.edge_warnings(pd.Series({"gamma": 4, "sparsity": 0.05}), [2, 4, 6],
                                  [0.03, 0.05, 0.1]) == []


def test_extrapolated_squares_and_points_are_marked(sweep: pd.DataFrame) -> None:
    vegas = heatmaps.method_heatmaps(sweep[sweep["method"] != "vanilla"], "vegas")
    assert vegas.fig is not None
    texts = [np.asarray(t.text) for t in vegas.fig.data]
    assert any(all(str(v).endswith("*") for v in t.ravel()) for t in texts)  # C=32K cells
    assert any(not any(str(v).endswith("*") for v in t.ravel()) for t in texts)  # C=4K
    lines = charts.faceted_lines(sweep, "batch", "throughput_tok_s", "t", "y")
    assert lines.fig is not None
    symbols = {s for t in lines.fig.data for s in t.marker.symbol}
    assert symbols == {"circle", "circle-open"}


def test_one_colour_per_method_and_phase_in_every_chart(sweep: pd.DataFrame) -> None:
    seen: dict[str, set[str]] = {}
    for chart in charts.sweep_charts(sweep):
        for t in [] if chart.fig is None else chart.fig.data:
            color = (t.line.color if t.type == "scatter" else
                     t.marker.color if t.type == "bar" else None)
            if color is not None and t.name:
                seen.setdefault(t.name.split(" ")[0], set()).add(color)
    for name, colors in seen.items():
        expected = METHOD_COLORS.get(name) or PHASE_COLORS.get(name)
        assert colors == {expected}, (name, colors)
    assert {"vegas", "magicdec-stream", "vanilla", "verify"} <= set(seen)


# ---- validate and tune -----------------------------------------------------------------------
def test_parity_axes_start_at_zero_or_go_log() -> None:
    df = fake_validate(np.random.default_rng(1))
    fig = validate_tune.parity(df).fig
    assert fig is not None and fig.layout.xaxis.range[0] == 0 and fig.layout.xaxis.type == "linear"
    wide = df.assign(measured=df["measured"] * np.geomspace(1, 100, len(df)),
                     predicted=df["predicted"] * np.geomspace(1, 100, len(df)))
    fig = validate_tune.parity(wide).fig
    assert fig is not None and fig.layout.xaxis.type == "log"
    rows = validate_tune.row_errors(df)
    assert rows.table_only and rows.table is not None and len(rows.table) == len(df)
    assert set(rows.table["extrapolated"]) == {"yes", ""}


def test_tune_table_names_the_baseline() -> None:
    cells = pd.DataFrame([{"batch": 1, "context": 4096, "method": "vegas", "gamma": 6,
                           "sparsity": 0.05, "throughput_tok_s": 100.0, "vanilla_tok_s": 50.0,
                           "speedup_vs_vanilla": 2.0, "baseline_method": "magicdec-stream",
                           "baseline_gamma": 4, "baseline_sparsity": 0.07,
                           "baseline_tok_s": 80.0, "speedup_vs_baseline": 1.25,
                           "extrapolated": True}])
    table = validate_tune.tune_table(cells).table
    assert table is not None
    assert table.loc[0, "baseline"] == "magicdec-stream γ=4, s=0.07"
    assert table.loc[0, "extrapolated"] == "yes"


def test_terminal_extrapolation_notes_name_the_method() -> None:
    df = pd.DataFrame({"method": ["vanilla", "vegas", "magicdec-stream"],
                       "extrapolated": [None, "context beyond;batch beyond", "batch beyond"]})
    assert extrapolation_reasons(df) == {"batch beyond": ["vegas", "magicdec-stream"],
                                         "context beyond": ["vegas"]}
