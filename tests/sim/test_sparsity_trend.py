"""Sparsity trend above the traced sparsities, in log budget: the budget axis, the weight
between traced sparsities, the fitted slope, its guards, the note."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vegas_sim.sim.context_trend import shift_rates
from vegas_sim.sim.sparsity_trend import (
    IterationContexts,
    borrowed_trend,
    budget_doublings,
    budget_weight,
    fit_sparsity_trend,
    informs_slope,
    mean_budget,
    sparsity_note,
)

BASE = np.array([0.8, 0.6, 0.45, 0.3])  # per-position rates at the lowest budget
LONG = IterationContexts.of(np.array([4000, 4000, 4100, 4200]))
SHORT = IterationContexts.of(np.array([150, 160, 200]))


def _rates(slope: float, budgets: list[float]) -> list[np.ndarray]:
    """Rates whose conditional logits move by `slope` per doubling of the budget."""
    return [shift_rates(BASE, slope * np.log2(b / budgets[0])) for b in budgets]


def test_mean_budget_is_the_clamped_share_of_each_iteration() -> None:
    assert mean_budget(0.1, LONG, 32) == pytest.approx(0.1 * (4000 * 2 + 4100 + 4200) / 4)
    assert mean_budget(0.1, SHORT, 32) == 32.0  # every iteration at the floor
    assert mean_budget(0.2, SHORT, 32) == pytest.approx((32 + 32 + 40) / 3)
    assert mean_budget(0.2, IterationContexts.of(np.array([20])), 32) == 20.0  # capped at C


def test_weight_is_linear_in_log_budget() -> None:
    # long prompts: budget ∝ s, so the log-s weight
    assert budget_weight(math.sqrt(0.05 * 0.1), 0.05, 0.1, LONG, 32) == pytest.approx(0.5)
    # short prompts: flat while s·C stays under the floor, then rising with the budget
    assert budget_weight(0.15, 0.1, 0.2, SHORT, 32) == 0.0  # linear in log s: 0.58
    w = budget_weight(0.18, 0.1, 0.2, SHORT, 32)
    assert w == pytest.approx(math.log((32 + 32 + 36) / 3 / 32) / math.log((32 + 32 + 40) / 96))
    # both neighbours at the floor: the same draft, linear in log s
    assert budget_weight(0.02, 0.01, 0.04, SHORT, 32) == pytest.approx(0.5)
    assert budget_doublings(0.2, 0.1, LONG, 32) == pytest.approx(1.0)


def test_a_logit_line_in_budget_is_recovered_and_followed() -> None:
    budgets = [32.0, 32.0, 64.0, 128.0]  # two sparsities at the floor: replicates of one draft
    trend = fit_sparsity_trend([0.01, 0.02, 0.04, 0.08], budgets, _rates(0.5, budgets),
                               [1e-4] * 4)
    assert trend.slope == pytest.approx(0.5, rel=1e-3)
    assert trend.buckets == tuple(budgets)
    assert trend.shift(1.0) == pytest.approx(0.5, rel=1e-3)
    # held beyond twice the span fitted (2 doublings of the budget here)
    assert trend.shift(10.0) == pytest.approx(trend.shift(4.0))


def test_a_falling_floor_or_single_sparsity_is_held_flat() -> None:
    budgets = [50.0, 100.0, 200.0]
    sps = [0.05, 0.1, 0.2]
    falling = fit_sparsity_trend(sps, budgets, _rates(-0.4, budgets), [1e-4] * 3)
    assert falling.slope == 0.0 and "falls with the budget" in falling.reason
    one = fit_sparsity_trend([0.1], [100.0], _rates(0.5, [100.0]), [1e-4])
    assert one.slope == 0.0 and one.reason == "one traced sparsity"
    noisy = fit_sparsity_trend(sps, budgets, _rates(0.05, budgets), [0.5] * 3)
    assert noisy.slope == 0.0  # within its se of flat
    # short prompts: every traced sparsity at the floor (acceptance flat in s): nothing seen
    floor = fit_sparsity_trend(sps, [32.0] * 3, _rates(0.5, [32.0, 64.0, 128.0]), [1e-4] * 3)
    assert floor.slope == 0.0 and "drafts at the budget floor (32)" in floor.reason


def test_a_cell_that_saw_no_budget_change_borrows_the_slope_of_those_that_did() -> None:
    sps = [0.05, 0.1, 0.2]
    floor = fit_sparsity_trend(sps, [32.0] * 3, [BASE] * 3, [1e-4] * 3)
    assert not informs_slope(floor)
    donors = [fit_sparsity_trend(sps, b, _rates(slope, b), [1e-3] * 3)
              for slope, b in ((0.4, [50.0, 100.0, 200.0]), (0.6, [100.0, 200.0, 400.0]))]
    assert all(informs_slope(t) for t in donors)
    borrowed = borrowed_trend(floor, donors)
    # the random-effects mean of 0.4 and 0.6 (equal se: 0.5); its sd predicts a new cell: the
    # mean's se (τ/√2, their se being ~0) and the between-cell τ = 0.1414 (sd of 0.4 and 0.6)
    assert borrowed.slope == pytest.approx(0.5, rel=1e-2)
    assert borrowed.slope_se == pytest.approx(math.hypot(0.1, 0.1414), rel=0.05)
    assert borrowed.span == pytest.approx(2.0) and borrowed.shift(1.0) == borrowed.slope
    assert borrowed.shift(10.0) == pytest.approx(borrowed.shift(4.0))  # their reach, held
    assert "slope of the 2 cells of this method and temperature" in borrowed.reason
    note = sparsity_note(0.4, 0.2, [borrowed], [1.0], 1.0, borrowed.shift(1.0), 3.0, 3.4)
    assert "drafts at the budget floor (32): slope of the 2 cells" in note
    # falling donors lend no fall; no donors, nothing borrowed
    falling = borrowed_trend(floor, [fit_sparsity_trend(sps, [50.0, 100.0, 200.0],
                                                        _rates(-0.4, [50.0, 100.0, 200.0]),
                                                        [1e-3] * 3)])
    assert falling.slope == 0.0
    assert borrowed_trend(floor, []) is floor


def test_note_says_what_was_followed() -> None:
    budgets = [110.0, 185.0, 259.0]
    trend = fit_sparsity_trend([0.03, 0.05, 0.07], budgets, _rates(0.5, budgets), [1e-4] * 3)
    note = sparsity_note(0.14, 0.07, [trend], [1.0], 1.0, trend.shift(1.0), 7.33, 8.85)
    assert note.startswith("sparsity 0.14 above traced max 0.07: extrapolated along the "
                           "sparsity trend, +0.50 logit per doubling of the draft budget "
                           "(fitted on budgets 110..259)")
    assert note.endswith("+1.00 budget doublings: shift +0.50, mean acceptance length "
                         "7.33 -> 8.85")
    flat = sparsity_note(0.14, 0.07, [fit_sparsity_trend([0.07], [259.0], [BASE], [1e-4])],
                         [1.0], 1.0, 0.0, 7.33, 7.33)
    assert flat == ("sparsity 0.14 above traced max 0.07: sparsity trend flat (one traced "
                    "sparsity): held at 0.07")
