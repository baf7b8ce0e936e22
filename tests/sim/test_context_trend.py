"""Context trend: acceptance beyond the traced contexts follows the data's trend in log-context
(sign, flat, bounded, inside unchanged, widening uncertainty)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, cast

import numpy as np
import pandas as pd
import pytest

from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.anchored import AnchoredAcceptance
from vegas_sim.sim.context_trend import (
    OWN_SPAN_FACTOR,
    ContextTrend,
    calibrated_scale,
    covering_trend,
    toward_evidence,
    fit_trend,
    parse_trend_note,
    pool_trends,
    random_effects,
    shift_dist,
    shift_rates,
    shrink_to_flat,
)
from vegas_sim.sim.latency import LatencyModel
from vegas_sim.sim.uncertainty import interval_columns
from vegas_sim.traces.anchors import Anchor, AnchorSet
from vegas_sim.traces.schema import ACCEPTANCE_SCHEMA

CONTEXTS = (1024, 2048, 4096)
GAMMA = 4


def trend_traces(slope: float, seed: int = 0, n_requests: int = 16, n_iterations: int = 12,
                 copy_runs: bool = False) -> pd.DataFrame:
    """Synthetic sampled traces whose conditional acceptance is σ(0.3 + slope·log2(C/1024)),
    the same at every draft position; `copy_runs`: every bucket replays the same outcomes."""
    rng = np.random.default_rng(seed)
    recs: list[tuple[object, ...]] = []
    shared: dict[tuple[float, int, int], tuple[int, np.ndarray]] = {}
    for s in (0.05, 0.1):
        for c0 in CONTEXTS:
            p = 1.0 / (1.0 + math.exp(-(0.3 + slope * math.log2(c0 / 1024))))
            for req in range(n_requests):
                ctx = c0
                for it in range(n_iterations):
                    key = (s, req, it)
                    if copy_runs and key in shared:
                        acc, prob = shared[key]
                    else:
                        prob = np.clip(p + rng.normal(0, 0.05, GAMMA), 0, 1)
                        ok = rng.random(GAMMA) < prob
                        acc = int(np.argmin(ok)) if not ok.all() else GAMMA
                        shared[key] = (acc, prob)
                    recs.append(("vegas", GAMMA, s, math.ceil(s * ctx), ctx, 0.6, "longdoc",
                                 req, it, acc, prob.astype(np.float32), "real"))
                    ctx += acc + 1
    return pd.DataFrame(recs, columns=ACCEPTANCE_SCHEMA.names)


@pytest.fixture(scope="module")
def rising() -> AcceptanceModel:
    return AcceptanceModel.from_traces(trend_traces(0.5), "real")


def trend_of(model: AcceptanceModel) -> dict[str, Any]:
    (row,) = model.context_trends()
    return row


@pytest.mark.parametrize("slope", [0.5, -0.5])
def test_trend_sign_follows_the_data(slope: float) -> None:
    model = AcceptanceModel.from_traces(trend_traces(slope), "real")
    fitted = float(trend_of(model)["slope_per_doubling"])
    assert np.sign(fitted) == np.sign(slope)
    assert abs(fitted - slope) < 0.25  # the logit slope per doubling the data were drawn with
    edge = model.lookup("vegas", GAMMA, 0.1, 4096, "longdoc", 0.6)
    far = model.lookup("vegas", GAMMA, 0.1, 16384, "longdoc", 0.6)
    assert np.sign(far.mean_length - edge.mean_length) == np.sign(slope)
    (note,) = far.extrapolated
    parsed = parse_trend_note(note)
    assert parsed is not None and "context trend" in note
    assert parsed["shift"] == pytest.approx(fitted * parsed["doublings"], abs=0.02)
    assert parsed["length_after"] == pytest.approx(far.mean_length, abs=0.01)


def test_flat_data_give_a_flat_trend() -> None:
    model = AcceptanceModel.from_traces(trend_traces(0.0, copy_runs=True), "real")
    assert trend_of(model)["slope_per_doubling"] == 0.0
    far = model.lookup("vegas", GAMMA, 0.1, 65536, "longdoc", 0.6)
    edge = model.lookup("vegas", GAMMA, 0.1, 4096, "longdoc", 0.6)
    np.testing.assert_array_equal(far.rates, edge.rates)
    assert far.context_trend_sd_pct > 0.0  # held, but the data's own sampling error remains
    assert "context trend flat" in far.extrapolated[0]
    assert "using the nearest traced bucket (4096)" in far.extrapolated[0]


def test_a_slope_within_its_standard_error_is_flat_and_a_clear_one_passes() -> None:
    base = [np.array([0.7, 0.45, 0.25])]
    rates = [[shift_rates(base[0], d)] for d in (0.0, 0.1, 0.2)]
    noisy = fit_trend([1024, 2048, 4096], rates, [2.0, 2.0, 2.0], 2)
    assert noisy.slope == 0.0 and "standard error" in noisy.reason
    clear = fit_trend([1024, 2048, 4096], rates, [1e-4, 1e-4, 1e-4], 2)
    assert clear.slope == pytest.approx(0.1, rel=0.02)
    assert clear.deltas[0] == pytest.approx(-0.2, abs=1e-6)  # δ per bucket, edge = 0


def test_slope_is_capped_at_the_traced_span_change() -> None:
    # flat then a jump at the last bucket: the weighted line (last bucket precise) is steeper
    # than the span's average change per doubling, so the cap binds
    base = np.array([0.7, 0.45, 0.25])
    rates = [[shift_rates(base, d)] for d in (-0.3, -0.3, 0.0)]
    t = fit_trend([1024, 2048, 4096], rates, [0.05, 0.05, 1e-4], 2)
    assert t.estimate == pytest.approx(0.15, abs=1e-6) and "capped" in t.reason
    # the capped estimate is then shrunk by its evidence, as an uncapped one is
    assert t.slope == pytest.approx(shrink_to_flat(0.15, t.slope_se)[0], abs=1e-9)
    assert t.fitted_slope > 0.15 >= t.slope


def test_bounded_far_beyond_the_traced_contexts(rising: AcceptanceModel) -> None:
    group = ("vegas", 0.6, "longdoc", GAMMA)
    steep = dataclasses.replace(rising.context_trend(group, 4096.0), slope=8.0)
    model = AcceptanceModel.from_traces(trend_traces(0.5), "real")
    model._trends[(group, 4096.0)] = steep
    dists = [model.lookup("vegas", GAMMA, 0.1, c, "longdoc", 0.6) for c in (2**14, 2**20, 2**28)]
    for d in dists:
        assert np.all((d.rates >= 0.0) & (d.rates <= 1.0))
        assert np.all(np.diff(d.rates) <= 1e-12)  # P(accepted ≥ i) never rises with i
        assert d.mean_length <= GAMMA + 1
    # past OWN_SPAN_FACTOR traced spans, with nothing traced there to cover it, it is held
    reach = OWN_SPAN_FACTOR * steep.span
    assert steep.reach == pytest.approx(reach) and steep.covering is None
    assert math.log2((2**20 + steep.generated) / (4096 + steep.generated)) > reach
    np.testing.assert_allclose(dists[1].rates, dists[2].rates)
    assert "held beyond" in dists[2].extrapolated[0]


def test_inside_the_traced_contexts_nothing_changes(rising: AcceptanceModel) -> None:
    group = ("vegas", 0.6, "longdoc", GAMMA)
    other = AcceptanceModel.from_traces(trend_traces(0.5), "real")
    other._trends[(group, 4096.0)] = dataclasses.replace(
        rising.context_trend(group, 4096.0), slope=-3.0)
    hi = max(int(x) for x in rising.coverage()["context_range"])  # type: ignore[attr-defined]
    for c in (1024, 1500, 2048, 3000, 4096):
        a = rising.lookup("vegas", GAMMA, 0.07, c, "longdoc", 0.6)
        b = other.lookup("vegas", GAMMA, 0.07, c, "longdoc", 0.6)
        np.testing.assert_array_equal(a.rates, b.rates)
        assert a.context_trend_sd_pct == 0.0
        assert not any("context trend" in n for n in a.extrapolated)
        np.testing.assert_array_equal(a.sample(np.random.default_rng(3), 5, 20),
                                      b.sample(np.random.default_rng(3), 5, 20))
    # a prompt past the longest traced one follows the trend, though the traced runs'
    # iterations reached its length
    past = rising.lookup("vegas", GAMMA, 0.07, hi, "longdoc", 0.6)
    assert any(f"context {hi} outside traced prompts 1024..4096: context trend" in n
               for n in past.extrapolated)
    assert past.context_trend_sd_pct > 0.0
    below = rising.lookup("vegas", GAMMA, 0.1, 100, "longdoc", 0.6)  # below: held, as before
    np.testing.assert_array_equal(below.rates,
                                  rising.lookup("vegas", GAMMA, 0.1, 1024, "longdoc", 0.6).rates)
    assert "using the nearest traced bucket (1024)" in below.extrapolated[0]


def test_uncertainty_widens_with_distance(rising: AcceptanceModel) -> None:
    sds = [rising.lookup("vegas", GAMMA, 0.1, c, "longdoc", 0.6).context_trend_sd_pct
           for c in (4096, 8192, 16384, 65536, 2**20)]
    assert sds[0] == 0.0
    assert 0.0 < sds[1] < sds[2] < sds[3] < sds[4]  # also past the distance the trend is held
    t = rising.context_trend(("vegas", 0.6, "longdoc", GAMMA), 4096.0)
    assert [t.shift_sd(d) for d in (0, 1, 2)] == sorted({t.shift_sd(d) for d in (0, 1, 2)})


def test_calibrated_sd_widens_the_interval_and_moves_no_prediction() -> None:
    """The model's trend_sd_scale multiplies the context trend's sd and nothing else: the
    pooled slopes, the shift and the mean acceptance length beyond the traced contexts are the
    unscaled model's (a scale leaking into the pooling weights would move them); the note
    says which scale it took."""
    def far(scale: float) -> Any:
        model = AcceptanceModel.from_traces(trend_traces(0.4), "real")
        model.trend_sd_scale = scale
        return model.lookup("vegas", GAMMA, 0.1, 16384, "longdoc", 0.6)

    one, two = far(1.0), far(2.0)
    np.testing.assert_allclose(two.rates, one.rates)
    assert one.context_trend_sd_pct > 0.0
    assert two.context_trend_sd_pct == pytest.approx(2.0 * one.context_trend_sd_pct)
    assert any("its sd x2 (the default" in n for n in two.extrapolated)


def test_calibrated_scale_rounds_and_never_narrows() -> None:
    """A hold-out's quantile becomes a scale in SCALE_STEP steps, never below 1."""
    assert calibrated_scale(2.06) == 2.0
    assert calibrated_scale(5.22) == 5.0
    assert calibrated_scale(3.26) == 3.5
    assert calibrated_scale(0.4) == 1.0


