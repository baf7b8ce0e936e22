"""The KV-selection overhead: the selection phases plus the score write-out, the write-out
priced as the method's verify over a plain verify of the same set at the same point."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from tests.sim.test_latency import GPU, MODEL, synthetic_latency, true_ms
from vegas_sim.reports.terminal import kv_selection_line
from vegas_sim.sim.kv_selection import (
    collection_share,
    kv_selection_columns,
    plain_verify_method,
)
from vegas_sim.sim.latency import LatencyModel


@pytest.fixture(scope="module")
def exact() -> LatencyModel:
    """Every method, fitted on noise-free synthetic times."""
    return LatencyModel.fit(synthetic_latency(np.random.default_rng(0), noise=0.0), MODEL, GPU)


def test_write_out_share_is_verify_over_the_plain_verify(exact: LatencyModel) -> None:
    """Vegas collects 2 of its γ + 1 rows: its share is 1 − plain / collecting verify of the
    synthetic truth, although its own fit cannot tell the write-out from the KV read."""
    B, C, g = 4, 32768, 7
    kv = C + g + 1
    want = 1 - true_ms("verify", B, g + 1, kv, 0) / true_ms("verify", B, g + 1, kv, 2)
    assert want > 0.01
    assert collection_share(exact, "vegas", g, B, C) == pytest.approx(want, rel=1e-3)
    assert plain_verify_method(exact) == "magicdec-stream"


def test_collecting_every_row_costs_more_than_two(exact: LatencyModel) -> None:
    B, C, g = 4, 32768, 7
    two = collection_share(exact, "vegas", g, B, C)
    every = collection_share(exact, "specextend", g, B, C)
    assert every > two > 0
    assert collection_share(exact, "vegas-all", g, B, C) == pytest.approx(every, rel=0.05)


@pytest.mark.parametrize("method", ["vanilla", "magicdec-stream", "magicdec-quest"])
def test_methods_that_collect_nothing_pay_no_write_out(exact: LatencyModel, method: str
                                                       ) -> None:
    assert collection_share(exact, method, 7, 4, 32768) == 0.0


def test_without_a_plain_verify_the_write_out_is_unknown() -> None:
    lm = LatencyModel.fit(synthetic_latency(np.random.default_rng(1), noise=0.0,
                                            methods=("vanilla", "vegas")), MODEL, GPU)
    assert plain_verify_method(lm) is None
    assert math.isnan(collection_share(lm, "vegas", 7, 4, 32768))
    cols = kv_selection_columns(lm, "vegas", 7, 4, 32768,
                                {"ms_verify": 20.0, "ms_select": 1.0, "iter_ms": 50.0})
    assert math.isnan(cols["kv_selection_pct"]) and cols["plain_verify_method"] == ""


def test_share_counts_each_methods_selection_phases(exact: LatencyModel) -> None:
    """Quest: page scoring and its per-iteration work; Vegas: select plus the write-out;
    phases that are not selection (draft, sample) never count."""
    row = {"ms_verify": 20.0, "ms_select": 1.0, "ms_quest_meta": 5.0, "ms_other": 2.0,
           "ms_draft_step": 40.0, "ms_sample": 1.0, "iter_ms": 80.0}
    quest = kv_selection_columns(exact, "magicdec-quest", 7, 4, 32768, row)
    assert quest["kv_selection_pct"] == pytest.approx(100 * (5.0 + 2.0) / 80.0)
    assert quest["ms_verify_collect"] == 0.0 and quest["plain_verify_method"] == ""
    vegas = kv_selection_columns(exact, "vegas", 7, 4, 32768, row)
    share = collection_share(exact, "vegas", 7, 4, 32768)
    assert vegas["ms_verify_collect"] == pytest.approx(share * 20.0)
    assert vegas["kv_selection_pct"] == pytest.approx(100 * (1.0 + share * 20.0) / 80.0)
    assert kv_selection_columns(exact, "vanilla", 1, 4, 32768, row)["kv_selection_pct"] == 0.0


def test_terminal_line_names_the_reference_and_skips_vanilla() -> None:
    df = pd.DataFrame({
        "method": ["vanilla", "vegas", "magicdec-quest"], "iter_ms": [20.0, 70.0, 80.0],
        "kv_selection_pct": [0.0, 5.0, 20.0],
        "plain_verify_method": ["", "magicdec-stream", ""],
    })
    line = kv_selection_line(df)
    assert "vanilla" not in line
    assert "vegas 3.50 ms (5.0 %)" in line and "magicdec-quest 16.00 ms (20.0 %)" in line
    assert "magicdec-stream's plain verify" in line
    assert kv_selection_line(df.drop(columns="kv_selection_pct")) == ""
