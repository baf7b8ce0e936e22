"""Selection ops: Triton vs reference, and the reference against hand-computed cases.

Selected sets are compared through the weights they pick (ties at the k-th value may be
broken either way), never through raw index order.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.kernels.conftest import HAS_CUDA
from vegas_sim.kernels import ops, reference


def collected(device: str, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> tuple:
    """Scores/lse of a real verify pass (reference) so weights are a proper softmax."""
    gen = torch.Generator().manual_seed(seed)
    B, NQ, Hq, Hkv, D, S = 2, 5, 8, 2, 32, 300
    q = torch.randn(B, NQ, Hq, D, generator=gen).to(device=device, dtype=dtype)
    k = torch.randn(B, S, Hkv, D, generator=gen).to(device=device, dtype=dtype)
    v = torch.randn(B, S, Hkv, D, generator=gen).to(device=device, dtype=dtype)
    lens = torch.tensor([290, 100], dtype=torch.int32, device=device)
    _, lse, scores = reference.verify_attention(q, k, v, lens, D ** -0.5, "all")
    return scores, lse, lens, NQ, D


@pytest.mark.parametrize("one_row", [False, True])
def test_score_weights_matches_reference(one_row: bool, device: str, use_triton: None,
                                         poison: None) -> None:
    scores, lse, lens, NQ, D = collected(device)
    rank = lens - NQ + 1  # Vegas ranks [0, C]
    rows = torch.tensor([2, 4], device=device) if one_row else None
    got = ops.score_weights(scores, lse, D ** -0.5, rank, rows)
    ref = reference.score_weights(scores, lse, D ** -0.5, rank, rows)
    assert not torch.isnan(got).any()
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-9)


def test_score_weights_reference_semantics() -> None:
    scores, lse, lens, NQ, D = collected("cpu", torch.float32)
    rank = lens - NQ + 1
    w = reference.score_weights(scores, lse, D ** -0.5, rank)
    # row 0 (t0) attends exactly [0, C]: its weights sum to 1 per head; later rows see more
    # keys than are ranked, so the mean over rows sums to <= 1
    w0 = reference.score_weights(scores, lse, D ** -0.5, rank, torch.tensor([0, 0]))
    assert torch.allclose(w0.sum(-1), torch.ones(2), atol=2e-2)  # bf16 scores
    assert (w.sum(-1) <= 1.0 + 2e-2).all()
    for b, r in enumerate(rank.tolist()):
        assert (w[b, r:] == 0).all() and (w[b, :r] >= reference.WEIGHT_FLOOR).all()


def check_topk(idx: torch.Tensor, weights: torch.Tensor, budget: torch.Tensor) -> None:
    L, B, _ = weights.shape
    assert idx.shape == (L, B, int(budget.max())) and idx.dtype == torch.int32
    for layer in range(L):
        for b in range(B):
            n = int(budget[b])
            sel = idx[layer, b, :n].long()
            assert (idx[layer, b, n:] == -1).all()
            assert sel.unique().numel() == n and (sel >= 0).all()
            got = weights[layer, b, sel].sort().values
            best = weights[layer, b].topk(n).values.sort().values
            assert torch.equal(got, best)  # same weights picked, ties either way


@pytest.mark.parametrize("ties", [False, True])
def test_topk_select(ties: bool, device: str, use_triton: None) -> None:
    gen = torch.Generator().manual_seed(4)
    w = torch.rand(3, 2, 500, generator=gen)
    if ties:
        w = (w * 4).floor() / 4 + 0.1  # 4 distinct values: k-th value tied many times
    w[:, 1, 300:] = 0  # beyond rank_len of request 1
    budget = torch.tensor([37, 300], dtype=torch.int32)
    idx = ops.topk_select(w.to(device), budget.to(device))
    check_topk(idx.cpu(), w, budget)
    assert (idx[:, 1, :300] < 300).all()


def test_stream_indices() -> None:
    idx, n = reference.stream_indices(torch.tensor([100, 10, 30]), torch.tensor([20, 20, 5]), 4)
    assert n.tolist() == [20, 10, 5]
    assert idx[0].tolist() == [0, 1, 2, 3] + list(range(84, 100))
    assert idx[1].tolist() == list(range(10)) + [-1] * 10
    assert idx[2, :5].tolist() == [0, 1, 2, 3, 29]


def test_quest_update_meta_matches_reference(device: str, use_triton: None) -> None:
    gen = torch.Generator().manual_seed(5)
    B, S, Hkv, D = 2, 100, 2, 32
    k = torch.randn(B, S, Hkv, D, generator=gen).to(device=device, dtype=torch.bfloat16)
    P = math.ceil(S / 16)
    meta = [torch.full((B, P, Hkv, D), 7.0, dtype=torch.bfloat16, device=device)
            for _ in range(4)]
    steps = [([0, 0], [90, 37]), ([90, 37], [95, 49]), ([93, 40], [94, 41])]  # append, rollback
    for s, e in steps:
        st, en = torch.tensor(s, device=device), torch.tensor(e, device=device)
        ops.quest_update_meta(meta[0], meta[1], k, st, en)
        reference.quest_update_meta(meta[2], meta[3], k, st, en)
        assert torch.equal(meta[0], meta[2]) and torch.equal(meta[1], meta[3])
    # page 2 of request 1 now holds positions 32..40 only
    assert torch.equal(meta[3][1, 2], k[1, 32:41].amax(0))
    assert torch.equal(meta[2][1, 2], k[1, 32:41].amin(0))


def test_quest_select_matches_reference(device: str, use_triton: None) -> None:
    gen = torch.Generator().manual_seed(6)
    B, S, Hq, Hkv, D = 2, 300, 8, 2, 32
    k = torch.randn(B, S, Hkv, D, generator=gen).to(device=device, dtype=torch.bfloat16)
    q = torch.randn(B, Hq, D, generator=gen).to(device=device, dtype=torch.bfloat16)
    P = math.ceil(S / 16)
    kmin = torch.zeros(B, P, Hkv, D, dtype=torch.bfloat16, device=device)
    kmax = torch.zeros_like(kmin)
    reference.quest_update_meta(kmin, kmax, k, torch.tensor([0, 0]), torch.tensor([285, 96]))
    ctx, n_pages = torch.tensor([285, 96]), torch.tensor([5, 9])
    got, n_got = ops.quest_select(q, kmin, kmax, ctx.to(device), n_pages.to(device))
    ref, n_ref = reference.quest_select(q, kmin, kmax, ctx, n_pages)
    assert torch.equal(n_got.cpu(), n_ref) and n_ref.tolist() == [5 * 16 + 13, 6 * 16]
    page_score = reference.quest_page_scores(q, kmin, kmax).cpu()
    for b in range(B):
        g, r = got[b, : n_got[b]].cpu().long(), ref[b, : n_ref[b]].long()
        assert (got[b, n_got[b]:] == -1).all()
        # same multiset of page scores (ties either way), same partial page
        assert torch.equal(page_score[b, g // 16].sort().values, page_score[b, r // 16].sort().values)
        assert set(g.tolist()) >= set(range(int(ctx[b]) // 16 * 16, int(ctx[b])))


def test_vegas_pipeline_selects_inside_rank_len(device: str, use_triton: None) -> None:
    """verify (collect first_last) → weights → top-k → sparse draft, all through ops."""
    gen = torch.Generator().manual_seed(7)
    B, NQ, Hq, Hkv, D, S = 2, 4, 8, 2, 32, 200
    q = torch.randn(B, NQ, Hq, D, generator=gen).to(device)
    k = torch.randn(B, S, Hkv, D, generator=gen).to(device)
    v = torch.randn(B, S, Hkv, D, generator=gen).to(device)
    lens = torch.tensor([180, 64], dtype=torch.int32, device=device)
    _, lse, scores = ops.verify_attention(q, k, v, lens, D ** -0.5, "first_last")
    rows = ops.collect_row_ids(NQ, "first_last")
    rank = lens - NQ + 1
    assert scores is not None
    w = ops.score_weights(scores, lse[:, rows], D ** -0.5, rank)
    budget = torch.minimum(torch.tensor([40, 100], device=device), rank)
    idx = ops.topk_select(torch.stack([w, w]), budget.int())
    for b in range(B):
        sel = idx[0, b, : budget[b]]
        assert (sel >= 0).all() and (sel < rank[b]).all()
    out = ops.sparse_draft_attention(q[:, -1], k, v, idx[0], budget.int(), rank, lens, D ** -0.5)
    ref = reference.sparse_draft_attention(q[:, -1], k, v, idx[0], budget.int(), rank, lens,
                                           D ** -0.5)
    assert torch.allclose(out, ref, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_selection_gpu_real_shapes() -> None:
    gen = torch.Generator(device="cuda").manual_seed(8)
    B, R, Hq, S, L = 4, 2, 32, 131072 + 64, 4
    scores = torch.randn(B, R, Hq, S, generator=gen, device="cuda").mul(8).bfloat16()
    lse = torch.logsumexp(scores.float() * 128 ** -0.5, -1)
    rank = torch.tensor([131072, 100000, 65536, 131000], dtype=torch.int32, device="cuda")
    w = ops.score_weights(scores, lse, 128 ** -0.5, rank)
    ref = reference.score_weights(scores, lse, 128 ** -0.5, rank)
    assert torch.allclose(w, ref, rtol=1e-4, atol=1e-12)
    budget = torch.ceil(0.07 * rank.double()).int()
    weights = torch.stack([w] * L)
    idx = ops.topk_select(weights, budget)
    check_topk(idx.cpu(), weights.cpu(), budget.cpu())
