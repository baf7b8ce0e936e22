"""The roofline line: each phase's bytes and FLOPs from the latency model's constants, what
binds, the iteration's bound against the prediction, and where verify turns compute-bound."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.sim.test_latency import GPU, MODEL, synthetic_latency
from vegas_sim.methods import QUEST_PAGE, budget
from vegas_sim.sim.latency import LatencyModel
from vegas_sim.sim.roofline import iteration_roofline, roofline_columns, verify_compute_batch


@pytest.fixture(scope="module")
def latency() -> LatencyModel:
    return LatencyModel.fit(synthetic_latency(np.random.default_rng(0)), MODEL, GPU)


def bytes_per_token() -> float:
    """KV bytes of one token over all layers (K and V, bf16) of the model, by hand."""
    return 2.0 * MODEL.n_layers * MODEL.n_kv_heads * MODEL.head_dim * MODEL.dtype_bytes


def test_decode_bound_is_weights_plus_kv_at_copy_bandwidth(latency: LatencyModel) -> None:
    C, B = 32768, 4
    roof = iteration_roofline(latency, latency.iteration_cost("vanilla", 1, 1.0),
                              np.full(B, C, np.int64))
    decode = {p.phase: p for p in roof.phases}["decode"]
    want_gb = (MODEL.weight_bytes(1) + B * (C + 1) * bytes_per_token()) / 1e9
    assert decode.gbytes == pytest.approx(want_gb, rel=1e-9)
    assert decode.bytes_ms == pytest.approx(want_gb / GPU.copy_bandwidth_gbs * 1e3, rel=1e-9)
    assert decode.binds == "memory" and decode.bound_ms == decode.bytes_ms
    assert roof.bound_ms == pytest.approx(sum(p.bound_ms for p in roof.phases))
    assert roof.share == pytest.approx(roof.bound_ms / roof.predicted_ms)


def test_quest_pays_its_page_metadata(latency: LatencyModel) -> None:
    """Quest's iteration bound exceeds Stream's by the metadata its γ draft steps score:
    min and max keys (2 × K of one token) per 16-token page."""
    C, B, g, s = 65536, 4, 7, 0.07
    ctx = np.full(B, C, np.int64)
    quest = iteration_roofline(latency, latency.iteration_cost("magicdec-quest", g, s), ctx)
    meta = {p.phase: p for p in quest.phases}["quest_meta"]
    pages = sum(B * ((C + k) // QUEST_PAGE + 1) for k in range(1, g + 1))
    assert meta.gbytes == pytest.approx(pages * bytes_per_token() / 1e9, rel=1e-9)
    assert meta.tflop == 0.0 and meta.binds == "memory"


def test_verify_turns_compute_bound_where_flops_overtake_bytes(latency: LatencyModel) -> None:
    """The crossing batch, checked against the two sides of the inequality by hand: FLOPs
    B·(γ+1)·(2·params + 4·L·Hq·D·kv) against weights + B·kv·(KV + score bytes)."""
    g, C = 7, 1024
    turn = verify_compute_batch(latency, "vegas", g, C)
    assert turn is not None and turn > 1
    kv = C + g + 1

    def sides(b: int) -> tuple[float, float]:
        flops = b * (g + 1) * (MODEL.gemm_flops(1) + 4.0 * MODEL.n_layers * MODEL.n_heads
                               * MODEL.head_dim * kv)
        nbytes = MODEL.weight_bytes(1) + b * kv * (bytes_per_token() + 2 * MODEL.n_heads
                                                   * MODEL.n_layers * 2)
        return flops / (GPU.bf16_tflops * 1e12), nbytes / (GPU.copy_bandwidth_gbs * 1e9)

    f, m = sides(turn)
    assert f > m
    f, m = sides(turn - 1)
    assert f <= m
    # more rows per request reach the crossing at a smaller batch; a long context never does
    turn_g15 = verify_compute_batch(latency, "vegas", 15, C)
    assert turn_g15 is not None and turn_g15 < turn
    assert verify_compute_batch(latency, "vegas", g, 131072) is None


def test_roofline_columns_of_a_row(latency: LatencyModel) -> None:
    cost = latency.iteration_cost("vegas", 7, 0.07)
    cols = roofline_columns(latency, cost, 4, 8192)
    assert 0 < float(cols["roofline_pct"]) < 200
    assert str(cols["roofline_binds"]).split(",")[0] == "draft_step:memory"
    assert cols["roofline_bandwidth_gbs"] == GPU.copy_bandwidth_gbs
    # at 8K the KV bytes a request adds outweigh its FLOPs (NaN: memory-bound at any batch)
    assert math.isnan(float(cols["verify_compute_batch"]))
    assert math.isfinite(float(roofline_columns(latency, cost, 4, 1024)["verify_compute_batch"]))
    # the draft's selected keys, not the whole context, are what its steps read
    sel = float(budget(0.07, 8192 + 1, MODEL.max_positions, cost.min_tokens))
    draft_gb = 7 * (MODEL.weight_bytes(1) / 1e9) + 4 * (7 * sel + 28) * bytes_per_token() / 1e9
    roof = iteration_roofline(latency, cost, np.full(4, 8192, np.int64))
    assert {p.phase: p for p in roof.phases}["draft_step"].gbytes == pytest.approx(draft_gb,
                                                                                   rel=1e-6)
