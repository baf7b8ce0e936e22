"""load_trace_set: round trip and every rejection, each naming the file and column/key."""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tests.traces.conftest import edit_meta, rehash_meta, rewrite_table
from vegas_sim.cli import cli
from vegas_sim.errors import TraceSetError
from vegas_sim.traces import io
from vegas_sim.traces.schema import (
    ACCEPTANCE_FILE,
    ACCEPTANCE_SCHEMA,
    LATENCY_FILE,
    LATENCY_SCHEMA,
    META_KEYS,
)


def _load_error(path: Path) -> str:
    with pytest.raises(TraceSetError) as info:
        io.load_trace_set(path)
    return str(info.value)


def _frame(path: Path, file: str) -> pd.DataFrame:
    return pq.read_table(path / file).to_pandas()


def _put_frame(path: Path, file: str, df: pd.DataFrame) -> None:
    rewrite_table(path, file, pa.Table.from_pandas(df, preserve_index=False))


# ------------------------------------------------------------------------------ round trip
def test_round_trip_matches_written_rows(small_set: Path) -> None:
    ts = io.load_trace_set(small_set)
    assert list(ts.latency.columns) == LATENCY_SCHEMA.names
    assert list(ts.acceptance.columns) == ACCEPTANCE_SCHEMA.names
    # Same rows as the parts the writer was given (concatenated in part-name order).
    parts = sorted((small_set / "parts").glob("latency-*.parquet"))
    expected = pd.concat([pq.read_table(p).to_pandas() for p in parts], ignore_index=True)
    pd.testing.assert_frame_equal(ts.latency, expected, check_dtype=False)
    assert ts.latency["batch"].dtype == np.int64
    assert ts.weights_kind == "real" and ts.synthetic and ts.model_name == "qwen3-8b"
    row = ts.acceptance.iloc[0]
    assert len(row["accept_prob"]) == row["gamma"]
    assert ts.meta["content_hash"][LATENCY_FILE] == io.sha256_file(small_set / LATENCY_FILE)


def test_check_lists_passed_checks(small_set: Path) -> None:
    passed = io.check(small_set)
    text = "\n".join(passed)
    assert "meta.json" in text and LATENCY_FILE in text and ACCEPTANCE_FILE in text
    assert "content hash" in text


def test_summary_covers_grid(small_set: Path) -> None:
    d = io.summarize(io.load_trace_set(small_set))
    assert d["model"]["name"] == "qwen3-8b" and d["gpu"]["name"] == "synthetic"
    assert d["latency"]["batch"] == [1, 4]
    assert d["acceptance"]["gamma"] == [2, 4]
    assert d["acceptance"]["sparsity"] == [0.05, 0.1]
    assert set(d["latency"]["methods"]) == {"vanilla", "vegas", "magicdec-quest"}
    assert "quest_meta" in d["latency"]["phases"]
    json.dumps(d)  # serialisable for --format json
    text = io.format_summary(d)
    assert "SYNTHETIC" in text and "qwen3-8b" in text and "gamma 2 .. 4" in text
    acc = io.load_trace_set(small_set).acceptance
    assert d["acceptance"]["workload_spans"]
    for w, (lo, hi, reached) in d["acceptance"]["workload_spans"].items():
        runs = acc[(acc["workload"] == w) & (acc["iteration"] == 0)]["context"]
        assert (lo, hi) == (runs.min(), runs.max()) and reached >= hi
        assert f"{w:<11} prompts {lo}..{hi} tokens" in text  # what it is follows


def test_empty_acceptance_is_allowed(small_set: Path) -> None:
    rewrite_table(small_set, ACCEPTANCE_FILE, ACCEPTANCE_SCHEMA.empty_table())
    ts = io.load_trace_set(small_set)
    assert ts.acceptance.empty and not ts.has_real_acceptance
    assert "latency-only" in io.format_summary(io.summarize(ts))


def test_int32_columns_are_cast_safely(small_set: Path) -> None:
    t = pq.read_table(small_set / LATENCY_FILE)
    i = t.schema.get_field_index("batch")
    t = t.set_column(i, "batch", t.column("batch").cast(pa.int32()))
    rewrite_table(small_set, LATENCY_FILE, t)
    assert io.load_trace_set(small_set).latency["batch"].dtype == np.int64


