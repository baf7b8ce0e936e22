"""Acceptance model: a smaller γ walked again, decay extrapolation, interpolation, labels, bootstrap,
smoothing over neighbouring cells and the rate-matching replay."""

from __future__ import annotations

import copy
import math
import pickle
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vegas_sim.errors import TraceSetError, UserInputError
from vegas_sim.sim.acceptance import AcceptanceModel, smoother_matrix
from vegas_sim.sim.acceptance_dist import AcceptanceDist, RunningLengthDist
from vegas_sim.sim.acceptance_dist import AcceptanceDist, extend_rates
from vegas_sim.sim.acceptance_dist import match_rates as _match_rates
from vegas_sim.sim.acceptance_dist import uniform16
from vegas_sim.sim.context_trend import parse_trend_note, shift_rates
from vegas_sim.traces.schema import ACCEPTANCE_SCHEMA

BASE = {0.05: 0.55, 0.1: 0.72, 0.2: 0.86}  # first-position acceptance by sparsity (monotone)


def acceptance_frame(recs: Sequence[tuple[object, ...]]) -> pd.DataFrame:
    """acceptance.parquet rows from tuples in the schema's column order."""
    return pd.DataFrame(recs, columns=ACCEPTANCE_SCHEMA.names)


def make_acceptance(
    rng: np.random.Generator,
    methods: tuple[str, ...] = ("vegas",),
    gammas: tuple[int, ...] = (4, 8),
    sparsities: tuple[float, ...] = (0.05, 0.1, 0.2),
    contexts: tuple[int, ...] = (1024, 8192, 32768),
    workloads: tuple[str, ...] = ("chat", "code"),
    temperatures: tuple[float, ...] = (0.0, 0.6),
    n_requests: int = 8,
    n_iterations: int = 30,
) -> pd.DataFrame:
    """Synthetic traces: per-request ease follows an AR(1) (correlated iterations); the
    conditional acceptance of position i decays with i; greedy probabilities are 0/1."""
    recs = []
    for m in methods:
        for g in gammas:
            for s in sparsities:
                for c0 in contexts:
                    for wl in workloads:
                        for temp in temperatures:
                            base = BASE[s] * (0.97 if c0 > 4096 else 1.0) * (
                                0.95 if wl == "chat" else 1.0)
                            for req in range(n_requests):
                                ease, ctx = 0.0, c0
                                for it in range(n_iterations):
                                    ease = 0.8 * ease + rng.normal(0, 0.3)
                                    p = np.clip(base * 0.97 ** np.arange(g) + 0.1 * ease,
                                                0.0, 1.0)
                                    if temp == 0.0:
                                        prob = (rng.random(g) < p).astype(float)
                                        ok = prob == 1.0
                                    else:
                                        prob = np.clip(p + rng.normal(0, 0.1, g), 0, 1)
                                        ok = rng.random(g) < prob
                                    acc = int(np.argmin(ok)) if not ok.all() else g
                                    recs.append((m, g, s, math.ceil(s * ctx), ctx, temp, wl,
                                                 req, it, acc, prob.astype(np.float32), "real"))
                                    ctx += acc + 1
    return acceptance_frame(recs)


@pytest.fixture(scope="module")
def traces() -> pd.DataFrame:
    return make_acceptance(np.random.default_rng(0))


@pytest.fixture(scope="module")
def model(traces: pd.DataFrame) -> AcceptanceModel:
    return AcceptanceModel.from_traces(traces, "real")


@pytest.fixture(scope="module")
def raw(traces: pd.DataFrame) -> AcceptanceModel:
    """Every cell on its own data: the exactness properties against the trace rows."""
    return AcceptanceModel.from_traces(traces, "real", smooth=False)


def request_se(values: np.ndarray) -> float:
    """Standard error of the mean of a replay [R, W]: requests are the independent units
    (each replays one traced run), so the SE is that of the R per-request means."""
    per_request = values.mean(axis=1)  # [R]
    return float(per_request.std(ddof=1) / math.sqrt(len(per_request)))


def position_se(smp: np.ndarray, gamma: int) -> np.ndarray:
    """[γ] SE of the replayed per-position rates P(accepted ≥ i)."""
    return np.array([request_se((smp >= i).astype(float)) for i in range(1, gamma + 1)])


def cell_rows(df: pd.DataFrame, gamma: int, s: float, c0: int, temp: float = 0.0) -> pd.DataFrame:
    """Rows of the runs that started at context c0 (all workloads)."""
    first = df[df["iteration"] == 0]
    keys = first[(first["gamma"] == gamma) & (first["sparsity"] == s) & (first["context"] == c0)
                 & (first["temperature"] == temp)][["workload", "request"]]
    sub = df[(df["gamma"] == gamma) & (df["sparsity"] == s) & (df["temperature"] == temp)]
    return sub.merge(keys, on=["workload", "request"]).query("context >= @c0 and context < @c0 * 2")


# ---- refusal and errors -------------------------------------------------------------------


def test_random_weights_refused(traces: pd.DataFrame) -> None:
    with pytest.raises(TraceSetError) as err:
        AcceptanceModel.from_traces(traces, "random")
    assert "model_weights" in str(err.value) and "real" in (err.value.fix or "")
    bad = traces.copy()
    bad.loc[bad.index[5], "model_weights"] = "random"
    with pytest.raises(TraceSetError, match="model_weights"):
        AcceptanceModel.from_traces(bad, "real")


def test_malformed_rows_refused(traces: pd.DataFrame) -> None:
    bad = traces.copy()
    bad.loc[bad.index[0], "accepted"] = 99
    with pytest.raises(TraceSetError, match="accepted"):
        AcceptanceModel.from_traces(bad, "real")
    with pytest.raises(TraceSetError, match="no acceptance rows"):
        AcceptanceModel.from_traces(traces.iloc[:0], "real")
    with pytest.raises(TraceSetError, match="accept_prob"):
        AcceptanceModel.from_traces(traces.drop(columns=["accept_prob"]), "real")


