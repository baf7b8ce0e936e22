"""Closed-form model: renewal iterations, truncation, and agreement with the SimPy engine."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.sim.test_engine import LinearCost, RatesDist, geometric_rates
from vegas_sim.sim.analytic import (
    analytic_throughput,
    expected_iterations,
    length_pmf,
)
from vegas_sim.sim.engine import EngineConfig, Lengths, simulate
from vegas_sim.sim.metrics import summarize


def test_length_pmf_from_rates() -> None:
    pmf = length_pmf(np.array([0.8, 0.5, 0.1]))
    np.testing.assert_allclose(pmf, [0.2, 0.3, 0.4, 0.1])
    assert np.dot(np.arange(1, 5), pmf) == pytest.approx(1 + 0.8 + 0.5 + 0.1)


@pytest.mark.parametrize("out", [1, 7, 8, 9, 100, 25_001])
def test_deterministic_acceptance_iterations_are_ceil(out: int) -> None:
    # all drafts accepted: every iteration yields γ+1 = 8 tokens, the last one truncated
    assert expected_iterations(np.ones(7), out) == pytest.approx(math.ceil(out / 8), abs=1.0
                                                                 if out > 20_000 else 1e-12)


def test_vanilla_iterations_equal_output() -> None:
    assert expected_iterations(np.zeros(0), 37) == 37


def test_expected_iterations_match_monte_carlo() -> None:
    rates = np.array(geometric_rates(0.7, 5))
    rng = np.random.default_rng(0)
    lens = 1 + RatesDist(list(rates)).sample(rng, 20_000, 40)  # [R, W] acceptance lengths
    iters = np.sum(np.cumsum(lens, axis=1) < 50, axis=1) + 1
    assert expected_iterations(rates, 50) == pytest.approx(iters.mean(), rel=0.01)


def test_integrated_equals_midpoint_for_linear_cost() -> None:
    rates = np.array(geometric_rates(0.8, 6))
    a = analytic_throughput(LinearCost(3.0, 1e-4), rates, 8, 4096, 2048)
    b = analytic_throughput(LinearCost(3.0, 1e-4), rates, 8, 4096, 2048, integrate=True)
    assert a.throughput_tok_s == pytest.approx(b.throughput_tok_s, rel=1e-3)


def test_closed_form_by_hand() -> None:
    # vanilla, B=2, C=10, L=3: contexts 10, 11, 12 → mean cost 1 + 0.1·2·11 = 3.2 ms, 2 tok/iter
    r = analytic_throughput(LinearCost(), np.zeros(0), 2, 10, 3)
    assert r.iter_ms == pytest.approx(3.2)
    assert r.throughput_tok_s == pytest.approx(2 / 3.2e-3)


@pytest.mark.parametrize(("gamma", "p", "batch", "context", "out"), [
    (7, 0.8, 16, 4096, 2048),
    (3, 0.5, 32, 1000, 1000),
    (6, 0.9, 4, 32768, 1024),
])
def test_engine_agrees_with_closed_form(gamma: int, p: float, batch: int, context: int,
                                        out: int) -> None:
    rates = geometric_rates(p, gamma)
    cost = LinearCost(5.0, 1e-5)
    c = EngineConfig("vegas", gamma, batch, 10 * batch, Lengths(context, out))
    sim = np.mean([summarize(simulate(c, cost, RatesDist(rates), seed=s)).throughput_tok_s
                   for s in range(2)])
    closed = analytic_throughput(cost, np.array(rates), batch, context, out)
    assert sim == pytest.approx(closed.throughput_tok_s, rel=0.02)


def test_engine_agrees_with_closed_form_vanilla() -> None:
    cost = LinearCost(5.0, 1e-5)
    c = EngineConfig("vanilla", 1, 8, 32, Lengths(4096, 512))
    sim = summarize(simulate(c, cost, None)).throughput_tok_s
    closed = analytic_throughput(cost, np.zeros(0), 8, 4096, 512)
    assert sim == pytest.approx(closed.throughput_tok_s, rel=1e-6)
