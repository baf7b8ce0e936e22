"""merge_trace_sets / `vegas-sim traces merge`: union of disjoint sets of one model and GPU."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from vegas_sim.cli import cli
from vegas_sim.errors import TraceSetError
from vegas_sim.models import get_preset
from vegas_sim.traces import io
from vegas_sim.traces.merge import merge_trace_sets, union_seconds
from vegas_sim.traces.synthetic import synthetic_meta


def _acceptance(workload: str, temperature: float, accepted: int, n: int = 4,
                first_request: int = 0) -> pd.DataFrame:
    return pd.DataFrame({
        "method": ["vegas"] * n, "gamma": [3] * n, "sparsity": [0.07] * n,
        "budget": [256] * n, "context": [2048] * n, "temperature": [temperature] * n,
        "workload": [workload] * n, "request": range(first_request, first_request + n),
        "iteration": [0] * n,
        "accepted": [accepted] * n, "accept_prob": [[1.0, 1.0, 0.0]] * n,
        "model_weights": ["real"] * n,
    })


def _latency(batch: int) -> pd.DataFrame:
    return pd.DataFrame({
        "phase": ["decode"], "method": ["vanilla"], "batch": [batch], "context": [1024],
        "n_query": [1], "kv_read": [1025], "collect_rows": [0], "ms_median": [1.0 + batch],
        "ms_p10": [0.9], "ms_p90": [1.1 + batch], "n": [10],
    })


def _make_set(path: Path, workload: str, temperature: float, accepted: int,
              batch: int | None = None, model: str = "smollm2-135m",
              gpu_name: str | None = None, minutes: float = 1.0,
              acceptance: bool = True, first_request: int = 0) -> Path:
    grid: dict[str, Any] = {"workloads": [workload], "temperatures": [temperature],
                            "batch": [batch] if batch else []}
    meta = synthetic_meta(get_preset(model), grid=grid, workloads=[workload])
    if gpu_name is not None:
        meta["gpu"] = {**meta["gpu"], "name": gpu_name}
    w = io.TraceSetWriter(path, meta, durable=False)
    if acceptance:
        w.append_acceptance(_acceptance(workload, temperature, accepted,
                                        first_request=first_request))
    if batch is not None:
        w.append_latency(_latency(batch))
    w.finalize()
    (path / "run_log.json").write_text(json.dumps({"total_gpu_minutes": minutes}))
    return path


def test_merge_unions_rows_grid_and_gpu_minutes(tmp_path: Path) -> None:
    a = _make_set(tmp_path / "a", "chat", 0.0, accepted=1, batch=1, minutes=1.5)
    b = _make_set(tmp_path / "b", "code", 0.6, accepted=3, batch=4, minutes=2.0)
    merged = merge_trace_sets(tmp_path / "m", [a, b])
    assert sorted(merged.acceptance["workload"].unique()) == ["chat", "code"]
    assert len(merged.acceptance) == 8
    assert sorted(merged.latency["batch"]) == [1, 4]
    assert merged.meta["grid"]["workloads"] == ["chat", "code"]
    assert merged.meta["grid"]["temperatures"] == [0.0, 0.6]
    assert merged.meta["workload"] == ["chat", "code"]
    assert [m["path"] for m in merged.meta["merged_from"]] == [str(a), str(b)]
    log = json.loads((tmp_path / "m" / "run_log.json").read_text())
    assert log["total_gpu_minutes"] == pytest.approx(3.5)
    lengths = {(r["workload"], r["temperature"]): r["acceptance_length"]
               for r in log["acceptance_summary"]}
    assert lengths == {("chat", 0.0): 2.0, ("code", 0.6): 4.0}
    assert io.check(tmp_path / "m")  # the merged set is a valid, hashed trace set


def test_merge_refuses_a_point_measured_twice(tmp_path: Path) -> None:
    a = _make_set(tmp_path / "a", "chat", 0.0, accepted=1)
    b = _make_set(tmp_path / "b", "chat", 0.0, accepted=2)
    with pytest.raises(TraceSetError, match="count twice"):
        merge_trace_sets(tmp_path / "m", [a, b])


def test_a_point_run_on_other_requests_merges_with_its_request_ids(tmp_path: Path) -> None:
    """calibrate --first-prompt 4 ran the workload's prompts 4-7 of a point the first set ran
    on 0-3: the merged point has all 8, each under its own id; one request run twice is
    still refused."""
    a = _make_set(tmp_path / "a", "chat", 0.0, accepted=1)
    b = _make_set(tmp_path / "b", "chat", 0.0, accepted=2, first_request=4)
    acc = merge_trace_sets(tmp_path / "m", [a, b]).acceptance
    assert acc.groupby("request")["accepted"].first().to_dict() == {
        **{r: 1 for r in range(4)}, **{r: 2 for r in range(4, 8)}}
    c = _make_set(tmp_path / "c", "chat", 0.0, accepted=2, first_request=3)
    with pytest.raises(TraceSetError, match="'request': 3.*count twice"):
        merge_trace_sets(tmp_path / "m2", [a, c])


def test_replicates_pool_a_points_requests_renumbered(tmp_path: Path) -> None:
    a = _make_set(tmp_path / "a", "chat", 0.0, accepted=1)
    b = _make_set(tmp_path / "b", "chat", 0.0, accepted=2)
    merged = merge_trace_sets(tmp_path / "m", [a, b], replicates=True)
    acc = merged.acceptance
    assert sorted(acc["request"]) == list(range(8))  # 4 + 4 requests, none merged into one
    assert acc.groupby("request")["accepted"].first().tolist() == [1] * 4 + [2] * 4
    assert merged.meta["grid"]["acceptance_replicates"] == 2
    assert io.check(tmp_path / "m")
    # latency rows are still refused twice
    c = _make_set(tmp_path / "c", "chat", 0.0, accepted=1, batch=2)
    d = _make_set(tmp_path / "d", "chat", 0.0, accepted=1, batch=2)
    with pytest.raises(TraceSetError, match="latency"):
        merge_trace_sets(tmp_path / "m2", [c, d], replicates=True)
    result = CliRunner().invoke(cli, ["traces", "merge", "--replicates", str(tmp_path / "m3"),
                                      str(a), str(b)])
    assert result.exit_code == 0, result.output


def test_merge_refuses_a_latency_row_measured_twice(tmp_path: Path) -> None:
    a = _make_set(tmp_path / "a", "chat", 0.0, accepted=1, batch=2)
    b = _make_set(tmp_path / "b", "code", 0.0, accepted=2, batch=2)
    with pytest.raises(TraceSetError, match="latency"):
        merge_trace_sets(tmp_path / "m", [a, b])


def test_merge_refuses_other_model_or_gpu(tmp_path: Path) -> None:
    a = _make_set(tmp_path / "a", "chat", 0.0, accepted=1)
    other_model = _make_set(tmp_path / "b", "code", 0.0, accepted=1, model="qwen3-8b")
    timed = _make_set(tmp_path / "t", "chat", 0.6, accepted=1, batch=1)
    other_gpu = _make_set(tmp_path / "c", "code", 0.0, accepted=1, batch=2,
                          gpu_name="NVIDIA H100")
    with pytest.raises(TraceSetError, match="different models"):
        merge_trace_sets(tmp_path / "m1", [a, other_model])
    with pytest.raises(TraceSetError, match="different GPUs"):
        merge_trace_sets(tmp_path / "m2", [timed, other_gpu])


def test_merge_takes_acceptance_measured_on_another_gpu(tmp_path: Path) -> None:
    """Acceptance is the model's: an acceptance-only set from another GPU merges, and the
    merged meta names each source's GPU."""
    a = _make_set(tmp_path / "a", "chat", 0.0, accepted=1, batch=1)
    other_gpu = _make_set(tmp_path / "c", "code", 0.0, accepted=1, gpu_name="NVIDIA H100")
    merged = merge_trace_sets(tmp_path / "m", [a, other_gpu])
    assert sorted(merged.acceptance["workload"].unique()) == ["chat", "code"]
    assert merged.gpu_name != "NVIDIA H100"  # the first source's, whose latency it holds
    assert [m["gpu"] for m in merged.meta["merged_from"]][1] == "NVIDIA H100"


