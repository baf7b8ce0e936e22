"""Where the B 1 verify call's time goes: the split kernel and the split combine timed apart.

    python benchmarks/gpu/b1_breakdown.py [--shapes 1:32768:8,...] [--rounds 3] [--out CSV]

For each (B, C, NQ), collect none, default launch, CUDA-graph replays over rotating caches
(`kernels.min_of_rounds`, fastest of interleaved rounds):
- `op`: verify_attention as the runtime calls it (split kernel + combine);
- `split`: the same call with the combine left out (its graph holds the split kernel only);
- `combine`: the combine alone, on partials of the op's shape (L2-resident, as after the
  split kernel);
- `op 2 keys` / `split 2 keys`: the same launches over a cache of 2 keys, the fixed cost.
`op - split` is what the combine node adds to the op; `bytes / (split - split 2 keys)` is
the split kernel's streaming rate with its fixed cost taken out. Then `op <variant>` for
each launch variant (VARIANTS; one that does not build is reported and skipped), and the
0.85-of-copy time the target allows (copy measured in the same run). Prints a table and
writes one CSV row per (shape, part).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from kernels import (
    DEV,
    HKV,
    HQ,
    copy_bandwidth,
    kv_bytes,
    min_of_rounds,
    verify_call,
    verify_inputs,
)
from probe_common import parse_shapes, write_rows

from vegas_sim.kernels import verify_attention as va

SHAPES = [(1, 32768, 1), (1, 32768, 8), (1, 32768, 16), (1, 131072, 1), (1, 131072, 8),
          (1, 131072, 16)]
# Launch variants timed as whole ops beside the default (run 74's ncu read the split kernel
# 2.8-3.0 us faster with TMA loads at B 1, C 32K, NQ 8 and 16; runs 22-23 had timed TMA there
# +1 % slower under graphs).
VARIANTS: dict[str, dict[str, Any]] = {
    "tma": {"tma": True},
    "tma st4": {"tma": True, "num_stages": 4},
    "tma n64 st4": {"tma": True, "block_n": 64, "num_stages": 4},
    "m64 tma st4": {"min_m": 64, "tma": True, "num_stages": 4},
    "m64 n128 tma": {"min_m": 64, "block_n": 128, "tma": True},
    "no tma": {"tma": False},
}
VARIANT_PARTS = {f"op {label}" for label in VARIANTS}


@contextmanager
def no_combine() -> Iterator[None]:
    """verify_attention without its split combine (the split kernel alone)."""
    saved = va.combine
    va.combine = lambda *args, **kwargs: None
    try:
        yield
    finally:
        va.combine = saved


def split_only(call: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        with no_combine():
            return call()
    return run


def combine_call(B: int, C: int, NQ: int, gen: torch.Generator) -> Callable[[], Any]:
    """The combine of the default launch at (B, C, NQ) on random partials."""
    G = HQ // HKV
    block_m, cfg = va.launch_config(B, HKV, NQ, G, C, va.num_sms(torch.device(DEV)))
    n_part = B * HKV * cfg.splits * block_m
    o_part = torch.randn(n_part, 128, generator=gen, device=DEV)
    lse_part = torch.randn(n_part, generator=gen, device=DEV)
    out = torch.empty(B, NQ, HQ, 128, device=DEV, dtype=torch.bfloat16)
    lse = torch.empty(B, NQ, HQ, device=DEV)
    return lambda: va.combine(out, lse, o_part, lse_part, NQ, HKV, cfg.splits, block_m)


def shape_parts(gen: torch.Generator, B: int, C: int, NQ: int, rounds: int) -> dict[str, float]:
    caches, lens, q = verify_inputs(gen, B, C, NQ)
    two = torch.full_like(lens, 2)
    op = verify_call(caches, q, lens, "none", C)
    # 2 keys, with the launch of the full call (max_len C sizes the splits and tiles)
    op2 = verify_call(caches[:1], q, two, "none", C)
    calls = {"op": op, "split": split_only(op), "combine": combine_call(B, C, NQ, gen),
             "op 2 keys": op2, "split 2 keys": split_only(op2)}
    calls.update(variant_calls(caches, q, lens, C))
    for call in calls.values():
        call()
    torch.cuda.synchronize()
    best = min_of_rounds(calls, rounds)
    del caches, calls
    torch.cuda.empty_cache()
    return best


def variant_calls(caches: Any, q: torch.Tensor, lens: torch.Tensor, C: int
                  ) -> dict[str, Callable[[], Any]]:
    """`op <variant>` calls of the VARIANTS that build and run here."""
    calls = {}
    for label, kw in VARIANTS.items():
        call = verify_call(caches, q, lens, "none", C, **kw)
        try:
            call()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - out of shared memory is an answer
            print(f"  {label}: FAILED {type(e).__name__}: {e}"[:200], flush=True)
            continue
        calls[f"op {label}"] = call
    return calls


def report(B: int, C: int, NQ: int, best: dict[str, float], copy_gbps: float
           ) -> list[dict[str, Any]]:
    """Print one shape's parts and variants; its CSV rows."""
    block_m, cfg = va.launch_config(B, HKV, NQ, HQ // HKV, C, va.num_sms(torch.device(DEV)))
    nbytes = kv_bytes(B, C)

    def of_copy(ms: float) -> float:
        return nbytes / ms / 1e6 / copy_gbps

    stream_gbps = nbytes / (best["split"] - best["split 2 keys"]) / 1e6
    target_us = nbytes / (0.85 * copy_gbps) / 1e3
    print(f"B={B} C={C:6d} NQ={NQ:2d} m{block_m} {cfg.label():18s} target {target_us:.1f}us  "
          + "  ".join(f"{k} {v * 1e3:.1f}" for k, v in best.items() if k not in VARIANT_PARTS)
          + f"  op-split {(best['op'] - best['split']) * 1e3:.1f}"
          f"  split stream {stream_gbps:.0f} GB/s", flush=True)
    print("    " + "  ".join(f"{k} {v * 1e3:.1f}us ({of_copy(v):.3f})"
                             for k, v in best.items() if k == "op" or k in VARIANT_PARTS),
          flush=True)
    return [{"batch": B, "context": C, "n_query": NQ, "launch": f"m{block_m} {cfg.label()}",
             "part": part, "us": f"{ms * 1e3:.2f}", "ratio_copy": f"{of_copy(ms):.4f}"}
            for part, ms in best.items()]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--shapes", default="", help="B:C:NQ,... (default: B 1 at 32K and 128K)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/b1_breakdown.csv"))
    args = p.parse_args()
    gen = torch.Generator(device=DEV).manual_seed(11)
    copy_gbps = copy_bandwidth()
    rows = []
    for B, C, NQ in parse_shapes(args.shapes, SHAPES):
        rows += report(B, C, NQ, shape_parts(gen, B, C, NQ, args.rounds), copy_gbps)
    print(f"copy {copy_gbps:.0f} GB/s", flush=True)
    write_rows(args.out, rows)
    print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
