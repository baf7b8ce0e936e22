"""The `vegas-sim` command group: every command, each in its module, imported when it runs.

Every command's docstring is its --help text and carries an example. A command's module is
imported only when that command runs (or --help lists them all): a `predict` does not pay for
the imports of calibrate, validate or the HTML report, and the GPU commands import torch only
when they run, so a CPU-only install has the rest.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import click

# Each command's module under vegas_sim.cli.
COMMANDS = {"calibrate": "calibrate", "predict": "predict", "report": "explore",
            "sweep": "explore", "traces": "traces", "tune": "explore", "validate": "calibrate"}


class LazyGroup(click.Group):
    """A group whose commands are imported from `COMMANDS` on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            self.add_command(getattr(import_command(cmd_name), cmd_name))
        return self.commands.get(cmd_name)


def import_command(cmd_name: str) -> ModuleType | None:
    """The module of command `cmd_name` (None for no such command), imported."""
    if cmd_name not in COMMANDS:
        return None
    return importlib.import_module(f"vegas_sim.cli.{COMMANDS[cmd_name]}")


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="vegas-sim")
def cli() -> None:
    """Predict the speed of self-speculative decoding with sparse attention before you
    spend GPU hours on it.

    calibrate (GPU) measures a trace set; predict, sweep, tune and report (CPU) replay it in a
    simulator; validate compares predictions with real GPU runs.

    Example:

    \b
        vegas-sim predict --gamma 7 --sparsity 0.07 --batch 4 --context 32K
    """
