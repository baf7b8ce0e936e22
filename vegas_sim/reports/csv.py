"""Tidy tables on disk: CSV or Parquet chosen by the file suffix.

Result tables (sweep, tune, validate) are flat: one row per configuration, one column per
metric. A list-valued column such as `rates` (per-position acceptance rates, one entry per
draft position) is spread into `rate_1 .. rate_K` columns, with NaN past a row's own γ, so the
CSV opens in any spreadsheet and `read_table` gives back the same columns.
"""

from __future__ import annotations

import csv as _csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vegas_sim.errors import UserInputError
from vegas_sim.files import Writer, write_atomic

TABLE_SUFFIXES = (".csv", ".parquet", ".pq")
# The column a partial table (an interrupted sweep) carries on every row: how much of the grid
# it holds and how to finish it. A complete table has no such column.
PARTIAL_COLUMN = "partial"


def table_format(path: str | Path, option: str = "--out") -> str:
    """'csv' or 'parquet' from the file suffix; anything else is a user error."""
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    raise UserInputError(
        f"cannot tell the table format of {str(path)!r} (suffix {suffix or 'none'!r})",
        where=option, fix="name the file *.csv or *.parquet",
    )


def _as_list(value: Any) -> list[float] | None:
    """A per-position list from an array, a list, or its JSON text (as a CSV cell holds it)."""
    if isinstance(value, str):
        text = value.strip()
        try:  # JSON text '[0.9, 0.8]' or predict's space-separated '0.9000 0.8000' ('' = none)
            value = json.loads(text) if text.startswith("[") else [float(v) for v in text.split()]
        except ValueError:
            return None
    if isinstance(value, (list, tuple, np.ndarray)):
        return [float(v) for v in value]
    return None


def spread_rates(df: pd.DataFrame, column: str = "rates") -> pd.DataFrame:
    """Replace a list column `rates` by `rate_1 .. rate_K` (K = the longest list; NaN padded).

    Tables without the column, or that already have `rate_*` columns, come back unchanged.
    """
    if column not in df.columns:
        return df
    lists = [_as_list(v) for v in df[column]]
    width = max((len(v) for v in lists if v is not None), default=0)
    out = df.drop(columns=[column])
    if width == 0 or any(c.startswith("rate_") for c in df.columns):
        return out
    # [rows, K] rates; positions past a row's γ are NaN (no such draft position).
    grid = np.full((len(df), width), np.nan)
    for i, v in enumerate(lists):
        if v is not None:
            grid[i, : len(v)] = v
    spread = pd.DataFrame(grid, index=df.index, columns=[f"rate_{k + 1}" for k in range(width)])
    return pd.concat([out, spread], axis=1)


def flat_table(df: pd.DataFrame) -> pd.DataFrame:
    """The table as every file and stdout CSV holds it: rates spread; other object cells
    holding lists/dicts become JSON text (CSV-safe)."""
    df = spread_rates(df)
    for col in df.columns:
        if df[col].dtype == object:
            sample = next((v for v in df[col] if v is not None), None)
            if isinstance(sample, (list, tuple, dict, np.ndarray)):
                df = df.assign(**{col: [
                    json.dumps(v.tolist() if isinstance(v, np.ndarray) else v) for v in df[col]
                ]})
    return df


def table_writer(df: pd.DataFrame, path: str | Path, option: str = "--out") -> Writer:
    """A writer of `df` flat as CSV or Parquet (by `path`'s suffix) into the file it is given
    (a temp file that `files` renames to `path`)."""
    fmt = table_format(path, option)
    flat = flat_table(df)

    def write(tmp: Path) -> None:
        if fmt == "csv":
            flat.to_csv(tmp, index=False)
        else:
            flat.to_parquet(tmp, index=False)

    return write


def write_table(df: pd.DataFrame, path: str | Path, option: str = "--out") -> Path:
    """Write `df` flat to CSV or Parquet (by suffix), atomically (temp file + rename)."""
    path = Path(path)
    return write_atomic(path, table_writer(df, path, option), option)


