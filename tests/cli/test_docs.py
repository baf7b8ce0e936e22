"""Every command has --help text with an example (sqlite-utils' test_docs style)."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from vegas_sim.cli import cli


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [prefix]
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # the top group imports its commands on use
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            found += _commands(command, (*prefix, name))
        else:
            found.append((*prefix, name))
    return found


ALL = _commands(cli)


def test_all_issue_commands_exist() -> None:
    names = {c[0] for c in ALL if c}
    assert {"predict", "calibrate", "validate", "sweep", "tune", "report", "traces"} <= names


@pytest.mark.parametrize("path", ALL, ids=lambda p: " ".join(p) or "vegas-sim")
def test_help_has_example(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Example" in result.output, f"`vegas-sim {' '.join(path)} --help` has no example"
    assert "vegas-sim " in result.output.split("Example", 1)[1]


@pytest.mark.parametrize("path", [p for p in ALL if p], ids=" ".join)
def test_command_names_are_kebab_case(path: tuple[str, ...]) -> None:
    assert all(part == part.lower() and "_" not in part for part in path)


def example_lines(help_text: str) -> list[str]:
    """The non-empty lines of a --help's examples section (after "Example", before "Options")."""
    section = help_text.split("Example", 1)[1].split("\nOptions:", 1)[0]
    return [line for line in section.splitlines()[1:] if line.strip()]


@pytest.mark.parametrize("path", ALL, ids=lambda p: " ".join(p) or "vegas-sim")
def test_help_examples_are_not_rewrapped(path: tuple[str, ...]) -> None:
    """Each example line starts a command or continues one that ended in a backslash, at a
    terminal width narrower than the examples: click must not rewrap them (`\\b` blocks)."""
    result = CliRunner().invoke(cli, [*path, "--help"], terminal_width=60)
    previous = ""
    for line in example_lines(result.output):
        assert line.strip().startswith("vegas-sim ") or previous.endswith("\\"), (
            f"`vegas-sim {' '.join(path)} --help`: {line.strip()!r} is a fragment of a "
            f"rewrapped example")
        previous = line.rstrip()


@pytest.mark.parametrize("path", ALL, ids=lambda p: " ".join(p) or "vegas-sim")
def test_help_examples_keep_their_line_breaks(path: tuple[str, ...]) -> None:
    """A `\\` that ends a docstring line must be written `\\\\`: a single one joins the next
    line in Python, and --help then prints the indentation in the middle of the command."""
    result = CliRunner().invoke(cli, [*path, "--help"], terminal_width=200)
    for line in example_lines(result.output):
        assert "   " not in line.strip(), (
            f"`vegas-sim {' '.join(path)} --help`: {line.strip()!r} has a line joined into it")
