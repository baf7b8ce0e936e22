"""Latency model: fit recovery on synthetic roofline data, LOO, extrapolation, what-if, fast path."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

from vegas_sim.errors import TraceSetError
from vegas_sim.gpus import get_gpu
from vegas_sim.methods import METHODS, iteration_plan
from vegas_sim.models import get_preset
from vegas_sim.sim.latency import (
    FEATURES,
    PHASE_FEATURES,
    LatencyModel,
    MeasuredGpu,
    _Physics,
)

MODEL = get_preset("qwen3-8b")
GPU = MeasuredGpu("NVIDIA H200", copy_bandwidth_gbs=4200.0, bf16_tflops=700.0, memory_gb=141.0)

# The "true" efficiencies the synthetic GPU runs at (ms = Σ coef · roofline-ms feature).
TRUE = {
    "const": 0.25, "gemm": 1.15, "logits": 1.6, "kv": 1.25, "attn": 0.6, "collect": 1.4,
    "rank": 2.5,
}


def true_coef(phase: str) -> np.ndarray:
    """[n_features] the truth restricted to the phase's features (quest_meta pages cost more)."""
    c = np.array([TRUE[f] if f in PHASE_FEATURES[phase] else 0.0 for f in FEATURES])
    if phase == "quest_meta":
        c[FEATURES.index("kv")] = 3.0
    return c


def true_ms(phase: str, batch: int, n_query: int, kv_read: float, rows: int,
            phys: _Physics | None = None) -> float:
    """Noise-free synthetic time of one call with uniform kv_read per request."""
    phys = phys or _Physics.of(MODEL, GPU.copy_bandwidth_gbs, GPU.bf16_tflops)
    x = phys.intercept_features(batch, n_query) + phys.slope_features(phase, n_query, rows) * (
        batch * kv_read)
    return float(x @ true_coef(phase))


def synthetic_latency(rng: np.random.Generator, noise: float = 0.01,
                      methods: tuple[str, ...] = METHODS,
                      contexts: tuple[int, ...] = (1024, 4096, 16384, 32768),
                      batches: tuple[int, ...] = (1, 4, 16, 64, 256)) -> pd.DataFrame:
    """Rows for every phase of every plan on a calibration-like grid, log-normal noise."""
    recs: dict[tuple[object, ...], dict[str, object]] = {}
    for method in methods:
        for gamma in ((1,) if method == "vanilla" else (2, 4, 7)):
            for sparsity in (0.05, 0.1):
                for batch in batches:
                    for ctx in contexts:
                        plan = iteration_plan(method, gamma, np.full(batch, ctx), sparsity,
                                              MODEL.max_positions)
                        for p in plan:
                            key = (p.phase, method, batch, ctx, p.n_query, int(p.kv_read[0]),
                                   p.collect_rows)
                            recs[key] = dict(zip(
                                ("phase", "method", "batch", "context", "n_query", "kv_read",
                                 "collect_rows"), key))
    df = pd.DataFrame(list(recs.values()))
    t = np.array([true_ms(r.phase, r.batch, r.n_query, r.kv_read, r.collect_rows)
                  for r in df.itertuples()])
    df["ms_median"] = t * np.exp(rng.normal(0.0, noise, len(t)))
    df["ms_p10"] = df["ms_median"] * 0.98
    df["ms_p90"] = df["ms_median"] * 1.02
    df["n"] = 20
    return df


@pytest.fixture(scope="module")
def fitted() -> LatencyModel:
    df = synthetic_latency(np.random.default_rng(0))
    return LatencyModel.fit(df, MODEL, GPU)


def test_fit_recovers_coefficients_exactly_without_noise() -> None:
    lm = LatencyModel.fit(synthetic_latency(np.random.default_rng(0), noise=0.0), MODEL, GPU)
    coef = lm.coefficients()
    full = 0
    for r in coef.itertuples():
        if r.fitted.split(",") != list(PHASE_FEATURES[r.phase]):
            continue  # a collinear group: checked through its predictions below
        full += 1
        got = np.array([getattr(r, f) for f in FEATURES])
        np.testing.assert_allclose(got, true_coef(r.phase), rtol=1e-6, atol=1e-9)
    assert full >= 15  # most groups are fully identifiable on this grid


