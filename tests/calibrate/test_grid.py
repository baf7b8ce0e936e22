"""The calibration grid runner: rows match methods.iteration_plan, resume, OOM, skip, and a
tiny real-model calibration on CPU (the CI run)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from tests.calibrate.conftest import tiny_model
from vegas_sim.calibrate import hardware, measure_acceptance, measure_latency
from vegas_sim.calibrate import plan as plans
from vegas_sim.calibrate.measure_acceptance import acceptance_groups
from vegas_sim.calibrate.measure_latency import (
    draft_samples,
    split_iterations,
    split_quest_scoring,
    stats,
    verify_configs,
)
from vegas_sim.calibrate.plan import (
    CalibrationPlan,
    acceptance_points,
    default_plan,
    latency_points,
    quick_plan,
)
from vegas_sim.calibrate.runner import run_calibration
from vegas_sim.errors import UserInputError
from vegas_sim.methods import METHODS, iteration_plan
from vegas_sim.models import get_preset
from vegas_sim.traces.io import TraceSetWriter, load_trace_set

RANDOM_META = {"kind": "random", "id": "tiny-llama", "sha256": None}


def tiny_plan(**kw: Any) -> CalibrationPlan:
    base: dict[str, Any] = {
        "model": "tiny-llama", "weights": "random", "methods": METHODS, "gamma": (2,),
        # 0.1 and 0.25 both hit the min_tokens floor at C=32: one measurement, no duplicate rows
        "sparsity": (0.1, 0.25, 0.5), "batch": (1, 2), "context": (32, 64), "n_query": (1,),
        "device": "cpu", "warmup": 0, "reps": 2, "min_tokens": 16, "quick": True,
        "temperatures": (0.0, 0.6),  # latency grid samples at 0.6: the top-p/top-k path
    }
    base.update(kw)
    return CalibrationPlan(**base)


@pytest.fixture(scope="module")
def tiny_net() -> Any:
    return tiny_model("llama")


# ---- plan -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, where", [
    ({"weights": "fake"}, "--weights"),
    ({"methods": ("vegas", "nope")}, None),
    ({"gamma": (16,)}, "--gamma"),
    ({"n_query": (17,)}, "--n-query"),
    ({"batch": (0,)}, "--batch"),
    ({"temperatures": (-1.0,)}, "--temperature"),
    ({"iterations": 0}, "--iterations"),
    ({"sparsity": (0.0,)}, None),
])
def test_plan_rejects_bad_options(kw: dict[str, Any], where: str | None) -> None:
    with pytest.raises(UserInputError) as ei:
        tiny_plan(**kw)
    if where is not None:
        assert ei.value.where == where


def test_plans_and_points() -> None:
    q = quick_plan("qwen3-8b")
    assert q.quick and len(latency_points(q)) == 9 and acceptance_points(q) == []
    d = default_plan("qwen3-8b")
    assert d.verify_n_query() == [2, 4, 8, 12, 16]
    assert d.context[-1] == 128 * 1024 and d.ref_sparsity == 0.07
    pts = latency_points(d)
    sizes = [p.batch * p.context for p in pts]
    assert sizes == sorted(sizes) and len(pts) == 64
    real = default_plan("smollm2-135m", weights="real", methods=("vegas", "vanilla"))
    acc = acceptance_points(real)
    # vanilla does not draft: no acceptance rows; every (s, T, workload) once, at max gamma
    assert {p.method for p in acc} == {"vegas"} and {p.gamma for p in acc} == {15}
    assert len(acc) == 8 * 2 * 4 and len({p.key for p in acc}) == len(acc)
    # a run cut after the first 8 points has every workload × temperature, at s = 0.07
    assert {(p.workload, p.temperature) for p in acc[:8]} == {
        (w, t) for w in real.workloads for t in real.temperatures}
    assert {p.sparsity for p in acc[:8]} == {0.07}
    # measured as one batch per (method, γ, T, workload), all 8 sparsities in each
    groups = acceptance_groups(acc)
    assert len(groups) == 2 * 4 and all(len(g) == 8 for g in groups)
    assert all(len({(p.method, p.temperature, p.workload) for p in g}) == 1 for g in groups)
    assert acceptance_groups(acc[3:])[0][0] == acc[3]  # a resumed run: what is left, grouped


def test_coarse_to_fine_spreads_the_range_first() -> None:
    from vegas_sim.calibrate.plan import coarse_to_fine

    order = coarse_to_fine([0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2], 0.07)
    assert order[:3] == [0.07, 0.01, 0.2] and sorted(order) == [0.01, 0.02, 0.03, 0.05, 0.07,
                                                                0.1, 0.15, 0.2]
    assert coarse_to_fine([0.5], 0.5) == [0.5]


def test_verify_configs_cover_every_collection_setting() -> None:
    plan = tiny_plan()
    got = dict(verify_configs(plan, 8))
    assert got["magicdec-stream"] == ["magicdec-stream", "magicdec-quest"]
    assert set(got) == {"magicdec-stream", "vegas", "vegas-all", "specextend"}
    only_vegas = tiny_plan(methods=("vegas",))
    assert dict(verify_configs(only_vegas, 8)) == {"magicdec-stream": ["any"], "vegas": ["vegas"]}


# ---- statistics and sample bookkeeping -------------------------------------------------------
def test_stats_ordered() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        s = stats(list(rng.exponential(1.0, size=int(rng.integers(1, 9)))))
        assert s["ms_p10"] <= s["ms_median"] <= s["ms_p90"]
    assert stats([2.0, float("nan"), 4.0])["n"] == 2
    with pytest.raises(RuntimeError):
        stats([])


def test_draft_samples_keep_once_per_iteration_work_apart() -> None:
    # two Quest iterations: other (index prep), 2 steps each with nested scoring, verify,
    # sample, then the metadata update (top-level quest_meta)
    one = [("other", 0.2), ("draft_step", 1.0), ("quest_meta", 0.1), ("draft_step", 2.0),
           ("quest_meta", 0.3), ("verify", 5.0), ("sample", 0.5), ("quest_meta", 0.4)]
    its = split_iterations(one + one, "other")
    assert len(its) == 2
    steps, quest, once = draft_samples(its, 2)
    assert steps == [[1.0, 1.0], [2.0, 2.0]]
    assert quest == [[0.1, 0.1], [0.3, 0.3]]
    assert once == [pytest.approx(0.6)] * 2  # prep + update, once per iteration
    # graphed Quest: the scoring is inside the step graphs, only the update is timed apart;
    # every step still gets a quest_meta sample (0 here) for split_quest_scoring to fill
    graphed = [("other", 0.2), ("draft_step", 1.1), ("draft_step", 2.3), ("verify", 5.0),
               ("quest_meta", 0.4)]
    steps, quest, once = draft_samples(split_iterations(graphed, "other"), 2)
    assert quest == [[0.0], [0.0]] and once == [pytest.approx(0.6)]
    steps, quest = split_quest_scoring(steps, quest, 0.3)
    assert steps == [[pytest.approx(0.8)], [pytest.approx(2.0)]] and quest == [[0.3], [0.3]]
    plain = [("other", 0.0), ("draft_step", 1.0), ("draft_step", 1.5)]
    steps, quest, once = draft_samples(split_iterations(plain, "other"), 2)
    assert steps == [[1.0], [1.5]] and quest == [[], []] and once == [0.0]


# ---- hardware --------------------------------------------------------------------------------
def test_hardware_cpu_is_honest() -> None:
    hw = hardware.measure_hardware("cpu", quick=True)
    assert hw["name"] == "cpu" and hw["matmul_dtype"] == "float32" and hw["measured"]
    for key in ("sm_count", "memory_gb", "copy_bandwidth_gbs", "bf16_tflops"):
        assert hw[key] > 0
    assert "torch" in hardware.software_versions()


def test_memory_estimate_scales_with_kv() -> None:
    spec = get_preset("qwen3-8b")
    kv = spec.kv_bytes_per_token()
    a = hardware.memory_needed(spec, 1, 1024, include_weights=False)
    b = hardware.memory_needed(spec, 2, 1024, include_weights=False)
    assert a >= kv * 1024 and b > 1.9 * a
    assert hardware.memory_needed(spec, 1, 1024) - a == spec.param_count() * 2
    # H200 after loading the weights: B=4 at 128K fits, B=8 at 128K does not
    free = int(125e9)
    assert hardware.fits_in_memory(spec, 4, 131072, "cpu", include_weights=False, available=free)
    assert not hardware.fits_in_memory(spec, 8, 131072, "cpu", include_weights=False,
                                       available=free)


# ---- end to end on a tiny random model -------------------------------------------------------
class Interrupt(Exception):
    pass


def _plan_keys(plan: CalibrationPlan) -> list[str]:
    return [p.key for p in latency_points(plan)]


def test_rows_match_iteration_plan_and_resume(tmp_path: Path, tiny_net: Any) -> None:
    plan = tiny_plan()
    out = tmp_path / "ts"
    calls: list[tuple[int, int, str]] = []

    def stop_at_second(done: int, total: int, label: str) -> None:
        calls.append((done, total, label))
        if done == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_calibration(plan, out, stop_at_second, model=(tiny_net, RANDOM_META))
    assert calls[0] == (0, 4, "start")
    first = json.loads((out / "run_log.json").read_text())["sessions"]
    assert first[0]["outcome"].startswith("interrupted") and len(first[0]["points"]) == 2
    done_before = TraceSetWriter(out, json.loads((out / "meta.json").read_text())).done_points()
    assert done_before == set(_plan_keys(plan)[:2])

    calls.clear()
    run_calibration(plan, out, lambda d, t, lab: calls.append((d, t, lab)),
                    model=(tiny_net, RANDOM_META))
    assert calls[0] == (2, 4, "resumed") and calls[-1][0] == 4
    log = json.loads((out / "run_log.json").read_text())
    second = log["sessions"][-1]
    assert [p["key"] for p in second["points"]] == _plan_keys(plan)[2:]  # nothing redone
    assert log["total_gpu_seconds"] >= first[0]["wall_s"]
    overhead = second["step_overhead"]
    assert overhead["context"] == 32 and not overhead["cuda_graphs"]
    assert overhead["draft_step"]["eager_step_wall_ms"] > 0  # the Vegas draft step too

    ts = load_trace_set(out)
    assert ts.weights_kind == "random" and ts.acceptance.empty
    assert "meaningless" in ts.meta["grid"]["acceptance"]
    assert ts.meta["grid"]["host_gap_walls"] == "timed"
    _assert_rows_cover_plans(ts.latency, plan, tiny_net.spec.max_positions)


def test_resume_refuses_another_grid_or_model_before_loading(tmp_path: Path) -> None:
    """A changed grid would measure nothing new (or mix grids under the first meta.json), so
    it is refused by name, and so is another model, before any weights are loaded."""
    from vegas_sim.calibrate.runner import check_resumable, grid_meta

    out = tmp_path / "ts"
    plan = tiny_plan()
    check_resumable(out, plan)  # a new directory: nothing to compare, nothing made yet
    assert not out.exists()
    out.mkdir()
    (out / "meta.json").write_text(json.dumps({"source": plan.model, "grid": grid_meta(plan)}))
    check_resumable(out, plan)  # the same command resumes
    with pytest.raises(UserInputError, match=r"another grid.*\(methods: ") as err:
        check_resumable(out, tiny_plan(methods=("vegas",)))
    assert err.value.fix is not None and "traces merge" in err.value.fix
    with pytest.raises(UserInputError, match="this run is of 'other-model'"):
        check_resumable(out, tiny_plan(model="other-model"))
    (tmp_path / "file").write_text("")
    with pytest.raises(UserInputError, match="is not a directory"):
        check_resumable(tmp_path / "file", plan)
    with pytest.raises(UserInputError, match="cannot create"):
        check_resumable(tmp_path / "file" / "ts", plan)


def _assert_rows_cover_plans(lat: pd.DataFrame, plan: CalibrationPlan, max_len: int) -> None:
    """Every phase call of iteration_plan has a latency row with the same quantities (draft
    steps up to DRAFT_GAMMA: later steps differ only by one tail entry each)."""
    assert (lat["ms_median"] > 0).all()
    # decode / verify / select / sample: reps × HOST_GAP_CHAIN iterations; draft steps: reps
    chained = lat.phase.isin(["decode", "verify", "select", "sample"])
    assert (lat[chained]["n"] == plan.reps * measure_latency.HOST_GAP_CHAIN).all()
    pooled = lat.phase.isin(["quest_meta", "other"])  # over sparsities (and quest steps)
    assert (lat[~chained & ~pooled]["n"] == plan.reps).all()
    quantities = ["phase", "method", "batch", "context", "n_query", "kv_read", "collect_rows"]
    assert not lat.duplicated(quantities).any()  # coinciding budgets are measured once
    have = {tuple(r) for r in lat[quantities].itertuples(index=False)}
    gamma = plan.gamma[0]
    for b in plan.batch:
        for c in plan.context:
            for m in METHODS:
                for s in plan.sparsity:
                    calls = iteration_plan(m, gamma, np.full(b, c), s, max_len, plan.min_tokens)
                    step = 0
                    for call in calls:
                        if call.phase == "draft_step":
                            step += 1
                        if call.phase in ("draft_step", "quest_meta") and step > plans.DRAFT_GAMMA:
                            continue
                        key = (call.phase, m, b, c, call.n_query, int(call.kv_read[0]),
                               call.collect_rows)
                        assert key in have, key


def test_oom_point_is_recorded_skipped_and_retried(tmp_path: Path, tiny_net: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from vegas_sim.calibrate.specdec import SpecDecoder

    plan = tiny_plan(methods=("vanilla", "vegas"), batch=(1,), sparsity=(0.25,))
    real_verify = SpecDecoder.verify
    state = {"calls": 0}

    def flaky_verify(self: Any, st: Any) -> None:
        state["calls"] += 1
        if state["calls"] == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9 GiB")
        real_verify(self, st)

    monkeypatch.setattr(SpecDecoder, "verify", flaky_verify)
    lines: list[str] = []
    out = tmp_path / "ts"
    run_calibration(plan, out, model=(tiny_net, RANDOM_META), log_fn=lines.append)
    progress = [json.loads(x) for x in (out / "progress.jsonl").read_text().splitlines()]
    status = {p["key"]: p["status"] for p in progress}
    assert status == {"latency/b1/c32": "oom", "latency/b1/c64": "ok"}
    assert any("oom" in x and "out of memory" in x for x in lines)
    ts = load_trace_set(out)
    assert set(ts.latency["context"]) == {64}
    # a plain resume keeps the OOM verdict; retry_failed measures the point again
    run_calibration(plan, out, model=(tiny_net, RANDOM_META))
    assert set(load_trace_set(out).latency["context"]) == {64}
    run_calibration(plan, out, model=(tiny_net, RANDOM_META), retry_failed=True)
    assert set(load_trace_set(out).latency["context"]) == {32, 64}


def test_points_that_cannot_fit_are_skipped(tmp_path: Path, tiny_net: Any,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "free_memory", lambda device: 10_000)
    plan = tiny_plan(methods=("vanilla",), batch=(1,), context=(32,))
    lines: list[str] = []
    with pytest.raises(UserInputError, match="every point was skipped"):
        run_calibration(plan, tmp_path / "ts", model=(tiny_net, RANDOM_META),
                        log_fn=lines.append)
    assert lines and "skip" in lines[0] and "GB free" in lines[0]
    assert not (tmp_path / "ts" / "latency.parquet").exists()  # no empty set left behind


def test_acceptance_batch_halves_until_it_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = get_preset("qwen3-8b")
    plan = default_plan("qwen3-8b", device="cpu", weights="real")
    # A stand-in for a loaded bf16 model (spec, device, dtype: what the estimate reads).
    on_cuda = SimpleNamespace(spec=spec, device=torch.device("cuda"), dtype=torch.bfloat16)
    on_cpu = SimpleNamespace(spec=spec, device=torch.device("cpu"), dtype=torch.bfloat16)
    free = 40e9  # bytes "free": 32 requests of 8K Qwen3-8B KV (~1.2 GB each) do not fit
    monkeypatch.setattr(hardware, "free_memory", lambda device: free)
    n = measure_acceptance.requests_per_call(plan, on_cuda, 8192)
    assert n < measure_acceptance.ACCEPTANCE_BATCH_GPU and n & (n - 1) == 0  # halved from 128
    assert hardware.fits_in_memory(spec, n, 8192, "cuda", include_weights=False, dtype_bytes=2)
    assert not hardware.fits_in_memory(spec, 2 * n, 8192, "cuda", include_weights=False,
                                       dtype_bytes=2)
    assert measure_acceptance.requests_per_call(plan, on_cpu, 1024) <= measure_acceptance.ACCEPTANCE_BATCH_CPU
    fixed = dataclasses.replace(plan, acceptance_batch=3)
    assert measure_acceptance.requests_per_call(fixed, on_cpu, 64) == 3  # an explicit batch, if it fits


def test_cpu_device_check() -> None:
    if torch.cuda.is_available():
        pytest.skip("has CUDA")
    with pytest.raises(UserInputError, match="CUDA is not available"):
        run_calibration(tiny_plan(device="cuda"), "/nonexistent/never-written")


def test_pre_ampere_gpu_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    with pytest.raises(UserInputError, match=r"Tesla T4 \(compute capability 7.5\) has no bf16"):
        run_calibration(tiny_plan(device="cuda"), "/nonexistent/never-written")


# ---- the CI calibration: real SmolLM2 on CPU -------------------------------------------------
def test_tiny_real_calibration_smollm2(tmp_path: Path, smollm2: Any) -> None:
    model, _tok, meta = smollm2
    plan = CalibrationPlan(
        model="smollm2-135m", weights="real", methods=("vegas",), gamma=(2,),
        sparsity=(0.07, 0.2), batch=(1,), context=(256,), n_query=(1,), workloads=("chat",),
        iterations=2, device="cpu", warmup=0, reps=2, acceptance_prompts=2, acceptance_batch=2,
        min_tokens=8, quick=True)
    out = run_calibration(plan, tmp_path / "smol", model=(model, meta))
    ts = load_trace_set(out)
    assert ts.weights_kind == "real" and ts.meta["workload"] == ["chat"]
    assert ts.meta["model"]["name"] == "smollm2-135m"
    assert {"decode", "draft_step", "verify", "select", "sample"} <= set(ts.latency["phase"])
    acc = ts.acceptance
    # The two sparsities ran as one group (2 calls of 2 requests): 2 prompts × 2 iterations
    # each, under each point's own key, with each sparsity's own budgets.
    assert len(acc) == 2 * 2 * 2
    assert (acc["model_weights"] == "real").all() and (acc["gamma"] == 2).all()
    assert acc["accept_prob"].map(len).eq(2).all()
    by_s = {s: rows.set_index(["request", "iteration"]).sort_index()
            for s, rows in acc.groupby("sparsity")}
    assert set(by_s) == {0.07, 0.2}
    for rows in by_s.values():
        assert list(rows.index) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert (by_s[0.2]["budget"] > by_s[0.07]["budget"]).all()
    keys = {json.loads(line)["key"]
            for line in (out / "progress.jsonl").read_text().splitlines()}
    assert {f"acceptance/vegas/g2/s{s:g}/t0/chat" for s in (0.07, 0.2)} <= keys
    log = json.loads((out / "run_log.json").read_text())
    assert log["acceptance_summary"][0]["workload"] == "chat"
    assert 1.0 <= log["acceptance_summary"][0]["acceptance_length"] <= 3.0


def test_plan_from_cli_options() -> None:
    plan = plans.plan_from_options(
        "smollm2-135m", weights="real", methods="vegas,magicdec-stream", gamma="2..12:2",
        sparsity="1%,7%", batch="1..8:x2", context="1K..8K:x2", workload="chat,code",
        temperature="0,0.6", iterations=5, device="cpu")
    assert plan.methods == ("vegas", "magicdec-stream") and plan.gamma == (2, 4, 6, 8, 10, 12)
    assert plan.sparsity == (0.01, 0.07) and plan.batch == (1, 2, 4, 8)
    assert plan.context == (1024, 2048, 4096, 8192) and plan.workloads == ("chat", "code")
    assert plan.temperatures == (0.0, 0.6) and plan.iterations == 5 and not plan.quick
    assert plans.plan_from_options("qwen3-8b", quick=True).quick
    with pytest.raises(UserInputError) as ei:
        plans.plan_from_options("qwen3-8b", gamma="2..16")
    assert ei.value.where == "--gamma"


def test_contexts_beyond_the_model_are_dropped(tmp_path: Path, tiny_net: Any) -> None:
    lines: list[str] = []
    plan = tiny_plan(methods=("vanilla",), batch=(1,), context=(64, 256, 512))
    run_calibration(plan, tmp_path / "ts", model=(tiny_net, RANDOM_META), log_fn=lines.append)
    assert any("[512]" in x and "not measured" in x for x in lines)
    lat = load_trace_set(tmp_path / "ts").latency
    # 256 = max_positions: measured just below it, so that the drafts (γ = 2 here, the grid's
    # DRAFT_GAMMA steps) + verify still fit
    capped = 256 - 2 * max(2, plans.DRAFT_GAMMA) - 2
    assert plans.effective_context(plan, tiny_net.spec, 256) == capped
    assert sorted(set(lat["context"])) == [64, capped]
    # nothing left to measure is an error before anything is written, not an empty "valid" set
    with pytest.raises(UserInputError, match="every context exceeds") as err:
        run_calibration(tiny_plan(context=(512,)), tmp_path / "none",
                        model=(tiny_net, RANDOM_META))
    assert err.value.where == "--context" and not (tmp_path / "none" / "meta.json").exists()
    with pytest.raises(UserInputError, match="random weights have no acceptance"):
        run_calibration(tiny_plan(latency=False), tmp_path / "none",
                        model=(tiny_net, RANDOM_META))


def test_host_gap_correction() -> None:
    """wall − Σ GPU samples is the host's share, charged to the sample phase."""
    from vegas_sim.calibrate.measure_latency import Timed, with_host_gap

    timed = Timed(iterations=[[("verify", 4.0), ("sample", 1.0)], [("verify", 4.0),
                                                                     ("sample", 1.5)]],
                  walls=[6.0, 5.0])
    assert timed.host_gaps() == [1.0, 0.0]  # the second wall is below the GPU sum: no gap
    assert with_host_gap([1.0, 1.5], timed.host_gaps()) == [2.0, 1.5]
    assert Timed(iterations=[[("sample", 1.0)]], walls=[]).host_gaps() == [0.0]