class _FlatLatency:
    """What interval_columns asks of a LatencyModel (inside every measured range; sample and
    select timed in the decoding loop, so no host-protocol term)."""

    host_phases_in_loop = True

    def measures(self, phase: str, method: str) -> bool:
        return False

    def loo_pct(self, phase: str, method: str) -> float:
        return 0.0

    def octaves_outside(self, batch: int, context: int, n_query: int) -> dict[str, float]:
        return {}

    def what_if_octaves(self) -> float:  # the measured GPU
        return 0.0

    def for_temperature(self, temperature: float) -> _FlatLatency:
        return self

    def prices_mode(self, temperature: float) -> bool:  # no sampling-mode term
        return True


def test_the_trend_uncertainty_enters_the_prediction_interval(rising: AcceptanceModel) -> None:
    row = {"method": "vegas", "gamma": GAMMA, "batch": 1, "context": 65536, "output_len": 64,
           "sparsity": 0.1, "throughput_tok_s": 100.0, "throughput_ci_low": 100.0,
           "throughput_ci_high": 100.0}
    far = rising.lookup("vegas", GAMMA, 0.1, 65536, "longdoc", 0.6)
    latency = cast(LatencyModel, _FlatLatency())
    cols = interval_columns(row, latency, rising, far, {"verify": 1.0})
    assert cols["pi_extrapolation_acceptance_pct"] == pytest.approx(far.context_trend_sd_pct)
    inside = interval_columns({**row, "context": 2048}, latency, rising,
                              rising.lookup("vegas", GAMMA, 0.1, 2048, "longdoc", 0.6),
                              {"verify": 1.0})
    assert inside["pi_extrapolation_acceptance_pct"] == 0.0
    assert cols["pi_high"] - cols["pi_low"] > inside["pi_high"] - inside["pi_low"]


