"""Verify and sparse draft attention: Triton vs the torch reference.

Tolerances: ‖out − ref‖/‖ref‖ < 1e-4 in fp32, < 1e-2 in bf16 (both round the output to bf16);
lse within 1e-4 (fp32 math in both); collected scores within one bf16 ulp (the fp32 dot may
accumulate in another order before the bf16 rounding) and -inf exactly where masked.
CPU: small shapes under TRITON_INTERPRET=1. GPU (`-m gpu`): real shapes.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import pytest
import torch

from tests.kernels.conftest import HAS_CUDA
from vegas_sim.errors import UserInputError
from vegas_sim.kernels import ops, reference

DTYPES = [torch.float32, torch.bfloat16]
OUT_TOL = {torch.float32: 1e-4, torch.bfloat16: 1e-2}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def make_kv(
    gen: torch.Generator, B: int, S: int, Hkv: int, D: int, dtype: torch.dtype, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.randn(B, S, Hkv, D, generator=gen).to(device=device, dtype=dtype)
    v = torch.randn(B, S, Hkv, D, generator=gen).to(device=device, dtype=dtype)
    return k, v


def check_scores(got: torch.Tensor | None, ref: torch.Tensor | None) -> None:
    if ref is None:
        assert got is None
        return
    assert got is not None and got.shape == ref.shape and got.dtype == torch.bfloat16
    g, r = got.float(), ref.float()
    assert not torch.isnan(g).any(), "unwritten score elements"
    assert torch.equal(torch.isneginf(g), torch.isneginf(r)), "-inf pattern differs"
    fin = torch.isfinite(r)
    # one bf16 ulp of the larger value (fp32 sums in another order may round across a bf16
    # boundary), plus an absolute term for fp32 cancellation near zero
    ulp = 2.0 ** -7 * torch.maximum(g[fin].abs(), r[fin].abs()) + 1e-3
    assert ((g[fin] - r[fin]).abs() <= ulp).all()


VERIFY_CASES = [
    # B, NQ, Hq, Hkv, D, S_max, lens, collect, splits
    (2, 4, 8, 2, 32, 80, [70, 5], "first_last", None),
    (2, 8, 8, 1, 16, 96, [96, 40], "all", 3),
    (1, 1, 4, 4, 16, 40, [33], "first_last", 2),
    (3, 16, 4, 2, 16, 64, [64, 16, 41], "none", 2),
    (1, 12, 16, 2, 64, 70, [50], "first_last", 1),
    # gpt-oss-20b's group (G 8: its Hq 64 over Hkv 8; 2 KV heads here, the interpreter's time
    # grows with the programs) and head dim 64, the paper's 12 rows
    (2, 12, 16, 2, 64, 72, [72, 30], "all", 2),
    (1, 12, 16, 2, 64, 60, [45], "first_last", None),
]


def verify_case_inputs(case: tuple, dtype: torch.dtype, device: str, salt: int = 0
                       ) -> tuple[torch.Generator, torch.Tensor, torch.Tensor, torch.Tensor,
                                  torch.Tensor]:
    """(generator, q [B, NQ, Hq, D], k, v [B, S_max, Hkv, D], cache_lens [B]) of a verify case,
    seeded by the case (+ salt); the generator goes on for whatever the test draws next."""
    B, NQ, Hq, Hkv, D, S, lens, _collect, _splits = case
    gen = torch.Generator().manual_seed(zlib.crc32(repr(case).encode()) + salt)
    q = torch.randn(B, NQ, Hq, D, generator=gen).to(device=device, dtype=dtype)
    k, v = make_kv(gen, B, S, Hkv, D, dtype, device)
    return gen, q, k, v, torch.tensor(lens, dtype=torch.int32, device=device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", VERIFY_CASES)
def test_verify_attention_matches_reference(
    case: tuple, dtype: torch.dtype, device: str, use_triton: None, poison: None
) -> None:
    D, collect, splits = case[4], case[7], case[8]
    _gen, q, k, v, cl = verify_case_inputs(case, dtype, device)
    from vegas_sim.kernels import verify_attention as tri

    out, lse, scores = tri.verify_attention(q, k, v, cl, D ** -0.5, collect, splits=splits)
    r_out, r_lse, r_scores = reference.verify_attention(q, k, v, cl, D ** -0.5, collect)
    assert not torch.isnan(out.float()).any() and not torch.isnan(lse).any()
    assert rel_err(out, r_out) < OUT_TOL[dtype]
    assert (lse - r_lse).abs().max() < 1e-4 * max(1.0, float(r_lse.abs().max()))
    check_scores(scores, r_scores)


TMA_SHAPES = {  # device: B, NQ, Hq, Hkv, D, S_max, lens, BLOCK_N
    "cpu": (2, 4, 8, 2, 32, 80, [70, 37], 16),
    "cuda": (3, 8, 32, 8, 128, 4224, [4096, 1000, 2071], 64),
}


@pytest.mark.parametrize("collect", ["none", "first_last", "all"])
def test_verify_attention_tma_never_reads_unwritten_slots(
    collect: str, device: str, use_triton: None, poison: None
) -> None:
    """K/V tiles by TMA: the slots past cache_lens hold NaN (never written, as in a fresh
    cache), and the tile holding the last key goes by masked loads, so out, lse and scores
    are the reference's (a NaN V row in a TMA tile would poison acc through p = 0)."""
    from vegas_sim.kernels import verify_attention as tri

    if device == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs Hopper or later")
    B, NQ, Hq, Hkv, D, S, lens, block_n = TMA_SHAPES[device]
    gen = torch.Generator().manual_seed(5)
    dtype = torch.bfloat16
    q = torch.randn(B, NQ, Hq, D, generator=gen).to(device=device, dtype=dtype)
    k, v = make_kv(gen, B, S, Hkv, D, dtype, device)
    cl = torch.tensor(lens, dtype=torch.int32, device=device)
    r_out, r_lse, r_scores = reference.verify_attention(q, k, v, cl, D ** -0.5, collect)
    for b, L in enumerate(lens):
        k[b, L:] = float("nan")
        v[b, L:] = float("nan")
    for splits in (1, 3):
        out, lse, scores = tri.verify_attention(q, k, v, cl, D ** -0.5, collect, tma=True,
                                                splits=splits, block_n=block_n)
        assert rel_err(out, r_out) < OUT_TOL[dtype]
        assert (lse - r_lse).abs().max() < 1e-3
        check_scores(scores, r_scores)


