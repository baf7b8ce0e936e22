"""The command line's handling of what a user types: output files, option spellings, bad
values and Ctrl-C (the library's own checks are tested beside the library)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import click
import pandas as pd
import pytest
from click.testing import CliRunner

from vegas_sim import cli as cli_module
from vegas_sim.cli import cli
from vegas_sim.errors import UserInputError
from vegas_sim.files import check_out
from vegas_sim.sim.engine import PREFILL_MODES

FAST = ["--engine", "analytic", "--gamma", "4"]


def run(args: list[str]) -> click.testing.Result:
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def option_choices(command: click.Command, name: str) -> tuple[str, ...]:
    param = next(p for p in command.params if p.name == name)
    assert isinstance(param.type, click.Choice)
    return tuple(param.type.choices)


def test_prefill_choices_are_the_engines_and_each_runs() -> None:
    predict = cli.get_command(click.Context(cli), "predict")  # a lazy group: loaded on use
    assert predict is not None and option_choices(predict, "prefill") == PREFILL_MODES
    for mode in PREFILL_MODES:
        result = run(["predict", "--gamma", "4", "--replications", "1", "--prefill", mode])
        assert result.exit_code == 0, result.output


@pytest.mark.parametrize(("suffix", "read"), [
    (".csv", pd.read_csv), (".parquet", pd.read_parquet),
    (".json", lambda p: pd.DataFrame(json.loads(Path(p).read_text())["rows"])),
])
def test_predict_out_writes_the_format_its_suffix_names(tmp_path: Path, suffix: str,
                                                         read: object) -> None:
    out = tmp_path / f"pred{suffix}"
    result = run(["predict", *FAST, "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = read(out)  # type: ignore[operator]
    assert list(rows["method"]) == ["vanilla", "vegas"]
    assert "tok/s" in result.output  # --out alone still shows the table


def test_predict_format_must_agree_with_out(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["predict", *FAST, "--format", "json",
                                      "--out", str(tmp_path / "p.csv")])
    assert result.exit_code == 1 and "--format json disagrees" in result.output
    assert not (tmp_path / "p.csv").exists()


def test_predict_csv_on_stdout_keeps_its_notes_on_stderr() -> None:
    result = CliRunner().invoke(cli, ["predict", *FAST, "--format", "csv"])
    assert result.exit_code == 0
    assert result.stdout.startswith("method,") and "note:" not in result.stdout
    assert "note: acceptance" in result.stderr


@pytest.mark.parametrize("command", [
    ["predict", *FAST], ["sweep", "--gamma", "4"], ["tune", "--batch", "1"],
])
def test_a_bad_out_path_fails_before_any_work(tmp_path: Path, command: list[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from vegas_sim import api

    def no_work(*_: object, **__: object) -> None:
        raise AssertionError("the models were loaded before --out was checked")
    monkeypatch.setattr(api, "load_models", no_work)
    monkeypatch.setattr(api, "predict", no_work)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    suffix = {"predict": ".csv", "sweep": ".csv", "tune": ".json"}[command[0]]
    for out, problem in ((tmp_path, "is a directory"),
                         (blocker / f"x{suffix}", "not a directory"),
                         (tmp_path / "x.txt", "from its suffix")):
        result = CliRunner().invoke(cli, [*command, "--out", str(out)])
        assert result.exit_code == 1, result.output
        assert "--out" in result.output and problem in result.output
        assert "Traceback" not in result.output


def test_check_out_refuses_a_missing_parent_and_makes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "new" / "dir" / "s.csv"
    with pytest.raises(UserInputError, match="does not exist") as e:
        check_out(out, (".csv",))
    assert "mkdir -p" in e.value.fix and not (tmp_path / "new").exists()
    assert check_out(tmp_path / "s.csv", (".csv",)) == tmp_path / "s.csv"
    with pytest.raises(UserInputError, match=r"\*\.csv, \*\.parquet"):
        check_out(tmp_path / "s.xlsx", (".csv", ".parquet"))


@pytest.mark.parametrize(("args", "option", "problem"), [
    (["predict", "--temperature", "-1"], "--temperature", "temperature must be >= 0"),
    (["predict", "--gamma", "0"], "--gamma", "gamma must be >= 1"),
    (["predict", "--sparsity", "0.05,0.1"], "--sparsity", "is a grid"),
    (["sweep", "--gamma", "4", "--workers", "0", "--out", "x.csv"], "--workers", ">= 1"),
    (["sweep", "--gamma", "4", "--scheduler", "foo", "--out", "x.csv"], "--scheduler",
     "cannot reach"),
])
def test_bad_values_name_their_option(args: list[str], option: str, problem: str,
                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("distributed") if "--scheduler" in args else None
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output
    assert f"Error: {option}" in result.output and problem in result.output


def test_predict_takes_sparsity_as_sweep_does() -> None:
    rows = {}
    for text in ("0.05", "5%"):
        result = CliRunner().invoke(cli, ["predict", *FAST, "--sparsity", text,
                                          "--format", "json"])
        assert result.exit_code == 0, result.output
        rows[text] = json.loads(result.stdout)["rows"][1]
    assert rows["5%"]["sparsity"] == 0.05
    assert rows["5%"]["throughput_tok_s"] == rows["0.05"]["throughput_tok_s"]


def test_tune_prints_no_interval_for_the_analytic_engine(tmp_path: Path) -> None:
    result = run(["tune", "--batch", "4", "--out", str(tmp_path / "t.json")])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("B="))
    assert "[" not in line and "no confidence intervals" in result.output
    strategy = json.loads((tmp_path / "t.json").read_text())["strategy"]
    assert strategy["baseline_gamma"] == strategy["gamma"]  # baselines get the same γ range


def test_ctrl_c_exits_130_and_says_what_was_kept(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from vegas_sim import api

    def interrupted(**_: object) -> None:
        raise KeyboardInterrupt
    monkeypatch.setattr(api, "predict", interrupted)
    monkeypatch.setattr(sys, "argv", ["vegas-sim", "predict"])
    with pytest.raises(SystemExit) as done:
        cli_module.main()
    assert done.value.code == 130
    assert "interrupted" in capsys.readouterr().err


def test_main_keeps_click_exit_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    for argv, code in ((["predict", "--gamma", "0"], 1), (["no-such-command"], 2),
                       (["--version"], 0)):
        monkeypatch.setattr(sys, "argv", ["vegas-sim", *argv])
        with pytest.raises(SystemExit) as done:
            cli_module.main()
        assert done.value.code == code, argv


def test_model_comes_from_traces_and_ignores_case() -> None:
    by_traces = run(["predict", *FAST, "--traces", "smollm2-135m-h200", "--context", "4K",
                     "--format", "json"])
    by_name = run(["predict", *FAST, "--model", "SmolLM2-135M", "--context", "4K",
                   "--format", "json"])
    assert by_traces.exit_code == by_name.exit_code == 0, by_traces.output + by_name.output
    rows = [json.loads(r.stdout)["rows"] for r in (by_traces, by_name)]
    assert rows[0][1]["throughput_tok_s"] == rows[1][1]["throughput_tok_s"]
    assert "smollm2-135m-h200" in json.loads(by_name.stdout)["notes"][0]


def test_predict_rows_read_like_sweep_rows(tmp_path: Path) -> None:
    """Vanilla's γ / sparsity and the per-position rates are spelled the same in predict's CSV
    (stdout or file) as in sweep's, so the two tables concatenate."""
    stdout = run(["predict", *FAST, "--format", "csv"]).stdout
    predicted = pd.read_csv(io.StringIO(stdout))
    assert run(["sweep", "--gamma", "4", "--sparsity", "0.07",
                "--out", str(tmp_path / "s.csv")]).exit_code == 0
    swept = pd.read_csv(tmp_path / "s.csv")
    for table in (predicted, swept):
        vanilla = table[table["method"] == "vanilla"].iloc[0]
        assert (vanilla["gamma"], vanilla["sparsity"]) == (1, 1.0)
        assert "rates" not in table.columns and "rate_4" in table.columns


