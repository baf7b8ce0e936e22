"""Ctrl-C at any moment of a command exits 130 with one line saying what the command left, never
a traceback: while the commands are imported (the first seconds: numpy, pandas, scipy), while
one runs, and while the process exits. On fba85c4 a SIGINT to `tune` in its first 3 s (4 of
9 delays tried) printed a KeyboardInterrupt traceback from the imports and exited -2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vegas_sim.cli import INTERRUPTED, NOTHING_WRITTEN, command_words, interrupted_note

REPO = Path(__file__).resolve().parents[1]
# Runs the console script's main() with SIGINT sent to itself at one point of the run:
# `import:<module>` when that module starts to import, `run` when the command starts its
# work, `exit` when the interpreter exits after the command.
SCRIPT = """
import atexit, os, signal, sys, time
where = sys.argv[1]
sys.argv = ["vegas-sim", *sys.argv[2:]]
def interrupt():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.5)
if where.startswith("import:"):
    class Hook:
        def find_spec(self, name, path=None, target=None):
            if name == where[7:]:
                interrupt()
            return None
    sys.meta_path.insert(0, Hook())
elif where == "run":
    import vegas_sim.api as api
    api.tune = lambda **_: interrupt()
elif where == "exit":
    atexit.register(interrupt)
from vegas_sim.cli import main
main()
"""


def _tune(tmp_path: Path) -> list[str]:
    return ["tune", "--batch", "1", "--context", "4K", "--out", str(tmp_path / "t.json")]


def _run(where: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SCRIPT, where, *args], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("where", ["import:click", "import:pandas", "import:vegas_sim.sim.tune",
                                   "import:vegas_sim.sim.predict", "run"])
def test_ctrl_c_while_tune_starts_or_runs_says_what_was_kept(where: str,
                                                             tmp_path: Path) -> None:
    done = _run(where, _tune(tmp_path))
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"interrupted: {INTERRUPTED['tune']}"
    assert not (tmp_path / "t.json").exists()


def test_ctrl_c_while_the_process_exits_just_exits(tmp_path: Path) -> None:
    done = _run("exit", ["traces", "list"])
    assert done.returncode == 130 and "smollm2-135m-h200" in done.stdout
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr


def test_a_real_sigint_to_the_process_group_during_start_up(tmp_path: Path) -> None:
    """As a terminal's Ctrl-C: SIGINT to the whole group, half a second in."""
    proc = subprocess.Popen([sys.executable, "-c", "from vegas_sim.cli import main; main()",
                             *_tune(tmp_path)], cwd=REPO, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "Traceback" not in err, err


@pytest.mark.parametrize(("argv", "words"), [
    (["predict", "--gamma", "7"], "predict"),
    (["traces", "merge", "out", "a", "b"], "traces merge"),
    (["--help"], ""),
    (["report", "s.csv", "--out", "r.html"], "report"),
])
def test_the_interrupt_line_names_the_command(argv: list[str], words: str) -> None:
    assert command_words(argv) == words
    assert interrupted_note(argv) == INTERRUPTED.get(words, NOTHING_WRITTEN)
    assert set(INTERRUPTED) <= {"predict", "tune", "report", "sweep", "calibrate", "validate",
                                "traces merge", "traces subset", "traces finalize",
                                "traces import-vllm"}
