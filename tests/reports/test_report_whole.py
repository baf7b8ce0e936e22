"""A report is written as a whole: an interrupt or a full disk at any point leaves the
previous report (or nothing) and no file that blocks the rerun; names from the table or from
an edited page never reach outside the report's directory; a partial table is shown as one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from tests.reports.test_html import fake_sweep
from vegas_sim import files
from vegas_sim.cli.explore import report
from vegas_sim.reports import html
from vegas_sim.reports.csv import PARTIAL_COLUMN, write_table

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def sweep_csv(tmp_path: Path) -> Path:
    return write_table(fake_sweep(np.random.default_rng(0)), tmp_path / "sweep.csv")


def _run(sweep_csv: Path, out: Path) -> Any:
    return CliRunner().invoke(report, [str(sweep_csv), "--out", str(out)])


def _listing(folder: Path) -> dict[str, bytes]:
    """Every file of `folder` (hidden temp files included) with its bytes."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


class _Stop(BaseException):
    """Stands for Ctrl-C inside a test (a KeyboardInterrupt would stop pytest itself)."""


def _interrupt_write(monkeypatch: pytest.MonkeyPatch, nth: int, exc: BaseException) -> None:
    """The `nth` file the report writes (0: the page, then its CSVs) raises `exc` while it
    is being written."""
    original = html.table_writer
    calls = [0]

    def counting(write: Any) -> Any:
        def wrapped(tmp: Path) -> None:
            calls[0] += 1
            if calls[0] - 1 == nth:
                tmp.write_text("half a file")
                raise exc
            write(tmp)
        return wrapped

    monkeypatch.setattr(html, "table_writer", lambda *a, **k: counting(original(*a, **k)))
    real_write_together = files.write_together

    def page_counted(writes: list[tuple[Path, Any]], *a: Any, **k: Any) -> Any:
        (page_path, page), *rest = writes
        return real_write_together([(page_path, counting(page)), *rest], *a, **k)

    monkeypatch.setattr(html, "write_together", page_counted)


@pytest.mark.parametrize("nth", [0, 1, 3])
def test_an_interrupted_first_report_leaves_nothing_and_the_rerun_writes_it(
        nth: int, tmp_path: Path, sweep_csv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while the page (0) or a CSV (1, 3) is written. The old code wrote the CSVs
    first: the page's interrupt left them, and the rerun refused them as not its own."""
    before = _listing(tmp_path)
    _interrupt_write(monkeypatch, nth, _Stop())
    with pytest.raises(_Stop):
        html.write_report(sweep_csv, tmp_path / "r.html")
    assert _listing(tmp_path) == before  # no CSV, no page, no temp file
    monkeypatch.undo()
    result = _run(sweep_csv, tmp_path / "r.html")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r.html").is_file() and (tmp_path / "r.report.csv").is_file()


@pytest.mark.parametrize("nth", [0, 2])
def test_a_full_disk_leaves_the_previous_report_as_it_was(
        nth: int, tmp_path: Path, sweep_csv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _run(sweep_csv, tmp_path / "r.html").exit_code == 0
    before = _listing(tmp_path)
    _interrupt_write(monkeypatch, nth, OSError(28, "No space left on device"))
    result = _run(sweep_csv, tmp_path / "r.html")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "No space left on device" in result.output and "free space" in result.output
    assert _listing(tmp_path) == before
    monkeypatch.undo()
    assert _run(sweep_csv, tmp_path / "r.html").exit_code == 0


def test_a_file_size_limit_mid_page_leaves_nothing(tmp_path: Path, sweep_csv: Path) -> None:
    """A real short write: the process may write files of 1 MB, the page (plotly.js inline)
    is larger, the CSVs are not. The old code had written the CSVs by then."""
    script = ("import resource, signal, sys\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))\n"
              "sys.argv = ['vegas-sim', *sys.argv[1:]]\n"
              "from vegas_sim.cli import main; main()\n")
    before = _listing(tmp_path)
    done = subprocess.run([sys.executable, "-c", script, "report", str(sweep_csv), "--out",
                           str(tmp_path / "r.html")], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "--out: cannot write" in done.stderr
    assert _listing(tmp_path) == before
    assert _run(sweep_csv, tmp_path / "r.html").exit_code == 0


def test_the_interrupt_line_of_report_says_nothing_was_written() -> None:
    from vegas_sim.cli import interrupted_note

    note = interrupted_note(["report", "s.csv", "--out", "r.html"])
    assert "together" in note and "nothing was written" in note


# ---- names from the table or the page -----------------------------------------------------------
@pytest.mark.parametrize("method", ["ve/gas", "../../escape", "a\"<b>"])
def test_any_method_name_gives_companions_inside_the_folder(
        method: str, tmp_path: Path) -> None:
    df = fake_sweep(np.random.default_rng(0))
    df.loc[df["method"] == "vegas", "method"] = method
    src = write_table(df, tmp_path / "in" / "s.csv")
    out = tmp_path / "out" / "r.html"
    out.parent.mkdir()
    result = _run(src, out)
    assert result.exit_code == 0, result.output
    written = {p.name for p in out.parent.iterdir()}
    named = re.compile(r"r\.(html|report(-[A-Za-z0-9_-]+)?\.csv)")
    assert all(named.fullmatch(n) for n in written), written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]
    page = out.read_text()
    ids = re.findall(r'id="chart-([^"]*)"', page)
    assert ids and all(re.fullmatch(r"[A-Za-z0-9_-]+", i) for i in ids), ids


def test_an_edited_page_cannot_make_the_rerun_delete_or_keep_outside_files(
        tmp_path: Path, sweep_csv: Path) -> None:
    """The page's companions <meta> lists '../victim.csv' (and an absolute path): the old code
    failed on it with a ValueError traceback after writing the CSVs."""
    report_dir = tmp_path / "rep"
    report_dir.mkdir()
    out = report_dir / "r.html"
    assert _run(sweep_csv, out).exit_code == 0
    victim = tmp_path / "r.report.csv"
    victim.write_text("keep me")
    page = out.read_text()
    meta = re.search(r'<meta name="vegas-sim-companions" content="\[', page)
    assert meta is not None
    crafted = page.replace(meta.group(0), meta.group(0)
                           + f"&#34;../r.report.csv&#34;, &#34;{victim}&#34;, ", 1)
    out.write_text(crafted)
    result = _run(sweep_csv, out)
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert victim.read_text() == "keep me"
    assert html._previous_companions(out) == {p.name for p in report_dir.glob("r.report*.csv")}


# ---- a partial table --------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_partial_table_is_shown_as_partial(suffix: str, tmp_path: Path) -> None:
    note = "interrupted after 40 of 504 configurations; run the same command again to resume"
    df = fake_sweep(np.random.default_rng(0)).assign(**{PARTIAL_COLUMN: note})
    src = write_table(df, tmp_path / f"s{suffix}")
    result = _run(src, tmp_path / "r.html")
    assert result.exit_code == 0, result.output
    assert f"is a partial table: {note}" in result.output
    assert f"PARTIAL table, not the whole grid: {note}" in (tmp_path / "r.html").read_text()


def test_a_complete_table_is_not_called_partial(tmp_path: Path, sweep_csv: Path) -> None:
    result = _run(sweep_csv, tmp_path / "r.html")
    assert result.exit_code == 0 and "partial" not in result.output
    assert "PARTIAL" not in (tmp_path / "r.html").read_text()
    assert PARTIAL_COLUMN not in pd.read_csv(sweep_csv).columns
