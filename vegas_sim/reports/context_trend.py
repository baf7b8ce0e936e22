"""The report's context-trend table: how acceptance was carried beyond the traced contexts.

Rows predicted at a context above their acceptance trace set's traced contexts follow each
workload's context trend (`sim.context_trend`); their `extrapolated` note says by how much.
This table collects those notes per (method, workload, temperature, trend): the slope per
doubling of context, the traced buckets it was fitted on, the distance, the logit shift and
what it did to the mean acceptance length (bonus token included). No row used a trend: no table.
"""

from __future__ import annotations

import pandas as pd

from vegas_sim.reports.chart import Chart
from vegas_sim.sim.context_trend import parse_trend_note

TITLE = "Acceptance context trend beyond the traced contexts"
CAPTION = ("Acceptance above the traced contexts follows the trend each workload's traces show "
           "in log-context (a logit shift of the conditional per-position acceptance per "
           "doubling, shrunk by its standard error, capped, held past twice the traced span); "
           "its uncertainty grows with the distance and is part of the prediction interval, its "
           "sd scaled by the factor the acceptance set's own context hold-out needs (sd scale). "
           "Mean acceptance length includes the bonus token; ranges span the rows' γ and "
           "sparsities.")
KEYS = ("method", "workload", "temperature")


def _noted(df: pd.DataFrame) -> pd.DataFrame:
    """One row per result row whose note says it followed a context trend."""
    out = []
    for _, row in df.iterrows():
        parsed = parse_trend_note(str(row["extrapolated"])) if isinstance(
            row["extrapolated"], str) else None
        if parsed is not None:
            out.append({**{k: row[k] if k in row.index else "" for k in KEYS},
                        "context": row.get("context"), **parsed})
    return pd.DataFrame(out)


def _span(values: pd.Series, fmt: str) -> str:
    lo, hi = values.min(), values.max()
    return format(lo, fmt) if lo == hi else f"{format(lo, fmt)} .. {format(hi, fmt)}"


def _span_text(values: pd.Series) -> str:
    return "; ".join(sorted({str(v) for v in values if v}))


def context_trend_table(df: pd.DataFrame) -> Chart | None:
    """The table (module docstring), or None when no row followed a context trend."""
    if "extrapolated" not in df.columns:
        return None
    noted = _noted(df)
    if noted.empty:
        return None
    noted["workload"] = [w if isinstance(w, str) and w else "pooled" for w in noted["workload"]]
    rows = []
    for key, g in noted.groupby([*KEYS, "fitted_on", "slope_per_doubling"], sort=True,
                                dropna=False):
        method, workload, temperature, fitted_on, slope = key  # type: ignore[misc]
        rows.append({"method": method, "workload": workload, "temperature": temperature,
                     "slope per doubling (logit)": f"{slope:+.2f}", "fitted on": fitted_on,
                     "contexts": _span(g["context"], ".0f"),
                     "doublings beyond": _span(g["doublings"], "+.2f"),
                     "shift (logit)": _span(g["shift"], "+.2f"),
                     "mean acceptance length": (f"{_span(g['length_before'], '.2f')} → "
                                                f"{_span(g['length_after'], '.2f')}"),
                     "sd scale": _span_text(g["sd_scale"]),
                     "rows": len(g)})
    return Chart(TITLE, None, caption=CAPTION, table=pd.DataFrame(rows), slug="context-trend",
                 table_only=True)
