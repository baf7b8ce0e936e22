"""SimPy engine: exact timelines on tiny scenarios, invariants (hypothesis), metrics, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from vegas_sim.errors import UserInputError
from vegas_sim.sim.engine import (
    Arrivals,
    EngineConfig,
    EngineResult,
    Lengths,
    simulate,
)
from vegas_sim.sim.metrics import mean_ci, steady_window, summarize, weighted_percentiles


# ---------------------------------------------------------------------------- fakes
class LinearCost:
    """Iteration time a + b·Σ contexts (ms): the shape of the real model, known exactly."""

    def __init__(self, a: float = 1.0, b: float = 0.1) -> None:
        self.a, self.b = a, b
        self.calls = 0

    def __call__(self, contexts: np.ndarray) -> float:
        self.calls += 1
        return self.a + self.b * float(contexts.sum())

    def breakdown(self, contexts: np.ndarray) -> dict[str, float]:
        return {"verify": self.a, "draft_step": self.b * float(contexts.sum())}


class FixedDist:
    """Every iteration accepts exactly `k` drafts."""

    def __init__(self, gamma: int, k: int) -> None:
        self.gamma, self.k = gamma, k

    @property
    def mean_length(self) -> float:
        return 1.0 + self.k

    def sample(self, rng: np.random.Generator, n_requests: int, n_iterations: int) -> np.ndarray:
        return np.full((n_requests, n_iterations), self.k, np.int64)


class RatesDist:
    """Independent iterations with per-position rates r_i = P(accepted >= i)."""

    def __init__(self, rates: list[float]) -> None:
        self.rates = np.asarray(rates, dtype=np.float64)
        self.gamma = len(rates)

    @property
    def mean_length(self) -> float:
        return 1.0 + float(self.rates.sum())

    def sample(self, rng: np.random.Generator, n_requests: int, n_iterations: int) -> np.ndarray:
        u = rng.random((n_requests, n_iterations, 1))  # [R, W, 1]
        return np.sum(u < self.rates[None, None, :], axis=2).astype(np.int64)  # [R, W]


def geometric_rates(p: float, gamma: int) -> list[float]:
    return [p**i for i in range(1, gamma + 1)]


def cfg(method: str = "vegas", gamma: int = 3, batch: int = 1, n: int = 1, inp: int = 10,
        out: int = 5, **kw: object) -> EngineConfig:
    return EngineConfig(method, gamma, batch, n, Lengths(inp, out), **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- timelines
def test_single_request_timeline_by_hand() -> None:
    # γ=3, 1 accepted → 2 tokens/iter: tokens 2, 2, 1 (capped); contexts 10, 12, 14
    # iteration times 1 + 0.1·ctx = 2.0, 2.2, 2.4 → ends 2.0, 4.2, 6.6
    res = simulate(cfg(), LinearCost(), FixedDist(3, 1))
    np.testing.assert_allclose(res.iter_ms, [2.0, 2.2, 2.4])
    np.testing.assert_allclose(res.iter_start_ms, [0.0, 2.0, 4.2])
    assert res.iter_tokens.tolist() == [2, 2, 1]
    assert res.n_iters.tolist() == [3]
    assert res.first_token_ms[0] == pytest.approx(2.0)
    assert res.finish_ms[0] == pytest.approx(6.6)
    m = summarize(res)
    assert m.tpot_ms_p50 == pytest.approx((6.6 - 2.0) / 4)
    assert m.acceptance_length == pytest.approx(2.0)
    assert m.rates == pytest.approx((1.0, 0.0, 0.0))
    assert m.throughput_tok_s == pytest.approx(5 / 6.6e-3)
    assert m.itl_ms_p50 == pytest.approx(2.3, abs=0.11)  # gaps 2.2 and 2.4


def test_two_requests_batch_one_queue_in_closed_loop() -> None:
    # one user: the second request is submitted when the first finishes and replays its timeline
    res = simulate(cfg(n=2), LinearCost(), FixedDist(3, 1))
    np.testing.assert_allclose(res.arrival_ms, [0.0, 6.6])
    np.testing.assert_allclose(res.finish_ms, [6.6, 13.2])
    assert res.iter_batch.tolist() == [1] * 6


def test_two_requests_batched_together() -> None:
    # contexts [10,10] → 1 + 2.0; [12,12] → 3.4; [14,14] → 3.8
    res = simulate(cfg(batch=2, n=2), LinearCost(), FixedDist(3, 1))
    np.testing.assert_allclose(res.iter_ms, [3.0, 3.4, 3.8])
    np.testing.assert_allclose(res.finish_ms, [10.2, 10.2])
    assert res.iter_batch.tolist() == [2, 2, 2]


def test_each_request_its_own_context() -> None:
    # batch 2, two users but the second request's prompt is longer (dataset lengths)
    seen: list[list[int]] = []

    class Spy(LinearCost):
        def __call__(self, contexts: np.ndarray) -> float:
            seen.append(sorted(contexts.tolist()))
            return super().__call__(contexts)

    lengths = Lengths.dataset([(10, 2)])
    c = EngineConfig("vegas", 3, 2, 2, lengths,
                     arrivals=Arrivals.trace([0.0, 0.0], [(10, 2), (20, 6)]))
    simulate(c, Spy(), FixedDist(3, 1))
    assert seen == [[10, 20], [22], [24]]


def test_kv_admission_and_preemption_timeline_by_hand() -> None:
    # block size 1: a request holds context + γ + 1 = ctx + 4 slots; 2 tokens per iteration.
    # Capacity 37: 14+14, 16+16, 18+18 all fit, both run together to the end.
    res = simulate(cfg(batch=2, n=2, kv_capacity_tokens=37, kv_block_size=1), LinearCost(),
                   FixedDist(3, 1))
    np.testing.assert_allclose(res.finish_ms, [10.2, 10.2])
    assert res.preemptions == 0
    # Capacity 30: the second iteration needs 16+16 = 32 → the later-admitted request 1 is
    # preempted after one iteration (context 12), resumes when request 0 finishes at 7.6
    # (iterations 3.0, 2.2, 2.4) and runs its last two at context 12, 14 (2.2, 2.4).
    tight = cfg(batch=2, n=2, kv_capacity_tokens=30, kv_block_size=1)
    res = simulate(tight, LinearCost(), FixedDist(3, 1))
    np.testing.assert_allclose(res.finish_ms, [7.6, 12.2])
    np.testing.assert_allclose(res.first_token_ms, [3.0, 3.0])
    assert res.preemptions == 1 and res.emitted.tolist() == [5, 5]
    assert res.iter_batch.tolist() == [2, 1, 1, 1, 1]
    assert res.iter_kv_blocks.tolist() == [28, 16, 18, 16, 18]
    assert list(zip(res.seg_request.tolist(), res.seg_first_iter.tolist(),
                    res.seg_first_local.tolist(), res.seg_iters.tolist())) == [
        (1, 0, 0, 1), (0, 0, 0, 3), (1, 3, 1, 2)]
    # recompute re-prefills prompt + generated (10 + 2 = 12 tokens) on this instance
    res = simulate(tight, LinearCost(), FixedDist(3, 1), recompute_fn=lambda n: float(n.sum()))
    np.testing.assert_allclose(res.finish_ms, [7.6, 24.2])
    assert res.recompute_ms_total == 12.0 and res.prefill_ms_total == 0.0


def test_kv_blocks_round_up() -> None:
    # blocks of 16: capacity 37 → 2 blocks; contexts 10, 12 fit one block each (+4 slack),
    # at 14 each needs 2 → request 1 is preempted before the third iteration
    res = simulate(cfg(batch=2, n=2, kv_capacity_tokens=37), LinearCost(), FixedDist(3, 1))
    np.testing.assert_allclose(res.finish_ms, [8.8, 11.2])
    assert res.preemptions == 1 and res.iter_kv_blocks.max() == 2


def test_vanilla_one_token_per_iteration() -> None:
    res = simulate(cfg("vanilla", out=3), LinearCost(), None)
    np.testing.assert_allclose(res.iter_ms, [2.0, 2.1, 2.2])
    assert res.finish_ms[0] == pytest.approx(6.3)
    assert summarize(res).acceptance_length == 1.0


def test_trace_arrivals_leave_the_instance_idle() -> None:
    c = cfg(batch=4, n=2, arrivals=Arrivals.trace([0.0, 100.0]))
    res = simulate(c, LinearCost(), FixedDist(3, 1))
    np.testing.assert_allclose(res.arrival_ms, [0.0, 100_000.0])
    np.testing.assert_allclose(res.finish_ms, [6.6, 100_006.6])


def test_colocated_prefill_stalls_decoding() -> None:
    c = cfg(batch=2, n=2, prefill="co-located")
    res = simulate(c, LinearCost(), FixedDist(3, 1), prefill_fn=lambda lens: 0.5 * len(lens))
    # both prefilled (1.0 ms) before the three batched iterations of 3.0, 3.4, 3.8
    np.testing.assert_allclose(res.finish_ms, [11.2, 11.2])
    assert res.prefill_ms_total == pytest.approx(1.0)
    assert summarize(res).breakdown_ms["prefill"] == pytest.approx(1.0 / 3)


def test_poisson_arrivals_are_seeded() -> None:
    c = cfg(batch=4, n=20, arrivals=Arrivals.parse("poisson:50"))
    a = simulate(c, LinearCost(), RatesDist([0.8, 0.6, 0.4]), seed=3)
    b = simulate(c, LinearCost(), RatesDist([0.8, 0.6, 0.4]), seed=3)
    d = simulate(c, LinearCost(), RatesDist([0.8, 0.6, 0.4]), seed=4)
    np.testing.assert_array_equal(a.arrival_ms, b.arrival_ms)
    assert not np.array_equal(a.arrival_ms, d.arrival_ms)
    gaps = np.diff(np.concatenate([[0.0], a.arrival_ms]))
    assert 5.0 < gaps.mean() < 60.0  # mean 20 ms at 50/s


def test_vanilla_and_spec_share_requests_with_same_seed() -> None:
    lengths = Lengths(100, 50, kind="uniform", spread=0.5)
    spec = EngineConfig("vegas", 3, 4, 12, lengths)
    van = EngineConfig("vanilla", 3, 4, 12, lengths)
    a = simulate(spec, LinearCost(), RatesDist([0.7, 0.5, 0.3]), seed=9)
    b = simulate(van, LinearCost(), None, seed=9)
    np.testing.assert_array_equal(a.output_len, b.output_len)
    np.testing.assert_array_equal(a.input_len, b.input_len)


def test_lengths_distributions() -> None:
    rng = np.random.default_rng(0)
    for kind in ("uniform", "lognormal"):
        inp, out = Lengths(1000, 200, kind=kind, spread=0.3).draw(rng, 4000)
        assert inp.min() >= 1 and out.min() >= 1
        assert abs(inp.mean() / 1000 - 1) < 0.03 and abs(out.mean() / 200 - 1) < 0.03
        assert inp.std() > 0
    inp, out = Lengths.dataset([(5, 7), (9, 11)]).draw(rng, 100)
    assert set(zip(inp.tolist(), out.tolist())) == {(5, 7), (9, 11)}


# ---------------------------------------------------------------------------- invariants
def _run(method: str, gamma: int, batch: int, n: int, out: int, seed: int, p: float,
         cap: int | None = None) -> EngineResult:
    dist = None if method == "vanilla" else RatesDist(geometric_rates(p, gamma))
    c = EngineConfig(method, gamma, batch, n, Lengths(64, out, kind="uniform", spread=0.5),
                     kv_capacity_tokens=cap)
    return simulate(c, LinearCost(2.0, 0.001), dist, seed=seed)




@settings(max_examples=30, deadline=None)
@given(method=st.sampled_from(["vanilla", "vegas"]), gamma=st.integers(1, 8),
       batch=st.integers(1, 16), n=st.integers(1, 40), out=st.integers(1, 80),
       seed=st.integers(0, 2**32 - 1), p=st.floats(0.0, 1.0))
def test_invariants(method: str, gamma: int, batch: int, n: int, out: int, seed: int,
                    p: float) -> None:
    res = _run(method, gamma, batch, n, out, seed, p)
    m = summarize(res)
    # tokens conserved: every generated token belongs to a request's output
    assert int(res.iter_tokens.sum()) == int(res.output_len.sum()) == m.generated_tokens
    assert 1.0 <= m.acceptance_length <= gamma + 1
    assert all(0.0 <= r <= 1.0 for r in m.rates)
    assert list(m.rates) == sorted(m.rates, reverse=True)
    # no-overhead bound: ≤ B·(γ+1) tokens per iteration, each iteration ≥ the fixed 2 ms
    per_iter = 1 if method == "vanilla" else gamma + 1
    assert m.throughput_tok_s <= batch * per_iter / 2e-3 * (1 + 1e-9)
    assert np.all(res.iter_batch <= batch) and np.all(res.iter_batch >= 1)
    assert np.all(res.finish_ms >= res.first_token_ms)
    assert np.all(res.admit_ms >= res.arrival_ms)
    # same seed ⇒ identical result
    again = _run(method, gamma, batch, n, out, seed, p)
    np.testing.assert_array_equal(res.iter_ms, again.iter_ms)
    np.testing.assert_array_equal(res.finish_ms, again.finish_ms)
    assert summarize(again).throughput_tok_s == m.throughput_tok_s


@settings(max_examples=40, deadline=None)
@given(gamma=st.integers(1, 6), k=st.integers(0, 6), batch=st.integers(1, 12),
       waves=st.integers(1, 5), out=st.integers(1, 60), cap_a=st.integers(0, 12),
       extra=st.integers(0, 12))
@example(gamma=1, k=0, batch=8, waves=2, out=22, cap_a=5, extra=1)
def test_more_kv_capacity_never_lowers_closed_loop_throughput(
        gamma: int, k: int, batch: int, waves: int, out: int, cap_a: int, extra: int) -> None:
    """Over the whole run (every token over the makespan). The steady window is not monotone
    in the room: it ends at the first departure after the last (re)admission, and more room
    can move that readmission later, past a slow stretch (the example: room for 6 → 7
    requests, the run 2225 → 2312 tok/s, its window 2530 → 2312)."""
    k = min(k, gamma)
    need = 64 + out + gamma + 1
    thr = []
    for fits in (1 + cap_a, 1 + cap_a + extra):  # requests that fit the KV cache at once
        c = EngineConfig("vegas", gamma, batch, waves * batch, Lengths(64, out),
                         kv_capacity_tokens=fits * need, kv_block_size=1)
        res = simulate(c, LinearCost(2.0, 0.001), FixedDist(gamma, k))
        thr.append(float(res.output_len.sum()) / res.sim_time_ms)
    assert thr[1] >= thr[0] * (1 - 1e-9)


def test_breakdown_sums_to_mean_iteration_time() -> None:
    res = _run("vegas", 4, 8, 64, 200, 1, 0.8)
    m = summarize(res)
    assert sum(m.breakdown_ms.values()) == pytest.approx(m.iter_ms, rel=1e-9)


# ---------------------------------------------------------------------------- window, metrics
def test_steady_window_excludes_the_drain() -> None:
    # batch 2, 3 requests of different lengths: the last admission happens when the short one
    # finishes; the window ends at the next departure, before the tail where one request runs
    c = EngineConfig("vanilla", 1, 2, 3, Lengths(),
                     arrivals=Arrivals.trace([0, 0, 0], [(10, 2), (10, 6), (10, 6)]))
    res = simulate(c, LinearCost(), None)
    g0, g1 = steady_window(res)
    # r0 finishes after iteration 1; r2 admitted at iteration 2; r1 leaves after iteration 5
    assert (g0, g1) == (0, 5)
    assert res.iter_batch.tolist() == [2, 2, 2, 2, 2, 2, 1, 1]
    m = summarize(res)
    assert m.window_tokens == 12
    assert m.throughput_tok_s == pytest.approx(12 / (res.iter_end_ms[5] / 1000))


def test_lockstep_closed_loop_window_is_whole_run() -> None:
    res = simulate(cfg("vanilla", batch=4, n=16, out=8), LinearCost(), None)
    assert steady_window(res) == (0, res.iterations - 1)


def test_mean_ci_student_t() -> None:
    m, lo, hi = mean_ci([1.0, 2.0, 3.0])
    # t(0.975, 2) = 4.3027; sd = 1; half = 4.3027 / sqrt(3)
    assert m == 2.0 and hi - m == pytest.approx(4.302653 / math.sqrt(3), rel=1e-5)
    assert lo == pytest.approx(2 * m - hi)
    assert mean_ci([5.0]) == (5.0, 5.0, 5.0)


def test_weighted_percentiles() -> None:
    v, w = np.array([3.0, 1.0, 2.0]), np.array([1, 1, 2])
    assert weighted_percentiles(v, w, [25, 50, 75, 100]) == [1.0, 2.0, 2.0, 3.0]


def test_breakdown_is_sampled_not_every_iteration() -> None:
    calls: list[int] = []

    class Count(LinearCost):
        def breakdown(self, contexts: np.ndarray) -> dict[str, float]:
            calls.append(1)
            return super().breakdown(contexts)

    res = simulate(cfg("vanilla", batch=2, n=2, out=500), Count(), None)
    assert 0 < len(calls) < res.iterations / 10


# ---------------------------------------------------------------------------- errors
@pytest.mark.parametrize(("kwargs", "where"), [
    ({"batch": 0}, "--batch"),
    ({"n": 0}, "--requests"),
    ({"prefill": "remote"}, "--prefill"),
    ({"kv_capacity_tokens": 18}, "--context/--output-len"),
    ({"arrivals": Arrivals.trace([0.0, 1.0])}, "arrival trace"),
    ({"arrivals": Arrivals("poisson", rate_per_s=0.0)}, "--arrival"),
])
def test_config_errors_name_the_input(kwargs: dict[str, object], where: str) -> None:
    with pytest.raises(UserInputError) as err:
        simulate(cfg(**kwargs), LinearCost(), FixedDist(3, 1))  # type: ignore[arg-type]
    assert err.value.where == where and err.value.fix


def test_arrival_parse() -> None:
    assert Arrivals.parse("closed") == Arrivals("closed")
    assert Arrivals.parse("closed:8").users == 8
    assert Arrivals.parse("poisson:2.5").rate_per_s == 2.5
    for bad in ("poisson", "poisson:x", "uniform:3"):
        with pytest.raises(UserInputError, match="--arrival"):
            Arrivals.parse(bad)


def test_mismatched_acceptance_is_refused() -> None:
    with pytest.raises(UserInputError, match="gamma"):
        simulate(cfg(gamma=4), LinearCost(), FixedDist(3, 1))
    with pytest.raises(UserInputError, match="vanilla"):
        simulate(cfg("vanilla"), LinearCost(), FixedDist(3, 1))
    with pytest.raises(UserInputError, match="prefill"):
        simulate(cfg(prefill="co-located"), LinearCost(), FixedDist(3, 1))


def test_measured_rates_match_the_distribution() -> None:
    rates = [0.9, 0.7, 0.4, 0.2]
    c = EngineConfig("vegas", 4, 16, 64, Lengths(100, 400))
    m = summarize(simulate(c, LinearCost(), RatesDist(rates), seed=0))
    np.testing.assert_allclose(m.rates, rates, atol=0.02)
    assert m.acceptance_length == pytest.approx(1 + sum(rates), abs=0.05)


def test_runs_with_the_real_acceptance_dist() -> None:
    from vegas_sim.sim.acceptance_dist import AcceptanceDist

    dist = AcceptanceDist("vegas", 3, np.array([0.8, 0.6, 0.3]))  # hand-built: independent
    res = simulate(cfg(batch=4, n=8, out=100), LinearCost(), dist, seed=1)
    assert int(res.iter_tokens.sum()) == 800
    assert 1.0 < summarize(res).acceptance_length < 4.0


@pytest.mark.parametrize(("arrive_ms", "admit_ms", "finish_ms"), [
    # joins at the boundary 2.0: A [10] 2.0; A,B [12,10] 3.2, [14,12] 3.6 → A 8.8; B [14] 2.4
    (1.0, 2.0, [8.8, 11.2]),  # mid-iteration: waits for the boundary
    (2.0, 2.0, [8.8, 11.2]),  # exactly at the boundary: joins it
    # just after: A [10] 2.0, [12] 2.2; A,B [14,10] 3.4 → A 7.6; B [12] 2.2, [14] 2.4
    (2.0001, 4.2, [7.6, 12.2]),
])
def test_arrival_joins_at_the_next_iteration_boundary(arrive_ms: float, admit_ms: float,
                                                      finish_ms: list[float]) -> None:
    c = cfg(batch=2, n=2, arrivals=Arrivals.trace([0.0, arrive_ms / 1000.0]))
    res = simulate(c, LinearCost(), FixedDist(3, 1))
    assert res.admit_ms[1] == pytest.approx(admit_ms)
    np.testing.assert_allclose(res.finish_ms, finish_ms)


def test_window_acceptance_is_tokens_per_running_request_iteration() -> None:
    """A closed batch whose requests accept 0 then 3 drafts per iteration: the window (until
    the first request finishes) sees the early iterations only, the whole-run mean all."""
    from vegas_sim.sim.acceptance_dist import FixedSequences

    # request 0: 1 + 4 + 4 = 9 tokens in 3 iterations; request 1: 1, 1, 1, 4, 4 (12 tokens)
    seqs = FixedSequences(3, [[0, 3, 3, 3, 3], [0, 0, 0, 3, 3]])
    res = simulate(cfg(batch=2, n=2, out=9), LinearCost(), seqs)
    m = summarize(res)
    assert steady_window(res) == (0, 2)  # request 0 finishes in iteration 3
    assert m.window_tokens == 9 + 3 and m.window_acceptance_length == pytest.approx(12 / 6)
    # over every iteration that ran (before truncation): (0 + 3 + 3) + (0 + 0 + 0 + 3 + 3)
    assert m.acceptance_length == pytest.approx(1 + 12 / 8)
