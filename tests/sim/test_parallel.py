"""Tensor parallelism as a what-if (sim/parallel.py): the shard's bytes add up, TP 1 is the
measured model, collectives are priced only where a forward runs, capacity is per GPU."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vegas_sim import api
from vegas_sim.errors import UserInputError
from vegas_sim.gpus import get_gpu
from vegas_sim.models import PRESETS, get_preset
from vegas_sim.sim.parallel import TensorParallel
from vegas_sim.sim.scenario import kv_capacity

# presets and the tensor-parallel sizes vLLM accepts for them
SPLITTABLE = [(name, tp) for name, m in PRESETS.items() for tp in (1, 2, 3, 4, 8, 16)
              if m.n_heads % tp == 0 and m.ffn % tp == 0 and (m.expert_ffn % tp == 0)
              and (m.n_kv_heads % tp == 0 or tp % m.n_kv_heads == 0)]


@pytest.fixture(scope="module")
def qwen() -> api.LatencyModel:
    return api.load_models("qwen3-8b")[0]


@pytest.mark.parametrize(("name", "tp"), SPLITTABLE)
def test_shards_add_up_to_the_model(name: str, tp: int) -> None:
    model = get_preset(name)
    shard = model.tensor_shard(tp)
    # every projection and table is split; the router is whole on every GPU, and past the
    # model's KV heads each GPU holds one KV head's k and v projections
    replicated = model.n_layers * model.router_params() * model.dtype_bytes
    extra_kv_heads = tp * shard.n_kv_heads - model.n_kv_heads
    kv_copies = (extra_kv_heads * 2 * model.hidden * model.head_dim * model.n_layers
                 * model.dtype_bytes)
    whole = model.resident_weight_bytes() - replicated + kv_copies
    assert tp * (shard.resident_weight_bytes() - replicated) == pytest.approx(whole, rel=1e-3)
    # KV heads split, or replicated one per GPU past the model's KV heads
    kv_gpus = tp * shard.kv_bytes_per_token()
    assert kv_gpus == model.kv_bytes_per_token() * max(1, tp // model.n_kv_heads)
    assert shard.n_heads * tp == model.n_heads and shard.max_positions == model.max_positions


@settings(max_examples=25, deadline=None)
@given(tp=st.integers(min_value=-4, max_value=64))
def test_a_size_the_heads_cannot_be_split_by_is_refused(tp: int) -> None:
    model = get_preset("qwen3-8b")  # 32 query heads, 8 KV heads, MLP 12288
    ok = tp >= 1 and 32 % tp == 0 and 12288 % tp == 0 and (8 % tp == 0 or tp % 8 == 0)
    if ok:
        assert model.tensor_shard(tp).n_heads == 32 // tp
    else:
        with pytest.raises(UserInputError, match="--tp|split"):
            model.tensor_shard(tp)


def test_tp_one_is_the_measured_model(qwen: api.LatencyModel) -> None:
    one = qwen.with_tensor_parallel(TensorParallel.of(qwen.model, 1, None))
    c = np.array([4096, 30000, 120000, 70000], dtype=np.int64)
    for method in ("vanilla", "vegas", "magicdec-quest", "magicdec-stream"):
        assert one.iteration_cost(method, 5, 0.05)(c) == qwen.iteration_cost(method, 5, 0.05)(c)
    assert not one.is_what_if and one.gpu_model == qwen.model


def test_collectives_are_priced_where_a_forward_runs(qwen: api.LatencyModel) -> None:
    tp = TensorParallel.of(qwen.model, 4, get_gpu("h200"))
    comm = {phase: tp.phase_comm(phase, qwen.model, 8) for phase in
            ("decode", "verify", "draft_step", "prefill", "sample", "quest_meta", "select")}
    assert all(comm[p][0] > 0 and comm[p][1] == 0 for p in ("decode", "verify", "draft_step"))
    assert comm["sample"] == comm["quest_meta"] == (0.0, 0.0)
    assert comm["select"][1] > 0  # the rank weights are summed over the GPUs' heads
    # more rows move more bytes; a faster link moves them sooner
    assert tp.forward_comm_ms(qwen.model, 64) > tp.forward_comm_ms(qwen.model, 8)
    fast = dataclasses.replace(tp, link_gbs=2 * tp.link_gbs)
    assert fast.forward_comm_ms(qwen.model, 64) < tp.forward_comm_ms(qwen.model, 64)


@pytest.mark.parametrize("method", ["vanilla", "vegas", "magicdec-quest", "magicdec-stream"])
def test_fast_iteration_cost_agrees_with_the_phase_sum(qwen: api.LatencyModel,
                                                      method: str) -> None:
    tp8 = qwen.with_tensor_parallel(TensorParallel.of(qwen.model, 8, get_gpu("h200")))
    c = np.array([4100, 32800, 65600, 120001, 9000], dtype=np.int64)
    fast = tp8.iteration_cost(method, 3, 0.02)(c)
    assert fast == pytest.approx(tp8.plan_ms(method, 3, c, 0.02), rel=1e-9)
    # a decode over 8 GPUs is faster than on one, but not 8 times: the host and the
    # collectives do not split
    one = qwen.iteration_cost(method, 3, 0.02)(c)
    assert one / 8 < fast < one


def test_capacity_is_per_gpu() -> None:
    model = get_preset("qwen3-8b")
    one, four = (kv_capacity(model.tensor_shard(tp), 141.0, 0.9) for tp in (1, 4))
    assert four > 4 * one  # the weights split too, leaving more room than 4 × one GPU's


def test_an_unknown_link_is_refused() -> None:
    model = get_preset("qwen3-8b")
    spec = dataclasses.replace(get_gpu("h200"), link_gbs=0.0)
    with pytest.raises(UserInputError, match="link"):
        TensorParallel.of(model, 2, spec)


def test_load_models_labels_every_what_if() -> None:
    latency, _, notes = api.load_models("qwen3-8b", gpu="h100-sxm", tensor_parallel=8,
                                        model_what_if="llama-3.1-8b")
    assert latency.model.name == "llama-3.1-8b" and latency.tensor_parallel.size == 8
    assert latency.is_what_if and "NOT measured" in " ".join(notes)
    assert "tensor parallel" in latency.gpu_label and "llama-3.1-8b" in latency.gpu_label


def test_a_model_of_another_kind_is_not_priced_from_a_dense_set(qwen: api.LatencyModel) -> None:
    with pytest.raises(UserInputError, match="kind"):
        qwen.for_model(get_preset("qwen3-30b-a3b"))