# ------------------------------------------------------------------------------ files, meta
def test_missing_directory(tmp_path: Path) -> None:
    msg = _load_error(tmp_path / "nope")
    assert "nope" in msg and "does not exist" in msg and "fix:" in msg


@pytest.mark.parametrize("file", [LATENCY_FILE, ACCEPTANCE_FILE, "meta.json"])
def test_missing_file(small_set: Path, file: str) -> None:
    (small_set / file).unlink()
    msg = _load_error(small_set)
    assert file in msg and "missing" in msg and "fix:" in msg


def test_unreadable_parquet(small_set: Path) -> None:
    (small_set / LATENCY_FILE).write_bytes(b"not a parquet file at all")
    rehash_meta(small_set, LATENCY_FILE)
    msg = _load_error(small_set)
    assert LATENCY_FILE in msg and "unreadable parquet" in msg


def test_meta_not_json(small_set: Path) -> None:
    (small_set / "meta.json").write_text("{ broken")
    msg = _load_error(small_set)
    assert "meta.json" in msg and "not valid JSON" in msg


@pytest.mark.parametrize("key", sorted(META_KEYS))
def test_missing_meta_key(small_set: Path, key: str) -> None:
    edit_meta(small_set, lambda m: m.pop(key))
    msg = _load_error(small_set)
    assert "meta.json" in msg and repr(key) in msg


def test_wrong_schema_version(small_set: Path) -> None:
    edit_meta(small_set, lambda m: m.update(schema_version=2))
    msg = _load_error(small_set)
    assert "meta.json" in msg and "'schema_version'" in msg and "fix:" in msg


def test_unknown_weights_kind(small_set: Path) -> None:
    edit_meta(small_set, lambda m: m["model"]["weights"].update(kind="pretrained"))
    msg = _load_error(small_set)
    assert "meta.json" in msg and "'model.weights.kind'" in msg


def test_bad_gpu_number(small_set: Path) -> None:
    edit_meta(small_set, lambda m: m["gpu"].update(copy_bandwidth_gbs=-1))
    msg = _load_error(small_set)
    assert "meta.json" in msg and "'gpu.copy_bandwidth_gbs'" in msg


def test_hash_mismatch_after_tampering(small_set: Path) -> None:
    df = _frame(small_set, LATENCY_FILE)
    df.loc[0, "n"] = 21  # a plausible silent edit that every range check accepts
    rewrite_table(small_set, LATENCY_FILE, pa.Table.from_pandas(df, preserve_index=False),
                  rehash=False)
    msg = _load_error(small_set)
    assert LATENCY_FILE in msg and "content hash mismatch" in msg and "'content_hash'" in msg


def _tamper(path: Path) -> None:
    df = _frame(path, LATENCY_FILE)
    df.loc[0, "n"] = 21
    rewrite_table(path, LATENCY_FILE, pa.Table.from_pandas(df, preserve_index=False),
                  rehash=False)


def test_hash_mismatch_fix_is_a_command_that_works(small_set: Path) -> None:
    """The fix is a shell command for this very set (no DIR to fill in, no Python to write),
    and running it as written repairs the set from its parts."""
    _tamper(small_set)
    fix = _load_error(small_set).split("fix:", 1)[1]
    assert "finalize_trace_set(DIR)" not in fix
    command = shlex.split(fix.split("`")[1])  # the first back-quoted part
    assert command[:3] == ["vegas-sim", "traces", "finalize"] and command[3] == str(small_set)
    result = CliRunner().invoke(cli, command[1:])
    assert result.exit_code == 0, result.output
    assert io.load_trace_set(small_set).latency["n"].iloc[0] != 21


def test_hash_mismatch_without_parts_does_not_offer_a_rebuild(small_set: Path) -> None:
    shutil.rmtree(small_set / "parts")  # as a packaged set: consolidated files only
    _tamper(small_set)
    msg = _load_error(small_set)
    assert "content hash mismatch" in msg and "finalize" not in msg and "restore" in msg


