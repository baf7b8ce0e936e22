"""`vegas-sim traces subset`: a trace set cut to a range of its rows, for range hold-outs.

Fit on small batches, short contexts, short γ or the outer sparsities, then predict the
configurations that were measured beyond them: `subset_trace_set(SET, OUT, "batch<=16")`
writes a new, finalized set with the latency and acceptance rows that pass, its meta's grid
lists trimmed to the values kept, and its provenance recorded (`subset_of`: the source's path,
date and content hash; `where`: the conditions).

Conditions (comma-separated, all must hold): `col<=V`, `col>=V`, `col<V`, `col>V`, `col==V`,
`col in A|B|C`. Integers take K / M suffixes (32K = 32768). A condition applies to each table
that has the column (latency: phase, method, batch, context, n_query, kv_read, collect_rows;
acceptance: method, gamma, sparsity, budget, context, temperature, workload, request,
iteration, accepted); a column neither table has is refused.

γ upper bounds truncate instead of dropping: an acceptance run traced at γ_t holds every
shorter γ (accepted' = min(accepted, γ), the first γ acceptance probabilities), which is how
the acceptance model itself serves γ < γ_t, so `gamma<=7` keeps the γ 12 traces cut to γ 7.
A truncated point that the source also traced natively at that γ keeps the native rows only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vegas_sim.errors import UserInputError
from vegas_sim.traces.io import TraceSet, TraceSetWriter, load_trace_set
from vegas_sim.traces.merge import _check_output
from vegas_sim.traces.schema import (
    ACCEPTANCE_POINT_KEYS,
    CALIBRATION_KEY,
    ACCEPTANCE_SCHEMA,
    EXPECTED_ROWS_KEY,
    LATENCY_SCHEMA,
)

OPS = ("<=", ">=", "==", "<", ">", "in")
_COND_RE = re.compile(r"^\s*([a-z_]+)\s*(<=|>=|==|<|>|\s+in\s+)\s*(.+?)\s*$")
_NUM_RE = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)([kKmM]?)$")
_SUFFIX = {"": 1, "k": 1024, "m": 1024 * 1024}
_LIST_COLUMNS = ("accept_prob",)  # not comparable
LATENCY_COLUMNS = tuple(LATENCY_SCHEMA.names)
ACCEPTANCE_COLUMNS = tuple(n for n in ACCEPTANCE_SCHEMA.names if n not in _LIST_COLUMNS)
WHERE_OPTION = "--where"
WHERE_HELP = "e.g. 'batch<=16', 'context<=32K', 'gamma<=7', 'sparsity in 0.01|0.2'"


@dataclass(frozen=True)
class Condition:
    """One `column op value(s)` test; values are numbers or strings (method, workload…)."""

    column: str
    op: str
    values: tuple[float | str, ...]

    def mask(self, frame: pd.DataFrame) -> np.ndarray:
        """[len(frame)] bool: the rows that pass."""
        col = frame[self.column]
        if self.op == "in":
            return np.asarray(np.logical_or.reduce(
                [_equal(col, v) for v in self.values] or [np.zeros(len(frame), bool)]))
        v = self.values[0]
        if self.op == "==":
            return _equal(col, v)
        x = col.to_numpy(dtype=float)
        bound = float(v)
        tol = 1e-9 * max(abs(bound), 1.0)  # 0.07 stored as a float32-derived 0.0700000003
        return np.asarray({"<=": x <= bound + tol, ">=": x >= bound - tol,
                           "<": x < bound - tol, ">": x > bound + tol}[self.op])

    def keeps(self, value: Any) -> bool:
        """Whether one grid value passes (for trimming meta's grid lists)."""
        return bool(self.mask(pd.DataFrame({self.column: [value]}))[0])

    def gamma_cap(self) -> int | None:
        """The γ an upper bound on gamma truncates longer traces to (None: no upper bound)."""
        if self.column != "gamma" or self.op not in ("<=", "<"):
            return None
        bound = float(self.values[0])
        cap = math.floor(bound) if self.op == "<=" else math.ceil(bound) - 1
        return cap if cap >= 1 else None

    @property
    def text(self) -> str:
        sep = " in " if self.op == "in" else self.op
        return f"{self.column}{sep}{'|'.join(_fmt(v) for v in self.values)}"


def _fmt(v: float | str) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _equal(col: pd.Series, v: float | str) -> np.ndarray:
    if isinstance(v, str):
        return np.asarray(col.astype(str).to_numpy() == v)
    x = col.to_numpy(dtype=float)
    return np.asarray(np.abs(x - v) <= 1e-9 * max(abs(v), 1.0))


def _value(token: str, column: str, text: str) -> float | str:
    """A number (K / M suffixes allowed) for numeric columns, else the string itself."""
    token = token.strip()
    m = _NUM_RE.match(token)
    if m is not None:
        return float(m.group(1)) * _SUFFIX[m.group(2).lower()]
    if column in ("method", "phase", "workload", "model_weights"):
        return token
    raise UserInputError(f"{token!r} in {text!r} is not a number", where=WHERE_OPTION,
                         fix=f"compare {column} with a number such as 16, 32K or 0.05")


def parse_where(text: str) -> list[Condition]:
    """The conditions of a --where text (see the module docstring)."""
    if not text or not text.strip():
        raise UserInputError("empty condition", where=WHERE_OPTION, fix=f"give one, {WHERE_HELP}")
    known = sorted(set(LATENCY_COLUMNS) | set(ACCEPTANCE_COLUMNS))
    out = []
    for item in text.split(","):
        m = _COND_RE.match(item)
        if m is None:
            raise UserInputError(f"cannot read condition {item.strip()!r}", where=WHERE_OPTION,
                                 fix=f"write column, operator ({', '.join(OPS)}), value: "
                                     f"{WHERE_HELP}")
        column, op, rhs = m.group(1), m.group(2).strip(), m.group(3)
        if column not in known:
            raise UserInputError(f"unknown column {column!r} in {item.strip()!r}",
                                 where=WHERE_OPTION, fix=f"use one of: {', '.join(known)}")
        tokens = rhs.split("|") if op == "in" else [rhs]
        if op != "in" and "|" in rhs:
            raise UserInputError(f"{item.strip()!r}: several values need 'in'",
                                 where=WHERE_OPTION, fix=f"write '{column} in {rhs}'")
        values = tuple(_value(t, column, text) for t in tokens)
        if op in ("<=", ">=", "<", ">") and isinstance(values[0], str):
            raise UserInputError(f"{item.strip()!r}: {column} has no order",
                                 where=WHERE_OPTION, fix=f"use '{column}=={values[0]}' or 'in'")
        out.append(Condition(column, op, values))
    return out


def filter_latency(rows: pd.DataFrame, conditions: list[Condition]) -> pd.DataFrame:
    """The latency rows that pass every condition on a latency column."""
    keep = np.ones(len(rows), dtype=bool)
    for c in conditions:
        if c.column in rows.columns and c.column in LATENCY_COLUMNS:
            keep &= c.mask(rows)
    return rows[keep].reset_index(drop=True)


def filter_acceptance(rows: pd.DataFrame, conditions: list[Condition]) -> pd.DataFrame:
    """The acceptance rows that pass; a γ upper bound truncates longer traces (module doc)."""
    caps = [cap for c in conditions if (cap := c.gamma_cap()) is not None]
    if caps and len(rows):
        rows = _truncate_gamma(rows, min(caps))
    keep = np.ones(len(rows), dtype=bool)
    for c in conditions:
        if c.column in ACCEPTANCE_COLUMNS:
            keep &= c.mask(rows)
    return rows[keep].reset_index(drop=True)


def _truncate_gamma(rows: pd.DataFrame, cap: int) -> pd.DataFrame:
    """Rows traced at γ > cap as γ = cap; dropped where the point was also traced at cap."""
    long = rows["gamma"].to_numpy() > cap
    if not long.any():
        return rows
    keys = [k for k in ACCEPTANCE_POINT_KEYS if k != "gamma"]
    native = {tuple(r) for r in rows.loc[rows["gamma"] == cap, keys].itertuples(index=False)}
    cut = rows[long].copy()
    cut["gamma"] = cap
    cut["accepted"] = np.minimum(cut["accepted"].to_numpy(), cap)
    cut["accept_prob"] = pd.Series([np.asarray(p, dtype=np.float32)[:cap]
                                    for p in cut["accept_prob"]], index=cut.index, dtype=object)
    if native:
        clash = np.array([tuple(r) in native for r in cut[keys].itertuples(index=False)])
        cut = cut[~clash]
    return pd.concat([rows[~long], cut], ignore_index=True)


def _trim_grid(grid: dict[str, Any], conditions: list[Condition],
               acceptance: pd.DataFrame) -> dict[str, Any]:
    """meta's grid with each list of a conditioned column cut to the values that pass (γ: the
    values traced after truncation, when the set has acceptance rows)."""
    out = dict(grid)
    for c in conditions:
        values = out.get(c.column)
        if not isinstance(values, list) or not all(isinstance(v, (int, float)) for v in values):
            continue
        kept = [v for v in values if c.keeps(v)]
        if c.gamma_cap() is not None and len(acceptance):
            kept = sorted({*kept, *(int(g) for g in acceptance["gamma"].unique())})
        out[c.column] = kept
    return out


def _check_left(name: str, before: int, after: int, where: str) -> None:
    if before and not after:
        raise UserInputError(f"no {name} row passes {where!r} (the source has {before})",
                             where=WHERE_OPTION,
                             fix="widen the conditions (`vegas-sim traces show SET` lists the "
                                 "ranges measured)")


def subset_meta(source: TraceSet, where: str, conditions: list[Condition],
                acceptance: pd.DataFrame) -> dict[str, Any]:
    """The subset's meta.json (content hash and parts are the writer's)."""
    meta = {k: v for k, v in source.meta.items()
            if k not in ("content_hash", "parts", EXPECTED_ROWS_KEY, CALIBRATION_KEY)}
    meta["grid"] = _trim_grid(dict(source.meta.get("grid", {})), conditions, acceptance)
    meta["subset_of"] = {"path": str(source.path), "date": source.meta.get("date"),
                         "content_hash": source.meta.get("content_hash")}
    meta["where"] = ",".join(c.text for c in conditions)
    return meta


def subset_trace_set(source: str | Path, out: str | Path, where: str) -> TraceSet:
    """Write the rows of `source` that pass `where` to the new directory `out`; return it."""
    conditions = parse_where(where)
    out = Path(out)
    _check_output(out)
    ts = load_trace_set(source)
    latency = filter_latency(ts.latency, conditions)
    acceptance = filter_acceptance(ts.acceptance, conditions)
    _check_left("latency", len(ts.latency), len(latency), where)
    _check_left("acceptance", len(ts.acceptance), len(acceptance), where)
    meta = subset_meta(ts, where, conditions, acceptance)
    meta[EXPECTED_ROWS_KEY] = {"latency": len(latency), "acceptance": len(acceptance)}
    writer = TraceSetWriter(out, meta)
    if len(latency):
        writer.append_latency(latency)
    if len(acceptance):
        writer.append_acceptance(acceptance)
    return writer.finalize()
