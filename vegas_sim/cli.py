"""The `vegas-sim` command line. It only parses, validates and calls the library.

Every command's docstring is its --help text and carries an example.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from vegas_sim.cliutil import user_errors
from vegas_sim.errors import UserInputError
from vegas_sim.methods import DEFAULT_SPARSITY, METHODS

F = TypeVar("F", bound=Callable[..., Any])


def parse_size(value: str, option: str) -> int:
    """One token count: '32K' → 32768, '128k' → 131072, '4096' → 4096."""
    from vegas_sim.calibrate.gridspec import parse_int_grid

    values = parse_int_grid(value, option)
    if len(values) != 1:
        raise UserInputError(f"{value!r} is a grid; one value is expected", where=option,
                             fix="pass a single size such as 32K (use `sweep` for grids)")
    return values[0]


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


# ---------------------------------------------------------------------------------- predict
def _predict_options(f: F) -> F:
    options = [
        click.option("--gamma", "-g", type=int, default=7, show_default=True,
                     help="Draft tokens per iteration (γ)."),
        click.option("--sparsity", "-s", type=float, default=DEFAULT_SPARSITY, show_default=True,
                     help="Fraction of the context the draft attends to, in (0, 1]."),
        click.option("--batch", "-b", type=int, default=4, show_default=True,
                     help="Maximum batch size of the decode instance."),
        click.option("--context", "-c", default="32K", show_default=True,
                     help="Prompt tokens per request (e.g. 4096, 32K, 128K)."),
        click.option("--output-len", type=int, default=1024, show_default=True,
                     help="Generated tokens per request."),
        click.option("--method", "-m", "methods", multiple=True,
                     type=click.Choice(METHODS), default=("vegas",), show_default=True,
                     help="Method(s) to predict side by side; vanilla is always the baseline."),
        click.option("--model", default="qwen3-8b", show_default=True,
                     help="Model whose latency to use (a preset calibrated in the trace set)."),
        click.option("--traces", type=click.Path(path_type=Path), default=None,
                     help="Trace set directory (default: the packaged measured sets)."),
        click.option("--gpu", default=None,
                     help="Hardware what-if: rescale to this GPU's datasheet "
                          "(a100, h100-sxm, h100-nvl, h200, b200). Not measured."),
        click.option("--graph-launch-ms", type=float, default=None,
                     help="What-if: replace the measured per-step host overhead (large "
                          "in sets measured with an eager runtime) by this launch cost, as a "
                          "CUDA-graph engine would see. Not measured."),
        click.option("--requests", type=int, default=None,
                     help="Requests to simulate (default: 4 × batch)."),
        click.option("--arrival", default="closed", show_default=True,
                     help="'closed' (batch-many users) or 'poisson:RATE' (requests/s)."),
        click.option("--workload", default=None,
                     help="Acceptance workload (reasoning, code, chat, longdoc); default all."),
        click.option("--temperature", type=float, default=0.0, show_default=True,
                     help="Sampling temperature whose acceptance to replay (0 = greedy)."),
        click.option("--prefill", type=click.Choice(["disaggregated", "colocated"]),
                     default="disaggregated", show_default=True),
        click.option("--engine", type=click.Choice(["sim", "analytic"]), default="sim",
                     show_default=True, help="SimPy engine or closed form."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--replications", type=int, default=5, show_default=True,
                     help="Independent replications for the 95% confidence intervals."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@cli.command()
@_predict_options
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table",
              show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Write the result here (format from --format, or the file suffix).")
def predict(fmt: str, out: Path | None, **kwargs: Any) -> None:
    """Predict throughput and latency of one configuration, with 95% confidence intervals.

    Replays the trace set in the SimPy model of batched draft→verify iterations: latency of
    the model asked for, acceptance from a real-weights trace set (the output says which).

    Examples:

    \b
        vegas-sim predict --gamma 7

    \b
        vegas-sim predict -m vegas -m magicdec-stream -m specextend --batch 4 --context 120K

    \b
        vegas-sim predict --gamma 6 --gpu h100-sxm --format json --out pred.json

    \b
        vegas-sim predict --gamma 7 --context 120K --graph-launch-ms 0.5
    """
    from vegas_sim import api

    with user_errors():
        context = parse_size(kwargs.pop("context"), "--context")
        table, notes = api.predict_methods(context=context, **kwargs)
    _emit_table(table, notes, fmt, out)


def _emit_table(table: Any, notes: list[str], fmt: str, out: Path | None) -> None:
    from vegas_sim.reports import terminal

    if out is not None and fmt == "table":
        fmt = {".csv": "csv", ".json": "json"}.get(out.suffix.lower(), "csv")
    if fmt == "table":
        terminal.print_prediction(table, notes)
        return
    text = (table.to_csv(index=False) if fmt == "csv"
            else json.dumps({"notes": notes, "rows": json.loads(
                table.to_json(orient="records"))}, indent=2))
    if out is None:
        click.echo(text, nl=False)
    else:
        out.write_text(text)
        click.echo(f"wrote {out} ({len(table)} rows)", err=True)


# ----------------------------------------------------------------------------------- traces
@cli.group()
def traces() -> None:
    """Inspect and check trace sets.

    Example:

    \b
        vegas-sim traces show vegas_sim/traces/default/qwen3-8b-h200
    """


@traces.command("check")
@click.argument("directory", type=click.Path(path_type=Path))
def traces_check(directory: Path) -> None:
    """Validate a trace set: schema version, columns, types, ranges and content hash.

    Exits non-zero with a message naming the file, the column and the fix.

    Example:

    \b
        vegas-sim traces check ./my-traces
    """
    from vegas_sim.traces import io

    with user_errors():
        passed = io.check(directory)
    for line in passed:
        click.echo(f"ok  {line}")
    click.echo(f"{directory}: valid trace set")


@traces.command("show")
@click.argument("directory", type=click.Path(path_type=Path))
def traces_show(directory: Path) -> None:
    """Show what a trace set covers: model, GPU, grid, methods, γ/sparsity/context ranges.

    Example:

    \b
        vegas-sim traces show ./my-traces
    """
    from vegas_sim.traces import io

    with user_errors():
        trace_set = io.load_trace_set(directory)
        summary = io.summarize(trace_set)
    click.echo(io.format_summary(summary))
    if len(trace_set.latency):
        _show_latency_fit(trace_set)


def _show_latency_fit(trace_set: Any) -> None:
    """The latency model fitted on this set: leave-one-out error per phase."""
    from vegas_sim import api

    with user_errors():
        model = api.fit_latency(trace_set)
        loo = model.loo_errors()
    click.echo(f"  latency model leave-one-out error ({model.host_bound_share():.0%} of points "
               "host-bound):")
    for row in loo.itertuples():
        click.echo(f"    {row.phase:<11} {row.n_points:>4} points  median {row.median_pct:5.1f} %"
                   f"  max {row.max_pct:6.1f} %")


@traces.command("merge")
@click.argument("out", type=click.Path(path_type=Path))
@click.argument("sources", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--replicates", is_flag=True,
              help="Pool acceptance points measured in several sets as more requests "
                   "(repeated calibrations of one grid).")
def traces_merge(out: Path, sources: tuple[Path, ...], replicates: bool) -> None:
    """Merge trace sets of one model and GPU, measured apart, into the new directory OUT.

    For calibrations run as parallel processes or over several sessions. Refused when the
    sets differ in model, weights or GPU, or when two of them measured the same latency row
    or acceptance point (it would count twice) — unless --replicates: then an acceptance
    point measured in several sets keeps all their requests (renumbered), which lowers its
    sampling error. Grid lists and workloads are unioned; the run log keeps every source's
    sessions, counting GPU time that overlapped (parallel processes on one GPU) once.

    Examples:

    \b
        vegas-sim traces merge ./smollm2-all ./acc-chat ./acc-code ./acc-longdoc

    \b
        vegas-sim traces merge --replicates ./smollm2-acc ./acc-run1 ./acc-run2
    """
    from vegas_sim.traces.io import format_summary, summarize
    from vegas_sim.traces.merge import merge_trace_sets

    with user_errors():
        merged = merge_trace_sets(out, list(sources), replicates=replicates)
    click.echo(format_summary(summarize(merged)))


@traces.command("list")
def traces_list() -> None:
    """List the trace sets packaged with vegas-sim.

    Example:

    \b
        vegas-sim traces list
    """
    from vegas_sim.traces import catalog

    sets = catalog.packaged_sets()
    if not sets:
        click.echo("no trace set is packaged with this build")
    for path in sets:
        click.echo(str(path))


def _register_commands() -> None:
    """Commands defined beside this module (their heavy imports happen inside the commands)."""
    from vegas_sim.cli_calibrate import calibrate, validate
    from vegas_sim.cli_explore import report, sweep, tune

    for command in (calibrate, validate, sweep, tune, report):
        cli.add_command(command)


_register_commands()


def main() -> None:
    cli(prog_name="vegas-sim")


if __name__ == "__main__":
    main()