def test_unfinished_set_fix_names_the_set(small_set: Path) -> None:
    shutil.copy(next((small_set / "parts").glob("latency-*.parquet")),
                small_set / "parts" / "latency-999999.parquet")
    fix = _load_error(small_set).split("fix:", 1)[1]
    assert f"--out {small_set}" in fix and "'DIR'" not in fix


# ------------------------------------------------------------------------------ latency rows
Mutation = Callable[[pd.DataFrame], Any]


def _set(col: str, value: Any, row: int = 0) -> Mutation:
    def mutate(df: pd.DataFrame) -> None:
        df.loc[row, col] = value
    return mutate


LATENCY_REJECTIONS: list[tuple[str, Mutation, str]] = [
    ("ms_median", _set("ms_median", float("nan")), "NaN"),
    ("ms_p10", _set("ms_p10", -0.5), "negative"),
    ("ms_median", _set("ms_p10", 1e6), "ms_p10 <= ms_median <= ms_p90"),
    ("ms_median", _set("ms_p90", 1e-6), "ms_p10 <= ms_median <= ms_p90"),
    ("n", _set("n", 0), "n must be >= 1"),
    ("batch", _set("batch", 0), "batch must be >= 1"),
    ("context", _set("context", 0), "context must be >= 1"),
    ("n_query", _set("n_query", 0), "n_query must be >= 1"),
    ("kv_read", _set("kv_read", -1), "kv_read must be >= 0"),
    ("phase", _set("phase", "warmup"), "unknown phase"),
    ("method", _set("method", "medusa"), "unknown method"),
]


@pytest.mark.parametrize("column,mutate,problem", LATENCY_REJECTIONS,
                         ids=[f"{c}-{p[:12]}" for c, _, p in LATENCY_REJECTIONS])
def test_latency_rejections(small_set: Path, column: str, mutate: Mutation,
                            problem: str) -> None:
    df = _frame(small_set, LATENCY_FILE)
    mutate(df)
    _put_frame(small_set, LATENCY_FILE, df)
    msg = _load_error(small_set)
    assert LATENCY_FILE in msg and f"column {column!r}" in msg and problem in msg
    assert "row 0" in msg and "fix:" in msg


def test_missing_column(small_set: Path) -> None:
    t = pq.read_table(small_set / LATENCY_FILE).drop_columns(["ms_p90"])
    rewrite_table(small_set, LATENCY_FILE, t)
    msg = _load_error(small_set)
    assert LATENCY_FILE in msg and "column 'ms_p90'" in msg and "missing column" in msg


def test_unexpected_column(small_set: Path) -> None:
    t = pq.read_table(small_set / LATENCY_FILE)
    t = t.append_column("gpu_temp", pa.array(np.zeros(t.num_rows)))
    rewrite_table(small_set, LATENCY_FILE, t)
    msg = _load_error(small_set)
    assert "column 'gpu_temp'" in msg and "unexpected" in msg


def test_wrong_dtype(small_set: Path) -> None:
    t = pq.read_table(small_set / LATENCY_FILE)
    i = t.schema.get_field_index("batch")
    t = t.set_column(i, "batch", t.column("batch").cast(pa.string()))
    rewrite_table(small_set, LATENCY_FILE, t)
    msg = _load_error(small_set)
    assert LATENCY_FILE in msg and "column 'batch'" in msg and "wrong dtype" in msg


def test_float_where_int_expected_is_rejected(small_set: Path) -> None:
    t = pq.read_table(small_set / LATENCY_FILE)
    i = t.schema.get_field_index("kv_read")
    t = t.set_column(i, "kv_read", t.column("kv_read").cast(pa.float64()))
    rewrite_table(small_set, LATENCY_FILE, t)
    assert "column 'kv_read'" in _load_error(small_set)


# ------------------------------------------------------------------------------ acceptance rows
def _set_prob(value: list[float]) -> Mutation:
    def mutate(df: pd.DataFrame) -> None:
        df.at[0, "accept_prob"] = np.asarray(value, dtype=np.float32)
    return mutate


