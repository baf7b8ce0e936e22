"""One writer per output: a second command writing the same --out (or trace-set directory) is
refused with a message naming the first; a lock left by a process that died is taken over."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.sim.test_sweep import Models, synthetic_models
from vegas_sim.cli import cli
from vegas_sim.errors import UserInputError
from vegas_sim.reports.csv import read_table
from vegas_sim.runs import checkpoint_dir, sweep_to_file
from vegas_sim.sim.sweep import SweepGrid

REPO = Path(__file__).resolve().parents[1]
GRID = SweepGrid(methods=("vegas",), gamma=(2, 4), sparsity=(0.07,), batch=(1, 4),
                 context=(4096,), output_len=(128,))
HOLD = ("import sys; from vegas_sim.files import output_lock\n"
        "with output_lock(sys.argv[1]):\n"
        "    print('held', flush=True); sys.stdin.read()\n")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    return synthetic_models(tmp_path_factory.mktemp("locks") / "ts")


def test_two_concurrent_sweeps_on_one_out(models: Models, tmp_path: Path) -> None:
    """The second sweep starts while the first is running (from the first's progress
    callback): it is refused, naming the first; the first writes the whole table."""
    out = tmp_path / "s.csv"
    second: list[BaseException | None] = []

    def run_second() -> None:
        try:
            sweep_to_file(GRID, *models, out, workers=1)  # type: ignore[arg-type]
            second.append(None)
        except BaseException as e:  # noqa: BLE001 - recorded for the assertions below
            second.append(e)

    def progress(done: int, total: int) -> None:
        if not second and done > 0:
            worker = threading.Thread(target=run_second)
            worker.start()
            worker.join(timeout=60)

    first = sweep_to_file(GRID, *models, out, workers=1, progress=progress)  # type: ignore[arg-type]
    assert len(second) == 1 and isinstance(second[0], UserInputError), second
    assert "being written by process" in second[0].message()
    assert len(first.table) == len(read_table(out)) == len(GRID)
    assert not checkpoint_dir(out).exists() and not (tmp_path / "s.csv.lock").exists()


@pytest.fixture()
def holder(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """Another process holding the lock of `tmp_path/out`'s outputs, as a running command
    would: yields it and the folder; killed at the end."""
    procs: list[subprocess.Popen[str]] = []

    def start(path: Path) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], cwd=REPO, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        return proc

    yield start  # type: ignore[misc]
    for proc in procs:
        proc.kill()
        proc.wait()


COMMANDS = {
    "sweep": lambda out: ["sweep", "--gamma", "4", "--sparsity", "0.07", "--batch", "1",
                          "--context", "4K", "-m", "vegas", "--out", str(out / "s.csv")],
    "tune": lambda out: ["tune", "--batch", "1", "--context", "4K", "--out",
                         str(out / "t.json")],
    "report": lambda out: ["report", str(out / "missing.csv"), "--out", str(out / "r.html")],
    "traces merge": lambda out: ["traces", "merge", str(out / "merged"), "smollm2-135m-h200"],
    "traces subset": lambda out: ["traces", "subset", "smollm2-135m-h200", "--where",
                                  "batch<=4", "--out", str(out / "sub")],
    "traces finalize": lambda out: ["traces", "finalize", str(out / "set")],
    "calibrate": lambda out: ["calibrate", "--model", "smollm2-135m", "--out", str(out / "ts")],
    "validate": lambda out: ["validate", "--traces", "smollm2-135m-h200", "--model",
                             "smollm2-135m", "--random", "2", "--out", str(out / "v.csv")],
}
LOCKED = {"sweep": "s.csv", "tune": "t.json", "report": "r.html", "traces merge": "merged",
          "traces subset": "sub", "traces finalize": "set", "calibrate": "ts",
          "validate": "v.csv"}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_second_writer_is_refused_naming_the_first(command: str, tmp_path: Path,
                                                     holder: object) -> None:
    first = holder(tmp_path / LOCKED[command])  # type: ignore[operator]
    result = CliRunner().invoke(cli, COMMANDS[command](tmp_path))
    assert result.exit_code == 1, result.output
    assert f"being written by process {first.pid}" in result.output
    assert "choose another" in result.output
    assert "Traceback" not in result.output


def test_a_lock_of_a_process_that_died_is_taken_over(tmp_path: Path, holder: object) -> None:
    first = holder(tmp_path / "r.html")  # type: ignore[operator]
    first.kill()
    first.wait()
    assert (tmp_path / "r.html.lock").exists()  # left behind by the killed process
    result = CliRunner().invoke(cli, COMMANDS["report"](tmp_path))
    assert result.exit_code == 1 and "being written" not in result.output
    assert "missing.csv" in result.output  # it went on to read its input
    assert not (tmp_path / "r.html.lock").exists()
