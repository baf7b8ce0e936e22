"""Launch policy of verify attention: which tiles, splits, pipeline stages and loads
`verify_attention` runs for a call, and the fallbacks when a launch does not fit the GPU.

Launch config (`choose_config`): `wide_config` for long calls on the M 64 tile (32-key
tiles, two programs per SM, TMA); else a table of configurations measured best on the H200
(`TUNED`), or tile sizes by M and a split count from a wave model (`choose_splits`): the
time of a launch is ~ ceil(programs / SMs) × keys per program, so a split count that leaves a
second, partial wave is slower than one that fills one wave (docs/KERNELS.md, Split counts).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from vegas_sim.errors import UserInputError

NUM_SMS_DEFAULT = 132  # H200; read off the device when there is one


@dataclass(frozen=True)
class Overrides:
    """The kernels' environment overrides, read once at import (`read_overrides`): for
    benchmarking a default against its alternative and for bisecting, never needed to run.

    verify_min_m: VEGAS_SIM_VERIFY_MIN_M, the smallest M tile of every verify call (else
    `default_min_m`); verify_tma: VEGAS_SIM_VERIFY_TMA=0 / 1, K/V by TMA off / on for every
    verify call where `tma_usable` (else by the launch config); radix_topk:
    VEGAS_SIM_RADIX_TOPK=0 sends selection's equal-budget top-k to torch.topk."""

    verify_min_m: int | None = None
    verify_tma: bool | None = None
    radix_topk: bool = True


def read_overrides(env: Mapping[str, str]) -> Overrides:
    """`Overrides` from an environment; a value that is not one of the allowed ones is a
    UserInputError naming the variable."""
    def choice(name: str, allowed: tuple[str, ...]) -> str | None:
        value = env.get(name)
        if value is not None and value not in allowed:
            raise UserInputError(f"{name}={value!r} is not one of {', '.join(allowed)}",
                                 where=f"env {name}", fix=f"set it to one of "
                                 f"{', '.join(allowed)}, or unset it")
        return value

    min_m = choice("VEGAS_SIM_VERIFY_MIN_M", ("16", "32", "64", "128"))
    tma = choice("VEGAS_SIM_VERIFY_TMA", ("0", "1"))
    return Overrides(verify_min_m=None if min_m is None else int(min_m),
                     verify_tma=None if tma is None else tma == "1",
                     radix_topk=choice("VEGAS_SIM_RADIX_TOPK", ("0", "1")) != "0")


OVERRIDES = read_overrides(os.environ)


def interpreted(t: Tensor) -> bool:
    """True when Triton runs in its CPU interpreter (tensors off the GPU)."""
    return t.device.type != "cuda"


def num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return NUM_SMS_DEFAULT


@dataclass(frozen=True)
class VerifyConfig:
    """Launch configuration of `_verify_attention_kernel`; `tma`: K/V tiles by TMA (where the
    device and the cache allow it, see `tma_usable`)."""

    splits: int
    block_n: int
    num_warps: int
    num_stages: int
    tma: bool = False

    def label(self) -> str:
        return (f"s{self.splits} n{self.block_n} w{self.num_warps} st{self.num_stages}"
                + (" tma" if self.tma else ""))


# Measured best on the H200, keyed by
# (SMs, B·Hkv, BLOCK_M, floor(log2(max_len))). `benchmarks/kernels.py --tune` prints entries
# in this format; paste the ones that beat the heuristic here. Long calls on the M 64 tile
# take `wide_config` before this table is looked up, so they need no entry.
TUNED: dict[tuple[int, int, int, int], VerifyConfig] = {
    (132, 32, 32, 17): VerifyConfig(4, 128, 4, 3),  # B=4 C=128K NQ=8: 0.98 of copy (st4: 0.99)
}

