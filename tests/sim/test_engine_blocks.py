"""Drafting iterations evaluated a block at a time (`IterationCost.of_contexts`, the engine's
`_iterate_drafting`) give what one call per iteration gives, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from tests.sim.engine_golden import fingerprint
from tests.sim.test_engine import RatesDist, geometric_rates
from tests.sim.test_latency import GPU, MODEL, synthetic_latency
from vegas_sim.methods import METHODS, drafts
from vegas_sim.sim.engine import Arrivals, EngineConfig, Lengths, simulate
from vegas_sim.sim.iteration_cost import IterationCost
from vegas_sim.sim.latency import LatencyModel


@pytest.fixture(scope="module")
def fitted() -> LatencyModel:
    return LatencyModel.fit(synthetic_latency(np.random.default_rng(0)), MODEL, GPU)


class OneAtATime:
    """The same cost without `of_contexts`: the engine then prices one iteration a call."""

    def __init__(self, cost: IterationCost) -> None:
        self.cost = cost

    def __call__(self, contexts: np.ndarray) -> float:
        return self.cost(contexts)

    def breakdown(self, contexts: np.ndarray) -> dict[str, float]:
        return self.cost.breakdown(contexts)


def test_rows_equal_the_per_iteration_call(fitted: LatencyModel) -> None:
    rng = np.random.default_rng(5)
    for method in [m for m in METHODS if drafts(m)]:
        for gamma in (1, 5, 12, 20):
            for sparsity in (0.001, 0.07, 0.5):
                cost = fitted.iteration_cost(method, gamma, sparsity)
                for batch in (1, 6, 64):
                    ctx = rng.choice([1, 15, 16, 17, 300, 4096, 100_000, 131_071],
                                     (9, batch)) + rng.integers(0, 3, (9, batch))
                    want = np.array([cost(row) for row in ctx])
                    np.testing.assert_array_equal(cost.of_contexts(ctx), want)


CASES = {  # method, γ, KV capacity (tokens), arrivals: preemption, open loop, Quest's scoring
    "vegas_kv_bound": ("vegas", 6, 40_000, Arrivals("closed")),
    "stream_kv_bound": ("magicdec-stream", 4, 30_000, Arrivals("closed")),
    "quest_poisson": ("magicdec-quest", 5, None, Arrivals("poisson", rate_per_s=20.0)),
    "specextend_users": ("specextend", 3, 60_000, Arrivals("closed", users=9)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_engine_runs_equal_one_iteration_a_call(fitted: LatencyModel, case: str) -> None:
    method, gamma, capacity, arrivals = CASES[case]
    cfg = EngineConfig(method, gamma, 16, 48, Lengths(3000, 900, kind="lognormal", spread=0.5),
                       arrivals=arrivals, kv_capacity_tokens=capacity)
    cost = fitted.iteration_cost(method, gamma, 0.07)
    dist = RatesDist(geometric_rates(0.8, gamma))
    blocks = simulate(cfg, cost, dist, seed=11)
    single = simulate(cfg, OneAtATime(cost), dist, seed=11)  # type: ignore[arg-type]
    assert fingerprint(blocks) == fingerprint(single)
    assert blocks.breakdown_ms == single.breakdown_ms
    assert blocks.preemptions == single.preemptions
    if capacity is not None and case.endswith("kv_bound"):
        assert blocks.preemptions > 0  # the case exercises the KV stop
