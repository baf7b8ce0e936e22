"""Read, write and validate trace sets (DESIGN.md, "Trace set").

Layout of a trace-set directory::

    meta.json            schema_version, model, gpu, software, date, grid, workload, seeds,
                         content_hash {file: sha256}, parts {table: [part file names]}
    latency.parquet      consolidated rows (schema.LATENCY_SCHEMA)
    acceptance.parquet   consolidated rows (schema.ACCEPTANCE_SCHEMA), may hold 0 rows
    parts/               one parquet file per appended chunk (the source of truth while writing)
    progress.jsonl       one JSON line per finished / skipped grid point (resume)

Writing (`TraceSetWriter`): every append lands in its own part file, written to a hidden temp
file, fsync'd and renamed into place, so an interruption at any moment leaves either the whole
part or nothing. An append given a `key` (the grid point) overwrites that point's part, so a point
that was appended but not yet marked done is simply redone on resume, never duplicated.
`finalize()` concatenates the parts (sorted by name, hence deterministic) into the two
consolidated files, then rewrites meta.json with their hashes and the list of parts it included.
Parts stay on disk: re-running `finalize()` rebuilds the same files, which also repairs a
finalize that was itself interrupted.

Reading (`load_trace_set`): validates meta.json, both files' schemas, every value range and the
content hash. A directory whose parts are newer than its last finalize is *refused* (not silently
finalized in memory: a half-written calibration should not be mistaken for a finished one); the
message says to finish by re-running `vegas-sim calibrate ... --out DIR` (which resumes) or to
call `finalize_trace_set(DIR)`.
A directory without `parts/` (e.g. a packaged set) is read from the consolidated files alone.
Where a directory is expected, the bare name of a packaged set (`vegas_sim/traces/default/
<name>/`, e.g. `qwen3-8b-h200`) also works when no path of that name exists (`trace_set_dir`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from vegas_sim.errors import TraceSetError
from vegas_sim.files import atomic_write, sha256_file, write_json
from vegas_sim.methods import METHODS, PHASES, SPEC_METHODS
from vegas_sim.models import ModelSpec
from vegas_sim.traces.schema import (
    ACCEPTANCE_FILE,
    ACCEPTANCE_POINT_KEYS,
    ACCEPTANCE_SCHEMA,
    DATA_FILES,
    LATENCY_FILE,
    LATENCY_SCHEMA,
    META_FILE,
    META_KEYS,
    SCHEMA_VERSION,
    SCHEMAS,
    WEIGHT_KINDS,
)

PARTS_DIR = "parts"
PROGRESS_FILE = "progress.jsonl"
# Packaged sets (made by `vegas-sim calibrate`); each may be named by its directory's name.
PACKAGED_DIR = Path(__file__).parent / "default"
LATENCY_METHODS: tuple[str, ...] = (*METHODS, "any")  # "any": a method-independent phase
_TABLE_OF_FILE = {LATENCY_FILE: "latency", ACCEPTANCE_FILE: "acceptance"}
_FILE_OF_TABLE = {v: k for k, v in _TABLE_OF_FILE.items()}
_GPU_NUMBERS = ("sm_count", "memory_gb", "copy_bandwidth_gbs", "bf16_tflops")
_FIX_RECALIBRATE = "re-run `vegas-sim calibrate` to regenerate the trace set"


def finalize_command(path: Path) -> str:
    """The command that runs `finalize_trace_set(path)`."""
    return f"vegas-sim traces finalize {shlex.quote(str(path))}"


def _unfinalized_fix(path: Path) -> str:
    return (f"finish the calibration by re-running the same `vegas-sim calibrate ... --out "
            f"{path}` (it resumes where it stopped), or consolidate what is there with "
            f"`{finalize_command(path)}`")


def _hash_mismatch_fix(path: Path) -> str:
    """Restore, rebuild from the parts (only when they are there), or re-calibrate."""
    if not _part_files(path, "latency") and not _part_files(path, "acceptance"):
        return (f"the file changed after it was written: restore it (e.g. from the copy it "
                f"came from), or {_FIX_RECALIBRATE}")
    return ("the file changed after it was written: restore it, or rebuild it from "
            f"{PARTS_DIR}/ (discarding the change) with `{finalize_command(path)}`, or "
            f"{_FIX_RECALIBRATE}")


@dataclass
class TraceSet:
    path: Path
    meta: dict[str, Any]
    latency: pd.DataFrame  # columns of schema.LATENCY_SCHEMA
    acceptance: pd.DataFrame  # columns of schema.ACCEPTANCE_SCHEMA (may be empty)

    @property
    def weights_kind(self) -> str:
        """'real' or 'random'."""
        return str(self.meta["model"]["weights"]["kind"])

    @property
    def name(self) -> str:
        """The directory name, e.g. 'qwen3-8b-h200'."""
        return self.path.name

    @property
    def model_name(self) -> str:
        return str(self.meta["model"]["name"])

    @property
    def model_spec(self) -> ModelSpec:
        return ModelSpec.from_dict(self.meta["model"])

    @property
    def gpu_name(self) -> str:
        return str(self.meta["gpu"]["name"])

    @property
    def synthetic(self) -> bool:
        """True for sets made by traces/synthetic.py (never measured)."""
        return bool(self.meta.get("synthetic", False))

    @property
    def runtime_revision(self) -> str:
        """The calibration runtime's revision (schema.RUNTIME_REVISION); "1" when unrecorded."""
        return str(self.meta.get("software", {}).get("runtime", "1"))

    @property
    def has_real_acceptance(self) -> bool:
        """Real weights and at least one acceptance row: usable by the acceptance model."""
        return self.weights_kind == "real" and len(self.acceptance) > 0


