"""Prediction intervals: the parts, which one dominates, and where extrapolation widens."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from vegas_sim import api
from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.context_trend import run_lengths
from vegas_sim.sim.predict import Scenario, predict
from vegas_sim.sim.uncertainty import acceptance_sampling_pct, interval, parts_of, run_sd


def test_interval_combines_parts_in_quadrature_and_names_the_largest() -> None:
    lo, hi, dominant = interval(100.0, {"latency-fit": 3.0, "acceptance-sampling": 4.0,
                                        "extrapolation-distance": 0.0, "simulation": 0.0})
    assert math.isclose(hi - 100.0, 1.96 * 5.0) and math.isclose(100.0 - lo, 1.96 * 5.0)
    assert dominant == "acceptance-sampling"


def test_replay_drops_the_acceptance_and_simulation_parts() -> None:
    row = {"pi_latency_fit_pct": 2.0, "pi_acceptance_pct": 3.0,
           "pi_extrapolation_latency_pct": 1.0, "pi_extrapolation_acceptance_pct": 5.0,
           "pi_simulation_pct": 1.0}
    parts = parts_of(row, acceptance=False, simulation=False)
    assert parts == {"latency-fit": 2.0, "acceptance-sampling": 0.0,
                     "extrapolation-distance": 1.0, "simulation": 0.0}


def test_predict_rows_carry_an_interval_that_widens_beyond_the_measured_batch() -> None:
    latency, acceptance = api.load_models(None, None)[:2]
    inside = Scenario("vegas", 7, 0.07, batch=4, context=32768, output_len=256)
    beyond = Scenario("vegas", 7, 0.07, batch=512, context=1024, output_len=256)
    rows = predict([inside, beyond], latency, acceptance, replications=2)
    for _, r in rows.iterrows():
        assert r["pi_low"] < r["throughput_tok_s"] < r["pi_high"]
        assert r["pi_dominant"]
    assert rows["pi_extrapolation_latency_pct"].iloc[0] == 0.0
    assert rows["pi_extrapolation_latency_pct"].iloc[1] > 0.0


def test_host_protocol_term_lowers_only_the_low_end() -> None:
    parts = {"latency-fit": 1.0, "acceptance-sampling": 0.0, "extrapolation-distance": 0.0,
             "simulation": 0.0}
    lo, hi, dominant = interval(100.0, parts, slower_pct=6.0)
    assert math.isclose(hi - 100.0, 1.96)  # the high end is the symmetric parts' alone
    assert math.isclose(100.0 - lo, math.hypot(1.96, 6.0))
    assert dominant == "host-protocol"


def test_host_protocol_term_only_for_sets_timing_sample_and_select_apart() -> None:
    """The packaged Qwen3-8B set timed sample/select after verify alone: its speculative rows
    get a term of their sample + select share; vanilla and the in-loop SmolLM2 set get none."""
    from vegas_sim.sim.uncertainty import host_protocol_pct

    qwen, acceptance = api.load_models("qwen3-8b")[:2]
    smol = api.load_models("smollm2-135m")[0]
    assert not qwen.host_phases_in_loop and smol.host_phases_in_loop
    sc = Scenario("vegas", 5, 0.05, batch=4, context=8192, output_len=64)
    row = predict([sc], qwen, acceptance, replications=1).iloc[0]
    share = 100.0 * (row["ms_sample"] + row["ms_select"]) / sum(
        row[f"ms_{p}"] for p in ("draft_step", "verify", "select", "sample"))
    assert 0.0 < row["pi_host_protocol_pct"] and math.isclose(
        row["pi_host_protocol_pct"], share, rel_tol=0.05)
    assert row["pi_low"] < row["throughput_tok_s"] * (1 - share / 100.0)
    assert host_protocol_pct(qwen, "vanilla", {"decode": 8.0, "sample": 0.5}) == 0.0
    assert host_protocol_pct(smol, "vegas", {"verify": 1.0, "sample": 1.0}) == 0.0


def test_interval_is_clipped_into_the_all_rejected_and_all_accepted_bounds() -> None:
    from vegas_sim.sim.uncertainty import bounded, physical_bound, rejected_floor

    row = {"method": "vegas", "gamma": 7, "acceptance_length": 4.0, "throughput_tok_s": 100.0}
    assert math.isclose(physical_bound(row), 200.0)  # every draft accepted: 8 of 4 tokens
    assert physical_bound({**row, "method": "vanilla", "gamma": 0}) == math.inf
    # every draft rejected: 1 of 4 tokens, lowered by the latency terms alone (not acceptance's)
    out = {"pi_latency_fit_pct": 5.0, "pi_acceptance_pct": 30.0,
           "pi_extrapolation_latency_pct": 0.0, "pi_extrapolation_acceptance_pct": 80.0,
           "pi_simulation_pct": 0.0, "pi_host_protocol_pct": 0.0, "pi_sampling_mode_pct": 0.0}
    floor = rejected_floor(row, out)
    assert math.isclose(floor, 25.0 * (1 - 1.96 * 0.05))
    assert bounded(-30.0, 250.0, floor, physical_bound(row)) == (floor, 200.0)
    assert rejected_floor({**row, "method": "vanilla"}, out) == 0.0
    assert rejected_floor(row, {**out, "pi_latency_fit_pct": 80.0}) == 0.0  # never negative


def test_far_extrapolation_keeps_the_interval_above_every_draft_rejected() -> None:
    """A context far past every trace widens the acceptance term until the symmetric interval
    would reach 0; the low end stops at the all-rejected throughput instead."""
    latency, acceptance = api.load_models(None, None)[:2]
    sc = Scenario("magicdec-stream", 12, 0.07, batch=4, context=110592, output_len=256,
                  workload="longdoc")
    row = predict([sc], latency, acceptance, replications=1).iloc[0]
    all_rejected = row["throughput_tok_s"] / row["acceptance_length"]
    assert 1.96 * row["pi_extrapolation_acceptance_pct"] > 100.0  # symmetric: below 0
    assert 0.9 * all_rejected < row["pi_low"] <= all_rejected < row["throughput_tok_s"]


def test_dominant_extrapolation_names_its_axis() -> None:
    from vegas_sim.sim.uncertainty import dominant_axis

    axes = {"batch": 0.0, "gamma": 3.0, "sparsity": 8.0, "context": 2.0}
    assert dominant_axis("extrapolation-distance", axes) == "extrapolation-distance (sparsity)"
    assert dominant_axis("latency-fit", axes) == "latency-fit"


def _small_traces(n_requests: int, seed: int = 3) -> pd.DataFrame:
    from tests.sim.test_acceptance import make_acceptance

    return make_acceptance(np.random.default_rng(seed), gammas=(4,), sparsities=(0.05, 0.1),
                           workloads=("code",), temperatures=(0.6,), n_requests=n_requests,
                           n_iterations=20)


def test_a_cell_of_one_run_takes_its_groups_prompt_spread() -> None:
    """A cell traced on one prompt (competitive's buckets are one problem each) has no spread
    of its own, yet its mean stands for every other prompt: its sampling term is the spread of
    the group's runs across buckets, not zero; cells of several runs keep their own."""
    one = AcceptanceModel.from_traces(_small_traces(1), "real")
    dist = one.lookup("vegas", 4, 0.05, 8192, "code", 0.6)
    assert all(src.run_spread > 0.0 for src in dist.sources)
    assert acceptance_sampling_pct(dist) > 0.0

    several = AcceptanceModel.from_traces(_small_traces(6), "real")
    dist = several.lookup("vegas", 4, 0.05, 8192, "code", 0.6)
    x = np.array([2.0, 3.0, 4.0, 5.0])
    assert run_sd(x, 10.0) == pytest.approx(x.std(ddof=1))  # 4 runs: their own sd
    assert run_sd(x[:3], 10.0) == pytest.approx(30.0)  # 3: at least the group's spread
    assert run_sd(x[:3], 0.01) == pytest.approx(x[:3].std(ddof=1))
    assert run_sd(x[:1], 0.5) == pytest.approx(1.0)  # one run: the group's alone
    assert acceptance_sampling_pct(dist) > 0.0


def test_one_run_among_several_takes_the_pooled_within_cell_spread() -> None:
    """One bucket cut to a single prompt: its spread is the other cells' own, pooled."""
    rows = _small_traces(6)
    first = rows[rows["iteration"] == 0]
    keep = first[(first["context"] != 32768) | (first["request"] == 0)][
        ["sparsity", "request", "context"]].rename(columns={"context": "start"})
    runs = rows.merge(rows[rows["iteration"] == 0][["sparsity", "request", "context"]]
                      .rename(columns={"context": "start"}), on=["sparsity", "request"])
    cut = runs.merge(keep, on=["sparsity", "request", "start"]).drop(columns="start")
    model = AcceptanceModel.from_traces(cut[rows.columns], "real")
    group = next(k.group for k in model._cells)
    spread = model.run_spread(group)
    lengths = [run_lengths(model._cells[k]) for k in model._cells if k.bucket < 32768]
    own = np.sqrt(np.mean([np.var(x / x.mean(), ddof=1) for x in lengths]))
    assert spread == pytest.approx(own, rel=0.05)


def test_a_gpu_what_if_widens_the_interval_by_its_distance_from_the_measured_gpu() -> None:
    """The H200 set priced as an A100 (1.66 octaves of bf16 rate) carries the 'gpu' axis at
    WHAT_IF_PCT_PER_OCTAVE per octave, vanilla's row too; the measured GPU none; and tune's
    low end (pi_low_shape) leaves it out, since it moves every configuration together."""
    from vegas_sim.sim.uncertainty import WHAT_IF_PCT_PER_OCTAVE

    latency, acceptance = api.load_models("qwen3-8b")[:2]
    a100 = api.load_models("qwen3-8b", gpu="a100")[0]
    assert latency.what_if_octaves() == 0.0
    assert math.isclose(a100.what_if_octaves(), math.log2(989.0 / 312.0))
    scenarios = [Scenario(m, 7, 0.07, batch=4, context=32768, output_len=256)
                 for m in ("vanilla", "vegas")]
    measured = predict(scenarios, latency, acceptance, replications=2)
    what_if = predict(scenarios, a100, acceptance, replications=2)
    added = what_if["pi_extrapolation_latency_pct"] - measured["pi_extrapolation_latency_pct"]
    assert np.allclose(added, WHAT_IF_PCT_PER_OCTAVE * a100.what_if_octaves())
    widths = (what_if["pi_high"] - what_if["pi_low"]) / what_if["throughput_tok_s"]
    assert (widths > (measured["pi_high"] - measured["pi_low"])
            / measured["throughput_tok_s"]).all()
    vegas = what_if.iloc[1]
    assert vegas["pi_low"] < vegas["pi_low_shape"] < vegas["throughput_tok_s"]
