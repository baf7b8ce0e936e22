"""`traces subset`: rows filtered by --where, meta trimmed and traced to its source."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vegas_sim.errors import UserInputError
from vegas_sim.traces.io import load_trace_set
from vegas_sim.traces.subset import parse_where, subset_trace_set


def test_parse_where_reads_each_operator_and_suffix() -> None:
    conds = parse_where("batch<=16,context>=32K,gamma<8,sparsity in 0.01|0.2,method==vegas")
    assert [(c.column, c.op) for c in conds] == [
        ("batch", "<="), ("context", ">="), ("gamma", "<"), ("sparsity", "in"),
        ("method", "==")]
    assert conds[1].values == (32768.0,)
    assert conds[3].values == (0.01, 0.2)


@pytest.mark.parametrize("text", ["foo<3", "batch<=x", "batch~3", "", "batch<=1|2"])
def test_parse_where_refuses_bad_conditions(text: str) -> None:
    with pytest.raises(UserInputError):
        parse_where(text)


def test_latency_subset_keeps_only_passing_rows(tmp_path: Path) -> None:
    out = tmp_path / "small"
    sub = subset_trace_set("qwen3-8b-h200", out, "batch<=16,context<=32K")
    assert sub.latency["batch"].max() <= 16 and sub.latency["context"].max() <= 32768
    assert len(sub.latency) > 0
    meta = json.loads((out / "meta.json").read_text())
    assert max(meta["grid"]["batch"]) == 16 and max(meta["grid"]["context"]) == 32768
    assert meta["where"] == "batch<=16,context<=32768"
    assert meta["subset_of"]["content_hash"] == load_trace_set("qwen3-8b-h200").meta[
        "content_hash"]
    load_trace_set(out)  # the content hash was rewritten: the set loads and checks


def test_gamma_bound_truncates_longer_acceptance_traces(tmp_path: Path) -> None:
    sub = subset_trace_set("smollm2-135m-real", tmp_path / "g", "gamma<=7")
    acc = sub.acceptance
    assert set(acc["gamma"].unique()) <= {4, 7} and (acc["gamma"] == 7).any()
    assert (acc["accepted"] <= acc["gamma"]).all()
    assert all(len(p) == g for p, g in zip(acc["accept_prob"][:50], acc["gamma"][:50]))


def test_nothing_left_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="no latency row"):
        subset_trace_set("qwen3-8b-h200", tmp_path / "none", "batch>1K")
    assert not np.any([p.exists() for p in [tmp_path / "none" / "meta.json"]])