def test_host_gap_is_shared_by_a_repetitions_chained_iterations() -> None:
    """A repetition of `chain` back-to-back iterations: its gap (wall − Σ samples of all its
    iterations) is split evenly among them, not charged to one."""
    from vegas_sim.calibrate.measure_latency import Timed

    its = [[("decode", 3.0), ("sample", 0.5)]] * 4
    timed = Timed(iterations=its, walls=[16.0, 13.0], chain=2)  # GPU 7 ms per repetition
    assert timed.host_gaps() == [4.5, 4.5, 3.0, 3.0]
    # iterations and walls that do not match the chain: no correction rather than a wrong one
    assert Timed(iterations=its[:3], walls=[16.0, 13.0], chain=2).host_gaps() == [0.0] * 3


def test_a_chain_runs_once_and_its_walls_are_the_timed_runs() -> None:
    """A chained repetition runs once, timed: its phase samples and its wall come from the
    same run (single iterations likewise)."""
    from vegas_sim.calibrate.timers import PhaseTimer

    timer = PhaseTimer("cpu")
    seen: list[bool] = []

    def body() -> None:
        seen.append(timer.enabled)
        with timer.phase("decode"):
            if not timer.enabled:  # an untimed run would be slow: never taken
                time.sleep(0.02)

    ctx = SimpleNamespace(plan=SimpleNamespace(warmup=1, reps=2),
                          model=SimpleNamespace(device=torch.device("cpu")))
    single = measure_latency._timed(ctx, timer, body, "decode")  # type: ignore[arg-type]
    assert seen == [True] * 3 and len(single.walls) == 2 and max(single.walls) < 20.0
    seen.clear()
    timed = measure_latency._timed(ctx, timer, body, "decode", chain=2)  # type: ignore[arg-type]
    assert seen == [True] * 5 and max(timed.walls) < 40.0


