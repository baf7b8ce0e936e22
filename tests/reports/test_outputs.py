"""What `report` (and `write_table`) may write, and where: never over a user's files or the
input, files with the umask's mode, a clean error for an unwritable path, and a table that is
not a sweep / tune / validate result refused before anything is written."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from tests.reports.test_html import fake_sweep, fake_validate
from vegas_sim.cli.explore import report
from vegas_sim.errors import UserInputError
from vegas_sim.reports.csv import write_table
from vegas_sim.reports.html import _slug, write_report

HAS_PROC = Path("/proc/self").is_dir()


@pytest.fixture()
def sweep_csv(tmp_path: Path) -> Path:
    """A full sweep table on disk (its rows: the γ × s × batch × context grid)."""
    return write_table(fake_sweep(np.random.default_rng(0)), tmp_path / "sweep.csv")


@pytest.fixture()
def small_csv(tmp_path: Path) -> Path:
    """A 2-row sweep (one batch, one context): several charts are skipped."""
    df = fake_sweep(np.random.default_rng(1))
    df = df[(df["gamma"] == 2) & (df["sparsity"] == 0.03) & (df["batch"] == 1)
            & (df["context"] == 4096) & (df["method"] != "magicdec-stream")]
    return write_table(df, tmp_path / "small.csv")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ---- 1. never overwrite a file the report did not write ---------------------------------------
def test_report_keeps_an_unrelated_result_named_like_the_html(
        tmp_path: Path, sweep_csv: Path, small_csv: Path) -> None:
    # The audit: `report small.csv --out sweep.html` replaced sweep.csv by the 2-row table.
    before = sweep_csv.read_bytes()
    res = CliRunner().invoke(report, [str(small_csv), "--out", str(tmp_path / "sweep.html")])
    assert res.exit_code == 0, res.output
    assert sweep_csv.read_bytes() == before
    assert (tmp_path / "sweep.report.csv").is_file()


def test_report_never_writes_onto_its_input(tmp_path: Path, sweep_csv: Path) -> None:
    # The README's `report sweep.csv --out sweep.html`: the input stays byte for byte.
    before = sweep_csv.read_bytes()
    out = write_report(sweep_csv, tmp_path / "sweep.html")
    assert sweep_csv.read_bytes() == before and sweep_csv not in out.csvs
    # The report's own whole-table CSV as input, with the --out it came from: refused.
    with pytest.raises(UserInputError, match="over its input") as e:
        write_report(tmp_path / "sweep.report.csv", tmp_path / "sweep.html")
    assert e.value.where == "--out"


def test_report_refuses_a_foreign_file_at_a_companion_name(tmp_path: Path,
                                                           sweep_csv: Path) -> None:
    mine = tmp_path / "r.report-speedup.csv"
    mine.write_text("my own notes\n")
    with pytest.raises(UserInputError, match="not written by the report") as e:
        write_report(sweep_csv, tmp_path / "r.html")
    assert e.value.where == "--out" and e.value.fix and "move that file" in e.value.fix
    assert mine.read_text() == "my own notes\n"
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "r.report.csv").exists()


def test_report_rerun_replaces_its_own_outputs(tmp_path: Path, sweep_csv: Path,
                                               small_csv: Path) -> None:
    first = write_report(sweep_csv, tmp_path / "r.html")
    second = write_report(small_csv, tmp_path / "r.html")  # other data, same --out
    assert set(second.csvs) < set(first.csvs)
    assert len(pd.read_csv(tmp_path / "r.report.csv")) == 2
    # the first report's CSVs the second did not write are gone (they described other data)
    for stale in set(first.csvs) - set(second.csvs):
        assert not stale.exists(), stale
    third = write_report(tmp_path / "sweep.csv", tmp_path / "r.html")
    assert [p.name for p in third.csvs] == [p.name for p in first.csvs]


def test_companion_names_are_short_whole_words(tmp_path: Path, sweep_csv: Path) -> None:
    out = write_report(sweep_csv, tmp_path / "sweep.html")
    assert [p.name for p in out.csvs] == [
        "sweep.report.csv", "sweep.report-heatmap-magicdec-stream.csv",
        "sweep.report-heatmap-vegas.csv", "sweep.report-speedup.csv", "sweep.report-phases.csv"]
    title = "Speedup over vanilla, each method at its best (γ, s)"
    assert _slug(title) == "speedup-over-vanilla"
    for text in (title, "Predicted vs measured (held-out configurations)", "x" * 40):
        words = re.findall(r"[a-z0-9]+", text.lower())
        slug = _slug(text)
        assert slug.split("-") == words[: len(slug.split("-"))]  # leading whole words
        assert slug == "x" * 40 or len(slug) <= 24  # one long word is kept whole


# ---- 2. a table of no known kind, or without what --kind needs ---------------------------------
def test_report_refuses_a_table_of_no_known_kind(tmp_path: Path) -> None:
    (tmp_path / "ab.csv").write_text("a,b\n1,2\n")
    res = CliRunner().invoke(report, [str(tmp_path / "ab.csv"), "--out",
                                      str(tmp_path / "ab.html")])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "not a sweep, tune or validate result" in res.output
    assert "throughput_tok_s" in res.output and "predicted, measured" in res.output
    assert "vegas-sim sweep --out" in res.output
    assert not (tmp_path / "ab.html").exists() and not (tmp_path / "ab.report.csv").exists()


def test_report_refuses_a_sweep_as_tune(tmp_path: Path, sweep_csv: Path) -> None:
    res = CliRunner().invoke(report, [str(sweep_csv), "--kind", "tune", "--out",
                                      str(tmp_path / "t.html")])
    assert res.exit_code == 1 and "one row per (batch, context)" in res.output
    assert "vegas-sim tune --out" in res.output
    assert not (tmp_path / "t.html").exists()


@pytest.mark.parametrize(("kind", "df", "missing"), [
    ("tune", pd.DataFrame({"batch": [1], "context": [4096]}), "gamma, speedup_vs_vanilla"),
    ("sweep", fake_validate(np.random.default_rng(2)), "throughput_tok_s"),
    ("validate", fake_sweep(np.random.default_rng(3)), "predicted, measured"),
])
def test_forced_kind_names_the_missing_columns(tmp_path: Path, kind: str, df: pd.DataFrame,
                                               missing: str) -> None:
    with pytest.raises(UserInputError, match=f"lacks {missing}") as e:
        write_report(df, tmp_path / "r.html", kind)
    assert e.value.where == "RESULTS" and e.value.fix and f"vegas-sim {kind} --out" in e.value.fix


# ---- 3. the files get the umask's mode, not mkstemp's 0600 -------------------------------------
@pytest.fixture(params=[0o022, 0o027])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def test_outputs_get_the_umask_mode(tmp_path: Path, umask: int) -> None:
    want = 0o666 & ~umask
    table = write_table(pd.DataFrame({"a": [1]}), tmp_path / "t.csv")
    parquet = write_table(pd.DataFrame({"a": [1]}), tmp_path / "t.parquet")
    out = write_report(fake_validate(np.random.default_rng(4)), tmp_path / "v.html")
    for path in (table, parquet, out.html, *out.csvs):
        assert _mode(path) == want, (path.name, oct(_mode(path)))


# ---- 4. an unwritable --out is a user error, not a traceback -----------------------------------
def _unwritable(tmp_path: Path, name: str) -> list[Path]:
    """A path under a regular file, and (Linux) one in /proc, which takes no new files."""
    (tmp_path / "t.sh").write_text("#!/bin/sh\n")
    paths = [tmp_path / "t.sh" / name]
    return [*paths, Path("/proc") / name] if HAS_PROC else paths


def test_report_to_an_unwritable_out(tmp_path: Path, sweep_csv: Path) -> None:
    for out in _unwritable(tmp_path, "r.html"):
        res = CliRunner().invoke(report, [str(sweep_csv), "--out", str(out)])
        assert res.exit_code == 1, res.output
        assert "Traceback" not in res.output and res.exception is not None
        assert isinstance(res.exception, SystemExit)
        assert "--out: cannot write" in res.output and str(out) in res.output
        assert "fix:" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.csv", "t.sh"]


def test_write_table_to_an_unwritable_path(tmp_path: Path) -> None:
    for path in _unwritable(tmp_path, "s.csv"):
        with pytest.raises(UserInputError, match="cannot write") as e:
            write_table(pd.DataFrame({"a": [1]}), path, option="--out")
        assert e.value.where == "--out" and e.value.fix
    assert not list(tmp_path.glob(".*.tmp"))


# ---- 5. the skipped lines say "skipped" once ---------------------------------------------------
def test_skipped_lines_say_skipped_once(tmp_path: Path, small_csv: Path) -> None:
    res = CliRunner().invoke(report, [str(small_csv), "--out", str(tmp_path / "s.html")])
    assert res.exit_code == 0, res.output
    lines = [line for line in res.stderr.splitlines() if line.startswith("skipped")]
    assert "skipped Throughput vs batch size: the results have a single batch (1)" in lines
    assert lines and all(line.count("skipped") == 1 for line in lines), lines
    # The page itself keeps its "skipped: why" note under each chart's heading.
    assert "skipped: the results have a single batch" in (tmp_path / "s.html").read_text()


def test_ttft_line_gives_each_part_its_own_unit() -> None:
    """A saturated open-loop row waits for minutes: seconds there, milliseconds elsewhere, and
    never both units on one number."""
    from vegas_sim.reports.terminal import ttft_lines

    row = {"method": "vegas", "prefill_ms": 1000.8, "kv_transfer_ms": 96.6,
           "ttft_ms_p50": 174_700.0, "ttft_includes": "prefill + transfer + wait"}
    line = ttft_lines(pd.DataFrame([row]))[0]
    assert "p50 174.7 s = prefill 1000.8 ms + KV transfer 96.6 ms + waiting 173.6 s;" in line
    assert "s ms" not in line
    short = ttft_lines(pd.DataFrame([{**row, "ttft_ms_p50": 1200.0}]))[0]
    assert "p50 1200.0 ms = " in short and "waiting 102.6 ms;" in short