def test_methods_and_workloads_errors(model: AcceptanceModel) -> None:
    with pytest.raises(TraceSetError, match="traced: vegas"):
        model.lookup("specextend", 4, 0.1, 4096)
    with pytest.raises(TraceSetError, match="traced: vegas"):
        model.lookup("eagle", 4, 0.1, 4096)
    with pytest.raises(UserInputError, match="chat, code"):
        model.lookup("vegas", 4, 0.1, 4096, workload="math")


def test_vanilla_needs_no_acceptance(model: AcceptanceModel) -> None:
    d = model.lookup("vanilla", 7, 0.07, 4096)
    assert d.rates.shape == (0,) and d.mean_length == 1.0 and not d.extrapolated
    assert (d.sample(np.random.default_rng(0), 3, 5) == 0).all()


# ---- a smaller γ than traced: the runs walked again ---------------------------------------


def walked_outcomes(rows: pd.DataFrame, gamma: int, traced: int) -> np.ndarray:
    """The accepted counts of `rows`' runs walked at `gamma` by hand: each run's tokens
    (accepted drafts, then the correction, or the bonus counted as accepted), an iteration
    accepting the consecutive accepted tokens from where it starts, at most γ, until a run's
    end leaves one undecided."""
    out: list[int] = []
    for _, run in rows.groupby(["workload", "request"], sort=False):
        tokens: list[bool] = []
        for a in run.sort_values("iteration")["accepted"]:
            tokens += [True] * int(a) + [int(a) >= traced]
        p = 0
        while p < len(tokens):
            k = 0
            while k < gamma and p + k < len(tokens) and tokens[p + k]:
                k += 1
            if k < gamma and p + k >= len(tokens):
                break
            out.append(k)
            p += k + 1
    return np.array(out)


def test_a_smaller_gamma_walks_the_runs_again(traces: pd.DataFrame, raw: AcceptanceModel,
                                              model: AcceptanceModel) -> None:
    """γ below the traced γ_t: the rates and the replay are those of the runs walked at γ
    (`acceptance_walk`), not of their iterations truncated."""
    d3 = raw.lookup("vegas", 3, 0.1, 8192)  # traced at γ 4 and 8: uses γ_t = 4
    assert d3.extrapolated == []
    rows = cell_rows(traces, 4, 0.1, 8192)
    walked = walked_outcomes(rows, 3, 4)
    direct = np.array([(walked >= i).mean() for i in (1, 2, 3)])
    np.testing.assert_allclose(d3.rates, direct, rtol=1e-12)  # greedy: prob = outcome
    truncated = np.minimum(rows["accepted"].to_numpy(), 3)
    # an all-accepted γ_t iteration is more than one at γ: truncation under-counts it
    assert d3.mean_length > 1 + truncated.mean()
    # smoothed: the walked cells are smoothed as traced ones, between the traced γ's rates
    smoothed = model.lookup("vegas", 3, 0.1, 8192)
    assert model.lookup("vegas", 4, 0.1, 8192).mean_length > smoothed.mean_length > 1.0
    # draws: the walked runs, replayed at their own pace (one walked iteration per iteration)
    assert d3.sources[0].stretch == 1.0
    s3 = d3.sample(np.random.default_rng(7), 400, 30)
    assert abs(s3.mean() - walked.mean()) < 4 * request_se(s3)


def test_walk_splits_an_all_accepted_iteration() -> None:
    """One γ-12 run: all 12 accepted, then a rejection at the first draft. Walked at γ 4 it
    is 4, 4 and 3 accepted (13 accepted tokens, then the rejected one), each iteration at the
    tokens generated before it; at γ 12 it is itself."""
    probs = [np.ones(12, np.float32), np.zeros(12, np.float32)]
    rows = acceptance_frame([("vegas", 12, 0.1, 103, 1024 + g, 0.0, "chat", 0, it, a, p, "real")
                             for it, (a, g, p) in enumerate([(12, 0, probs[0]),
                                                             (0, 13, probs[1])])])
    model = AcceptanceModel.from_traces(rows, "real", smooth=False)
    key = next(iter(model._cells))
    walked = model._walked(key, 4)
    assert walked.acc.tolist() == [4, 4, 3] and walked.gen.tolist() == [0, 5, 10]
    assert walked.prob[2].tolist() == [1.0, 1.0, 1.0, 0.0]  # the rejected draft's record
    assert model._walked(key, 12) is model._cells[key]
    assert model.lookup("vegas", 4, 0.1, 1024).mean_length == pytest.approx(1 + 11 / 3)


def test_rates_use_accept_prob_when_sampling(traces: pd.DataFrame,
                                             raw: AcceptanceModel) -> None:
    d = raw.lookup("vegas", 4, 0.1, 8192, temperature=0.6)
    rows = cell_rows(traces, 4, 0.1, 8192, temp=0.6)
    probs = np.stack(list(rows["accept_prob"]))  # [N, 4]
    assert d.rates[0] == pytest.approx(probs[:, 0].mean(), rel=1e-6)
    acc = rows["accepted"].to_numpy()
    # the Rao-Blackwellised rates agree with the raw outcomes within sampling error
    for i in range(1, 5):
        frac = (acc >= i).mean()
        assert abs(d.rates[i - 1] - frac) < 4 * math.sqrt(frac * (1 - frac) / len(acc)) + 1e-9


# ---- extrapolation in gamma --------------------------------------------------------------


