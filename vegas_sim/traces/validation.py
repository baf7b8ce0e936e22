"""Validation of a trace set's contents: meta.json, and both tables' schemas, types and value
ranges. Every error is a TraceSetError naming the file, the column and the fix."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from vegas_sim.errors import TraceSetError, UserInputError
from vegas_sim.files import sha256_file
from vegas_sim.methods import PHASES, SPEC_METHODS
from vegas_sim.models import ModelSpec, check_tensor_parallel
from vegas_sim.traces.schema import (
    ACCEPTANCE_SCHEMA,
    CALIBRATION_FIELDS,
    CALIBRATION_KEY,
    DATA_FILES,
    EXPECTED_ROWS_KEY,
    LATENCY_FILE,
    LATENCY_METHODS,
    LATENCY_DEFAULTS,
    UNRECORDED_TEMPERATURE,
    LATENCY_SCHEMA,
    META_KEYS,
    MODEL_CHOICES,
    MODEL_FIELDS,
    MODEL_REQUIRED,
    GRID_FIELDS,
    Field,
    SCHEMA_VERSION,
    TP_BACKENDS,
    TP_FIELDS,
    WEIGHT_KINDS,
)

GPU_NUMBERS = ("sm_count", "memory_gb", "copy_bandwidth_gbs", "bf16_tflops")


FIX_RECALIBRATE = "re-run `vegas-sim calibrate` to regenerate the trace set"


DRAFT_TAIL_MAX = 16  # drafts a step can have written before it: verify takes <= 16 rows

def content_hash(path: str | Path) -> dict[str, str]:
    """{data file name: sha256} for the data files present in trace-set directory `path`."""
    root = Path(path)
    return {name: sha256_file(root / name) for name in DATA_FILES if (root / name).is_file()}


def _err(problem: str, where: Path | str, fix: str, column: str | None = None) -> TraceSetError:
    loc = f"{where}, column {column!r}" if column else str(where)
    return TraceSetError(problem, where=loc, fix=fix)


# ============================================================================ meta validation
def _meta_err(where: Path, key: str, problem: str, fix: str = FIX_RECALIBRATE) -> TraceSetError:
    return TraceSetError(problem, where=f"{where}, key {key!r}", fix=fix)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and bool(np.isfinite(x))


def validate_meta(meta: Any, where: Path, *, require_hash: bool = True) -> None:
    """Check meta.json's keys and types; `where` names the file in messages."""
    if not isinstance(meta, dict):
        raise TraceSetError("meta.json must hold a JSON object", where=str(where),
                            fix=FIX_RECALIBRATE)
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
    _validate_claims(meta, where)
    _validate_tensor_parallel(meta.get("tensor_parallel"), where)
    _validate_calibration(meta.get(CALIBRATION_KEY), where)
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


def _validate_claims(meta: dict[str, Any], where: Path) -> None:
    """The grid's typed keys, the workload names, and the row counts a writer expects."""
    check_fields(meta["grid"], GRID_FIELDS, where, "grid")
    if not _kind_ok(meta["workload"], "str_list"):
        raise _meta_err(where, "workload",
                        f"workload is {meta['workload']!r}; it must be a list of names")
    expected = meta.get(EXPECTED_ROWS_KEY)
    if expected is not None:
        rule = Field("int", 0)
        if not isinstance(expected, dict):
            raise _meta_err(where, EXPECTED_ROWS_KEY,
                            f"{EXPECTED_ROWS_KEY} must map 'latency' and 'acceptance' to row "
                            "counts")
        check_fields(expected, {"latency": rule, "acceptance": rule}, where, EXPECTED_ROWS_KEY)


