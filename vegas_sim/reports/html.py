"""One self-contained HTML report (plus the CSVs beside it) from a sweep, tune or validate result.

    >>> from vegas_sim.reports.html import write_report
    >>> out = write_report("sweep.csv", "sweep.html")        # kind detected from the columns
    >>> out.html, out.csvs, out.skipped

The page inlines the plotly.js bundle (no CDN, opens from disk), draws every chart the data
supports, and lists the charts it skipped and why instead of drawing a broken one.

The CSVs beside `sweep.html` are `sweep.report.csv` (the whole table, flat) and
`sweep.report-<slug>.csv` (each static table). The `.report` infix keeps them apart from the
result files users name themselves (`sweep.csv`), and the page records their names, so a rerun
may replace them but a report never overwrites a file it did not write, nor its input. The page
and its CSVs are written as one (`files.write_together`): an interrupt or a full disk leaves
the previous report as it was, nothing half-written beside it.
"""

from __future__ import annotations

import datetime as _dt
import html as _html
import json
import os
import re
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import jinja2
import pandas as pd
import plotly.io as pio
import plotly.offline
from markupsafe import Markup

from vegas_sim.errors import UserInputError
from vegas_sim.files import check_out, write_together
from vegas_sim.reports import charts as ch
from vegas_sim.reports import validate_tune as vt
from vegas_sim.reports.chart import Chart
from vegas_sim.reports.context_trend import context_trend_table
from vegas_sim.reports.csv import read_table, spread_rates, table_writer, to_numbers
from vegas_sim.reports.provenance import partial_note, provenance
from vegas_sim.reports.templates import GENERATOR, REPORT_TEMPLATE

KINDS = ("sweep", "tune", "validate")
# The columns each kind's charts are built from: a table without them is not that kind.
REQUIRED_COLUMNS = {
    "sweep": ("method", "gamma", "sparsity", "batch", "context", "throughput_tok_s"),
    "tune": ("batch", "context", "gamma", "speedup_vs_vanilla"),
    "validate": ("predicted", "measured"),
}
WRITERS = {"sweep": "`vegas-sim sweep --out` (CSV or Parquet)",
           "tune": "`vegas-sim tune --out` (JSON)", "validate": "`vegas-sim validate --out`"}
PLOT_CONFIG = {"displaylogo": False, "responsive": True,
               "toImageButtonOptions": {"format": "svg"}}
# <meta> of the page listing the CSVs it wrote: a rerun may replace exactly those.
COMPANIONS_META = "vegas-sim-companions"
SLUG_CHARS = 24


@dataclass
class ReportOutput:
    """What `write_report` wrote: the HTML, the CSVs beside it, and the charts it skipped."""

    html: Path
    csvs: list[Path] = field(default_factory=list)
    charts: list[str] = field(default_factory=list)  # titles of the rendered charts
    skipped: list[str] = field(default_factory=list)  # "title: why"
    tables: list[str] = field(default_factory=list)  # titles of the table-only entries
    partial: str = ""  # what the table says of itself when it is partial (an interrupted sweep)


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
        return _with_doc_columns(pd.DataFrame(doc["cells"]), doc), "tune", notes
    return read_table(path), None, []


def _with_doc_columns(cells: pd.DataFrame, doc: dict[str, object]) -> pd.DataFrame:
    """A tune JSON's cells, with the document's model / GPU / final engine as columns where
    the cells lack them (the provenance block reads the table)."""
    strategy = doc.get("strategy")
    engine = strategy.get("final_engine") if isinstance(strategy, dict) else None
    for col, value in (("model", doc.get("model")), ("gpu", doc.get("gpu")), ("engine", engine)):
        if col not in cells.columns and isinstance(value, str) and value and not cells.empty:
            cells[col] = value
    return cells


def detect_kind(df: pd.DataFrame) -> str:
    """validate if it has predicted+measured, tune if it has tune-only columns, else sweep."""
    if {"predicted", "measured"} <= set(df.columns):
        return "validate"
    if "speedup_vs_baseline" in df.columns or "baseline_method" in df.columns:
        return "tune"
    return "sweep"


def _missing_columns(kind: str, df: pd.DataFrame) -> list[str]:
    return [c for c in REQUIRED_COLUMNS[kind] if c not in df.columns]


def _not_a_result(df: pd.DataFrame) -> UserInputError:
    """No --kind and the columns fit no kind: say what each kind would need."""
    lacks = "; ".join(f"a {k} needs {', '.join(_missing_columns(k, df))}" for k in KINDS)
    return UserInputError(
        f"the table is not a sweep, tune or validate result (its columns: "
        f"{', '.join(map(str, df.columns[:8]))}{', ...' if len(df.columns) > 8 else ''}); "
        f"missing columns: {lacks}",
        where="RESULTS",
        fix="pass the file written by `vegas-sim sweep --out`, `vegas-sim tune --out` or "
            "`vegas-sim validate --out`")


def _fix(kind: str, forced: bool) -> str:
    fix = f"pass the file written by {WRITERS[kind]}"
    return fix + ", or leave out --kind to detect the kind from the columns" if forced else fix