def test_gamma_extension_monotone_and_bounded(model: AcceptanceModel) -> None:
    d = model.lookup("vegas", 14, 0.1, 8192)
    assert d.rates.shape == (14,)
    assert any("gamma 14 above traced max 8" in n for n in d.extrapolated)
    assert np.all(np.diff(d.rates) <= 1e-12) and np.all((d.rates >= 0) & (d.rates <= 1))
    np.testing.assert_allclose(d.rates[:8], model.lookup("vegas", 8, 0.1, 8192).rates)
    _, ext = extend_rates(d.rates[:8], 14)  # the conditional rates of positions 9..14
    np.testing.assert_allclose(d.rates[8:], d.rates[7] * np.cumprod(ext))
    assert np.all(np.diff(ext) <= 1e-12) and np.all((ext >= 0) & (ext <= 1))
    sample = d.sample(np.random.default_rng(1), 300, 200)
    assert sample.max() <= 14 and sample.min() >= 0
    assert (sample > 8).any()  # all-accepted iterations were extended
    assert abs(sample.mean() - (d.mean_length - 1)) < 4 * request_se(sample) + 0.02


@pytest.mark.parametrize("rates,expect_flat", [
    (np.array([0.9, 0.8, 0.75, 0.72]), True),  # conditional rates rise: continue flat
    (np.array([0.9, 0.7, 0.5, 0.3]), False),  # conditional rates fall: keep falling
])
def test_extend_rates_decay(rates: np.ndarray, expect_flat: bool) -> None:
    full, ext = extend_rates(rates, 9)
    assert full.shape == (9,) and ext.shape == (5,)
    np.testing.assert_allclose(full[:4], rates)
    last_cond = rates[-1] / rates[-2]
    assert np.all(ext <= last_cond + 1e-12) and np.all(np.diff(ext) <= 1e-12)
    assert np.allclose(ext, last_cond) == expect_flat
    np.testing.assert_allclose(full[4:], rates[-1] * np.cumprod(ext))
    zero, ext0 = extend_rates(np.array([0.5, 0.0]), 4)
    assert np.array_equal(zero, [0.5, 0.0, 0.0, 0.0]) and np.array_equal(ext0, [0.0, 0.0])
    same, none = extend_rates(rates, 3)
    assert np.array_equal(same, rates[:3]) and none.shape == (0,)


# ---- sparsity / context / temperature -----------------------------------------------------


def test_sparsity_interpolation_monotone_and_labelled(model: AcceptanceModel) -> None:
    grid = np.linspace(0.01, 0.99, 50)
    means = [model.lookup("vegas", 6, float(s), 8192).mean_length for s in grid]
    assert np.all(np.diff(means) >= -1e-12)
    assert model.lookup("vegas", 6, 1.0, 8192).mean_length == pytest.approx(7.0)
    lo = model.lookup("vegas", 6, 0.05, 8192)
    hi = model.lookup("vegas", 6, 0.1, 8192)
    # between traced sparsities the weight is linear in log budget, here (8K prompts, off the
    # floor) ∝ s: the log-midpoint is the mean
    mid = model.lookup("vegas", 6, math.sqrt(0.05 * 0.1), 8192)
    assert mid.extrapolated == [] and mid.mean_length == pytest.approx(
        (lo.mean_length + hi.mean_length) / 2)
    w = math.log(0.075 / 0.05) / math.log(2.0)  # 0.585, not the linear-in-s 0.5 (budget ∝ s)
    assert model.lookup("vegas", 6, 0.075, 8192).mean_length == pytest.approx(
        (1 - w) * lo.mean_length + w * hi.mean_length)
    assert any("below traced min" in n for n in model.lookup("vegas", 6, 0.02, 8192).extrapolated)
    # above the traced max: the s = 0.2 cell moved along its sparsity trend, below γ + 1
    top = model.lookup("vegas", 6, 0.2, 8192).mean_length
    above = model.lookup("vegas", 6, 0.6, 8192)
    assert any("above traced max 0.2: extrapolated along the sparsity trend" in n
               for n in above.extrapolated)
    assert top < above.mean_length < 7.0
    # replay of the mixture has the interpolated mean
    smp = mid.sample(np.random.default_rng(2), 400, 200)
    assert abs(smp.mean() - (mid.mean_length - 1)) < 4 * request_se(smp) + 0.02


def test_sparsity_follows_the_draft_budget_at_the_floor(traces: pd.DataFrame,
                                                        model: AcceptanceModel) -> None:
    """Acceptance depends on the budget clamp(s·C, min_tokens, C): a short prompt drafts at the
    floor until s·C passes it, so between traced sparsities it stays at the lower cell there
    (linear in log budget, not in log s), and above them, where its own cells saw no budget
    change, it follows the slope of the cells that did (the 8K prompts')."""
    floored = AcceptanceModel.from_traces(traces, "real", min_tokens=192)
    # 1K prompts (contexts 1024..~1.2K): 0.1 and 0.15 draft at the floor, 0.2 above it
    lo = floored.lookup("vegas", 6, 0.1, 1024).mean_length
    hi = floored.lookup("vegas", 6, 0.2, 1024).mean_length
    assert lo != pytest.approx(hi)
    assert floored.lookup("vegas", 6, 0.15, 1024).mean_length == pytest.approx(lo)
    assert lo < floored.lookup("vegas", 6, 0.19, 1024).mean_length < hi
    # 8K prompts: budget ∝ s, the log-midpoint is the mean of the two
    lo8, hi8 = (floored.lookup("vegas", 6, s, 8192).mean_length for s in (0.05, 0.1))
    assert floored.lookup("vegas", 6, math.sqrt(0.05 * 0.1), 8192).mean_length == \
        pytest.approx((lo8 + hi8) / 2)
    # every traced sparsity at the floor (min_tokens 256 at 1K): the 8K cells' slope, moving
    # the top cell up as s·C passes the floor (0.6 · 1K = 2.4 floors)
    above = model.lookup("vegas", 6, 0.6, 1024)
    top = model.lookup("vegas", 6, 0.2, 1024).mean_length
    assert top < model.lookup("vegas", 6, 0.3, 1024).mean_length < above.mean_length
    assert any("every traced sparsity drafts at the budget floor (256): slope of the" in n
               and "that saw the budget change" in n for n in above.extrapolated)


