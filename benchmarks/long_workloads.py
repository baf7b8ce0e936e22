"""Acceptance of the long code / chat prompts and of competitive programming, as measured.

CPU, under a minute. Data: the packaged real-weights set `smollm2-135m-real`. Mean acceptance
length (1 + accepted, bonus included, γ 12, mean over the traced sparsities) per method and
temperature:

- code-long and chat-long by prompt length (1K, 2K, 3K, 4K, 7K; 32 iterations a run);
- competitive by generated position (tokens generated so far: context − prompt; runs of 192
  iterations from 404–1074-token problem statements).

Prints both tables and writes them to one CSV (`axis` says which: prompt or generated).

    PYTHONPATH=. python benchmarks/long_workloads.py [--out CSV]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from vegas_sim.traces.io import load_trace_set

SET = "smollm2-135m-real"
RESULTS = Path(__file__).resolve().parent / "results"
RUN = ["workload", "method", "sparsity", "temperature", "request"]
GENERATED_BINS = [-1, 256, 512, 1024, 2048, 4096]
GENERATED_LABELS = ["0-256", "256-512", "512-1K", "1K-2K", "2K-4K"]


def with_prompt(acc: pd.DataFrame) -> pd.DataFrame:
    """Rows with their run's prompt length (its first iteration's context)."""
    first = acc[acc["iteration"] == 0].set_index(RUN)["context"].rename("prompt")
    return acc.join(first, on=RUN)


def table(rows: pd.DataFrame, column: str) -> pd.DataFrame:
    """Mean length per (temperature, method) × `column`: per sparsity first, then averaged."""
    per_sparsity = (rows.assign(length=rows["accepted"] + 1.0)
                    .groupby(["temperature", "method", column, "sparsity"], observed=True)
                    ["length"].mean())
    return per_sparsity.groupby(["temperature", "method", column], observed=True).mean().unstack(column)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--out", type=Path, default=RESULTS / "long_workloads.csv")
    args = ap.parse_args()
    acc = load_trace_set(SET).acceptance
    acc = acc[acc["workload"].isin(["code-long", "chat-long", "competitive"])]
    acc = with_prompt(acc)
    frames = []
    for workload in ("code-long", "chat-long"):
        t = table(acc[acc["workload"] == workload], "prompt")
        print(f"\n{workload}: mean acceptance length by prompt length (γ 12)")
        print(t.round(2).to_string())
        prompts = acc[(acc["workload"] == workload) & (acc["iteration"] == 0)]
        print("prompts traced:", prompts.groupby(["temperature", "method"])["request"]
              .nunique().to_dict())
        frames.append(t.stack().rename("length").reset_index()
                      .rename(columns={"prompt": "bin"}).assign(workload=workload, axis="prompt"))
    comp = acc[acc["workload"] == "competitive"].copy()
    comp["generated"] = pd.cut(comp["context"] - comp["prompt"], GENERATED_BINS,
                               labels=GENERATED_LABELS)
    t = table(comp, "generated")
    print("\ncompetitive: mean acceptance length by tokens generated so far (γ 12)")
    print(t.round(2).to_string())
    frames.append(t.stack().rename("length").reset_index()
                  .rename(columns={"generated": "bin"}).assign(workload="competitive",
                                                               axis="generated"))
    out = pd.concat(frames, ignore_index=True)
    out = out.assign(command="PYTHONPATH=. python benchmarks/long_workloads.py")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(args.out, index=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
