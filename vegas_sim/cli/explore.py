"""`vegas-sim sweep`, `tune` and `report`: explore a grid, search it, and show the result.

Each command's docstring is its --help text and carries an example.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click
import pandas as pd

from vegas_sim import api
from vegas_sim.cli.common import (
    progress_bars,
    scenario_options,
    sigterm_as_interrupt,
    user_errors,
)
from vegas_sim.files import check_out, output_lock
from vegas_sim.reports.csv import write_json_doc
from vegas_sim.reports.html import write_report
from vegas_sim.runs import SweepInterrupted, sweep_to_file
from vegas_sim.sim.ranking import RANK_BY, best_per_cell, check_rank_by, describe_best
from vegas_sim.sim.tune import TuneResult

_rank_opt = click.option("--rank-by", type=click.Choice(RANK_BY), default=None,
                         help="Print the best configuration of each cell by this metric: "
                              "throughput, goodput (tokens/s of requests meeting the SLOs; "
                              "needs --slo-*) or tpot (lowest TPOT p50).")


@click.command()
@scenario_options("sweep")
@_rank_opt
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Result table: *.csv, *.parquet or *.json (one row per configuration; "
                   "JSON as predict writes it, with the notes).")
def sweep(rank_by: str | None, out: Path, **values: Any) -> None:
    """Predict every configuration of a grid γ × sparsity × batch × context × method.

    Runs in parallel on all local cores (or on a Dask cluster with --scheduler) and writes one
    tidy row per configuration with every metric and its 95% CI. Rows are identical for the
    same seed whatever the number of workers.

    A grid longer than a minute first says how many configurations it has and about how long
    they will take. Finished chunks are checkpointed in OUT.partial/: Ctrl-C (or SIGTERM)
    stops within seconds, writes the rows finished so far to --out as a partial table (its
    `partial` column says so on every row; report marks it) and exits 130; the same command
    again resumes where it stopped (a different grid, seed or trace set for that --out is
    refused).

    --rank-by prints the best configuration of each (batch, context, output) cell by that
    metric; goodput needs --slo-tpot-ms and/or --slo-ttft-ms. Open-loop arrivals
    (--arrival poisson:RATE) need --engine sim.

    Examples:

    \b
        vegas-sim sweep --gamma 2..12 --sparsity 0.01,0.03,0.05,0.07,0.1 --batch 1,4,16 \\
            --context 32K,120K -m vegas -m magicdec-stream --out sweep.csv

    \b
        vegas-sim sweep --gamma 4,7 --sparsity 0.07 --engine sim --replications 1 \\
            --arrival poisson:0.3 --slo-tpot-ms 8 --rank-by goodput --out serve.csv
    """
    stopped: SweepInterrupted | None = None
    with user_errors(), output_lock(out):
        check_out(out, (".csv", ".parquet", ".json"))
        if rank_by is not None:
            check_rank_by(rank_by, values["slo_tpot_ms"] is not None
                          or values["slo_ttft_ms"] is not None)
        grid, latency, acceptance, notes = api.sweep_setup(values)
        engine = values["engine"]
        with progress_bars() as update, sigterm_as_interrupt():
            try:
                done = sweep_to_file(grid, latency, acceptance, out, engine=engine,
                                     seed=values["seed"], replications=values["replications"],
                                     workers=values["workers"],
                                     scheduler=values["scheduler"], notes=tuple(notes),
                                     progress=lambda d, t: update(f"sweep ({engine})", d, t),
                                     say=lambda text: click.echo(text, err=True))
            except SweepInterrupted as e:
                stopped = e
    if stopped is not None:
        click.echo(stopped.message(), err=True)
        raise click.exceptions.Exit(130)
    for note in done.notes:
        click.echo(f"note: {note}", err=True)
    resumed = f", {done.resumed} configurations from the checkpoint" if done.resumed else ""
    click.echo(f"wrote {out} ({len(done.table)} rows{resumed})", err=True)
    if rank_by is not None:
        for _, row in best_per_cell(done.table, rank_by).iterrows():
            click.echo(describe_best(row, rank_by))


@click.command()
@scenario_options("tune")
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Serving table: *.json (best γ per batch size and context).")
def tune(out: Path, **values: Any) -> None:
    """Find the best (γ, sparsity) per (batch, context) with the paper's three-step strategy.

    (1) sweep sparsity at a large γ and take the smallest sparsity where acceptance has
    stabilised, (2) sweep γ there for throughput, (3) with γ fixed, refine sparsity, widening
    the window while the best sits on its edge. The search stays in the box --gamma LO..HI ×
    --sparsity LO..HI, by default the span the acceptance traces support; a point of a wider
    box outside that span is ranked by its prediction interval's low end (pi_low) or, with
    --outside-evidence exclude, not searched. Where the choice lies on the box's edge, the
    model is asked past it and a note says by how much a wider box could matter.

    Selection: the best by --rank-by among every configuration evaluated; those within
    --tie-pct % of the best go to the smaller K (then sparsity); K = 0 (no speculation) where
    no speculative configuration's pi_low beats vanilla. Where the KV cache binds, the final
    ranking and the reported numbers come from the SimPy engine (the analytic one leaves
    preemption out). Prints the choice, the speedup over vanilla (with pi_low) and over the
    best baseline (MagicDec, SpecExtend at their own best γ, s). A grid longer than a minute
    first says how many configurations and about how long.

    The JSON holds, per engine, what it reads: vLLM's speculative_config (method,
    num_speculative_tokens, num_speculative_tokens_per_batch_size [[lo, hi, K], ...] over
    1..max_num_seqs) and the per-context 5-item table of its unmerged proposal; SGLang's
    batch-keyed adaptive config; TensorRT-LLM's draft_len_schedule; and our Vegas sparsity
    per range. A format that cannot express the table (K = 0 for SGLang) is null with the
    reason. Every section is checked against the engine's rules before it is written.

    --rank-by goodput or tpot makes every "best" above that metric's (goodput: tokens/s of
    the requests meeting --slo-tpot-ms / --slo-ttft-ms).

    Examples:

    \b
        vegas-sim tune --batch 1,4,16 --context 32K,120K --out best_gamma.json

    \b
        vegas-sim tune --batch 1,64 --context 4K --gamma 1..16 --sparsity 0.005..0.3 \\
            --out wide_box.json

    \b
        vegas-sim tune --batch 4 --context 32K --slo-tpot-ms 7 --rank-by goodput \\
            --out slo_gamma.json
    """
    with user_errors(), output_lock(out):
        check_out(out, (".json",))
        with progress_bars() as update, sigterm_as_interrupt():
            result = api.tune(**values, progress=update,
                              say=lambda text: click.echo(text, err=True))
        write_json_doc(result.serving_table(), out)
    for line in tune_lines(result):
        click.echo(line)
    if values["final_engine"] == "analytic":
        click.echo("(analytic engine: no confidence intervals; --final-engine sim gives 95% "
                   "CIs)", err=True)
    for note in result.notes:
        click.echo(f"note: {note}", err=True)
    click.echo(f"wrote {out}", err=True)


def _pi_low(r: pd.Series) -> str:
    """' (pi_low L×)', and the low end the rule used where the anchors' shape-transfer term
    moved it."""
    low, shape = float(r["speedup_pi_low"]), float(r.get("speedup_pi_low_shape", math.nan))
    if math.isnan(shape) or abs(shape - low) < 5e-3:
        return f" (pi_low {low:.2f}×)"
    return f" (pi_low {low:.2f}×; {shape:.2f}× without the anchors' shape-transfer term)"


def tune_lines(result: TuneResult) -> list[str]:
    """The terminal summary of a tune: the box, the rule, one line per cell."""
    box = result.box
    ev = box["evidence"]
    lines = [f"search box: γ {box['gamma'][0]}..{box['gamma'][1]}, sparsity "
             f"{box['sparsity'][0]:g}..{box['sparsity'][1]:g} ({box['source']}; traced span: "
             f"γ <= {ev['gamma_max']}, sparsity {ev['sparsity'][0]:g}..{ev['sparsity'][1]:g})",
             f"selection: {result.selection}"]
    for _, r in result.cells.iterrows():
        head = f"B={r['batch']:>4} C={r['context']:>7}: "
        found = (f"γ={r['gamma']}, s={r['sparsity']:g} {r['throughput_tok_s']:.0f} tok/s, "
                 f"{r['speedup_vs_vanilla']:.2f}× vanilla"
                 + _ci(r['speedup_ci_low'], r['speedup_ci_high'])
                 + _pi_low(r))
        if not r["on_evidence"]:
            found += " [outside the traced span: ranked by pi_low]"
        if r["speculate"]:
            line = head + "K=" + str(r["k"]) + ": " + found
            if "speedup_vs_baseline" in r.index and not pd.isna(r["speedup_vs_baseline"]):
                line += (f", {r['speedup_vs_baseline']:.2f}× {r['baseline_method']} γ="
                         f"{r['baseline_gamma']}" + _ci(r['speedup_vs_baseline_ci_low'],
                                                        r['speedup_vs_baseline_ci_high']))
        else:
            line = (head + f"K=0 (vanilla {r['vanilla_tok_s']:.0f} tok/s): best speculative "
                    + found + f"; {r['k_reason']}")
        if "roofline_pct" in r.index:
            line += (f"; roofline bound {r['roofline_ms']:.2f} ms = {r['roofline_pct']:.0f} % "
                     "of its iteration")
        if r["speculate"] and pd.notna(r.get("kv_selection_pct")):
            line += f"; KV selection {r['kv_selection_pct']:.1f} % of it"
        if r["rank_by"] == "goodput":
            line += f"; goodput {r['goodput_tok_s']:.0f} tok/s"
        elif r["rank_by"] == "tpot":
            line += f"; TPOT p50 {r['tpot_ms_p50']:.2f} ms"
        if r["engine"] != result.config.search_engine:
            line += f" [{r['engine']} engine: {r['ranked_with']}]"
        lines.append(line)
    return lines


def _ci(low: float, high: float) -> str:
    return f" [{low:.2f}, {high:.2f}]" if low < high else ""


@click.command()
@click.argument("results", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Report file (*.html); the CSVs go beside it as <stem>.report*.csv.")
@click.option("--kind", type=click.Choice(["sweep", "tune", "validate"]), default=None,
              help="Report kind [default: detected from the columns].")
@click.option("--title", default=None, help="Title of the page.")
def report(results: Path, out: Path, kind: str | None, title: str | None) -> None:
    """Write one self-contained HTML report (opens offline, from disk) from a sweep, tune or
    validate result, plus its CSVs beside it: <stem>.report.csv (the whole table, flat) and
    <stem>.report-<table>.csv (each table under a chart). A rerun replaces them; a file the
    report did not write (its input, or an HTML that is not a vegas-sim report) is never
    overwritten. The page and its CSVs are written together: an interrupt or a full disk
    leaves the previous report as it was. A partial sweep table (an interrupted sweep) is
    drawn with a warning that says so.

    The page opens with the provenance read from the table: trace sets, GPU (measured or
    what-if), engine, acceptance source, what the intervals are, and the extrapolated rows per
    method (marked in every chart and table). Charts: throughput over γ × sparsity for every
    method and cell, speedup over vanilla per method, iteration time by phase, per-position
    acceptance, throughput and TPOT vs batch and vs context, the throughput–TPOT trade-off; a
    tune result gets its table with the named baseline; a validate result a parity plot and
    its error tables. Charts the data cannot support are listed as skipped; a truncated CSV or
    a text cell in a number column is refused.

    Example:

    \b
        vegas-sim report sweep.csv --out sweep.html
    """
    with user_errors(), output_lock(out), sigterm_as_interrupt():
        written = write_report(results, out, kind, title=title)
    if written.partial:
        click.echo(f"warning: {results} is a partial table: {written.partial}", err=True)
    for skipped in written.skipped:
        click.echo(f"skipped {skipped}", err=True)
    click.echo(json.dumps({"html": str(written.html), "csvs": [str(p) for p in written.csvs],
                           "charts": len(written.charts)}))
