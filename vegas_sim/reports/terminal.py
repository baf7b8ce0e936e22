"""Terminal tables (rich) for predictions."""

from __future__ import annotations

import math

import pandas as pd
from rich.console import Console
from rich.table import Table

PHASE_ORDER = ("decode", "draft_step", "quest_meta", "verify", "collect", "select", "sample")


def _ci(value: float, low: float, high: float, fmt: str) -> str:
    if any(map(math.isnan, (low, high))) or low == high:
        return format(value, fmt)
    return f"{format(value, fmt)} [{format(low, fmt)}, {format(high, fmt)}]"


def _phase_breakdown(row: pd.Series) -> str:
    parts = []
    total = float(row.get("iter_ms", float("nan")))
    for phase in PHASE_ORDER:
        ms = row.get(f"ms_{phase}")
        if ms is None or pd.isna(ms) or ms <= 0:
            continue
        share = f" {100 * ms / total:.0f}%" if total and not math.isnan(total) else ""
        parts.append(f"{phase} {ms:.2f}{share}")
    return ", ".join(parts)


def prediction_table(df: pd.DataFrame) -> Table:
    table = Table(title="vegas-sim prediction (95% CI in brackets)", show_lines=False)
    for name in ("method", "γ", "s", "batch", "context", "tok/s", "speedup", "acc len",
                 "TPOT ms p50", "iter ms", "iteration breakdown (ms, share)", "extrapolated"):
        table.add_column(name, overflow="fold")
    for _, row in df.iterrows():
        spec = row["method"] != "vanilla"
        table.add_row(
            str(row["method"]),
            str(row["gamma"]) if spec else "-",
            f"{row['sparsity']:.3g}" if spec else "-",
            str(row["batch"]),
            str(row["context"]),
            _ci(row["throughput_tok_s"], row["throughput_ci_low"], row["throughput_ci_high"],
                ".0f"),
            _ci(row["speedup_vs_vanilla"], row["speedup_ci_low"], row["speedup_ci_high"], ".2f"),
            f"{row['acceptance_length']:.2f}",
            f"{row['tpot_ms_p50']:.2f}",
            f"{row['iter_ms']:.2f}",
            _phase_breakdown(row),
            str(row.get("extrapolated") or ""),
        )
    return table


def print_prediction(df: pd.DataFrame, notes: list[str], console: Console | None = None) -> None:
    console = console or Console()
    console.print(prediction_table(df))
    for note in notes:
        console.print(f"[dim]note:[/dim] {note}")
