"""`traces check` is as strict as the loaders: every meta.json field typed and bounded from
schema.MODEL_FIELDS / GRID_FIELDS, latency rows physically possible, and every command that
loads a set refuses what `check` refuses, with the same message and no traceback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from vegas_sim.cli import cli
from vegas_sim.traces.io import TraceSetWriter
from vegas_sim.traces.merge import merge_trace_sets
from vegas_sim.traces.subset import subset_trace_set
from tests.traces.conftest import edit_meta, rewrite_table

MetaEdit = Callable[[dict[str, Any]], None]


def _model(key: str, value: Any) -> MetaEdit:
    def edit(meta: dict[str, Any]) -> None:
        meta["model"][key] = value
    return edit


def _grid(key: str, value: Any) -> MetaEdit:
    def edit(meta: dict[str, Any]) -> None:
        meta["grid"][key] = value
    return edit


def _workload(meta: dict[str, Any]) -> None:
    meta["workload"] = [1, 2]


META_CASES: list[tuple[str, MetaEdit, str]] = [
    ("n_layers-string", _model("n_layers", "36"), "model.n_layers is '36'"),
    ("n_layers-negative", _model("n_layers", -36), "model.n_layers is -36"),
    ("n_kv_heads-zero", _model("n_kv_heads", 0), "model.n_kv_heads is 0"),
    ("window_layers-text", _model("window_layers", ["a"]), "model.window_layers is ['a']"),
    ("window_layers-range", _model("window_layers", [999]), "window layers [999]"),
    ("rope_theta-bool", _model("rope_theta", True), "model.rope_theta is True"),
    ("dtype-unknown", _model("dtype", "int3"), "model.dtype is 'int3'"),
    ("heads-not-grouped", _model("n_kv_heads", 5), "not a multiple of model.n_kv_heads"),
    ("grid-batch-text", _grid("batch", ["4"]), "grid.batch is ['4']"),
    ("grid-min_tokens", _grid("min_tokens", 0), "grid.min_tokens is 0"),
    ("workload-numbers", _workload, "workload is [1, 2]"),
]


def _swap_batch_context(df: pd.DataFrame) -> None:
    df["batch"], df["context"] = df["context"].copy(), df["batch"].copy()


def _zero_latency(df: pd.DataFrame) -> None:
    df.loc[0, ["ms_p10", "ms_median", "ms_p90"]] = 0.0


LATENCY_CASES: list[tuple[str, Callable[[pd.DataFrame], None], str]] = [
    ("swapped", _swap_batch_context, "are the batch and context columns swapped?"),
    ("zero", _zero_latency, "latency is zero or negative"),
]


def _edit_latency(path: Path, mutate: Callable[[pd.DataFrame], None]) -> None:
    df = pq.read_table(path / "latency.parquet").to_pandas()
    mutate(df)
    rewrite_table(path, "latency.parquet", pa.Table.from_pandas(df, preserve_index=False))


def _commands(path: Path, tmp: Path) -> dict[str, list[str]]:
    """Every command that loads a trace set, pointed at `path`."""
    table = tmp / "val.csv"
    table.write_text("method,gamma,sparsity,batch,context,output_len,workload,regime,measured\n"
                     "vegas,4,0.05,1,1024,64,chat,real,100\n")
    return {
        "check": ["traces", "check", str(path)],
        "show": ["traces", "show", str(path)],
        "predict": ["predict", "--traces", str(path), "--context", "1K", "--batch", "1",
                    "--output-len", "64", "--gamma", "4"],
        "sweep": ["sweep", "--traces", str(path), "--gamma", "4", "--sparsity", "0.05",
                  "--batch", "1", "--context", "1K", "--output-len", "64", "--out",
                  str(tmp / "s.csv")],
        "tune": ["tune", "--traces", str(path), "--batch", "1", "--context", "1K",
                 "--out", str(tmp / "t.json")],
        "repredict": ["validate", "--repredict", str(table), "--traces", str(path),
                      "--out", str(tmp / "v.csv")],
    }


def _refused_everywhere(path: Path, tmp: Path, problem: str) -> None:
    for name, args in _commands(path, tmp).items():
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 1, (name, result.output, result.exception)
        assert problem in result.output, (name, result.output)
        assert "Traceback" not in result.output, (name, result.output)
        assert not isinstance(result.exception, Exception) or isinstance(
            result.exception, SystemExit), (name, repr(result.exception))


@pytest.mark.parametrize("edit,problem", [c[1:] for c in META_CASES],
                         ids=[c[0] for c in META_CASES])
def test_meta_refused_by_check_and_every_loader(small_set: Path, tmp_path: Path,
                                                edit: MetaEdit, problem: str) -> None:
    edit_meta(small_set, edit)
    _refused_everywhere(small_set, tmp_path, problem)


@pytest.mark.parametrize("mutate,problem", [c[1:] for c in LATENCY_CASES],
                         ids=[c[0] for c in LATENCY_CASES])
def test_impossible_latency_refused_by_check_and_every_loader(
        small_set: Path, tmp_path: Path, mutate: Callable[[pd.DataFrame], None],
        problem: str) -> None:
    _edit_latency(small_set, mutate)
    _refused_everywhere(small_set, tmp_path, problem)


def test_the_packaged_sets_pass() -> None:
    for name in ("qwen3-8b-h200", "smollm2-135m-real", "gpt-oss-20b-h200",
                 "qwen3-30b-a3b-h200", "smollm2-135m-h200", "smollm2-135m-real-yarn4"):
        result = CliRunner().invoke(cli, ["traces", "check", name])
        assert result.exit_code == 0, (name, result.output)


# ---------------------------------------------------------------------------------- finalize
def _interrupt_on_call(monkeypatch: pytest.MonkeyPatch, method: str, call: int) -> None:
    """TraceSetWriter.<method> raises KeyboardInterrupt on its `call`-th call (1-based)."""
    original = getattr(TraceSetWriter, method)
    calls = [0]

    def interrupted(self: TraceSetWriter, *args: Any, **kw: Any) -> Any:
        calls[0] += 1
        if calls[0] == call:
            raise KeyboardInterrupt
        return original(self, *args, **kw)

    monkeypatch.setattr(TraceSetWriter, method, interrupted)


def _finalize_refused(path: Path, problem: str) -> None:
    result = CliRunner().invoke(cli, ["traces", "finalize", str(path)])
    assert result.exit_code == 1 and problem in result.output, result.output
    assert "Traceback" not in result.output
    check = CliRunner().invoke(cli, ["traces", "check", str(path)])
    assert check.exit_code == 1, check.output


def test_finalize_refuses_a_subset_interrupted_before_its_acceptance(
        small_set: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _interrupt_on_call(monkeypatch, "append_acceptance", 1)
    with pytest.raises(KeyboardInterrupt):
        subset_trace_set(small_set, tmp_path / "cut", "batch<=1")
    monkeypatch.undo()
    _finalize_refused(tmp_path / "cut", "acceptance rows where meta.json's expected_rows")


def test_finalize_refuses_an_empty_set_as_no_latency_only_set(
        small_set: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _interrupt_on_call(monkeypatch, "append_latency", 1)
    with pytest.raises(KeyboardInterrupt):
        subset_trace_set(small_set, tmp_path / "cut", "batch<=1")
    monkeypatch.undo()
    _finalize_refused(tmp_path / "cut", "the set holds no rows")


def test_finalize_refuses_a_merge_interrupted_after_its_first_set(
        small_set: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one = subset_trace_set(small_set, tmp_path / "one", "batch<=1,gamma<=2").path
    four = subset_trace_set(small_set, tmp_path / "four", "batch>=4,gamma>=4").path
    _interrupt_on_call(monkeypatch, "append_acceptance", 2)
    with pytest.raises(KeyboardInterrupt):
        merge_trace_sets(tmp_path / "both", [one, four])
    monkeypatch.undo()
    _finalize_refused(tmp_path / "both", "acceptance rows where meta.json's expected_rows")


def test_a_finished_merge_and_subset_still_check_and_finalize(small_set: Path,
                                                              tmp_path: Path) -> None:
    one = subset_trace_set(small_set, tmp_path / "one", "batch<=1,gamma<=2").path
    four = subset_trace_set(small_set, tmp_path / "four", "batch>=4,gamma>=4").path
    merged = merge_trace_sets(tmp_path / "both", [one, four])
    for path in (one, four, merged.path):
        assert CliRunner().invoke(cli, ["traces", "finalize", str(path)]).exit_code == 0
        assert CliRunner().invoke(cli, ["traces", "check", str(path)]).exit_code == 0
