"""`vegas-sim predict`: one configuration, several methods side by side.

The command's docstring is its --help text and carries examples.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from vegas_sim import api
from vegas_sim.cli.common import heartbeat, scenario_options, user_errors
from vegas_sim.errors import UserInputError
from vegas_sim.files import check_out, write_atomic
from vegas_sim.reports import terminal
from vegas_sim.reports.csv import flat_table, write_table


@click.command()
@scenario_options("predict")
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
        vegas-sim predict --gamma 6 --workload reasoning --temperature 0.6 --context 4K \\
            -m vegas -m magicdec-stream --acceptance-anchor qwen3-8b-published

    \b
        vegas-sim predict --gamma 7 --weight-format fp8
    """
    with user_errors():
        explicit = ctx.get_parameter_source("fmt") is not click.core.ParameterSource.DEFAULT
        fmt = _out_format(fmt, explicit, out)
        with heartbeat("predicting", "methods") as progress:
            table = api.predict(**kwargs, progress=progress)
        notes = list(table.attrs.pop("notes", []))
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
