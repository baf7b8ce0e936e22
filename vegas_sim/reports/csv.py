"""Tidy tables on disk: CSV or Parquet chosen by the file suffix.

Result tables (sweep, tune, validate) are flat: one row per configuration, one column per
metric. A list-valued column such as `rates` (per-position acceptance rates, one entry per
draft position) is spread into `rate_1 .. rate_K` columns, with NaN past a row's own γ, so the
CSV opens in any spreadsheet and `read_table` gives back the same columns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vegas_sim.errors import UserInputError
from vegas_sim.files import write_atomic

TABLE_SUFFIXES = (".csv", ".parquet", ".pq")


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


def write_table(df: pd.DataFrame, path: str | Path, option: str = "--out") -> Path:
    """Write `df` flat to CSV or Parquet (by suffix), atomically (temp file + rename)."""
    path = Path(path)
    fmt = table_format(path, option)
    flat = flat_table(df)

    def write(tmp: Path) -> None:
        if fmt == "csv":
            flat.to_csv(tmp, index=False)
        else:
            flat.to_parquet(tmp, index=False)

    return write_atomic(path, write, option)


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
    try:
        df = pd.read_csv(path) if fmt == "csv" else pd.read_parquet(path)
    except Exception as e:  # noqa: BLE001 - pandas/pyarrow raise many types for a corrupt file
        raise UserInputError(f"cannot read {str(path)!r}: {e}", where=option,
                             fix="pass an intact CSV or Parquet result table") from None
    return spread_rates(df)


def rate_columns(df: pd.DataFrame) -> list[str]:
    """`rate_1 .. rate_K` present in `df`, in position order."""
    cols = [c for c in df.columns if c.startswith("rate_") and c[5:].isdigit()]
    return sorted(cols, key=lambda c: int(c[5:]))