# Long launches (keys = B·Hkv·max_len KV rows): from TMA_KEYS, K/V go by TMA for
# collect=none at M >= 32 (faster than the pointer loads there, slower at M 16 and below
# TMA_KEYS). From WIDE_KEYS, the M 64 tile (NQ·G > 32, or Collect-2-Query at NQ·G > 16) takes
# `wide_config`: a 64-key, 4-stage Collect-2-Query launch there holds one issue-bound program
# per SM where collect=none runs two. Evidence: docs/KERNELS.md, TMA and the wide launch.
TMA_KEYS = 2**20
WIDE_KEYS = 2**22


# Programs of the wide launch resident on one SM at a time (its shared memory: 85 KB each),
# and its key tile.
WIDE_PER_SM = 2
WIDE_BLOCK_N = 32


def wide_config(n_heads: int, n_sms: int, max_len: int = 1) -> VerifyConfig:
    """The M 64 launch for long calls: 32-key tiles at 4 stages (85 KB of shared memory, two
    programs per SM), K/V by TMA, splits by `wide_splits`. From WIDE_KEYS it beats the
    TUNED/heuristic launch; below, it loses (docs/KERNELS.md, TMA and the wide launch)."""
    return VerifyConfig(wide_splits(n_heads, max_len, n_sms), WIDE_BLOCK_N, 4, 4, tma=True)


def wide_splits(n_heads: int, max_len: int, n_sms: int) -> int:
    """Split count of the wide launch (n_heads = B·Hkv programs per split): one wave of up to
    WIDE_PER_SM programs on every SM where the heads fit in one (`splits_one_wave`), else the
    wave model of `choose_splits` over those slots (more heads than slots: 1 split left a
    partial last wave, e.g. 384 programs, 1.45 waves, at B 48 Hkv 8; 2 splits fill 2.9)."""
    slots = WIDE_PER_SM * n_sms
    if n_heads <= slots:
        return splits_one_wave(n_heads, n_sms, WIDE_PER_SM)
    return choose_splits(n_heads, max_len, WIDE_BLOCK_N, slots)