def test_below_the_traced_sparsities_acceptance_falls_with_the_budget(
        model: AcceptanceModel) -> None:
    """Below the traced min (0.05) the min's cell moves down its sparsity trend by the budget
    doublings lost at the request's context: never flat while the budget (and the draft's
    cost) falls, monotone in s, continuous at the traced min; at a context where both budgets
    are the floor the draft is the same, and so is its acceptance."""
    at_min = model.lookup("vegas", 6, 0.05, 32768).mean_length
    lengths = [model.lookup("vegas", 6, s, 32768).mean_length for s in (0.04, 0.02, 0.005)]
    assert at_min > lengths[0] > lengths[1] > lengths[2] >= 1.0
    near = model.lookup("vegas", 6, 0.0499, 32768).mean_length
    assert near == pytest.approx(at_min, abs=0.02)
    low = model.lookup("vegas", 6, 0.02, 32768)
    assert any("below traced min 0.05: extrapolated down the sparsity trend" in n
               and "-1.32 budget doublings" in n for n in low.extrapolated)
    # 500 tokens: 0.05 and 0.01 both draft MIN_TOKENS (the floor): held
    floor = model.lookup("vegas", 6, 0.01, 500)
    assert floor.mean_length == pytest.approx(model.lookup("vegas", 6, 0.05, 500).mean_length)
    assert any("the same draft budget (the floor)" in n for n in floor.extrapolated)


def test_context_buckets_and_labels(model: AcceptanceModel) -> None:
    # Between traced buckets the rates are interpolated linearly in log-context.
    buckets = sorted(model.coverage()["context_buckets"])  # type: ignore[call-overload]
    lo_b, hi_b = [b for b in buckets if b < 2000][-1], next(b for b in buckets if b > 2000)
    inside = model.lookup("vegas", 4, 0.1, 2000)
    assert inside.extrapolated == []
    w = (math.log(2000) - math.log(lo_b)) / (math.log(hi_b) - math.log(lo_b))
    r_lo = model.lookup("vegas", 4, 0.1, int(lo_b)).rates
    r_hi = model.lookup("vegas", 4, 0.1, int(hi_b)).rates
    np.testing.assert_allclose(inside.rates, (1 - w) * r_lo + w * r_hi)
    ctxs = np.geomspace(lo_b, hi_b, 9).astype(int)
    means = [model.lookup("vegas", 4, 0.1, int(c)).mean_length for c in ctxs]
    assert np.all(np.diff(means) >= -1e-12) or np.all(np.diff(means) <= 1e-12)  # monotone
    far = model.lookup("vegas", 4, 0.1, 200_000)
    assert any("context 200000 outside traced" in n for n in far.extrapolated)
    # beyond the traced contexts: the last bucket moved along its context trend (a logit
    # shift, sim.context_trend; tests/sim/test_context_trend.py)
    moved = parse_trend_note(far.extrapolated[0])
    assert moved is not None
    np.testing.assert_allclose(far.rates, shift_rates(
        model.lookup("vegas", 4, 0.1, 32768).rates, float(moved["shift"])), atol=0.01)
    low = model.lookup("vegas", 4, 0.1, 100)
    assert any("context 100 outside" in n for n in low.extrapolated)


def test_temperature_nearest_and_workload_pooling(model: AcceptanceModel) -> None:
    d = model.lookup("vegas", 4, 0.1, 8192, temperature=0.5)
    assert any("temperature 0.5 not traced" in n for n in d.extrapolated)
    np.testing.assert_allclose(d.rates, model.lookup("vegas", 4, 0.1, 8192, temperature=0.6).rates)
    chat = model.lookup("vegas", 4, 0.1, 8192, workload="chat").rates
    code = model.lookup("vegas", 4, 0.1, 8192, workload="code").rates
    pooled = model.lookup("vegas", 4, 0.1, 8192).rates
    np.testing.assert_allclose(pooled, (chat + code) / 2, rtol=1e-9)  # equal iterations each


def test_coverage(model: AcceptanceModel) -> None:
    cov = model.coverage()
    assert cov["methods"] == ["vegas"] and cov["gamma_max"] == 8
    assert cov["sparsities"] == [0.05, 0.1, 0.2] and cov["workloads"] == ["chat", "code"]
    assert cov["temperatures"] == [0.0, 0.6] and cov["context_buckets"] == [1024, 8192, 32768]
    ctx_range = cov["context_range"]
    assert isinstance(ctx_range, tuple)
    assert ctx_range[0] == 1024 and ctx_range[1] > 32768


def test_coverage_is_a_copy_each_call(model: AcceptanceModel) -> None:
    cov = model.coverage()
    cov["methods"].append("x")  # type: ignore[attr-defined]
    assert model.coverage()["methods"] == ["vegas"]


