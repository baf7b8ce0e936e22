"""Why does the calibration grid time a MagicDec-stream draft step ~0.9 ms above a Vegas draft
step at the same keys read (qwen3-8b-h200, every (B, C)), when the decode loop does not?

Times, on Qwen3-8B random weights at B = 4, C = 4K: (1) the grid's `measure_drafts` for each
drafting path, in two orders; (2) the draft steps inside whole γ = 7 iterations of the decode
loop (CUDA events, as the grid's phases). Prints ms; run on a GPU:
    python benchmarks/gpu/draft_step_probe.py
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from vegas_sim.calibrate import grid
from vegas_sim.calibrate.runtime import load_model
from vegas_sim.calibrate.specdec import SpecConfig, SpecDecoder
from vegas_sim.calibrate.timers import PhaseTimer

B, C = 4, int(os.environ.get("PROBE_CONTEXT", "4096"))
MODEL = os.environ.get("PROBE_MODEL", "qwen3-8b")
DEVICE = os.environ.get("PROBE_DEVICE", "cuda")
PATHS = {"vegas": ["vegas"], "magicdec-stream": ["magicdec-stream"],
         "magicdec-quest": ["magicdec-quest"]}


def grid_draft_steps(ctx: grid.PointContext, path: str) -> list[tuple[int, float]]:
    rows = grid.measure_drafts(ctx, path, PATHS[path])
    return [(int(r["kv_read"]), round(float(r["ms_median"]), 3)) for r in rows
            if r["phase"] == "draft_step"][:3]


def loop_phases(net: object, method: str, gamma: int = 7, iters: int = 10) -> None:
    timer = PhaseTimer(net.device)  # type: ignore[attr-defined]
    cfg = SpecConfig(method=method, gamma=gamma, sparsity=0.05, temperature=0.6, top_p=0.95,
                     top_k=20)
    dec = SpecDecoder(net, cfg, timer)  # type: ignore[arg-type]
    state = dec.init_state(B, C, C + 64, seed=0)
    dec.prepare_graphs(state)
    for _ in range(3):
        dec.step(state)
    _sync()
    timer.reset()
    t0 = time.perf_counter()
    for _ in range(iters):
        dec.step(state)
    _sync()
    wall = (time.perf_counter() - t0) / iters * 1e3
    samples = timer.samples()
    steps = [ms for name, ms in samples if name == "draft_step"]
    per_phase = {n: round(sum(ms for k, ms in samples if k == n) / iters, 3)
                 for n in sorted({k for k, _ in samples})}
    print(f"loop {method:16s} draft_step median {np.median(steps):.3f} ms "
          f"(first of each iteration {np.median(steps[::gamma]):.3f}); iteration wall "
          f"{wall:.2f} ms; per iteration {per_phase}", flush=True)


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    net, _, _ = load_model(MODEL, weights="random", device=DEVICE)
    plan = grid.default_plan(MODEL, weights="random", sparsity=(0.01, 0.05, 0.2),
                             gamma=(1, 3, 7, 15), reps=3, device=DEVICE)
    ctx = grid.PointContext(net, plan, B, C, seed=1)
    with torch.no_grad():
        for order in (["vegas", "magicdec-stream", "magicdec-quest"],
                      ["magicdec-stream", "vegas"]):
            for path in order:
                print(f"grid {path:16s} (kv_read, ms): {grid_draft_steps(ctx, path)}",
                      flush=True)
        for method in ("vegas", "magicdec-stream", "magicdec-quest"):
            loop_phases(net, method)


if __name__ == "__main__":
    main()