def splits_one_wave(n_heads: int, n_sms: int, per_sm: int) -> int:
    """The most splits whose n_heads·splits programs (n_heads = B·Hkv programs per split) fit
    in one wave of per_sm programs on every SM; 1 when n_heads alone exceeds it.

    One wave, not the nearest count: a split count rounded to ~per_sm programs per SM can
    overshoot the slots by up to n_heads / 2 programs, a second wave whose few programs each
    read a full chunk at one program's rate, while one wave with fewer programs than slots
    costs what whole waves predict (docs/KERNELS.md, Split counts). At power-of-two batches with
    Hkv 4 or 8 on 132 SMs the count is the rounded one's; with Hkv 3 it differs at B 16 and 32,
    which the packaged SmolLM2 latency set (C <= 7K) never runs on this launch
    (tests/kernels/test_launch_waves.py checks every packaged grid shape)."""
    return max(1, per_sm * n_sms // n_heads)


# Wave model constants, in keys of one KV head: a program's fixed cost (pipeline fill,
# epilogue) and the combine launch, each as the keys one SM streams in that time. Rough; they
# only break near-ties between split counts (docs/KERNELS.md, Split counts).
PROGRAM_KEYS = 64
COMBINE_KEYS = 192
MAX_SPLITS = 128
SPLIT_GAIN = 0.03


def split_cost(n_heads: int, max_len: int, splits: int, block_n: int, n_sms: int) -> float:
    """Relative time of a launch with `splits` splits: waves × (keys per program + fixed)."""
    chunk = math.ceil(math.ceil(max_len / splits) / block_n) * block_n
    used = math.ceil(max_len / chunk)  # splits that get keys (chunks are whole tiles)
    waves = math.ceil(n_heads * used / n_sms)
    return waves * (chunk + PROGRAM_KEYS) + (COMBINE_KEYS if used > 1 else 0)


def choose_splits(n_heads: int, max_len: int, block_n: int, n_sms: int) -> int:
    """Split count minimising `split_cost`; more splits must win by > SPLIT_GAIN (the model is
    rough, and every split adds partials and scheduling noise). n_heads = B·Hkv programs per
    split. Hkv 8, 132 SMs: B=1 → 16 (one wave of 128), B=3 → 11 (two full waves), B=4 → 4,
    B=16 → 1."""
    max_len = max(1, max_len)
    best, best_cost = 1, math.inf
    for s in range(1, MAX_SPLITS + 1):
        cost = split_cost(n_heads, max_len, s, block_n, n_sms)
        if cost < best_cost * (1.0 - SPLIT_GAIN):
            best, best_cost = s, cost
        if math.ceil(max_len / s) <= block_n:
            break  # more splits only leave some empty
    return best


def tile_config(block_m: int) -> tuple[int, int, int]:
    """(BLOCK_N, warps, stages) by M tile, from the H200 sweep (docs/KERNELS.md, Split
    counts): 128-key tiles and 4 warps for M <= 32, 64-key tiles for M = 64 (128 with 4 stages
    is out of shared memory there), 32-key tiles and 8 warps for M = 128 (G = 8, not
    measured)."""
    if block_m <= 32:
        return 128, 4, 3
    if block_m <= 64:
        return 64, 4, 3
    return 32, 8, 3


# Smallest M tile. 64 = one warpgroup: on Hopper Triton then emits wgmma (the tensor cores read
# K and V straight from shared memory); M 16/32 tiles compile to mma.sync + ldmatrix, and at
# M 32 x N 128 the kernel spills once scores are stored. With M 64 for every NQ the score
# store costs about its bytes and one compiled kernel serves NQ 1..16; the padding costs
# tensor-core FLOPs only. 64 wins with collection at large NQ, 16 without collection and at
# NQ 1: 16 is the default, `default_min_m` makes the per-collection choice (docs/KERNELS.md,
# M tile minimum). Env VEGAS_SIM_VERIFY_MIN_M overrides both (`Overrides`).
MIN_M_DEFAULT = 16


def choose_config(batch: int, hkv: int, n_q: int, group: int, max_len: int,
                  n_sms: int, min_m: int = MIN_M_DEFAULT, collect: str = "none") -> VerifyConfig:
    """Launch config for one verify call: `wide_config` for long calls on the M 64 tile (not
    collect "all", which was not measured), else the `TUNED` entry for this shape or
    heuristics, with TMA for long collect=none calls at M >= 32 (TMA_KEYS)."""
    block_m = max(min_m, 16, next_pow2(n_q * group))
    keys = batch * hkv * max(1, max_len)
    if block_m == 64 and collect != "all" and keys >= WIDE_KEYS:
        return wide_config(batch * hkv, n_sms, max(1, max_len))
    key = (n_sms, batch * hkv, block_m, max(1, max_len).bit_length() - 1)
    if key in TUNED:
        cfg = TUNED[key]
    else:
        block_n, warps, stages = tile_config(block_m)
        cfg = VerifyConfig(choose_splits(batch * hkv, max_len, block_n, n_sms), block_n,
                           warps, stages)
    if collect == "none" and block_m >= 32 and keys >= TMA_KEYS:
        cfg = replace(cfg, tma=True)
    return cfg


def next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


@functools.lru_cache(maxsize=256)
def smaller_configs(cfg: VerifyConfig) -> tuple[VerifyConfig, ...]:
    """cfg, then the same tile with fewer pipeline stages (down to 2), then half the keys per
    tile (down to 16) from cfg's stages down: the launches to try, largest shared-memory
    footprint first, on a GPU that cannot load cfg (`fit.launch_fitted`)."""
    out: list[VerifyConfig] = []
    block_n = cfg.block_n
    while block_n >= 16:
        out += [replace(cfg, block_n=block_n, num_stages=st)
                for st in range(cfg.num_stages, min(cfg.num_stages, 2) - 1, -1)]
        block_n //= 2
    return tuple(out)


# M tile minimum when collecting first_last with more than 16 packed rows (NQ·G > 16): it
# halves the collection's overhead there; at NQ·G <= 16 and without collection M 16 is as
# fast or faster. See docs/KERNELS.md, M tile minimum.
MIN_M_COLLECT = 64


# Pipeline stages of the M 64 tile when it collects first_last (the default_min_m case): 4
# beat 3, 5, 6 and 8 warps (docs/KERNELS.md, M tile minimum). K/V stages of 64 keys are 32 KB
# each: 4 + the Q tile fit the 227 KB of shared memory.
STAGES_COLLECT = 4


def default_stages(collect: str, block_m: int, block_n: int, auto: int) -> int:
    """Pipeline stages when the caller gives none: STAGES_COLLECT for first_last on the
    M 64 x N 64 tile (what default_min_m picks at NQ·G > 16), else `auto` (choose_config)."""
    if collect == "first_last" and block_m == MIN_M_COLLECT and block_n == 64:
        return STAGES_COLLECT
    return auto


def launch_config(batch: int, hkv: int, n_q: int, group: int, max_len: int, n_sms: int,
                  collect: str = "none", *, min_m: int | None = None, splits: int | None = None,
                  block_n: int | None = None, num_warps: int | None = None,
                  num_stages: int | None = None, tma: bool | None = None
                  ) -> tuple[int, VerifyConfig]:
    """(BLOCK_M, config) of one verify call: the caller's knobs where given (None = default),
    else the M tile minimum of `default_min_m`, `choose_config`'s table entry or heuristics, a
    split count refitted to a BLOCK_N the caller chose, and `default_stages` of the final tile.
    What the launcher runs, and what the benchmarks label their rows with."""
    min_m = default_min_m(n_q, group, collect) if min_m is None else min_m
    block_m = max(min_m, 16, next_pow2(n_q * group))
    auto = choose_config(batch, hkv, n_q, group, max_len, n_sms, min_m=min_m, collect=collect)
    block_n = auto.block_n if block_n is None else block_n
    if splits is None:
        splits = (auto.splits if block_n == auto.block_n
                  else choose_splits(batch * hkv, max_len, block_n, n_sms))
    num_warps = auto.num_warps if num_warps is None else num_warps
    if num_stages is None:
        num_stages = default_stages(collect, block_m, block_n, auto.num_stages)
    if tma is None:
        tma = auto.tma if OVERRIDES.verify_tma is None else OVERRIDES.verify_tma
    return block_m, VerifyConfig(splits, block_n, num_warps, num_stages, tma)


def tma_usable(k_cache: Tensor, v_cache: Tensor, block_d: int) -> bool:
    """Whether K/V can be read by TMA: a Hopper-or-later GPU (or the interpreter), triton's
    TensorDescriptor, D a power of two, and 16-byte aligned bases and strides."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    if k_cache.shape[3] != block_d:
        return False
    if k_cache.device.type == "cuda" and torch.cuda.get_device_capability(k_cache.device)[0] < 9:
        return False
    size = k_cache.element_size()
    return all(t.data_ptr() % 16 == 0 and t.stride(0) * size % 16 == 0
               and t.stride(1) * size % 16 == 0 for t in (k_cache, v_cache))


def kv_descriptor(cache: Tensor, block_n: int) -> object:
    """[B, S_max, Hkv·D] view of a [B, S_max, Hkv, D] cache, read in [1, BLOCK_N, D] boxes
    (TMA fills rows past S_max with zeros)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    B, S, Hkv, D = cache.shape
    return TensorDescriptor(cache, [B, S, Hkv * D], [cache.stride(0), cache.stride(1), 1],
                            [1, block_n, D])


def default_min_m(n_q: int, group: int, collect: str) -> int:
    """M tile minimum when the caller gives none: VEGAS_SIM_VERIFY_MIN_M if set, else 64 for
    Collect-2-Query with NQ·G > 16 (wgmma tile: the score store costs about half), else
    16 (mma.sync tiles; fastest without collection and at NQ·G <= 16)."""
    if OVERRIDES.verify_min_m is not None:
        return OVERRIDES.verify_min_m
    if collect == "first_last" and n_q * group > 16:
        return MIN_M_COLLECT
    return 16
