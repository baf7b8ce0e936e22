"""A data file's table checks run once per content (recorded in the signed fit cache); rows
are parsed on first use, from bytes whose hash is checked again."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vegas_sim.errors import TraceSetError
from vegas_sim.traces import reader
from vegas_sim.traces.io import check, load_trace_set

from .conftest import rewrite_table


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache of this test's own, so that another test's entries do not answer."""
    monkeypatch.setenv("VEGAS_SIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("VEGAS_SIM_CACHE_KEY", str(tmp_path / "config" / "cache.key"))
    monkeypatch.delenv("VEGAS_SIM_CACHE", raising=False)
    return tmp_path / "cache"


@pytest.fixture()
def checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files whose tables were checked, in order."""
    seen: list[str] = []
    real = reader.validate_file_table

    def counting(name: str, *args: object) -> object:
        seen.append(name)
        return real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(reader, "validate_file_table", counting)
    return seen


def test_a_table_is_checked_once_per_content(small_set: Path, cache: Path,
                                             checks: list[str]) -> None:
    first = load_trace_set(small_set)
    assert sorted(checks) == ["acceptance.parquet", "latency.parquet"]
    second = load_trace_set(small_set)
    assert len(checks) == 2  # the second read trusts the signed record of the first check
    pd.testing.assert_frame_equal(first.latency, second.latency)
    pd.testing.assert_frame_equal(first.acceptance, second.acceptance)
    assert second.n_rows("acceptance") == len(second.acceptance) > 0


def test_changed_content_is_checked_again_and_refused(small_set: Path, cache: Path,
                                                      checks: list[str]) -> None:
    load_trace_set(small_set)
    table = pq.read_table(small_set / "latency.parquet")
    ms = table.column("ms_median").to_pylist()
    bad = table.set_column(table.schema.get_field_index("ms_median"), "ms_median",
                           [[-1.0] + ms[1:]])
    rewrite_table(small_set, "latency.parquet", bad)  # meta.json's hash updated too
    with pytest.raises(TraceSetError, match="ms_median"):
        load_trace_set(small_set)
    assert checks.count("latency.parquet") == 2


def test_rows_parsed_later_must_be_the_checked_bytes(small_set: Path, cache: Path) -> None:
    load_trace_set(small_set)  # the check is recorded
    ts = load_trace_set(small_set)  # trusted by hash; acceptance rows not parsed yet
    other = pq.read_table(small_set / "acceptance.parquet").slice(0, 3)
    pq.write_table(other, small_set / "acceptance.parquet")  # replaced after the read
    with pytest.raises(TraceSetError, match="changed after its trace set was read"):
        _ = ts.acceptance


def test_traces_check_always_checks(small_set: Path, cache: Path, checks: list[str]) -> None:
    load_trace_set(small_set)
    check(small_set)
    assert len(checks) == 4


def test_without_the_cache_every_read_checks(small_set: Path, checks: list[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VEGAS_SIM_CACHE", "0")
    load_trace_set(small_set)
    load_trace_set(small_set)
    assert len(checks) == 4


def test_a_set_written_before_the_collective_columns_reads_the_same_twice(
        cache: Path, checks: list[str]) -> None:
    """A packaged set without the tensor-parallel columns: its second read (the check cached)
    fills them with their defaults as the first (checked) read does."""
    first = load_trace_set("smollm2-135m-h200")
    second = load_trace_set("smollm2-135m-h200")
    assert checks.count("latency.parquet") == 1
    assert (second.latency["collective_calls"] == 0).all()
    pd.testing.assert_frame_equal(first.latency, second.latency)


def test_a_warm_load_reads_no_table(small_set: Path, cache: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a set's tables are checked, loading it again neither reads nor parses them (their
    hashes are recorded under each file's change stamp); its rows still parse on use."""
    load_trace_set(small_set)
    read: list[str] = []
    real_read, real_parse = reader._read_bytes, reader._parse_parquet
    monkeypatch.setattr(reader, "_read_bytes", lambda p: read.append(p.name) or real_read(p))
    monkeypatch.setattr(reader, "_parse_parquet",
                        lambda d, p: read.append(f"parse {p.name}") or real_parse(d, p))
    ts = load_trace_set(small_set)
    assert read == []
    assert len(ts.latency) > 0 and read == ["latency.parquet", "parse latency.parquet"]


def test_a_rewritten_file_is_hashed_and_checked_again(small_set: Path, cache: Path,
                                                      checks: list[str]) -> None:
    load_trace_set(small_set)
    table = pq.read_table(small_set / "latency.parquet")
    rewrite_table(small_set, "latency.parquet", table.slice(0, table.num_rows - 1),
                  rehash=False)  # meta.json's hash not updated: the new content is refused
    with pytest.raises(TraceSetError, match="content hash mismatch"):
        load_trace_set(small_set)


def test_collectives_on_one_gpu_are_refused_on_every_load(small_set: Path,
                                                          cache: Path) -> None:
    """The cached check records whether a row holds a collective call: a set whose meta says
    one GPU is refused on the second load too, without its rows parsed."""
    df = pq.read_table(small_set / "latency.parquet").to_pandas()
    forward = df["phase"].isin(["decode", "draft_step", "verify"])
    df["collective_calls"] = forward.astype(int) * 6
    df["collective_bytes"] = df["collective_calls"] * 8192
    df["collective_ms"] = df["ms_median"] * 0.2 * forward
    rewrite_table(small_set, "latency.parquet", pa.Table.from_pandas(df, preserve_index=False))
    for _ in range(2):
        with pytest.raises(TraceSetError, match="record collectives"):
            load_trace_set(small_set)
