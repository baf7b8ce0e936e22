"""One self-contained HTML report (plus the CSVs beside it) from a sweep, tune or validate result.

    >>> from vegas_sim.reports.html import write_report
    >>> out = write_report("sweep.csv", "sweep.html")        # kind detected from the columns
    >>> out.html, out.csvs, out.skipped

The page inlines the plotly.js bundle (no CDN, opens from disk), draws every chart the data
supports, and lists the charts it skipped and why instead of drawing a broken one.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import jinja2
import pandas as pd
import plotly.io as pio
import plotly.offline
from markupsafe import Markup

from vegas_sim.errors import UserInputError
from vegas_sim.reports import charts as ch
from vegas_sim.reports.csv import read_table, spread_rates, write_table
from vegas_sim.reports.templates import REPORT_TEMPLATE

KINDS = ("sweep", "tune", "validate")
PLOT_CONFIG = {"displaylogo": False, "responsive": True,
               "toImageButtonOptions": {"format": "svg"}}


@dataclass
class ReportOutput:
    """What `write_report` wrote: the HTML, the CSVs beside it, and the charts it skipped."""

    html: Path
    csvs: list[Path] = field(default_factory=list)
    charts: list[str] = field(default_factory=list)  # titles of the rendered charts
    skipped: list[str] = field(default_factory=list)  # "title: why"


def _version() -> str:
    try:
        return metadata.version("vegas-sim")
    except metadata.PackageNotFoundError:
        return "dev"


def load_results(results: pd.DataFrame | str | Path) -> tuple[pd.DataFrame, str | None, list[str]]:
    """(table, kind hint, notes) from a DataFrame or a CSV / Parquet / tune-JSON file."""
    if isinstance(results, pd.DataFrame):
        return spread_rates(results), None, []
    path = Path(results)
    if path.suffix.lower() == ".json":
        if not path.is_file():
            raise UserInputError(f"{str(path)!r} does not exist", where="RESULTS",
                                 fix="pass the JSON written by `vegas-sim tune --out`")
        try:
            doc = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise UserInputError(f"{str(path)!r} is not valid JSON: {e}", where="RESULTS",
                                 fix="pass the JSON written by `vegas-sim tune --out`") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("cells"), list):
            raise UserInputError(f"{str(path)!r} has no 'cells' list", where="RESULTS",
                                 fix="pass the JSON written by `vegas-sim tune --out`")
        notes = [f"model {doc.get('model')}, method {doc.get('method')}"] if "model" in doc else []
        notes += [str(n) for n in doc.get("notes", [])]
        return pd.DataFrame(doc["cells"]), "tune", notes
    return read_table(path), None, []


def detect_kind(df: pd.DataFrame) -> str:
    """validate if it has predicted+measured, tune if it has tune-only columns, else sweep."""
    if {"predicted", "measured"} <= set(df.columns):
        return "validate"
    if "speedup_vs_baseline" in df.columns or "baseline_method" in df.columns:
        return "tune"
    return "sweep"


def _charts_for(kind: str, df: pd.DataFrame) -> list[ch.Chart]:
    if kind == "validate":
        return [ch.parity(df)]
    if kind == "tune":
        return [ch.tune_speedups(df), ch.tune_gamma_map(df)]
    return ch.sweep_charts(df)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:40] or "table"


def _table_html(df: pd.DataFrame) -> Markup:
    return Markup(df.to_html(index=False, classes="data", border=0, na_rep="–",
                             float_format=lambda v: f"{v:.4g}"))


def _check_kind(kind: str | None, df: pd.DataFrame) -> str:
    if kind is None:
        return detect_kind(df)
    if kind not in KINDS:
        raise UserInputError(f"unknown report kind {kind!r}", where="--kind",
                             fix=f"use one of: {', '.join(KINDS)}")
    if kind == "validate" and not {"predicted", "measured"} <= set(df.columns):
        raise UserInputError("a validate report needs the columns 'predicted' and 'measured'",
                             where="RESULTS", fix="pass the table written by `vegas-sim validate`")
    return kind


def write_report(
    results: pd.DataFrame | str | Path,
    out_html: str | Path,
    kind: str | None = None,
    *,
    title: str | None = None,
    notes: list[str] | tuple[str, ...] = (),
) -> ReportOutput:
    """Write one self-contained HTML report and the CSVs beside it.

    `results` is a sweep / tune / validate table (DataFrame or CSV/Parquet path) or a tune JSON;
    `kind` is detected from the columns when None. Beside `out_html` (same stem) go
    `<stem>.csv` (the results, flat) and `<stem>_<chart>.csv` for each static table.
    """
    df, hint, file_notes = load_results(results)
    if df.empty:
        raise UserInputError("the results table is empty", where="RESULTS",
                             fix="run a sweep/tune/validate that produces rows")
    kind = _check_kind(kind or hint, df)
    out = Path(out_html)
    if out.suffix.lower() not in (".html", ".htm"):
        raise UserInputError(f"{str(out)!r} is not an .html file", where="--out",
                             fix="name the report *.html")
    out.parent.mkdir(parents=True, exist_ok=True)
    result = ReportOutput(html=out)
    result.csvs.append(write_table(df, out.with_suffix(".csv")))
    rendered = []
    for i, chart in enumerate(_charts_for(kind, df)):
        entry: dict[str, object] = {"title": chart.title, "caption": chart.caption,
                                    "note": chart.note}
        if chart.fig is not None:
            entry["div"] = Markup(pio.to_html(
                chart.fig, include_plotlyjs=False, full_html=False, config=PLOT_CONFIG,
                div_id=f"chart-{i}", default_height="420px"))
            result.charts.append(chart.title)
        else:
            result.skipped.append(f"{chart.title}: {chart.note}")
        if chart.table is not None and not chart.table.empty:
            entry["table"] = _table_html(chart.table)
            result.csvs.append(write_table(
                chart.table, out.with_name(f"{out.stem}_{_slug(chart.title)}.csv")))
        rendered.append(entry)
    html = jinja2.Environment(autoescape=True).from_string(REPORT_TEMPLATE).render(
        title=title or f"vegas-sim {kind} report", kind=kind, n_rows=len(df),
        generated=_dt.datetime.now().isoformat(timespec="seconds"), version=_version(),
        source=str(results) if not isinstance(results, pd.DataFrame) else "",
        notes=[*file_notes, *notes], csvs=[p.name for p in result.csvs], charts=rendered,
        plotly_js=Markup(plotly.offline.get_plotlyjs()),
    )
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(html)
    os.replace(tmp, out)
    return result