def test_merge_cli_refuses_a_non_empty_output(tmp_path: Path) -> None:
    a = _make_set(tmp_path / "a", "chat", 0.0, accepted=1)
    b = _make_set(tmp_path / "b", "code", 0.0, accepted=1)
    runner = CliRunner()
    ok = runner.invoke(cli, ["traces", "merge", str(tmp_path / "m"), str(a), str(b)])
    assert ok.exit_code == 0, ok.output
    assert "workloads chat, code" in ok.output
    again = runner.invoke(cli, ["traces", "merge", str(tmp_path / "m"), str(a), str(b)])
    assert again.exit_code == 1
    assert "not empty" in again.output


def test_merge_refuses_one_set_named_twice(tmp_path: Path) -> None:
    a = _make_set(tmp_path / "a", "chat", 0.0, accepted=1)
    (tmp_path / "link").symlink_to(a)
    (tmp_path / "x").mkdir()
    for twice in ([a, a], [a, tmp_path / "x" / ".." / "a"], [a, tmp_path / "link"]):
        with pytest.raises(TraceSetError, match="are the same trace set") as info:
            merge_trace_sets(tmp_path / "m", twice, replicates=True)
        assert str(twice[0]) in str(info.value) and str(twice[1]) in str(info.value)
    assert not (tmp_path / "m").exists()