def _validate_tensor_parallel(tp: Any, where: Path) -> None:
    """meta.json's optional `tensor_parallel`: {size >= 1, backend nccl|gloo, interconnect}."""
    if tp is None:
        return
    if not isinstance(tp, dict) or set(TP_FIELDS) - set(tp):
        raise _meta_err(where, "tensor_parallel", f"tensor_parallel is {tp!r}; it must hold "
                        f"{', '.join(TP_FIELDS)}")
    check_fields(tp, TP_FIELDS, where, "tensor_parallel")
    if tp["backend"] not in TP_BACKENDS:
        raise _meta_err(where, "tensor_parallel",
                        f"tensor_parallel.backend is {tp['backend']!r}; it must be one of "
                        f"{', '.join(TP_BACKENDS)}")


def _validate_calibration(cal: Any, where: Path) -> None:
    """meta.json's optional `acceptance_calibration`: {context_trend_sd_scale >= 1, from}."""
    if cal is None:
        return
    if not isinstance(cal, dict) or set(CALIBRATION_FIELDS) - set(cal):
        raise _meta_err(where, CALIBRATION_KEY, f"{CALIBRATION_KEY} is {cal!r}; it must hold "
                        f"{', '.join(CALIBRATION_FIELDS)}",
                        fix="re-run `vegas-sim traces trend-holdout SET --write-scale`, "
                            "or delete the key (the default scale then applies)")
    check_fields(cal, CALIBRATION_FIELDS, where, CALIBRATION_KEY)


def _kind_ok(value: Any, kind: str) -> bool:
    """`value` is of `Field.kind` (a JSON bool is not an int, a number is finite)."""
    if kind.endswith("_list"):
        return isinstance(value, list) and all(_kind_ok(v, kind[:-5]) for v in value)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return _is_number(value)
    if kind == "object":
        return value is None or isinstance(value, (dict, list))
    return isinstance(value, {"bool": bool, "str": str}[kind])


_KIND_TEXT = {"int": "an integer", "number": "a finite number", "bool": "true or false",
              "str": "a string", "object": "a JSON object or null"}


def _kind_text(rule: Field) -> str:
    kind = rule.kind
    if kind.endswith("_list"):
        text = f"a list of {_KIND_TEXT[kind[:-5]].removeprefix('an ').removeprefix('a ')}s"
    else:
        text = _KIND_TEXT[kind]
    if rule.low is not None:
        text += f" >= {rule.low:g}"
    if rule.above is not None:
        text += f" > {rule.above:g}"
    return text


def _in_bounds(value: Any, rule: Field) -> bool:
    values = value if isinstance(value, list) else [value]
    return all((rule.low is None or v >= rule.low) and (rule.above is None or v > rule.above)
               for v in values)


def check_fields(obj: dict[str, Any], rules: dict[str, Field], where: Path,
                 prefix: str) -> None:
    """Each key of `obj` that `rules` names holds its kind within its bounds
    (schema.MODEL_FIELDS, schema.GRID_FIELDS); the first that does not is a TraceSetError
    naming the key, the value and what it must be."""
    for key, rule in rules.items():
        if key not in obj:
            continue
        value = obj[key]
        if not _kind_ok(value, rule.kind) or (rule.kind not in ("bool", "str", "object")
                                              and not _in_bounds(value, rule)):
            raise _meta_err(where, f"{prefix}.{key}",
                            f"{prefix}.{key} is {value!r}; it must be {_kind_text(rule)}")
        allowed = MODEL_CHOICES.get(key) if prefix == "model" else None
        if allowed is not None and value not in allowed:
            raise _meta_err(where, f"{prefix}.{key}",
                            f"{prefix}.{key} is {value!r}; it must be one of {list(allowed)}")