def _check_tune_shape(df: pd.DataFrame, forced: bool) -> None:
    """A tune result has one row per (batch, context); a sweep has all the tune columns too,
    but one row per method × γ × sparsity there, which would draw nonsense tune charts."""
    dup = df[df.duplicated(["batch", "context"], keep=False)]
    if dup.empty:
        return
    first = dup.iloc[0]
    n = int(((df["batch"] == first["batch"]) & (df["context"] == first["context"])).sum())
    raise UserInputError(
        f"a tune report needs one row per (batch, context); the table has {n} rows for "
        f"batch {first['batch']}, context {first['context']} (a sweep has one per method, γ "
        "and sparsity)", where="RESULTS", fix=_fix("tune", forced))


def _check_kind(kind: str | None, hint: str | None, df: pd.DataFrame) -> str:
    """The report kind: `kind` (--kind), else `hint` (a tune JSON), else from the columns;
    refused when the table lacks what that kind's charts need."""
    if kind is not None and kind not in KINDS:
        raise UserInputError(f"unknown report kind {kind!r}", where="--kind",
                             fix=f"use one of: {', '.join(KINDS)}")
    chosen = kind or hint or detect_kind(df)
    missing = _missing_columns(chosen, df)
    if missing and kind is None and hint is None:
        raise _not_a_result(df)
    if missing:
        raise UserInputError(
            f"a {chosen} report needs the columns {', '.join(REQUIRED_COLUMNS[chosen])}; "
            f"the table lacks {', '.join(missing)}", where="RESULTS",
            fix=_fix(chosen, kind is not None))
    if chosen == "tune":
        _check_tune_shape(df, kind is not None)
    return chosen


def _charts_for(kind: str, df: pd.DataFrame) -> list[Chart]:
    if kind == "validate":
        charts = [vt.parity(df), vt.row_errors(df)]
    elif kind == "tune":
        charts = [vt.tune_table(df), vt.tune_speedups(df), vt.tune_gamma_map(df)]
    else:
        charts = ch.sweep_charts(df)
    trend = context_trend_table(df)  # rows beyond the traced contexts: the trend they followed
    return charts if trend is None else [*charts, trend]


def _slug(text: str, limit: int = SLUG_CHARS) -> str:
    """Whole words of `text` joined by '-', as many as fit in `limit` characters (at least
    one): a file name a user can read, never cut mid-word."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    kept: list[str] = []
    for word in words:
        if kept and len("-".join([*kept, word])) > limit:
            break
        kept.append(word)
    return "-".join(kept) or "table"


def _slugs(charts: list[Chart]) -> list[str]:
    """Each chart's slug, unique, as a part of a file name and an element id: letters,
    digits, '_' and '-' only (a method name in it may hold anything, '/' and '..' included);
    from the title where the chart has none."""
    used: set[str] = set()
    slugs = []
    for chart in charts:
        base = re.sub(r"[^A-Za-z0-9_]+", "-", chart.slug).strip("-") or _slug(chart.title)
        slug, n = base, 1
        while slug in used:  # two charts with one slug must not share a file or an id
            n += 1
            slug = f"{base}-{n}"
        used.add(slug)
        slugs.append(slug)
    return slugs


def _table_html(df: pd.DataFrame) -> Markup:
    return Markup(df.to_html(index=False, classes="data", border=0, na_rep="–",
                             float_format=lambda v: f"{v:.4g}"))


def _companions(out: Path, df: pd.DataFrame, charts: list[Chart],
                slugs: list[str]) -> list[tuple[Path, pd.DataFrame]]:
    """(path, table) of each CSV beside the report: the whole table, then the charts' tables."""
    planned = [(out.with_name(f"{out.stem}.report.csv"), df)]
    for chart, slug in zip(charts, slugs):
        if chart.table is not None and not chart.table.empty:
            planned.append((out.with_name(f"{out.stem}.report-{slug}.csv"), chart.table))
    return planned


def _head(out: Path) -> str:
    """The first 16 KiB of the file at `out` ('' if none): the <meta>s precede plotly.js."""
    try:
        with out.open("rb") as f:
            return f.read(16_384).decode("utf-8", "replace")
    except OSError:
        return ""


def _is_our_report(head: str) -> bool:
    """A report this code wrote: the generator <meta>, or (older reports) the companions one."""
    return (f'<meta name="generator" content="{GENERATOR}' in head
            or f'<meta name="{COMPANIONS_META}"' in head)


def _check_html_is_ours(out: Path) -> None:
    """Refuse to replace an existing file at `out` that is not a vegas-sim report."""
    if os.path.lexists(out) and not _is_our_report(_head(out)):
        raise UserInputError(
            f"{str(out)!r} exists and is not a vegas-sim report; writing the report would "
            "overwrite it", where="--out",
            fix="choose another --out, or delete the file if it is no longer needed")


