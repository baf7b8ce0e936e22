"""Grouped expert GEMM (kernels/moe_gemm.py) against the torch reference, and the routing
it reads. CPU: small shapes under TRITON_INTERPRET=1. GPU (`-m gpu`): the real shapes of
gpt-oss-20b and Qwen3-30B-A3B."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.conftest import HAS_CUDA
from vegas_sim.errors import UserInputError
from vegas_sim.kernels import moe, ops


def routed(gen: torch.Generator, T: int, E: int, k: int, skew: bool = False) -> torch.Tensor:
    """[T, k] distinct experts per token; skew piles the tokens onto the first experts."""
    scores = torch.rand(T, E, generator=gen)
    if skew:
        scores[:, : max(1, E // 4)] += 1.0
    return scores.topk(k, dim=-1).indices


def triton_routing(experts: torch.Tensor, n_experts: int, block_m: int) -> moe.MoeRouting:
    from tests.kernels.conftest import triton_available
    if not triton_available():
        pytest.skip("triton not installed")
    from vegas_sim.kernels import moe_gemm
    return moe_gemm.moe_routing(experts, n_experts, block_m)


@pytest.mark.parametrize("T,E,k,bm", [(1, 8, 2, 16), (37, 8, 2, 16), (5, 32, 4, 16),
                                      (64, 4, 1, 32), (0, 4, 2, 16), (300, 128, 8, 64)])
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_routing_puts_every_pair_once_in_blocks_of_one_expert(T: int, E: int, k: int,
                                                              bm: int, impl: str) -> None:
    gen = torch.Generator().manual_seed(T * 31 + E)
    experts = routed(gen, T, E, k)
    build = moe.moe_routing if impl == "torch" else triton_routing
    r = build(experts, E, bm)
    rows = r.pair_rows.view(r.n_blocks, bm)
    real = r.pair_rows[r.pair_rows >= 0]
    assert sorted(real.tolist()) == list(range(T * k))  # every pair exactly once
    flat = experts.reshape(-1)
    for b in range(r.n_blocks):
        pairs = rows[b][rows[b] >= 0]
        if r.block_expert[b] < 0:
            assert pairs.numel() == 0
        else:
            assert (flat[pairs.long()] == r.block_expert[b]).all()  # one expert per block
    # each expert's pairs fill whole blocks from the start of its first one: no gaps
    used = (r.block_expert >= 0).sum()
    assert int(used) == sum(-(-int((flat == e).sum()) // bm) for e in range(E))


def cases() -> list[tuple[int, int, int, int, int, bool, bool, str | None, bool]]:
    # T, E, k, N, K, gather, bias, activation, row_scale
    return [(3, 4, 2, 24, 40, True, False, None, False),
            (19, 8, 2, 16, 33, True, True, None, True),
            (6, 8, 3, 40, 24, False, True, None, False),
            (40, 4, 2, 32, 72, False, False, None, True),
            (7, 8, 2, 48, 40, True, True, "gpt_oss", False),
            (5, 4, 2, 24, 16, True, False, "silu", False)]


@pytest.mark.parametrize("T,E,k,N,K,gather,bias,activation,scale", cases())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_equals_reference(use_triton: None, device: str, T: int, E: int, k: int, N: int,
                                 K: int, gather: bool, bias: bool, activation: str | None,
                                 scale: bool, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(N * K + T)
    experts = routed(gen, T, E, k, skew=True).to(device)
    x = torch.randn(T if gather else T * k, K, generator=gen).to(device, dtype)
    w = torch.randn(E, N, K, generator=gen).to(device, dtype)
    b = torch.randn(E, N, generator=gen).to(device, dtype) if bias else None
    row_scale = torch.rand(T * k, generator=gen).to(device) if scale else None
    r = ops.moe_routing(experts, E)
    got = ops.moe_gemm(x, w, b, r, gather, activation, row_scale)
    want = moe.moe_gemm_reference(x.float(), w.float(), None if b is None else b.float(), r,
                                  gather, activation, row_scale)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    n_out = N // 2 if activation else N
    assert got.shape == (T * k, n_out) and got.dtype == dtype
    err = (got.float() - want).norm() / want.norm()
    assert float(err) < tol


def test_reference_multiplies_each_pair_by_its_own_expert() -> None:
    gen = torch.Generator().manual_seed(3)
    experts = routed(gen, 4, 5, 2)
    x = torch.randn(4, 6, generator=gen)
    w = torch.randn(5, 7, 6, generator=gen)
    got = moe.moe_gemm_reference(x, w, None, moe.moe_routing(experts, 5), gather=True)
    for p, e in enumerate(experts.reshape(-1).tolist()):
        torch.testing.assert_close(got[p], w[e] @ x[p // 2])


def test_moe_gemm_refuses_weights_of_another_expert_count() -> None:
    experts = torch.zeros(2, 1, dtype=torch.int64)
    with pytest.raises(UserInputError, match="moe_gemm"):
        ops.moe_gemm(torch.zeros(2, 4), torch.zeros(3, 5, 4), None, ops.moe_routing(experts, 4),
                     gather=True)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("E,k,H,F", [(32, 4, 2880, 2880), (128, 8, 2048, 768)])
@pytest.mark.parametrize("T", [1, 7, 128, 1024])
def test_real_shapes_on_the_gpu(E: int, k: int, H: int, F: int, T: int) -> None:
    gen = torch.Generator().manual_seed(T)
    experts = routed(gen, T, E, k).cuda()
    x = (torch.randn(T, H, generator=gen)).to("cuda", torch.bfloat16)
    w = (torch.randn(E, 2 * F, H, generator=gen) * 0.02).to("cuda", torch.bfloat16)
    b = (torch.randn(E, 2 * F, generator=gen) * 0.02).to("cuda", torch.bfloat16)
    r = ops.moe_routing(experts, E)
    got = ops.moe_gemm(x, w, b, r, gather=True)
    want = moe.moe_gemm_reference(x, w, b, r, gather=True)
    assert float((got.float() - want.float()).norm() / want.float().norm()) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("T", [1, 64])
def test_the_ffn_replays_from_a_cuda_graph_as_it_runs_eagerly(T: int) -> None:
    from vegas_sim.calibrate import moe as runtime_moe  # the runtime's FFN on these kernels

    gen = torch.Generator().manual_seed(T)
    E, k, H, F = 32, 4, 2880, 2880

    def rnd(*shape: int, std: float = 0.02) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).to("cuda", torch.bfloat16)
    args = (rnd(E, H), rnd(E), rnd(E, 2 * F, H), rnd(E, 2 * F), rnd(E, H, F), rnd(E, H))
    h = rnd(T, H, std=1.0)
    eager = runtime_moe.moe_ffn(h, *args, k=k, activation="gpt_oss")
    # the same bf16 inputs: an fp32 router would break near-ties the other way
    want = runtime_moe.moe_ffn_reference(h, *args, k=k, activation="gpt_oss").float()
    assert float((eager.float() - want).norm() / want.norm()) < 2e-2
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        runtime_moe.moe_ffn(h, *args, k=k, activation="gpt_oss")  # warm up off the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = runtime_moe.moe_ffn(h, *args, k=k, activation="gpt_oss")
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(replayed, eager)