def test_progress_without_a_terminal_is_plain_lines(capsys: pytest.CaptureFixture[str]) -> None:
    """Under nohup, CI or a batch job a long calibration still says where it is: one line per
    new step (the same step again only after LOG_EVERY_S) and one at the end."""
    from vegas_sim.cli.common import progress_task

    with progress_task("calibrating") as progress:
        for done, label in ((0, "start"), (1, "B=1 C=256"), (1, "B=1 C=256"), (2, "B=2 C=256")):
            progress(done, 2, label)
    lines = capsys.readouterr().err.splitlines()
    assert [x.split(" (")[0] for x in lines] == [
        "calibrating: 0/2 start", "calibrating: 1/2 B=1 C=256", "calibrating: 2/2 B=2 C=256"]


def test_an_interrupted_calibration_says_how_much_it_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vegas_sim.calibrate import runner

    def two_points_then_ctrl_c(plan: object, out: object, progress: Any,
                               **_: object) -> None:
        progress(2, 5, "B=1 C=256")
        raise KeyboardInterrupt
    monkeypatch.setattr(runner, "run_calibration", two_points_then_ctrl_c)
    result = CliRunner().invoke(cli, ["calibrate", "--model", "smollm2-135m", "--device",
                                      "cpu", "--quick", "--out", str(tmp_path / "ts")])
    assert result.exit_code == 1  # click's Abort; the console script turns it into 130
    assert "calibrate: 2 of 5 points kept in" in result.output
    assert "run the same command again to resume" in result.output