def test_a_pickled_model_reads_back_to_the_same_arrays_and_lookups(
        traces: pd.DataFrame) -> None:
    # how the fit cache stores it: cells, their contexts and smoothed rates in a few columns
    fresh = AcceptanceModel.from_traces(traces, "real")
    fresh.lookup("vegas", 6, 0.1, 8192, output_len=16)  # fills the smoothed rates
    fresh.coverage()
    buffers: list[pickle.PickleBuffer] = []
    blob = pickle.dumps(fresh, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) < len(fresh._cells)  # not five arrays per cell
    back = pickle.loads(blob, buffers=buffers)
    assert list(back._cells) == list(fresh._cells)
    for key, cell in fresh._cells.items():
        got = back._cells[key]
        for name in ("acc", "prob", "run_start", "run_len", "gen"):
            want = getattr(cell, name)
            assert getattr(got, name).dtype == want.dtype
            np.testing.assert_array_equal(getattr(got, name), want)
        assert (got.gamma, got.sparsity, got.bucket, got.ctx_min, got.ctx_max) == (
            cell.gamma, cell.sparsity, cell.bucket, cell.ctx_min, cell.ctx_max)
        np.testing.assert_array_equal(back._contexts[key].counts, fresh._contexts[key].counts)
        np.testing.assert_array_equal(back._contexts[key].contexts,
                                      fresh._contexts[key].contexts)
    for at, rates in fresh._smoothed.items():
        assert list(back._smoothed[at]) == list(rates)
        for key, r in rates.items():
            np.testing.assert_array_equal(back._smoothed[at][key], r)
    assert back.coverage() == fresh.coverage()
    for args in (("vegas", 6, 0.1, 8192), ("vegas", 12, 0.07, 50_000), ("vegas", 3, 0.3, 900)):
        a, b = fresh.lookup(*args, output_len=16), back.lookup(*args, output_len=16)
        assert a.rates.tolist() == b.rates.tolist() and a.extrapolated == b.extrapolated
        rng_a, rng_b = np.random.default_rng(1), np.random.default_rng(1)
        np.testing.assert_array_equal(a.sample(rng_a, 5, 40), b.sample(rng_b, 5, 40))
    assert copy.copy(back)._cells is back._cells  # a shallow copy packs nothing


# ---- bootstrap ---------------------------------------------------------------------------


def test_bootstrap_mean_matches_trace_mean(traces: pd.DataFrame, raw: AcceptanceModel) -> None:
    d = raw.lookup("vegas", 8, 0.2, 32768)
    rows = cell_rows(traces, 8, 0.2, 32768)
    trace_mean = rows["accepted"].mean()
    n_req, n_it = 500, 400
    smp = d.sample(np.random.default_rng(3), n_req, n_it)
    assert abs(smp.mean() - trace_mean) < 4 * request_se(smp)
    per_pos = np.array([(smp >= i).mean() for i in range(1, 9)])
    np.testing.assert_allclose(per_pos, d.rates, atol=4 * position_se(smp, 8).max())


def test_bootstrap_deterministic_per_seed(model: AcceptanceModel) -> None:
    d = model.lookup("vegas", 6, 0.075, 8192)
    a = d.sample(np.random.default_rng(11), 20, 50)
    b = d.sample(np.random.default_rng(11), 20, 50)
    c = d.sample(np.random.default_rng(12), 20, 50)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert a.shape == (20, 50) and a.dtype == np.int64


def test_each_request_replays_one_run_from_its_start() -> None:
    """Runs whose accepted counts encode (run, iteration) show the replay's structure: a
    request is one traced run from its first iteration on, circular past the run's end."""
    recs = []
    for req in range(3):
        for it in range(10 + 3 * req):
            acc = (it % 3) if req != 1 else 3  # run 1 is all-accepted; others cycle 0,1,2
            recs.append(("vegas", 3, 0.1, 256, 4096 + 4 * it, 0.0, "w", req, it, acc,
                         (np.arange(3) < acc).astype(np.float32), "real"))  # greedy 0/1
    df = acceptance_frame(recs)
    d = AcceptanceModel.from_traces(df, "real").lookup("vegas", 3, 0.1, 4096)
    smp = d.sample(np.random.default_rng(5), 50, 24)
    k = np.arange(24)
    runs = [[3] * 24] + [list((k % length) % 3) for length in (10, 16)]
    seen = set()
    for row in smp:
        assert list(row) in runs, row
        seen.add(tuple(row))
    assert len(seen) == 3  # all three runs were drawn


def test_replay_keeps_the_rise_along_a_generation() -> None:
    """Acceptance that rises with the iteration index (later text is easier) still rises in
    the replay, and a slower γ walks through the run at its own pace."""
    recs = []
    rng = np.random.default_rng(8)
    for req in range(40):
        ctx = 4096
        for it in range(30):
            p = 0.3 + 0.6 * it / 29  # [0.3, 0.9]: easier later
            ok = rng.random(8) < p
            acc = int(np.argmin(ok)) if not ok.all() else 8
            recs.append(("vegas", 8, 0.1, 410, ctx, 0.0, "w", req, it, acc,
                         ok.astype(np.float32), "real"))
            ctx += acc + 1
    df = acceptance_frame(recs)
    m = AcceptanceModel.from_traces(df, "real", smooth=False)
    smp = m.lookup("vegas", 8, 0.1, 4096).sample(np.random.default_rng(1), 400, 30)
    early, late = smp[:, :10].mean(), smp[:, 20:].mean()
    assert late > early + 4 * (request_se(smp[:, :10]) + request_se(smp[:, 20:]))
    d2 = m.lookup("vegas", 2, 0.1, 4096)
    walked = d2.sources[0].cell
    assert walked is not None and d2.sources[0].stretch == 1.0
    # the runs walked at γ 2 take ~1.3 iterations per traced γ-8 iteration
    assert len(walked.acc) > 1.2 * len(df)
    slow = d2.sample(np.random.default_rng(1), 400, 30)
    # column k of the γ-2 replay is walked iteration k: earlier in the text, less accepted
    assert slow[:, 20:].mean() < np.minimum(smp[:, 20:], 2).mean()


def test_request_id_reused_at_another_context_is_another_run() -> None:
    df = make_acceptance(np.random.default_rng(4), gammas=(4,), sparsities=(0.1,),
                         contexts=(1024, 65536), workloads=("w",), temperatures=(0.0,),
                         n_requests=2, n_iterations=5)
    cov = AcceptanceModel.from_traces(df, "real").coverage()
    assert cov["n_runs"] == 4 and cov["context_buckets"] == [1024, 65536]


