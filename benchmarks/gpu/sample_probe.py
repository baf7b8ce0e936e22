"""What the runtime's `sample` phase is made of: GPU time against host time.

    python benchmarks/gpu/sample_probe.py [--vocab 151936] [--out CSV]

For vanilla (rows [B, V]) and speculative acceptance (rows [B, γ+1, V]) at T 0.6, top-p 0.95,
top-k 20 (the packaged Qwen3-8B set's sampling), each op is timed three ways:
- `eager`: wall time of one eager call followed by a synchronize (what the decode loop pays,
  less its Python bookkeeping), median of 50;
- `graph`: one CUDA-graph replay (the GPU's own time), `kernels.bench`;
- both for `probs_from_logits` as the runtime has it (revision 3: top-p over the top-k
  survivors) and for `full_sort` (`sampling.probs_by_full_sort`), the same distribution as
  revision 2 computed it (top-p by a sort of the whole vocabulary), printed with their largest
  difference.
Run 77 measured revision 2's runtime (its `probs_from_logits` is `full_sort` here).
Prints a table and writes one CSV row per (rows, op, way).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from kernels import bench
from probe_common import write_rows

from vegas_sim.calibrate.sampling import (
    draw,
    probs_by_full_sort,
    probs_from_logits,
    rejection_accept,
)

T, TOP_P, TOP_K = 0.6, 0.95, 20
SHAPES = [(4, 1), (4, 8), (16, 8), (64, 13)]  # (B, rows per request): vanilla, γ 7, γ 12


def eager_ms(fn: Callable[[], Any], reps: int = 50) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def runtime_call(logits: torch.Tensor, gen: torch.Generator) -> Callable[[], Any]:
    """The runtime's sampling work for these rows: a draw (vanilla, one row per request) or
    rejection sampling of the drafts against random draft probabilities (γ+1 rows)."""
    B, n, vocab = logits.shape
    if n == 1:
        return lambda: draw(probs_from_logits(logits[:, 0], T, TOP_P, TOP_K), gen)
    drafts = torch.randint(0, vocab, (B, n - 1), generator=gen, device=logits.device)
    q = torch.softmax(logits[:, : n - 1], dim=-1)
    return lambda: rejection_accept(drafts, q, probs_from_logits(logits, T, TOP_P, TOP_K), gen)


def probe_shape(gen: torch.Generator, B: int, n: int, vocab: int) -> list[dict[str, Any]]:
    logits = 3 * torch.randn(B, n, vocab, generator=gen, device="cuda")
    ops: dict[str, Callable[[], Any]] = {
        "full_sort": partial(probs_by_full_sort, logits, T, TOP_P, TOP_K),
        "probs_from_logits": partial(probs_from_logits, logits, T, TOP_P, TOP_K),
    }
    diff = (ops["probs_from_logits"]() - ops["full_sort"]()).abs().max().item()
    rows, line = [], [f"B={B:2d} rows={n:2d}"]
    for name, fn in ops.items():
        for way, ms in (("eager", eager_ms(fn)), ("graph", bench(fn))):
            rows.append({"batch": B, "rows": n, "op": name, "way": way, "ms": f"{ms:.4f}"})
            line.append(f"{name} {way} {ms:.3f}")
    name = "sample" if n == 1 else "accept"
    ms = eager_ms(runtime_call(logits, gen))
    rows.append({"batch": B, "rows": n, "op": name, "way": "eager", "ms": f"{ms:.4f}"})
    line.append(f"{name} eager {ms:.3f}")
    print("  ".join(line) + f"  (max |dp| {diff:.1e})", flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/sample_probe.csv"))
    args = p.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(5)
    rows = [r for B, n in SHAPES for r in probe_shape(gen, B, n, args.vocab)]
    write_rows(args.out, rows)
    print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
