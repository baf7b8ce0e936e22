"""Where the KV cache binds, do the analytic and SimPy engines agree, and which does tune use?

The analytic engine's closed form runs the whole batch; the SimPy engine admits requests as
vLLM does (KV blocks) and preempts when the cache is full. On a grid where the cache holds
fewer requests than the batch, the two differ; `tune` then ranks and reports such a cell
with the SimPy engine (`sim.tune`, "KV cache binds"). This prints both engines on a KV-bound
grid of the packaged Qwen3-8B sets on one H200, their ratio, the SimPy engine's mean running
batch, and which engine tune's rule picks for the cell.

    PYTHONPATH=. python benchmarks/kv_bound_engines.py [--out benchmarks/results/kv_bound_engines.csv]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import vegas_sim

GRID = {"batch": "32,64,128", "context": "32K,64K,120K", "gamma": "4,7",
        "sparsity": "0.07", "output_len": "256"}
KEYS = ["method", "gamma", "sparsity", "batch", "context"]


def both_engines(replications: int) -> pd.DataFrame:
    """One row per configuration: the analytic and the SimPy engine's tokens/s side by side."""
    frames = {engine: vegas_sim.sweep(methods=("vegas",), engine=engine, workers=2,
                                      replications=replications, **GRID)
              for engine in ("analytic", "sim")}
    a = frames["analytic"][KEYS + ["throughput_tok_s"]]
    s = frames["sim"][KEYS + ["throughput_tok_s", "mean_running_batch"]]
    rows = a.merge(s, on=KEYS, suffixes=("_analytic", "_sim"))
    rows["analytic_over_sim"] = rows["throughput_tok_s_analytic"] / rows["throughput_tok_s_sim"]
    rows["kv_binds"] = rows["mean_running_batch"] < rows["batch"] - 1e-9
    rows["tune_ranks_with"] = rows["kv_binds"].map({True: "sim", False: "analytic"})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replications", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rows = both_engines(args.replications)
    pd.set_option("display.width", 200)
    print(rows.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    bound, free = rows[rows["kv_binds"]], rows[~rows["kv_binds"]]
    for name, part in (("KV-bound", bound), ("not bound", free)):
        if len(part):
            dev = (part["analytic_over_sim"] - 1).abs() * 100
            print(f"{name}: {len(part)} rows, analytic vs sim |diff| median {dev.median():.1f} %, "
                  f"max {dev.max():.1f} %")
    if args.out is not None:
        rows.to_csv(args.out, index=False)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
