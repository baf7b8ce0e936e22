"""What every chart builder shares: the `Chart` it returns, the cell vocabulary (which columns
fix a workload cell), and picking each method's best row.

A builder returns a `Chart`: a figure, or None with a note saying why it was skipped (missing
columns, a single point, ...). A chart is never drawn from partial data that would mislead; it
is skipped and the report says so. A table-only entry (`table_only`) is a static table with no
figure, not a skipped chart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from vegas_sim.methods import METHODS

# Columns that identify a configuration (any present subset); the rest are metrics.
CONFIG_COLUMNS = ("method", "gamma", "sparsity", "batch", "context", "output_len", "engine",
                  "temperature", "workload", "arrival", "requests", "prefill",
                  "kv_capacity_tokens")
# A "cell" is what a user fixes before choosing (γ, s): batch, context and the rest of the
# workload; methods are compared within a cell.
CELL_COLUMNS = tuple(c for c in CONFIG_COLUMNS if c not in ("method", "gamma", "sparsity"))


@dataclass
class Chart:
    """One chart of the report; `fig` is None when skipped, and `note` says why."""

    title: str
    fig: go.Figure | None
    note: str = ""
    caption: str = ""
    table: pd.DataFrame | None = field(default=None)  # a static table shown under the chart
    # Short name of `table`'s CSV beside the report (<stem>.report-<slug>.csv) and of the
    # chart's element id (chart-<slug>); titles are too long for file names. Empty: derived
    # from the title.
    slug: str = ""
    table_only: bool = False  # a static table with no figure (not a skipped chart)
    height: int = 420  # px of the figure on the page


def skip(title: str, why: str) -> Chart:
    return Chart(title, None, note=f"skipped: {why}")


def missing(df: pd.DataFrame, cols: tuple[str, ...]) -> list[str]:
    return [c for c in cols if c not in df.columns or df[c].isna().all()]


def fmt_tokens(n: Any) -> str:
    """32768 → '32K'."""
    n = int(n)
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def cell_columns(df: pd.DataFrame) -> list[str]:
    """The cell columns of `df` that vary or matter (batch, context always if present); a
    column the earlier ones determine (`requests`, 4 × batch by default) adds no cell."""
    varying = [c for c in CELL_COLUMNS if c in df.columns
               and (c in ("batch", "context") or df[c].nunique(dropna=False) > 1)]
    kept: list[str] = []
    for c in varying:
        if c in ("batch", "context") or not kept or (
                df.groupby(kept, dropna=False)[c].nunique(dropna=False).max() > 1):
            kept.append(c)
    return kept


def cell_label(row: pd.Series, cols: list[str]) -> str:
    parts = []
    for c in cols:
        v = row[c]
        if c == "batch":
            parts.append(f"B={v}")
        elif c == "context":
            parts.append(f"C={fmt_tokens(v)}")
        else:
            parts.append(f"{c}={v}")
    return ", ".join(parts)


def method_order(methods: list[str]) -> list[str]:
    known = [m for m in METHODS if m in methods]
    return known + sorted(str(m) for m in methods if m not in METHODS)


def best_per_method(df: pd.DataFrame, metric: str = "throughput_tok_s") -> pd.DataFrame:
    """For each (cell, method), the row with the highest `metric` (the method at its best γ, s)."""
    keys = [*cell_columns(df), "method"]
    ok = df.dropna(subset=[metric])
    if ok.empty:
        return ok
    idx = ok.groupby(keys, dropna=False)[metric].idxmax()
    return ok.loc[idx.to_numpy()].reset_index(drop=True)


def config_label(row: pd.Series) -> str:
    if row["method"] == "vanilla" or "gamma" not in row.index:
        return str(row["method"])
    return f"{row['method']} (γ={int(row['gamma'])}, s={row['sparsity']:g})"
