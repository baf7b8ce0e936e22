"""Where a trace-set directory is expected: packaged sets by bare name, paths always first,
and a file (not a directory) said to be a file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from vegas_sim.cli import cli
from vegas_sim.errors import TraceSetError
from vegas_sim.traces import catalog, io

PACKAGED = "qwen3-8b-h200"  # the smallest packaged set (latency only)


@pytest.fixture
def packaged(small_set: Path, tmp_path: Path) -> Path:
    """A packaged-sets directory holding the small set under the name 'small-set'."""
    root = tmp_path / "default"
    root.mkdir()
    shutil.copytree(small_set, root / "small-set")
    return root


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory: no relative path names a trace set from here."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def _error(path: str | Path, **kwargs: Path) -> str:
    with pytest.raises(TraceSetError) as info:
        io.load_trace_set(path, **kwargs)
    return str(info.value)


# ------------------------------------------------------------------------------ names
def test_a_bare_name_loads_the_packaged_set(packaged: Path, elsewhere: Path) -> None:
    ts = io.load_trace_set("small-set", packaged_dir=packaged)
    assert ts.path == packaged / "small-set" and ts.name == "small-set"
    assert io.trace_set_dir(Path("small-set"), packaged) == packaged / "small-set"


def test_an_existing_path_wins_over_a_packaged_name(packaged: Path, elsewhere: Path,
                                                    small_set: Path) -> None:
    shutil.copytree(small_set, elsewhere / "small-set")
    assert io.load_trace_set("small-set", packaged_dir=packaged).path == Path("small-set")


def test_only_a_bare_name_is_looked_up(packaged: Path, elsewhere: Path) -> None:
    for spelled in ("sub/small-set", str(elsewhere / "small-set")):
        assert io.trace_set_dir(spelled, packaged) == Path(spelled)
        assert "does not exist" in _error(spelled, packaged_dir=packaged)


def test_an_unknown_name_lists_the_packaged_names(packaged: Path, elsewhere: Path) -> None:
    msg = _error("no-such-set", packaged_dir=packaged)
    assert "no-such-set" in msg and "no packaged trace set has this name" in msg
    assert "small-set" in msg and "traces list" in msg


def test_resolve_takes_names_for_latency_and_acceptance(packaged: Path, elsewhere: Path) -> None:
    lat, acc, _notes = catalog.resolve("qwen3-8b", Path("small-set"),
                                       acceptance=Path("small-set"), default_dir=packaged)
    assert lat.path == acc.path == packaged / "small-set"


@pytest.mark.parametrize("command", [["traces", "show", PACKAGED],
                                     ["traces", "check", PACKAGED]])
def test_cli_traces_commands_take_a_packaged_name(command: list[str], elsewhere: Path) -> None:
    result = CliRunner().invoke(cli, command)
    assert result.exit_code == 0, result.output
    assert "qwen3-8b" in result.output


def test_cli_predict_takes_a_packaged_name(elsewhere: Path) -> None:
    result = CliRunner().invoke(cli, ["predict", "--traces", PACKAGED, "--engine", "analytic"])
    assert result.exit_code == 0, result.output
    assert f"latency: {PACKAGED}" in result.output


def test_cli_list_prints_each_name_and_directory() -> None:
    result = CliRunner().invoke(cli, ["traces", "list"])
    assert result.exit_code == 0, result.output
    lines = [line.split() for line in result.output.splitlines()]
    assert [name for name, _ in lines] == [p.name for p in io.packaged_sets()]
    assert all(Path(path).name == name for name, path in lines)
    assert PACKAGED in [name for name, _ in lines]


def test_the_group_example_uses_the_short_name() -> None:
    result = CliRunner().invoke(cli, ["traces", "--help"])
    assert f"vegas-sim traces show {PACKAGED}" in result.output
    assert "traces/default" not in result.output


# ------------------------------------------------------------------------------ a file
def test_a_file_is_said_to_be_a_file(tmp_path: Path) -> None:
    file = tmp_path / "some_file"
    file.write_text("not a trace set")
    msg = _error(file)
    assert str(file) in msg and "is a file, not a trace-set directory" in msg
    assert "does not exist" not in msg and "fix:" in msg


def test_a_file_of_a_set_points_at_its_directory(small_set: Path) -> None:
    msg = _error(small_set / "meta.json")
    assert "is a file" in msg and f"pass the directory that holds it, {small_set}" in msg


def test_a_file_as_predict_traces_is_said_to_be_a_file(tmp_path: Path) -> None:
    file = tmp_path / "some_file"
    file.write_text("")
    with pytest.raises(TraceSetError, match="is a file"):
        catalog.resolve("qwen3-8b", file, default_dir=tmp_path / "none")


@pytest.mark.parametrize("command", [["traces", "check"], ["traces", "show"],
                                     ["predict", "--engine", "analytic", "--traces"]])
def test_cli_says_a_file_is_a_file(command: list[str], tmp_path: Path) -> None:
    file = tmp_path / "some_file"
    file.write_text("")
    result = CliRunner().invoke(cli, [*command, str(file)])
    assert result.exit_code == 1
    assert "is a file, not a trace-set directory" in result.output
    assert "does not exist" not in result.output and "Traceback" not in result.output