def _validate_model_meta(model: Any, where: Path) -> None:
    if not isinstance(model, dict):
        raise _meta_err(where, "model", "'model' must be a JSON object (ModelSpec.to_dict())")
    missing = [k for k in MODEL_REQUIRED if k not in model]
    if missing:
        raise _meta_err(where, f"model.{missing[0]}",
                        f"'model' is not a complete model spec: it lacks {missing}")
    check_fields(model, MODEL_FIELDS, where, "model")
    if model["n_heads"] % model["n_kv_heads"]:
        raise _meta_err(where, "model.n_kv_heads",
                        f"model.n_heads {model['n_heads']} is not a multiple of model.n_kv_heads "
                        f"{model['n_kv_heads']} (each KV head serves a whole group of heads)")
    try:
        ModelSpec.from_dict(model)
    except (TypeError, ValueError) as e:  # UserInputError is a ValueError
        text = e.problem if isinstance(e, UserInputError) else str(e)
        raise _meta_err(where, "model", f"'model' is not a valid model spec: {text}") from None
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
    for key in GPU_NUMBERS:
        if not _is_number(gpu.get(key)) or gpu[key] <= 0:
            raise _meta_err(where, f"gpu.{key}",
                            f"gpu.{key} must be a positive number, got {gpu.get(key)!r}")


def tensor_parallel_size(meta: dict[str, Any]) -> int:
    """The tensor-parallel size a set's latency was measured at (1 without the key)."""
    tp = meta.get("tensor_parallel")
    return int(tp["size"]) if isinstance(tp, dict) and "size" in tp else 1


def check_collective_claims(meta: dict[str, Any], collectives: bool,
                            where: Path | str) -> None:
    """Collectives in the rows (`collectives`: some latency row records a collective call)
    only where meta.json says tensor parallel, at a size the model can be split by."""
    size = tensor_parallel_size(meta)
    key = f"{where} (meta.json key 'tensor_parallel')"
    if size == 1 and collectives:
        raise TraceSetError("latency rows record collectives, but meta.json says one GPU (no "
                            "tensor_parallel, or size 1)", where=key,
                            fix="record the group in meta.json's tensor_parallel, or "
                                f"{FIX_RECALIBRATE}")
    if size > 1:
        try:
            check_tensor_parallel(ModelSpec.from_dict(meta["model"]), size)
        except UserInputError as e:
            raise TraceSetError(e.problem, where=key, fix=FIX_RECALIBRATE) from None


def check_row_claims(meta: dict[str, Any], n_latency: int, n_acceptance: int,
                     where: Path | str) -> None:
    """The rows of a set against what its meta claims: a set holds some rows (an empty one is
    no latency-only set, it is nothing), and exactly the `expected_rows` its writer recorded
    (a merge or subset that stopped early left fewer)."""
    if n_latency == 0 and n_acceptance == 0:
        raise TraceSetError(
            "the set holds no rows, neither latency nor acceptance (the command that wrote it "
            "stopped before its first rows)", where=str(where),
            fix="delete the directory and run the calibrate, merge or subset that made it again")
    expected = meta.get(EXPECTED_ROWS_KEY)
    if not isinstance(expected, dict):
        return
    got = {"latency": n_latency, "acceptance": n_acceptance}
    short = {k: v for k, v in got.items() if k in expected and expected[k] != v}
    if short:
        table = next(iter(short))
        raise TraceSetError(
            f"the set holds {got[table]:,} {table} rows where meta.json's {EXPECTED_ROWS_KEY} "
            f"records {expected[table]:,}: the `traces merge` or `traces subset` that wrote it "
            "stopped before it finished", where=f"{where} (meta.json key {EXPECTED_ROWS_KEY!r})",
            fix="delete the directory and run that merge or subset again (finalize cannot "
                "recover rows that were never written)")


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