def test_many_prompt_lengths_get_log2_buckets() -> None:
    rng = np.random.default_rng(6)
    df = make_acceptance(rng, gammas=(4,), sparsities=(0.1,), contexts=(1024,), workloads=("w",),
                         temperatures=(0.0,), n_requests=30, n_iterations=4)
    starts = rng.integers(1000, 64000, 30)  # 30 distinct prompt lengths
    df["context"] += np.repeat(starts - 1024, 4)
    m = AcceptanceModel.from_traces(df, "real")
    buckets = m.coverage()["context_buckets"]
    assert 2 <= len(buckets) <= 7  # type: ignore[arg-type]
    assert m.lookup("vegas", 4, 0.1, 3000).extrapolated == []


def test_hand_built_dist_samples_from_rates() -> None:
    d = AcceptanceDist("vegas", 3, np.array([0.8, 0.5, 0.2]))
    smp = d.sample(np.random.default_rng(0), 200, 500)
    for i, r in enumerate(d.rates, start=1):
        assert (smp >= i).mean() == pytest.approx(r, abs=0.01)


def test_bootstrap_samples_the_requested_shape(model: AcceptanceModel) -> None:
    d = model.lookup("vegas", 10, 0.075, 8192)  # mixture + extension: the slowest path
    smp = d.sample(np.random.default_rng(0), 1000, 2000)
    assert smp.shape == (1000, 2000) and 0 <= smp.min() and smp.max() <= 10


def test_reads_a_written_and_reloaded_synthetic_trace_set(tmp_path: Path) -> None:
    synthetic = pytest.importorskip("vegas_sim.traces.synthetic")
    from vegas_sim.traces.io import load_trace_set

    synthetic.make_synthetic_trace_set(tmp_path, methods=("vegas",), gammas=(2, 4),
                                       sparsities=(0.03, 0.15), contexts=(1024, 4096),
                                       batches=(1,), requests=3, iterations=10)
    ts = load_trace_set(tmp_path)
    m = AcceptanceModel.from_traces(ts.acceptance, ts.weights_kind)
    d = m.lookup("vegas", 6, 0.07, 2048)
    assert d.rates.shape == (6,) and any("gamma 6" in n for n in d.extrapolated)
    assert d.sample(np.random.default_rng(0), 4, 9).shape == (4, 9)


# ---- output length: the iterations a request of that length runs ---------------------------


