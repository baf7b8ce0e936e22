"""`vegas-sim predict`: one configuration, several methods side by side.

The command's docstring is its --help text and carries examples.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from vegas_sim import api
from vegas_sim.cli.common import (
    acceptance_anchor_option,
    acceptance_traces_option,
    gpu_options,
    gpu_target,
    parse_size,
    parse_sparsity,
    user_errors,
    weight_format_option,
)
from vegas_sim.errors import UserInputError
from vegas_sim.files import check_out, write_atomic
from vegas_sim.methods import DEFAULT_SPARSITY, METHODS
from vegas_sim.reports import terminal
from vegas_sim.reports.csv import flat_table, write_table

F = TypeVar("F", bound=Callable[..., Any])


def _predict_options(f: F) -> F:
    options: list[Callable[[Any], Any]] = [
        click.option("--gamma", "-g", type=int, default=7, show_default=True,
                     help="Draft tokens per iteration (γ)."),
        click.option("--sparsity", "-s", default=str(DEFAULT_SPARSITY), show_default=True,
                     help="Fraction of the context the draft attends to, in (0, 1]: 0.07 or "
                          "7%."),
        click.option("--batch", "-b", type=int, default=4, show_default=True,
                     help="Maximum running sequences (vLLM's max_num_seqs); the KV cache may "
                          "hold fewer: requests are admitted while their blocks fit, and the "
                          "latest admitted are preempted (recomputed) when it fills."),
        click.option("--context", "-c", default="32K", show_default=True,
                     help="Prompt tokens per request (e.g. 4096, 32K, 128K)."),
        click.option("--output-len", default="1024", show_default=True,
                     help="Generated tokens per request: N, lognormal:MEAN,CV (clipped to the "
                          "model's positions), or file:PATH (one length per line, or a CSV "
                          "column: file:PATH#COLUMN), drawn per request with --seed."),
        click.option("--kv-block-size", type=int, default=16, show_default=True,
                     help="Tokens per KV-cache block (vLLM's block_size): admission and "
                          "preemption count whole blocks."),
        click.option("--gpu-memory-utilization", type=float, default=0.9, show_default=True,
                     help="Share of GPU memory for the weights and the KV cache (vLLM's "
                          "gpu_memory_utilization); the KV cache gets what the weights leave."),
        click.option("--method", "-m", "methods", multiple=True,
                     type=click.Choice(METHODS), default=("vegas",), show_default=True,
                     help="Method(s) to predict side by side; vanilla is always the baseline."),
        click.option("--model", default=None,
                     help="Model whose latency to use (a preset calibrated in the trace set) "
                          "[default: qwen3-8b, or the model of --traces]."),
        click.option("--traces", type=click.Path(path_type=Path), default=None,
                     help="Trace set: a directory, or a packaged set's name (`vegas-sim "
                          "traces list`) [default: the packaged measured sets]."),
        acceptance_traces_option,
        gpu_options,
        click.option("--graph-launch-ms", type=float, default=None,
                     help="What-if: replace the measured per-step host overhead (large "
                          "in sets measured with an eager runtime) by this launch cost, as a "
                          "CUDA-graph engine would see. Not measured."),
        weight_format_option,
        click.option("--requests", type=int, default=None,
                     help="Requests to simulate (default: 4 × batch closed loop; "
                          "max(200, 20 × batch) for Poisson arrivals, enough for a steady "
                          "state)."),
        click.option("--arrival", default="closed", show_default=True,
                     help="'closed' (batch-many users), 'closed:USERS', 'poisson:RATE' "
                          "(requests/s) or 'trace:FILE' (arrival times in seconds, one per "
                          "line, or a CSV with arrival_s[, input_len, output_len]); open loop: "
                          "rows add TTFT with queueing, E2E, queue length, served rate and "
                          "whether it is saturated."),
        click.option("--slo-tpot-ms", type=float, default=None,
                     help="TPOT SLO for goodput (tokens/s of requests meeting every SLO)."),
        click.option("--slo-ttft-ms", type=float, default=None,
                     help="TTFT SLO (queueing included) for goodput."),
        click.option("--workload", default=None,
                     help="Acceptance workload (reasoning, code, chat, longdoc, recall); "
                          "default all, pooled."),
        click.option("--temperature", type=float, default=0.0, show_default=True,
                     help="Sampling temperature whose acceptance to replay (0 = greedy)."),
        click.option("--prefill", type=click.Choice(["disaggregated", "co-located"]),
                     default="disaggregated", show_default=True,
                     help="Where admitted requests are prefilled: on a prefill stage of its "
                          "own GPUs, the KV then sent over --kv-link-gbs, or on this instance "
                          "between decode iterations (co-located). TTFT includes the prefill "
                          "either way (the ttft_includes column says how)."),
        click.option("--prefill-gpus", type=int, default=1, show_default=True,
                     help="Disaggregated: GPUs of the prefill stage (FCFS, a prompt each)."),
        click.option("--kv-link-gbs", type=float, default=50.0, show_default=True,
                     help="Disaggregated: prefill → decode KV link, GB/s (50: one 400 Gb/s "
                          "RDMA NIC)."),
        click.option("--engine", type=click.Choice(["sim", "analytic"]), default="sim",
                     show_default=True, help="SimPy engine or closed form."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--replications", type=int, default=5, show_default=True,
                     help="Independent replications for the 95% confidence intervals."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@click.command()
@_predict_options
@acceptance_anchor_option
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json", "parquet"]),
              default="table", show_default=True,
              help="Output format; with --out, the file's suffix decides.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Write the rows to this file: *.csv, *.json or *.parquet.")
@click.pass_context
def predict(ctx: click.Context, fmt: str, out: Path | None, **kwargs: Any) -> None:
    """Predict throughput and latency of one configuration, with 95% confidence intervals.

    Replays the trace set in the SimPy model of batched draft→verify iterations: latency of
    the model asked for, acceptance from a real-weights trace set (the output says which),
    its level set by measured acceptance anchors where given (--acceptance-anchor; for
    qwen3-8b the paper's figures, qwen3-8b-published, by default).

    Examples:

    \b
        vegas-sim predict --gamma 7

    \b
        vegas-sim predict -m vegas -m magicdec-stream -m specextend --batch 4 --context 120K

    \b
        vegas-sim predict --gamma 6 --gpu h100-sxm --format json --out pred.json

    \b
        vegas-sim predict --gamma 7 --context 120K --graph-launch-ms 0.5

    \b
        vegas-sim predict --batch 64 --output-len lognormal:1024,0.5

    \b
        vegas-sim predict --arrival poisson:0.3 --slo-tpot-ms 8 --slo-ttft-ms 2000

    \b
        vegas-sim predict --gamma 6 --workload reasoning --temperature 0.6 --context 4K \
            -m vegas -m magicdec-stream --acceptance-anchor qwen3-8b-published

    \b
        vegas-sim predict --gamma 7 --weight-format fp8
    """
    with user_errors():
        explicit = ctx.get_parameter_source("fmt") is not click.core.ParameterSource.DEFAULT
        fmt = _out_format(fmt, explicit, out)
        context = parse_size(kwargs.pop("context"), "--context")
        sparsity = parse_sparsity(kwargs.pop("sparsity"))
        kwargs["acceptance_anchors"] = tuple(kwargs["acceptance_anchors"])
        kwargs["gpu"] = gpu_target(kwargs["gpu"], kwargs.pop("gpu_spec"))
        table, notes = api.predict_methods(context=context, sparsity=sparsity, **kwargs)
        # --out alone writes the file and still shows the table; an explicit --format does not
        show = out is not None and not explicit or out is None and fmt == "table"
        _emit_table(table, notes, fmt, out, show=show)


OUT_FORMATS = {".csv": "csv", ".json": "json", ".parquet": "parquet"}


def _out_format(fmt: str, explicit: bool, out: Path | None) -> str:
    """The format to write: --out's suffix decides; an explicit --format must agree with it."""
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