def test_fit_recovers_coefficients_with_noise(fitted: LatencyModel) -> None:
    coef = fitted.coefficients().set_index(["phase", "method"])
    for phase, method in [("decode", "vanilla"), ("draft_step", "vegas"),
                          ("draft_step", "magicdec-stream"), ("sample", "vegas"),
                          ("quest_meta", "magicdec-quest")]:
        row = coef.loc[(phase, method)]
        for f in PHASE_FEATURES[phase]:
            want = true_coef(phase)[FEATURES.index(f)]
            if f == "const":  # a small share of every point: loosely determined by 1 % noise
                assert abs(row[f] - want) < 0.2, (phase, method, f)
            else:
                assert row[f] == pytest.approx(want, rel=0.06), (phase, method, f)
    # verify of vegas: n_query = γ+1 varies, collect_rows = 2 fixed (collect folded into kv)
    row = coef.loc[("verify", "vegas")]
    assert row["gemm"] == pytest.approx(TRUE["gemm"], rel=0.06)
    assert row["attn"] == pytest.approx(TRUE["attn"], rel=0.25)
    assert row["collect"] == 0.0
    # whatever the split, predictions of collinear groups match the truth
    for method in ("specextend", "vegas-all", "magicdec-quest"):
        kv = np.full(8, 20_000)
        assert fitted.phase_ms("verify", method, 5, kv, 5 if "quest" not in method else 0) == (
            pytest.approx(true_ms("verify", 8, 5, 20_000, 5 if "quest" not in method else 0),
                          rel=0.03))


def test_weight_bound_gemm_folds_the_overhead() -> None:
    """Batch ≤ 64 never leaves the weight-bound regime: const and gemm cannot be separated."""
    df = synthetic_latency(np.random.default_rng(11), noise=0.0, methods=("vanilla",),
                           batches=(1, 8, 64))
    lm = LatencyModel.fit(df, MODEL, GPU)
    row = lm.coefficients().set_index(["phase", "method"]).loc[("decode", "vanilla")]
    assert row["const"] == 0.0 and row["gemm"] > TRUE["gemm"]
    assert lm.phase_ms("decode", "vanilla", 1, np.full(8, 5000)) == pytest.approx(
        true_ms("decode", 8, 1, 5000, 0), rel=1e-6)


def test_fit_without_noise_is_exact_in_prediction() -> None:
    df = synthetic_latency(np.random.default_rng(1), noise=0.0)
    lm = LatencyModel.fit(df, MODEL, GPU)
    for r in df.sample(200, random_state=0).itertuples():
        pred = lm.phase_ms(r.phase, r.method, r.n_query, np.full(r.batch, r.kv_read),
                           r.collect_rows)
        assert pred == pytest.approx(r.ms_median, rel=1e-6)


def test_loo_errors_small_on_roofline_data(fitted: LatencyModel) -> None:
    loo = fitted.loo_errors()
    assert list(loo.columns) == ["phase", "n_points", "median_pct", "max_pct"]
    assert set(loo["phase"]) == {"decode", "draft_step", "verify", "select", "quest_meta",
                                 "sample"}
    # 1 % noise: LOO median must be near the noise level, far below the 3 % target
    assert (loo["median_pct"] < 2.0).all(), loo
    assert (loo["max_pct"] < 6.0).all(), loo
    by = fitted.loo_errors(by_method=True)
    assert "method" in by.columns and by["n_points"].sum() == loo["n_points"].sum()


def test_loo_detects_a_model_that_does_not_fit() -> None:
    df = synthetic_latency(np.random.default_rng(2), noise=0.0, methods=("vanilla",))
    # a quadratic-in-context effect the roofline cannot express → LOO errors visible
    df.loc[df["phase"] == "decode", "ms_median"] *= 1 + (df["context"] / 8192.0) ** 2
    loo = LatencyModel.fit(df, MODEL, GPU).loo_errors().set_index("phase")
    assert loo.loc["decode", "max_pct"] > 10.0


def test_extrapolation_is_linear_in_kv_bytes(fitted: LatencyModel) -> None:
    """Far outside the grid (32K max) doubling the context doubles the KV term."""
    b = 4
    def draft(ctx: int) -> float:
        return fitted.phase_ms("draft_step", "magicdec-stream", 1, np.full(b, ctx))
    t0, t1, t2 = draft(0), draft(256_000), draft(512_000)
    assert t2 - t1 == pytest.approx(t1 - t0, rel=1e-9)
    assert t2 > 1.5 * t1  # KV-dominated at this size: not flat
    truth = true_ms("draft_step", b, 1, 512_000, 0)
    assert t2 == pytest.approx(truth, rel=0.05)
    # whole iteration of vegas at 128K..256K, far above the grid: grows with verify KV bytes
    cost = fitted.iteration_cost("vegas", 6, 0.07)
    c1, c2 = cost(np.full(b, 131072)), cost(np.full(b, 262144))
    assert c2 > c1 * 1.3