# ============================================================================ small utilities
def content_hash(path: str | Path) -> dict[str, str]:
    """{data file name: sha256} for the data files present in trace-set directory `path`."""
    root = Path(path)
    return {name: sha256_file(root / name) for name in DATA_FILES if (root / name).is_file()}


def _write_parquet_atomic(path: Path, table: pa.Table, durable: bool = True) -> None:
    # zstd: a third smaller than snappy on acceptance rows (the repository carries them)
    atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"),
                 durable=durable)


def _err(problem: str, where: Path | str, fix: str, column: str | None = None) -> TraceSetError:
    loc = f"{where}, column {column!r}" if column else str(where)
    return TraceSetError(problem, where=loc, fix=fix)


# ============================================================================ meta validation
def _meta_err(where: Path, key: str, problem: str, fix: str = _FIX_RECALIBRATE) -> TraceSetError:
    return TraceSetError(problem, where=f"{where}, key {key!r}", fix=fix)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and bool(np.isfinite(x))


def validate_meta(meta: Any, where: Path, *, require_hash: bool = True) -> None:
    """Check meta.json's keys and types; `where` names the file in messages."""
    if not isinstance(meta, dict):
        raise TraceSetError("meta.json must hold a JSON object", where=str(where),
                            fix=_FIX_RECALIBRATE)
    required = [k for k in META_KEYS if require_hash or k != "content_hash"]
    for key in required:
        if key not in meta:
            raise _meta_err(where, key, f"missing required key {key!r} ({META_KEYS[key]})")
    version = meta["schema_version"]
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise _meta_err(
            where, "schema_version",
            f"schema_version is {version!r}; this vegas-sim reads schema {SCHEMA_VERSION}",
            fix="use the vegas-sim version that wrote the set, or re-run `vegas-sim calibrate` "
                "with this one",
        )
    _validate_model_meta(meta["model"], where)
    _validate_gpu_meta(meta["gpu"], where)
    for key, kind in (("software", dict), ("grid", dict), ("seeds", dict), ("workload", list)):
        if not isinstance(meta[key], kind):
            raise _meta_err(where, key, f"{key!r} must be a JSON {kind.__name__}, "
                                        f"got {type(meta[key]).__name__}")
    try:
        dt.datetime.fromisoformat(str(meta["date"]).replace("Z", "+00:00"))
    except ValueError:
        raise _meta_err(where, "date", f"date {meta['date']!r} is not ISO 8601",
                        fix="write e.g. '2026-01-31T12:00:00+00:00'") from None
    if require_hash:
        hashes = meta["content_hash"]
        if not isinstance(hashes, dict) or any(
            not isinstance(hashes.get(f), str) for f in DATA_FILES
        ):
            raise _meta_err(where, "content_hash",
                            f"content_hash must map each of {list(DATA_FILES)} to a sha256 hex",
                            fix="finalize the trace set (TraceSetWriter.finalize) to record it")


def _validate_model_meta(model: Any, where: Path) -> None:
    if not isinstance(model, dict):
        raise _meta_err(where, "model", "'model' must be a JSON object (ModelSpec.to_dict())")
    try:
        ModelSpec.from_dict(model)
    except TypeError as e:
        raise _meta_err(where, "model", f"'model' is not a complete model spec: {e}") from None
    weights = model.get("weights")
    if not isinstance(weights, dict) or "kind" not in weights or "id" not in weights:
        raise _meta_err(where, "model.weights",
                        "'model.weights' must be {'kind': 'real'|'random', 'id': str, ...}")
    if weights["kind"] not in WEIGHT_KINDS:
        raise _meta_err(where, "model.weights.kind",
                        f"weights kind {weights['kind']!r} is not one of {list(WEIGHT_KINDS)}")


