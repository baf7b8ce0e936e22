"""predict(): the library API behind `vegas-sim predict`, through real (synthetic) trace sets."""

from __future__ import annotations

import pickle
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vegas_sim.errors import DoesNotFitError, UserInputError
from vegas_sim.methods import PHASES
from vegas_sim.models import get_preset
from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.latency import LatencyModel
from vegas_sim.sim.predict import (
    Scenario,
    predict,
    predict_one,
    prefill_fn,
    roofline_prefill_ms,
    validate_scenario,
)
from vegas_sim.sim.scenario import kv_capacity
from vegas_sim.sim.workload import Arrivals, OutputLengths
from vegas_sim.traces.synthetic import make_synthetic_trace_set

Models = tuple[LatencyModel, AcceptanceModel]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    path: Path = tmp_path_factory.mktemp("traces") / "synthetic"
    ts = make_synthetic_trace_set(path, methods=("vanilla", "vegas", "magicdec-stream"),
                                  gammas=(2, 4, 6), contexts=(1024, 4096, 16384))
    latency = LatencyModel.from_meta(ts.latency, ts.meta)
    return latency, AcceptanceModel.from_traces(ts.acceptance, ts.weights_kind)


def sc(method: str = "vegas", **kw: object) -> Scenario:
    base: dict[str, object] = {"gamma": 4, "sparsity": 0.07, "batch": 4, "context": 4096,
                               "output_len": 256}
    base.update(kw)
    return Scenario(method, **base)  # type: ignore[arg-type]


REQUIRED = [
    "method", "gamma", "sparsity", "batch", "context", "output_len", "engine",
    "throughput_tok_s", "throughput_ci_low", "throughput_ci_high", "speedup_vs_vanilla",
    "speedup_ci_low", "speedup_ci_high", "acceptance_length", "rates", "tpot_ms_p50",
    "tpot_ms_p90", "itl_ms_p50", "itl_ms_p99", "iter_ms", "extrapolated", "gpu",
    "iterations_simulated", "wall_s", *[f"ms_{p}" for p in PHASES],
]


def test_rows_and_columns(models: Models) -> None:
    calls: list[tuple[int, int]] = []
    df = predict([sc("vanilla"), sc("vegas"), sc("magicdec-stream")], *models, replications=3,
                 progress=lambda i, n: calls.append((i, n)))
    assert calls == [(1, 3), (2, 3), (3, 3)]
    assert len(df) == 3 and set(REQUIRED) <= set(df.columns)
    van, veg, stream = (df.iloc[i] for i in range(3))
    assert van["speedup_vs_vanilla"] == 1.0 and van["acceptance_length"] == 1.0
    assert van["rates"] == ""
    for row in (veg, stream):
        assert row["throughput_ci_low"] <= row["throughput_tok_s"] <= row["throughput_ci_high"]
        assert row["speedup_ci_low"] <= row["speedup_vs_vanilla"] <= row["speedup_ci_high"]
        assert row["speedup_vs_vanilla"] == pytest.approx(
            row["throughput_tok_s"] / van["throughput_tok_s"], rel=0.02)
        rates = [float(x) for x in row["rates"].split()]
        assert len(rates) == 4 and rates == sorted(rates, reverse=True)
        assert row["acceptance_length"] == pytest.approx(1 + sum(rates), abs=1e-3)
        phases = sum(row[f"ms_{p}"] for p in PHASES)
        assert phases == pytest.approx(row["iter_ms"], rel=1e-6)
        assert row["iterations_simulated"] > 0 and row["gpu"] == "synthetic (measured)"
    # the synthetic truth ranks Vegas' drafts above StreamingLLM's
    assert veg["acceptance_length"] > stream["acceptance_length"]


def test_same_seed_same_table(models: Models) -> None:
    a = predict([sc()], *models, seed=7, replications=2).drop(columns="wall_s")
    b = predict([sc()], *models, seed=7, replications=2).drop(columns="wall_s")
    c = predict([sc()], *models, seed=8, replications=2).drop(columns="wall_s")
    pd.testing.assert_frame_equal(a, b)
    assert a["throughput_tok_s"][0] != c["throughput_tok_s"][0]


