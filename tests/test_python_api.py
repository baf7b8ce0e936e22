"""The Python API (`vegas_sim.predict` …): the README's "From Python" block and the functions'
own examples run as written, and the functions return what the CLI prints."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import vegas_sim
import vegas_sim.api
from vegas_sim.cli import cli
from vegas_sim.errors import UserInputError

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_from_python_block_runs() -> None:
    block = README.read_text().split("## From Python", 1)[1].split("```python", 1)[1]
    block = block.split("```", 1)[0]
    test = doctest.DocTestParser().get_doctest(block, {}, "README From Python", str(README), 0)
    assert len(test.examples) >= 10
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    assert runner.failures == 0


@pytest.mark.parametrize("module", [vegas_sim, vegas_sim.api])
def test_docstring_examples_run(module: object) -> None:
    failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)  # type: ignore[arg-type]
    assert tried > 0 and failures == 0


def test_exports_are_the_commands() -> None:
    for name in ("predict", "sweep", "tune", "report", "repredict", "load_traces",
                 "check_traces", "show_traces"):
        assert callable(getattr(vegas_sim, name)), name
    with pytest.raises(AttributeError):
        vegas_sim.no_such_command  # noqa: B018


def test_predict_returns_the_rows_and_notes_the_cli_prints() -> None:
    args = ["--gamma", "5", "--engine", "analytic", "--context", "16K", "--gpu", "b200"]
    shown = json.loads(CliRunner().invoke(cli, ["predict", *args, "--format", "json"]).stdout)
    table = vegas_sim.predict(gamma=5, engine="analytic", context=16384, gpu="b200")
    assert table.attrs["notes"] == shown["notes"]
    # the JSON writes 10 significant digits
    assert list(table["throughput_tok_s"]) == pytest.approx(
        [r["throughput_tok_s"] for r in shown["rows"]], rel=1e-9)


def test_a_gpu_with_a_measured_set_is_not_a_what_if() -> None:
    """--gpu h100-sxm for qwen3-8b takes the set measured on an H100, and every output says
    it is measured; --gpu h100-nvl, measured nowhere, stays a what-if from the H200 set."""
    measured = vegas_sim.predict(gamma=5, engine="analytic", context=16384, gpu="h100-sxm")
    notes = measured.attrs["notes"]
    assert "latency: qwen3-8b-h100 (random weights, NVIDIA H100 80GB HBM3 measured)" in notes
    assert "GPU h100-sxm: measured (qwen3-8b-h100)" in notes
    assert not any("what-if" in n for n in notes)
    assert set(measured["gpu"]) == {"NVIDIA H100 80GB HBM3 (measured)"}
    what_if = vegas_sim.predict(gamma=5, engine="analytic", context=16384, gpu="h100-nvl")
    assert "GPU h100-nvl: what-if by datasheet ratios — NOT measured" in what_if.attrs["notes"]
    assert set(what_if["gpu"]) == {"h100-nvl (what-if, not measured)"}


def test_api_errors_name_the_argument() -> None:
    with pytest.raises(UserInputError, match="--gpu: unknown GPU"):
        vegas_sim.predict(gpu="mi300x")
    with pytest.raises(UserInputError, match="is a grid"):
        vegas_sim.predict(context="4K,8K")


@pytest.mark.parametrize("output_len", ["lognormal:300,0.5", "256,512"])
def test_tune_refuses_more_than_one_output_length(output_len: str) -> None:
    """tune prices every configuration at one length: a distribution or a grid is refused
    before anything is loaded, naming the option (it was a bare int() ValueError)."""
    with pytest.raises(UserInputError, match="--output-len: tune takes one output length"):
        vegas_sim.tune(batch="4", context="2K", output_len=output_len)  # type: ignore[arg-type]
