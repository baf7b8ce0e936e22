"""TTFT as engines report it: the prefill's token, after the prefill stage (disaggregated) or
the prefill on the decode GPU (co-located); no draft→verify iteration before it."""

from __future__ import annotations

import numpy as np
import pytest

from tests.sim.test_engine import FixedDist, LinearCost
from vegas_sim.sim.engine import Arrivals, EngineConfig, Lengths, prefill_stage, simulate
from vegas_sim.sim.metrics import summarize

PREFILL_MS = 100.0


def _prefill(lens: np.ndarray) -> float:
    return PREFILL_MS * len(lens)


def test_prefill_stage_queues_fcfs_over_its_gpus() -> None:
    arrivals = np.array([0.0, 0.0, 10.0, 500.0])
    lens = np.array([1000, 1000, 1000, 1000])
    one = prefill_stage(arrivals, lens, _prefill, 1, 0.01)  # 10 ms of transfer each
    np.testing.assert_allclose(one, [110.0, 210.0, 310.0, 610.0])
    two = prefill_stage(arrivals, lens, _prefill, 2, 0.01)
    np.testing.assert_allclose(two, [110.0, 110.0, 210.0, 610.0])


def _run(method: str, prefill: str, arrivals: Arrivals, n: int = 4) -> object:
    cfg = EngineConfig(method=method, gamma=4 if method != "vanilla" else 1, max_batch=4,
                       n_requests=n, lengths=Lengths(1000, 32), arrivals=arrivals,
                       prefill=prefill, kv_transfer_ms_per_token=0.01)
    dist = None if method == "vanilla" else FixedDist(4, 2)
    return simulate(cfg, LinearCost(20.0, 0.0), dist, seed=1, prefill_fn=_prefill)


@pytest.mark.parametrize("method", ["vanilla", "vegas"])
def test_disaggregated_ttft_is_queueing_prefill_and_transfer(method: str) -> None:
    res = _run(method, "disaggregated", Arrivals.trace([0.0, 0.001, 0.002, 0.003]))  # s
    ttft = res.first_output_ms - res.arrival_ms  # type: ignore[attr-defined]
    # one prefill GPU: each waits for those before it; 10 ms of KV transfer; slots are free
    np.testing.assert_allclose(ttft, [110.0, 209.0, 308.0, 407.0])
    assert np.all(res.first_token_ms > res.first_output_ms)  # type: ignore[attr-defined]


def test_the_first_token_does_not_wait_for_a_draft() -> None:
    """Vanilla and a γ-4 method see the same TTFT: the prefill's token streams at once; the
    draft→verify iteration (80 ms here, a vanilla step 20 ms) comes after it."""
    closed = Arrivals("closed")
    van = summarize(_run("vanilla", "disaggregated", closed))  # type: ignore[arg-type]
    spec = summarize(_run("vegas", "disaggregated", closed))  # type: ignore[arg-type]
    assert van.ttft_ms_p50 == pytest.approx(PREFILL_MS + 10.0)  # run ahead, then transfer
    assert spec.ttft_ms_p50 == pytest.approx(van.ttft_ms_p50)
    colo_v = summarize(_run("vanilla", "co-located", closed))  # type: ignore[arg-type]
    colo_s = summarize(_run("vegas", "co-located", closed))  # type: ignore[arg-type]
    # the four prompts are prefilled one after another on the decode GPU
    assert colo_v.ttft_ms_p50 == pytest.approx(colo_s.ttft_ms_p50)
    assert colo_v.ttft_ms_p50 == pytest.approx(250.0)  # median of 100, 200, 300, 400


def test_throughput_of_a_closed_loop_is_unchanged_by_the_prefill_stage() -> None:
    """The prefill runs ahead in a closed loop: the decode timeline is the paper's."""
    closed = Arrivals("closed")
    staged = _run("vegas", "disaggregated", closed)
    cfg = EngineConfig(method="vegas", gamma=4, max_batch=4, n_requests=4,
                       lengths=Lengths(1000, 32), arrivals=closed)
    bare = simulate(cfg, LinearCost(20.0, 0.0), FixedDist(4, 2), seed=1)
    np.testing.assert_array_equal(staged.finish_ms, bare.finish_ms)  # type: ignore[attr-defined]
