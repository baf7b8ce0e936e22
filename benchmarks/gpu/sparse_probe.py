"""Eleventh session: sparse draft attention launches at the mid-size selections where DESIGN's
target, ms <= 1.3 x (selected bytes / copy) + launch, was missed in run 31 (20-27 MB selected:
(ms - launch) / (bytes / copy) 1.3-1.6). Timed as the kernel grid times them (CUDA-graph
replays, fastest of interleaved rounds, index sets and caches rotated past the L2).

`--set launch` (run 32): tiles, stages, warps and split counts. `--set store` (run 46): the
default at two more split counts, and the split kernel alone without its combine (a
diagnostic: wrong output; it shows what the combine costs), also at 2 keys. Run 46 also timed
the partials' store of the whole 16-row M tile against the G real rows that the kernel now
stores (a `store_pad` knob, since removed: results/h200/sparse_store_pad_run46.patch).
`--set heads` (run 54) timed several KV heads per program (`heads_per_program`, one index load
and one contiguous run of HPP·D elements per selected token for HPP heads): slower at all 6
shapes, so the kernel was removed (its source: commit 7bf2d86). `--set pattern`: the default
launch over unsorted random slots (the benchmark's), the same slots sorted, and contiguous runs
of the same length: how much of the mid-size excess is DRAM locality (run 55: ~1 %). `--set
deep`: 16-key tiles and 4-6 pipeline stages, beyond run 32's sweep (run 56: 16-key tiles at 2
warps and 8 programs per SM best at every mid-size selection). `--set warps`: its neighbours
(run 57: 1 warp and 8 programs per SM best at 9 of 10 shapes). `--set w1`: that launch's
neighbours.

    python benchmarks/gpu/sparse_probe.py [--set launch|store|pattern|deep|warps|w1] [--rounds 3]
        [--out F.csv]
        [--shapes B:C:S,...]
"""

from __future__ import annotations

import argparse
import math
import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernels import (
    HQ,
    SCALE,
    D,
    copy_bandwidth,
    kv_bytes,
    make_cache,
    min_of_rounds,
    n_copies,
    random_selection,
    rotating,
    sparse_launch_ms,
    sparse_ratio,
)
from probe_common import write_rows

from vegas_sim.kernels import sparse_attention as sa
from vegas_sim.kernels.verify_attention import splits_per_sm

SHAPES = [(1, 32768, 0.2), (1, 131072, 0.05), (4, 32768, 0.05), (4, 131072, 0.01),
          (16, 32768, 0.01), (1, 32768, 0.01), (4, 32768, 0.2), (16, 131072, 0.05)]
TAIL = 4


