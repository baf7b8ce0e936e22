"""Acceptance at a smaller γ than traced, checked where both were traced.

CPU, seconds. Data: the packaged real-weights set `smollm2-135m-real`, whose longdoc rows at
T 0.6 are traced at γ 12 and at γ 4 over the same prompts and sparsities. Each γ-4 cell's mean
acceptance length (Rao-Blackwellised rates, bonus included) is predicted from its γ-12 cell,
unsmoothed, two ways: each iteration truncated (min(accepted, 4): the rule before) and the
runs walked again at γ 4 (`sim.acceptance_walk.rewalk`, the model's rule). Whole runs and the
first 127 generated tokens (a 128-token request, as the held-out draws run).
Prints the ratio traced / predicted per method and over every cell, writes a CSV.

    PYTHONPATH=. python benchmarks/gamma_walk.py [--out CSV]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.acceptance_dist import TracedCell
from vegas_sim.sim.acceptance_walk import rewalk
from vegas_sim.traces.io import load_trace_set

SET = Path(__file__).resolve().parents[1] / "vegas_sim/traces/default/smollm2-135m-real"
OUTPUT_LENS = (None, 127)


def _cut(cell: TracedCell, output_len: int | None) -> TracedCell:
    return cell if output_len is None else cell.head(output_len)


def cells(acceptance: pd.DataFrame) -> pd.DataFrame:
    """One row per (γ-4 cell, output length): traced, truncated and walked mean lengths."""
    rows = acceptance[(acceptance["workload"] == "longdoc") & (acceptance["temperature"] == 0.6)]
    model = AcceptanceModel.from_traces(rows, "real", smooth=False)
    out = []
    for key, cell in model._cells.items():
        if key.gamma != 4:
            continue
        traced12 = model._cells[key._replace(gamma=12)]
        walked = rewalk(traced12, 4)
        for n in OUTPUT_LENS:
            out.append({"method": key.method, "context": key.bucket, "sparsity": key.sparsity,
                        "output_len": n or 0,
                        "traced": 1 + _cut(cell, n).rates().sum(),
                        "truncated": 1 + _cut(traced12, n).rates()[:4].sum(),
                        "walked": 1 + _cut(walked, n).rates().sum()})
    return pd.DataFrame(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    x = cells(load_trace_set(SET).acceptance)
    x["truncated_ratio"] = x["traced"] / x["truncated"]
    x["walked_ratio"] = x["traced"] / x["walked"]
    cols = ["truncated_ratio", "walked_ratio"]
    for n, part in x.groupby("output_len"):
        print(f"output {'whole runs' if n == 0 else f'{n} tokens'}: traced γ 4 / predicted "
              f"from γ 12, mean over cells")
        print(part.groupby("method")[cols].mean().round(3).to_string())
        print(part[cols].agg(["mean", "median", "min", "max"]).round(3).to_string(), "\n")
    if args.out is not None:
        x.assign(command="PYTHONPATH=. python benchmarks/gamma_walk.py").to_csv(args.out,
                                                                             index=False)


if __name__ == "__main__":
    main()