def rising_runs(n_requests: int = 6, n_iterations: int = 20) -> pd.DataFrame:
    """Greedy runs whose acceptance rises along the generation: iteration k accepts
    min(k // 4, 3) of γ 3, so a short output sees less acceptance than the whole run."""
    recs = []
    for req in range(n_requests):
        ctx = 4096
        for it in range(n_iterations):
            acc = min(it // 4, 3)
            prob = (np.arange(3) < acc).astype(np.float32)
            recs.append(("vegas", 3, 0.1, 410, ctx, 0.0, "w", req, it, acc, prob, "real"))
            ctx += acc + 1
    return acceptance_frame(recs)


def test_output_len_keeps_the_iterations_a_short_request_runs() -> None:
    df = rising_runs()
    m = AcceptanceModel.from_traces(df, "real")
    gen = df["context"] - 4096  # tokens generated before each iteration (one run per request)
    for out_len in (1, 5, 12, 30):
        d = m.lookup("vegas", 3, 0.1, 4096, output_len=out_len)
        acc = df.loc[gen < out_len, "accepted"].to_numpy()
        np.testing.assert_allclose(d.rates, [(acc >= i).mean() for i in (1, 2, 3)], rtol=1e-12)
        assert d.extrapolated == []
        # replay stays inside the kept prefix of the runs
        assert d.sample(np.random.default_rng(0), 20, 30).max() <= acc.max()
    full = m.lookup("vegas", 3, 0.1, 4096)
    assert full.mean_length == pytest.approx(1 + df["accepted"].mean())
    assert m.lookup("vegas", 3, 0.1, 4096, output_len=10).mean_length < full.mean_length
    assert m.lookup("vegas", 3, 0.1, 4096, output_len=10_000).mean_length == pytest.approx(
        full.mean_length)  # past the traced tokens: every iteration, and a note
    assert any("output length 10000 beyond the" in n
               for n in m.lookup("vegas", 3, 0.1, 4096, output_len=10_000).extrapolated)
    with pytest.raises(UserInputError, match="--output-len"):
        m.lookup("vegas", 3, 0.1, 4096, output_len=0)


def test_output_len_blocks_are_windows_of_the_kept_prefix() -> None:
    df = rising_runs(n_requests=2, n_iterations=12)  # per run: accepted 0,0,0,0,1,1,1,1,2,...
    d = AcceptanceModel.from_traces(df, "real").lookup("vegas", 3, 0.1, 4096, output_len=8)
    # gen before iterations: 0,1,2,3,4,6,8,...: 6 iterations kept, accepted 0,0,0,0,1,1
    prefix = [0, 0, 0, 0, 1, 1]
    windows = {tuple(prefix[(p + k) % 6] for k in range(8)) for p in range(6)}
    smp = d.sample(np.random.default_rng(1), 30, 16)
    assert {tuple(b) for b in smp.reshape(-1, 8)} <= windows
    np.testing.assert_allclose(d.rates, [2 / 6, 0, 0])


def test_output_len_walk_and_mixture_stay_exact(traces: pd.DataFrame,
                                               raw: AcceptanceModel) -> None:
    model = raw
    d3 = model.lookup("vegas", 3, 0.1, 8192, output_len=20)
    rows = cell_rows(traces, 4, 0.1, 8192)
    walked = model._walked(next(k for k in model._cells if k.gamma == 4 and k.sparsity == 0.1
                                and k.bucket == 8192 and k.temperature == 0.0
                                and k.workload == "chat"), 3)
    assert np.all(np.diff(walked.gen[walked.run_start == 0]) > 0)  # gen rises along a run
    first = rows.groupby(["workload", "request"])["context"].transform("min")
    kept = rows[rows["context"] - first < 20]
    assert d3.mean_length >= 1 + np.minimum(kept["accepted"].to_numpy(), 3).mean()
    mid = model.lookup("vegas", 6, np.sqrt(0.05 * 0.1), 8192, output_len=20)  # log-midpoint
    lo = model.lookup("vegas", 6, 0.05, 8192, output_len=20)
    hi = model.lookup("vegas", 6, 0.1, 8192, output_len=20)
    assert mid.mean_length == pytest.approx((lo.mean_length + hi.mean_length) / 2)


# ---- smoothing over neighbouring cells ----------------------------------------------------


def test_smoother_keeps_a_linear_trend_and_sums_to_one() -> None:
    rng = np.random.default_rng(8)
    coords = np.array([[math.log(s), math.log(c)] for s in (0.02, 0.05, 0.1, 0.2)
                       for c in (1024, 4096, 16384)])  # [12, 2]
    op = smoother_matrix(coords, rng.integers(1, 9, len(coords)).astype(float))
    np.testing.assert_allclose(op.sum(axis=1), 1.0, atol=1e-12)
    linear = 0.3 + 0.1 * coords[:, 0] - 0.02 * coords[:, 1]  # a plane: passes unchanged
    np.testing.assert_allclose(op @ linear, linear, atol=2e-3)  # up to the tiny slope ridge
    # one traced context: the context direction has no spread, the fit is still defined
    one_c = smoother_matrix(coords[::3], np.ones(4))
    np.testing.assert_allclose(one_c @ linear[::3], linear[::3], atol=2e-3)
    assert np.array_equal(smoother_matrix(coords[:1], np.ones(1)), np.ones((1, 1)))


SPS = (0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2)
CTXS = (1024, 2048, 4096, 8192)


def _logit(s: float, c: int) -> float:
    """True per-position acceptance logit: smooth and increasing in log s and log C."""
    return 0.8 + 0.7 * math.log(s / 0.05) + 0.25 * math.log(c / 4096)


def noisy_smooth_traces(rng: np.random.Generator, gamma: int = 6, runs: int = 3,
                        iterations: int = 12) -> pd.DataFrame:
    """Sampled (T 0.6) traces whose runs each draw a random ease (logit offset, sd 0.8): few runs
    per cell make every cell's mean noisy around a smooth truth."""
    recs = []
    for s in SPS:
        for c0 in CTXS:
            for req in range(runs):
                p = 1 / (1 + math.exp(-(_logit(s, c0) + rng.normal(0, 0.8))))
                ctx = c0
                for it in range(iterations):
                    prob = np.full(gamma, p, dtype=np.float32)
                    ok = rng.random(gamma) < p
                    acc = int(np.argmin(ok)) if not ok.all() else gamma
                    recs.append(("vegas", gamma, s, math.ceil(s * ctx), ctx, 0.6, "w", req,
                                 it, acc, prob, "real"))
                    ctx += acc + 1
    return acceptance_frame(recs)


def true_length(s: float, c: int, gamma: int) -> float:
    """1 + Σ_i E[p^i] over the run ease (the expectation the traces sample)."""
    z = np.random.default_rng(0).normal(0, 0.8, 200_000)
    p = 1 / (1 + np.exp(-(_logit(s, c) + z)))
    return 1.0 + float(sum(np.mean(p ** i) for i in range(1, gamma + 1)))


@pytest.fixture(scope="module")
def noisy() -> tuple[AcceptanceModel, AcceptanceModel]:
    df = noisy_smooth_traces(np.random.default_rng(9))
    return (AcceptanceModel.from_traces(df, "real", smooth=False),
            AcceptanceModel.from_traces(df, "real"))


def test_smoothing_beats_cells_on_a_noisy_smooth_truth(
        noisy: tuple[AcceptanceModel, AcceptanceModel]) -> None:
    raw, smooth = noisy
    err_raw, err_smooth, signed = [], [], []
    for s in SPS:
        for c in CTXS:
            truth = true_length(s, c, 6)
            r = raw.lookup("vegas", 6, s, c, temperature=0.6).mean_length
            m = smooth.lookup("vegas", 6, s, c, temperature=0.6).mean_length
            err_raw.append(abs(r / truth - 1))
            err_smooth.append(abs(m / truth - 1))
            signed.append(m / truth - 1)
    assert np.mean(err_smooth) < 0.75 * np.mean(err_raw)  # noise averaged out ...
    assert abs(np.mean(signed)) < 0.03  # ... without a bias


def test_smoothing_recovers_the_monotone_trend(
        noisy: tuple[AcceptanceModel, AcceptanceModel]) -> None:
    """The truth rises in s and in C; cell noise makes the raw means dip, the smoothed ones
    dip less often and only slightly (a corner cell has neighbours on one side only)."""
    def dips(m: AcceptanceModel) -> np.ndarray:
        grid = np.array([[m.lookup("vegas", 6, s, c, temperature=0.6).mean_length
                          for s in SPS] for c in CTXS])  # [C, s]
        return np.concatenate([np.diff(grid, axis=1).ravel(), np.diff(grid, axis=0).ravel()])
    raw_d, smooth_d = dips(noisy[0]), dips(noisy[1])
    assert (smooth_d < 0).sum() < (raw_d < 0).sum()
    neg_mass = float(-np.minimum(smooth_d, 0).sum())  # total size of the dips, lengths
    assert neg_mass < 0.2 * float(-np.minimum(raw_d, 0).sum()) and smooth_d.min() > -0.4


def test_replay_follows_the_smoothed_rates(
        noisy: tuple[AcceptanceModel, AcceptanceModel]) -> None:
    _, smooth = noisy
    for gamma, s in ((6, 0.05), (4, 0.06), (9, 0.1)):  # a cell, a mixture, an extension
        d = smooth.lookup("vegas", gamma, s, 2048, temperature=0.6)
        smp = d.sample(np.random.default_rng(4), 400, 200)
        per_pos = np.array([(smp >= i).mean() for i in range(1, gamma + 1)])
        np.testing.assert_allclose(per_pos, d.rates, atol=4 * position_se(smp, gamma).max())


def test_match_rates_hits_the_target_and_keeps_a_matching_record() -> None:
    rng = np.random.default_rng(10)
    base_rates = np.array([0.8, 0.6, 0.3, 0.0])  # a record of γ_t 3 replayed at γ 4
    u = rng.random(200_000)
    vals = (u[:, None] < base_rates[None, :3]).sum(axis=1)  # [N] counts with those rates
    base = np.array([0.8, 0.75, 0.5, 0.0])  # their conditional rates (0 past γ_t)
    target = np.array([0.9, 0.5, 0.7, 0.4])
    out = _match_rates(np.random.default_rng(11), vals, base, target)
    want = np.cumprod(target)
    got = np.array([(out >= i).mean() for i in range(1, 5)])
    np.testing.assert_allclose(got, want, atol=0.006)
    same = _match_rates(np.random.default_rng(11), vals, base, base)
    assert same is vals  # nothing to change: the record replays unchanged, no draws


@pytest.mark.parametrize("buffered", [0, 1, 2])
def test_uniform16_is_generator_bytes_and_leaves_the_same_state(buffered: int) -> None:
    """match_rates' uniforms from the raw outputs: the same values as `Generator.bytes`, and
    the same generator afterwards, whatever 32-bit word a bounded draw left buffered."""
    for count in (0, 1, 2, 3, 5, 8, 999, 4096, 4097):
        a, b = np.random.default_rng(count), np.random.default_rng(count)
        for g in (a, b):
            g.integers(0, 1000, buffered)  # bounded 32-bit draws: an odd count buffers a word
        want = np.frombuffer(a.bytes(2 * count), dtype=np.uint16)
        np.testing.assert_array_equal(uniform16(b, count), want)
        assert a.bit_generator.state == b.bit_generator.state
        np.testing.assert_array_equal(a.integers(0, 1 << 20, 7), b.integers(0, 1 << 20, 7))


def test_fitted_model_pickles(model: AcceptanceModel) -> None:
    """fitcache stores the fitted model with pickle (after lookups filled its cache too)."""
    import pickle

    d = model.lookup("vegas", 5, 0.07, 3000, output_len=40)
    back = pickle.loads(pickle.dumps(model))
    np.testing.assert_allclose(back.lookup("vegas", 5, 0.07, 3000, output_len=40).rates, d.rates)


def test_acceptance_follows_the_running_context(model: AcceptanceModel) -> None:
    """A request whose context doubles while it generates is looked up again per doubling:
    it replays the prompt's acceptance until its generated tokens reach the next stage, then
    the next stage's; a request that never doubles is the prompt's lookup alone."""
    from vegas_sim.sim.acceptance_dist import RunningLengthDist, running_stages

    assert running_stages(1024, 512) == [(0, 1024)]
    assert running_stages(1000, 7000) == [(0, 1000), (1000, 2000), (3000, 4000)]
    low = model.lookup("vegas", 4, 0.1, 1024, "chat", 0.6)
    high = model.lookup("vegas", 4, 0.1, 32768, "chat", 0.6)
    run = RunningLengthDist.of([0, 40], [low, high], 80, [1024, 32768])
    assert run.mean_length == pytest.approx((low.mean_length + high.mean_length) / 2)
    assert "running context" in run.extrapolated[0]
    acc = run.sample(np.random.default_rng(0), 64, 30)
    before = np.cumsum(acc + 1, axis=1) - (acc + 1)  # [R, W] tokens generated before
    first = run.stages[0].sample(np.random.default_rng(0), 64, 30)
    np.testing.assert_array_equal(acc[before < 40], first[before < 40])  # the prompt's stage
    assert acc.max() <= 4


def _fixed(gamma: int, accepted: int) -> AcceptanceDist:
    """Every iteration accepts exactly `accepted` of `gamma` drafts (rates 1 then 0)."""
    return AcceptanceDist("vegas", gamma, (np.arange(1, gamma + 1) <= accepted).astype(float))


@pytest.mark.parametrize("accepted, starts", [
    ((2, 0, 4), (0, 10, 25)),  # three stages, each entered mid-run
    ((0, 3), (0, 10)),  # one token an iteration: the next stage starts right after the span
    ((4, 1, 0), (0, 5, 200)),  # the last stage is never reached inside the width
])
def test_running_stages_switch_at_their_generated_tokens(accepted: tuple[int, ...],
                                                         starts: tuple[int, ...]) -> None:
    """Stage j's draws start at the first iteration whose generated tokens reach its start."""
    stages = [_fixed(4, a) for a in accepted]
    run = RunningLengthDist.of(list(starts), stages, 300, [1000 * (j + 1) for j in starts])
    got = run.sample(np.random.default_rng(1), 3, 40)
    want, generated = [], 0
    for _ in range(40):
        stage = max(j for j, s in enumerate(starts) if generated >= s)
        want.append(accepted[stage])
        generated += accepted[stage] + 1
    np.testing.assert_array_equal(got, np.tile(want, (3, 1)))