def write_json_doc(doc: Any, path: str | Path, option: str = "--out") -> Path:
    """Write a JSON document (tune's serving table, predict's rows) atomically; the path must
    be *.json."""
    path = Path(path)
    if path.suffix.lower() != ".json":
        raise UserInputError(f"{str(path)!r} is not a .json file", where=option,
                             fix="name the output *.json")
    text = json.dumps(doc, indent=2) + "\n"
    return write_atomic(path, lambda tmp: tmp.write_text(text), option)


def read_table(path: str | Path, option: str = "RESULTS") -> pd.DataFrame:
    """Read a CSV/Parquet result table; a missing or unreadable file names the fix."""
    path = Path(path)
    fmt = table_format(path, option)
    if not path.is_file():
        raise UserInputError(f"{str(path)!r} does not exist", where=option,
                             fix="pass the file written by `vegas-sim sweep --out` (or tune/validate)")
    if fmt == "csv":
        check_csv_fields(path, option)
    try:
        df = pd.read_csv(path) if fmt == "csv" else pd.read_parquet(path)
    except Exception as e:  # noqa: BLE001 - pandas/pyarrow raise many types for a corrupt file
        raise UserInputError(f"cannot read {str(path)!r}: {e}", where=option,
                             fix="pass an intact CSV or Parquet result table") from None
    return spread_rates(df)


def check_csv_fields(path: Path, option: str = "RESULTS") -> None:
    """Refuse a CSV whose records do not all have the header's number of fields (a file cut
    mid-line, or a hand edit): pandas would fill the gap with NaN and draw half a row."""
    with path.open(newline="", encoding="utf-8", errors="replace") as f:
        reader = _csv.reader(f)
        header = next(reader, None)
        if header is None:
            return
        for record in reader:
            if record and len(record) != len(header):
                raise UserInputError(
                    f"{str(path)!r} line {reader.line_num} has {len(record)} fields, its "
                    f"header {len(header)}: the file is truncated or was edited by hand",
                    where=option, fix="write the table again with the command that made it, "
                                      "or delete that line")


# Columns a result table holds numbers in (rate_K and ms_<phase> by their prefix).
NUMERIC_COLUMNS = (
    "gamma", "sparsity", "batch", "context", "output_len", "requests", "temperature",
    "throughput_tok_s", "throughput_ci_low", "throughput_ci_high", "speedup_vs_vanilla",
    "speedup_ci_low", "speedup_ci_high", "speedup_vs_baseline", "speedup_vs_baseline_ci_low",
    "speedup_vs_baseline_ci_high", "baseline_gamma", "baseline_sparsity", "baseline_tok_s",
    "vanilla_tok_s", "acceptance_length", "window_acceptance_length", "tpot_ms_p50",
    "tpot_ms_p90", "tpot_ms_p99", "itl_ms_p50", "itl_ms_p90", "itl_ms_p99", "iter_ms",
    "predicted", "measured", "error_pct", "ci_low", "ci_high",
)


def _numeric(col: str) -> bool:
    return col in NUMERIC_COLUMNS or col.startswith(("ms_", "rate_"))


def to_numbers(df: pd.DataFrame, where: str = "RESULTS", first_line: int | None = None
               ) -> pd.DataFrame:
    """`df` with its number columns as numbers; a cell that is text (not empty) is refused,
    naming the column and the row (the CSV line when `first_line`, the line of the first row,
    is given)."""
    out = df.copy()
    for col in [c for c in df.columns if _numeric(str(c))]:
        if pd.api.types.is_numeric_dtype(df[col]) or pd.api.types.is_bool_dtype(df[col]):
            continue
        values = pd.to_numeric(df[col], errors="coerce")
        text = df[col].astype(str).str.strip()
        bad = values.isna() & df[col].notna() & (text != "") & (text.str.lower() != "nan")
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            at = f"line {first_line + i}" if first_line is not None else f"row {i + 1}"
            raise UserInputError(
                f"column {col!r}, {at}, holds {df[col].iloc[i]!r}, not a number",
                where=where, fix=f"correct or delete that row ({col} must hold numbers); "
                                 "or write the table again with the command that made it")
        out[col] = values
    return out


def rate_columns(df: pd.DataFrame) -> list[str]:
    """`rate_1 .. rate_K` present in `df`, in position order."""
    cols = [c for c in df.columns if c.startswith("rate_") and c[5:].isdigit()]
    return sorted(cols, key=lambda c: int(c[5:]))
