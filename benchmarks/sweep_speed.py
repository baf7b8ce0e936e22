"""Time a 1,000-configuration analytic sweep on all local cores (target: <= 60 s on 2 cores).

    python benchmarks/sweep_speed.py [--workers N]

Uses a synthetic trace set (qwen3-8b shape); prints the measured time and its ratio to the
target. Grid: 2 methods × γ 1..10 × 10 sparsities × batch {1, 4, 16, 64} × context {4K, 32K}
with output 1024 (1,600), the first 1,000 of them in grid order.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from vegas_sim import api
from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.sweep import SweepGrid, sweep
from vegas_sim.traces.synthetic import make_synthetic_trace_set

TARGET_S = 60.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ts = make_synthetic_trace_set(Path(tmp) / "ts", gammas=(2, 4, 8, 12),
                                      sparsities=(0.01, 0.05, 0.1, 0.2),
                                      contexts=(4096, 32768), batches=(1, 16, 64))
        latency = api.fit_latency(ts)
        acceptance = AcceptanceModel.from_traces(ts.acceptance, ts.weights_kind)
    sparsity = (0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.1, 0.15)
    grid = SweepGrid(methods=("vegas", "magicdec-stream"), gamma=tuple(range(1, 11)),
                     sparsity=sparsity, batch=(1, 4, 16, 64), context=(4096, 32768),
                     output_len=(1024,), include_vanilla=False)
    # 2 · 10 · 10 · 4 · 2 = 1,600; take the first 1,000 in grid order for an exact count.
    scenarios = grid.scenarios()[:1000]
    t0 = time.perf_counter()
    table = sweep(scenarios, latency, acceptance, engine="analytic", workers=args.workers)
    wall = time.perf_counter() - t0
    print(f"analytic sweep: {len(table)} configurations, {args.workers} workers, "
          f"{wall:.1f} s (target {TARGET_S:.0f} s on 2 cores; ratio {wall / TARGET_S:.2f})")


if __name__ == "__main__":
    main()