@pytest.mark.parametrize("after_draft", [False, True])
def test_vanilla_and_verify_time_chained_iterations(tiny_net: Any, after_draft: bool) -> None:
    """The host-gap phases are timed over HOST_GAP_CHAIN consecutive iterations per
    repetition: reps × chain samples per row — also when every iteration drafts first."""
    from vegas_sim.calibrate import measure_latency

    plan = plans.quick_plan("tiny", device="cpu", methods=("vanilla", "vegas"), gamma=(2,),
                           sparsity=(0.1,), batch=(2,), context=(32,), reps=2, warmup=0,
                           verify_after_draft=after_draft)
    ctx = measure_latency.PointContext(tiny_net, plan, 2, 32, seed=0)
    with torch.no_grad():
        rows = measure_latency.measure_vanilla(ctx) + measure_latency.measure_verify(ctx, 3)
    n = {(r["phase"], r["method"]): r["n"] for r in rows}
    assert n[("decode", "vanilla")] == n[("sample", "vanilla")] == 2 * measure_latency.HOST_GAP_CHAIN
    assert n[("verify", "vegas")] == n[("sample", "vegas")] == 2 * measure_latency.HOST_GAP_CHAIN


def test_sigterm_interrupts_like_ctrl_c() -> None:
    """`timeout`'s SIGTERM becomes a KeyboardInterrupt inside a calibration, so the run log
    is still written on the way out (then the previous handler is back)."""
    import os
    import signal
    import threading
    import time

    from vegas_sim.calibrate.runner import terminate_as_interrupt

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), terminate_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(2)
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.gpu
def test_graphed_calibration_rows_cover_every_plan_phase_on_cuda(tmp_path: Path) -> None:
    """With CUDA graphs Quest's per-step scoring is timed apart (quest_scoring_ms), not nested
    in the steps: its quest_meta rows must exist all the same (an early SmolLM2 set lacked
    them), and so must the 'other' rows."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from tests.calibrate.conftest import tiny_spec
    from vegas_sim.calibrate.runtime import Transformer

    net = Transformer(tiny_spec("llama"), None, device="cuda", dtype=torch.bfloat16, seed=0)
    plan = tiny_plan(device="cuda", batch=(2,), context=(64,), temperatures=(0.0,))
    out = run_calibration(plan, tmp_path / "ts", model=(net, RANDOM_META))
    session = json.loads((out / "run_log.json").read_text())["sessions"][-1]
    assert session["step_overhead"]["cuda_graphs"]
    _assert_rows_cover_plans(load_trace_set(out).latency, plan, net.spec.max_positions)


# ---------------------------------------------------------------- acceptance prompts and cuts
def test_cut_prompts_cut_every_longer_prompt_to_each_shorter_length() -> None:
    prompts = [[1, 2], [3, 4, 5, 6], [7, 8, 9, 10, 11, 12, 13, 14], [15, 16, 17, 18]]
    cuts = measure_acceptance.cut_prompts(prompts)
    # length 2: the three longer prompts' first 2 ids; length 4: the 8-long prompt's first 4
    assert cuts == [[3, 4], [7, 8], [15, 16], [7, 8, 9, 10]]


def _plan(**kw: Any) -> CalibrationPlan:
    return quick_plan("smollm2-135m", device="cpu", weights="real", gamma=(12,),
                      iterations=32, **kw)


def test_longdoc_acceptance_prompts_add_the_cuts_after_the_natural_windows() -> None:
    spec = get_preset("smollm2-135m")
    natural = measure_acceptance.acceptance_prompts(_plan(acceptance_prompts=32, acceptance_cuts="none"),
                                      spec, "longdoc", 12)
    both = measure_acceptance.acceptance_prompts(_plan(acceptance_prompts=32, acceptance_cuts="add"),
                                   spec, "longdoc", 12)
    only = measure_acceptance.acceptance_prompts(_plan(acceptance_prompts=32, acceptance_cuts="only"),
                                   spec, "longdoc", 12)
    levels = sorted({len(p) for p in natural})
    assert len(natural) == 32 and len(levels) == 4  # 8 windows each of 1K, 2K, 4K, 7K
    assert both[:32] == natural and both[32:] == only  # request ids of the natural kept
    # a level of k-th rank gains every window of the longer levels: 24 + 16 + 8 cuts
    assert len(only) == 48
    for n in levels:
        at_n = [p for p in both if len(p) == n]
        assert len(at_n) == sum(len(p) >= n for p in natural)
        assert all(p in [q[:n] for q in natural if len(q) >= n] for p in at_n)


def test_first_prompt_runs_the_later_prompts_under_their_workload_ids() -> None:
    """--first-prompt 128 runs longdoc's appended 3K windows: the prompts from the 128th on,
    and (measure_acceptance_group) requests numbered from 128."""
    spec = get_preset("smollm2-135m")
    every = measure_acceptance.acceptance_prompts(_plan(acceptance_prompts=1000), spec,
                                                  "longdoc", 12)
    later = measure_acceptance.acceptance_prompts(
        _plan(acceptance_prompts=32, acceptance_first_prompt=128), spec, "longdoc", 12)
    assert later == every[128:160] and {len(p) for p in later} == {3072}
    with pytest.raises(UserInputError, match="number 160"):
        measure_acceptance.acceptance_prompts(_plan(acceptance_first_prompt=160), spec,
                                              "longdoc", 12)
    with pytest.raises(UserInputError, match="--first-prompt"):
        _plan(acceptance_first_prompt=128, acceptance_cuts="add")


def test_free_form_workloads_are_not_cut() -> None:
    spec = get_preset("smollm2-135m")
    plan = _plan(acceptance_prompts=4, acceptance_cuts="add")  # 4 chat prompts: not windows
    assert len(measure_acceptance.acceptance_prompts(plan, spec, "chat", 12)) == 4
    with pytest.raises(UserInputError, match="nothing to cut"):
        measure_acceptance.acceptance_prompts(dataclasses.replace(plan, acceptance_cuts="only"), spec,
                                "chat", 12)


def test_unknown_acceptance_cuts_is_refused() -> None:
    with pytest.raises(UserInputError, match="acceptance cuts"):
        _plan(acceptance_cuts="all")


def test_greedy_latency_times_the_sampling_phases_greedy_at_half_the_batches(
        tmp_path: Path, tiny_net: Any) -> None:
    """--greedy-latency: the grid at T 0.6, plus draft_step and sample at T 0 at the points of
    greedy_batches (drafts at the extreme sparsities); the fit has both modes."""
    from vegas_sim.sim.latency import LatencyModel
    from vegas_sim.traces.schema import SAMPLING_PHASES

    plan = tiny_plan(greedy_latency=True, batch=(1, 2, 4), context=(64,))
    assert plans.greedy_batches(plan) == (1, 4)
    assert plans.greedy_sparsities(plan) == (0.1, 0.5)
    ts = load_trace_set(run_calibration(plan, tmp_path / "ts", model=(tiny_net, RANDOM_META)))
    lat = ts.latency
    assert ts.meta["grid"]["greedy_latency"] is True
    sampled, greedy = lat[lat["temperature"] == 0.6], lat[lat["temperature"] == 0.0]
    assert len(sampled) + len(greedy) == len(lat)
    _assert_rows_cover_plans(sampled, plan, tiny_net.spec.max_positions)
    assert set(greedy["phase"]) == set(SAMPLING_PHASES)
    assert set(greedy["batch"]) == {1, 4}
    assert set(greedy[greedy["phase"] == "sample"]["method"]) == set(
        sampled[sampled["phase"] == "sample"]["method"])
    model = LatencyModel.from_meta(lat, ts.meta)
    assert model.measured_modes == ("greedy", "sampled") and model.prices_mode(0.0)
    with pytest.raises(UserInputError, match="greedy"):
        tiny_plan(greedy_latency=True, temperatures=(0.0,))
