"""Launch-config choice of verify attention and the fast paths added for the H200 targets.

The config tests pin the behaviour that the H200 measurements asked for (one full wave of
programs, BLOCK_N by M tile, the measured table); the kernel tests run the fast paths (S_max a
multiple of BLOCK_N: unmasked score stores; Collect-2-Query's separate dot for G = 1..8; many
splits with empty ones; scores past cache_lens filled by every split) against the reference.
"""

from __future__ import annotations

import math
import zlib

import pytest
import torch

from tests.kernels.test_attention import OUT_TOL, check_scores, make_kv, rel_err
from tests.kernels.test_selection import check_topk
from vegas_sim.kernels import reference


@pytest.fixture
def va(use_triton: None):  # type: ignore[no-untyped-def]
    from vegas_sim.kernels import verify_attention

    return verify_attention


@pytest.fixture
def vl(use_triton: None):  # type: ignore[no-untyped-def]
    from vegas_sim.kernels import verify_launch

    return verify_launch


def test_choose_splits_fills_one_wave(vl, va) -> None:  # type: ignore[no-untyped-def]
    # Hkv 8 on 132 SMs: B=4 -> 4 splits (128 programs); 5 would need 2 waves (0.65 of copy bandwidth, measured)
    assert vl.choose_splits(32, 131072, 128, 132) == 4
    assert vl.split_cost(32, 131072, 5, 128, 132) > 1.5 * vl.split_cost(32, 131072, 4, 128, 132)
    assert vl.choose_splits(8, 32768, 128, 132) == 16  # B=1: 128 programs
    assert vl.choose_splits(128, 131072, 64, 132) == 1  # B=16
    assert vl.choose_splits(24, 131072, 128, 132) == 11  # B=3: two full waves of 132
    assert vl.choose_splits(8, 100, 128, 132) == 1  # shorter than one tile


@pytest.mark.parametrize("B,keys", [(1, 6586), (1, 360), (4, 1343), (16, 360), (4, 8192),
                                    (1, 33), (2, 16384), (7, 9000), (16, 26246), (64, 40000)])
@pytest.mark.parametrize("block_d,hkv", [(128, 8), (64, 3)])
def test_sparse_launch_fills_one_wave_and_every_split(B: int, keys: int, block_d: int, hkv: int,
                                                      use_triton: None) -> None:
    """Tiles of TILE_ELEMENTS (16 keys at D 128, 32 at D 64), at most PER_SM programs per SM
    (more is a second wave), and no split left empty by the kernel's whole-tile chunks
    (cdiv(cdiv(keys, splits), BLOCK_N) tiles each)."""
    from vegas_sim.kernels import sparse_attention as sa

    splits, block_n = sa.launch_shape(B, hkv, keys, 132, block_d=block_d)
    assert block_n * block_d == sa.TILE_ELEMENTS
    chunk = math.ceil(math.ceil(keys / splits) / block_n) * block_n
    assert math.ceil(keys / chunk) == splits  # every split gets keys
    assert splits == 1 or B * hkv * splits <= sa.PER_SM * 132
    assert splits <= math.ceil(keys / block_n)


def test_sparse_tiles_keep_their_bytes_and_a_larger_tile_fewer_programs(use_triton: None) -> None:
    from vegas_sim.kernels import sparse_attention as sa

    assert [sa.tile_keys(d) for d in (16, 32, 64, 128, 256)] == [128, 64, 32, 16, 16]
    # a 64-key tile at D 128 holds 4 tiles' shared memory: 2 programs per SM, not 8, so
    # at most 2 · 132 / 8 = 33 splits of its 103 tiles: 26 splits of 4 tiles
    assert sa.launch_shape(1, 8, 6586, 132, block_n=64) == (26, 64)
    assert sa.launch_shape(1, 8, 6586, 132) == (103, 16)  # 412 tiles, <= 132 splits: 103 of 4


