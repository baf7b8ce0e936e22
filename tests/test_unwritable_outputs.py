"""Every command that writes, pointed at a place that takes no file (a read-only filesystem,
/proc, a directory under either), exits 1 naming its output option and the path, with no
traceback and nothing written. Running as root, a directory's mode does not stop a write,
so the read-only place is sysfs (mounted read-only in containers, and refusing new files
everywhere) and, when not root, a 0555 directory."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from vegas_sim.cli import cli

FIX = Path(__file__).parent / "traces" / "fixtures" / "vllm"
VLLM = ["traces", "import-vllm", str(FIX / "bench_serve.json"), "--method", "vegas", "--gamma",
        "4", "--sparsity", "0.07", "--workload", "reasoning", "--temperature", "0.6",
        "--model", "qwen3-8b", "--context", "1K..32K"]
# command -> (arguments writing to `base`, the option named in the error: '' for the path)
COMMANDS: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "predict": (lambda b: ["predict", "--engine", "analytic", "--out", str(b / "p.json")],
                "--out"),
    "sweep": (lambda b: ["sweep", "--gamma", "4", "--batch", "1", "--context", "4K",
                         "--out", str(b / "s.csv")], "--out"),
    "tune": (lambda b: ["tune", "--batch", "1", "--context", "4K", "--out", str(b / "t.json")],
             "--out"),
    "report": (lambda b: ["report", str(FIX / "bench_serve.json"), "--out", str(b / "r.html")],
               "--out"),
    "traces merge": (lambda b: ["traces", "merge", str(b / "m"), "smollm2-135m-h200",
                                "smollm2-135m-real"], "OUT"),
    "traces subset": (lambda b: ["traces", "subset", "smollm2-135m-h200", "--where",
                                 "batch<=4", "--out", str(b / "sub")], "--out"),
    # finalize writes into an existing set: a missing one is refused for what it is
    "traces finalize": (lambda b: ["traces", "finalize", str(b / "set")], ""),
    "import-vllm --out": (lambda b: [*VLLM, "--out", str(b / "a.json")], "--out"),
    "import-vllm --trace-set": (lambda b: [*VLLM, "--trace-set", str(b / "ts")],
                                "--trace-set"),
    "calibrate": (lambda b: ["calibrate", "--model", "smollm2-135m", "--out", str(b / "ts")],
                  "--out"),
    "validate": (lambda b: ["validate", "--traces", "smollm2-135m-h200", "--model",
                            "smollm2-135m", "--random", "2", "--out", str(b / "v.csv")],
                 "--out"),
}


def _places(tmp_path: Path) -> list[Path]:
    places = []
    if Path("/proc/self").is_dir():
        places += [Path("/proc"), Path("/proc/self"), Path("/proc/no-such/deeper")]
    if os.path.ismount("/sys") or Path("/sys/kernel").is_dir():
        places += [Path("/sys"), Path("/sys/kernel")]
    if os.geteuid() != 0:
        locked = tmp_path / "read-only"
        locked.mkdir()
        locked.chmod(0o555)
        places.append(locked)
    return places


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_output_where_nothing_can_be_written_is_a_clean_error(command: str,
                                                                 tmp_path: Path) -> None:
    args, option = COMMANDS[command]
    places = _places(tmp_path)
    if not places:
        pytest.skip("no place here refuses new files")
    for base in places:
        result = CliRunner().invoke(cli, args(base))
        assert result.exit_code == 1, (base, result.output)
        assert isinstance(result.exception, SystemExit), (base, result.exception)
        assert "Traceback" not in result.output
        assert f"{option}: " in result.output and str(base) in result.output, result.output
        assert "fix:" in result.output
