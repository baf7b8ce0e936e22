"""The sweep / tune / report commands end to end on a synthetic trace set (click runner)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from vegas_sim.cli.explore import report, sweep, tune
from vegas_sim.traces.synthetic import make_synthetic_trace_set


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "ts"
    make_synthetic_trace_set(path, gammas=(2, 4, 8), sparsities=(0.03, 0.07, 0.15),
                             contexts=(4096, 16384), batches=(1, 4), noise=0.0)
    return path


def test_sweep_then_report(traces: Path, tmp_path: Path) -> None:
    out = tmp_path / "s.csv"
    res = CliRunner().invoke(sweep, [
        "--gamma", "2..4", "--sparsity", "0.03,0.07", "--batch", "1,4", "--context", "4K",
        "-m", "vegas", "-m", "magicdec-stream", "--output-len", "64", "--traces", str(traces),
        "--workers", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    table = pd.read_csv(out)
    assert len(table) == 2 * (1 + 2 * 3 * 2)
    # every row says where its numbers came from (the provenance survives the CSV)
    assert set(table["latency_traces"]) == {"ts"} and set(table["acceptance_traces"]) == {"ts"}
    drafting = table["method"] != "vanilla"  # vanilla drafts nothing: no acceptance source
    assert set(table.loc[drafting, "acceptance_source"]) == {"trace set ts"}
    assert table.loc[~drafting, "acceptance_source"].isna().all()
    assert set(table["engine"]) == {"analytic"} and table["gpu"].notna().all()
    html = tmp_path / "s.html"
    res = CliRunner().invoke(report, [str(out), "--out", str(html)])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout.strip().splitlines()[-1])["charts"] >= 4
    page = html.read_text()
    assert "<svg" not in page[:1000] and html.stat().st_size > 4_000_000
    assert '<meta name="generator" content="vegas-sim report' in page
    for method in ("vegas", "magicdec-stream"):
        assert f'id="chart-heatmap-{method}"' in page
    block = page[page.index('<section id="provenance">'):]
    assert "<td>ts</td>" in block[: block.index("</section>")]


def test_tune_writes_json(traces: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    res = CliRunner().invoke(tune, ["--batch", "1,4", "--context", "4K", "--output-len", "64",
                                    "--traces", str(traces), "--workers", "1",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert set(doc["num_speculative_tokens_by_batch"]) == {"1", "4"}
    assert {c["latency_traces"] for c in doc["cells"]} == {"ts"}
    assert "B=   1 C=   4096" in res.stdout
    html = tmp_path / "t.html"
    res = CliRunner().invoke(report, [str(out), "--out", str(html)])
    assert res.exit_code == 0, res.output
    page = html.read_text()
    assert "Tuned configuration per cell" in page and "<td>ts</td>" in page


def test_user_errors_become_click_errors(traces: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(sweep, ["--gamma", "0", "--traces", str(traces),
                                     "--out", str(tmp_path / "x.csv")])
    assert res.exit_code == 1 and "--gamma" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(report, [str(tmp_path / "missing.csv"), "--out",
                                      str(tmp_path / "r.html")])
    assert res.exit_code == 1 and "does not exist" in res.output


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_sweep_to_an_unwritable_out_is_a_user_error(traces: Path) -> None:
    # /proc passes the up-front directory checks (it exists; root may write to it) but takes
    # no new file: write_table itself must turn the OSError into a user error.
    res = CliRunner().invoke(sweep, ["--gamma", "2", "--sparsity", "0.03", "--batch", "1",
                                     "--context", "4K", "-m", "vegas", "--output-len", "64",
                                     "--traces", str(traces), "--workers", "1",
                                     "--out", "/proc/s.csv"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "--out: cannot write '/proc/s.csv'" in res.output