def test_choose_config_table_and_tiles(vl, va) -> None:  # type: ignore[no-untyped-def]
    wide = vl.VerifyConfig(2, 32, 4, 4, tma=True)  # B=16: 128 heads x 2 splits on 132 SMs
    assert vl.choose_config(16, 8, 16, 4, 32768, 132) == wide
    for nq in (8, 16):  # Collect-2-Query's M 64 tile takes it from NQ·G > 16
        assert vl.choose_config(16, 8, nq, 4, 32768, 132, min_m=64, collect="first_last") == wide
    assert vl.choose_config(4, 8, 16, 4, 131072, 132) == vl.VerifyConfig(8, 32, 4, 4, True)
    # collect "all" was not measured on the wide launch; short calls keep the old one
    assert not vl.choose_config(16, 8, 16, 4, 32768, 132, collect="all").tma
    assert vl.choose_config(4, 8, 16, 4, 32768, 132, collect="first_last").block_n == 64
    # M tile >= 64 (wgmma on Hopper): every NQ <= 16 at G = 4 is one kernel
    assert (vl.choose_config(4, 8, 1, 4, 131072, 132, min_m=64)
            == vl.choose_config(4, 8, 16, 4, 131072, 132, min_m=64))
    for min_m in (16, 64):
        for nq in range(1, 17):
            for group in (1, 2, 4, 8):
                for max_len in (8192, 65536):
                    cfg = vl.choose_config(2, 32 // group, nq, group, max_len, 132, min_m=min_m)
                    block_m = max(min_m, 16, 1 << (nq * group - 1).bit_length())
                    keys = 2 * 32 // group * max_len
                    # 128-key tiles with 4 stages at M >= 64 are out of shared memory
                    assert not (block_m >= 64 and cfg.block_n == 128 and cfg.num_stages >= 4)
                    wide = block_m == 64 and keys >= vl.WIDE_KEYS
                    assert cfg.block_n == (32 if wide else 128 if block_m <= 32
                                           else 64 if block_m <= 64 else 32)
                    assert cfg.tma == (wide or (block_m >= 32 and keys >= vl.TMA_KEYS))
                    assert 1 <= cfg.splits <= vl.MAX_SPLITS
    # the first tuned table entry for M 32 still applies when asked for M 16 tiles, now with TMA
    assert (vl.choose_config(4, 8, 8, 4, 131072, 132, min_m=16)
            == vl.VerifyConfig(4, 128, 4, 3, tma=True))
    # ... and only collect=none takes TMA on the old launch (first_last at M 32 lost, measured)
    assert not vl.choose_config(4, 8, 8, 4, 131072, 132, min_m=16, collect="first_last").tma
    assert not vl.choose_config(4, 8, 1, 4, 131072, 132).tma  # M 16: no gain (measured)


def test_int32_offset_guard(va) -> None:  # type: ignore[no-untyped-def]
    from vegas_sim.errors import UserInputError

    q = torch.zeros(1, 2, 4, 16)
    # a request stride of 2^31 elements, without the memory (token stride 0)
    k = torch.zeros(16).as_strided((1, 2**27, 1, 16), (2**31, 0, 16, 1))
    with pytest.raises(UserInputError, match="2\\^31"):
        va.verify_attention(q, k, k, torch.tensor([8], dtype=torch.int32), 0.25)


FAST_CASES = [
    # B, NQ, Hq, Hkv, D, S_max, lens, collect, splits, block_n
    (2, 8, 8, 1, 32, 128, [128, 77], "first_last", 3, 32),  # G = 8: 2G = 16 dense rows
    (2, 5, 8, 4, 16, 192, [100, 6], "first_last", 7, 16),  # G = 2, empty splits, long fill
    (1, 1, 4, 1, 16, 64, [17], "first_last", 5, 16),  # NQ = 1: R = 1, G = 4
    (2, 3, 4, 4, 16, 96, [96, 40], "all", 2, 32),  # G = 1, S_max % BLOCK_N == 0
    (1, 16, 8, 2, 16, 64, [64], "first_last", 4, 16),  # M = 64, every key in use
    (2, 6, 4, 2, 16, 100, [90, 30], "first_last", 3, 32),  # S_max % BLOCK_N != 0 (masked)
]


# M tile minimum (the collected rows are the first R·G rows of every M tile)
VARIANTS = [{"min_m": 16}, {"min_m": 32}, {"min_m": 64}, {"min_m": 128}, {}]


@pytest.mark.parametrize("variant", VARIANTS, ids=["m16", "m32", "m64", "m128", "default"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", FAST_CASES)
def test_verify_fast_paths_match_reference(case: tuple, dtype: torch.dtype, variant: dict,  # type: ignore[no-untyped-def]
                                           device: str, va, poison: None) -> None:
    B, NQ, Hq, Hkv, D, S, lens, collect, splits, block_n = case
    gen = torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))
    q = torch.randn(B, NQ, Hq, D, generator=gen).to(device=device, dtype=dtype)
    k, v = make_kv(gen, B, S, Hkv, D, dtype, device)
    cl = torch.tensor(lens, dtype=torch.int32, device=device)
    out, lse, scores = va.verify_attention(q, k, v, cl, D ** -0.5, collect, splits=splits,
                                           block_n=block_n, **variant)
    r_out, r_lse, r_scores = reference.verify_attention(q, k, v, cl, D ** -0.5, collect)
    assert rel_err(out, r_out) < OUT_TOL[dtype]
    assert (lse - r_lse).abs().max() < 1e-4 * max(1.0, float(r_lse.abs().max()))
    check_scores(scores, r_scores)


def test_weights_blocks_avoid_masks(use_triton: None) -> None:
    from vegas_sim.kernels import selection

    assert selection.weights_blocks(131072 + 128, 64) == (2048, 16, 8)  # last block masked
    assert selection.weights_blocks(131072, 64) == (2048, 16, 8)
    assert selection.weights_blocks(300, 64) == (512, 64, 8)
    assert selection.weights_blocks(100, 2) == (128, 2, 4)


@pytest.mark.parametrize("S,block_s", [(256, 128), (384, 128), (384, 256), (300, 1024)])
def test_score_weights_block_paths(S: int, block_s: int, device: str, use_triton: None,
                                   poison: None) -> None:
    """S_max a multiple of BLOCK_S (no key mask) or not (last block masked), rank_len far
    below S_max (blocks skipped)."""
    from vegas_sim.kernels import selection

    gen = torch.Generator().manual_seed(S)
    B, R, Hq = 2, 2, 4
    scores = (torch.randn(B, R, Hq, S, generator=gen) * 4).bfloat16()
    scores[1, :, :, 100:] = float("-inf")
    lse = torch.logsumexp(scores.float() * 0.25, -1)
    rank = torch.tensor([S - 3, 60], dtype=torch.int32)
    args = (scores.to(device), lse.to(device), 0.25, rank.to(device))
    got = selection.score_weights(*args, block_s=block_s)
    ref = reference.score_weights(scores, lse, 0.25, rank)
    assert torch.allclose(got.cpu(), ref, rtol=1e-5, atol=1e-9)
    assert (got[1, 60:] == 0).all()


def test_topk_select_equal_budgets(device: str, use_triton: None) -> None:
    from vegas_sim.kernels import ops

    gen = torch.Generator().manual_seed(9)
    w = torch.rand(4, 3, 700, generator=gen)
    w[:, :, 650:] = 0
    budget = torch.full((3,), math.ceil(0.07 * 650), dtype=torch.int32)
    idx = ops.topk_select(w.to(device), budget.to(device))
    check_topk(idx.cpu(), w, budget)


def test_default_min_m_per_collection(vl, va, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """64-row (wgmma) tiles only for Collect-2-Query with more than 16 packed rows."""
    monkeypatch.setattr(vl, "OVERRIDES", vl.Overrides())
    assert vl.default_min_m(8, 4, "first_last") == 64  # NQ 8, G 4: 32 rows
    assert vl.default_min_m(5, 4, "first_last") == 64
    assert vl.default_min_m(4, 4, "first_last") == 16  # 16 rows: M 16 won on the H200
    assert vl.default_min_m(1, 4, "first_last") == 16
    assert vl.default_min_m(8, 4, "none") == 16
    assert vl.default_min_m(8, 4, "all") == 16
    monkeypatch.setattr(vl, "OVERRIDES", vl.read_overrides({"VEGAS_SIM_VERIFY_MIN_M": "32"}))
    assert vl.default_min_m(1, 4, "none") == 32


def test_environment_overrides_read_once_and_checked(vl) -> None:  # type: ignore[no-untyped-def]
    """Every kernel override comes from one read of the environment; a bad value is a user
    error naming the variable."""
    from vegas_sim.errors import UserInputError

    assert vl.read_overrides({}) == vl.Overrides()
    got = vl.read_overrides({"VEGAS_SIM_VERIFY_MIN_M": "64", "VEGAS_SIM_VERIFY_TMA": "0",
                             "VEGAS_SIM_RADIX_TOPK": "0"})
    assert got == vl.Overrides(verify_min_m=64, verify_tma=False, radix_topk=False)
    for name, bad in (("VEGAS_SIM_VERIFY_MIN_M", "48"), ("VEGAS_SIM_VERIFY_TMA", "yes"),
                      ("VEGAS_SIM_RADIX_TOPK", "off")):
        with pytest.raises(UserInputError, match=name):
            vl.read_overrides({name: bad})


# Keep this the last test of the last kernel test file: if the >= 2^31-element cache still
# hits an illegal address (seen once on the H200), the CUDA context is lost and nothing after it runs.
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("NQ,collect", [(1, "none"), (8, "first_last")])
def test_verify_cache_over_2_31_elements(NQ: int, collect: str) -> None:
    """B=16 C=128K (16 × 131200 × 8 × 128 elements > 2^31), default launch, checked on the
    last request, whose keys sit past 2^31 elements from the cache base."""
    from vegas_sim.kernels import ops

    gen = torch.Generator(device="cuda").manual_seed(31)
    B, C, Hq, Hkv, D = 16, 131072, 32, 8, 128
    k = torch.empty(B, C + 128, Hkv, D, device="cuda", dtype=torch.bfloat16)
    v = torch.empty_like(k)
    for b in range(B):  # per request: no single random fill over >= 2^31 elements
        k[b].normal_(generator=gen)
        v[b].normal_(generator=gen)
    q = torch.randn(B, NQ, Hq, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((B,), C, dtype=torch.int32, device="cuda")
    out, lse, scores = ops.verify_attention(q, k, v, lens, D ** -0.5, collect)
    torch.cuda.synchronize()
    last = slice(B - 1, B)
    r_out, r_lse, r_scores = reference.verify_attention(q[last], k[last], v[last], lens[last],
                                                        D ** -0.5, collect)
    assert rel_err(out[last], r_out) < 1e-2
    assert (lse[last] - r_lse).abs().max() < 1e-3
    check_scores(None if scores is None else scores[last], r_scores)


def test_collecting_m64_tiles_get_four_stages_and_nothing_else_changes(vl, va) -> None:  # type: ignore[no-untyped-def]
    # st 4 halved the first_last overhead of the M 64 tile (docs/KERNELS.md)
    assert vl.default_stages("first_last", 64, 64, 3) == vl.STAGES_COLLECT == 4
    assert vl.default_stages("none", 64, 64, 3) == 3  # plain verify keeps its tuned stages
    assert vl.default_stages("all", 64, 64, 3) == 3
    assert vl.default_stages("first_last", 16, 128, 3) == 3  # NQ·G <= 16 keeps the M 16 tile
    assert vl.default_stages("first_last", 64, 128, 2) == 2  # a 128-key tile: no room for 4


def test_launch_config_resolves_the_launchers_defaults(vl, va) -> None:  # type: ignore[no-untyped-def]
    """What verify_attention runs and what the benchmarks label rows with: the M tile by
    collection, the wide launch of long calls, the stages of the *final* key tile, TMA."""
    assert vl.launch_config(16, 8, 8, 4, 32768, 132, "first_last") == (
        64, vl.wide_config(128, 132, 32768))
    assert vl.launch_config(16, 8, 8, 4, 32768, 132) == (
        32, vl.choose_config(16, 8, 8, 4, 32768, 132))
    # a caller's 128-key tile on M 64 keeps 3 stages (4 are out of shared memory) and gets
    # the wave model's split count for that tile
    block_m, cfg = vl.launch_config(4, 8, 8, 4, 32768, 132, "first_last", block_n=128)
    assert (block_m, cfg.block_n, cfg.num_stages) == (64, 128, 3)
    assert cfg.splits == vl.choose_splits(32, 32768, 128, 132)
    assert vl.launch_config(4, 8, 8, 4, 32768, 132, "first_last", splits=7,
                            num_warps=8)[1] == vl.VerifyConfig(7, 64, 8, 4)
    assert vl.launch_config(4, 8, 8, 4, 32768, 132, tma=True)[1].tma
    assert not vl.launch_config(16, 8, 8, 4, 32768, 132, "first_last", tma=False)[1].tma
