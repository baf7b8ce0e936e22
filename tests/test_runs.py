"""Sweeps to a file: an interrupt keeps the finished rows, the same command resumes, and the
resumed table is the uninterrupted one; a real `vegas-sim sweep` of a 576K-configuration grid
stops within seconds of SIGINT and leaves no worker behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from click.testing import CliRunner

from tests.sim.test_sweep import Models, synthetic_models
from vegas_sim.cli.explore import report
from vegas_sim.errors import UserInputError
from vegas_sim.reports.csv import PARTIAL_COLUMN, read_table, write_table
from vegas_sim.runs import SweepInterrupted, checkpoint_dir, sweep_to_file
from vegas_sim.sim.sweep import SweepGrid, sweep

REPO = Path(__file__).resolve().parents[1]
GRID = SweepGrid(methods=("vegas", "magicdec-stream"), gamma=(2, 4, 6), sparsity=(0.03, 0.07),
                 batch=(1, 4), context=(4096, 32768), output_len=(128,))
# 12 γ × 1000 sparsities × 2 methods × 24 cells + 24 vanilla rows = 576 024 configurations.
HUGE = ["--gamma", "1..12", "--sparsity", "0.001..1:0.001", "--batch", "1..32:x2",
        "--context", "1K..8K:x2", "-m", "vegas", "-m", "magicdec-stream", "--workers", "2"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    return synthetic_models(tmp_path_factory.mktemp("runs") / "ts")


def _stop_after(calls: int) -> object:
    """A progress callback that presses Ctrl-C at its `calls`-th call."""
    seen = [0]

    def progress(done: int, total: int) -> None:
        seen[0] += 1
        if seen[0] == calls:
            raise KeyboardInterrupt

    return progress


def test_interrupted_sweep_keeps_rows_and_resumes_to_the_same_table(models: Models,
                                                                    tmp_path: Path) -> None:
    out = tmp_path / "s.csv"
    with pytest.raises(SweepInterrupted) as stopped:
        sweep_to_file(GRID, *models, out, workers=2, progress=_stop_after(3))  # type: ignore[arg-type]
    assert 0 < stopped.value.done < len(GRID) and stopped.value.total == len(GRID)
    partial = read_table(out)
    assert len(partial) == stopped.value.done  # complete rows only, in grid order
    assert partial["throughput_tok_s"].notna().all()
    assert checkpoint_dir(out).is_dir() and "resume" in stopped.value.message()

    done = sweep_to_file(GRID, *models, out, workers=1)
    assert done.resumed == stopped.value.done and not checkpoint_dir(out).exists()
    fresh = tmp_path / "fresh.csv"
    write_table(sweep(GRID, *models, workers=1), fresh)
    # byte-identical to an uninterrupted sweep, but for the wall-clock column
    pd.testing.assert_frame_equal(pd.read_csv(out).drop(columns="wall_s"),
                                  pd.read_csv(fresh).drop(columns="wall_s"))
    assert (out.read_text().splitlines()[0] == fresh.read_text().splitlines()[0])


def test_resume_refuses_another_grid(models: Models, tmp_path: Path) -> None:
    out = tmp_path / "s.parquet"
    with pytest.raises(SweepInterrupted):
        sweep_to_file(GRID, *models, out, workers=1, progress=_stop_after(2))  # type: ignore[arg-type]
    other = SweepGrid(methods=("vegas",), gamma=(2,), sparsity=(0.03,), batch=(1,),
                      context=(4096,), output_len=(128,))
    with pytest.raises(UserInputError, match="another grid") as refused:
        sweep_to_file(other, *models, out, workers=1)
    assert "delete" in refused.value.message()
    with pytest.raises(UserInputError, match="another grid"):
        sweep_to_file(GRID, *models, out, workers=1, seed=1)
    assert len(sweep_to_file(GRID, *models, out, workers=1).table) == len(GRID)


def test_interrupt_before_any_chunk_leaves_no_checkpoint(models: Models, tmp_path: Path) -> None:
    out = tmp_path / "s.csv"
    with pytest.raises(SweepInterrupted) as stopped:
        sweep_to_file(GRID, *models, out, workers=1, progress=_stop_after(1))  # type: ignore[arg-type]
    assert stopped.value.done == 0 and "nothing written" in stopped.value.message()
    assert not out.exists() and not checkpoint_dir(out).exists()


def test_sweep_writes_json_like_predict(models: Models, tmp_path: Path) -> None:
    done = sweep_to_file(GRID, *models, tmp_path / "s.json", workers=1, notes=("from here",))
    doc = json.loads((tmp_path / "s.json").read_text())
    assert set(doc) == {"notes", "rows"} and doc["notes"] == ["from here"]
    assert len(doc["rows"]) == len(done.table) == len(GRID)
    assert doc["rows"][1]["method"] == "vegas" and doc["rows"][1]["throughput_tok_s"] > 0


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".json"])
def test_a_partial_table_says_so_in_the_file_and_report_shows_it(
        suffix: str, models: Models, tmp_path: Path) -> None:
    """fba85c4 wrote the partial CSV and Parquet with nothing to tell them from a whole
    table, and `report` drew them without a word."""
    out = tmp_path / f"s{suffix}"
    with pytest.raises(SweepInterrupted) as stopped:
        sweep_to_file(GRID, *models, out, workers=1, progress=_stop_after(3))  # type: ignore[arg-type]
    rows = (pd.DataFrame(json.loads(out.read_text())["rows"]) if suffix == ".json"
            else read_table(out))
    said = f"interrupted after {stopped.value.done} of {len(GRID)} configurations"
    assert rows[PARTIAL_COLUMN].str.startswith(said).all()
    if suffix != ".json":
        result = CliRunner().invoke(report, [str(out), "--out", str(tmp_path / "r.html")])
        assert result.exit_code == 0, result.output
        assert f"is a partial table: {said}" in result.output
        assert f"PARTIAL table, not the whole grid: {said}" in (tmp_path / "r.html").read_text()
    sweep_to_file(GRID, *models, out, workers=1)  # resumed to the end: a whole table
    whole = (pd.DataFrame(json.loads(out.read_text())["rows"]) if suffix == ".json"
             else read_table(out))
    assert len(whole) == len(GRID) and PARTIAL_COLUMN not in whole.columns


# ---- the real command ----------------------------------------------------------------------
def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (from /proc/*/stat, field 4)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _sweep(out: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    main = "from vegas_sim.cli import main; main()"  # the console script, this checkout
    # SIGINT at its default, so that Python installs its Ctrl-C handler in the child even when
    # the tests run in the background, where the shell starts them with SIGINT ignored
    return subprocess.Popen([sys.executable, "-c", main, "sweep", *HUGE, "--out", str(out)],
                            env=env, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _interrupt_once_working(proc: subprocess.Popen[str], out: Path) -> tuple[float, list[int]]:
    """Wait until it checkpoints a chunk, SIGINT the command; (seconds to exit, workers)."""
    deadline = time.monotonic() + 120
    before = set(checkpoint_dir(out).glob("segment-*.parquet"))
    while not set(checkpoint_dir(out).glob("segment-*.parquet")) - before:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "no chunk finished in 120 s"
        time.sleep(0.2)
    workers = _children(proc.pid)
    assert len(workers) >= 2, workers  # the pool's processes are running
    proc.send_signal(signal.SIGINT)
    start = time.monotonic()
    proc.wait(timeout=30)
    return time.monotonic() - start, workers


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_ctrl_c_stops_a_huge_sweep_in_seconds_and_it_resumes(tmp_path: Path) -> None:
    out = tmp_path / "huge.csv"
    first = _sweep(out)
    took, workers = _interrupt_once_working(first, out)
    err = first.stderr.read() if first.stderr else ""
    assert first.returncode == 130, err
    assert took < 10, took
    assert not any(_alive(w) for w in workers), workers
    assert "576024 configurations, ~" in err  # the estimate came before the work
    assert "sweep (analytic): 0/576024" in err  # and the first progress line
    kept = pd.read_csv(out)
    assert 0 < len(kept) < 576024 and kept["throughput_tok_s"].notna().all()
    assert f"with the {len(kept)} of 576024" in err and "run the same command again" in err

    second = _sweep(out)  # the same command resumes
    took, workers = _interrupt_once_working(second, out)
    err = second.stderr.read() if second.stderr else ""
    assert second.returncode == 130 and took < 10, (took, err)
    assert not any(_alive(w) for w in workers)
    assert f"resuming {checkpoint_dir(out)}/: {len(kept)} configurations already done" in err
    more = pd.read_csv(out)
    assert len(more) > len(kept)
    key = ["method", "gamma", "sparsity", "batch", "context"]
    both = kept.merge(more, on=key, suffixes=("", "_resumed"))
    assert len(both) == len(kept)  # every kept row is still there, with the same numbers
    assert (both["throughput_tok_s"] == both["throughput_tok_s_resumed"]).all()
