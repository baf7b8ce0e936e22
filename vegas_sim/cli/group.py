"""The `vegas-sim` command group: every command, each in its module.

Every command's docstring is its --help text and carries an example. The GPU commands
(calibrate, validate) import torch only when they run, so a CPU-only install has the rest.
"""

from __future__ import annotations

import click

from vegas_sim.cli.calibrate import calibrate, validate
from vegas_sim.cli.explore import report, sweep, tune
from vegas_sim.cli.predict import predict
from vegas_sim.cli.traces import traces


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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


for _command in (calibrate, predict, report, sweep, traces, tune, validate):
    cli.add_command(_command)