def test_an_interrupted_validation_says_how_to_continue(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vegas_sim.validate import run

    def ctrl_c(**_: object) -> None:
        raise KeyboardInterrupt
    monkeypatch.setattr(run, "run_validation", ctrl_c)
    result = CliRunner().invoke(cli, ["validate", "--traces", "smollm2-135m-h200", "--model",
                                      "smollm2-135m", "--random", "2", "--passes", "3",
                                      "--device", "cpu", "--out", str(tmp_path / "v.csv")])
    assert result.exit_code == 1
    assert "the same command with --resume continues it" in result.output


def test_repredict_will_not_overwrite_its_input(tmp_path: Path) -> None:
    table = tmp_path / "val.csv"
    table.write_text("method\nvegas\n")
    result = CliRunner().invoke(cli, ["validate", "--repredict", str(table), "--traces",
                                      "qwen3-8b-h200", "--out", str(table)])
    assert result.exit_code == 2 and "would overwrite the --repredict table" in result.output
    assert table.read_text() == "method\nvegas\n"


H100_RUNS = Path(__file__).parents[2] / "benchmarks/results/validate_h100_rev7_qwen3_8b.csv"


def test_repredict_on_another_gpu_prices_a_what_if_that_its_interval_admits(
        tmp_path: Path) -> None:
    """Rows run on an H100, predicted from the H200 set as an H100 what-if (said so, with the
    'gpu' term in the interval), and from the H100's own set as measured."""
    table = tmp_path / "h100.csv"
    pd.read_csv(H100_RUNS).iloc[:3].to_csv(table, index=False)
    result = CliRunner().invoke(cli, ["validate", "--repredict", str(table), "--traces",
                                      "qwen3-8b-h200", "--gpu", "h100-sxm", "--out",
                                      str(tmp_path / "what_if.csv")])
    assert result.exit_code == 0, result.output
    assert "GPU h100-sxm: what-if by datasheet ratios from qwen3-8b-h200" in result.output
    what_if = pd.read_csv(tmp_path / "what_if.csv")
    assert set(what_if["gpu"]) == {"h100-sxm (what-if, not measured)"}
    assert (what_if["pi_low"] <= what_if["measured"]).all()
    result = CliRunner().invoke(cli, ["validate", "--repredict", str(table), "--traces",
                                      "qwen3-8b-h100", "--gpu", "h100-sxm", "--out",
                                      str(tmp_path / "measured.csv")])
    assert "GPU h100-sxm: measured (qwen3-8b-h100)" in result.output
    measured = pd.read_csv(tmp_path / "measured.csv")
    assert (measured["pi_extrapolation_distance_pct"]
            < what_if["pi_extrapolation_distance_pct"]).all()


def test_validate_refuses_a_gpu_for_a_run(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["validate", "--traces", "qwen3-8b-h200", "--random", "2",
                                      "--model", "qwen3-8b", "--gpu", "h100-sxm", "--out",
                                      str(tmp_path / "v.csv")])
    assert result.exit_code == 2 and "a run is priced on the GPU it runs on" in result.output


def test_sweep_without_a_terminal_reports_progress_as_calibrate_does(tmp_path: Path) -> None:
    result = run(["sweep", "--gamma", "2..4", "--out", str(tmp_path / "s.csv")])
    assert result.exit_code == 0, result.output
    assert "sweep (analytic): 16/16 (" in result.stderr


def test_acceptance_traces_picks_the_set_and_says_it_is_yarn_extended() -> None:
    result = run(["predict", "--model", "qwen3-8b", "--engine", "analytic", "--context", "24K",
                  "--workload", "recall", "--acceptance-traces", "smollm2-135m-real-yarn4",
                  "--acceptance-anchor", "none"])
    assert result.exit_code == 0, result.output
    assert "smollm2-135m-real-yarn4 (real weights, NVIDIA H200 measured, YaRN-extended" \
        in result.output
    assert "outside traced" not in result.output  # 24K lies inside the set's 12K-32K
    assert "draft step / vanilla decode step: vegas" in result.output
    bad = CliRunner().invoke(cli, ["predict", "--acceptance-traces", "qwen3-8b-h200"])
    assert bad.exit_code != 0 and "real" in bad.output


def test_progress_in_a_log_steps_every_five_percent(capsys: pytest.CaptureFixture[str]) -> None:
    """A sweep logging to a file says where it is as it goes, not only "0/N" and the end:
    a line each time another 5 % is done (or LOG_EVERY_S passed), fewer than one per update."""
    from vegas_sim.cli.common import progress_lines

    progress = progress_lines("sweep (analytic)")
    for done in range(0, 2411, 10):
        progress(min(done, 2410), 2410, "")
    lines = capsys.readouterr().err.splitlines()
    done_seen = [int(x.split(": ")[1].split("/")[0]) for x in lines]
    assert done_seen[0] == 0 and done_seen[-1] == 2410
    assert 18 <= len(lines) <= 25  # about one per 5 %, not one per update (242)
    assert all(b - a <= 0.05 * 2410 + 10 for a, b in zip(done_seen, done_seen[1:]))


def test_a_long_job_reports_while_it_runs_and_a_short_one_stays_quiet(
        capsys: pytest.CaptureFixture[str]) -> None:
    """predict's heartbeat: a line every period while the block runs (done of total, time
    so far), none for a block that ends sooner; the reporting thread ends with the block."""
    import threading
    import time

    from vegas_sim.cli.common import heartbeat

    with heartbeat("predicting", "methods", every_s=0.02) as progress:
        progress(1, 2)
        time.sleep(0.5)
    assert "predicting: 1/2 methods done" in capsys.readouterr().err
    with heartbeat("predicting", "methods", every_s=30.0) as progress:
        progress(2, 2)
    assert capsys.readouterr().err == ""
    assert not any(t.daemon and t.is_alive() and t.name.startswith("Thread")
                   for t in threading.enumerate())
