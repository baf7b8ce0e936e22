"""The sharded runtime (calibrate/tensor_parallel.py) on the CPU over gloo: at TP 2 and 4 (KV
heads replicated) every method's greedy tokens are exactly the whole model's vanilla tokens,
and the logits of one forward match the whole model's."""

from __future__ import annotations

import socket
from functools import partial

import pytest
import torch

from vegas_sim.calibrate.specdec import SpecConfig, SpecDecoder
from vegas_sim.calibrate.tensor_parallel import ShardedTransformer, run_group, shard_weights
from vegas_sim.methods import METHODS

from .conftest import tiny_model

MAX_NEW = 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prompts() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(0, 101, (n,), generator=gen) for n in (40, 57, 33)]


def _check_rank(rank: int, arch: str) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    whole = tiny_model(arch)
    weights = {n: p.detach().clone() for n, p in whole.named_parameters()}
    shard = ShardedTransformer(whole.spec, weights)
    prompts = _prompts()
    # one forward: the gathered logits are the whole model's
    tokens = torch.stack([p[:30] for p in prompts])
    ref = whole(tokens, whole.new_cache(3, 64))
    got = shard(tokens, shard.new_cache(3, 64))
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    vanilla = SpecDecoder(whole, SpecConfig("vanilla", 1)).generate(prompts, MAX_NEW).tokens
    for method in METHODS:
        cfg = SpecConfig(method, 4, sparsity=0.1, min_tokens=8)
        out = SpecDecoder(shard, cfg).generate(prompts, MAX_NEW).tokens
        assert out == vanilla, f"{method} at TP {shard.tp} (rank {rank}) differs from vanilla"
    assert shard.collectives.calls["all_gather"] > 0


@pytest.mark.slow
@pytest.mark.parametrize(("tp", "arch"), [(2, "qwen2"), (4, "llama")])  # biases; KV replicated
def test_every_method_is_lossless_under_greedy_when_sharded(tp: int, arch: str) -> None:
    run_group(tp, partial(_check_rank, arch=arch), port=_free_port())


def test_shards_partition_the_projections() -> None:
    whole = tiny_model("qwen2")
    weights = {n: p.detach() for n, p in whole.named_parameters()}
    parts = [shard_weights(whole.spec, weights, r, 2) for r in range(2)]
    # the MLP's down projection and the attention output are split by columns
    w2 = torch.cat([p["layers.0.w2"] for p in parts], dim=1)
    torch.testing.assert_close(w2, weights["layers.0.w2"])
    wo = torch.cat([p["layers.0.wo"] for p in parts], dim=1)
    torch.testing.assert_close(wo, weights["layers.0.wo"])
    # the vocabulary is split by rows, the last slice zero-padded (101 = 51 + 50)
    embed = torch.cat([p["embed"] for p in parts])
    torch.testing.assert_close(embed[:101], weights["embed"])
    assert embed.shape[0] == 102 and not embed[101].any()
