"""The loop both verify probes share (c2q_probe.py, tma_probe.py): for each shape, every
candidate launch against collect="none", timed as the kernel grid times them
(`kernels.min_of_rounds`: interleaved CUDA-graph rounds, fastest kept; caches rotated past
the L2), one CSV row per (shape, candidate)."""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernels import HKV, HQ, kv_bytes, min_of_rounds, verify_call, verify_inputs

Shape = tuple[int, int, int]  # B, C, NQ
Candidate = tuple[str, str, dict[str, Any]]  # label, collect, verify_attention knobs
Candidates = Callable[[int, int], list[Candidate]]  # (B, NQ) -> the launches to time


def add_arguments(p: argparse.ArgumentParser, default_out: str) -> None:
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path(default_out))
    p.add_argument("--shapes", default="", help="B:C:NQ,... (default: the probe's SHAPES)")
    p.add_argument("--candidates", default="", help="labels, comma-separated (default: all)")


def parse_shapes(text: str, default: list[Shape]) -> list[Shape]:
    if not text:
        return default
    return [(int(b), int(c), int(nq)) for b, c, nq in (t.split(":") for t in text.split(","))]


def timed_calls(B: int, C: int, NQ: int, caches: Any, lens: torch.Tensor, q: torch.Tensor,
                candidates: list[Candidate], wanted: set[str] | None
                ) -> dict[str, Callable[[], Any]]:
    """The candidates that compile and run once, as rotating verify calls."""
    calls = {}
    for label, collect, kw in candidates:
        if wanted is not None and label not in wanted:
            continue
        try:
            call = verify_call(caches, q, lens, collect, C, **kw)
            call()
            torch.cuda.synchronize()
            calls[label] = call
        except Exception as e:  # noqa: BLE001 - a candidate may not compile
            print(f"B={B} C={C} NQ={NQ} {label}: FAILED {type(e).__name__}: {e}"[:300],
                  flush=True)
    return calls


def time_shape(gen: torch.Generator, shape: Shape, candidates: list[Candidate],
               wanted: set[str] | None, rounds: int) -> dict[str, float]:
    """Fastest ms of each candidate that runs at one (B, C, NQ), on fresh inputs freed after."""
    B, C, NQ = shape
    caches, lens, q = verify_inputs(gen, B, C, NQ)
    calls = timed_calls(B, C, NQ, caches, lens, q, candidates, wanted)
    best = min_of_rounds(calls, rounds)
    del caches, calls
    torch.cuda.empty_cache()
    return best


def run_probe(args: argparse.Namespace, shapes: list[Shape], candidates: Candidates,
              pct_column: str = "overhead_pct") -> int:
    """Time every shape's candidates against the one labelled "none"; write args.out."""
    wanted = set(args.candidates.split(",")) | {"none"} if args.candidates else None
    gen = torch.Generator(device="cuda").manual_seed(7)
    rows: list[dict[str, Any]] = []
    for B, C, NQ in shapes:
        best = time_shape(gen, (B, C, NQ), candidates(B, NQ), wanted, args.rounds)
        base = best["none"]
        for label, ms in best.items():
            gbps = kv_bytes(B, C) / ms / 1e6
            pct = 100 * (ms / base - 1)
            rows.append({"batch": B, "context": C, "n_query": NQ, "candidate": label,
                         "ms": f"{ms:.5f}", "gbps": f"{gbps:.0f}", pct_column: f"{pct:.2f}"})
            print(f"B={B:2d} C={C:6d} NQ={NQ:2d} {label:18s} {ms:.4f} ms {gbps:6.0f} GB/s "
                  f"{pct:+6.1f} % vs none", flush=True)
    write_rows(args.out, rows)
    print(f"HQ {HQ} HKV {HKV}; wrote {args.out}", flush=True)
    return 0


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """A probe's CSV: one row per dict, the first row's keys as the header."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
