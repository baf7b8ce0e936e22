"""Fourteenth session: how far the packaged qwen3-8b-h200 draft steps (measured with run 33's
sparse launch rule) are from the runtime with the one-warp launch of run 59. Times the grid's
own Vegas draft-step rows (`grid.measure_drafts`, sparsities 1 / 5 / 20 %) on Qwen3-8B random
weights at a few (B, C), alternating the rules in one process (this code's, run 33's, and run
59's 16-key tiles at every head dim; runs 62 and 64 compared only the first two, when run 59's
was this code's), and prints ms per kv_read. `--model smollm2-135m` does the same for the SmolLM2 set's shape (random
weights: latency does not depend on their values). Run on a GPU:

    python benchmarks/gpu/sparse_launch_ab.py [--model qwen3-8b|smollm2-135m]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch

from vegas_sim.calibrate import grid
from vegas_sim.calibrate.runtime import load_model
from vegas_sim.kernels import sparse_attention as sa

RULES = ("new", "old", "run59")
POINTS = {"qwen3-8b": [(4, 32768), (4, 131040), (16, 32768), (1, 131040)],
          "smollm2-135m": [(1, 4096), (16, 4096), (64, 4096), (32, 7168)]}


def run33_launch(batch: int, hkv: int, max_keys: int, n_sms: int, **_: Any) -> tuple[int, int]:
    """Run 33's rule: up to 2^15 keys in all, 32-key tiles at ~4 programs per SM over whole
    tiles; above, 64-key tiles at ~2 waves (both at 4 warps, see `old_rule`)."""
    if batch * max_keys <= 2**15:
        want = max(1, round(4 * n_sms / max(1, batch * hkv)))
        return sa.whole_tile_splits(math.ceil(max_keys / 32), want), 32
    want = max(1, math.ceil(2 * n_sms / max(1, batch * hkv)))
    return int(min(want, max(1, max_keys // 64))), 64


def run59_launch(batch: int, hkv: int, max_keys: int, n_sms: int, **_: Any) -> tuple[int, int]:
    """Run 59's rule: 16-key tiles at every head dim, 8 programs per SM (one warp)."""
    want = max(1, 8 * n_sms // max(1, batch * hkv))
    return sa.whole_tile_splits(math.ceil(max_keys / 16), want), 16


@contextmanager
def rule(name: str) -> Iterator[None]:
    """The launcher with `name`'s launch: "new" (this code's), "run59" or "old" (run 33's)."""
    shape, call = sa.launch_shape, sa.sparse_draft_attention
    if name == "old":
        sa.launch_shape = run33_launch  # type: ignore[assignment]
        sa.sparse_draft_attention = partial(call, num_warps=4)  # type: ignore[assignment]
    elif name == "run59":
        sa.launch_shape = run59_launch  # type: ignore[assignment]
    try:
        yield
    finally:
        sa.launch_shape, sa.sparse_draft_attention = shape, call  # type: ignore[assignment]


def draft_rows(ctx: grid.PointContext) -> dict[int, float]:
    rows: list[dict[str, Any]] = grid.measure_drafts(ctx, "vegas", ["vegas"])
    out: dict[int, list[float]] = {}
    for r in rows:
        if r["phase"] == "draft_step":
            out.setdefault(int(r["kv_read"]), []).append(float(r["ms_median"]))
    return {k: min(v) for k, v in out.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(POINTS), default="qwen3-8b")
    model = p.parse_args().model
    net, _, _ = load_model(model, weights="random", device="cuda")
    plan = grid.default_plan(model, weights="random", sparsity=(0.01, 0.05, 0.2),
                             gamma=(1, 3, 7, 15), reps=3, device="cuda")
    with torch.no_grad():
        for B, C in POINTS[model]:
            ctx = grid.PointContext(net, plan, B, C, seed=1)
            runs: dict[str, list[dict[int, float]]] = {name: [] for name in RULES}
            for name in RULES * 2:
                with rule(name):
                    runs[name].append(draft_rows(ctx))
            for kv in sorted(runs["new"][0]):
                ms = {name: min(r[kv] for r in runs[name]) for name in RULES}
                print(f"B={B:2d} C={C:6d} kv_read {kv:6d}: " + ", ".join(
                    f"{name} {ms[name]:.3f} ms" for name in RULES)
                    + f", new/old {ms['new'] / ms['old']:.4f}", flush=True)
            del ctx
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
