"""Open-loop serving: served rate, TTFT with queueing, saturation, goodput, ranking.

Rates are set relative to the configuration's capacity measured by a closed-loop run (its
requests/s with the batch always full), so the tests hold whatever the latency set.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from vegas_sim import api
from vegas_sim.errors import UserInputError
from vegas_sim.reports import terminal
from vegas_sim.sim.engine import Arrivals, EngineConfig, Lengths, simulate
from vegas_sim.sim.metrics import Slo, summarize
from vegas_sim.sim.predict import Scenario, predict, predict_one
from vegas_sim.sim.ranking import best_per_cell, check_rank_by
from vegas_sim.sim.tune import TuneConfig, argbest

OUT = 128  # short outputs keep the runs fast


@pytest.fixture(scope="module")
def models() -> tuple[Any, Any]:
    latency, acceptance, _ = api.load_models("qwen3-8b")
    return latency, acceptance


def sc(method: str = "vegas", **kw: Any) -> Scenario:
    base: dict[str, Any] = {"gamma": 7 if method != "vanilla" else 1,
                            "sparsity": 0.07 if method != "vanilla" else 1.0, "batch": 4,
                            "context": 32768, "output_len": OUT,
                            "prefill_gpus": 64}  # the decode GPU, not the prefill, saturates
    base.update(kw)
    base["arrival"] = Arrivals.of(base.get("arrival", "closed"))  # the option's text, parsed
    return Scenario(method, **base)


@pytest.fixture(scope="module")
def capacity(models: tuple[Any, Any]) -> float:
    """Requests/s vanilla serves with its batch always full (closed loop)."""
    row = predict_one(sc("vanilla", requests=32), *models, replications=1)
    return float(row["throughput_tok_s"]) / OUT


def _pair(models: tuple[Any, Any], **kw: Any) -> pd.DataFrame:
    return predict([sc("vanilla", **kw), sc("vegas", **kw)], *models, replications=2)


def test_open_loop_default_requests_reach_a_steady_state() -> None:
    assert sc(arrival="poisson:2").n_requests == 200
    assert sc(arrival="poisson:2", batch=64).n_requests == 20 * 64
    assert sc().n_requests == 16  # closed loop: unchanged, 4 × batch


def test_past_capacity_is_saturated_and_ttft_grows_with_the_horizon(
        models: tuple[Any, Any], capacity: float) -> None:
    heavy = f"poisson:{5 * capacity:.4g}"
    short = predict_one(sc("vanilla", arrival=heavy, requests=100), *models, replications=1)
    long = predict_one(sc("vanilla", arrival=heavy, requests=200), *models, replications=1)
    assert short["saturated"] and long["saturated"]
    # queueing: the backlog grows as (λ − μ)·t, so doubling the horizon ~doubles the wait
    assert long["ttft_ms_p50"] > 1.6 * short["ttft_ms_p50"]
    assert long["queue_len_mean"] > 1.6 * short["queue_len_mean"]
    # served at the capacity, not at the offered rate
    assert long["served_rate"] == pytest.approx(capacity, rel=0.1)
    assert long["throughput_tok_s"] == pytest.approx(capacity * OUT, rel=0.1)


def test_poisson_2_and_100_differ_as_queueing_says(models: tuple[Any, Any]) -> None:
    """The issue's pair at predict's default configuration (output 1024): both past its
    capacity, 100 much further; the faster arrivals pile up sooner, so every request waits
    longer."""
    full = predict_one(sc("vanilla", output_len=1024, requests=16), *models, replications=1)
    assert 2 > 1.5 * float(full["throughput_tok_s"]) / 1024
    rows = {r: predict_one(sc("vanilla", arrival=f"poisson:{r}", requests=100, output_len=1024),
                           *models, replications=1) for r in (2, 100)}
    assert rows[2]["saturated"] and rows[100]["saturated"]
    assert rows[100]["ttft_ms_p50"] > 1.1 * rows[2]["ttft_ms_p50"]
    assert rows[100]["queue_len_mean"] > rows[2]["queue_len_mean"]
    assert rows[100]["offered_rate"] == 100 and rows[2]["offered_rate"] == 2


def test_light_load_serves_the_offered_load_and_tpot_is_the_gain(
        models: tuple[Any, Any], capacity: float) -> None:
    rate = 0.2 * capacity
    df = _pair(models, arrival=f"poisson:{rate:.4g}")
    van, veg = df.iloc[0], df.iloc[1]
    assert not van["saturated"] and not veg["saturated"]
    for row in (van, veg):
        assert row["served_rate"] == pytest.approx(rate, rel=0.2)
        assert row["queue_len_mean"] < 0.5
    assert veg["speedup_vs_vanilla"] == pytest.approx(1.0, abs=0.05)  # throughput: no gain
    assert veg["tpot_speedup"] > 1.05
    assert veg["tpot_ms_p50"] < van["tpot_ms_p50"]
    assert veg["ttft_ms_p50"] > 0 and veg["e2e_ms_p50"] > veg["ttft_ms_p50"]


def test_closed_loop_is_never_saturated_and_has_no_offered_rate(
        models: tuple[Any, Any]) -> None:
    row = predict_one(sc(requests=16), *models, replications=1)
    assert not row["saturated"] and np.isnan(row["offered_rate"])
    assert row["tpot_speedup"] > 1 and np.isnan(row["goodput_tok_s"])


def _engine_run(slo: Slo) -> tuple[float, float]:
    cfg = EngineConfig("vanilla", 1, 4, 60, Lengths(100, 20),
                       arrivals=Arrivals("poisson", rate_per_s=20.0))

    def cost(contexts: np.ndarray) -> float:
        return 10.0

    cost.breakdown = lambda contexts: {"decode": 10.0}  # type: ignore[attr-defined]
    m = summarize(simulate(cfg, cost, None, seed=3), slo)  # type: ignore[arg-type]
    return m.throughput_tok_s, m.goodput_tok_s


def test_goodput_counts_only_requests_meeting_the_slos() -> None:
    thr, loose = _engine_run(Slo(tpot_ms=1e6, ttft_ms=1e9))
    assert loose == pytest.approx(thr)
    assert _engine_run(Slo(tpot_ms=1.0))[1] == 0.0  # no iteration is that short
    assert _engine_run(Slo(ttft_ms=1.0))[1] == 0.0
    assert np.isnan(_engine_run(Slo())[1])
    mid = _engine_run(Slo(ttft_ms=60.0))[1]  # the waiting ones miss it
    assert 0.0 < mid < thr


def test_saturated_rows_say_so_on_the_terminal(models: tuple[Any, Any],
                                               capacity: float) -> None:
    df = _pair(models, arrival=f"poisson:{5 * capacity:.4g}", requests=60)
    console = Console(width=200, record=True)
    terminal.print_prediction(df, [], console)
    text = console.export_text()
    assert "saturated: vanilla: offered" in text and "TTFT grows without bound" in text
    assert "TPOT × = vanilla TPOT / method TPOT" in text


def test_co_located_prefill_is_a_phase_column(models: tuple[Any, Any]) -> None:
    df = predict([sc("vanilla", prefill="co-located", requests=8)], *models, replications=1)
    assert df["ms_prefill"].iloc[0] > 0
    console = Console(width=200, record=True)
    console.print(terminal.breakdown_table(df))
    text = console.export_text()
    header = next(line for line in text.splitlines() if "decode" in line)
    assert "prefill" in header
    share = 100 * df["ms_prefill"].iloc[0] / (df["ms_prefill"].iloc[0] + df["iter_ms"].iloc[0])
    assert f"{share:.0f}%" in text


def test_rank_by() -> None:
    df = pd.DataFrame({"method": ["vanilla", "vegas", "vegas"], "gamma": [1, 4, 7],
                       "sparsity": [1.0, 0.07, 0.07], "batch": 4, "context": 4096,
                       "output_len": 64, "throughput_tok_s": [100.0, 300.0, 200.0],
                       "goodput_tok_s": [50.0, 10.0, 150.0], "tpot_ms_p50": [9.0, 6.0, 5.0]})
    assert int(best_per_cell(df, "throughput")["gamma"].iloc[0]) == 4
    assert int(best_per_cell(df, "goodput")["gamma"].iloc[0]) == 7
    assert int(argbest(df, "tpot")["gamma"]) == 7
    assert int(argbest(df)["gamma"]) == 4
    with pytest.raises(UserInputError, match="service-level objective"):
        check_rank_by("goodput", slo_given=False)
    with pytest.raises(UserInputError, match="service-level objective"):
        TuneConfig(rank_by="goodput")
    TuneConfig(rank_by="goodput", extra={"slo_tpot_ms": 7.0})
    with pytest.raises(UserInputError, match="analytic"):
        TuneConfig(extra={"arrival": Arrivals.parse("poisson:1")})


def test_bad_slo_is_refused(models: tuple[Any, Any]) -> None:
    with pytest.raises(UserInputError) as err:
        predict([sc(slo_tpot_ms=-1.0)], *models)
    assert err.value.where == "--slo-tpot-ms"


def test_a_trace_of_arrivals_is_served_one_request_per_arrival(
        models: tuple[Any, Any], capacity: float, tmp_path: Any) -> None:
    """--arrival trace:FILE: the file's times (here a burst of 3× capacity, then silence)
    set the requests, and the burst is saturated while its queue drains."""
    gap = 1.0 / (3.0 * capacity)
    path = tmp_path / "arrivals.txt"
    path.write_text("\n".join(f"{i * gap:.6f}" for i in range(60)) + "\n")
    row = predict_one(sc("vanilla", arrival=f"trace:{path}"), *models, replications=1)
    assert row["requests"] == 60 and row["saturated"]
    assert row["offered_rate"] == pytest.approx(3.0 * capacity, rel=0.01)
    csv_path = tmp_path / "arrivals.csv"
    csv_path.write_text("arrival_s,input_len,output_len\n0.0,1024,16\n0.5,2048,32\n")
    two = predict_one(sc("vanilla", arrival=f"trace:{csv_path}"), *models, replications=1)
    assert two["requests"] == 2 and not two["saturated"]


def test_a_bad_arrival_trace_names_its_line(tmp_path: Any) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("0.0\n0.5\nsoon\n")
    with pytest.raises(UserInputError, match="line 3") as err:
        Arrivals.parse(f"trace:{path}")
    assert err.value.where == f"--arrival trace:{path}"
    with pytest.raises(UserInputError, match="cannot read"):
        Arrivals.parse(f"trace:{tmp_path / 'missing.txt'}")


def test_draft_step_share_compares_steps_at_the_methods_batch(
        models: tuple[Any, Any], capacity: float) -> None:
    """Under an arrival rate vanilla runs more sequences than Vegas (it serves each slower), so
    its simulated decode steps are of a larger batch; the draft-step share is still one step
    against one step at Vegas's own batch: the closed loop at that batch gives the same."""
    df = _pair(models, arrival=f"poisson:{1.5 * capacity:.4g}", batch=16, requests=120)
    van, veg = df.iloc[0], df.iloc[1]
    assert van["mean_running_batch"] > veg["mean_running_batch"] + 1
    closed = predict_one(sc("vegas", batch=round(veg["mean_running_batch"])), *models,
                         replications=1)
    assert veg["draft_step_vs_decode"] == pytest.approx(closed["draft_step_vs_decode"],
                                                         rel=0.02)
