"""Latency model of mixture-of-experts and hybrid-attention shapes: the weight stream grows
with the experts a batch touches, window layers read their window, the fast iteration
evaluator agrees with the per-phase plan, and the weight-format what-ifs."""

from __future__ import annotations

import numpy as np
import pytest

from vegas_sim.errors import UserInputError
from vegas_sim.models import PRESETS
from vegas_sim.sim.latency import LatencyModel, MeasuredGpu
from vegas_sim.sim.latency_features import Physics as _Physics
from vegas_sim.traces.synthetic import _latency_rows

GPU = {"name": "NVIDIA H200", "copy_bandwidth_gbs": 4000.0, "bf16_tflops": 700.0,
       "memory_gb": 141.0}


def _fit(name: str) -> LatencyModel:
    import pandas as pd

    spec = PRESETS[name]
    rng = np.random.default_rng(0)
    frames = [_latency_rows(spec, GPU, m, (2, 4), (0.05, 0.1), (4096, 16384), (1, 4, 16),
                            0.01, rng) for m in ("vanilla", "vegas", "magicdec-quest")]
    return LatencyModel.fit(pd.concat(frames, ignore_index=True), spec,
                            MeasuredGpu.from_meta(GPU))


def test_moe_weight_stream_grows_with_the_experts_touched() -> None:
    q3 = PRESETS["qwen3-30b-a3b"]
    phys = _Physics.of(q3, 4000.0, 700.0)
    ms_per_byte = 1e3 / 4e12
    for tokens in (1, 4, 64, 4096):
        assert phys.weight_ms_at(tokens) == pytest.approx(q3.weight_bytes(tokens) * ms_per_byte)
    assert phys.weight_ms_at(64) > 5 * phys.weight_ms_at(1)
    dense = _Physics.of(PRESETS["qwen3-8b"], 4000.0, 700.0)
    assert dense.weight_ms_at(64) == dense.weight_ms_at(1) == dense.weight_ms
    assert not dense.window_features("decode", 1).any()


def test_hybrid_window_layers_read_their_window_in_draft_and_verify() -> None:
    lat = _fit("gpt-oss-20b")
    spec = lat.model
    c = np.array([4096, 16384, 9000])
    cost = lat.iteration_cost("vegas", 4, 0.05)
    assert cost(c) == pytest.approx(lat.plan_ms("vegas", 4, c, 0.05), rel=1e-9)
    van = lat.iteration_cost("vanilla", 1, 1.0)
    assert van(c) == pytest.approx(lat.plan_ms("vanilla", 1, c, 1.0), rel=1e-9)
    # a decode row's kv feature: full layers at C + 1, window layers at min(W, C + 1) only
    phys = lat.physics
    batch, nq = np.array([2.0, 2.0]), np.array([1.0, 1.0])
    ctx = np.array([4096, 16384])
    x = phys.features("decode", batch, nq, 2.0 * (ctx + 1), np.zeros(2),
                      window_sum=2.0 * np.minimum(spec.sliding_window, ctx + 1))
    full = spec.full_kv_bytes_per_token() * 1e3 / 4e12
    window = spec.window_kv_bytes_per_token() * 1e3 / 4e12
    np.testing.assert_allclose(x[:, 3], 2.0 * (ctx + 1) * full + 2.0 * 128 * window)
    assert phys.kv_ms_per_token == pytest.approx(full)


def test_weight_format_what_ifs_are_labelled_and_cheaper() -> None:
    lat = _fit("gpt-oss-20b")
    c = np.full(4, 16384)
    base = lat.iteration_cost("vanilla", 1, 1.0)(c)
    mx = lat.with_weight_format("mxfp4")
    assert mx.iteration_cost("vanilla", 1, 1.0)(c) < base
    assert "mxfp4 weights (what-if" in mx.gpu_label and mx.is_what_if
    assert lat.with_weight_format("bf16").iteration_cost("vanilla", 1, 1.0)(c) == base
    with pytest.raises(UserInputError, match="weight format"):
        lat.with_weight_format("int3")


# ---- the packaged H200 sets of the MoE shapes ---------------------------------------------
@pytest.mark.parametrize("model", ["gpt-oss-20b", "qwen3-30b-a3b"])
def test_packaged_moe_set_predicts_and_prints_the_draft_step_share(model: str) -> None:
    """`predict --model M` finds the packaged H200 set, names the proxy acceptance, and each
    drafting row carries one draft step's time over a vanilla decode step's at its midpoint
    (where the analytic engine prices its phases too: its phase columns give the same)."""
    import vegas_sim

    table = vegas_sim.predict(model=model, methods=["vegas", "magicdec-stream"],
                              engine="analytic", context="16K")
    notes = " ".join(table.attrs["notes"])
    assert f"latency: {model}-h200 (random weights, NVIDIA H200 measured)" in notes
    assert "used as a proxy for" in notes
    van, *spec_rows = table.to_dict("records")
    assert np.isnan(van["draft_step_vs_decode"])
    for r in spec_rows:
        expected = r["ms_draft_step"] / r["gamma"] / van["ms_decode"]
        assert r["draft_step_vs_decode"] == pytest.approx(expected, rel=1e-4)
        assert 0.3 < r["draft_step_vs_decode"] < 1.3