def test_merge_refuses_a_copy_as_a_replicate(tmp_path: Path) -> None:
    a = _make_set(tmp_path / "a", "chat", 0.0, accepted=1)
    copy = tmp_path / "copy"
    shutil.copytree(a, copy)
    for replicates in (True, False):
        with pytest.raises(TraceSetError, match="identical acceptance.parquet") as info:
            merge_trace_sets(tmp_path / "m", [a, copy], replicates=replicates)
        assert str(a) in str(info.value) and str(copy) in str(info.value)
    result = CliRunner().invoke(cli, ["traces", "merge", "--replicates", str(tmp_path / "m"),
                                      str(a), str(copy)])
    assert result.exit_code == 1 and "copies of one measurement" in result.output
    assert "Traceback" not in result.output


def test_latency_only_sets_share_an_empty_acceptance_file_and_still_merge(
        tmp_path: Path) -> None:
    a = _make_set(tmp_path / "a", "chat", 0.0, accepted=1, batch=1, acceptance=False)
    b = _make_set(tmp_path / "b", "chat", 0.0, accepted=1, batch=2, acceptance=False)
    assert (a / "acceptance.parquet").read_bytes() == (b / "acceptance.parquet").read_bytes()
    assert sorted(merge_trace_sets(tmp_path / "m", [a, b]).latency["batch"]) == [1, 2]


def test_merge_into_a_file_is_a_clean_error(tmp_path: Path) -> None:
    a = _make_set(tmp_path / "a", "chat", 0.0, accepted=1)
    b = _make_set(tmp_path / "b", "code", 0.0, accepted=1)
    file = tmp_path / "out.txt"
    file.write_text("")
    with pytest.raises(TraceSetError, match="is a file, not a directory"):
        merge_trace_sets(file, [a, b])
    with pytest.raises(TraceSetError, match=f"{file} is a file"):
        merge_trace_sets(file / "m", [a, b])
    result = CliRunner().invoke(cli, ["traces", "merge", str(file), str(a), str(b)])
    assert result.exit_code == 1 and "is a file, not a directory" in result.output
    assert "Traceback" not in result.output and file.read_text() == ""


def test_gpu_minutes_count_overlapping_sessions_once() -> None:
    assert union_seconds([(0, 60), (30, 90), (200, 260)]) == 150
    assert union_seconds([(0, 100), (10, 20)]) == 100
    assert union_seconds([]) == 0


