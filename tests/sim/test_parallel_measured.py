"""A latency set calibrated at `--tp N` (meta.json tensor_parallel): fitted on the shard's
features, it predicts at N as measured (no modelled collective added, no what-if label) and
refuses any other size."""

from __future__ import annotations

import pytest

from vegas_sim.errors import UserInputError
from vegas_sim.sim.latency import LatencyModel
from vegas_sim.sim.parallel import TensorParallel, shard_physics
from vegas_sim.traces.reader import load_trace_set

TP2 = {"size": 2, "backend": "nccl", "interconnect": "NVLink (18 active links on GPU 0)"}


@pytest.fixture(scope="module")
def packaged() -> tuple[object, dict[str, object]]:
    ts = load_trace_set("qwen3-8b-h200")
    rows = ts.latency[(ts.latency["batch"] <= 8) & (ts.latency["context"] <= 8192)]
    return rows, ts.meta


def test_a_set_measured_at_tp2_predicts_at_tp2_as_measured(packaged: tuple) -> None:
    rows, meta = packaged
    one = LatencyModel.from_meta(rows, meta)
    two = LatencyModel.from_meta(rows, {**meta, "tensor_parallel": TP2})
    group = two.tensor_parallel
    assert group.measured and group.size == 2 and not group.what_if
    assert not two.is_what_if and "measured, NVLink" in two.gpu_label
    assert "what-if" not in two.gpu_label and "measured on one rank" in group.label
    # its times hold the collectives: none is modelled on top
    assert two.comm_ms("verify", 32) == (0.0, 0.0) and two.comm_ms("select", 4) == (0.0, 0.0)
    # the features are one GPU's shard, KV capacity per GPU
    gpu = one.measured_gpu
    assert two.physics == shard_physics(one.model, 2, gpu.copy_bandwidth_gbs, gpu.bf16_tflops,
                                        "bf16")
    assert two.gpu_model.n_heads == one.model.n_heads // 2


@pytest.mark.parametrize("size", [1, 4])
def test_a_set_measured_at_tp2_refuses_another_size(packaged: tuple, size: int) -> None:
    rows, meta = packaged
    two = LatencyModel.from_meta(rows, {**meta, "tensor_parallel": TP2})
    with pytest.raises(UserInputError, match="measured at tensor-parallel size 2") as err:
        two.with_tensor_parallel(TensorParallel(size, 450.0, 5.0))
    assert "--tp 2" in (err.value.fix or "")


def test_a_set_without_the_key_is_one_gpu(packaged: tuple) -> None:
    rows, meta = packaged
    one = LatencyModel.from_meta(rows, meta)
    assert one.tensor_parallel.size == 1 and not one.tensor_parallel.measured
    what_if = one.with_tensor_parallel(TensorParallel(2, 450.0, 5.0))
    assert what_if.is_what_if and what_if.comm_ms("verify", 32)[0] > 0