# ---- KV-cache capacity of hybrid and quantised models ---------------------------------------
def test_resident_weights_follow_the_weight_format() -> None:
    for spec in PRESETS.values():  # bf16: every parameter at the model's dtype, as before
        assert spec.resident_weight_bytes() == pytest.approx(spec.param_count() * spec.dtype_bytes)
    oss = PRESETS["gpt-oss-20b"]
    # MXFP4 experts, the rest bf16: the released gpt-oss-20b checkpoint is ~13.8 GB
    assert oss.resident_weight_bytes("mxfp4") == pytest.approx(13.8e9, rel=0.02)
    saved = oss.n_experts * (oss.expert_bytes() - oss.expert_bytes("mxfp4"))
    assert oss.resident_weight_bytes() - oss.resident_weight_bytes("mxfp4") == pytest.approx(saved)


def test_window_layers_hold_only_their_window_in_the_kv_cache() -> None:
    from vegas_sim.sim.scenario import kv_capacity

    oss, q8 = PRESETS["gpt-oss-20b"], PRESETS["qwen3-8b"]
    assert q8.window_cache_bytes(8, 16) == 0
    # W 128: 127 + 8 keys in 9 blocks of 16, plus the block the window straddles
    assert oss.window_cache_bytes(8, 16) == 10 * 16 * oss.window_kv_bytes_per_token()
    free = 0.9 * 94e9 - oss.resident_weight_bytes("mxfp4")
    alone = kv_capacity(oss, 94.0, 0.9, weight_format="mxfp4")
    assert alone == int(free // oss.full_kv_bytes_per_token())  # a token costs its 12 full layers
    assert alone > 1.9 * int(free // oss.kv_bytes_per_token())
    running = kv_capacity(oss, 94.0, 0.9, weight_format="mxfp4", running=128, new_tokens=8)
    reserved = 128 * oss.window_cache_bytes(8, 16) / oss.full_kv_bytes_per_token()
    assert alone - running == pytest.approx(reserved, abs=1)
    assert kv_capacity(oss, 94.0, 0.9) < alone  # bf16 experts leave less room


def test_the_latency_models_weight_format_sizes_the_kv_cache() -> None:
    from vegas_sim.sim.predict import Scenario, scenario_kv_capacity

    lat = _fit("gpt-oss-20b")
    sc = Scenario("vegas", 7, 0.07, batch=128, context=200, output_len=2000)
    bf16, mx = scenario_kv_capacity(sc, lat), scenario_kv_capacity(
        sc, lat.with_weight_format("mxfp4"))
    assert bf16 is not None and mx is not None
    spec = PRESETS["gpt-oss-20b"]
    gained = (spec.resident_weight_bytes() - spec.resident_weight_bytes("mxfp4"))
    assert mx - bf16 == pytest.approx(gained / spec.full_kv_bytes_per_token(), abs=1)


def test_the_papers_aime_setting_runs_every_sequence_and_halves_the_draft_step() -> None:
    """gpt-oss-20b at the Vegas paper's AIME25 setting (H100 NVL, 128 sequences, ~10K tokens
    each on average): the cache holds them all once window layers and MXFP4 experts are sized
    as vLLM sizes them, and a draft step is about half a decode step (the paper's 48 %)."""
    import vegas_sim

    shares = {}
    for fmt in ("bf16", "mxfp4"):
        table = vegas_sim.predict(model="gpt-oss-20b", methods=["magicdec-stream"],
                                  engine="analytic", gpu="h100-nvl", batch=128, context=200,
                                  output_len=20000, workload="reasoning", temperature=1.0,
                                  weight_format=fmt)
        assert (table["mean_running_batch"] == 128).all()
        shares[fmt] = float(table["draft_step_vs_decode"].iloc[1])
    assert 0.40 < shares["mxfp4"] < 0.56 < shares["bf16"] < 0.8


def test_prefill_roofline_reads_every_expert_and_windows_its_window_layers() -> None:
    import dataclasses

    from vegas_sim.sim.predict import roofline_prefill_ms

    oss = PRESETS["gpt-oss-20b"]
    bw, tflops = 4000.0, 800.0
    # a 4K prompt touches all 32 experts of every layer: at least the whole expert set's bytes
    assert roofline_prefill_ms(oss, bw, tflops, 4096) >= 1e3 * oss.weight_bytes(1e6) / (bw * 1e9)
    dense_attention = dataclasses.replace(oss, window_layers=(), sliding_window=0)
    long = 65536  # the window layers' W 128 keys cost ~nothing beside L/2: half the attention
    saved = (roofline_prefill_ms(dense_attention, bw, tflops, long)
             - roofline_prefill_ms(oss, bw, tflops, long))
    attention_ms = 1e3 * oss.attn_flops(long, long / 2) / (tflops * 1e12)
    assert saved == pytest.approx(attention_ms / 2, rel=0.01)
