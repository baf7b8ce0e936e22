"""The fp8 log-domain score format (reference.LogScores) against the bf16 raw scores.

CPU: small shapes under TRITON_INTERPRET=1. The kernel's m is its split's running maximum, so
it is compared with the reference's tile maximum through the invariants of the contract
(m >= the tile's largest logit, <= the row's) and through the decoded logits d + m.
"""

from __future__ import annotations

import math

import pytest
import torch

from vegas_sim.errors import UserInputError
from vegas_sim.kernels import ops, reference
from vegas_sim.kernels.reference import FP8_MASKED, SCORE_TILE, LogScores

LOG2E = math.log2(math.e)
# e4m3 rounds to nearest with three mantissa bits: |error| <= 2^-4 · |d|
E4M3_REL = 2.0 ** -4
# cases: B, NQ, Hq, Hkv, D, S_max, lens, collect, launch knobs
CASES = [
    (2, 5, 8, 2, 32, 160, [150, 70], "first_last", {"splits": 1, "block_n": 32}),
    (2, 5, 8, 2, 32, 160, [150, 70], "first_last", {"splits": 2, "block_n": 64}),
    # S_max not a multiple of BLOCK_N (the masked S_max end) and more splits than tiles
    (1, 3, 4, 2, 32, 100, [61], "all", {"splits": 3, "block_n": 32}),
]


def peaked_inputs(case: tuple, seed: int) -> tuple[torch.Tensor, ...]:
    """q, k, v, cache_lens with a few keys aligned to the queries, so the softmax is peaked
    (as real attention is) rather than flat."""
    B, NQ, Hq, Hkv, D, S, lens, _collect, _kw = case
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, NQ, Hq, D, generator=gen)
    k = torch.randn(B, S, Hkv, D, generator=gen)
    v = torch.randn(B, S, Hkv, D, generator=gen)
    G = Hq // Hkv
    for b in range(B):
        hot = torch.randint(0, lens[b] - NQ, (6,), generator=gen)
        for j, pos in enumerate(hot.tolist()):
            k[b, pos] += 0.5 * (1 + j) * q[b, 0, ::G]  # each KV head aligned to its first q head
    return (q.bfloat16(), k.bfloat16(), v.bfloat16(), torch.tensor(lens, dtype=torch.int32))


def fp8_launch(case: tuple, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               lens: torch.Tensor, score_format: str) -> tuple:
    from vegas_sim.kernels import verify_attention as tri

    D, collect, kw = case[4], case[7], case[8]
    return tri.verify_attention(q, k, v, lens, D ** -0.5, collect, score_format=score_format,
                                **kw)


@pytest.mark.parametrize("case", CASES)
def test_fp8_kernel_matches_reference(case: tuple, use_triton: None, poison: None) -> None:
    q, k, v, lens = peaked_inputs(case, 1)
    D, collect = case[4], case[7]
    out, lse, sc = fp8_launch(case, q, k, v, lens, "fp8")
    out16, lse16, _ = fp8_launch(case, q, k, v, lens, "bf16")
    # the softmax is untouched: the same launch gives the same output in both formats
    assert torch.equal(out, out16) and torch.equal(lse, lse16)
    _, _, ref = reference.verify_attention(q, k, v, lens, D ** -0.5, collect,
                                           score_format="fp8")
    check_fp8_scores(sc, ref)


def check_fp8_scores(sc: object, ref: object) -> None:
    """The kernel's fp8 scores against the reference's (module docstring)."""
    assert isinstance(sc, LogScores) and isinstance(ref, LogScores)
    assert sc.d.dtype == torch.float8_e4m3fn and sc.m.shape == ref.m.shape
    d, rd = sc.d.float(), ref.d.float()
    assert not torch.isnan(d).any() and not torch.isnan(sc.m).any()
    assert (d <= 0).all()
    assert torch.equal(d == FP8_MASKED, rd == FP8_MASKED)  # same masked keys
    # m: between the tile's max and the row's; -inf only on tiles with no visible key (a
    # BLOCK_N tile wider than SCORE_TILE writes its running max to an empty sub-tile too)
    fin = torch.isfinite(ref.m)
    assert torch.isfinite(sc.m[fin]).all()
    assert (torch.isfinite(sc.m) | torch.isinf(ref.m)).all()
    row_max = ref.m.amax(-1, keepdim=True).expand_as(ref.m)
    assert (sc.m[fin] >= ref.m[fin] - 1e-3).all() and (sc.m[fin] <= row_max[fin] + 1e-3).all()
    x, rx = reference.log_scores_logits(sc), reference.log_scores_logits(ref)
    vis = torch.isfinite(rx)
    tol = E4M3_REL * (d.abs() + rd.abs()) + 2e-2
    assert ((x - rx).abs()[vis] <= tol[vis]).all()