def test_iteration_cost_equals_plan_sum(fitted: LatencyModel) -> None:
    rng = np.random.default_rng(3)
    for method in METHODS:
        for gamma in (1, 3, 7, 20):
            for sparsity in (0.001, 0.07, 0.5, 1.0):
                cost = fitted.iteration_cost(method, gamma, sparsity)
                for batch in (1, 5, 128):
                    # mix tiny (below min_tokens), page-boundary and huge contexts
                    ctx = rng.choice([1, 15, 16, 17, 255, 256, 300, 4096, 100_000, 131_071],
                                     batch) + rng.integers(0, 3, batch)
                    want = fitted.plan_ms(method, gamma, ctx, sparsity)
                    assert cost(ctx) == pytest.approx(want, rel=1e-9), (method, gamma, sparsity)
                    parts = cost.breakdown(ctx)
                    assert sum(parts.values()) == pytest.approx(want, rel=1e-9)
    parts = fitted.iteration_cost("magicdec-quest", 4, 0.1).breakdown(np.full(8, 4096))
    assert set(parts) == {"draft_step", "quest_meta", "verify", "sample"}
    assert all(v > 0 for v in parts.values())


def test_iteration_cost_min_tokens_respected(fitted: LatencyModel) -> None:
    ctx = np.full(16, 8192)
    lo = fitted.iteration_cost("vegas", 4, 0.01, min_tokens=64)
    hi = fitted.iteration_cost("vegas", 4, 0.01, min_tokens=2048)
    assert lo(ctx) == pytest.approx(fitted.plan_ms("vegas", 4, ctx, 0.01, min_tokens=64), rel=1e-9)
    assert hi(ctx) > lo(ctx)


def test_iteration_cost_is_fast(fitted: LatencyModel) -> None:
    cost = fitted.iteration_cost("vegas", 7, 0.07)
    ctx = np.random.default_rng(4).integers(1000, 100_000, 128)
    cost(ctx)  # fill the per-batch cache
    n = 2000
    t = time.perf_counter()
    for _ in range(n):
        cost(ctx)
    per_call_us = (time.perf_counter() - t) / n * 1e6
    # the target is ~10 µs; leave room for a loaded CI machine
    assert per_call_us < 60.0, per_call_us


def test_what_if_scales_memory_bound_terms_by_bandwidth_ratio(fitted: LatencyModel) -> None:
    target = get_gpu("h100-sxm")
    wi = fitted.what_if(target)
    assert wi.gpu_label == "h100-sxm (what-if, not measured)"
    assert fitted.gpu_label == "NVIDIA H200 (measured)"
    assert wi.is_what_if and not fitted.is_what_if
    ratio = get_gpu("h200").bandwidth_gbs / target.bandwidth_gbs  # > 1: slower memory
    c0 = fitted.coefficients().set_index(["phase", "method"]).loc[("draft_step", "vegas"), "const"]
    kv = np.full(2, 20_000)  # batch 2: weight-bound GEMM on both GPUs
    t_src = fitted.phase_ms("draft_step", "vegas", 1, kv)
    t_dst = wi.phase_ms("draft_step", "vegas", 1, kv)
    assert t_dst - c0 == pytest.approx((t_src - c0) * ratio, rel=1e-9)
    # compute-bound verify at large batch: H100-SXM and H200 have the same bf16 datasheet rate,
    # so the GEMM part is unchanged and only bandwidth terms grow
    assert wi.phase_ms("verify", "vegas", 8, np.full(512, 1000), 2) > fitted.phase_ms(
        "verify", "vegas", 8, np.full(512, 1000), 2)
    b200 = fitted.what_if(get_gpu("b200"))
    assert b200.iteration_cost("vegas", 6, 0.07)(np.full(8, 32768)) < fitted.iteration_cost(
        "vegas", 6, 0.07)(np.full(8, 32768))
    # a what-if of a what-if scales from the measured GPU, not from the first target
    again = wi.what_if(get_gpu("b200"))
    assert again.phase_ms("draft_step", "vegas", 1, kv) == pytest.approx(
        b200.phase_ms("draft_step", "vegas", 1, kv), rel=1e-12)


