"""The anchored acceptance model: the transform, its fit, what it leaves alone, its marks, and
the command line that reaches it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner, Result

from vegas_sim import api
from vegas_sim.cli import cli
from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.acceptance_dist import AcceptanceDist
from vegas_sim.sim.anchored import AnchoredAcceptance, TransferSd
from vegas_sim.sim.context_trend import shift_dist, shift_rates, shifted_dist_sd_pct
from vegas_sim.sim.tune_rules import lower_score
from vegas_sim.traces.anchors import Anchor, AnchorSet, write_anchors
from vegas_sim.traces.io import load_trace_set

SHAPE = "smollm2-135m-real"


@pytest.fixture(scope="module")
def shape() -> AcceptanceModel:
    return api.fit_acceptance(load_trace_set(SHAPE))


def _set(*anchors: Anchor) -> AnchorSet:
    return AnchorSet(model="m", source="test", anchors=anchors, path="test-anchors")


VEGAS = Anchor("vegas", 6, 0.07, (300, 300), "reasoning", 0.6, 5.5)


def test_fit_meets_the_anchor_exactly(shape: AcceptanceModel) -> None:
    model = AnchoredAcceptance(shape, SHAPE, [_set(VEGAS)])
    before = shape.lookup("vegas", 6, 0.07, 300, "reasoning", 0.6).mean_length
    after = model.lookup("vegas", 6, 0.07, 300, "reasoning", 0.6)
    assert abs(before - 5.5) > 0.5  # the anchor is a real move
    assert after.mean_length == pytest.approx(5.5, rel=1e-6)
    ranged = Anchor("vegas", 6, 0.07, (128, 4000), "reasoning", 0.6, 5.0)
    m2 = AnchoredAcceptance(shape, SHAPE, [_set(ranged)])
    assert m2.range_length("vegas", 6, 0.07, (128, 4000), "reasoning", 0.6) == pytest.approx(
        5.0, rel=1e-6)


def test_fit_with_rates_and_two_workloads(shape: AcceptanceModel) -> None:
    rates = (0.9, 0.8, 0.7, 0.6)
    a = Anchor("vegas", 4, 0.07, None, "chat", 0.6, 1 + sum(rates), per_position_rates=rates)
    b = Anchor("vegas", 4, 0.07, None, "code", 0.6, 2.5)
    model = AnchoredAcceptance(shape, SHAPE, [_set(a, b)])
    sh = model.shifts["vegas"]
    assert set(sh.by_workload) == {"chat", "code"}
    assert sh.by_workload["chat"] > sh.by_workload["code"]  # chat anchored higher
    assert model.range_length("vegas", 4, 0.07, None, "code", 0.6) == pytest.approx(2.5, 1e-6)
    # the joint δ sits between the two per-workload ones
    assert sh.by_workload["code"] < sh.delta < sh.by_workload["chat"]


def test_shift_is_monotone_and_keeps_rates_valid() -> None:
    rates = np.array([0.9, 0.7, 0.5, 0.3, 0.1])
    lengths = [1 + shift_rates(rates, d).sum() for d in np.linspace(-6, 6, 25)]
    assert np.all(np.diff(lengths) > 0)
    for d in (-10.0, -1.0, 0.0, 1.0, 10.0):
        r = shift_rates(rates, d)
        assert np.all((r >= 0) & (r <= 1)) and np.all(np.diff(r) <= 1e-12)
    np.testing.assert_array_equal(shift_rates(rates, 0.0), rates)


def test_replay_reaches_the_shifted_level(shape: AcceptanceModel) -> None:
    dist = shape.lookup("magicdec-stream", 8, 0.05, 2000, "longdoc", 0.6)
    for delta in (-1.0, 1.0):
        shifted = shift_dist(dist, delta)
        got = 1 + shifted.sample(np.random.default_rng(1), 400, 64).mean()
        assert got == pytest.approx(shifted.mean_length, rel=0.03)
        assert (shifted.mean_length > dist.mean_length) == (delta > 0)


def test_no_anchor_method_unchanged_and_said(shape: AcceptanceModel) -> None:
    model = AnchoredAcceptance(shape, SHAPE, [_set(VEGAS)])
    plain = shape.lookup("specextend", 6, 0.07, 300, "reasoning", 0.6)
    got = model.lookup("specextend", 6, 0.07, 300, "reasoning", 0.6)
    np.testing.assert_array_equal(got.rates, plain.rates)
    assert any("no acceptance anchor in test-anchors" in r for r in got.extrapolated)
    assert model.source_for("specextend") == f"trace set {SHAPE} (no specextend anchor in " \
                                             "test-anchors)"
    assert model.source_for("vegas") == f"anchors test-anchors on shape {SHAPE}"
    a = shape.lookup("vegas", 6, 0.07, 300).sample(np.random.default_rng(3), 8, 8)
    b = AnchoredAcceptance(shape, SHAPE).lookup("vegas", 6, 0.07, 300).sample(
        np.random.default_rng(3), 8, 8)
    np.testing.assert_array_equal(a, b)  # no anchors: the shape itself, draw for draw


@pytest.mark.parametrize(("config", "words"), [
    ({"workload": "code"}, "workload code vs reasoning"),
    ({"workload": None}, "workload all vs reasoning"),
    ({"temperature": 0.0}, "temperature 0 vs 0.6"),
    ({"gamma": 13}, "γ 13 vs 6"),
    ({"sparsity": 0.2}, "sparsity 0.2 vs 0.07"),
    ({"context": 1000}, "context 1000 vs 300..300"),
])
def test_far_from_every_anchor_is_marked(shape: AcceptanceModel, config: dict[str, object],
                                         words: str) -> None:
    model = AnchoredAcceptance(shape, SHAPE, [_set(VEGAS)])
    base = {"method": "vegas", "gamma": 6, "sparsity": 0.07, "context": 300,
            "workload": "reasoning", "temperature": 0.6}
    near = model.lookup(**base)  # type: ignore[arg-type]
    assert not any("anchor" in r for r in near.extrapolated)
    far = model.lookup(**{**base, **config})  # type: ignore[arg-type]
    marks = [r for r in far.extrapolated if "far from every anchor of test-anchors" in r]
    assert marks and words in marks[0], far.extrapolated


def test_near_but_not_at_the_anchor_is_not_marked(shape: AcceptanceModel) -> None:
    model = AnchoredAcceptance(shape, SHAPE, [_set(VEGAS)])
    dist = model.lookup("vegas", 8, 0.1, 400, "reasoning", 0.6)
    assert not any("anchor" in r for r in dist.extrapolated)


# ------------------------------------------------------------------------- command line
FAST = ["predict", "--engine", "analytic", "--gamma", "6", "--format", "json"]


def _json(result: Result) -> dict[str, object]:
    out = result.stdout
    return json.loads(out[out.index("{"):])  # type: ignore[no-any-return]


def test_qwen3_uses_published_anchors_by_default_and_none_turns_them_off() -> None:
    runner = CliRunner()
    on = runner.invoke(cli, FAST)
    off = runner.invoke(cli, [*FAST, "--acceptance-anchor", "none"])
    assert on.exit_code == 0 and off.exit_code == 0, on.output + off.output
    doc_on, doc_off = _json(on), _json(off)
    assert any("qwen3-8b-published (packaged) set the acceptance level by default" in str(n)
               for n in doc_on["notes"])  # type: ignore[union-attr]
    rows_on = {r["method"]: r for r in doc_on["rows"]}  # type: ignore[union-attr]
    rows_off = {r["method"]: r for r in doc_off["rows"]}  # type: ignore[union-attr]
    assert rows_on["vegas"]["acceptance_source"] == (
        "anchors qwen3-8b-published on shape smollm2-135m-real")
    assert rows_off["vegas"]["acceptance_source"] == "trace set smollm2-135m-real"
    # the anchors raise vegas's level (at 32K both follow the context trend up, the unanchored
    # lower level more: a logit shift moves a saturating length less)
    assert rows_on["vegas"]["acceptance_length"] > rows_off["vegas"]["acceptance_length"] + 0.2


def test_predicting_the_anchors_own_setting_gives_them_back() -> None:
    """The paper's setting (182-token prompts, 19,680-token outputs, the anchors' own
    output_len): the simulated acceptance of every anchored method, following the running
    context over the whole generation as the anchors' counts do, is its packaged anchor, up
    to the replay's sampling noise."""
    args = ["predict", "--gamma", "6", "--sparsity", "0.07", "--context", "182",
            "--output-len", "19680", "--batch", "4", "--workload", "reasoning",
            "--temperature", "0.6", "--replications", "1", "--format", "json",
            "-m", "magicdec-stream", "-m", "magicdec-quest", "-m", "specextend", "-m", "vegas"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    rows = {r["method"]: r for r in _json(result)["rows"]}  # type: ignore[union-attr]
    want = {"magicdec-stream": 4.92, "magicdec-quest": 5.43, "specextend": 5.24, "vegas": 6.24}
    for method, length in want.items():
        assert rows[method]["acceptance_length"] == pytest.approx(length, rel=0.04), method


def test_smollm2_gets_no_default_anchors() -> None:
    result = CliRunner().invoke(cli, [*FAST, "--model", "smollm2-135m", "--context", "4K"])
    assert result.exit_code == 0, result.output
    doc = _json(result)
    assert not any("anchors" in str(n) for n in doc["notes"])  # type: ignore[union-attr]


def test_an_anchor_file_on_the_command_line(tmp_path: Path) -> None:
    path = write_anchors(_set(Anchor("vegas", 6, 0.07, None, None, None, 3.0)),
                         tmp_path / "mine.csv")
    result = CliRunner().invoke(cli, [*FAST, "--acceptance-anchor", str(path)])
    assert result.exit_code == 0, result.output
    rows = {r["method"]: r for r in _json(result)["rows"]}  # type: ignore[union-attr]
    assert rows["vegas"]["acceptance_source"] == "anchors mine on shape smollm2-135m-real"


@pytest.mark.parametrize(("content", "words"), [
    (('{"format": "vegas-sim.acceptance-anchors", "version": 1, "anchors": '
     '[{"method": "vegas", "gamma": 6, "mean_acceptance_length": 9}]}'),
     "anchor 0, field 'mean_acceptance_length'"),
    ("not json", "not valid JSON"),
])
def test_bad_anchor_files_exit_nonzero(tmp_path: Path, content: str, words: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    result = CliRunner().invoke(cli, [*FAST, "--acceptance-anchor", str(path)])
    assert result.exit_code != 0 and words in result.output, result.output


@pytest.mark.parametrize("args", [
    ["--acceptance-anchor", "nope"],
    ["--acceptance-anchor", "none", "--acceptance-anchor", "qwen3-8b-published"],
])
def test_bad_anchor_names_exit_nonzero(args: list[str]) -> None:
    result = CliRunner().invoke(cli, [*FAST, *args])
    assert result.exit_code != 0 and "--acceptance-anchor" in result.output, result.output


def test_anchors_at_several_contexts_are_followed_in_context(shape: AcceptanceModel) -> None:
    """Anchors that fall with the context faster than the shape does: one δ cannot meet both
    ends, a δ that moves with log2 context does, and it is held past the anchored contexts."""
    near = shape.lookup("magicdec-stream", 4, 0.07, 1024, "longdoc", 0.0).mean_length
    lo = Anchor("magicdec-stream", 4, 0.07, (1024, 1024), "longdoc", 0.0, near + 0.3)
    hi = Anchor("magicdec-stream", 4, 0.07, (6144, 6144), "longdoc", 0.0, near - 0.6)
    model = AnchoredAcceptance(shape, SHAPE, [_set(lo, hi)])
    sh = model.shifts["magicdec-stream"]
    for a, got in zip(sh.anchors, sh.fitted_lengths):
        assert got == pytest.approx(a.mean_acceptance_length, rel=1e-3)
    shift = sh.shift_for("longdoc")
    assert shift.slope < 0
    assert shift.at(512) == shift.at(1024) and shift.at(65536) == shift.at(6144)
    one = AnchoredAcceptance(shape, SHAPE, [_set(lo)]).shifts["magicdec-stream"]
    assert one.shift_for("longdoc").slope == 0.0


def test_cached_shifts_equal_a_fresh_fit() -> None:
    """The anchored δ's are cached by the shape's fit key and the anchors: a second model
    reads them back and answers as the fitted one does."""
    ts = load_trace_set(SHAPE)
    shape = api.fit_acceptance(ts)
    anchors = [_set(VEGAS)]
    fresh = AnchoredAcceptance(shape, ts.name, anchors)
    api._anchored(shape, ts, anchors)  # fitted and stored (or read, if an earlier test did)
    again = api._anchored(shape, ts, anchors)
    assert again.shifts == fresh.shifts
    np.testing.assert_array_equal(again.lookup("vegas", 6, 0.07, 300).rates,
                                  fresh.lookup("vegas", 6, 0.07, 300).rates)


def test_transfer_term_grows_with_the_distance_from_the_anchor(shape: AcceptanceModel) -> None:
    sds = TransferSd(near=0.1, workload=0.8, temperature=0.4, per_sparsity_octave=0.3,
                     per_context_octave=0.2)
    model = AnchoredAcceptance(shape, SHAPE, [_set(VEGAS)], transfer=sds)
    at = model.lookup("vegas", 6, 0.07, 300, "reasoning", 0.6)
    other_t = model.lookup("vegas", 6, 0.07, 300, "reasoning", 0.0)
    other_wl = model.lookup("vegas", 6, 0.07, 300, "chat", 0.0)
    far_s = model.lookup("vegas", 6, 0.01, 300, "chat", 0.0)
    assert 0 < at.transfer_sd_pct < other_t.transfer_sd_pct < other_wl.transfer_sd_pct
    assert other_wl.transfer_sd_pct < far_s.transfer_sd_pct
    assert set(at.transfer_axes_pct) == {"anchor"}
    assert set(far_s.transfer_axes_pct) == {"anchor", "workload", "temperature", "sparsity"}
    assert sum(far_s.transfer_axes_pct.values()) == pytest.approx(far_s.transfer_sd_pct)
    # sparsity within SPARSITY_RATIO and γ anywhere add nothing
    assert model.lookup("vegas", 12, 0.1, 300, "reasoning", 0.6).transfer_axes_pct.keys() \
        == {"anchor"}
    # no transfer sds, no term; a plain shape model has none either
    plain = AnchoredAcceptance(shape, SHAPE, [_set(VEGAS)], transfer=TransferSd())
    assert plain.lookup("vegas", 6, 0.01, 300, "chat", 0.0).transfer_sd_pct == 0.0
    assert shape.lookup("vegas", 6, 0.01, 300, "chat", 0.0).transfer_sd_pct == 0.0


def test_transfer_term_takes_the_larger_side() -> None:
    rates = np.array([0.95, 0.9, 0.85, 0.8])  # near γ + 1: a shift down moves it most
    dist = AcceptanceDist("vegas", 4, rates)
    base = dist.mean_length
    down = 1.0 + float(shift_rates(rates, -1.96 * 0.5).sum())
    up = 1.0 + float(shift_rates(rates, 1.96 * 0.5).sum())
    assert base - down > up - base
    assert shifted_dist_sd_pct(dist, 0.5) == pytest.approx(100 * (base - down) / 1.96 / base)
    assert shifted_dist_sd_pct(dist, 0.0) == 0.0


def test_the_interval_widens_by_the_transfer_term_but_tune_ranks_without_it() -> None:
    # qwen3-8b's packaged anchors are reasoning at T 0.6: longdoc at T 0 differs in both
    rows = api.predict(gamma=6, sparsity=0.07, context="4K", methods=["vegas"],
                       workload="longdoc", engine="analytic")
    row = rows[rows.method == "vegas"].iloc[0]
    assert row.pi_transfer_pct > 0
    assert 0 < row.pi_low < row.pi_low_shape < row.throughput_tok_s
    assert row.pi_dominant.startswith("extrapolation-distance (anchors: ")
    low = lower_score(rows[rows.method == "vegas"], "throughput")
    assert float(low.iloc[0]) == pytest.approx(float(row.pi_low_shape))


def test_a_long_generation_carries_the_transfer_term_through_its_stages() -> None:
    rows = api.predict(gamma=6, sparsity=0.07, context=200, output_len=8000, batch=1,
                       methods=["vegas"], workload="longdoc", engine="analytic")
    row = rows[rows.method == "vegas"].iloc[0]
    assert "running context" in row.extrapolated
    assert row.pi_transfer_pct > 0


def test_another_models_level_adds_the_model_axis(shape: AcceptanceModel) -> None:
    """Anchors measured on another model (`anchor_model`) widen an anchored method by the
    `model` sd; a method without an anchor keeps the shape set's level, and when that is
    another model's (`shape_model`) it carries the same axis alone; the predicted model's
    own levels carry none."""
    sds = TransferSd(near=0.1, model=0.9)
    own = AnchoredAcceptance(shape, SHAPE, [_set(VEGAS)], transfer=sds)
    sibling = AnchoredAcceptance(shape, SHAPE, [_set(VEGAS)], transfer=sds, anchor_model="m",
                                 shape_model=SHAPE)
    at = ("vegas", 6, 0.07, 300, "reasoning", 0.6)
    assert set(own.lookup(*at).transfer_axes_pct) == {"anchor"}
    widened = sibling.lookup(*at)
    assert set(widened.transfer_axes_pct) == {"anchor", "model"}
    assert widened.transfer_sd_pct > own.lookup(*at).transfer_sd_pct
    assert widened.mean_length == pytest.approx(own.lookup(*at).mean_length)  # the level
    unanchored = ("magicdec-stream", 6, 0.07, 300, "reasoning", 0.6)
    assert own.lookup(*unanchored).transfer_sd_pct == 0.0
    proxy = sibling.lookup(*unanchored)
    assert set(proxy.transfer_axes_pct) == {"model"} and proxy.transfer_sd_pct > 0.0


def test_a_model_without_anchors_takes_its_familys() -> None:
    """Qwen3-4B has no anchors of its own: Qwen3-8B's published ones set its level, marked as
    another model's; gpt-oss-20b has no family anchors and keeps the proxy's level, whose
    interval carries the `model` axis all the same."""
    qwen = api.load_models("qwen3-8b", None, None, model_what_if="qwen3-4b")
    assert any("qwen3-8b-published were measured on qwen3-8b, used for qwen3-4b" in n
               for n in qwen[2])
    d = qwen[1].lookup("vegas", 6, 0.07, 182, "reasoning", 0.6)
    assert "model" in d.transfer_axes_pct
    oss = api.load_models("gpt-oss-20b", None, None)
    assert not oss[1].anchor_sets
    d = oss[1].lookup("vegas", 6, 0.07, 182, "reasoning", 0.6)
    assert set(d.transfer_axes_pct) == {"model"}
    own = api.load_models("qwen3-8b", None, None)[1].lookup("vegas", 6, 0.07, 182,
                                                            "reasoning", 0.6)
    assert "model" not in own.transfer_axes_pct  # its own published anchors


def _stream_at(output_len: int) -> pd.Series:
    rows = api.predict(gamma=6, sparsity=0.07, context=182, output_len=output_len, batch=4,
                       methods=["magicdec-stream"], workload="reasoning", temperature=0.6,
                       engine="analytic")
    return rows[rows.method == "magicdec-stream"].iloc[0]


def test_the_anchors_own_generation_carries_no_context_trend_term() -> None:
    """The packaged AIME25 anchors pool whole 19,680-token generations, which the shape reaches
    along its reasoning trend: their δ took up that trend's error, so a prediction of the same
    generations has (almost) none of it left, while the unanchored shape carries all of it."""
    row = _stream_at(19680)
    assert "took up the trend's error" in row.extrapolated
    context_term = row.pi_extrapolation_acceptance_pct - row.pi_transfer_pct
    unanchored = api.predict(gamma=6, sparsity=0.07, context=182, output_len=19680, batch=4,
                             methods=["magicdec-stream"], workload="reasoning",
                             temperature=0.6, engine="analytic", acceptance_anchors=["none"])
    shape_term = float(unanchored.iloc[1].pi_extrapolation_acceptance_pct)
    assert shape_term > 10.0
    assert context_term < 0.2 * shape_term


def test_a_short_generation_at_the_anchors_workload_carries_the_anchors_trend_error() -> None:
    """Inside the shape's traced contexts the trend is not followed, but the level is the
    anchors', fitted through it: the error it took up at 20K tokens lands on a 256-token
    generation whole, and shrinks as the generation nears the anchors' length."""
    terms = [(r.pi_extrapolation_acceptance_pct - r.pi_transfer_pct)
             for r in (_stream_at(n) for n in (256, 4096, 19680))]
    assert terms[0] > terms[1] > terms[2] >= 0.0
    assert terms[0] > 5.0


def test_another_workloads_trend_keeps_its_own_term(shape: AcceptanceModel) -> None:
    """The anchors' δ says nothing about another workload's trend: its term is the shape's."""
    model = AnchoredAcceptance(shape, SHAPE, [_set(
        Anchor("magicdec-stream", 6, 0.07, (182, 182), "reasoning", 0.6, 4.9, output_len=8000))])
    far = model.lookup("magicdec-stream", 6, 0.07, 30000, "longdoc", 0.6)
    own = shape.lookup("magicdec-stream", 6, 0.07, 30000, "longdoc", 0.6)
    assert far.context_trend_sd_pct == pytest.approx(own.context_trend_sd_pct)
    assert "took up" not in " ".join(far.extrapolated)
