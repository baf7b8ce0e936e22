"""calibrate and validate on a CPU-only install (no torch): every bad option or file is named
before torch is needed, and good ones end in how to install the `gpu` extra, not in a
ModuleNotFoundError."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from vegas_sim.cli import cli

GPU_PACKAGES = ("torch", "triton", "gguf", "tokenizers")
GPU_HALF = ("vegas_sim.calibrate.", "vegas_sim.validate.", "vegas_sim.kernels")


@pytest.fixture()
def no_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU extra uninstalled: its packages cannot be imported, and the modules of the GPU
    half that imported them are forgotten (all restored afterwards)."""
    for name, module in list(sys.modules.items()):
        top = name.split(".")[0]
        if top in GPU_PACKAGES or name.startswith(GPU_HALF):
            parent, _, child = name.rpartition(".")
            if parent and sys.modules.get(parent) is not None:
                monkeypatch.setattr(sys.modules[parent], child, module, raising=False)
            monkeypatch.delitem(sys.modules, name)
    for name in GPU_PACKAGES:
        monkeypatch.setitem(sys.modules, name, None)  # type: ignore[arg-type]


def _calibrate(tmp_path: Path, *extra: str) -> list[str]:
    return ["calibrate", "--model", "smollm2-135m", "--out", str(tmp_path / "ts"), *extra]


def _validate(tmp_path: Path, *extra: str, random: bool = True) -> list[str]:
    return ["validate", "--traces", "smollm2-135m-h200", "--model", "smollm2-135m",
            *(["--random", "2"] if random else []), "--out", str(tmp_path / "v.csv"), *extra]


CASES = {
    "calibrate --gamma 0": (_calibrate, ("--gamma", "0"), "--gamma"),
    "calibrate --sparsity 2": (_calibrate, ("--sparsity", "2"), "sparsity"),
    "calibrate --batch 0": (_calibrate, ("--batch", "0"), "--batch"),
    "calibrate --context abc": (_calibrate, ("--context", "abc"), "--context"),
    "calibrate --methods nope": (_calibrate, ("--methods", "nope"), "--methods"),
    "calibrate --workload nope": (_calibrate, ("--workload", "nope"), "--workload"),
    "calibrate --temperature -1": (_calibrate, ("--temperature", "-1"), "--temperature"),
    "calibrate --iterations 0": (_calibrate, ("--iterations", "0"), "--iterations"),
    "calibrate --min-tokens 0": (_calibrate, ("--min-tokens", "0"), "--min-tokens"),
    "calibrate --prompts 0": (_calibrate, ("--prompts", "0"), "--prompts"),
    "calibrate --rope-scaling x": (_calibrate, ("--rope-scaling", "x"), "--rope-scaling"),
    "calibrate --model missing": (_calibrate, ("--model", "missing.gguf"), "--model"),
    "validate --traces missing": (_validate, ("--traces", "no-such-set"), "--traces"),
    "validate --acceptance-traces missing": (_validate, ("--acceptance-traces", "no-such-set"),
                                             "--acceptance-traces"),
    "validate --model missing": (_validate, ("--model", "missing.gguf"), "--model"),
    "validate --time-budget -1": (_validate, ("--time-budget", "-1"), "--time-budget"),
    "validate --replications 0": (_validate, ("--replications", "0"), "--replications"),
    "validate --context-range x": (_validate, ("--context-range", "x"), "--context-range"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_option_is_named_before_torch_is_needed(case: str, tmp_path: Path,
                                                      no_torch: None) -> None:
    command, extra, option = CASES[case]
    result = CliRunner().invoke(cli, command(tmp_path, *extra))
    assert result.exit_code == 1 and not isinstance(result.exception, ImportError), result.output
    assert option in result.output and "vegas-sim[gpu]" not in result.output


def test_a_missing_heldout_file_is_named(tmp_path: Path, no_torch: None) -> None:
    args = _validate(tmp_path, "--heldout", str(tmp_path / "missing.csv"), random=False)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and "missing.csv" in result.output, result.output


def test_a_calibrate_out_that_is_a_file_is_refused(tmp_path: Path, no_torch: None) -> None:
    (tmp_path / "ts").write_text("a file")
    result = CliRunner().invoke(cli, _calibrate(tmp_path))
    assert result.exit_code == 1 and "--out" in result.output and "is a file" in result.output


@pytest.mark.parametrize("command", [_calibrate, _validate])
def test_good_inputs_say_how_to_install_the_gpu_extra(command: object, tmp_path: Path,
                                                      no_torch: None) -> None:
    result = CliRunner().invoke(cli, command(tmp_path))  # type: ignore[operator]
    assert result.exit_code == 1 and not isinstance(result.exception, ImportError), result.output
    assert "pip install 'vegas-sim[gpu]'" in result.output
    assert "Traceback" not in result.output
