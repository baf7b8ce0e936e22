"""Prediction intervals: the parts, which one dominates, and where extrapolation widens."""

from __future__ import annotations

import math

from vegas_sim import api
from vegas_sim.sim.predict import Scenario, predict
from vegas_sim.sim.uncertainty import interval, parts_of


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
