"""A trace set's tensor-parallel record: meta.json `tensor_parallel` ({size, backend,
interconnect}) and the latency rows' collective columns, checked by `traces check` and every
loader; a set written before the columns existed reads them as 0 (one GPU)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tests.traces.conftest import edit_meta, rewrite_table
from vegas_sim.cli import cli
from vegas_sim.traces.reader import load_trace_set
from vegas_sim.traces.schema import LATENCY_DEFAULTS

TP2 = {"size": 2, "backend": "nccl", "interconnect": "NVLink (18 active links on GPU 0)"}


def _check(path: Path) -> tuple[int, str]:
    run = CliRunner().invoke(cli, ["traces", "check", str(path)])
    return run.exit_code, run.output


def _with_collectives(path: Path, edit: Callable[[pd.DataFrame], None]) -> None:
    df = pq.read_table(path / "latency.parquet").to_pandas()
    forward = df["phase"].isin(["decode", "draft_step", "verify"])
    df["collective_calls"] = forward.astype(int) * 6
    df["collective_bytes"] = df["collective_calls"] * 8192
    df["collective_ms"] = df["ms_median"] * 0.2 * forward
    edit(df)
    rewrite_table(path, "latency.parquet", pa.Table.from_pandas(df, preserve_index=False))


def test_a_set_without_the_columns_reads_them_as_zero(small_set: Path) -> None:
    lat = load_trace_set(small_set).latency
    for column, value in LATENCY_DEFAULTS.items():
        assert (lat[column] == value).all()


def test_a_tp2_set_with_consistent_collectives_passes(small_set: Path) -> None:
    edit_meta(small_set, lambda m: m.__setitem__("tensor_parallel", TP2))
    _with_collectives(small_set, lambda df: None)
    code, out = _check(small_set)
    assert code == 0 and "tensor parallel 2" in out, out
    show = CliRunner().invoke(cli, ["traces", "show", str(small_set)]).output
    assert "tensor parallel 2 (nccl, NVLink" in show and "20 % of its time" in show


def _meta_edit(value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda m: m.__setitem__("tensor_parallel", value)


@pytest.mark.parametrize(("edit", "message"), [
    (_meta_edit({"size": 2, "backend": "mpi", "interconnect": "x"}), "backend is 'mpi'"),
    (_meta_edit({"size": 0, "backend": "nccl", "interconnect": "x"}), "tensor_parallel.size"),
    (_meta_edit({"size": 2}), "it must hold size, backend, interconnect"),
    (_meta_edit({"size": 3, "backend": "nccl", "interconnect": "x"}), "cannot be split 3 ways"),
])
def test_a_malformed_group_is_refused(small_set: Path, edit: Callable[[dict[str, Any]], None],
                                      message: str) -> None:
    edit_meta(small_set, edit)
    code, out = _check(small_set)
    assert code != 0 and message in out and "tensor_parallel" in out, out


def _negative_calls(df: pd.DataFrame) -> None:
    df.loc[0, "collective_calls"] = -1


def _calls_without_bytes(df: pd.DataFrame) -> None:
    df.loc[df["collective_calls"] > 0, "collective_bytes"] = 0


def _longer_than_the_phase(df: pd.DataFrame) -> None:
    df.loc[df["collective_calls"] > 0, "collective_ms"] = df["ms_median"] * 2


def _time_without_calls(df: pd.DataFrame) -> None:
    none = df["collective_calls"] == 0
    df.loc[none, "collective_ms"] = df.loc[none, "ms_median"] * 0.5


@pytest.mark.parametrize(("edit", "message"), [
    (_negative_calls, "collective_calls must be >= 0"),
    (_calls_without_bytes, "must be zero together"),
    (_longer_than_the_phase, "below the phase's ms_median"),
    (_time_without_calls, "collective time where no collective was issued"),
])
def test_impossible_collective_rows_are_refused(small_set: Path,
                                                edit: Callable[[pd.DataFrame], None],
                                                message: str) -> None:
    edit_meta(small_set, _meta_edit(TP2))
    _with_collectives(small_set, edit)
    code, out = _check(small_set)
    assert code != 0 and message in out and "column 'collective" in out, out


def test_collectives_in_a_one_gpu_set_are_refused(small_set: Path) -> None:
    _with_collectives(small_set, lambda df: None)
    code, out = _check(small_set)
    assert code != 0 and "meta.json says one GPU" in out, out
