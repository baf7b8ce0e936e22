"""Past the predicted model's native positions (where it runs RoPE-scaled), a lookup of a
workload the proxy's RoPE-scaled set traced comes from that set, one it did not trace takes
the level step the traced ones show; inside the window nothing changes."""

from __future__ import annotations

import re

import numpy as np
import pytest

from vegas_sim import api
from vegas_sim.sim.context_trend import shift_dist
from vegas_sim.traces import catalog, io

LONG = 110592


@pytest.fixture(scope="module")
def default() -> api.AnchoredAcceptance:
    return api.load_models("qwen3-8b", None, "h100-nvl")[1]


def test_the_scaled_companion_is_the_yarn_set() -> None:
    native = io.load_trace_set("smollm2-135m-real")
    scaled = catalog.scaled_companion(native)
    assert scaled is not None and scaled.name == "smollm2-135m-real-yarn4"
    assert scaled.meta["model"]["rope_scaling"]
    assert catalog.scaled_companion(scaled) is None  # no other scaled set of that model


def test_past_the_window_a_traced_workload_comes_from_the_scaled_set(
        default: api.AnchoredAcceptance) -> None:
    scaled = api._fit_packaged("smollm2-135m-real-yarn4")
    for workload in ("longdoc", "recall"):
        d = default.lookup("magicdec-stream", 5, 0.07, LONG, workload, 0.6, output_len=1024)
        assert "smollm2-135m-real-yarn4" in d.extrapolated[0]
        assert "native 32768 positions" in d.extrapolated[0]
        # the scaled set's shape at the level the native shape's anchors set
        delta = default.shifts["magicdec-stream"].delta_for(workload, LONG)
        want = shift_dist(scaled.lookup("magicdec-stream", 5, 0.07, LONG, workload, 0.6,
                                        output_len=1024), delta)
        np.testing.assert_allclose(d.rates, want.rates, rtol=1e-12)
        native = default.lookup("magicdec-stream", 5, 0.07, 32768, workload, 0.6,
                                output_len=1024)
        assert d.mean_length < native.mean_length  # the rise past the native set is not followed


def test_inside_the_window_a_lookup_stays_native(default: api.AnchoredAcceptance) -> None:
    for context, workload in ((32768, "longdoc"), (32768, "code"), (32768, None)):
        d = default.lookup("vegas", 7, 0.07, context, workload, 0.6, output_len=1024)
        assert not any("RoPE-scaled" in n for n in d.extrapolated), (context, workload)
    a = default.lookup("vegas", 7, 0.07, 32768, "longdoc", 0.6, output_len=1024)
    shape = api.load_models("qwen3-8b", None, "h100-nvl",
                            acceptance_traces="smollm2-135m-real")[1]
    b = shape.lookup("vegas", 7, 0.07, 32768, "longdoc", 0.6, output_len=1024)
    np.testing.assert_array_equal(a.rates, b.rates)


def test_a_model_without_a_native_window_is_unchanged() -> None:
    assert "gpt-oss-20b" not in catalog.NATIVE_POSITIONS  # trained to its full length
    model = api.load_models("gpt-oss-20b", None, None)[1]
    d = model.lookup("vegas", 7, 0.07, LONG, "longdoc", 0.6, output_len=1024)
    assert not any("RoPE-scaled" in n for n in d.extrapolated)


def test_every_workload_pooled_past_the_window_pools_the_scaled_sets(
        default: api.AnchoredAcceptance) -> None:
    """`--workload all` past the window: the scaled set's workloads pooled (the only evidence
    there), not the native set's short-prompt workloads followed out by their trends."""
    d = default.lookup("vegas", 7, 0.07, LONG, None, 0.6, output_len=1024)
    assert "smollm2-135m-real-yarn4" in d.extrapolated[0]
    assert "its workloads pooled: chat-long, code-long, longdoc, recall" in d.extrapolated[0]
    native = api.load_models("qwen3-8b", None, "h100-nvl",
                             acceptance_traces="smollm2-135m-real")[1]
    n = native.lookup("vegas", 7, 0.07, LONG, None, 0.6, output_len=1024)
    assert not any("RoPE-scaled" in x for x in n.extrapolated)
    assert d.mean_length != pytest.approx(n.mean_length, rel=1e-3)


def test_past_the_window_an_untraced_workload_takes_the_scaled_sets_level_step(
        default: api.AnchoredAcceptance) -> None:
    """A workload the scaled set did not trace (code) is moved by the mean step of the traced
    ones from the native set's longest context into the scaled set: lower, with that step's
    spread added to its context sd."""
    native = api.load_models("qwen3-8b", None, "h100-nvl",
                             acceptance_traces="smollm2-135m-real")[1]
    d = default.lookup("vegas", 7, 0.07, LONG, "code", 0.6, output_len=1024)
    n = native.lookup("vegas", 7, 0.07, LONG, "code", 0.6, output_len=1024)
    note = next(x for x in d.extrapolated if "not traced so" in x)
    assert "code not traced so in smollm2-135m-real-yarn4" in note
    assert all(w in note for w in ("chat-long", "code-long", "longdoc", "recall"))
    assert d.mean_length < n.mean_length
    edge = int(re.search(r"its acceptance at (\d+) moved", note)[1])  # type: ignore[index]
    at_edge = native.lookup("vegas", 7, 0.07, edge, "code", 0.6, output_len=1024)
    assert d.context_trend_sd_pct > at_edge.context_trend_sd_pct  # the step's spread added


def test_past_the_window_an_untraced_workload_leaves_its_native_trend_where_evidence_ends(
        ) -> None:
    """Longdoc left out of the scaled set: its native lookup is taken at the longest context
    the scaled set's workloads were traced natively, not followed out along its own rising
    trend; at any context past the window it is that lookup moved by the δ its note prints
    (the other workloads' step to the scaled set there)."""
    from vegas_sim.sim.acceptance import AcceptanceModel, PastWindow

    native = api._fit_packaged("smollm2-135m-real")
    rows = io.load_trace_set("smollm2-135m-real-yarn4").acceptance
    scaled = AcceptanceModel.from_traces(rows[rows.workload != "longdoc"], "real")
    model = native.past_window(PastWindow(8192, lambda: scaled, "the scaled set", "smollm2"))
    edge = max(native.traced_contexts("vegas", w)[1] for w in scaled.workloads)
    base = native.lookup("vegas", 7, 0.07, edge, "longdoc", 0.6)
    for context in (16384, 28672):
        d = model.lookup("vegas", 7, 0.07, context, "longdoc", 0.6)
        note = d.extrapolated[0]
        assert f"its acceptance at {edge} moved by" in note, note
        delta = float(note.split("moved by δ ")[1].split()[0])
        assert d.mean_length == pytest.approx(shift_dist(base, delta).mean_length, rel=0.01)
        along = native.lookup("vegas", 7, 0.07, context, "longdoc", 0.6)
        assert along.mean_length > base.mean_length  # the native trend it no longer follows


def test_the_steps_sd_is_one_more_workloads_predictive_sd() -> None:
    """k steps: sd·√(1 + 1/k), widened by Student's t (k − 1 dof) over 1.96; one: its size."""
    from scipy.stats import t

    from vegas_sim.sim.acceptance import step_sd

    steps = np.array([-0.75, -1.08, -1.16, -1.51])
    want = steps.std(ddof=1) * np.sqrt(1.25) * t.ppf(0.975, 3) / 1.96
    assert step_sd(steps) == pytest.approx(want)
    assert step_sd(steps) > 1.5 * steps.std(ddof=1)
    assert step_sd(np.array([-0.9])) == pytest.approx(0.9)
