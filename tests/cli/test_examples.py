"""Every example a user can copy (each command's --help, the README) works as written.

CPU commands run for real against the packaged trace sets, in one scratch directory and in
an order where each file an example reads was written by an earlier one (sweep.csv before
`report sweep.csv`). GPU commands (calibrate, validate on a GPU) and merges of sets we do not
ship cannot run here; their examples are checked to use only options the command has.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import vegas_sim
from tests.cli.test_docs import ALL, example_lines
from vegas_sim.cli import cli

README = Path(__file__).resolve().parents[2] / "README.md"
# Run for real; the rest is option-checked. report reads the sweep's CSV, so it runs last.
RUNNABLE = ("predict", "sweep", "tune", "traces show", "traces list", "traces subset", "report")


def help_examples() -> list[str]:
    """Each --help example as one command line (backslash continuations joined)."""
    found: list[str] = []
    for path in ALL:
        text = CliRunner().invoke(cli, [*path, "--help"], terminal_width=200).output
        joined = " ".join(line.strip() for line in example_lines(text)).replace("\\ ", "")
        found += ["vegas-sim " + part.strip() for part in joined.split("vegas-sim ")[1:]]
    return found


def readme_examples() -> list[str]:
    """The vegas-sim command lines of the README's code blocks (indented lines)."""
    found = []
    for line in README.read_text().splitlines():
        if line.startswith("    ") and "vegas-sim " in line:
            found.append("vegas-sim " + line.split("vegas-sim ", 1)[1].strip())
    return found


def command_of(args: list[str]) -> tuple[str, click.Command, list[str]]:
    """(its name, the click command, its own arguments) of `vegas-sim ARGS`; no subcommand
    is the group's default (the root's example, predict)."""
    node: click.Command = cli
    names: list[str] = []
    while isinstance(node, click.Group) and args and args[0] in node.list_commands(
            click.Context(node)):
        names.append(args[0])
        found = node.get_command(click.Context(node), args[0])  # the root imports on use
        assert found is not None
        node, args = found, args[1:]
    return " ".join(names), node, args


def unknown_options(command: click.Command, args: list[str]) -> list[str]:
    known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    return [a.split("=", 1)[0] for a in args
            if a.startswith("-") and not _is_number(a) and a.split("=", 1)[0] not in known]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def run_order(examples: list[str]) -> list[str]:
    def rank(example: str) -> int:
        name = command_of(shlex.split(example)[1:])[0]
        return RUNNABLE.index(name) if name in RUNNABLE else len(RUNNABLE)
    return sorted(examples, key=rank)


@pytest.fixture()
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory where the examples' paths exist: `./my-traces`, a packaged set."""
    package = Path(vegas_sim.__file__).parent
    (tmp_path / "my-traces").symlink_to(package / "traces" / "default" / "qwen3-8b-h200")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_examples_are_found() -> None:
    names = {command_of(shlex.split(e)[1:])[0] for e in help_examples()}
    assert {"predict", "sweep", "tune", "report", "calibrate", "validate"} <= names
    assert any("sweep" in e for e in readme_examples()) and len(readme_examples()) >= 5


def example_groups(examples: list[str]) -> list[list[str]]:
    """The examples in run order, one group each, except that an example reading a file
    (`report sweep.csv`) joins the group of the example that wrote it (`--out sweep.csv`):
    each group runs in a scratch directory of its own, so the groups can run in parallel."""
    groups: list[list[str]] = []
    writer: dict[str, list[str]] = {}
    for example in run_order(examples):
        args = shlex.split(example)
        group = next((writer[a] for a in args[1:] if a in writer), None)
        if group is None:
            group = []
            groups.append(group)
        group.append(example)
        if "--out" in args[:-1]:
            writer[args[args.index("--out") + 1]] = group
    return groups


def without_out(example: str) -> tuple[str, ...]:
    """The example's arguments less its `--out PATH`: two examples that differ only in where
    they write run the same computation."""
    args = shlex.split(example)
    if "--out" in args[:-1]:
        i = args.index("--out")
        args = args[:i] + args[i + 2:]
    return tuple(args)


HELP_EXAMPLES = help_examples()
HELP_RUNS = {without_out(e) for e in HELP_EXAMPLES}
GROUPS = [(source, group) for source, found in (("--help", HELP_EXAMPLES),
                                                 ("README", readme_examples()))
          for group in example_groups(found)]


@pytest.mark.parametrize(("source", "group"), GROUPS,
                         ids=[f"{s}:{g[-1][10:60]}" for s, g in GROUPS])
def test_every_example_works_as_written(source: str, group: list[str], scratch: Path) -> None:
    for example in group:
        name, command, args = command_of(shlex.split(example)[1:])
        assert not unknown_options(command, args), (
            f"{source} example `{example}` uses options `vegas-sim {name}` does not have: "
            f"{unknown_options(command, args)}")
        if name not in RUNNABLE and name:
            continue
        if source == "README" and len(group) == 1 and without_out(example) in HELP_RUNS:
            continue  # a --help example runs the same command (nothing here reads its output)
        result = CliRunner().invoke(cli, shlex.split(example)[1:], catch_exceptions=False)
        assert result.exit_code == 0, f"{source} example `{example}` failed:\n{result.output}"
