"""`vegas-sim traces …`: inspect, check, merge and finalize trace sets.

Each command's docstring is its --help text and carries an example.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import click

from vegas_sim import api
from vegas_sim.cli.common import parse_size, parse_sparsity, user_errors
from vegas_sim.errors import UserInputError
from vegas_sim.files import check_out, output_lock
from vegas_sim.methods import SPEC_METHODS
from vegas_sim.traces import io
from vegas_sim.traces.anchors import AnchorSet, load_anchors, write_anchors
from vegas_sim.traces.merge import merge_trace_sets
from vegas_sim.traces.subset import WHERE_HELP, subset_trace_set
from vegas_sim.traces.summary import format_context_trends
from vegas_sim.traces.vllm_import import FORMATS, ImportOptions, append_to, import_vllm
from vegas_sim.traces.vllm_traces import write_trace_set
from vegas_sim.validate.context_holdout import (
    DESIGNS,
    calibration_lines,
    holdout,
    needed_scale,
    summary_lines,
    write_scale,
)


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

    A real-weights set also shows its acceptance context trend: per workload, temperature,
    method and traced γ, the slope (per doubling of context) the acceptance model follows
    beyond the traced contexts, and the traced range it was fitted on.

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
    if len(trace_set.acceptance) and trace_set.weights_kind == "real":
        with user_errors():
            model = api.fit_acceptance(trace_set)
        click.echo(format_context_trends(model.context_trends()), nl=False)
        source = (trace_set.info.calibrated_by
                  or "the default; `traces trend-holdout --write-scale` calibrates it")
        click.echo(f"  context trend sd scale: {model.trend_sd_scale:g} ({source})")


def _show_latency_fit(trace_set: Any) -> None:
    """The latency model fitted on this set: leave-one-out error per phase."""
    with user_errors():
        model, loo = api.latency_loo(trace_set)
    click.echo(f"  latency model leave-one-out error ({model.host_bound_share():.0%} of points "
               "host-bound):")
    for phase, n, median, top in zip(loo["phase"], loo["n_points"], loo["median_pct"],
                                     loo["max_pct"]):
        if math.isnan(median):  # no point can be left out and refitted
            click.echo(f"    {phase:<11} {n:>4} points  n/a (too few points)")
        else:
            click.echo(f"    {phase:<11} {n:>4} points  median {median:5.1f} %  max {top:6.1f} %")


@traces.command("trend-holdout")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--design", type=click.Choice(DESIGNS), default="third", show_default=True,
              help="third: fit each workload on its shortest third of prompt contexts (the "
                   "context hold-out the scale means); workload: on its shortest alone.")
@click.option("--write-scale", is_flag=True,
              help="Record the scale the held-out points need in the set's meta.json "
                   "(acceptance_calibration): every prediction from the set then takes it.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Also write every held-out point to this CSV.")
def traces_trend_holdout(directory: Path, design: str, write_scale: bool,
                         out: Path | None) -> None:
    """Check a real-weights set's context trend on contexts it was not fitted on, and calibrate
    the trend's interval.

    Each workload's longer prompts are held out in turn and predicted from the rest of the set
    along the context trend, as `predict` extrapolates past the traced contexts. Prints the
    error (median, max) and the interval's coverage per workload, and the factor on the
    trend's sd that 95 % of the held-out points need (per workload also from the other
    workloads alone, out of sample). --write-scale records that factor, rounded to 0.5, so
    that intervals from this set widen as its own slopes stray; a set without it takes the
    default scale (docs/DESIGN.md, context trend). CPU, about a minute for a large set.

    Example:

    \b
        vegas-sim traces trend-holdout ./my-real-traces --write-scale --out holdout.csv
    """
    with user_errors():
        if write_scale and design != "third":
            raise UserInputError("the scale is the context hold-out's", where="--write-scale",
                                 fix="leave out --design workload")
        if out is not None:
            check_out(out, (".csv",))
        trace_set = io.load_trace_set(directory)
        if trace_set.weights_kind != "real":
            raise UserInputError(
                "its acceptance was measured with random weights, which says nothing about a "
                "model's", where=str(directory),
                fix="run it on a set calibrated with real weights (calibrate --weights real)")
        points = holdout(trace_set, design,
                         lambda wl, n: click.echo(f"{wl}: {n} held-out points", err=True))
        if points.empty:
            raise UserInputError(
                "no workload was traced at two or more prompt contexts: nothing to hold out",
                where=str(directory),
                fix="calibrate acceptance at several contexts (calibrate --context 1K,2K,4K)")
    click.echo("\n".join(summary_lines(points) + calibration_lines(points)))
    if out is not None:
        points.to_csv(out, index=False)
        click.echo(f"wrote {out}")
    if write_scale:
        _record_scale(trace_set, points, directory)


def _record_scale(trace_set: Any, points: Any, directory: Path) -> None:
    """--write-scale: the scale the points need into the set's meta.json."""
    with user_errors():
        scale = needed_scale(points)
        if not math.isfinite(scale):
            raise UserInputError(
                "the context trend misses more than 5 % of the held-out points by more than any "
                "scale of its sd covers", where="--write-scale",
                fix="trace more contexts per workload; predictions keep the default scale")
        with output_lock(trace_set.path, "DIRECTORY", make=False):
            write_scale(trace_set.path, scale,
                        f"vegas-sim traces trend-holdout {directory} --write-scale")
    click.echo(f"{trace_set.path / 'meta.json'}: context trend sd scale {scale:g}")


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
    with user_errors(), output_lock(directory, "DIRECTORY", make=False):
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
    or acceptance run (a point on one request: it would count twice); a point that two sets
    ran on different requests (`calibrate --first-prompt`) keeps both. With --replicates an
    acceptance point measured in several sets keeps all their requests (renumbered), which
    lowers its sampling error. A set named twice, or two copies of one measurement (identical
    data), is refused: a copy is no independent replicate. Grid lists and workloads are unioned;
    the run log keeps every source's sessions, counting GPU time that overlapped (parallel
    processes on one GPU) once.

    Examples:

    \b
        vegas-sim traces merge ./smollm2-all ./acc-chat ./acc-code ./acc-longdoc

    \b
        vegas-sim traces merge --replicates ./smollm2-acc ./acc-seed1 ./acc-seed2
    """
    with user_errors(), output_lock(out, "OUT"):
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
    with user_errors(), output_lock(out):
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


@traces.command("import-vllm")
@click.argument("source", type=click.Path(path_type=Path))
@click.argument("after", required=False, type=click.Path(path_type=Path))
@click.option("--method", required=True, type=click.Choice(SPEC_METHODS),
              help="The drafting method the server ran (vLLM does not record it).")
@click.option("--gamma", required=True, type=int,
              help="The server's num_speculative_tokens; must match the data's positions.")
@click.option("--sparsity", default=None, help="The draft's sparsity ratio, e.g. 0.07 or 7%.")
@click.option("--context", default=None,
              help="Prompt lengths of the requests the counts cover: a range LO..HI (e.g. "
                   "1K..32K) or one size; responses: taken from their usage when left out.")
@click.option("--workload", default=None, help="Workload name, e.g. reasoning, code, chat.")
@click.option("--temperature", type=float, default=None, help="Sampling temperature (0: greedy).")
@click.option("--model", default=None, help="vegas-sim model preset, e.g. qwen3-8b.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
              help="What SOURCE is; detected from its content when left out.")
@click.option("--engine-label", default=None,
              help="Prometheus: take the series of this `engine` label (default: sum them).")
@click.option("--served-model", default=None,
              help="Prometheus: take the series of this `model_name` label.")
@click.option("--record", type=int, default=None,
              help="bench: which run (line, 1-based) of an --append-result file.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Write the anchor to this .json or .csv anchors file.")
@click.option("--append", is_flag=True, help="Add the anchor to the existing --out file.")
@click.option("--trace-set", type=click.Path(path_type=Path), default=None,
              help="responses with per_step_accepted: also write an acceptance trace set here "
                   "(a new directory; needs --sparsity, --temperature, --model).")
def traces_import_vllm(source: Path, after: Path | None, method: str, gamma: int,
                       sparsity: str | None, context: str | None, workload: str | None,
                       temperature: float | None, model: str | None, fmt: str | None,
                       engine_label: str | None, served_model: str | None, record: int | None,
                       out: Path | None, append: bool, trace_set: Path | None) -> None:
    """Make an acceptance anchor from what vLLM records about speculative decoding.

    SOURCE is one of (detected, or --format): a Prometheus text dump of the server's
    /metrics (`curl -s HOST:PORT/metrics > metrics.txt`; a second dump AFTER gives the
    interval's difference); the JSON of `vllm bench serve --save-result`; or responses
    carrying metrics.speculative_decoding (server flag --per-request-spec-decode-metrics),
    one JSON object per line. vLLM does not record the method, sparsity, context, workload
    or temperature: pass them. The anchor holds vLLM's mean acceptance length (1 + accepted
    / drafts) and per-position rates; every inconsistency is refused with file, line and fix.
    With detailed responses (per_step_accepted), --trace-set also writes a real-weight
    acceptance trace set. Formats and checks: docs/VLLM_IMPORT.md; the example's files are
    in the source tree's tests/traces/fixtures/vllm/.

    Example:

    \b
        vegas-sim traces import-vllm metrics_before.txt metrics_after.txt --method vegas \\
            --gamma 6 --sparsity 0.07 --context 1K..32K --workload reasoning \\
            --temperature 0.6 --model qwen3-8b --out anchors.json
    """
    with user_errors(), contextlib.ExitStack() as locks:
        for path, option in ((out, "--out"), (trace_set, "--trace-set")):
            if path is not None:
                locks.enter_context(output_lock(path, option))
        opts = ImportOptions(
            method=method, gamma=gamma,
            sparsity=None if sparsity is None else parse_sparsity(sparsity),
            context=None if context is None else _context_range(context), workload=workload,
            temperature=temperature, model=model, engine=engine_label,
            served_model=served_model, record=record)
        if out is not None:
            check_out(out, (".json", ".csv"))
        elif append:
            raise UserInputError("--append needs --out", where="--append",
                                 fix="name the anchors file to add to with --out")
        imported = import_vllm(source, after, opts, fmt)
        anchors = imported.anchor_set
        if append and out is not None and out.exists():
            anchors = append_to(load_anchors(out), anchors, out)
        written = None if out is None else write_anchors(anchors, out)
        traces_written = None
        if trace_set is not None:
            if not imported.requests:
                raise UserInputError("a trace set needs per-request responses", where="--trace-set",
                                     fix="import responses with per_step_accepted (server flag "
                                         "--per-request-spec-decode-metrics detailed)")
            traces_written = write_trace_set(trace_set, source, imported.requests, opts)
    _report_import(imported.anchor_set, imported.notes, written, traces_written)


def _context_range(text: str) -> tuple[int, int]:
    """'1K..32K' → (1024, 32768); '32K' → (32768, 32768)."""
    lo, sep, hi = text.partition("..")
    lo_v = parse_size(lo, "--context")
    hi_v = parse_size(hi, "--context") if sep else lo_v
    if hi_v < lo_v:
        raise UserInputError(f"range end {hi_v} is below its start {lo_v}", where="--context",
                             fix="write LO..HI, e.g. 1K..32K")
    return lo_v, hi_v


def _report_import(anchors: AnchorSet, notes: tuple[str, ...], written: Path | None,
                   traces_written: tuple[Any, int] | None) -> None:
    for anchor in anchors.anchors:
        click.echo(f"anchor: {anchor.describe()}")
        click.echo(f"  mean acceptance length {anchor.mean_acceptance_length:.4f} over "
                   f"{anchor.num_drafts} drafts")
        if anchor.per_position_rates is not None:
            rates = ", ".join(f"{r:.3f}" for r in anchor.per_position_rates)
            click.echo(f"  per-position acceptance rates: {rates}")
        click.echo(f"  source: {anchor.source}")
    for note in notes:
        click.echo(f"note: {note}")
    if written is not None:
        click.echo(f"wrote {written}")
    if traces_written is not None:
        trace_set, skipped = traces_written
        click.echo(f"wrote trace set {trace_set.path}: {len(trace_set.acceptance)} acceptance "
                   f"rows (real weights, imported; no latency rows)"
                   + (f", {skipped} step(s) left out (drafted fewer than --gamma)" if skipped
                      else ""))