def test_an_anchor_shift_composes_with_the_trend(rising: AcceptanceModel) -> None:
    far = rising.lookup("vegas", GAMMA, 0.1, 16384, "longdoc", 0.6)
    edge = rising.lookup("vegas", GAMMA, 0.1, 4096, "longdoc", 0.6)
    parsed = parse_trend_note(far.extrapolated[0])
    assert parsed is not None
    both = shift_dist(far, 0.4)  # logit shifts add: trend, then the anchors' level
    trend = rising.context_trend(("vegas", 0.6, "longdoc", GAMMA), 4096.0)
    trend_delta = trend.shift(trend.doublings_to(16384))
    assert trend_delta == pytest.approx(parsed["shift"], abs=0.005)
    np.testing.assert_allclose(both.rates, shift_rates(edge.rates, 0.4 + trend_delta),
                               atol=1e-9)
    assert both.context_trend_sd_pct == far.context_trend_sd_pct
    assert both.extrapolated == far.extrapolated


def test_context_trend_rows_for_traces_show(rising: AcceptanceModel) -> None:
    row = trend_of(rising)
    assert (row["context_lo"], row["context_hi"], row["buckets"]) == (1024, 4096, 3)
    assert row["pct_per_doubling"] > 0
    assert isinstance(rising.context_trend(("vegas", 0.6, "longdoc", GAMMA), 4096.0),
                      ContextTrend)