def _validate_gpu_meta(gpu: Any, where: Path) -> None:
    if not isinstance(gpu, dict) or not isinstance(gpu.get("name"), str):
        raise _meta_err(where, "gpu", "'gpu' must be a JSON object with a string 'name'")
    for key in _GPU_NUMBERS:
        if not _is_number(gpu.get(key)) or gpu[key] <= 0:
            raise _meta_err(where, f"gpu.{key}",
                            f"gpu.{key} must be a positive number, got {gpu.get(key)!r}")


# ============================================================================ table validation
def _is_int(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t))


def _is_float(t: pa.DataType) -> bool:
    return bool(pa.types.is_floating(t))


def _is_str(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _compatible(got: pa.DataType, want: pa.DataType) -> bool:
    """Types we can cast to the schema's without losing meaning (widening, list of floats)."""
    if got.equals(want):
        return True
    if _is_int(want):
        return _is_int(got)  # range checked by a safe cast
    if _is_float(want):
        return _is_float(got) or _is_int(got)
    if _is_str(want):
        return _is_str(got)
    if pa.types.is_list(want) or pa.types.is_large_list(want):
        if pa.types.is_list(got) or pa.types.is_large_list(got):
            return _is_float(got.value_type) or _is_int(got.value_type)
        return False
    return False


def conform_table(table: pa.Table, schema: pa.Schema, where: Path | str) -> pa.Table:
    """Check columns and dtypes against `schema`; cast compatible types; return in schema order."""
    names = set(table.column_names)
    for field in schema:
        if field.name not in names:
            raise _err(f"missing column {field.name!r} (expected {field.type})", where,
                       "write every column of the schema (vegas_sim/traces/schema.py)",
                       field.name)
    extra = sorted(names - set(schema.names))
    if extra:
        raise _err(f"unexpected column(s) {extra}", where,
                   "drop them: schema v1 has exactly the columns in vegas_sim/traces/schema.py",
                   extra[0])
    columns = []
    for field in schema:
        col = table.column(field.name)
        if not _compatible(col.type, field.type):
            raise _err(f"wrong dtype {col.type}, expected {field.type}", where,
                       f"store {field.name!r} as {field.type}", field.name)
        if col.null_count:
            first = int(np.flatnonzero(pc.is_null(col).to_numpy(zero_copy_only=False))[0])
            raise _err(f"{col.null_count} null (missing or NaN) value(s), first at row {first}",
                       where,
                       "every cell must hold a value", field.name)
        try:
            col = col.cast(field.type, safe=not pa.types.is_list(field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise _err(f"cannot convert {col.type} to {field.type} without loss: {e}", where,
                       f"store {field.name!r} as {field.type}", field.name) from None
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=schema)


def _np(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy()


def _first_bad(mask: np.ndarray, values: np.ndarray) -> str:
    idx = np.flatnonzero(mask)
    first = values[idx[0]]
    first = first.item() if hasattr(first, "item") else first
    return f"{idx.size} row(s), first at row {int(idx[0])} (value {first!r})"


def _require(mask_bad: np.ndarray, values: np.ndarray, problem: str, where: Path | str,
             column: str, fix: str) -> None:
    if mask_bad.any():
        raise _err(f"{problem}: {_first_bad(mask_bad, values)}", where, fix, column)


def _check_members(table: pa.Table, column: str, allowed: tuple[str, ...], where: Path | str,
                   what: str) -> None:
    values = np.asarray(_np(table, column), dtype=object)
    bad = ~pd.Series(values).isin(allowed).to_numpy()
    _require(bad, values, f"unknown {what}", where, column, f"use one of: {', '.join(allowed)}")


def validate_latency(table: pa.Table, where: Path | str) -> pa.Table:
    """Schema, dtypes and value ranges of latency rows; returns the table cast to the schema."""
    table = conform_table(table, LATENCY_SCHEMA, where)
    _check_members(table, "phase", PHASES, where, "phase")
    _check_members(table, "method", LATENCY_METHODS, where, "method")
    for col in ("batch", "context", "n_query", "n"):
        v = _np(table, col)
        _require(v < 1, v, f"{col} must be >= 1", where, col, f"record {col} >= 1")
    for col in ("kv_read", "collect_rows"):
        v = _np(table, col)
        _require(v < 0, v, f"{col} must be >= 0", where, col, f"record {col} >= 0")
    ms = {c: _np(table, c) for c in ("ms_p10", "ms_median", "ms_p90")}
    for col, v in ms.items():
        _require(~np.isfinite(v), v, "latency is NaN or infinite", where, col,
                 "drop the point or re-measure it")
        _require(v < 0, v, "latency is negative", where, col, "re-measure the point")
    order_bad = (ms["ms_p10"] > ms["ms_median"]) | (ms["ms_median"] > ms["ms_p90"])
    _require(order_bad, ms["ms_median"], "ms_p10 <= ms_median <= ms_p90 violated", where,
             "ms_median", "compute the three statistics from the same timings")
    return table


def validate_acceptance(table: pa.Table, where: Path | str, weights_kind: str | None) -> pa.Table:
    """Schema, dtypes and ranges of acceptance rows; `weights_kind` is meta's (None: skip)."""
    table = conform_table(table, ACCEPTANCE_SCHEMA, where)
    _check_members(table, "method", SPEC_METHODS, where, "(or non-drafting) method")
    gamma = _np(table, "gamma")
    _require(gamma < 1, gamma, "gamma must be >= 1", where, "gamma", "record gamma >= 1")
    acc = _np(table, "accepted")
    _require((acc < 0) | (acc > gamma), acc, "accepted outside [0, gamma]", where, "accepted",
             "record accepted drafts (0..gamma), without the bonus token")
    s = _np(table, "sparsity")
    _require(~((s > 0) & (s <= 1)), s, "sparsity outside (0, 1]", where, "sparsity",
             "record the sparsity ratio as a fraction, e.g. 0.07")
    temp = _np(table, "temperature")
    _require(~(temp >= 0) | ~np.isfinite(temp), temp, "temperature < 0 or not finite", where,
             "temperature", "record 0 for greedy, else the sampling temperature")
    for col, lo in (("budget", 0), ("context", 1), ("request", 0), ("iteration", 0)):
        v = _np(table, col)
        _require(v < lo, v, f"{col} must be >= {lo}", where, col, f"record {col} >= {lo}")
    _check_accept_prob(table, gamma, where)
    _check_members(table, "model_weights", WEIGHT_KINDS, where, "weights kind")
    if weights_kind is not None:
        mw = np.asarray(_np(table, "model_weights"), dtype=object)
        _require(mw != weights_kind, mw,
                 f"model_weights differs from meta.json's model.weights.kind {weights_kind!r}",
                 where, "model_weights", "label every row with the weights the run used")
    return table


def _check_accept_prob(table: pa.Table, gamma: np.ndarray, where: Path | str) -> None:
    col = table.column("accept_prob").combine_chunks()
    lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
    _require(lengths != gamma, lengths, "accept_prob length != gamma", where, "accept_prob",
             "record one probability per drafted position")
    flat = pc.list_flatten(col).to_numpy(zero_copy_only=False).astype(np.float64)
    bad = ~((flat >= 0) & (flat <= 1))  # NaN fails both comparisons
    if bad.any():
        row = np.repeat(np.arange(len(lengths)), lengths)[np.flatnonzero(bad)[0]]
        raise _err(f"accept_prob value outside [0, 1] or NaN: {int(bad.sum())} value(s), "
                   f"first in row {int(row)} ({flat[bad][0]!r})", where,
                   "record min(1, p/q) per position (1/0 under greedy)", "accept_prob")


def _validate_file_table(name: str, table: pa.Table, where: Path | str,
                         weights_kind: str | None) -> pa.Table:
    if name == LATENCY_FILE:
        return validate_latency(table, where)
    return validate_acceptance(table, where, weights_kind)


def _to_pandas(table: pa.Table) -> pd.DataFrame:
    return table.to_pandas()


def _table_from_frame(rows: pd.DataFrame, where: str) -> pa.Table:
    if not isinstance(rows, pd.DataFrame):
        raise TraceSetError(f"expected a pandas DataFrame, got {type(rows).__name__}",
                            where=where, fix="pass the rows as a DataFrame")
    try:
        return pa.Table.from_pandas(rows, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise TraceSetError(f"rows cannot be converted to Arrow: {e}", where=where,
                            fix="use the column types of vegas_sim/traces/schema.py") from None


# ============================================================================ reading
def _read_parquet(path: Path) -> pa.Table:
    if not path.is_file():
        raise TraceSetError("file is missing", where=str(path),
                            fix=f"a trace set holds {META_FILE}, {LATENCY_FILE} and "
                                f"{ACCEPTANCE_FILE}; {_FIX_RECALIBRATE}")
    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise TraceSetError(f"unreadable parquet: {e}", where=str(path),
                            fix=f"the file is corrupt or not parquet; {_FIX_RECALIBRATE}") from None


def _read_meta(path: Path, *, require_hash: bool = True) -> dict[str, Any]:
    meta_path = path / META_FILE
    if not meta_path.is_file():
        raise TraceSetError("meta.json is missing", where=str(meta_path),
                            fix=f"point at a trace-set directory; {_FIX_RECALIBRATE}")
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceSetError(f"not valid JSON: {e}", where=str(meta_path),
                            fix=f"restore the file; {_FIX_RECALIBRATE}") from None
    validate_meta(meta, meta_path, require_hash=require_hash)
    return dict(meta)


def _part_files(path: Path, table: str) -> list[Path]:
    """Committed part files of `table` ('latency' | 'acceptance'), sorted by name."""
    parts = path / PARTS_DIR
    if not parts.is_dir():
        return []
    return sorted(p for p in parts.glob(f"{table}-*.parquet") if not p.name.startswith("."))


def unfinalized_parts(path: str | Path) -> list[str]:
    """Part files written after the last finalize (empty for a finished set)."""
    root = Path(path)
    try:
        meta = json.loads((root / META_FILE).read_text())
        recorded = meta.get("parts", {}) if isinstance(meta, dict) else {}
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        recorded = {}
    out = []
    for table in _FILE_OF_TABLE:
        known = set(recorded.get(table, []) if isinstance(recorded, dict) else [])
        out += [p.name for p in _part_files(root, table) if p.name not in known]
    return out


# ============================================================================ locating
def packaged_sets(packaged_dir: Path | None = None) -> list[Path]:
    """Directories of the packaged trace sets (those holding a meta.json), sorted by name."""
    root = PACKAGED_DIR if packaged_dir is None else packaged_dir
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / META_FILE).is_file())


def _is_bare_name(path: Path) -> bool:
    """'qwen3-8b-h200', not 'traces/x', '/x', '.' or '..' ('./x' is 'x' to pathlib and click,
    but a path that exists is never looked up)."""
    return len(path.parts) == 1 and path.name not in ("", ".", "..") and not path.is_absolute()


def trace_set_dir(path: str | Path, packaged_dir: Path | None = None) -> Path:
    """The directory `path` names: itself when it exists (paths always win), else, for a bare
    name, the packaged set of that name if there is one, else `path` unchanged (the loader
    then says what is wrong). `packaged_dir`: where packaged sets live (tests move it)."""
    given = Path(path)
    if given.exists() or given.is_symlink() or not _is_bare_name(given):
        return given
    packaged = {p.name: p for p in packaged_sets(packaged_dir)}
    return packaged.get(given.name, given)


def _not_a_set_dir(root: Path, packaged_dir: Path | None) -> TraceSetError:
    """Why `root` (not a directory) cannot be a trace set, and what to pass instead."""
    names = ", ".join(p.name for p in packaged_sets(packaged_dir)) or "none"
    if root.is_file():
        inside = root.name == META_FILE or root.name in DATA_FILES
        return TraceSetError(
            "is a file, not a trace-set directory", where=str(root),
            fix=f"pass the directory that holds it, {root.parent}" if inside else
                f"pass the directory that holds {META_FILE}, {LATENCY_FILE} and "
                f"{ACCEPTANCE_FILE} (made by `vegas-sim calibrate`), or the name of a "
                f"packaged set ({names})")
    if root.exists():
        return TraceSetError("is not a directory (a trace set is a directory)",
                             where=str(root), fix="pass a trace-set directory")
    if _is_bare_name(root):
        return TraceSetError(
            "no such directory, and no packaged trace set has this name", where=str(root),
            fix=f"name a packaged set ({names}; `vegas-sim traces list`), or pass a "
                "directory made by `vegas-sim calibrate`")
    return TraceSetError("trace-set directory does not exist", where=str(root),
                         fix="pass a directory made by `vegas-sim calibrate`, or the name of a "
                             f"packaged set ({names}; `vegas-sim traces list`)")


def _load(path: str | Path, passed: list[str], packaged_dir: Path | None = None) -> TraceSet:
    """Validation in order; each step that succeeds appends a line to `passed`."""
    root = trace_set_dir(path, packaged_dir)
    if not root.is_dir():
        raise _not_a_set_dir(root, packaged_dir)
    meta = _read_meta(root, require_hash=False)
    pending = unfinalized_parts(root)
    if pending:
        raise TraceSetError(
            f"unfinished trace set: {len(pending)} part file(s) in {PARTS_DIR}/ are newer than "
            f"the last finalize (e.g. {pending[0]})", where=str(root),
            fix=_unfinalized_fix(root))
    validate_meta(meta, root / META_FILE)
    passed.append(f"{META_FILE}: keys present, schema_version {SCHEMA_VERSION}, model and gpu "
                  f"well-formed")
    kind = str(meta["model"]["weights"]["kind"])
    frames: dict[str, pd.DataFrame] = {}
    for name in DATA_FILES:
        file = root / name
        table = _validate_file_table(name, _read_parquet(file), file, kind)
        passed.append(f"{name}: {table.num_rows} rows, columns and dtypes match schema v1, "
                      f"value ranges valid")
        frames[name] = _to_pandas(table)
    for name in DATA_FILES:
        actual, recorded = sha256_file(root / name), meta["content_hash"][name]
        if actual != recorded:
            raise TraceSetError(
                f"content hash mismatch: sha256 is {actual[:12]}…, meta.json records "
                f"{recorded[:12]}…", where=f"{root / name} (meta.json key 'content_hash')",
                fix=_hash_mismatch_fix(root))
    passed.append("content hash matches meta.json for " + ", ".join(DATA_FILES))
    return TraceSet(root, meta, frames[LATENCY_FILE], frames[ACCEPTANCE_FILE])


def load_trace_set(path: str | Path, *, packaged_dir: Path | None = None) -> TraceSet:
    """Read and fully validate a trace set; raises TraceSetError naming file, column and fix.

    `path`: a trace-set directory, or the bare name of a packaged set when no such path
    exists (`trace_set_dir`). Refuses a set with parts newer than its last finalize (see the
    module docstring).
    """
    return _load(path, [], packaged_dir)


def check(path: str | Path) -> list[str]:
    """The checks a trace set passes (for `vegas-sim traces check`); raises on the first failure.
    `path` as for `load_trace_set`."""
    passed: list[str] = []
    _load(path, passed)
    return passed


# ============================================================================ writing
def _slug(key: str) -> str:
    """A file-name-safe, collision-free name for a grid-point key."""
    readable = re.sub(r"[^A-Za-z0-9_.=-]+", "_", key)[:60]
    return f"{readable}-{hashlib.sha1(key.encode()).hexdigest()[:10]}"


class TraceSetWriter:
    """Creates or resumes a trace set directory; appends rows atomically per grid point.

    `meta` holds every key of schema.META_KEYS except `content_hash` (filled by `finalize`);
    `schema_version` defaults to the current one. Resuming an existing directory keeps its
    meta.json and requires the same model (all of `meta['model']`, weights included) and the same
    GPU name; anything else raises TraceSetError.

        w = TraceSetWriter(out, meta)
        for point in grid:
            if point.key in w.done_points(): continue
            w.append_latency(rows, key=point.key); w.mark_done(point.key)
        w.finalize()
    """

    def __init__(self, path: str | Path, meta: dict[str, Any], *, durable: bool = True) -> None:
        self.path = Path(path)
        self.durable = durable  # False: skip fsyncs (tests); writes stay atomic
        new_meta = {"schema_version": SCHEMA_VERSION, **meta}
        new_meta.pop("content_hash", None)
        validate_meta(new_meta, self.path / META_FILE, require_hash=False)
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / PARTS_DIR).mkdir(exist_ok=True)
        if (self.path / META_FILE).exists():
            self.meta = self._resume(new_meta)
        else:
            self.meta = new_meta
            write_json(self.path / META_FILE, self.meta, durable=durable)
        # Unkeyed parts are numbered after the highest number on disk (never reused).
        numbers = [int(m.group(1)) for t in _FILE_OF_TABLE for p in _part_files(self.path, t)
                   if (m := re.search(r"-(\d{6})(?:-base)?\.parquet$", p.name))]
        self._seq = max(numbers, default=0)

    @property
    def weights_kind(self) -> str:
        return str(self.meta["model"]["weights"]["kind"])

    def _resume(self, new_meta: dict[str, Any]) -> dict[str, Any]:
        meta_path = self.path / META_FILE
        old = _read_meta(self.path, require_hash=False)
        if old["model"] != new_meta["model"]:
            raise TraceSetError(
                f"resuming with a different model: directory has {old['model'].get('name')!r} "
                f"(weights {old['model'].get('weights')}), this run has "
                f"{new_meta['model'].get('name')!r} (weights {new_meta['model'].get('weights')})",
                where=f"{meta_path}, key 'model'",
                fix="write to a new directory, or resume with the same model and weights")
        if old["gpu"]["name"] != new_meta["gpu"]["name"]:
            raise TraceSetError(
                f"resuming on a different GPU: directory has {old['gpu']['name']!r}, this run "
                f"has {new_meta['gpu']['name']!r}", where=f"{meta_path}, key 'gpu.name'",
                fix="write to a new directory, or resume on the same GPU model")
        self._adopt_consolidated(old)
        return old

    def _adopt_consolidated(self, meta: dict[str, Any]) -> None:
        """A finalized set without its parts (e.g. copied without parts/) becomes a base part,
        so that parts stay the single source of truth for the next finalize."""
        for name, table in _TABLE_OF_FILE.items():
            recorded = set(meta.get("parts", {}).get(table, []))
            present = {p.name for p in _part_files(self.path, table)}
            file = self.path / name
            if not file.is_file() or recorded & present:
                continue
            data = _read_parquet(file)
            if data.num_rows == 0:
                continue
            expected = meta.get("content_hash", {}).get(name)
            if expected is not None and sha256_file(file) != expected:
                raise TraceSetError(
                    "content hash mismatch: cannot resume from a modified file",
                    where=f"{file} (meta.json key 'content_hash')",
                    fix="restore the file or write to a new directory")
            base = self.path / PARTS_DIR / f"{table}-000000-base.parquet"
            _write_parquet_atomic(base, data, self.durable)

    # ------------------------------------------------------------------ appends
    def _part_path(self, table: str, key: str | None) -> Path:
        if key is not None:
            return self.path / PARTS_DIR / f"{table}-k-{_slug(key)}.parquet"
        self._seq += 1
        return self.path / PARTS_DIR / f"{table}-{self._seq:06d}.parquet"

    def append_latency(self, rows: pd.DataFrame, key: str | None = None) -> Path:
        """Validate and write latency rows as one part; with `key`, replaces that key's part."""
        where = f"{self.path / PARTS_DIR} (latency rows)"
        table = validate_latency(_table_from_frame(rows, where), where)
        return self._write_part("latency", table, key)

    def append_acceptance(self, rows: pd.DataFrame, key: str | None = None) -> Path:
        """Validate and write acceptance rows as one part; with `key`, replaces that key's part."""
        where = f"{self.path / PARTS_DIR} (acceptance rows)"
        table = validate_acceptance(_table_from_frame(rows, where), where, self.weights_kind)
        return self._write_part("acceptance", table, key)

    def _write_part(self, table_name: str, table: pa.Table, key: str | None) -> Path:
        part = self._part_path(table_name, key)
        _write_parquet_atomic(part, table, self.durable)
        return part

    # ------------------------------------------------------------------ progress
    def _progress_lines(self) -> Iterator[dict[str, Any]]:
        file = self.path / PROGRESS_FILE
        if not file.is_file():
            return
        lines = file.read_text().splitlines()
        for line in lines:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line torn by an interruption: that point was not marked done
            if isinstance(rec, dict) and "key" in rec:
                yield rec

    def progress(self) -> dict[str, dict[str, Any]]:
        """Last record per grid-point key: {'key', 'status', 'detail', 'time'}."""
        return {str(rec["key"]): rec for rec in self._progress_lines()}

    def done_points(self) -> set[str]:
        """Keys of grid points already recorded (for resume), whatever their status."""
        return set(self.progress())

    def mark_done(self, key: str, status: str = "ok", detail: str = "") -> None:
        """Record a finished (or skipped, e.g. 'oom') grid point; fsync'd before returning."""
        rec = {"key": key, "status": status, "detail": detail,
               "time": dt.datetime.now(dt.timezone.utc).isoformat()}
        file = self.path / PROGRESS_FILE
        with open(file, "a+b") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() > 0:  # repair a torn last line so this record starts on its own line
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    f.write(b"\n")
            f.write((json.dumps(rec, sort_keys=True) + "\n").encode())
            f.flush()
            if self.durable:
                os.fsync(f.fileno())

    # ------------------------------------------------------------------ finalize
    def finalize(self) -> TraceSet:
        """Concatenate the parts into latency.parquet / acceptance.parquet, record their hashes
        in meta.json, and return the validated set. Idempotent; safe to re-run after a crash."""
        included: dict[str, list[str]] = {}
        for name, table_name in _TABLE_OF_FILE.items():
            parts = _part_files(self.path, table_name)
            tables = [_validate_file_table(name, _read_parquet(p), p, self.weights_kind)
                      for p in parts]
            schema = SCHEMAS[name]
            merged = pa.concat_tables(tables) if tables else schema.empty_table()
            _write_parquet_atomic(self.path / name, merged, self.durable)
            included[table_name] = [p.name for p in parts]
        self.meta = {**self.meta, "content_hash": content_hash(self.path), "parts": included}
        write_json(self.path / META_FILE, self.meta, durable=self.durable)
        return load_trace_set(self.path)


def finalize_trace_set(path: str | Path) -> TraceSet:
    """Finalize an existing (possibly interrupted) trace-set directory from its parts."""
    root = Path(path)
    meta = _read_meta(root, require_hash=False)
    return TraceSetWriter(root, meta).finalize()


# ============================================================================ summaries
def _range(df: pd.DataFrame, col: str) -> list[Any] | None:
    if df.empty:
        return None
    return [df[col].min().item(), df[col].max().item()]


def _sorted_unique(df: pd.DataFrame, col: str) -> list[Any]:
    return sorted(v.item() if hasattr(v, "item") else v for v in df[col].unique())


def summarize(trace_set: TraceSet) -> dict[str, Any]:
    """What a trace set covers (for `vegas-sim traces show`); JSON-serialisable."""
    meta, lat, acc = trace_set.meta, trace_set.latency, trace_set.acceptance
    model, gpu, weights = meta["model"], meta["gpu"], meta["model"]["weights"]
    return {
        "path": str(trace_set.path),
        "synthetic": trace_set.synthetic,
        "model": {"name": model["name"], "architecture": model["architecture"],
                  "n_layers": model["n_layers"], "weights_kind": weights["kind"],
                  "weights_id": weights["id"]},
        "gpu": {k: gpu.get(k) for k in ("name", *_GPU_NUMBERS)},
        "date": meta["date"],
        "software": meta["software"],
        "grid": meta["grid"],
        "latency": {
            "rows": len(lat), "methods": _sorted_unique(lat, "method"),
            "phases": _sorted_unique(lat, "phase"), "batch": _range(lat, "batch"),
            "context": _range(lat, "context"), "n_query": _range(lat, "n_query"),
        },
        "acceptance": {
            "rows": len(acc), "methods": _sorted_unique(acc, "method"),
            "gamma": _range(acc, "gamma"), "sparsity": _range(acc, "sparsity"),
            "context": _range(acc, "context"), "workloads": _sorted_unique(acc, "workload"),
            "temperatures": _sorted_unique(acc, "temperature"),
            "requests": int(acc.groupby(["method", "gamma", "sparsity", "workload",
                                         "temperature", "request"]).ngroups) if len(acc) else 0,
        },
    }


def _fmt_range(r: list[Any] | None) -> str:
    if r is None:
        return "-"
    return f"{r[0]}" if r[0] == r[1] else f"{r[0]} .. {r[1]}"


def _num(value: Any) -> str:
    """Measured numbers to 4 significant digits (they are not more precise than that)."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def format_summary(d: dict[str, Any]) -> str:
    """Human-readable text of `summarize`'s dict."""
    m, g, lat, acc = d["model"], d["gpu"], d["latency"], d["acceptance"]
    lines = [f"trace set {d['path']}"]
    if d["synthetic"]:
        lines.append("  SYNTHETIC: generated by a formula, not measured on a GPU")
    lines += [
        (f"  model     {m['name']} ({m['architecture']}, {m['n_layers']} layers), "
        f"{m['weights_kind']} weights ({m['weights_id']})"),
        (f"  gpu       {g['name']}: copy {_num(g['copy_bandwidth_gbs'])} GB/s, bf16 "
        f"{_num(g['bf16_tflops'])} TFLOP/s measured, {g['sm_count']} SMs, "
        f"{_num(g['memory_gb'])} GB"),
        f"  date      {d['date']}",
        "  software  " + ", ".join(f"{k} {v}" for k, v in sorted(d["software"].items())),
        f"  latency   {lat['rows']} rows; methods {', '.join(lat['methods']) or '-'}",
        f"            phases {', '.join(lat['phases']) or '-'}",
        (f"            batch {_fmt_range(lat['batch'])}, context {_fmt_range(lat['context'])}, "
        f"n_query {_fmt_range(lat['n_query'])}"),
    ]
    if acc["rows"] == 0:
        lines.append("  acceptance  none (latency-only set)")
    else:
        note = "" if m["weights_kind"] == "real" else "  [random weights: not usable]"
        lines += [
            (f"  acceptance {acc['rows']} rows, {acc['requests']} requests; "
            f"methods {', '.join(acc['methods'])}{note}"),
            (f"            gamma {_fmt_range(acc['gamma'])}, sparsity "
            f"{_fmt_range(acc['sparsity'])}, context {_fmt_range(acc['context'])}"),
            (f"            workloads {', '.join(acc['workloads'])}; temperatures "
            f"{', '.join(str(t) for t in acc['temperatures'])}"),
        ]
    return "\n".join(lines) + "\n"


def acceptance_summary(acc: pd.DataFrame, at_gamma: int = 6) -> list[dict[str, Any]]:
    """Mean acceptance length (1 + accepted) per (method, γ, sparsity, temperature, workload),
    also truncated to γ = `at_gamma` when traced at γ >= it (the run log's headline)."""
    out: list[dict[str, Any]] = []
    if acc.empty:
        return out
    keys = list(ACCEPTANCE_POINT_KEYS)
    for k, g in acc.groupby(keys, sort=True):
        rec: dict[str, Any] = {c: (v.item() if hasattr(v, "item") else v) for c, v in zip(keys, k)}
        rec["rows"] = len(g)
        rec["acceptance_length"] = float(g["accepted"].mean() + 1)
        if rec["gamma"] >= at_gamma:
            rec[f"acceptance_length_gamma{at_gamma}"] = float(
                np.minimum(g["accepted"].to_numpy(), at_gamma).mean() + 1)
        out.append(rec)
    return out


def require_real_acceptance(trace_set: TraceSet) -> None:
    """Raise TraceSetError unless `trace_set` has acceptance rows from real weights."""
    if trace_set.weights_kind != "real":
        raise TraceSetError(
            "random-weight model's acceptance is meaningless",
            where=f"{trace_set.path / META_FILE}, key 'model.weights.kind'",
            fix="calibrate with --weights real for acceptance (random weights are for latency)")
    if len(trace_set.acceptance) == 0:
        raise TraceSetError(
            "latency-only trace set: no acceptance rows",
            where=str(trace_set.path / ACCEPTANCE_FILE),
            fix="calibrate a real-weight model with acceptance, or use a packaged one")
