"""Block-granular KV admission and preemption: properties (hypothesis) and the golden runs."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.sim.engine_golden import CASES, fingerprint, run_case
from tests.sim.test_engine import LinearCost, RatesDist, geometric_rates
from vegas_sim.errors import UserInputError
from vegas_sim.sim.engine import Arrivals, EngineConfig, EngineResult, Lengths, simulate
from vegas_sim.sim.metrics import summarize
from vegas_sim.sim.workload import OutputLengths

GOLDEN = Path(__file__).parent / "data" / "engine_golden_kv_to_spare.csv"


def _golden() -> list[dict[str, str]]:
    with GOLDEN.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("row", _golden(), ids=lambda r: f"{r['case']}-{r['kv']}")
def test_kv_to_spare_is_bit_identical_to_the_engine_before_admission(row: dict[str, str]
                                                                     ) -> None:
    # the fingerprints were written by the engine that reserved whole requests at admission
    assert row["case"] in CASES
    res = run_case(row["case"], row["kv"])
    assert fingerprint(res) == row["sha256"]
    assert repr(summarize(res).throughput_tok_s) == row["throughput_tok_s"]
    assert res.preemptions == 0


def _tight_run(method: str, gamma: int, batch: int, n: int, out: int, cv: float, block: int,
               room: float, seed: int, arrival: str, recompute: bool,
               cost: LinearCost | None = None) -> EngineResult:
    """A run whose KV cache holds `room` × the largest request (>= 1: every request fits)."""
    lengths = Lengths(40, out, output=OutputLengths.lognormal(out, cv).clipped(4 * out))
    slack = 1 if method == "vanilla" else gamma + 1
    biggest = -(-(40 + 4 * out + slack) // block) * block
    cap = max(int(room * biggest), biggest)
    arrivals = Arrivals.parse(arrival)
    c = EngineConfig(method, gamma, batch, n, lengths, arrivals=arrivals,
                     kv_capacity_tokens=cap, kv_block_size=block)
    dist = None if method == "vanilla" else RatesDist(geometric_rates(0.7, gamma))
    pre = (lambda lens: 0.5 + 0.01 * float(lens.sum())) if recompute else None
    return simulate(c, cost or LinearCost(2.0, 0.001), dist, seed=seed, recompute_fn=pre)


run_args = {
    "method": st.sampled_from(["vanilla", "vegas"]), "gamma": st.integers(1, 8),
    "batch": st.integers(1, 24), "n": st.integers(1, 48), "out": st.integers(1, 120),
    "cv": st.floats(0.0, 1.5), "block": st.sampled_from([1, 4, 16, 32]),
    "room": st.floats(1.0, 8.0), "seed": st.integers(0, 2**32 - 1),
    "arrival": st.sampled_from(["closed", "closed:3", "poisson:200"]), "recompute": st.booleans()}


@settings(max_examples=60, deadline=None)
@given(**run_args)
def test_kv_in_use_never_exceeds_capacity_and_tokens_are_conserved(
        method: str, gamma: int, batch: int, n: int, out: int, cv: float, block: int,
        room: float, seed: int, arrival: str, recompute: bool) -> None:
    res = _tight_run(method, gamma, batch, n, out, cv, block, room, seed, arrival, recompute)
    cap = res.config.kv_capacity_blocks
    assert cap is not None
    # the KV blocks held in every iteration, rebuilt from the segments after the run
    assert res.iter_kv_blocks.max() <= cap
    assert np.all(res.iter_batch >= 1) and np.all(res.iter_batch <= batch)
    # every request emits exactly its output length, however often it was preempted
    np.testing.assert_array_equal(res.emitted, res.output_len)
    assert int(res.iter_tokens.sum()) == int(res.output_len.sum())
    # its segments cover its own iterations 0..n_iters in order, without gaps or overlap
    assert res.seg_request.shape[0] == n + res.preemptions
    for r in range(n):
        mine = np.flatnonzero(res.seg_request == r)
        local, iters = res.seg_first_local[mine], res.seg_iters[mine]
        assert local[0] == 0 and np.all(local[1:] == (local + iters)[:-1])
        assert int(iters.sum()) == int(res.n_iters[r])
        assert np.all(np.diff(res.seg_first_iter[mine]) > 0)
    assert (res.recompute_ms_total > 0) == (recompute and res.preemptions > 0)
    assert np.all(res.finish_ms >= res.first_token_ms)


@settings(max_examples=40, deadline=None)
@given(**run_args)
def test_kv_to_spare_equals_the_unlimited_engine_exactly(
        method: str, gamma: int, batch: int, n: int, out: int, cv: float, block: int,
        room: float, seed: int, arrival: str, recompute: bool) -> None:
    # room for `batch` of the largest possible request: admission and preemption never bind
    res = _tight_run(method, gamma, batch, n, out, cv, block, batch + room, seed, arrival,
                     recompute)
    free = simulate(
        EngineConfig(res.config.method, gamma, batch, n, res.config.lengths,
                     arrivals=res.config.arrivals, kv_block_size=block),
        LinearCost(2.0, 0.001),
        None if method == "vanilla" else RatesDist(geometric_rates(0.7, gamma)), seed=seed)
    assert res.preemptions == 0
    for name in ("finish_ms", "first_token_ms", "admit_ms", "iter_ms", "iter_start_ms",
                 "iter_tokens", "iter_batch", "iter_kv_blocks"):
        np.testing.assert_array_equal(getattr(res, name), getattr(free, name))


class SumCost(LinearCost):
    """LinearCost that also prices many iterations at once from their Σ contexts: the engine
    then runs vanilla in blocks (`_iterate_vanilla`)."""

    sum_only = True

    def of_sums(self, csums: np.ndarray, batch: int) -> np.ndarray:
        return self.a + self.b * csums


@settings(max_examples=60, deadline=None)
@given(**{**run_args, "method": st.just("vanilla"),
          "arrival": st.sampled_from(["closed", "closed:3", "poisson:200", "poisson:5000"])})
def test_vanilla_in_blocks_is_bit_identical_to_one_iteration_at_a_time(
        method: str, gamma: int, batch: int, n: int, out: int, cv: float, block: int,
        room: float, seed: int, arrival: str, recompute: bool) -> None:
    # KV-tight (preemption, exact checks), open and closed loops, recompute stalls
    res = _tight_run(method, gamma, batch, n, out, cv, block, room, seed, arrival, recompute)
    blocks = _tight_run(method, gamma, batch, n, out, cv, block, room, seed, arrival,
                        recompute, cost=SumCost(2.0, 0.001))
    assert fingerprint(blocks) == fingerprint(res)
    assert blocks.preemptions == res.preemptions
    assert blocks.breakdown_ms == res.breakdown_ms
    np.testing.assert_array_equal(blocks.iter_kv_blocks, res.iter_kv_blocks)


def test_vanilla_in_blocks_lets_an_arrival_due_at_an_iteration_end_join_there() -> None:
    # iterations of exactly 2 ms: the second request arrives as the first's second iteration
    # ends, and joins at that boundary in both engines (not one iteration later)
    c = EngineConfig("vanilla", 1, 2, 2, Lengths(10, 20),
                     arrivals=Arrivals.trace([0.0, 0.004]))
    one, blocks = (simulate(c, cost, None) for cost in (LinearCost(2.0, 0.0),
                                                          SumCost(2.0, 0.0)))
    assert fingerprint(blocks) == fingerprint(one)
    assert blocks.admit_ms.tolist() == [0.0, 4.0]


def test_preemption_takes_the_most_recently_admitted_and_requeues_it_first() -> None:
    # 4 identical requests, room for 3 at admission; they outgrow it and the 4th admitted
    # (request 2 or 3, whichever was admitted last) is preempted first
    c = EngineConfig("vanilla", 1, 4, 4, Lengths(30, 40), kv_capacity_tokens=4 * 32 - 1,
                     kv_block_size=1)
    res = simulate(c, LinearCost(), None)
    assert res.preemptions >= 1
    first_victim = int(res.seg_request[0])  # the first segment to end is the first preempted
    assert first_victim == 3  # admitted last (FCFS admission order 0, 1, 2, 3)
    m = summarize(res)
    assert 1 <= m.mean_running_batch < 4 and m.preemptions == res.preemptions


def test_a_request_that_cannot_fit_alone_is_refused_with_the_fix() -> None:
    c = EngineConfig("vegas", 3, 8, 4, Lengths(100, 100), kv_capacity_tokens=200,
                     kv_block_size=16)
    with pytest.raises(UserInputError) as err:
        simulate(c, LinearCost(), RatesDist([0.5, 0.2, 0.1]))
    assert err.value.where == "--context/--output-len" and "KV" in err.value.problem
    assert err.value.fix
    # 204 tokens in 16-token blocks is 13 blocks = 208 tokens: fits alone, runs one at a time
    ok = simulate(c.__class__(**{**c.__dict__, "kv_capacity_tokens": 208}), LinearCost(),
                  RatesDist([0.5, 0.2, 0.1]))
    assert int(ok.iter_batch.max()) == 1


def test_output_length_distributions() -> None:
    rng = np.random.default_rng(0)
    ln = OutputLengths.parse("lognormal:2000,0.5")
    x = ln.draw(rng, 20000)
    assert abs(x.mean() / 2000 - 1) < 0.02 and abs(x.std() / x.mean() / 0.5 - 1) < 0.05
    assert ln.clipped(2500).draw(rng, 1000).max() == 2500
    assert OutputLengths.parse("64").draw(rng, 3).tolist() == [64, 64, 64]
    assert OutputLengths.parse("8K").mean == 8192  # --context's suffixes
    assert OutputLengths.parse("lognormal:19.5K,0.4").mean == 19968
    assert OutputLengths.parse("lognormal:19680.5,0.4").mean == 19680.5  # a mean, not a count
    s = OutputLengths.from_samples([5, 9], "file:x")
    assert set(s.draw(rng, 100).tolist()) == {5, 9} and s.max_output() == 9
    assert s.moments() == (7.0, 53.0)
    for bad in ("lognormal:5", "exp:3", "x", "8X", "1,2", "lognormal:1.1K,0.4"):
        with pytest.raises(UserInputError):
            OutputLengths.parse(bad)


def test_output_len_option_reads_numbers_distributions_and_files(tmp_path: Path) -> None:
    from vegas_sim.api import output_lengths

    assert output_lengths("1024") == (1024, None)
    mean, dist = output_lengths("lognormal:19680,0.4")
    assert mean == 19680 and dist is not None and dist.cv == 0.4
    (tmp_path / "lens.txt").write_text("100\n300\n\n200\n")
    mean, dist = output_lengths(f"file:{tmp_path / 'lens.txt'}")
    assert mean == 200 and dist is not None and sorted(dist.samples) == [100, 200, 300]
    (tmp_path / "runs.csv").write_text("prompt,output_tokens\n5,10\n6,30\n")
    assert output_lengths(f"file:{tmp_path / 'runs.csv'}")[0] == 20
    with pytest.raises(UserInputError) as err:
        output_lengths(f"file:{tmp_path / 'runs.csv'}#nope")
    assert "output_tokens" in str(err.value.fix)
    with pytest.raises(UserInputError):
        output_lengths(f"file:{tmp_path / 'missing.txt'}")