def test_ops_dispatch_uses_triton(device: str, use_triton: None) -> None:
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 4, 16, generator=gen).to(device)
    k, v = make_kv(gen, 1, 20, 2, 16, torch.float32, device)
    cl = torch.tensor([17], dtype=torch.int32, device=device)
    assert ops.backend(q) == "triton"
    out, _, scores = ops.verify_attention(q, k, v, cl, 0.25, "first_last")
    r_out, _, r_scores = reference.verify_attention(q, k, v, cl, 0.25, "first_last")
    assert rel_err(out, r_out) < 1e-4
    check_scores(scores, r_scores)


def test_reference_matches_sdpa() -> None:
    """The reference itself against torch SDPA with an explicit causal mask (fp64)."""
    gen = torch.Generator().manual_seed(2)
    B, NQ, Hq, Hkv, D, S = 2, 5, 8, 2, 16, 30
    q = torch.randn(B, NQ, Hq, D, generator=gen, dtype=torch.float64)
    k = torch.randn(B, S, Hkv, D, generator=gen, dtype=torch.float64)
    v = torch.randn(B, S, Hkv, D, generator=gen, dtype=torch.float64)
    cl = torch.tensor([30, 9], dtype=torch.int32)
    out, lse, _ = reference.verify_attention(q, k, v, cl, D ** -0.5)
    for b, L in enumerate(cl.tolist()):
        kk = k[b, :L].repeat_interleave(Hq // Hkv, 1).transpose(0, 1)  # [Hq, L, D]
        vv = v[b, :L].repeat_interleave(Hq // Hkv, 1).transpose(0, 1)
        mask = torch.ones(NQ, L, dtype=torch.bool).tril(L - NQ)
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[b].transpose(0, 1), kk, vv, attn_mask=mask)
        assert torch.allclose(out[b], ref.transpose(0, 1), atol=1e-5)  # reference math is fp32
        s = torch.einsum("nhd,lhd->hnl", q[b], kk.transpose(0, 1)) * D ** -0.5
        s = s.masked_fill(~mask, float("-inf"))
        assert torch.allclose(lse[b], torch.logsumexp(s, -1).transpose(0, 1).float(), atol=1e-5)


def test_ops_rejects_bad_inputs() -> None:
    q = torch.zeros(1, 17, 4, 16)
    k = torch.zeros(1, 20, 2, 16)
    cl = torch.tensor([20], dtype=torch.int32)
    with pytest.raises(UserInputError, match="NQ=17"):
        ops.verify_attention(q, k, k, cl, 0.25)
    with pytest.raises(UserInputError, match="collect"):
        ops.verify_attention(q[:, :2], k, k, cl, 0.25, collect="some")
    with pytest.raises(UserInputError, match="multiple"):
        ops.verify_attention(torch.zeros(1, 2, 3, 16), k, k, cl, 0.25)


def test_backend_env(monkeypatch: pytest.MonkeyPatch) -> None:
    t = torch.zeros(1)
    monkeypatch.delenv("VEGAS_SIM_KERNELS", raising=False)
    assert ops.backend(t) == "reference"
    monkeypatch.setenv("VEGAS_SIM_KERNELS", "cuda-please")
    with pytest.raises(UserInputError, match="VEGAS_SIM_KERNELS"):
        ops.backend(t)


SPARSE_CASES = [
    # B, Hq, Hkv, D, S_max, lens, tail lengths, n_idx, splits
    (3, 8, 2, 32, 200, [200, 150, 30], [3, 5, 1], [100, 40, 29], None),
    (2, 8, 1, 16, 120, [120, 64], [7, 0], [50, 64], 3),
    (1, 4, 4, 16, 40, [40], [40], [0], 2),  # tail only
    (2, 64, 8, 64, 96, [96, 50], [4, 2], [30, 48], None),  # gpt-oss-20b: G 8, D 64
]


def random_indices(gen: torch.Generator, tails: list[int], n: list[int], K: int) -> torch.Tensor:
    rows = []
    for t, m in zip(tails, n):
        pick = torch.randperm(t, generator=gen)[:m]
        rows.append(torch.cat([pick, torch.full((K - m,), -1)]))  # -1 past n_idx: ignored
    return torch.stack(rows).to(torch.int32)


def sparse_case_inputs(case: tuple, dtype: torch.dtype, device: str, salt: int = 0
                       ) -> tuple[Any, ...]:
    """(generator, q [B, Hq, D], k, v, indices, n_idx, tail starts, cache_lens) of a sparse
    case, seeded by the case (+ salt); the generator goes on for what the test draws next."""
    B, Hq, Hkv, D, S, lens, tail_len, n, _splits = case
    gen = torch.Generator().manual_seed(zlib.crc32(repr(case).encode()) + salt)
    q = torch.randn(B, Hq, D, generator=gen).to(device=device, dtype=dtype)
    k, v = make_kv(gen, B, S, Hkv, D, dtype, device)
    cl = torch.tensor(lens, dtype=torch.int32)
    tail = cl - torch.tensor(tail_len, dtype=torch.int32)
    idx = random_indices(gen, tail.tolist(), n, max(max(n), 1))
    on_device = (t.to(device) for t in (idx, torch.tensor(n, dtype=torch.int32), tail, cl))
    return (gen, q, k, v, *on_device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", SPARSE_CASES)
def test_sparse_draft_attention_matches_reference(
    case: tuple, dtype: torch.dtype, device: str, use_triton: None, poison: None
) -> None:
    D, splits = case[3], case[8]
    _gen, q, k, v, i_d, n_d, t_d, c_d = sparse_case_inputs(case, dtype, device)
    from vegas_sim.kernels import sparse_attention as tri

    out = tri.sparse_draft_attention(q, k, v, i_d, n_d, t_d, c_d, D ** -0.5, splits=splits)
    ref = reference.sparse_draft_attention(q, k, v, i_d, n_d, t_d, c_d, D ** -0.5)
    assert not torch.isnan(out.float()).any()
    assert rel_err(out, ref) < OUT_TOL[dtype]


def test_sparse_equals_dense_when_everything_selected() -> None:
    """Selecting [0, tail_start) + tail == the last verify row: ties the two references."""
    gen = torch.Generator().manual_seed(3)
    B, Hq, Hkv, D, S = 2, 4, 2, 16, 50
    q = torch.randn(B, 1, Hq, D, generator=gen)
    k, v = make_kv(gen, B, S, Hkv, D, torch.float32, "cpu")
    cl = torch.tensor([50, 21], dtype=torch.int32)
    dense, _, _ = reference.verify_attention(q, k, v, cl, 0.25)
    tail = cl - 3
    idx = torch.stack([torch.arange(47), torch.cat([torch.arange(18), torch.full((29,), -1)])])
    out = reference.sparse_draft_attention(q[:, 0], k, v, idx.int(), tail, tail, cl, 0.25)
    assert torch.allclose(out, dense[:, 0], atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("B,NQ,C,collect,knobs", [
    (4, 8, 32768, "first_last", {}), (16, 16, 8192, "all", {}),
    (1, 1, 131072, "first_last", {}), (2, 12, 32768, "none", {}),
    # the M tiles the default does not pick there, and a many-split 64-key launch
    (4, 8, 32768, "first_last", {"min_m": 16}), (2, 5, 32768, "first_last", {"min_m": 64}),
    (1, 16, 32768, "first_last", {"splits": 64, "block_n": 64}),
    # long calls: wide_config (M 64, 32-key TMA tiles, two programs per SM) and TMA at M 32
    (16, 8, 32768, "first_last", {}), (4, 16, 131072, "none", {}), (4, 8, 131072, "none", {}),
    # ... at batches whose split count is not the rounded one: one wave (2, not 3), and more
    # heads than slots (2, not 1)
    (12, 7, 49152, "first_last", {}), (48, 7, 12288, "first_last", {}),
])
def test_verify_attention_gpu_real_shapes(B: int, NQ: int, C: int, collect: str,
                                          knobs: dict, poison: None) -> None:
    D = 128
    q, k, v, lens = verify_gpu_inputs(torch.Generator(device="cuda").manual_seed(B * 1000 + NQ),
                                      B, NQ, C, (32, 8, D))
    if knobs:
        from vegas_sim.kernels import verify_attention as tri

        out, lse, scores = tri.verify_attention(q, k, v, lens, D ** -0.5, collect, **knobs)
    else:
        out, lse, scores = ops.verify_attention(q, k, v, lens, D ** -0.5, collect)
    r_out, r_lse, r_scores = reference.verify_attention(q, k, v, lens, D ** -0.5, collect)
    assert rel_err(out, r_out) < 1e-2
    assert (lse - r_lse).abs().max() < 1e-3
    check_scores(scores, r_scores)


def verify_gpu_inputs(gen: torch.Generator, B: int, NQ: int, C: int,
                      heads: tuple[int, int, int]) -> tuple[torch.Tensor, ...]:
    """bf16 q [B, NQ, Hq, D], k/v [B, C+64, Hkv, D] and cache_lens [B] in [C/2, C] (the first
    at C) on the GPU: verify_attention's inputs at a real shape."""
    Hq, Hkv, D = heads
    q = torch.randn(B, NQ, Hq, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, C + 64, Hkv, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, C + 64, Hkv, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    lens = torch.randint(C // 2, C + 1, (B,), generator=gen, device="cuda", dtype=torch.int32)
    lens[0] = C
    return q, k, v, lens


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("tma", [False, True])
def test_verify_attention_gpu_graph_replays(tma: bool) -> None:
    """Captured once, replayed on new queries (as calibrate replays verify steps): every
    replay's scores and outputs are the reference's."""
    from vegas_sim.kernels import verify_attention as tri

    gen = torch.Generator(device="cuda").manual_seed(11)
    B, NQ, Hq, Hkv, D, C = 1, 8, 32, 8, 128, 32768
    q = torch.randn(B, NQ, Hq, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, C, Hkv, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, C, Hkv, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((B,), C, dtype=torch.int32, device="cuda")
    tri.verify_attention(q, k, v, lens, D ** -0.5, "first_last", tma=tma)  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse, scores = tri.verify_attention(q, k, v, lens, D ** -0.5, "first_last",
                                                tma=tma)
    for _ in range(3):
        q.copy_(torch.randn(q.shape, generator=gen, device="cuda", dtype=torch.bfloat16))
        graph.replay()
        r_out, r_lse, r_scores = reference.verify_attention(q, k, v, lens, D ** -0.5,
                                                            "first_last")
        assert rel_err(out, r_out) < 1e-2
        assert (lse - r_lse).abs().max() < 1e-3
        check_scores(scores, r_scores)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("B,C,sparsity,heads", [
    (16, 32768, 0.05, (32, 8, 128)), (4, 131072, 0.07, (32, 8, 128)),  # Qwen3-8B: 16-key tiles
    (64, 4096, 0.05, (9, 3, 64)), (1, 7168, 0.2, (9, 3, 64)),  # SmolLM2: 32-key tiles
])
def test_sparse_attention_gpu_real_shapes(B: int, C: int, sparsity: float,
                                          heads: tuple[int, int, int], poison: None) -> None:
    args = sparse_gpu_inputs(torch.Generator(device="cuda").manual_seed(B), B, C, sparsity,
                             heads)
    D = heads[2]
    out = ops.sparse_draft_attention(*args, D ** -0.5)
    ref = reference.sparse_draft_attention(*args, D ** -0.5)
    assert rel_err(out, ref) < 1e-2


def sparse_gpu_inputs(gen: torch.Generator, B: int, C: int, sparsity: float,
                      heads: tuple[int, int, int]) -> tuple[torch.Tensor, ...]:
    """bf16 q [B, Hq, D], k/v [B, C+16, Hkv, D], ceil(s·C) random indices per request, their
    count, the tail start C and cache length C + 7: sparse_draft_attention's arguments."""
    Hq, Hkv, D = heads
    q = torch.randn(B, Hq, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, C + 16, Hkv, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, C + 16, Hkv, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    K = math.ceil(sparsity * C)
    idx = torch.stack([torch.randperm(C, generator=gen, device="cuda")[:K] for _ in range(B)])
    cl = torch.full((B,), C + 7, dtype=torch.int32, device="cuda")
    tail = torch.full((B,), C, dtype=torch.int32, device="cuda")
    n = torch.full((B,), K, dtype=torch.int32, device="cuda")
    return q, k, v, idx.int(), n, tail, cl


# ---- attention sinks (gpt-oss): one logit per query head in every softmax denominator ------

def sink_logits(gen: torch.Generator, Hq: int, device: str, dtype: torch.dtype = torch.float32
                ) -> torch.Tensor:
    """[Hq] sinks ~ N(0, 2²), head 0's dominating its rows (+12), head 1's vanishing (-30)."""
    sinks = torch.randn(Hq, generator=gen) * 2.0
    sinks[0], sinks[1] = 12.0, -30.0
    return sinks.to(device=device, dtype=dtype)


def dense_with_sink_column(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: list[int],
                           scale: float, sinks: torch.Tensor) -> torch.Tensor:
    """fp64 causal attention of q [B, NQ, Hq, D] with a sink column in every softmax."""
    B, NQ, Hq, _D = q.shape
    group = Hq // k.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(B):
        for i in range(NQ):
            p = lens[b] - NQ + i  # row i's position: keys [0, p]
            for h in range(Hq):
                kk, vv = k[b, : p + 1, h // group].double(), v[b, : p + 1, h // group].double()
                logits = torch.cat([kk @ q[b, i, h].double() * scale, sinks[h:h + 1].double()])
                out[b, i, h] = torch.softmax(logits, 0)[:-1] @ vv
    return out


def test_reference_sinks_are_a_softmax_sink_column() -> None:
    """The references with sinks against an explicit softmax over [scores, sink_h] (fp64),
    and their lse is log(Σ exp(scale·s) + exp(sink))."""
    gen = torch.Generator().manual_seed(21)
    B, NQ, Hq, Hkv, D, S = 2, 5, 8, 2, 16, 30
    q = torch.randn(B, NQ, Hq, D, generator=gen, dtype=torch.float64)
    k = torch.randn(B, S, Hkv, D, generator=gen, dtype=torch.float64)
    v = torch.randn(B, S, Hkv, D, generator=gen, dtype=torch.float64)
    lens = [30, 9]
    cl = torch.tensor(lens, dtype=torch.int32)
    sinks = sink_logits(gen, Hq, "cpu")
    out, lse, _ = reference.verify_attention(q, k, v, cl, 0.25, sinks=sinks)
    assert torch.allclose(out.double(), dense_with_sink_column(q, k, v, lens, 0.25, sinks),
                          atol=1e-5)
    _, plain_lse, _ = reference.verify_attention(q, k, v, cl, 0.25)
    assert torch.allclose(lse, torch.logaddexp(plain_lse, sinks[None, None]), atol=1e-6)
    # the sparse reference selecting every position == the last verify row
    tail = cl - 2
    idx = torch.stack([torch.arange(28), torch.cat([torch.arange(7), torch.full((21,), -1)])])
    sparse = reference.sparse_draft_attention(q[:, -1], k, v, idx.int(), tail, tail, cl, 0.25,
                                              sinks)
    assert torch.allclose(sparse, out[:, -1], atol=1e-6)


def test_sink_normalised_weights_are_the_models_probabilities() -> None:
    """score_weights with a sink-including lse: per row and head, the key weights sum to
    1 − p_sink (what the model puts on keys), so the mean over heads sums to 1 − mean p_sink."""
    gen = torch.Generator().manual_seed(22)
    B, NQ, Hq, Hkv, D, S = 2, 4, 8, 2, 16, 40
    q = torch.randn(B, NQ, Hq, D, generator=gen)
    k, v = make_kv(gen, B, S, Hkv, D, torch.float32, "cpu")
    cl = torch.tensor([40, 17], dtype=torch.int32)
    sinks = sink_logits(gen, Hq, "cpu")
    _, lse, scores = reference.verify_attention(q, k, v, cl, 0.25, "all", sinks)
    assert scores is not None
    w = reference.score_weights(scores, lse, 0.25, cl)
    p_sink = torch.exp(sinks[None, None] - lse)  # [B, NQ, Hq]
    torch.testing.assert_close(w.sum(-1), 1.0 - p_sink.mean(dim=(1, 2)), rtol=2e-2, atol=1e-4)
    assert float(p_sink[:, :, 0].min()) > 0.9 and float(p_sink[:, :, 1].max()) < 1e-9


SINK_CASES = [
    # B, NQ, Hq, Hkv, D, S_max, lens, collect, splits; gpt-oss-20b's group (G 8, D 64) at the
    # paper's 12 rows
    (2, 12, 16, 2, 64, 72, [72, 30], "first_last", 1),  # one split: the sink in the epilogue
    (2, 12, 16, 2, 64, 72, [72, 30], "all", 3),  # the sink in the combine
    (1, 1, 16, 2, 64, 40, [33], "none", 2),
    (2, 4, 8, 2, 32, 80, [70, 5], "first_last", None),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", SINK_CASES)
def test_verify_attention_with_sinks_matches_reference(
    case: tuple, dtype: torch.dtype, device: str, use_triton: None, poison: None
) -> None:
    Hq, D, collect, splits = case[2], case[4], case[7], case[8]
    gen, q, k, v, cl = verify_case_inputs(case, dtype, device, salt=1)
    sinks = sink_logits(gen, Hq, device, dtype)  # the model's dtype, as the runtime passes it
    from vegas_sim.kernels import verify_attention as tri

    out, lse, scores = tri.verify_attention(q, k, v, cl, D ** -0.5, collect, splits=splits,
                                            sinks=sinks)
    r_out, r_lse, r_scores = reference.verify_attention(q, k, v, cl, D ** -0.5, collect, sinks)
    assert not torch.isnan(out.float()).any() and not torch.isnan(lse).any()
    assert rel_err(out, r_out) < OUT_TOL[dtype]
    assert (lse - r_lse).abs().max() < 1e-4 * max(1.0, float(r_lse.abs().max()))
    check_scores(scores, r_scores)  # raw q·k: the sink never enters the scores
    _, plain_lse, _ = reference.verify_attention(q, k, v, cl, D ** -0.5)
    assert (lse - plain_lse).abs().max() > 1.0  # the sink is in the lse (head 0's +12)


@pytest.mark.parametrize("splits", [1, 3])
def test_minus_inf_sinks_are_bit_identical_to_none(splits: int, device: str,
                                                   use_triton: None) -> None:
    """sink = -inf adds 2^-inf = 0 and rescales by 2^0 = 1: out and lse are those of the
    kernel without sinks to the bit (verify in its epilogue and combine, sparse in combine)."""
    from vegas_sim.kernels import sparse_attention as sp
    from vegas_sim.kernels import verify_attention as tri

    gen = torch.Generator().manual_seed(23)
    B, NQ, Hq, Hkv, D, S = 2, 3, 16, 2, 32, 48
    q = torch.randn(B, NQ, Hq, D, generator=gen).to(device)
    k, v = make_kv(gen, B, S, Hkv, D, torch.float32, device)
    cl = torch.tensor([48, 20], dtype=torch.int32, device=device)
    none = torch.full((Hq,), float("-inf"), device=device)
    got = tri.verify_attention(q, k, v, cl, 0.2, "first_last", splits=splits, sinks=none)
    want = tri.verify_attention(q, k, v, cl, 0.2, "first_last", splits=splits)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    idx = torch.arange(16, dtype=torch.int32, device=device).repeat(B, 1)
    n, tail = torch.full((B,), 16, dtype=torch.int32, device=device), cl - 4
    got_s = sp.sparse_draft_attention(q[:, 0], k, v, idx, n, tail, cl, 0.2, splits=splits,
                                      sinks=none)
    assert torch.equal(got_s, sp.sparse_draft_attention(q[:, 0], k, v, idx, n, tail, cl, 0.2,
                                                        splits=splits))


SPARSE_SINK_CASES = [
    # B, Hq, Hkv, D, S_max, lens, tail lengths, n_idx, splits (gpt-oss-20b heads)
    (2, 64, 8, 64, 96, [96, 50], [4, 2], [30, 48], None),
    (2, 64, 8, 64, 96, [96, 50], [4, 2], [30, 48], 1),
    (1, 64, 8, 64, 40, [40], [40], [0], 2),  # tail only
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", SPARSE_SINK_CASES)
def test_sparse_draft_attention_with_sinks_matches_reference(
    case: tuple, dtype: torch.dtype, device: str, use_triton: None, poison: None
) -> None:
    Hq, D, splits = case[1], case[3], case[8]
    gen, q, k, v, i_d, n_d, t_d, c_d = sparse_case_inputs(case, dtype, device, salt=1)
    sinks = sink_logits(gen, Hq, device, dtype)
    out = ops.sparse_draft_attention(q, k, v, i_d, n_d, t_d, c_d, D ** -0.5, sinks)
    if splits is not None:
        from vegas_sim.kernels import sparse_attention as tri

        out = tri.sparse_draft_attention(q, k, v, i_d, n_d, t_d, c_d, D ** -0.5, splits=splits,
                                         sinks=sinks)
    ref = reference.sparse_draft_attention(q, k, v, i_d, n_d, t_d, c_d, D ** -0.5, sinks)
    assert not torch.isnan(out.float()).any()
    assert rel_err(out, ref) < OUT_TOL[dtype]
    plain = reference.sparse_draft_attention(q, k, v, i_d, n_d, t_d, c_d, D ** -0.5)
    assert rel_err(plain, ref) > 0.1  # the sinks change the output


def test_ops_rejects_bad_sinks() -> None:
    q = torch.zeros(1, 2, 4, 16)
    k = torch.zeros(1, 20, 2, 16)
    cl = torch.tensor([20], dtype=torch.int32)
    with pytest.raises(UserInputError, match="sinks"):
        ops.verify_attention(q, k, k, cl, 0.25, sinks=torch.zeros(5))
    with pytest.raises(UserInputError, match="sinks"):
        ops.sparse_draft_attention(q[:, 0], k, k, torch.zeros(1, 1, dtype=torch.int32),
                                   cl * 0, cl, cl, 0.25, torch.zeros(4, dtype=torch.int64))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("B,NQ,C,collect,knobs", [
    (4, 12, 32768, "first_last", {}), (4, 12, 32768, "all", {}), (2, 12, 32768, "none", {}),
    (1, 1, 131072, "first_last", {}), (16, 12, 32768, "first_last", {}),
    (4, 12, 8192, "first_last", {"splits": 1}),  # the sink in the single-split epilogue
    (4, 12, 131072, "none", {"tma": True}),
])
def test_verify_attention_with_sinks_gpu_gpt_oss_shapes(B: int, NQ: int, C: int, collect: str,
                                                        knobs: dict, poison: None) -> None:
    """gpt-oss-20b's heads (Hq 64, Hkv 8, D 64), bf16 sinks as the runtime passes them."""
    Hq, D = 64, 64
    q, k, v, lens = verify_gpu_inputs(
        torch.Generator(device="cuda").manual_seed(B * 1000 + NQ + 7), B, NQ, C, (Hq, 8, D))
    sinks = sink_logits(torch.Generator().manual_seed(B), Hq, "cuda", torch.bfloat16)
    sinks[2] = 9.0  # comparable to the keys' sum at C 8K: p_sink ~ 1/2
    if knobs:
        from vegas_sim.kernels import verify_attention as tri

        out, lse, scores = tri.verify_attention(q, k, v, lens, D ** -0.5, collect, sinks=sinks,
                                                **knobs)
    else:
        out, lse, scores = ops.verify_attention(q, k, v, lens, D ** -0.5, collect, sinks=sinks)
    r_out, r_lse, r_scores = reference.verify_attention(q, k, v, lens, D ** -0.5, collect,
                                                        sinks)
    assert rel_err(out, r_out) < 1e-2
    assert (lse - r_lse).abs().max() < 1e-3
    check_scores(scores, r_scores)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_attention_with_sinks_gpu_graph_replays() -> None:
    """Verify (first_last) and sparse draft with sinks captured in one CUDA graph, replayed on
    new queries and new sink values (the sinks are read from the device on every replay)."""
    gen = torch.Generator(device="cuda").manual_seed(12)
    B, NQ, Hq, Hkv, D, C = 2, 12, 64, 8, 64, 16384
    q = torch.randn(B, NQ, Hq, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, C, Hkv, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, C, Hkv, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([C, C - 999], dtype=torch.int32, device="cuda")
    idx = torch.stack([torch.randperm(C - 64, generator=gen, device="cuda")[:800]
                       for _ in range(B)]).int()
    n = torch.full((B,), 800, dtype=torch.int32, device="cuda")
    tail = lens - 16
    sinks = torch.zeros(Hq, device="cuda", dtype=torch.bfloat16)

    def step() -> tuple[torch.Tensor, ...]:
        out, lse, scores = ops.verify_attention(q, k, v, lens, D ** -0.5, "first_last",
                                                sinks=sinks)
        assert scores is not None
        return out, lse, scores, ops.sparse_draft_attention(q[:, -1], k, v, idx, n, tail, lens,
                                                            D ** -0.5, sinks)

    step()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse, scores, sparse = step()
    for i in range(3):
        q.copy_(torch.randn(q.shape, generator=gen, device="cuda", dtype=torch.bfloat16))
        sinks.copy_(sink_logits(torch.Generator().manual_seed(i), Hq, "cuda", torch.bfloat16))
        graph.replay()
        r_out, r_lse, r_scores = reference.verify_attention(q, k, v, lens, D ** -0.5,
                                                            "first_last", sinks)
        assert rel_err(out, r_out) < 1e-2 and (lse - r_lse).abs().max() < 1e-3
        check_scores(scores, r_scores)
        r_sparse = reference.sparse_draft_attention(q[:, -1], k, v, idx, n, tail, lens,
                                                    D ** -0.5, sinks)
        assert rel_err(sparse, r_sparse) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("B,C,sparsity", [(16, 32768, 0.05), (4, 131072, 0.07), (1, 7168, 0.2)])
def test_sparse_attention_with_sinks_gpu_gpt_oss_shapes(B: int, C: int, sparsity: float,
                                                        poison: None) -> None:
    Hq, Hkv, D = 64, 8, 64
    args = sparse_gpu_inputs(torch.Generator(device="cuda").manual_seed(B + 5), B, C, sparsity,
                             (Hq, Hkv, D))
    sinks = sink_logits(torch.Generator().manual_seed(B), Hq, "cuda", torch.bfloat16)
    out = ops.sparse_draft_attention(*args, D ** -0.5, sinks)
    ref = reference.sparse_draft_attention(*args, D ** -0.5, sinks)
    assert rel_err(out, ref) < 1e-2


# ---- sliding window (gpt-oss's even layers): each row its `window` newest keys ------------

WINDOW_CASES = [
    # B, NQ, Hq, Hkv, D, S_max, lens, window, splits, sinks; gpt-oss's group (G 8, D 64)
    (2, 1, 16, 2, 64, 96, [96, 5], 8, None, True),  # decode; request 1 shorter than the window
    (2, 8, 16, 2, 64, 96, [90, 40], 16, 1, True),  # verify rows, one split: sink in the epilogue
    (2, 8, 16, 2, 64, 96, [90, 40], 16, 3, True),  # the sink in the combine, splits inside it
    (3, 4, 8, 2, 32, 80, [80, 17, 6], 5, 2, False),  # windows across a tile edge, no sinks
]


def window_case_inputs(case: tuple, dtype: torch.dtype, device: str
                       ) -> tuple[torch.Tensor, ...]:
    B, NQ, Hq, Hkv, D, S, lens, window, splits, with_sinks = case
    _gen, q, k, v, cl = verify_case_inputs((B, NQ, Hq, Hkv, D, S, lens, "none", splits), dtype,
                                           device, salt=window)
    sinks = sink_logits(_gen, Hq, device, dtype) if with_sinks else None
    return q, k, v, cl, sinks


def test_reference_window_is_the_dense_mask_cut_below() -> None:
    """The reference's window against an explicit softmax over each row's window keys (and
    the sink), fp64: row i of request b sees keys [p − W + 1, p], p = len − NQ + i."""
    q, k, v, cl, sinks = window_case_inputs(WINDOW_CASES[1], torch.float32, "cpu")
    window, scale = WINDOW_CASES[1][7], 0.125
    out, lse, scores = reference.verify_attention(q, k, v, cl, scale, sinks=sinks, window=window)
    assert scores is None
    G = q.shape[2] // k.shape[2]
    for b in range(q.shape[0]):
        for i in range(q.shape[1]):
            p = int(cl[b]) - q.shape[1] + i
            keys = torch.arange(max(0, p - window + 1), p + 1)
            for h in (0, 5, q.shape[2] - 1):
                kk, vv = k[b, keys, h // G].double(), v[b, keys, h // G].double()
                logits = torch.cat([kk @ q[b, i, h].double() * scale, sinks[h:h + 1].double()])
                torch.testing.assert_close(out[b, i, h].double(),
                                           torch.softmax(logits, 0)[:-1] @ vv, atol=1e-5,
                                           rtol=1e-5)
                torch.testing.assert_close(lse[b, i, h].double(), torch.logsumexp(logits, 0),
                                           atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", WINDOW_CASES)
def test_verify_attention_with_window_matches_reference(
    case: tuple, dtype: torch.dtype, device: str, use_triton: None, poison: None
) -> None:
    D, window, splits = case[4], case[7], case[8]
    q, k, v, cl, sinks = window_case_inputs(case, dtype, device)
    from vegas_sim.kernels import verify_attention as tri

    out, lse, _ = tri.verify_attention(q, k, v, cl, D ** -0.5, splits=splits, sinks=sinks,
                                       window=window)
    r_out, r_lse, _ = reference.verify_attention(q, k, v, cl, D ** -0.5, sinks=sinks,
                                                 window=window)
    assert not torch.isnan(out.float()).any() and not torch.isnan(lse).any()
    assert rel_err(out, r_out) < OUT_TOL[dtype]
    assert (lse - r_lse).abs().max() < 1e-4 * max(1.0, float(r_lse.abs().max()))
    full, _, _ = reference.verify_attention(q, k, v, cl, D ** -0.5, sinks=sinks)
    assert rel_err(out, full) > 0.05  # the window does cut keys the full row would see


def test_verify_attention_with_window_never_reads_older_keys(device: str,
                                                             use_triton: None) -> None:
    """Every slot older than the oldest row's window rewritten (random × 50): the kernel's
    output is bit-identical (it skips whole tiles below the window and masks the rest)."""
    q, k, v, cl, _sinks = window_case_inputs(WINDOW_CASES[3], torch.float32, device)
    NQ, window = q.shape[1], WINDOW_CASES[3][7]
    from vegas_sim.kernels import verify_attention as tri

    want, _, _ = tri.verify_attention(q, k, v, cl, 0.2, splits=2, window=window)
    for b, L in enumerate(cl.tolist()):
        first = max(0, L - NQ - window + 1)
        k[b, :first] = torch.randn_like(k[b, :first]) * 50
        v[b, :first] = torch.randn_like(v[b, :first]) * 50
    got, _, _ = tri.verify_attention(q, k, v, cl, 0.2, splits=2, window=window)
    assert torch.equal(got, want)


def test_ops_refuses_a_negative_window_and_collection_with_a_window() -> None:
    q = torch.randn(1, 2, 4, 8)
    k = v = torch.randn(1, 16, 2, 8)
    cl = torch.tensor([16], dtype=torch.int32)
    for collect, window in (("first_last", 4), ("none", -1)):
        with pytest.raises(UserInputError, match="window"):
            ops.verify_attention(q, k, v, cl, 0.3, collect, window=window)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("B,NQ,C", [(1, 1, 4096), (128, 1, 1024), (32, 8, 32768), (4, 12, 131072)])
def test_verify_attention_with_window_gpu_gpt_oss_shapes(B: int, NQ: int, C: int,
                                                         poison: None) -> None:
    q, k, v, lens = verify_gpu_inputs(torch.Generator(device="cuda").manual_seed(B + NQ), B, NQ,
                                      C, (64, 8, 64))
    sinks = torch.randn(64, device="cuda", dtype=torch.bfloat16)
    out, lse, _ = ops.verify_attention(q, k, v, lens, 0.125, sinks=sinks, window=128)
    r_out, r_lse, _ = reference.verify_attention(q, k, v, lens, 0.125, sinks=sinks, window=128)
    assert rel_err(out, r_out) < 1e-2
    assert (lse - r_lse).abs().max() < 1e-3