ACCEPTANCE_REJECTIONS: list[tuple[str, Mutation, str]] = [
    ("accepted", lambda df: df.__setitem__("accepted", df["gamma"] + 1), "outside [0, gamma]"),
    ("accepted", _set("accepted", -1), "outside [0, gamma]"),
    ("accept_prob", _set_prob([0.5] * 9), "length != gamma"),
    ("accept_prob", lambda df: _set_prob([1.5] * int(df.loc[0, "gamma"]))(df), "outside [0, 1]"),
    ("accept_prob", lambda df: _set_prob([np.nan] * int(df.loc[0, "gamma"]))(df), "NaN"),
    ("sparsity", _set("sparsity", 0.0), "outside (0, 1]"),
    ("sparsity", _set("sparsity", 1.5), "outside (0, 1]"),
    ("temperature", _set("temperature", -0.1), "temperature < 0"),
    ("gamma", _set("gamma", 0), "gamma must be >= 1"),
    ("method", _set("method", "vanilla"), "non-drafting"),
    ("model_weights", _set("model_weights", "pretrained"), "unknown weights kind"),
    ("model_weights", _set("model_weights", "random"), "differs from meta.json"),
]


@pytest.mark.parametrize("column,mutate,problem", ACCEPTANCE_REJECTIONS,
                         ids=[f"{c}-{p[:12]}" for c, _, p in ACCEPTANCE_REJECTIONS])
def test_acceptance_rejections(small_set: Path, column: str, mutate: Mutation,
                               problem: str) -> None:
    df = _frame(small_set, ACCEPTANCE_FILE)
    mutate(df)
    _put_frame(small_set, ACCEPTANCE_FILE, df)
    msg = _load_error(small_set)
    assert ACCEPTANCE_FILE in msg and f"column {column!r}" in msg and problem in msg
    assert "fix:" in msg


def test_null_cell_is_rejected(small_set: Path) -> None:
    t = pq.read_table(small_set / ACCEPTANCE_FILE)
    i = t.schema.get_field_index("workload")
    values = t.column("workload").to_pylist()
    values[0] = None
    t = t.set_column(i, "workload", pa.array(values, pa.string()))
    rewrite_table(small_set, ACCEPTANCE_FILE, t)
    msg = _load_error(small_set)
    assert "column 'workload'" in msg and "null" in msg


def test_fixture_is_untouched_by_mutations(template_set: Path) -> None:
    # The template is shared by every test: mutations must only ever hit copies.
    io.load_trace_set(template_set)


def test_copy_without_parts_loads(small_set: Path) -> None:
    # A packaged set ships without parts/ (package-data only takes the top-level files).
    shutil.rmtree(small_set / "parts")
    (small_set / "progress.jsonl").unlink()
    assert len(io.load_trace_set(small_set).latency) > 0


def test_nan_stored_as_value_not_null(small_set: Path) -> None:
    # Arrow keeps NaN distinct from null when not converted from pandas: both are rejected.
    t = pq.read_table(small_set / LATENCY_FILE)
    values = t.column("ms_p90").to_numpy().copy()
    values[3] = np.nan
    i = t.schema.get_field_index("ms_p90")
    t = t.set_column(i, "ms_p90", pa.array(values, from_pandas=False))
    rewrite_table(small_set, LATENCY_FILE, t)
    msg = _load_error(small_set)
    assert "column 'ms_p90'" in msg and "NaN" in msg and "row 3" in msg


def test_traces_show_prints_the_measured_gpu_stack_beside_the_extra() -> None:
    """A packaged set says which torch / triton it was measured on and whether the `gpu`
    extra admits them; the extra's ranges in the code are pyproject.toml's."""
    import re
    import tomllib

    from vegas_sim.traces import summary

    root = Path(io.__file__).resolve().parents[2]
    extra = tomllib.loads((root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["gpu"]
    for name, (lo, hi) in summary.GPU_EXTRA.items():
        spec = next(e for e in extra if re.match(rf"{name}\b", e))
        want = f">={'.'.join(map(str, lo))},<{'.'.join(map(str, hi))}"
        assert sorted(spec[len(name):].split(",")) == sorted(want.split(","))
    out = CliRunner().invoke(cli, ["traces", "show", "qwen3-8b-h200"]).output
    assert ("gpu stack torch 2.11.0+cu130 (admitted; the gpu extra: >=2.11,<2.15), triton 3.6.0 "
            "(admitted" in out)
    assert summary.gpu_stack({"torch": "2.10.1", "triton": "3.9.0"})["torch"]["inside"] is False