def test_sim_and_analytic_agree(models: Models) -> None:
    s = sc(output_len=2048, batch=8, requests=64)
    sim = predict_one(s, *models, replications=2)
    closed = predict_one(s, *models, engine="analytic")
    assert closed["iterations_simulated"] == 0
    assert sim["throughput_tok_s"] == pytest.approx(closed["throughput_tok_s"], rel=0.03)
    assert sim["speedup_vs_vanilla"] == pytest.approx(closed["speedup_vs_vanilla"], rel=0.03)


def test_extrapolation_is_reported(models: Models) -> None:
    inside = predict_one(sc(context=4096), *models, replications=1)
    outside = predict_one(sc(context=65536, gamma=8), *models, replications=1)
    assert outside["extrapolated"] != ""
    assert len(outside["extrapolated"]) > len(inside["extrapolated"])


def test_kv_capacity_limits_throughput(models: Models) -> None:
    full = predict_one(sc(batch=8), *models, replications=1)
    need = 4096 + 256 + 5
    tight = predict_one(sc(batch=8, kv_capacity_tokens=2 * need), *models, replications=1)
    assert tight["throughput_tok_s"] < 0.5 * full["throughput_tok_s"]


def test_colocated_prefill_costs_throughput(models: Models) -> None:
    dis = predict_one(sc(), *models, replications=1)
    co = predict_one(sc(prefill="co-located"), *models, replications=1)
    assert co["throughput_tok_s"] < dis["throughput_tok_s"]
    assert co["ms_prefill"] > 0 and dis["ms_prefill"] == 0


def test_prefill_falls_back_to_roofline(models: Models) -> None:
    latency = models[0]
    fn = prefill_fn(latency, "vegas")  # the synthetic set has no 'prefill' rows
    gpu = latency.gpu
    one = roofline_prefill_ms(latency.model, gpu.copy_bandwidth_gbs, gpu.bf16_tflops, 4096)
    assert fn(np.array([4096, 4096])) == pytest.approx(2 * one)
    # 4096 tokens of an 8B model are compute-bound: ≈ 2·params·L / FLOP rate
    spec = latency.model
    gemm = spec.gemm_flops(4096) / (gpu.bf16_tflops * 1e12) * 1000
    assert gemm < one < 1.5 * gemm


def test_poisson_low_load_throughput_is_the_offered_load(models: Models) -> None:
    row = predict_one(sc(arrival=Arrivals.parse("poisson:0.5"), requests=40, output_len=64), *models,
                      replications=1)
    assert row["throughput_tok_s"] == pytest.approx(0.5 * 64, rel=0.35)


def test_max_positions(models: Models) -> None:
    with pytest.raises(UserInputError, match=r"131073 tokens exceeds qwen3-8b's 131072") as err:
        predict([sc(context=131072, output_len=1)], *models)
    assert err.value.where == "--context/--output-len"
    assert err.value.fix is not None and "--context 131071 or less" in err.value.fix
    with pytest.raises(UserInputError) as err:  # a 128K prompt leaves 127K at output 1024
        predict([sc(context=128 * 1024, output_len=1024)], *models)
    assert err.value.fix is not None and "(127K)" in err.value.fix
    predict([sc(context=127 * 1024, output_len=1024)], *models, replications=1)