def test_what_if_from_unknown_measured_gpu_is_refused() -> None:
    df = synthetic_latency(np.random.default_rng(5), methods=("vanilla",))
    lm = LatencyModel.fit(df, MODEL, MeasuredGpu("Mystery GPU", 1000.0, 100.0, 10.0))
    with pytest.raises(TraceSetError, match="gpu.name"):
        lm.what_if(get_gpu("h200"))


def test_missing_phase_names_phase_method_and_fix() -> None:
    df = synthetic_latency(np.random.default_rng(6), methods=("vanilla", "vegas"))
    lm = LatencyModel.fit(df, MODEL, GPU)
    lm.iteration_cost("vegas", 4, 0.07)
    with pytest.raises(TraceSetError) as err:
        lm.iteration_cost("magicdec-quest", 4, 0.07)
    msg = str(err.value)
    assert "draft_step" in msg and "magicdec-quest" in msg and "calibrate" in msg
    assert lm.methods_covered() == ["vanilla", "vegas"]


def test_any_method_rows_and_pooled_sample_serve_other_methods() -> None:
    df = synthetic_latency(np.random.default_rng(7), methods=("vegas",))
    df.loc[df["phase"] == "draft_step", "method"] = "any"
    lm = LatencyModel.fit(df, MODEL, GPU)
    # specextend has no rows of its own: draft_step comes from "any", sample from the pool,
    # but its verify/select (γ+1 collected rows) were never measured
    with pytest.raises(TraceSetError, match="verify"):
        lm.iteration_cost("specextend", 4, 0.07)
    assert lm.phase_ms("draft_step", "specextend", 1, np.full(4, 500)) > 0
    assert lm.phase_ms("sample", "specextend", 5, np.full(4, 500)) > 0


@pytest.mark.parametrize("col,value,match", [
    ("ms_median", -1.0, "ms_median"),
    ("phase", "warmup", "phase"),
    ("batch", 0, "batch"),
])
def test_bad_rows_rejected_with_column(col: str, value: object, match: str) -> None:
    df = synthetic_latency(np.random.default_rng(8), methods=("vanilla",))
    df.loc[df.index[0], col] = value
    with pytest.raises(TraceSetError, match=match) as err:
        LatencyModel.fit(df, MODEL, GPU)
    assert "latency.parquet" in str(err.value) and err.value.fix


def test_missing_column_and_empty_rejected() -> None:
    df = synthetic_latency(np.random.default_rng(9), methods=("vanilla",))
    with pytest.raises(TraceSetError, match="kv_read"):
        LatencyModel.fit(df.drop(columns=["kv_read"]), MODEL, GPU)
    with pytest.raises(TraceSetError, match="no latency rows"):
        LatencyModel.fit(df.iloc[:0], MODEL, GPU)


def test_from_meta_reads_model_and_gpu() -> None:
    df = synthetic_latency(np.random.default_rng(10), methods=("vanilla",))
    meta = {"model": {**MODEL.to_dict(), "weights": {"kind": "random"}},
            "gpu": {"name": "NVIDIA H200", "sm_count": 132, "memory_gb": 141.0,
                    "copy_bandwidth_gbs": 4200.0, "bf16_tflops": 700.0}}
    lm = LatencyModel.from_meta(df, meta)
    assert lm.model == MODEL and lm.gpu == GPU
    with pytest.raises(TraceSetError, match="gpu"):
        LatencyModel.from_meta(df, {"model": meta["model"], "gpu": {"name": "x"}})


def test_fits_a_written_and_reloaded_synthetic_trace_set(tmp_path: object) -> None:
    """Round trip through the trace-set writer/reader (traces helper) into the model."""
    synthetic = pytest.importorskip("vegas_sim.traces.synthetic")
    from vegas_sim.traces.io import load_trace_set

    synthetic.make_synthetic_trace_set(tmp_path, methods=("vanilla", "vegas"), noise=0.01,
                                       acceptance=False)
    ts = load_trace_set(tmp_path)
    lm = LatencyModel.from_meta(ts.latency, ts.meta)
    loo = lm.loo_errors()
    assert (loo["median_pct"] < 3.0).all(), loo  # DESIGN.md target on roofline-shaped data
    ctx = np.array([1000, 5000, 20000])
    assert lm.iteration_cost("vegas", 4, 0.07)(ctx) == pytest.approx(
        lm.plan_ms("vegas", 4, ctx, 0.07), rel=1e-9)
