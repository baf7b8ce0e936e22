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


def quest_inputs(device: str, B: int, S: int, seed: int, Hq: int = 8, Hkv: int = 2,
                 D: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """k [B, S, Hkv, D], q [B, Hq, D] bf16 and the page min/max of every position."""
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(B, S, Hkv, D, generator=gen).to(device=device, dtype=torch.bfloat16)
    q = torch.randn(B, Hq, D, generator=gen).to(device=device, dtype=torch.bfloat16)
    P = math.ceil(S / 16)
    kmin = torch.zeros(B, P, Hkv, D, dtype=torch.bfloat16, device=device)
    kmax = torch.zeros_like(kmin)
    reference.quest_update_meta(kmin, kmax, k, torch.zeros(B, dtype=torch.int32),
                                torch.full((B,), S, dtype=torch.int32))
    return k, q, kmin, kmax


def check_quest_same(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor,
                     ctx: torch.Tensor, n_pages: torch.Tensor, max_pages: int | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """ops.quest_select (Triton: the default radix pick on the wide scoring kernel), the
    one-program search pick and the scoring kernel looped over the KV heads return the
    reference's index list exactly: the same pages, in ascending order, the same partial
    page, -1 past n_idx."""
    from vegas_sim.kernels import quest

    dev = q.device
    ref, n_ref = reference.quest_select(q, kmin, kmax, ctx, n_pages, max_pages)
    for got, n_got in [ops.quest_select(q, kmin, kmax, ctx.to(dev), n_pages.to(dev), max_pages),
                       quest.quest_select(q, kmin, kmax, ctx.to(dev), n_pages.to(dev),
                                          max_pages, pick="search"),
                       quest.quest_select(q, kmin, kmax, ctx.to(dev), n_pages.to(dev),
                                          max_pages, score_wide=False)]:
        assert torch.equal(n_got.cpu(), n_ref.cpu())
        assert torch.equal(got.cpu(), ref.cpu())
    return ref.cpu(), n_ref.cpu()


def test_quest_select_matches_reference(device: str, use_triton: None) -> None:
    _, q, kmin, kmax = quest_inputs(device, 2, 300, seed=6)
    ctx, n_pages = torch.tensor([285, 96]), torch.tensor([5, 9])
    ref, n_ref = check_quest_same(q, kmin, kmax, ctx, n_pages)
    assert n_ref.tolist() == [5 * 16 + 13, 6 * 16]
    page_score = reference.quest_page_scores(q, kmin, kmax).cpu()
    for b in range(2):
        pages = ref[b, : n_ref[b]].long()[::16] // 16
        full = int(ctx[b]) // 16
        take = min(int(n_pages[b]), full)
        # the top `take` full pages by score, then the partial page
        want = page_score[b, :full].topk(take).indices.sort().values
        assert torch.equal(pages[:take], want)
        assert set(ref[b, : n_ref[b]].tolist()) >= set(range(full * 16, int(ctx[b])))
    # a fixed bound on n_pages (CUDA graphs): wider list, same entries
    check_quest_same(q, kmin, kmax, ctx, n_pages, max_pages=12)


def test_quest_select_ties_and_edges(device: str, use_triton: None) -> None:
    """Pages with identical keys tie exactly; the smaller page index wins, as in the reference.
    Also: n_pages 0 (the partial page alone), n_pages past the full pages, context a multiple
    of 16 (no partial page), context below one page."""
    k, q, kmin, kmax = quest_inputs(device, 4, 320, seed=11)
    for b in range(4):  # copies of page 3 at pages 5, 9, 12: four tied pages
        for p in (5, 9, 12):
            kmin[b, p] = kmin[b, 3]
            kmax[b, p] = kmax[b, 3]
    scores = reference.quest_page_scores(q, kmin, kmax).cpu()
    ctx = torch.tensor([317, 320, 9, 200])
    for b in range(4):
        full = int(ctx[b]) // 16
        rank = int((scores[b, :full] > scores[b, 3]).sum())
        if b in (0, 1):  # a budget that cuts the four tied pages in two
            assert rank + 4 <= full
    n_pages = torch.tensor([int((scores[0, :19] > scores[0, 3]).sum()) + 2,
                            int((scores[1, :20] > scores[1, 3]).sum()) + 1, 3, 0])
    ref, n_ref = check_quest_same(q, kmin, kmax, ctx, n_pages)
    chosen = set((ref[0, : n_ref[0]].long() // 16).tolist())
    assert {3, 5} <= chosen and not {9, 12} & chosen
    assert n_ref.tolist() == [int(n_pages[0]) * 16 + 13, int(n_pages[1]) * 16, 9, 8]
    check_quest_same(q, kmin, kmax, ctx, torch.tensor([30, 30, 30, 30]))  # all full pages


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("heads", [(8, 2, 32), (6, 3, 24)])
def test_quest_scores_and_first_digit(device: str, use_triton: None, poison: None, wide: bool,
                                      heads: tuple[int, int, int]) -> None:
    """Both scoring kernels (head counts and a head dim that are not powers of two too): the
    reference's page scores to fp32 rounding, -inf past the full pages, and with a histogram
    the first radix digit of exactly the full pages' keys."""
    from vegas_sim.kernels import quest

    Hq, Hkv, D = heads
    _, q, kmin, kmax = quest_inputs(device, 2, 200, seed=14, Hq=Hq, Hkv=Hkv, D=D)
    ctx = torch.tensor([200, 70], dtype=torch.int32, device=device)
    hist = quest.radix_histograms(2, q.device)
    got = quest.quest_scores(q, kmin, kmax, ctx, hist=hist, wide=wide, block_p=4 if wide else None)
    ref = reference.quest_page_scores(q, kmin, kmax)
    for b, full in enumerate([12, 4]):
        assert torch.allclose(got[b, :full], ref[b, :full], rtol=1e-5, atol=1e-4)
        assert (got[b, full:] == float("-inf")).all()
        want = torch.bincount(order_keys(got[b, :full].cpu()) >> 21, minlength=2048)
        assert torch.equal(hist[b, 0].cpu(), want.int())
        assert (hist[b, 1:] == 0).all()


def test_quest_select_chunked_rows(device: str, use_triton: None, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Rows longer than the pick kernel holds in registers take the chunked search: same list."""
    from vegas_sim.kernels import quest

    monkeypatch.setattr(quest, "PICK_WHOLE_MAX", 16)
    monkeypatch.setattr(quest, "PICK_CHUNK", 16)
    _, q, kmin, kmax = quest_inputs(device, 2, 1000, seed=12)
    check_quest_same(q, kmin, kmax, torch.tensor([999, 640]), torch.tensor([20, 7]))


def order_keys(scores: torch.Tensor) -> torch.Tensor:
    """The 32-bit order keys of fp32 scores (as kernels.quest orders them), int64."""
    bits = scores.view(torch.int32)
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).long() + 2**31


def near_tie_scores(gen: torch.Generator, B: int, P: int) -> torch.Tensor:
    """[B, P] fp32 scores drawn from a few values that share the radix pick's first digit or
    its first two (1.0 plus a few ulps, plus multiples of 1024 ulps), a few negatives and
    exact repeats: every level of the radix search and the ties at the take-th score."""
    one = torch.tensor([1.0]).view(torch.int32)
    ulps = torch.tensor([0, 1, 2, 3, 1024, 1025, 2048, 2 ** 21, 2 ** 22])
    pos = (one + ulps).view(torch.float32)
    values = torch.cat([pos, -pos[:3], torch.tensor([0.5, 7.0])])
    return values[torch.randint(len(values), (B, P), generator=gen)]


@pytest.mark.parametrize("rescan", [False, True])
@pytest.mark.parametrize("chunk", [16, 64])
def test_quest_radix_pick_exact_on_near_ties(device: str, use_triton: None, poison: None,
                                             chunk: int, rescan: bool,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The radix pick (its write from the chunk summaries, or re-counting the pages before
    each chunk) over constructed scores (keys differing in one radix digit only, many exact
    ties, budgets cutting tie classes, several chunks per request, the write's count of the
    pages before its chunk in several steps) gives the reference's exact list, as does the
    one-program search; request 3 has n_pages 0, request 2 a context below one page.
    Outputs start poisoned: every column is written (the -1 fill shared among programs)."""
    from vegas_sim.kernels import quest

    monkeypatch.setattr(quest, "RADIX_ROW", 32)
    gen = torch.Generator().manual_seed(21)
    B, P = 5, 150
    scores = near_tie_scores(gen, B, P)
    ctx = torch.tensor([2400, 1000, 9, 1500, 2391], dtype=torch.int32)
    n_pages = torch.tensor([40, 12, 2, 0, 149], dtype=torch.int32)  # 4: every full page
    n_max = 149
    full = (ctx // 16).clamp(max=P)
    past = torch.arange(P)[None, :] >= full[:, None]
    scores = torch.where(past, float("-inf"), scores)  # as quest_scores leaves them
    hist = torch.zeros(B, 3, 2048, dtype=torch.int32)
    for b in range(B):
        hist[b, 0] = torch.bincount(order_keys(scores[b, : full[b]]) >> 21, minlength=2048)
    ref, n_ref = reference.quest_pick(scores, ctx, n_pages, n_max)
    take = n_pages.clamp(max=full)
    for b in (0, 1):  # the budgets cut a class of tied scores
        row = scores[b, : full[b]]
        kth = row.sort(descending=True).values[take[b] - 1]
        above, tied = int((row > kth).sum()), int((row == kth).sum())
        assert above < take[b] < above + tied
    dev = device
    got, n_got = quest.quest_pick_radix(scores.to(dev), hist.to(dev), ctx.to(dev),
                                        n_pages.to(dev), n_max, chunk=chunk, rescan=rescan)
    assert torch.equal(n_got.cpu(), n_ref) and torch.equal(got.cpu(), ref)
    got, n_got = quest.quest_pick(scores.to(dev), ctx.to(dev), n_pages.to(dev), n_max)
    assert torch.equal(n_got.cpu(), n_ref) and torch.equal(got.cpu(), ref)


def ulps_above_one(n: torch.Tensor) -> torch.Tensor:
    """fp32 1.0 plus n ulps (n int)."""
    return (torch.tensor([1.0]).view(torch.int32) + n.int()).view(torch.float32)


def summary_cannot_tell(row: torch.Tensor, take: int, chunk: int, upto: int) -> bool:
    """Whether the "radix" write must count pages for some chunk before `upto`: a chunk with
    three or more keys on the take-th key's top 22 bits whose last 10 bits lie on both sides
    of (or at) the take-th's, not all equal (kernels.quest `_chunk_summary`)."""
    keys = order_keys(row)
    t = int(keys.sort(descending=True).values[take - 1])
    for c0 in range(0, upto, chunk):
        k = keys[c0: c0 + chunk]
        low = k[(k >> 10) == t >> 10] & 1023
        d = t & 1023
        if len(low) >= 3 and int(low.min()) <= d <= int(low.max()) and low.min() < low.max():
            return True
    return False


def test_quest_radix_write_from_chunk_summaries(device: str, use_triton: None, poison: None,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The "radix" write's slots from the chunk summaries, each case of them against the
    reference's exact list: chunks with two keys on the take-th key's 22-bit prefix on either
    side of it (row 0), chunks of exact ties at the take-th key (row 1), chunks whose keys on
    the prefix all lie above or below it (row 2), a chunk the summary cannot order, so that
    the later chunks count its pages (row 3), and continuous scores (row 4). Ten chunks a
    request, summaries read four at a time, the -1 fill in several steps."""
    from vegas_sim.kernels import quest

    monkeypatch.setattr(quest, "RADIX_SUMMARY_BLOCK", 4)
    monkeypatch.setattr(quest, "RADIX_FILL_MAX", 16)
    monkeypatch.setattr(quest, "RADIX_ROW", 32)
    gen = torch.Generator().manual_seed(5)
    B, P, chunk = 5, 160, 16
    low = 0.5 + torch.rand(B, P, generator=gen) * 0.25  # far below 1.0: off the prefix
    scores = low.clone()
    page = torch.arange(P)
    scores[0, page % chunk == 3] = float(ulps_above_one(torch.tensor([3])))
    scores[0, page % chunk == 9] = float(ulps_above_one(torch.tensor([1])))
    scores[1, page % 4 == 1] = 1.0
    scores[1, page % 16 == 6] = float(ulps_above_one(torch.tensor([1024])))  # the next prefix
    digits = torch.tensor([0, 1, 1, 5, 5, 5, 9, 9, 9, 9])  # per chunk: below / at / above d 5
    for c, dg in enumerate(digits.tolist()):
        scores[2, c * chunk + torch.arange(3) * 5] = float(ulps_above_one(torch.tensor([dg])))
    scores[3, :chunk] = ulps_above_one(torch.arange(chunk) % 4)  # 0..3 ulps, chunk 0 only
    scores[3, 40::16] = float(ulps_above_one(torch.tensor([2])))
    scores[4] = torch.randn(P, generator=gen)
    ctx = torch.full((B,), P * 16 + 5, dtype=torch.int32)
    n_pages = torch.tensor([15, 30, 13, 12, 37], dtype=torch.int32)
    hist = torch.zeros(B, 3, 2048, dtype=torch.int32)
    for b in range(B):
        hist[b, 0] = torch.bincount(order_keys(scores[b]) >> 21, minlength=2048)
    needs_count = [summary_cannot_tell(scores[b], int(n_pages[b]), chunk, P - chunk)
                   for b in range(B)]
    assert needs_count == [False, False, False, True, False]
    ref, n_ref = reference.quest_pick(scores, ctx, n_pages, 40)
    dev = device
    got, n_got = quest.quest_pick_radix(scores.to(dev), hist.to(dev), ctx.to(dev),
                                        n_pages.to(dev), 40, chunk=chunk)
    assert torch.equal(n_got.cpu(), n_ref) and torch.equal(got.cpu(), ref)


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


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_quest_select_gpu_real_shape_and_graph_replay() -> None:
    """Qwen3-8B heads, B 4 at contexts up to 32K: the Triton list is the reference's (pages
    whose scores differ from the take-th by fp32 rounding alone may swap); captured once in a
    CUDA graph with a fixed max_pages and replayed on new queries, the same lists as eager."""
    from vegas_sim.kernels import quest

    gen = torch.Generator(device="cuda").manual_seed(13)
    B, Hq, Hkv, D, C = 4, 32, 8, 128, 32768
    P = C // 16 + 8
    kmin = torch.randn(B, P, Hkv, D, generator=gen, device="cuda").bfloat16()
    kmax = (kmin.float() + torch.rand(B, P, Hkv, D, generator=gen, device="cuda")).bfloat16()
    q = torch.randn(B, Hq, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    ctx = torch.tensor([C, C - 5, 20000, 1000], dtype=torch.int32, device="cuda")
    n_pages = torch.tensor([102, 400, 1, 70], dtype=torch.int32, device="cuda")
    max_pages = 410

    def check(got: torch.Tensor, n_got: torch.Tensor) -> None:
        ref, n_ref = reference.quest_select(q, kmin, kmax, ctx, n_pages, max_pages)
        assert torch.equal(n_got, n_ref) and (got.shape == ref.shape)
        scores = reference.quest_page_scores(q, kmin, kmax)
        for b in range(B):
            g = set(got[b, : n_got[b]].tolist())
            r = set(ref[b, : n_ref[b]].tolist())
            if g != r:  # only pages at the take-th score, to fp32 rounding
                full = int(ctx[b]) // 16
                take = min(int(n_pages[b]), full)
                kth = scores[b, :full].topk(take).values[-1]
                for page in {t // 16 for t in g ^ r}:
                    assert abs(float(scores[b, page] - kth)) <= 1e-5 * abs(float(kth)) + 1e-3
            assert (got[b, n_got[b]:] == -1).all()
            listed = got[b, : n_got[b]]
            assert bool((listed[1:] > listed[:-1]).all())  # ascending pages, then the partial

    eager = ops.quest_select(q, kmin, kmax, ctx, n_pages, max_pages)
    check(*eager)
    # the search pick on the same scoring kernel: the same list exactly; the scoring kernel
    # looped over the KV heads: the reference's, to fp32 rounding
    search = quest.quest_select(q, kmin, kmax, ctx, n_pages, max_pages, pick="search")
    assert torch.equal(search[0], eager[0]) and torch.equal(search[1], eager[1])
    check(*quest.quest_select(q, kmin, kmax, ctx, n_pages, max_pages, score_wide=False))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, n_out = ops.quest_select(q, kmin, kmax, ctx, n_pages, max_pages)
    for _ in range(3):
        q.copy_(torch.randn(q.shape, generator=gen, device="cuda", dtype=torch.bfloat16))
        graph.replay()
        check(out, n_out)
        want = ops.quest_select(q, kmin, kmax, ctx, n_pages, max_pages)
        assert torch.equal(out, want[0]) and torch.equal(n_out, want[1])
