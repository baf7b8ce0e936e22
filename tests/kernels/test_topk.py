"""radix_topk against torch.topk, compared through the values picked (torch may break ties at
the k-th value either way), never through index order (radix_topk's order is fixed, not sorted:
test_gpu_repeatable checks it on the GPU, where programs race).

Small rows with small blocks and samples, so that the split over programs, the candidate
list, the fallback of a missed bracket and every radix exit (one pattern left, whole range
taken, all passes run) are exercised under the interpreter; the production shape runs with
`pytest -m gpu`.
"""

from __future__ import annotations

import pytest
import torch

WEIGHT_FLOOR = float(torch.finfo(torch.float32).tiny)  # as reference.WEIGHT_FLOOR


def check(idx: torch.Tensor, weights: torch.Tensor, k: int) -> None:
    """Per row: k unique in-range positions whose values are the row's k largest."""
    S = weights.shape[-1]
    assert idx.shape == (*weights.shape[:-1], k) and idx.dtype == torch.int32
    w = weights.reshape(-1, S).cpu()
    sel = idx.reshape(-1, k).long().cpu()
    for row in range(w.shape[0]):
        assert sel[row].unique().numel() == k
        # a fixed order: at most three ascending runs (winners, candidates above the k-th
        # value, candidates tied at it)
        assert int((sel[row][1:] < sel[row][:-1]).sum()) <= 2, row
        assert bool((sel[row] >= 0).all()) and bool((sel[row] < S).all())
        got = w[row, sel[row]].sort().values
        best = w[row].topk(k).values.sort().values
        assert torch.equal(got, best), row


def run(weights: torch.Tensor, k: int, device: str, **kwargs: int) -> None:
    from vegas_sim.kernels.topk import radix_topk

    check(radix_topk(weights.to(device), k, **kwargs), weights, k)


def rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("k", "block", "split", "sample"), [
    (1, 128, 1, 64), (37, 128, 3, 32), (600, 256, 2, 128), (999, 128, 8, 64), (400, 256, 1, 4096),
])
def test_random(k: int, block: int, split: int, sample: int, device: str, use_triton: None,
                poison: None) -> None:
    """1000 per row: not a multiple of block; sample 4096: the whole row is the sample."""
    run(rand(3, 1000) ** 4, k, device, block=block, split=split, sample=sample)


@pytest.mark.parametrize("sample", [32, 4096])
def test_ties_at_kth(sample: int, device: str, use_triton: None, poison: None) -> None:
    w = (rand(2, 3, 777, seed=1) * 4).floor() / 4 + 0.1  # 4 values: the k-th tied ~190 times
    run(w, 300, device, block=128, sample=sample)


@pytest.mark.parametrize("k", [300, 650, 899])
def test_zero_tail(k: int, device: str, use_triton: None, poison: None) -> None:
    """rank_len < S: with k over the nonzero count the zeros fill (radix bucket 0 = {lo})."""
    w = rand(4, 900, seed=2).clamp_min(WEIGHT_FLOOR)
    w[:, 500:] = 0
    w[1, 100:] = 0
    run(w, k, device, block=256, sample=64)


