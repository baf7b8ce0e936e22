"""Sparsity trend above the traced sparsities: the fitted slope, its guards, the note."""

from __future__ import annotations

import numpy as np
import pytest

from vegas_sim.sim.context_trend import shift_rates
from vegas_sim.sim.sparsity_trend import TREND_SPARSITIES, fit_sparsity_trend, sparsity_note

BASE = np.array([0.8, 0.6, 0.45, 0.3])  # per-position rates at the lowest sparsity


def _rates(slope: float, sparsities: list[float]) -> list[np.ndarray]:
    """Rates whose conditional logits move by `slope` per doubling of sparsity."""
    return [shift_rates(BASE, slope * np.log2(s / sparsities[0])) for s in sparsities]


def test_a_logit_line_is_recovered_and_followed() -> None:
    sps = [0.01, 0.02, 0.04, 0.08]
    trend = fit_sparsity_trend(sps, _rates(0.5, sps), [1e-4] * len(sps))
    assert trend.slope == pytest.approx(0.5, rel=1e-3)
    assert trend.buckets == tuple(sps[-TREND_SPARSITIES:])  # fitted on the top ones only
    assert trend.shift(1.0) == pytest.approx(0.5, rel=1e-3)
    # held beyond twice the span fitted (2 doublings here)
    assert trend.shift(10.0) == pytest.approx(trend.shift(4.0))


def test_a_falling_or_single_sparsity_is_held_flat() -> None:
    sps = [0.05, 0.1, 0.2]
    falling = fit_sparsity_trend(sps, _rates(-0.4, sps), [1e-4] * 3)
    assert falling.slope == 0.0 and "falls with sparsity" in falling.reason
    one = fit_sparsity_trend([0.1], _rates(0.5, [0.1]), [1e-4])
    assert one.slope == 0.0 and one.reason == "one traced sparsity"
    noisy = fit_sparsity_trend(sps, _rates(0.05, sps), [0.5] * 3)  # within its se of flat
    assert noisy.slope == 0.0


def test_note_says_what_was_followed() -> None:
    sps = [0.03, 0.05, 0.07]
    trend = fit_sparsity_trend(sps, _rates(0.5, sps), [1e-4] * 3)
    note = sparsity_note(0.14, 0.07, [trend], [1.0], trend.shift(1.0), 7.33, 8.85)
    assert note.startswith("sparsity 0.14 above traced max 0.07: extrapolated along the "
                           "sparsity trend, +0.50 logit per doubling (fitted on 0.03..0.07)")
    assert note.endswith("+1.00 doublings: shift +0.50, mean acceptance length 7.33 -> 8.85")
    flat = sparsity_note(0.14, 0.07, [fit_sparsity_trend([0.07], [BASE], [1e-4])], [1.0],
                         0.0, 7.33, 7.33)
    assert flat == ("sparsity 0.14 above traced max 0.07: sparsity trend flat (one traced "
                    "sparsity): held at 0.07")
