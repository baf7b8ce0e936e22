"""The `vegas-sim` command line. It only parses, validates and calls the library.

Every command's docstring is its --help text and carries an example.
"""

from __future__ import annotations

import json
import math
import sys
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

    return _one(parse_int_grid(value, option), value, option, "a single size such as 32K")


def parse_sparsity(value: str) -> float:
    """One sparsity ratio, as sweep takes them: '0.07' or '7%'."""
    from vegas_sim.calibrate.gridspec import parse_sparsity_grid

    return _one(parse_sparsity_grid(value, "--sparsity"), value, "--sparsity",
                "a single ratio such as 0.07 or 7%")


T = TypeVar("T")


def _one(values: list[T], text: str, option: str, example: str) -> T:
    if len(values) != 1:
        raise UserInputError(f"{text!r} is a grid; one value is expected", where=option,
                             fix=f"pass {example} (use `sweep` for grids)")
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
        click.option("--sparsity", "-s", default=str(DEFAULT_SPARSITY), show_default=True,
                     help="Fraction of the context the draft attends to, in (0, 1]: 0.07 or "
                          "7%."),
        click.option("--batch", "-b", type=int, default=4, show_default=True,
                     help="Maximum batch size of the decode instance."),
        click.option("--context", "-c", default="32K", show_default=True,
                     help="Prompt tokens per request (e.g. 4096, 32K, 128K)."),
        click.option("--output-len", type=int, default=1024, show_default=True,
                     help="Generated tokens per request."),
        click.option("--method", "-m", "methods", multiple=True,
                     type=click.Choice(METHODS), default=("vegas",), show_default=True,
                     help="Method(s) to predict side by side; vanilla is always the baseline."),
        click.option("--model", default=None,
                     help="Model whose latency to use (a preset calibrated in the trace set) "
                          "[default: qwen3-8b, or the model of --traces]."),
        click.option("--traces", type=click.Path(path_type=Path), default=None,
                     help="Trace set: a directory, or a packaged set's name (`vegas-sim "
                          "traces list`) [default: the packaged measured sets]."),
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
        click.option("--prefill", type=click.Choice(["disaggregated", "co-located"]),
                     default="disaggregated", show_default=True,
                     help="Where admitted requests are prefilled: on other GPUs, or on this "
                          "instance between decode iterations (co-located)."),
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
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json", "parquet"]),
              default="table", show_default=True,
              help="Output format; with --out, the file's suffix decides.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Write the rows to this file: *.csv, *.json or *.parquet.")
@click.pass_context
def predict(ctx: click.Context, fmt: str, out: Path | None, **kwargs: Any) -> None:
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
        explicit = ctx.get_parameter_source("fmt") is not click.core.ParameterSource.DEFAULT
        fmt = _out_format(fmt, explicit, out)
        context = parse_size(kwargs.pop("context"), "--context")
        sparsity = parse_sparsity(kwargs.pop("sparsity"))
        table, notes = api.predict_methods(context=context, sparsity=sparsity, **kwargs)
        # --out alone writes the file and still shows the table; an explicit --format does not
        show = out is not None and not explicit or out is None and fmt == "table"
        _emit_table(table, notes, fmt, out, show=show)


OUT_FORMATS = {".csv": "csv", ".json": "json", ".parquet": "parquet"}


def _out_format(fmt: str, explicit: bool, out: Path | None) -> str:
    """The format to write: --out's suffix decides; an explicit --format must agree with it."""
    from vegas_sim.reports.csv import check_out

    if out is None:
        if fmt == "parquet":
            raise UserInputError("parquet is binary and needs a file", where="--format",
                                 fix="add --out FILE.parquet")
        return fmt
    check_out(out, tuple(OUT_FORMATS))
    by_suffix = OUT_FORMATS[out.suffix.lower()]
    if explicit and fmt != by_suffix:
        raise UserInputError(f"--format {fmt} disagrees with the file name {str(out)!r}",
                             where="--format/--out",
                             fix=f"drop --format, or name the file *.{fmt}" if fmt != "table"
                             else "drop --format table to write the file")
    return by_suffix


def _emit_table(table: Any, notes: list[str], fmt: str, out: Path | None,
                show: bool) -> None:
    """Write the rows to `out` in `fmt` (when given), and print them: as the table when
    `show`, else as `fmt` on stdout when there is no file."""
    from vegas_sim.reports import terminal
    from vegas_sim.reports.csv import flat_table, write_atomic, write_table

    if out is not None:
        if fmt == "json":
            text = _json_rows(table, notes)
            write_atomic(out, lambda tmp: Path(tmp).write_text(text))
        else:
            write_table(table, out)
        click.echo(f"wrote {out} ({len(table)} rows)", err=True)
    if show:
        terminal.print_prediction(table, notes)
    elif out is None:
        click.echo(flat_table(table).to_csv(index=False) if fmt == "csv"
                   else _json_rows(table, notes), nl=False)
        if fmt == "csv":  # JSON carries its notes; CSV has no place for them
            for note in notes:
                click.echo(f"note: {note}", err=True)