def test_floor_ties(device: str, use_triton: None, poison: None) -> None:
    """Many values at the weight floor (smallest normal) with the k-th among them."""
    w = (rand(2, 1500, seed=3) ** 60 * 1e-20).clamp_min(WEIGHT_FLOOR)
    n_floor = int((w == WEIGHT_FLOOR).sum(-1).min())
    assert n_floor > 600
    run(w, 1500 - n_floor // 2, device, block=256, sample=128)


@pytest.mark.parametrize("log2_bins", [5, 8])
def test_wide_range(log2_bins: int, device: str, use_triton: None, poison: None) -> None:
    """Values from subnormals to +inf: radix passes over wide ranges."""
    levels = torch.tensor([0.0, 1e-45, 1e-39, 3e-30, 0.5, 1.0, 2.0, 7e30, float("inf")])
    w = levels[torch.randint(0, len(levels), (3, 640), generator=torch.Generator().manual_seed(4))]
    w[2] = torch.exp(torch.randn(640, generator=torch.Generator().manual_seed(5)) * 30)
    for k in (5, 200, 639):
        run(w, k, device, block=128, sample=64, log2_bins=log2_bins)


@pytest.mark.parametrize("sigmas", [0.0, -3.0])
def test_bracket_missed(sigmas: float, device: str, use_triton: None, poison: None,
                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A narrow (or inverted) sample bracket misses on some rows: they fall back to the
    whole row; the others refine their candidates."""
    from vegas_sim.kernels import topk

    monkeypatch.setattr(topk, "SAMPLE_SIGMAS", sigmas)
    w = rand(4, 1200, seed=8) ** 3
    w[3, 700:] = 0
    run(w, 150, device, block=256, sample=32)


@pytest.mark.parametrize("value", [0.0, 0.25])
def test_all_equal(value: float, device: str, use_triton: None, poison: None) -> None:
    run(torch.full((2, 300), value), 77, device, block=128, sample=32)


@pytest.mark.parametrize(("sample", "split"), [(32, 1), (32, 4), (4096, 2)])
def test_ties_take_the_smallest_positions(sample: int, split: int, device: str,
                                          use_triton: None, poison: None) -> None:
    """Of the values tied at the k-th, the smallest positions: the selected *set* does not
    depend on the order in which blocks reserve slots. (The interpreter runs programs one
    after another, so this order is fixed here; test_gpu_repeatable is the GPU check.)"""
    from vegas_sim.kernels.topk import radix_topk

    gen = torch.Generator().manual_seed(9)
    w = torch.zeros(3, 900)
    for row, n_big in enumerate((10, 0, 299)):
        perm = torch.randperm(900, generator=gen)
        w[row, perm[:n_big]] = 5.0
        w[row, perm[n_big:n_big + 400]] = 1.0  # 400 copies of the k-th value (k = 300)
    got = radix_topk(w.to(device), 300, block=128, sample=sample, split=split).cpu().long()
    for row in range(3):
        big = (w[row] == 5.0).nonzero().flatten()
        ones = (w[row] == 1.0).nonzero().flatten()  # ascending positions
        want = torch.cat([big, ones[:300 - big.numel()]])
        assert torch.equal(got[row].sort().values, want.sort().values), row


def test_edges(device: str, use_triton: None) -> None:
    from vegas_sim.kernels.topk import radix_topk

    w = rand(2, 3, 200, seed=6)
    assert radix_topk(w.to(device), 0).shape == (2, 3, 0)
    run(w, 200, device)  # k == S: every position
    run(w, 199, device, sample=32)
    run(w[:, :, :1].contiguous(), 1, device)  # S = 1 (k == S)
    run(w[:, :, :2].contiguous(), 1, device)
    assert radix_topk(w[:0].to(device), 5).shape == (0, 3, 5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_production_shape(device: str, use_triton: None) -> None:
    """[36 layers, 4 requests, 131200] softmax-like weights, zeros past rank_len, k = 9175."""
    gen = torch.Generator().manual_seed(7)
    w = torch.softmax(torch.randn(36, 4, 131200, generator=gen) * 3, -1).clamp_min(WEIGHT_FLOOR)
    rank = torch.tensor([131200, 130000, 100000, 9000])  # the last: zeros fill its top k
    run(w * (torch.arange(131200) < rank[:, None]), 9175, device)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_repeatable(use_triton: None) -> None:
    """Ten calls on rows with thousands of copies of the k-th value: the same indices in the
    same order every time, although ~16 programs a row compact it in any order."""
    from vegas_sim.kernels.topk import radix_topk

    gen = torch.Generator().manual_seed(10)
    w = torch.softmax(torch.randn(8, 131200, generator=gen) * 3, -1)
    w[:, ::3] = w.topk(9175, -1).values[:, -1:]  # ~43700 copies of each row's k-th value
    w = w.cuda()
    first = radix_topk(w, 9175)
    for _ in range(10):
        assert torch.equal(radix_topk(w, 9175), first)
    run(w.cpu(), 9175, "cuda")


def test_constexprs_do_not_follow_the_row_shape(monkeypatch: pytest.MonkeyPatch,
                                                use_triton: None) -> None:
    """One compiled kernel set serves every row length >= BLOCK_DEFAULT and every row count:
    a calibration calls the top-k at each context and batch of its grid, and a constexpr that
    follows the shape (PARTS did) recompiles at each one (measured on the H200: 40-68 s a point)."""
    from vegas_sim.kernels import topk

    seen: set[tuple[tuple[str, object], ...]] = set()

    class Recording:
        def __init__(self, kernel: object) -> None:
            self.kernel = kernel

        def __getitem__(self, grid: object):  # type: ignore[no-untyped-def]
            def launch(*args: object, **kw: object) -> object:
                seen.add(tuple(sorted((k, v) for k, v in kw.items() if k.isupper())))
                return self.kernel[grid](*args, **kw)  # type: ignore[index]
            return launch

    for name in ("_compact_kernel", "_refine_kernel"):
        monkeypatch.setattr(topk, name, Recording(getattr(topk, name)))
    for rows, S in [(1, 1100), (3, 2300), (2, 5000), (6, 1024)]:
        run(rand(rows, S, seed=S), 37, "cpu")
    assert len(seen) == 2, seen  # one constexpr set per kernel
