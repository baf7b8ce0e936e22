"""Where a result table's numbers came from, read from the table itself (it survives sharing):
the trace sets, the GPU (measured or what-if), the engine, the acceptance source and anchors,
and which rows are extrapolated. Also the caption every interval gets: what it is, or that
there is none.

A table written before the rows carried `latency_traces` / `acceptance_traces` /
`acceptance_source` says "provenance unknown (table written by an older vegas-sim)".
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from vegas_sim.reports.csv import PARTIAL_COLUMN
from vegas_sim.sim.predict import is_extrapolated

UNKNOWN = "provenance unknown (table written by an older vegas-sim)"
SIM_INTERVAL = "95 % CI of the simulation (Monte-Carlo replications only)"
ANALYTIC_INTERVAL = "no interval (analytic engine)"
# (label on the page, the table's column)
FIELDS = (
    ("latency trace set", "latency_traces"),
    ("sampling phases priced", "latency_sampling"),
    ("acceptance trace set", "acceptance_traces"),
    ("acceptance source", "acceptance_source"),
    ("acceptance anchors", "acceptance_anchors"),
    ("GPU", "gpu"),
    ("engine", "engine"),
    ("model", "model"),
)
MAX_REASONS = 8  # distinct extrapolation reasons listed per method


@dataclass
class Provenance:
    """The report's provenance block: (label, value) lines and warnings to show first."""

    items: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    extrapolated: list[str] = field(default_factory=list)  # "method: n of m rows — reasons"


def _values(df: pd.DataFrame, col: str) -> list[str]:
    if col not in df.columns:
        return []
    return sorted({str(v) for v in df[col].dropna() if str(v).strip()})


def extrapolated_mask(df: pd.DataFrame) -> np.ndarray:
    """[rows] bool: the row's `extrapolated` column names a reason (or is true)."""
    if "extrapolated" not in df.columns:
        return np.zeros(len(df), dtype=bool)
    return np.array([is_extrapolated(v) for v in df["extrapolated"]], dtype=bool)


def _reasons(row: pd.Series) -> list[str]:
    for col in ("extrapolated_reasons", "extrapolated"):
        text = row.get(col)
        if isinstance(text, str) and text.strip() and is_extrapolated(text):
            return [r.strip() for r in text.replace("; ", ";").split(";") if r.strip()]
    return ["extrapolated (no reason recorded)"]


def extrapolation_notes(df: pd.DataFrame) -> list[str]:
    """One line per method with extrapolated rows: how many, and why (each reason once)."""
    mask = extrapolated_mask(df)
    if not mask.any():
        return []
    methods = df["method"].astype(str) if "method" in df.columns else pd.Series(
        ["all rows"] * len(df), index=df.index)
    lines = []
    for method in dict.fromkeys(methods[mask]):
        rows = df[mask & (methods == method).to_numpy()]
        # reasons that differ only in their numbers are one kind: the first is shown
        kinds: Counter[str] = Counter()
        example: dict[str, str] = {}
        for _, row in rows.iterrows():
            for r in _reasons(row):
                kind = re.sub(r"\d+(\.\d+)?", "#", r)
                kinds[kind] += 1
                example.setdefault(kind, r)
        listed = "; ".join(example[k] + (f" (and similar: {n} rows)" if n > 1 else "")
                           for k, n in kinds.most_common(MAX_REASONS))
        more = len(kinds) - MAX_REASONS
        lines.append(f"{method}: {len(rows)} of {int((methods == method).sum())} rows "
                     f"extrapolated — {listed}" + (f"; {more} more reasons" if more > 0 else ""))
    return lines


def interval_caption(df: pd.DataFrame) -> str:
    """What the table's intervals are: the sim engine's replication CI, none (analytic), or
    unknown (no engine column: the CIs are described by their width)."""
    engines = _values(df, "engine")
    parts = []
    if "sim" in engines:
        parts.append(("error bars: " if len(engines) == 1 else "sim rows: ") + SIM_INTERVAL)
    if "analytic" in engines:
        parts.append(ANALYTIC_INTERVAL if len(engines) == 1 else
                     "analytic rows: " + ANALYTIC_INTERVAL)
    if not engines:
        parts.append("engine unknown (no engine column): intervals shown as the table gives them")
    return "; ".join(parts)


def has_interval(df: pd.DataFrame, low: str, high: str) -> bool:
    """The table has CI columns and at least one row where they differ."""
    if not {low, high} <= set(df.columns):
        return False
    lo, hi = (pd.to_numeric(df[c], errors="coerce") for c in (low, high))
    return bool((hi - lo).fillna(0).abs().gt(0).any())


def partial_note(df: pd.DataFrame) -> str:
    """What a partial table says of itself (its PARTIAL_COLUMN); '' for a complete one."""
    return "; ".join(_values(df, PARTIAL_COLUMN))


def provenance(df: pd.DataFrame) -> Provenance:
    """The provenance block of a report of `df`."""
    prov = Provenance()
    partial = partial_note(df)
    if partial:
        prov.warnings.append(f"PARTIAL table, not the whole grid: {partial}")
    for label, col in FIELDS:
        values = _values(df, col)
        if values:
            prov.items.append((label, ", ".join(values)))
    if not any(col in df.columns for col in ("latency_traces", "acceptance_traces",
                                             "acceptance_source")):
        prov.items.insert(0, ("trace sets", UNKNOWN))
    if "gpu" not in df.columns:
        prov.items.append(("GPU", "unknown (no gpu column)"))
    whatif = [g for g in _values(df, "gpu") if "what-if" in g.lower() or "not measured" in g]
    if whatif:
        prov.warnings.append(f"GPU what-if, NOT measured: {', '.join(whatif)}")
    if "engine" in df.columns or "throughput_ci_low" in df.columns or "ci_low" in df.columns:
        prov.items.append(("intervals", interval_caption(df)))
    lat, acc = _values(df, "latency_traces"), _values(df, "acceptance_traces")
    if lat and acc and set(lat) != set(acc):
        prov.warnings.append(f"acceptance from {', '.join(acc)}, latency from {', '.join(lat)}: "
                             "the acceptance is another set's (a proxy when its model differs)")
    mask = extrapolated_mask(df)
    prov.items.append(("extrapolated rows", f"{int(mask.sum())} of {len(df)}"
                       if "extrapolated" in df.columns else "unknown (no extrapolated column)"))
    prov.extrapolated = extrapolation_notes(df)
    return prov


def mark_column(df: pd.DataFrame) -> list[str]:
    """The 'extrapolated' column of a static table: 'yes' or ''."""
    return ["yes" if x else "" for x in extrapolated_mask(df)]
