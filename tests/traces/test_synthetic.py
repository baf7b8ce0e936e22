"""Synthetic trace sets: deterministic, complete, and faithful to their stated ground truth."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from vegas_sim.errors import UserInputError
from vegas_sim.methods import iteration_plan
from vegas_sim.models import get_preset
from vegas_sim.traces import catalog, io
from vegas_sim.traces.synthetic import (
    SYNTHETIC_GPU,
    make_synthetic_trace_set,
    roofline_ms,
    synthetic_alpha,
    synthetic_rates,
)

GRID: dict[str, Any] = {
    "methods": ("vanilla", "magicdec-stream", "magicdec-quest", "specextend", "vegas"),
    "gammas": (3, 5), "sparsities": (0.05, 0.2), "contexts": (1024, 8192), "batches": (1, 8),
}


def test_meta_is_clearly_synthetic(small_set: Path) -> None:
    ts = io.load_trace_set(small_set)
    assert ts.meta["synthetic"] is True and ts.gpu_name == "synthetic"
    assert "SYNTHETIC" in catalog.describe(ts)


def test_same_seed_same_rows_other_seed_other_rows(tmp_path: Path) -> None:
    a = make_synthetic_trace_set(tmp_path / "a", seed=7, **GRID)
    b = make_synthetic_trace_set(tmp_path / "b", seed=7, **GRID)
    c = make_synthetic_trace_set(tmp_path / "c", seed=8, **GRID)
    pd.testing.assert_frame_equal(a.latency, b.latency)
    assert a.meta["content_hash"] == b.meta["content_hash"]
    assert not np.array_equal(a.latency["ms_median"], c.latency["ms_median"])
    assert not np.array_equal(a.acceptance["accepted"], c.acceptance["accepted"])


def test_every_planned_phase_has_a_row(tmp_path: Path) -> None:
    ts = make_synthetic_trace_set(tmp_path / "s", noise=0.0, **GRID)
    spec = get_preset("qwen3-8b")
    index = ts.latency.set_index(["phase", "method", "batch", "context", "n_query", "kv_read",
                                  "collect_rows"])["ms_median"]
    checked = 0
    for method in GRID["methods"]:
        for gamma in GRID["gammas"]:
            for s in GRID["sparsities"]:
                for c in GRID["contexts"]:
                    for b in GRID["batches"]:
                        ctx = np.full(b, c)
                        for call in iteration_plan(method, gamma, ctx, s, spec.max_positions):
                            key = (call.phase, method, b, c, call.n_query, int(call.kv_read[0]),
                                   call.collect_rows)
                            want = roofline_ms(spec, SYNTHETIC_GPU, call.phase, b, call.n_query,
                                               float(call.kv_read[0]), call.collect_rows)
                            assert index.loc[key] == pytest.approx(want, rel=1e-12)  # noise 0
                            checked += 1
    assert checked > 500


def test_roofline_follows_the_physics() -> None:
    spec = get_preset("qwen3-8b")
    t = lambda **kw: roofline_ms(spec, SYNTHETIC_GPU, **kw)
    short = t(phase="verify", batch=4, n_query=8, kv_read=4096)
    long = t(phase="verify", batch=4, n_query=8, kv_read=65536)
    assert long > short
    # Attention time grows linearly with KV read once it dominates.
    d1 = t(phase="verify", batch=4, n_query=8, kv_read=131072) - long
    assert d1 == pytest.approx(long - t(phase="verify", batch=4, n_query=8, kv_read=0), rel=0.01)
    assert t(phase="verify", batch=4, n_query=8, kv_read=4096, collect_rows=2) > short
    # Small batches are bandwidth bound: weights dominate a single decode.
    weights_ms = spec.weight_bytes() / (SYNTHETIC_GPU["copy_bandwidth_gbs"] * 1e6)
    assert t(phase="decode", batch=1, n_query=1, kv_read=1) == pytest.approx(weights_ms, rel=0.1)


def test_alpha_rises_with_sparsity_and_orders_methods() -> None:
    for method in ("vegas", "specextend", "magicdec-quest", "magicdec-stream"):
        values = [synthetic_alpha(method, s, 8192) for s in (0.01, 0.03, 0.07, 0.15, 0.5)]
        assert all(b > a for a, b in itertools.pairwise(values))
    assert synthetic_alpha("vegas", 0.07, 8192) > synthetic_alpha("magicdec-stream", 0.07, 8192)
    assert synthetic_alpha("vegas", 0.07, 65536) < synthetic_alpha("vegas", 0.07, 4096)
    np.testing.assert_allclose(synthetic_rates("vegas", 3, 0.07, 4096),
                               synthetic_alpha("vegas", 0.07, 4096) ** np.arange(1, 4))


def test_acceptance_rows_match_ground_truth(tmp_path: Path) -> None:
    ts = make_synthetic_trace_set(
        tmp_path / "s", methods=("vegas",), gammas=(4,), sparsities=(0.07,), contexts=(4096,),
        batches=(1,), requests=50, iterations=40, seed=3)
    acc = ts.acceptance["accepted"].to_numpy()
    empirical = np.array([(acc >= i).mean() for i in range(1, 5)])  # r_i = P(>= i accepted)
    truth = synthetic_rates("vegas", 4, 0.07, 4096)
    np.testing.assert_allclose(empirical, truth, atol=0.04)  # 2000 samples: std <= 0.011
    # Greedy: accept_prob is the 1/0 outcome, so leading ones equal `accepted`.
    probs = np.stack(ts.acceptance["accept_prob"].to_numpy())
    leading = np.cumprod(probs == 1.0, axis=1).sum(axis=1)
    np.testing.assert_array_equal(leading, acc)
    # Contexts grow by the tokens each iteration produced.
    r0 = ts.acceptance[ts.acceptance["request"] == 0].sort_values("iteration")
    np.testing.assert_array_equal(np.diff(r0["context"]), r0["accepted"].to_numpy()[:-1] + 1)


def test_sampled_acceptance_records_probabilities(tmp_path: Path) -> None:
    ts = make_synthetic_trace_set(
        tmp_path / "s", methods=("vegas",), gammas=(3,), sparsities=(0.1,), contexts=(2048,),
        batches=(1,), temperatures=(0.6,), requests=3, iterations=5)
    probs = np.stack(ts.acceptance["accept_prob"].to_numpy())
    np.testing.assert_allclose(probs, synthetic_alpha("vegas", 0.1, 2048, 0.6), rtol=1e-6)


def test_random_weights_and_latency_only(tmp_path: Path) -> None:
    r = make_synthetic_trace_set(tmp_path / "r", weights_kind="random", methods=("vegas",),
                                 gammas=(2,), sparsities=(0.1,), contexts=(1024,), batches=(1,))
    assert set(r.acceptance["model_weights"]) == {"random"} and not r.has_real_acceptance
    lo = make_synthetic_trace_set(tmp_path / "l", acceptance=False, methods=("vegas",),
                                  gammas=(2,), sparsities=(0.1,), contexts=(1024,), batches=(1,))
    assert lo.acceptance.empty and len(lo.latency) > 0


def test_refuses_the_package_defaults_directory() -> None:
    with pytest.raises(UserInputError, match="never be written into the packaged defaults"):
        make_synthetic_trace_set(io.PACKAGED_DIR / "oops")
    assert not (io.PACKAGED_DIR / "oops").exists()