def _previous_companions(out: Path) -> set[str]:
    """Names of the CSVs that the report now at `out` wrote (its <meta>); none if no report.
    Only names a report gives its CSVs count: `<stem>.report*.csv` in `out`'s directory (an
    edited page may list anything, '../' included)."""
    head = _head(out)
    found = re.search(rf'<meta name="{COMPANIONS_META}" content="([^"]*)"', head)
    if found is None:
        return set()
    try:
        names = json.loads(_html.unescape(found.group(1)))
    except json.JSONDecodeError:
        return set()
    if not isinstance(names, list):
        return set()
    return {n for n in names if isinstance(n, str) and _is_companion_name(out, n)}


def _is_companion_name(out: Path, name: str) -> bool:
    return (Path(name).name == name and name.startswith(f"{out.stem}.report")
            and name.endswith(".csv"))


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _check_overwrites(out: Path, paths: list[Path], source: Path | None) -> None:
    """Refuse to write a CSV onto the input, or onto any file the previous report at `out`
    did not write: those are the user's (a `sweep.report.csv` they made, say)."""
    ours = _previous_companions(out)
    for path in paths:
        if source is not None and _same_file(path, source):
            raise UserInputError(
                f"the report would write its CSV {str(path)!r} over its input", where="--out",
                fix="choose another --out name (the CSVs are named after it)")
        if os.path.lexists(path) and path.name not in ours:
            raise UserInputError(
                f"{str(path)!r} exists and was not written by the report {str(out)!r}; "
                "writing the report would overwrite it", where="--out",
                fix="move that file away, or choose another --out name (the CSVs are named "
                    "after it)")


def _stale(out: Path, planned: list[Path]) -> list[Path]:
    """The CSVs the previous report at `out` wrote that this one does not rewrite: they
    described other data, and a later report of that name must find no foreign file there."""
    keep = {p.name for p in planned}
    return [out.with_name(name) for name in sorted(_previous_companions(out) - keep)]


def _remove(paths: list[Path]) -> None:
    for path in paths:
        if path.is_file():
            path.unlink(missing_ok=True)


def _render(slug: str, chart: Chart, result: ReportOutput) -> dict[str, object]:
    """The template's entry for one chart; records it in `result` as drawn or skipped."""
    entry: dict[str, object] = {"title": chart.title, "caption": chart.caption,
                                "note": chart.note, "id": f"section-{slug}"}
    if chart.fig is not None:
        entry["div"] = Markup(pio.to_html(
            chart.fig, include_plotlyjs=False, full_html=False, config=PLOT_CONFIG,
            div_id=f"chart-{slug}", default_height=f"{chart.height}px"))
        result.charts.append(chart.title)
    elif chart.table_only:
        result.tables.append(chart.title)
    else:
        # The note reads "skipped: why" on the page; the list is already of skipped charts.
        result.skipped.append(f"{chart.title}: {chart.note.removeprefix('skipped: ')}")
    if chart.table is not None and not chart.table.empty:
        entry["table"] = _table_html(chart.table)
    return entry


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
    `<stem>.report.csv` (the results, flat) and `<stem>.report-<slug>.csv` for each static
    table. Existing files of those names are replaced only if this report wrote them before.
    """
    df, hint, file_notes = load_results(results)
    if df.empty:
        raise UserInputError("the results table is empty", where="RESULTS",
                             fix="run a sweep/tune/validate that produces rows")
    from_csv = not isinstance(results, pd.DataFrame) and Path(results).suffix.lower() == ".csv"
    df = to_numbers(df, "RESULTS", first_line=2 if from_csv else None)
    kind = _check_kind(kind, hint, df)
    # before any output: no CSVs left beside a failed report
    out = check_out(Path(out_html), (".html", ".htm"))
    _check_html_is_ours(out)
    source = None if isinstance(results, pd.DataFrame) else Path(results)
    charts = _charts_for(kind, df)
    slugs = _slugs(charts)
    planned = _companions(out, df, charts, slugs)
    _check_overwrites(out, [path for path, _ in planned], source)
    result = ReportOutput(html=out, csvs=[path for path, _ in planned],
                          partial=partial_note(df))
    rendered = [_render(slug, chart, result) for slug, chart in zip(slugs, charts)]
    names = [p.name for p in result.csvs]
    page = jinja2.Environment(autoescape=True).from_string(REPORT_TEMPLATE).render(
        title=title or f"vegas-sim {kind} report", kind=kind, n_rows=len(df),
        generated=_dt.datetime.now().isoformat(timespec="seconds"), version=_version(),
        source=str(results) if source is not None else "",
        notes=[*file_notes, *notes], csvs=names, charts=rendered,
        provenance=provenance(df), generator=GENERATOR, companions_meta=COMPANIONS_META,
        companions=json.dumps(names), plotly_js=Markup(plotly.offline.get_plotlyjs()),
    )
    # All or nothing: the page and its CSVs are staged, then renamed into place together
    # (the page first: it lists the CSVs, so a rerun may replace any of them).
    stale = _stale(out, result.csvs)
    write_together([(out, lambda tmp: tmp.write_text(page, encoding="utf-8")),
                    *[(path, table_writer(table, path)) for path, table in planned]],
                   before_commit=lambda: _remove(stale))
    return result