def test_anchors_are_fitted_along_the_trend(rising: AcceptanceModel) -> None:
    """Prompts of 1K–64K: the anchor sees the trend beyond the traced 4K, so a steeper trend
    needs a smaller shift, and both anchored models still give the anchor back there."""
    anchor = Anchor("vegas", GAMMA, 0.1, (1024, 65536), "longdoc", 0.6, 3.5)
    anchors = AnchorSet(model="m", source="test", anchors=(anchor,), path="test-anchors")
    steep = AcceptanceModel.from_traces(trend_traces(0.5), "real")
    group = ("vegas", 0.6, "longdoc", GAMMA)
    steep._trends[(group, 4096.0)] = dataclasses.replace(
        rising.context_trend(group, 4096.0), slope=3.0)
    a, b = AnchoredAcceptance(rising, "s", [anchors]), AnchoredAcceptance(steep, "s", [anchors])
    assert b.shifts["vegas"].delta < a.shifts["vegas"].delta
    for model in (a, b):
        assert model.range_length("vegas", GAMMA, 0.1, (1024, 65536), "longdoc",
                                  0.6) == pytest.approx(3.5, rel=1e-6)
    far = a.lookup("vegas", GAMMA, 0.1, 32768, "longdoc", 0.6)
    assert "context trend" in far.extrapolated[0]


def _two_bucket_trend(delta: float, se: float, buckets: tuple[int, int] = (1024, 2048)
                      ) -> ContextTrend:
    """A group's own fit over two buckets whose logit shift from the first to the last is
    `delta`, each bucket's mean known to ±se."""
    base = np.array([0.7, 0.45, 0.25])
    rates = [[shift_rates(base, -delta)], [base]]
    return fit_trend(list(buckets), rates, [se, se], 1)


def test_random_effects_pools_agreeing_estimates_and_sees_disagreeing_ones() -> None:
    agree = random_effects([(0.3, 0.1), (0.3, 0.1), (0.3, 0.1)], correlated=False)
    assert agree.tau2 == 0.0 and agree.mean == pytest.approx(0.3)
    assert agree.se == pytest.approx(0.1 / math.sqrt(3))
    same_prompts = random_effects([(0.3, 0.1), (0.3, 0.1), (0.3, 0.1)], correlated=True)
    assert same_prompts.se == pytest.approx(0.1)  # correlated: pooling adds no precision
    apart = random_effects([(-1.0, 0.05), (0.0, 0.05), (1.0, 0.05)], correlated=False)
    assert apart.tau2 > 0.5 and apart.mean == pytest.approx(0.0, abs=1e-9)