def test_merge_keeps_each_sets_latency_temperature_on_its_rows(tmp_path: Path) -> None:
    """A point timed at T 0 in one set and at T 0.6 in another is two rows, not one twice;
    rows that record no temperature take their own set's latency_temperature."""
    from vegas_sim.sim.latency import LatencyModel

    def latency_set(name: str, temperature: float, ms: float) -> Path:
        grid: dict[str, Any] = {"latency_temperature": temperature, "batch": [2]}
        w = io.TraceSetWriter(tmp_path / name, synthetic_meta(get_preset("smollm2-135m"),
                                                              grid=grid), durable=False)
        rows = pd.concat([_latency(2), _latency(2).assign(phase="sample", kv_read=1025)])
        w.append_latency(rows.assign(ms_median=ms, ms_p10=ms * 0.9, ms_p90=ms * 1.1))
        w.finalize()
        return tmp_path / name

    merged = merge_trace_sets(tmp_path / "m", [latency_set("s", 0.6, 2.0),
                                               latency_set("g", 0.0, 1.0)])
    lat = merged.latency
    assert sorted(lat["temperature"]) == [0.0, 0.0, 0.6, 0.6]
    model = LatencyModel.from_meta(lat, merged.meta)
    assert model.measured_modes == ("greedy", "sampled")  # the first set's grid: T 0.6
    kv = np.array([1025])
    assert model.for_temperature(0.0).phase_ms("sample", "vanilla", 1, kv) < model.phase_ms(
        "sample", "vanilla", 1, kv)


def test_merge_refuses_methods_timed_in_different_sampling_modes(tmp_path: Path) -> None:
    """One method timed only sampled beside another timed only greedy: the merged grid
    would price one of them in a mode nobody timed for it, so the merge says so instead."""

    def latency_set(name: str, temperature: float, method: str) -> Path:
        grid: dict[str, Any] = {"latency_temperature": temperature, "batch": [2]}
        w = io.TraceSetWriter(tmp_path / name, synthetic_meta(get_preset("smollm2-135m"),
                                                              grid=grid), durable=False)
        rows = pd.concat([_latency(2).assign(phase=p) for p in ("draft_step", "sample")])
        w.append_latency(rows.assign(method=method, ms_median=1.0, ms_p10=0.9, ms_p90=1.1))
        w.finalize()
        return tmp_path / name

    with pytest.raises(TraceSetError, match="different modes .*magicdec-quest: greedy.*"
                                            "magicdec-stream: sampled"):
        merge_trace_sets(tmp_path / "m", [latency_set("s", 0.6, "magicdec-stream"),
                                          latency_set("g", 0.0, "magicdec-quest")])


def _revision_set(path: Path, revision: str, methods: tuple[str, ...], batch: int) -> Path:
    """A latency set of runtime revision `revision` with a decode row per method."""
    meta = synthetic_meta(get_preset("smollm2-135m"), grid={"batch": [batch]})
    meta["software"] = {**meta.get("software", {}), "runtime": revision}
    w = io.TraceSetWriter(path, meta, durable=False)
    w.append_latency(pd.concat([_latency(batch).assign(method=m) for m in methods]))
    w.finalize()
    return path


def test_a_method_measured_again_merges_over_an_older_revision(tmp_path: Path) -> None:
    """Revisions 5 and 6 changed only magicdec-quest's quest_meta: its rows measured on
    revision 6 merge over a revision-4 set without them, and the merged set says 6, so
    predict no longer calls Quest the older runtime's."""
    old = _revision_set(tmp_path / "old", "4", ("vanilla", "vegas"), batch=1)
    new = _revision_set(tmp_path / "new", "6", ("magicdec-quest",), batch=1)
    merged = merge_trace_sets(tmp_path / "m", [old, new])
    assert merged.runtime_revision == "6"
    assert sorted(merged.latency["method"]) == ["magicdec-quest", "vanilla", "vegas"]


def test_merge_refuses_a_changed_method_priced_by_two_runtimes(tmp_path: Path) -> None:
    old = _revision_set(tmp_path / "old", "4", ("vanilla", "magicdec-quest"), batch=1)
    new = _revision_set(tmp_path / "new", "6", ("magicdec-quest",), batch=2)
    with pytest.raises(TraceSetError, match="holds latency of magicdec-quest"):
        merge_trace_sets(tmp_path / "m", [old, new])


def test_merge_refuses_revisions_apart_by_a_change_of_every_method(tmp_path: Path) -> None:
    old = _revision_set(tmp_path / "old", "3", ("vanilla",), batch=1)
    new = _revision_set(tmp_path / "new", "6", ("magicdec-quest",), batch=1)
    with pytest.raises(TraceSetError, match="changed every method"):
        merge_trace_sets(tmp_path / "m", [old, new])
