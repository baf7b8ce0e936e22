"""Fourteenth session: does run 57's sparse finding (one or two warps per program and more
programs per SM beat four warps; results/sparse_probe_warps_h200_run57.csv) carry over to
verify attention where #3 still misses — B 1, C 32K (0.78-0.87 of copy) and Collect-2-Query's
overhead (up to 14 %)? Each shape times the default plain launch ("none"), the default
Collect-2-Query launch, and both collect modes at 1 or 2 warps × 32/64/128-key tiles × the
default split count ×1/2/4 (64/128-key tiles only with collection), timed as the kernel grid
times them (interleaved CUDA-graph rounds, fastest kept; caches rotated past the L2).
One CSV row per (shape, candidate).

    python benchmarks/gpu/warps_probe.py [--rounds 3] [--out FILE.csv] [--shapes B:C:NQ,...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernels import HKV, HQ, kv_bytes
from probe_common import Candidate, add_arguments, parse_shapes, time_shape, write_rows

from vegas_sim.kernels import verify_attention as va

SHAPES = [(1, 32768, 1), (1, 32768, 8), (1, 32768, 16), (16, 32768, 8), (4, 131072, 8),
          (16, 131072, 16)]


def candidates(B: int, C: int, NQ: int) -> list[Candidate]:
    out: list[Candidate] = [("none", "none", {}), ("c2q", "first_last", {})]
    for collect in ("none", "first_last"):
        _, auto = va.launch_config(B, HKV, NQ, HQ // HKV, C, 132, collect, min_m=16)
        tiles = (32, 64, 128) if collect == "none" else (64, 128)
        for warps in (1, 2):
            for n in tiles:
                for f in (1, 2, 4):
                    splits = max(1, round(auto.splits * f))
                    tag = "c2q" if collect == "first_last" else "none"
                    out.append((f"{tag} m16 w{warps} n{n} s{splits}", collect,
                                {"num_warps": warps, "block_n": n, "splits": splits,
                                 "min_m": 16, "num_stages": 3, "tma": False}))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p, "warps_probe.csv")
    args = p.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(7)
    rows: list[dict[str, Any]] = []
    for B, C, NQ in parse_shapes(args.shapes, SHAPES):
        best = time_shape(gen, (B, C, NQ), candidates(B, C, NQ), None, args.rounds)
        base, nbytes = best["none"], kv_bytes(B, C)
        for label, ms in sorted(best.items(), key=lambda kv: kv[1]):
            pct = 100 * (ms / base - 1)
            rows.append({"batch": B, "context": C, "n_query": NQ, "candidate": label,
                         "ms": f"{ms:.5f}", "gbps": f"{nbytes / ms / 1e6:.0f}",
                         "vs_none_pct": f"{pct:.2f}"})
        top = sorted(best.items(), key=lambda kv: kv[1])
        c2q = [kv for kv in top if kv[0].startswith("c2q")]
        print(f"B={B:2d} C={C:6d} NQ={NQ:2d} none {base * 1e3:7.2f} us; fastest: "
              + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in top[:3])
              + f"; c2q default {best['c2q'] / base * 100 - 100:+.1f} %, best c2q "
              f"{c2q[0][0]} {c2q[0][1] / base * 100 - 100:+.1f} %", flush=True)
    write_rows(args.out, rows)
    print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