def conform_table(table: pa.Table, schema: pa.Schema, where: Path | str,
                  defaults: dict[str, int | float] | None = None) -> pa.Table:
    """Check columns and dtypes against `schema`; cast compatible types; return in schema order.
    A column of `defaults` that the table lacks is added holding its default."""
    for name, value in (defaults or {}).items():
        if name not in table.column_names:
            table = table.append_column(name, pa.array([value] * table.num_rows,
                                                       type=schema.field(name).type))
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
    table = conform_table(table, LATENCY_SCHEMA, where, LATENCY_DEFAULTS)
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
        _require(v <= 0, v, "latency is zero or negative (no GPU call takes no time)", where,
                 col, "re-measure the point, or drop it")
    _check_kv_read(table, where)
    _check_collectives(table, ms["ms_median"], where)
    temp = _np(table, "temperature")
    _require(~np.isfinite(temp) | ((temp < 0) & (temp != UNRECORDED_TEMPERATURE)), temp,
             "temperature must be finite and >= 0 (or the unrecorded marker of older sets)",
             where, "temperature", "record the sampling temperature the phase ran at, 0 = greedy")
    order_bad = (ms["ms_p10"] > ms["ms_median"]) | (ms["ms_median"] > ms["ms_p90"])
    _require(order_bad, ms["ms_median"], "ms_p10 <= ms_median <= ms_p90 violated", where,
             "ms_median", "compute the three statistics from the same timings")
    return table


def _check_kv_read(table: pa.Table, where: Path | str) -> None:
    """A call attends at most the request's cache plus its new query rows: kv_read <= context
    + n_query, and a draft step also the drafts it wrote before it (at most `DRAFT_TAIL_MAX`).
    A table with its batch and context columns swapped breaks this on the first row (kv_read
    follows the real context, the 'context' column then holds batch sizes)."""
    kv, context, n_query = _np(table, "kv_read"), _np(table, "context"), _np(table, "n_query")
    is_draft = np.asarray(table.column("phase").to_pylist()) == "draft_step"
    limit = context + n_query + np.where(is_draft, DRAFT_TAIL_MAX, 0)
    _require(kv > limit, kv,
             "kv_read exceeds context + n_query (+ the drafts written, for a draft step): a "
             "request cannot attend more KV than its cache holds; are the batch and context "
             "columns swapped?", where, "kv_read",
             "record context = the tokens in each request's KV cache, batch = the requests")


def _check_collectives(table: pa.Table, median: np.ndarray, where: Path | str) -> None:
    """Collective calls and bytes >= 0 and zero together; their time finite, >= 0, below the
    phase's own, and 0 where the phase issued none."""
    calls, nbytes = _np(table, "collective_calls"), _np(table, "collective_bytes")
    for col, v in (("collective_calls", calls), ("collective_bytes", nbytes)):
        _require(v < 0, v, f"{col} must be >= 0", where, col, f"record {col} >= 0")
    _require((calls == 0) != (nbytes == 0), calls,
             "collective calls and bytes must be zero together", where, "collective_calls",
             "record the calls and the bytes they moved, or 0 for both")
    ms = _np(table, "collective_ms")
    _require(~np.isfinite(ms) | (ms < 0) | (ms >= median), ms,
             "collective time must be finite, >= 0 and below the phase's ms_median", where,
             "collective_ms", "record ms_median minus the phase's time with no-op collectives")
    _require((calls == 0) & (ms != 0), ms, "collective time where no collective was issued",
             where, "collective_ms", "record 0 for a phase with no collectives")


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


def validate_file_table(name: str, table: pa.Table, where: Path | str,
                         weights_kind: str | None) -> pa.Table:
    if name == LATENCY_FILE:
        return validate_latency(table, where)
    return validate_acceptance(table, where, weights_kind)


def to_pandas(table: pa.Table) -> pd.DataFrame:
    return table.to_pandas()


def table_from_frame(rows: pd.DataFrame, where: str) -> pa.Table:
    if not isinstance(rows, pd.DataFrame):
        raise TraceSetError(f"expected a pandas DataFrame, got {type(rows).__name__}",
                            where=where, fix="pass the rows as a DataFrame")
    try:
        return pa.Table.from_pandas(rows, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise TraceSetError(f"rows cannot be converted to Arrow: {e}", where=where,
                            fix="use the column types of vegas_sim/traces/schema.py") from None