def split_kernel_only(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor,
                      n: torch.Tensor, tail: torch.Tensor, lens: torch.Tensor) -> None:
    """The launcher's split kernel at its default launch, without the combine (diagnostic)."""
    B, Hq, Dh = q.shape
    Hkv = k.shape[2]
    splits, block_n = sa.launch_shape(B, Hkv, int(idx.shape[1]) + 32, 132)
    n_part = B * Hkv * splits * 16
    o_part = torch.empty(n_part, Dh, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(n_part, dtype=torch.float32, device=q.device)
    sa._sparse_attention_kernel[(B * Hkv, splits)](
        q, k, v, idx, n, tail, lens, o_part, lse_part, SCALE * 1.4426950408889634, Hq, Hkv,
        splits, idx.stride(0), k.stride(0), k.stride(1), G=Hq // Hkv, D=Dh, BLOCK_M=16,
        BLOCK_N=block_n, BLOCK_D=Dh, INPUT_PRECISION="tf32", UPCAST=False,
        num_warps=sa.NUM_WARPS)


def whole_splits(programs: int, keys: int, block_n: int, per_sm: int) -> int:
    """Splits for ~per_sm programs per SM of the H200 (132 SMs) over `programs` (request,
    head group) pairs, fitted to whole block_n tiles. The split count per head is rounded to
    nearest, as in runs 32-58; sparse_attention.launch_shape now rounds it down (one wave)."""
    return sa.whole_tile_splits(math.ceil(keys / block_n), splits_per_sm(programs, 132, per_sm))


def store_candidates(B: int, keys: int) -> list[tuple[str, dict[str, Any]]]:
    """(label, knobs; "split only" is the diagnostic): see the module docstring."""
    out: list[tuple[str, dict[str, Any]]] = [("default", {})]
    for per_sm in (2, 8):
        splits = whole_splits(B * 8, keys, 32, per_sm)
        out.append((f"n32 st3 {per_sm}/SM s{splits}",
                    {"block_n": 32, "splits": splits, "num_warps": 4}))
    out.append(("split only", {"split_only": True}))
    return out


PATTERNS = ("random", "sorted", "contiguous")


def pattern_candidates(B: int, keys: int) -> list[tuple[str, dict[str, Any]]]:
    """The default launch over the benchmark's unsorted random slots, the same slots sorted
    (the runtime's top-k writes ascending runs), and one contiguous run per request."""
    return [("default" if p == "random" else p, {"pattern": p}) for p in PATTERNS]


def selection(gen: torch.Generator, B: int, C: int, K: int, pattern: str) -> torch.Tensor:
    """int32 [B, K] slots of [0, C) laid out as `pattern` (PATTERNS)."""
    if pattern == "contiguous":
        start = torch.randint(0, C - K + 1, (B, 1), generator=gen, device="cuda")
        return (start + torch.arange(K, device="cuda")).int()
    idx = random_selection(gen, B, C, K)
    return idx.sort(dim=1).values if pattern == "sorted" else idx


def candidates(B: int, keys: int) -> list[tuple[str, dict[str, Any]]]:
    """(label, sparse_draft_attention knobs): the default, then tiles, stages, warps, and split
    counts for 2 or 4 programs per SM over whole tiles (4 warps unless labelled, as run 32 ran
    them when that was the launcher's default)."""
    out: list[tuple[str, dict[str, Any]]] = [("default", {})]
    for n in (32, 64, 128):
        for st in (2, 3, 4):
            for per_sm in (2, 4):
                splits = whole_splits(B * 8, keys, n, per_sm)
                out.append((f"n{n} st{st} {per_sm}/SM s{splits}",
                            {"block_n": n, "num_stages": st, "splits": splits, "num_warps": 4}))
    out.append(("n64 st3 w8", {"block_n": 64, "num_warps": 8}))
    out.append(("n32 st3 w2", {"block_n": 32, "num_warps": 2}))
    return out


Launch = tuple[int, int, int, int]  # BLOCK_N, stages, warps, programs per SM

# `--set deep`: shorter tiles and deeper pipelines than run 32 tried (it stopped at 32-key tiles
# and 4 stages): more of a 3-4 tile split's gathers in flight before its first tile's math
DEEP_LAUNCHES: list[Launch] = [(16, 3, 4, 4), (16, 4, 4, 4), (16, 5, 4, 4), (16, 6, 4, 4),
                               (16, 4, 2, 8), (16, 6, 2, 8), (32, 5, 4, 4), (32, 6, 4, 4),
                               (32, 4, 2, 4), (32, 4, 2, 8)]
# `--set warps`: run 56's best, 16-key tiles at 2 warps and 8 programs per SM, and its
# neighbours: fewer warps and more programs per SM
WARPS_LAUNCHES: list[Launch] = [(16, 4, 2, 8), (16, 3, 2, 8), (16, 2, 2, 8), (16, 3, 2, 6),
                                (16, 3, 2, 12), (16, 4, 2, 12), (16, 3, 2, 16), (16, 3, 1, 8),
                                (16, 3, 1, 16), (16, 4, 1, 16), (32, 3, 2, 8), (32, 2, 2, 8)]
# `--set w1`: run 57's best, 16-key tiles at 1 warp and 8 programs per SM (1.28-1.31 at the
# mid-size selections), and its neighbours: stages against programs resident per SM (a 16-key
# stage of K and V is 8 KB of shared memory; 228 KB per SM)
W1_LAUNCHES: list[Launch] = [(16, 3, 1, 8), (16, 3, 1, 6), (16, 3, 1, 9), (16, 2, 1, 8),
                             (16, 2, 1, 12), (16, 2, 1, 14), (16, 4, 1, 7), (16, 4, 1, 8),
                             (32, 2, 1, 6), (32, 3, 1, 4)]


def launch_candidates(launches: list[Launch], B: int, keys: int
                      ) -> list[tuple[str, dict[str, Any]]]:
    """The default, then each (BLOCK_N, stages, warps, programs per SM) over whole tiles."""
    out: list[tuple[str, dict[str, Any]]] = [("default", {})]
    for n, st, warps, per_sm in launches:
        splits = whole_splits(B * 8, keys, n, per_sm)
        out.append((f"n{n} st{st} w{warps} {per_sm}/SM s{splits}",
                    {"block_n": n, "num_stages": st, "num_warps": warps, "splits": splits}))
    return out


def probe_shape(gen: torch.Generator, B: int, C: int, s: float, rounds: int, copy_bw: float,
                launch: float, which: str) -> list[dict[str, Any]]:
    K = math.ceil(s * C)
    caches = [make_cache(gen, B, C) for _ in range(n_copies(kv_bytes(B, C)))]
    q = torch.randn(B, HQ, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    n = torch.full((B,), K, dtype=torch.int32, device="cuda")
    tail = torch.full((B,), C, dtype=torch.int32, device="cuda")
    lens = tail + TAIL
    sets = []
    for i in range(max(len(caches), n_copies(kv_bytes(B, K)))):
        sets.append((caches[i % len(caches)], random_selection(gen, B, C, K)))
    calls = {}
    pick = {"launch": candidates, "store": store_candidates, "pattern": pattern_candidates,
            "deep": partial(launch_candidates, DEEP_LAUNCHES),
            "warps": partial(launch_candidates, WARPS_LAUNCHES),
            "w1": partial(launch_candidates, W1_LAUNCHES)}[which]
    want = sa.sparse_draft_attention(q, *sets[0][0], sets[0][1], n, tail, lens, SCALE)
    for label, kw in pick(B, K + TAIL):
        pattern = kw.pop("pattern", "random")
        own = sets if pattern == "random" else [
            (kv, selection(gen, B, C, K, pattern)) for kv, _ in sets]
        if kw.pop("split_only", False):
            fns = [partial(split_kernel_only, q, k, v, idx, n, tail, lens)
                   for (k, v), idx in own]
        else:
            fns = [partial(sa.sparse_draft_attention, q, k, v, idx, n, tail, lens, SCALE, **kw)
                   for (k, v), idx in own]
        try:
            got = fns[0]()
            torch.cuda.synchronize()
            if got is not None and pattern != "random":  # other slots: another output
                assert not torch.isnan(got.float()).any()
            elif got is not None:
                err = float((got.float() - want.float()).norm() / want.float().norm())
                if not err < 2e-2:
                    print(f"B={B} C={C} s={s} {label}: WRONG, rel err {err:.3g}", flush=True)
                    continue
            calls[label] = rotating(fns)
        except Exception as e:  # noqa: BLE001 - a launch may not compile
            print(f"B={B} C={C} s={s} {label}: FAILED {type(e).__name__}: {e}"[:300], flush=True)
    best = min_of_rounds(calls, rounds)
    nbytes = kv_bytes(B, K + TAIL)
    rows = []
    for label, ms in sorted(best.items(), key=lambda kv: kv[1]):
        ratio = sparse_ratio(ms, launch, nbytes, copy_bw)
        rows.append({"batch": B, "context": C, "sparsity": s, "candidate": label,
                     "ms": f"{ms:.5f}", "launch_ms": f"{launch:.5f}", "target_ratio": f"{ratio:.3f}"})
        print(f"B={B:2d} C={C:6d} s={s:<5} {label:22s} {ms * 1e3:7.2f} us  "
              f"(ms - launch) / (bytes / copy) {ratio:.2f}", flush=True)
    del caches, sets, calls
    torch.cuda.empty_cache()
    return rows


def launch_diagnostic(gen: torch.Generator) -> list[dict[str, Any]]:
    """The 2-key op's split kernel alone."""
    q1 = torch.randn(1, HQ, D, device="cuda", dtype=torch.bfloat16)
    k1, v1 = make_cache(gen, 1, 64)
    one = torch.ones(1, dtype=torch.int32, device="cuda")
    idx1 = torch.zeros(1, 1, dtype=torch.int32, device="cuda")
    calls = {"2 keys split only": partial(split_kernel_only, q1, k1, v1, idx1, one, one, one + 1)}
    rows = []
    for label, ms in min_of_rounds({k: rotating([f]) for k, f in calls.items()}, 3).items():
        print(f"{label:22s} {ms * 1e3:7.2f} us", flush=True)
        rows.append({"batch": 1, "context": 2, "sparsity": "", "candidate": label,
                     "ms": f"{ms:.5f}", "launch_ms": "", "target_ratio": ""})
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("sparse_probe.csv"))
    p.add_argument("--shapes", default="", help="B:C:S,... (default: SHAPES)")
    p.add_argument("--set", dest="which", choices=("launch", "store", "pattern", "deep", "warps", "w1"),
                   default="pattern")
    args = p.parse_args()
    shapes = SHAPES if not args.shapes else [
        (int(b), int(c), float(s)) for b, c, s in (t.split(":") for t in args.shapes.split(","))]
    copy_bw = copy_bandwidth()
    gen = torch.Generator(device="cuda").manual_seed(2)
    launch = sparse_launch_ms(gen)
    print(f"copy {copy_bw:.0f} GB/s, launch (2 keys) {launch * 1e3:.2f} us", flush=True)
    rows = []
    if args.which == "store":
        rows += launch_diagnostic(gen)
    for B, C, s in shapes:
        rows += probe_shape(gen, B, C, s, args.rounds, copy_bw, launch, args.which)
    write_rows(args.out, rows)
    print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
