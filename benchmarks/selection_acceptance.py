"""Which KV selection drafts best, on the two real models' traces, beside the Vegas paper's
acceptance claims (CPU; the packaged real sets' fitted acceptance, no anchors):

- Table 1 (LongBench-v2, 7 % of the KV): Collect-2-Query (the first draft and the bonus row,
  `vegas`) accepts about as many drafts as collecting every row (`vegas-all`);
- Figure 10a: Vegas accepts more than SpecExtend (the last accepted token's selection);
- Figure 2 (γ 5): Quest accepts 22 % more tokens per iteration (bonus included) than Stream.

    PYTHONPATH=. python benchmarks/selection_acceptance.py --out benchmarks/results/selection_acceptance.csv

Accepted drafts per iteration (acceptance length − 1) at s 0.07, context 4K, T 0 and 0.6, for
the long-context workloads both sets traced; the ratios are printed per row and as medians.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import pandas as pd

from vegas_sim import api
from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.traces.io import load_trace_set

SETS = ("smollm2-135m-real", "gemma3-270m-real")
WORKLOADS = ("longdoc", "recall", "code-long", "chat-long")
METHODS = ("vegas", "vegas-all", "specextend", "magicdec-stream", "magicdec-quest")
SPARSITY, CONTEXT = 0.07, 4096
RATIOS = {  # name: (numerator, denominator, gamma, counted as)
    "vegas / vegas-all, γ 7 (Table 1: comparable)": ("vegas", "vegas-all", 7, "accepted"),
    "vegas / specextend, γ 7 (Figure 10a: > 1)": ("vegas", "specextend", 7, "accepted"),
    "quest / stream, γ 5, bonus included (Figure 2: 1.22)": ("magicdec-quest", "magicdec-stream",
                                                              5, "length"),
}


def lengths(model: AcceptanceModel, workload: str, temperature: float,
            gamma: int) -> dict[str, float]:
    """Mean acceptance length (bonus included) of every method in one cell."""
    return {m: model.lookup(m, gamma, SPARSITY, CONTEXT, workload=workload,
                            temperature=temperature).mean_length for m in METHODS}


def rows_of(set_name: str) -> list[dict[str, object]]:
    model = api.fit_acceptance(load_trace_set(set_name))
    rows: list[dict[str, object]] = []
    for workload in WORKLOADS:
        for temperature in (0.0, 0.6):
            by_gamma = {g: lengths(model, workload, temperature, g) for g in (5, 7)}
            row: dict[str, object] = {"set": set_name, "workload": workload,
                                      "temperature": temperature}
            row.update({f"{m} accepted γ7": round(by_gamma[7][m] - 1, 3) for m in METHODS})
            for name, (num, den, g, kind) in RATIOS.items():
                shift = 1.0 if kind == "accepted" else 0.0
                row[name] = round((by_gamma[g][num] - shift) / (by_gamma[g][den] - shift), 3)
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write every row as CSV")
    args = parser.parse_args()
    table = pd.DataFrame([r for s in SETS for r in rows_of(s)])
    with pd.option_context("display.width", 250, "display.max_columns", 20):
        print(table.to_string(index=False))
    for name in RATIOS:
        for set_name in SETS:
            values = table.loc[table["set"] == set_name, name]
            print(f"{set_name}: {name}: median {statistics.median(values):.3f}, "
                  f"range {values.min():.3f}-{values.max():.3f}")
    if args.out:
        table.to_csv(args.out, index=False)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