def topk_sets(w: torch.Tensor, k: int) -> list[set[int]]:
    return [set(torch.topk(row, k).indices.tolist()) for row in w]


def test_fp8_weights_keep_the_bf16_selection(use_triton: None, poison: None) -> None:
    case = CASES[0]
    q, k, v, lens = peaked_inputs(case, 2)
    NQ, D = case[1], case[4]
    _, lse, sc8 = fp8_launch(case, q, k, v, lens, "fp8")
    _, _, sc16 = fp8_launch(case, q, k, v, lens, "bf16")
    lse_rows = lse[:, [0, NQ - 1]]
    rank = lens - NQ + 1
    w8 = ops.score_weights(sc8, lse_rows, D ** -0.5, rank)
    w16 = ops.score_weights(sc16, lse_rows, D ** -0.5, rank)
    ref8 = reference.score_weights(sc8, lse_rows, D ** -0.5, rank)
    assert torch.allclose(w8, ref8, rtol=1e-5, atol=1e-9)  # the kernel reads what it wrote
    for b, r in enumerate(rank.tolist()):
        assert (w8[b, r:] == 0).all() and (w8[b, :r] >= reference.WEIGHT_FLOOR).all()
        # the keys that carry the weight keep it within e4m3's rounding (2^(2^-4·|d|))
        big = w16[b, :r] >= 1e-2 * w16[b, :r].max()
        assert big.sum() >= 6
        ratio = w8[b, :r][big] / w16[b, :r][big]
        assert ((ratio - 1).abs() < 0.15).all(), ratio
        # the top-k sets: heavy overlap, and the fp8 set keeps the bf16 set's weight mass
        kk = max(8, r // 10)
        s8, s16 = topk_sets(w8[b:b + 1, :r], kk)[0], topk_sets(w16[b:b + 1, :r], kk)[0]
        assert len(s8 & s16) >= 0.8 * kk, (len(s8 & s16), kk)
        mass8 = float(w16[b, sorted(s8)].sum())
        mass16 = float(w16[b, sorted(s16)].sum())
        assert mass8 >= 0.99 * mass16, (mass8, mass16)


def test_fp8_masked_keys_weigh_nothing(use_triton: None, poison: None) -> None:
    """Row 0 sees keys [0, L − NQ]; ranked over the whole S_max, its masked keys (the other
    rows' keys, the fill past cache_lens) get the floor; visible keys more."""
    case = CASES[1]
    q, k, v, lens = peaked_inputs(case, 3)
    NQ, D, S = case[1], case[4], case[5]
    _, lse, sc8 = fp8_launch(case, q, k, v, lens, "fp8")
    lse_rows = lse[:, [0, NQ - 1]]
    rank = torch.full_like(lens, S)
    rows = torch.zeros(2, dtype=torch.int64)
    for w in (ops.score_weights(sc8, lse_rows, D ** -0.5, rank, rows),
              reference.score_weights(sc8, lse_rows, D ** -0.5, rank, rows)):
        for b, L in enumerate(lens.tolist()):
            assert (w[b, L - NQ + 1:] == reference.WEIGHT_FLOOR).all()
            assert (w[b, : L - NQ + 1] > reference.WEIGHT_FLOOR).all()
            assert float(w[b].sum()) == pytest.approx(1.0, abs=0.05)  # row 0's softmax


def test_fp8_masked_d_weighs_nothing_whatever_m(use_triton: None, poison: None) -> None:
    """d = -448 is a masked key even under an m far above the lse (a tile's m only bounds
    its visible keys): weight 0, not exp2(-448 + m − lse)."""
    S = 2 * SCORE_TILE
    d = torch.full((1, 1, 1, S), FP8_MASKED)
    d[..., SCORE_TILE] = 0.0
    d[..., SCORE_TILE + 1] = -1.0
    m = torch.tensor([[[[500.0, 0.0]]]])
    sc = LogScores(d.to(torch.float8_e4m3fn), m)
    lse = torch.zeros(1, 1, 1)
    rank = torch.tensor([S], dtype=torch.int32)
    for w in (ops.score_weights(sc, lse, 1.0, rank), reference.score_weights(sc, lse, 1.0, rank)):
        assert (w[0, :SCORE_TILE] == reference.WEIGHT_FLOOR).all()
        assert w[0, SCORE_TILE].item() == 1.0 and w[0, SCORE_TILE + 1].item() == 0.5
        assert (w[0, SCORE_TILE + 2:] == reference.WEIGHT_FLOOR).all()


def test_to_log_scores_reference() -> None:
    """The reference encoding by hand: tile max -> d 0, masked -> -448 with m -inf on an
    empty tile, and the S_max end of a partial tile."""
    S = SCORE_TILE + 5
    s = torch.full((1, 1, 1, S), float("-inf"))
    s[..., 3] = 2.0
    s[..., 4] = 1.0
    enc = reference.to_log_scores(s, 1.0)
    assert enc.m.shape == (1, 1, 1, 2)
    assert enc.m[..., 0].item() == pytest.approx(2.0 * LOG2E) and enc.m[..., 1].item() == -math.inf
    d = enc.d.float()
    assert d[..., 3].item() == 0.0
    assert d[..., 4].item() == pytest.approx(-LOG2E, rel=E4M3_REL)
    assert (d[..., 5:] == FP8_MASKED).all() and (d[..., :3] == FP8_MASKED).all()
    x = reference.log_scores_logits(enc)
    assert x[..., 3].item() == pytest.approx(2.0 * LOG2E) and x[..., 0].item() == -math.inf


def test_ops_checks_fp8_buffers() -> None:
    B, NQ, Hq, Hkv, D, S = 1, 3, 4, 2, 16, 64
    q = torch.randn(B, NQ, Hq, D)
    k = torch.randn(B, S, Hkv, D)
    lens = torch.tensor([40], dtype=torch.int32)
    good = ops.empty_scores((B, 2, Hq), S, "fp8", "cpu")
    assert isinstance(good, LogScores)
    _, lse, sc = ops.verify_attention(q, k, k, lens, 1.0, "first_last", scores_out=good,
                                      score_format="fp8")
    assert sc is good
    with pytest.raises(UserInputError, match="score format"):
        ops.verify_attention(q, k, k, lens, 1.0, "first_last", score_format="fp4")
    bad_m = LogScores(good.d, torch.empty(B, 2, Hq, 1))
    with pytest.raises(UserInputError, match="LogScores"):
        ops.verify_attention(q, k, k, lens, 1.0, "first_last", scores_out=bad_m,
                             score_format="fp8")
    bf16 = torch.empty(B, 2, Hq, S, dtype=torch.bfloat16)
    with pytest.raises(UserInputError, match="LogScores"):
        ops.verify_attention(q, k, k, lens, 1.0, "first_last", scores_out=bf16,
                             score_format="fp8")
    with pytest.raises(UserInputError, match="bf16"):
        ops.verify_attention(q, k, k, lens, 1.0, "first_last", scores_out=good)
    bad_d = LogScores(good.d.float(), good.m)
    with pytest.raises(UserInputError, match="LogScores"):
        ops.score_weights(bad_d, lse[:, [0, NQ - 1]], 1.0, lens)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("B,NQ,C,knobs", [
    (4, 8, 32768, {}), (2, 5, 32768, {"min_m": 16}), (1, 1, 32768, {}),
    (1, 16, 32768, {"splits": 64, "block_n": 64}),
    (16, 8, 32768, {}),  # wide_config: M 64, 32-key TMA tiles
    (12, 7, 49152, {}),
])
def test_fp8_scores_gpu_real_shapes(B: int, NQ: int, C: int, knobs: dict,
                                    poison: None) -> None:
    """Qwen3-8B heads: the fp8 launch against the reference and against the bf16 launch
    (same output and lse; weights whose top-k keeps the bf16 top-k's mass)."""
    from tests.kernels.test_attention import verify_gpu_inputs
    from vegas_sim.kernels import verify_attention as tri

    D = 128
    q, k, v, lens = verify_gpu_inputs(torch.Generator(device="cuda").manual_seed(B * 100 + NQ),
                                      B, NQ, C, (32, 8, D))
    out, lse, sc = tri.verify_attention(q, k, v, lens, D ** -0.5, "first_last",
                                        score_format="fp8", **knobs)
    out16, lse16, sc16 = tri.verify_attention(q, k, v, lens, D ** -0.5, "first_last", **knobs)
    # the same softmax (compiled apart, so equal up to the compiler's reduction order)
    assert torch.allclose(out.float(), out16.float(), rtol=1e-2, atol=1e-3)
    assert (lse - lse16).abs().max() < 1e-4
    _, _, ref = reference.verify_attention(q, k, v, lens, D ** -0.5, "first_last",
                                           score_format="fp8")
    check_fp8_scores(sc, ref)
    assert sc is not None and sc16 is not None
    rows = [0, NQ - 1] if NQ > 1 else [0]
    rank = lens - NQ + 1
    w8 = ops.score_weights(sc, lse[:, rows], D ** -0.5, rank)
    w16 = ops.score_weights(sc16, lse[:, rows], D ** -0.5, rank)
    assert torch.allclose(w8, reference.score_weights(sc, lse[:, rows], D ** -0.5, rank),
                          rtol=1e-4, atol=1e-12)
    for b, r in enumerate(rank.tolist()):
        kk = max(256, r // 14)
        top8 = torch.topk(w8[b, :r], kk).indices
        top16 = torch.topk(w16[b, :r], kk).indices
        assert float(w16[b, top8].sum()) >= 0.99 * float(w16[b, top16].sum())
        same = len(set(top8.tolist()) & set(top16.tolist()))
        assert same >= 0.85 * kk, (same, kk)