def _json_rows(table: Any, notes: list[str]) -> str:
    return json.dumps({"notes": notes, "rows": json.loads(table.to_json(orient="records"))},
                      indent=2)


# ----------------------------------------------------------------------------------- traces
@cli.group()
def traces() -> None:
    """Inspect and check trace sets.

    A trace set is named by its directory, or a packaged one by its name alone (see
    `vegas-sim traces list`), here and in --traces of the other commands.

    Example:

    \b
        vegas-sim traces show qwen3-8b-h200
    """


@traces.command("check")
@click.argument("directory", type=click.Path(path_type=Path))
def traces_check(directory: Path) -> None:
    """Validate a trace set: schema version, columns, types, ranges and content hash.

    DIRECTORY is a trace-set directory or the name of a packaged set. Exits non-zero with a
    message naming the file, the column and the fix.

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

    DIRECTORY is a trace-set directory or the name of a packaged set.

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
    for phase, n, median, top in zip(loo["phase"], loo["n_points"], loo["median_pct"],
                                     loo["max_pct"]):
        if math.isnan(median):  # no point can be left out and refitted
            click.echo(f"    {phase:<11} {n:>4} points  n/a (too few points)")
        else:
            click.echo(f"    {phase:<11} {n:>4} points  median {median:5.1f} %  max {top:6.1f} %")


@traces.command("finalize")
@click.argument("directory", type=click.Path(path_type=Path))
def traces_finalize(directory: Path) -> None:
    """Consolidate an interrupted calibration's points into a usable trace set.

    `calibrate` writes each measured point as a part file and consolidates them when it ends;
    a run stopped early leaves parts that `predict` and `traces show` refuse until the same
    calibrate command resumes and finishes. This makes a trace set of the points measured so
    far (resuming later still works, and finalizes again).

    Example:

    \b
        vegas-sim traces finalize ./my-traces
    """
    from vegas_sim.traces import io

    with user_errors():
        trace_set = io.finalize_trace_set(directory)
    click.echo(io.format_summary(io.summarize(trace_set)))


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
    sampling error. A set named twice, or two copies of one measurement (identical data),
    is refused: a copy is no independent replicate. Grid lists and workloads are unioned;
    the run log keeps every source's sessions, counting GPU time that overlapped (parallel
    processes on one GPU) once.

    Examples:

    \b
        vegas-sim traces merge ./smollm2-all ./acc-chat ./acc-code ./acc-longdoc

    \b
        vegas-sim traces merge --replicates ./smollm2-acc ./acc-seed1 ./acc-seed2
    """
    from vegas_sim.traces.io import format_summary, summarize
    from vegas_sim.traces.merge import merge_trace_sets

    with user_errors():
        merged = merge_trace_sets(out, list(sources), replicates=replicates)
    click.echo(format_summary(summarize(merged)))


@traces.command("list")
def traces_list() -> None:
    """List the trace sets packaged with vegas-sim: name and directory.

    The name alone names the set wherever a trace-set directory is expected (traces show,
    traces check, --traces), unless a path of that name exists.

    Example:

    \b
        vegas-sim traces list
    """
    from vegas_sim.traces import io

    sets = io.packaged_sets()
    if not sets:
        click.echo("no trace set is packaged with this build")
    width = max((len(path.name) for path in sets), default=0)
    for path in sets:
        click.echo(f"{path.name:<{width}}  {path}")


def _register_commands() -> None:
    """Commands defined beside this module (their heavy imports happen inside the commands)."""
    from vegas_sim.cli_calibrate import calibrate, validate
    from vegas_sim.cli_explore import report, sweep, tune

    for command in (calibrate, validate, sweep, tune, report):
        cli.add_command(command)


_register_commands()


def main() -> None:
    """The console script: click's own handling, except that Ctrl-C exits 130 (the shell's
    code for SIGINT) and says what was kept."""
    try:
        code = cli.main(prog_name="vegas-sim", standalone_mode=False)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.Abort:
        click.echo("interrupted: predict, sweep, tune and report write their files only when "
                   "they finish; calibrate and validate keep what they finished (calibrate "
                   "resumes with the same --out)", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