def test_batch_beyond_the_kv_cache_is_admitted_by_kv_in_use(models: Models) -> None:
    # what used to be refused ("needs KV for ... tokens"): vLLM admits by the KV in use and
    # preempts; the rows say how many ran on average and how often requests were preempted
    spec = get_preset("qwen3-8b")
    cap = kv_capacity(spec, 141.0, 0.9)  # the synthetic GPU's memory, vLLM's default share
    whole = cap // (8192 + 4096 + 5)  # requests whose whole life fits at once
    row = predict_one(sc(batch=2 * whole, context=8192, output_len=4096), *models,
                      replications=1)
    assert whole < row["mean_running_batch"] < 2 * whole
    assert row["kv_peak_blocks"] <= row["kv_capacity_blocks"] == cap // 16
    assert row["preemptions"] >= 0 and row["kv_block_size"] == 16
    free = predict_one(sc(batch=whole // 2, context=8192, output_len=4096), *models,
                       replications=1)
    assert free["preemptions"] == 0 and free["mean_running_batch"] == pytest.approx(
        whole // 2, rel=0.01)


def test_a_request_that_cannot_fit_alone_is_refused(models: Models) -> None:
    spec = get_preset("qwen3-8b")
    # 20 GB leaves ~3.6 GB next to the 8B weights: ~24K tokens of KV, less than one request
    with pytest.raises(DoesNotFitError) as err:
        validate_scenario(sc(batch=1, context=32768, output_len=1024), spec, 20.0)
    assert err.value.where == "--context" and "larger GPU" in str(err.value.fix)
    assert "one request of 32768 + 1024 tokens" in err.value.problem
    validate_scenario(sc(batch=512, context=4096, output_len=1024), spec, 20.0)


def test_analytic_runs_at_the_kv_limited_batch(models: Models) -> None:
    # capacity for ~10 requests at their mean KV (C + L/2 + slack + half a block) of max 32:
    # the sim's mean running batch and throughput are near the closed form's. (With only a
    # few requests in the cache, whole-request granularity makes the sim run fewer.)
    per = 1024 + 512 + 5 + 7.5
    kv = int(10 * per)
    rows = {e: predict_one(sc(batch=32, context=1024, output_len=1024, kv_capacity_tokens=kv,
                              requests=160), *models, replications=2, engine=e)
            for e in ("sim", "analytic")}
    ana, sim = rows["analytic"], rows["sim"]
    assert ana["mean_running_batch"] == pytest.approx(kv // 16 * 16 / per)
    assert sim["mean_running_batch"] == pytest.approx(ana["mean_running_batch"], rel=0.1)
    assert sim["throughput_tok_s"] == pytest.approx(ana["throughput_tok_s"], rel=0.15)
    assert sim["preemptions"] > 0
    free = predict_one(sc(batch=8, output_len=256), *models, replications=1, engine="analytic")
    assert free["mean_running_batch"] == 8


@pytest.mark.parametrize(("kw", "match"), [
    ({"method": "eagle"}, "unknown method"),
    ({"gamma": 0}, "gamma"),
    ({"sparsity": 0.0}, "sparsity"),
    ({"batch": 0}, "batch"),
    ({"context": 0}, "context"),
    ({"output_len": 0}, "output"),
    ({"requests": 0}, "requests"),
    ({"arrival": Arrivals.parse("poisson:-1")}, "rate"),
    ({"prefill": "remote"}, "prefill"),
])
def test_invalid_scenarios(models: Models, kw: dict[str, object], match: str) -> None:
    method = str(kw.pop("method", "vegas"))
    with pytest.raises(UserInputError, match=match):
        predict([sc(method, **kw)], *models)


def test_bad_engine_and_replications(models: Models) -> None:
    with pytest.raises(UserInputError, match="engine"):
        predict([sc()], *models, engine="fast")
    with pytest.raises(UserInputError, match="replications"):
        predict([sc()], *models, replications=0)


def test_picklable_for_process_pools(models: Models) -> None:
    scen, lat, acc = pickle.loads(pickle.dumps((sc(), *models)))
    a = predict_one(scen, lat, acc, replications=1)
    b = predict_one(sc(), *models, replications=1)
    assert a["throughput_tok_s"] == b["throughput_tok_s"]


@pytest.mark.parametrize("kw", [{"arrival": Arrivals.parse("poisson:2")},
                                {"prefill": "co-located"},
                                {"arrival": Arrivals.parse("closed:2")}])
def test_analytic_refuses_what_it_does_not_model(models: Models, kw: dict[str, object]) -> None:
    with pytest.raises(UserInputError, match="analytic") as err:
        predict([sc("vegas", **kw)], *models, engine="analytic")
    assert err.value.where == "--engine"


def test_rows_beyond_the_measured_latency_grid_are_marked(models: Models) -> None:
    """The synthetic set measures contexts up to 16384: a row whose KV grows past that is
    extrapolated for every method, vanilla included, and says why."""
    inside = predict([sc(context=8192, output_len=64)], *models, replications=1,
                     engine="analytic")
    beyond = predict([sc(context=16384, output_len=64),
                      sc(method="vanilla", context=16384, output_len=64)], *models,
                     replications=1, engine="analytic")
    assert "latency set" not in inside["extrapolated"].iloc[0]
    assert all("beyond the latency set's measured 16384" in e for e in beyond["extrapolated"])


def test_the_draft_budget_floor_is_the_acceptance_traces_own(
        models: Models, monkeypatch: pytest.MonkeyPatch) -> None:
    """A scenario without min_tokens drafts with the floor its acceptance was traced at (the
    packaged SmolLM2 sets used 32, not the default 256), the row says which, and an explicit
    min_tokens still wins."""
    import copy

    latency, acceptance = models
    low = copy.copy(acceptance)
    low.min_tokens = 32
    floors: list[int] = []
    cost = latency.iteration_cost
    monkeypatch.setattr(latency, "iteration_cost",
                        lambda *a: floors.append(a[3]) or cost(*a))  # type: ignore[func-returns-value]
    short = sc(context=1024, output_len=64, sparsity=0.01)  # budget 11: the floor decides
    for acc, floor in ((acceptance, 256), (low, 32)):
        floors.clear()
        row = predict([short], latency, acc, replications=1, engine="analytic").iloc[0]
        assert row["min_tokens"] == floor and set(floors) == {floor}
    floors.clear()
    predict([replace(short, min_tokens=256)], latency, low, replications=1, engine="analytic")
    assert set(floors) == {256}


def test_closed_loop_rows_are_those_of_before_the_open_loop_metrics(models: Models) -> None:
    """Closed-loop numbers pinned to the values predict gave before the open-loop columns
    were added (same seed): the new columns must not move the old ones. Within 0.5 %: the
    last bits of the libraries' arithmetic differ between numpy / scipy releases and CPUs, and
    where two requests' events fall at nearly the same time that can swap which one draws which
    acceptance (measured: TPOT p50 4e-5 apart, the closed loop's throughput up to 1.0e-3)."""
    scen = [Scenario("vanilla", 1, 1.0, 4, 4096, 256), Scenario("vegas", 4, 0.07, 4, 4096, 256),
            Scenario("vegas", 4, 0.07, 4, 4096, 256, prefill="co-located",
                     arrival=Arrivals.parse("closed:3"))]
    df = predict(scen, *models, replications=2)
    pinned = {"throughput_tok_s": [861.9710869661263, 753.456851798372, 481.13475786715276],
              "tpot_ms_p50": [4.640599012629334, 5.245879839849454, 5.8465735407365305],
              "itl_ms_p90": [4.655313796639348, 20.850513387892306, 20.656914858066557],
              "ms_prefill": [0.0, 0.0, 4.037684135171313]}
    for column, values in pinned.items():
        assert list(df[column]) == pytest.approx(values, rel=5e-3), column
    assert not df["saturated"].any()


def test_drafting_rows_baseline_is_common_random_numbers(models: Models) -> None:
    """A drafting row's vanilla draws the row's own request lengths whether or not a vanilla
    row ran first in the call, so its speedup (per-replication ratios) does not depend on the
    order of the scenarios."""
    lengths = OutputLengths.lognormal(256, 1.0)
    alone = predict([sc("vegas", output_dist=lengths)], *models, replications=3, seed=5)
    after = predict([sc("vanilla", output_dist=lengths), sc("vegas", output_dist=lengths)],
                    *models, replications=3, seed=5)
    cols = ["speedup_vs_vanilla", "speedup_ci_low", "speedup_ci_high"]
    assert alone[cols].iloc[0].tolist() == after[cols].iloc[1].tolist()


def test_outputs_inside_one_decode_chunk_have_no_tpot_speedup(models: Models) -> None:
    """γ 6 drafts cover a 2-token output in the first decode iteration: the method's TPOT is 0
    and its ratio to vanilla's is undefined (NaN), not a division by zero."""
    df = predict([sc("vanilla", output_len=2), sc("vegas", gamma=6, output_len=2)], *models,
                 replications=2)
    vegas = df.set_index("method").loc["vegas"]
    assert vegas["tpot_ms_p50"] == 0.0 and np.isnan(vegas["tpot_speedup"])
    assert df.set_index("method").loc["vanilla", "tpot_speedup"] == 1.0