def test_a_noisy_slope_is_pooled_toward_its_cells_not_held_flat() -> None:
    noisy = _two_bucket_trend(0.1, 0.6)  # alone: within one standard error of 0 → flat
    assert noisy.slope == 0.0 and noisy.estimate is not None
    clear = _two_bucket_trend(0.5, 0.02)
    trends = {("a", "recall"): noisy, ("b", "recall"): clear, ("c", "recall"): clear,
              ("a", "longdoc"): clear}
    pooled = pool_trends(trends, cell_of=lambda k: k[1])
    got = pooled[("a", "recall")]
    assert 0.1 < got.slope <= 0.5 + 1e-9 and "pooled" in got.reason
    assert got.slope_se < noisy.slope_se  # its siblings' evidence narrows it
    assert got.pct_per_doubling > 0.0
    # a group alone over its buckets keeps its own rule (shrunk toward flat); a group without
    # an estimate (one bucket) stays flat
    alone = _two_bucket_trend(0.1, 0.6, (512, 1024))
    one = ContextTrend(2048.0, 0.0, 0.0, 0.0, (2048.0,), (3.0,), (0.0,), "one traced bucket")
    out = pool_trends({**trends, ("a", "chat"): alone, ("a", "code"): one},
                      cell_of=lambda k: k[1])
    assert out[("a", "chat")] == alone and out[("a", "code")] == one
    assert out[("a", "recall")] == got  # other buckets' groups do not enter its pool


def _line(lo: float, hi: float, slope: float, se: float) -> ContextTrend:
    """A trend fitted over lo..hi (two buckets) with this slope: what `covering_trend` reads."""
    span = math.log2(hi / lo)
    return ContextTrend(hi, slope, slope, se, (lo, hi), (2.0, 3.0), (-slope * span, 0.0),
                        span=span, estimate=slope, reach_spans=OWN_SPAN_FACTOR)


def test_beyond_its_reach_a_short_trend_follows_the_evidence_that_covers_it() -> None:
    """A cell traced over 128..512 follows its own slope for OWN_SPAN_FACTOR spans (to 2K),
    then the pooled slope of the groups traced past that (to their last bucket, 8K), then is
    held; its sd grows with the distance, faster beyond its reach (the evidence's spread)."""
    short = _line(128.0, 512.0, -1.0, 0.1)
    far = [_line(1024.0, 8192.0, 0.4, 0.05), _line(1024.0, 8192.0, 0.2, 0.05),
           _line(64.0, 256.0, 3.0, 0.1)]  # the last is traced short: it covers nothing
    t = covering_trend(short, far, ["longdoc", "recall", "chat"])
    assert t.covering is not None and "chat" not in t.covering.fitted_on
    assert t.reach == pytest.approx(3.5) and t.covering.end == pytest.approx(4.0)
    pooled = random_effects([(0.4, 0.05), (0.2, 0.05)], correlated=False)
    assert t.covering.slope == pytest.approx(pooled.mean)
    assert t.covering.sd == pytest.approx(math.hypot(pooled.se, math.sqrt(pooled.tau2)))
    # its own slope, precise and far from the evidence's, keeps nearly all of itself
    assert -1.0 < t.slope < -0.9
    assert t.shift(2.0) == pytest.approx(2.0 * t.slope)  # inside the reach: own
    assert t.shift(3.8) == pytest.approx(3.5 * t.slope + 0.3 * pooled.mean)
    assert t.shift(9.0) == t.shift(4.0)  # past the evidence: held
    sds = [t.shift_sd(d) for d in (1.0, 3.5, 4.0, 9.0)]
    assert all(b > a for a, b in zip(sds, sds[1:]))
    assert "then covering" in t.source(3.8) and t.source(2.0) == "own"
    # nothing traced past the reach: unchanged (held past the reach)
    assert covering_trend(short, far[2:], ["chat"]) == short


def test_a_slope_measured_over_a_short_span_moves_to_the_evidence_that_covers_it() -> None:
    """The own slope is pooled with the covering evidence (`toward_evidence`): one whose
    standard error is large against the evidence's spread moves most of the way to it, one
    the evidence cannot explain keeps its own; the sd shrinks with what was borrowed."""
    far = [_line(1024.0, 8192.0, 0.4, 0.05), _line(1024.0, 8192.0, 0.45, 0.05)]
    noisy = covering_trend(_line(128.0, 160.0, 1.5, 1.0), far, ["longdoc", "recall"])
    assert 0.4 < noisy.slope < 0.6 and noisy.slope_se < 1.0
    assert "toward the covering evidence" in noisy.reason
    precise = covering_trend(_line(128.0, 512.0, -1.4, 0.05), far, ["longdoc", "recall"])
    assert -1.4 <= precise.slope < -1.3
    assert toward_evidence(_line(128.0, 512.0, -1.4, 0.05), []) == _line(128.0, 512.0, -1.4,
                                                                          0.05)
