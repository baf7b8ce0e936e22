"""`vegas-sim traces …`: inspect, check, merge and finalize trace sets.

Each command's docstring is its --help text and carries an example.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click

from vegas_sim import api
from vegas_sim.cli.common import user_errors
from vegas_sim.traces import io
from vegas_sim.traces.merge import merge_trace_sets
from vegas_sim.traces.subset import WHERE_HELP, subset_trace_set


@click.group()
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
    with user_errors():
        trace_set = io.load_trace_set(directory)
        summary = io.summarize(trace_set)
    click.echo(io.format_summary(summary))
    if len(trace_set.latency):
        _show_latency_fit(trace_set)


def _show_latency_fit(trace_set: Any) -> None:
    """The latency model fitted on this set: leave-one-out error per phase."""
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
    with user_errors():
        merged = merge_trace_sets(out, list(sources), replicates=replicates)
    click.echo(io.format_summary(io.summarize(merged)))


@traces.command("subset")
@click.argument("source", type=click.Path(path_type=Path))
@click.option("--where", "where", required=True,
              help=f"Conditions the rows must meet, comma-separated ({WHERE_HELP}).")
@click.option("--out", "out", required=True, type=click.Path(path_type=Path),
              help="New directory for the subset.")
def traces_subset(source: Path, where: str, out: Path) -> None:
    """Cut a trace set to the rows that meet --where, into the new directory --out.

    For range hold-outs: fit on small batches or short contexts and predict what was measured
    beyond them. Conditions: `col<=V`, `col>=V`, `col<V`, `col>V`, `col==V`, `col in A|B`
    (K / M suffixes: 32K); each applies to the latency and acceptance rows that have the
    column. An upper bound on gamma truncates longer acceptance traces to it (a γ 12 run
    holds every shorter γ). The subset's meta.json lists the grid values kept, the conditions
    (`where`) and the source (`subset_of`, with its content hash).

    Examples:

    \b
        vegas-sim traces subset qwen3-8b-h200 --where 'batch<=16,context<=32K' --out ./small

    \b
        vegas-sim traces subset smollm2-135m-real --where 'gamma<=7' --out ./short-gamma
    """
    with user_errors():
        subset = subset_trace_set(source, out, where)
    click.echo(f"{out}: rows where {subset.meta['where']}")
    click.echo(io.format_summary(io.summarize(subset)))


@traces.command("list")
def traces_list() -> None:
    """List the trace sets packaged with vegas-sim: name and directory.

    The name alone names the set wherever a trace-set directory is expected (traces show,
    traces check, --traces), unless a path of that name exists.

    Example:

    \b
        vegas-sim traces list
    """
    sets = io.packaged_sets()
    if not sets:
        click.echo("no trace set is packaged with this build")
    width = max((len(path.name) for path in sets), default=0)
    for path in sets:
        click.echo(f"{path.name:<{width}}  {path}")
