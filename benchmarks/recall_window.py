"""Recall acceptance against the draft's window: does window drafting (MagicDec-Stream) lose
what lies outside its window, and query-aware selection (Quest, SpecExtend, Vegas) less so?

    python benchmarks/recall_window.py [--out benchmarks/results/recall_window.csv]

CPU, seconds. Reads the packaged real-weights sets `smollm2-135m-real` (recall prompts of
1K-7K tokens) and, when packaged, `smollm2-135m-real-yarn4` (12K-31K, RoPE extended by YaRN
x4), and the recall workload files that say where each prompt's passage lies
(vegas_sim/calibrate/workloads: `recall.distance`, tokens from the passage to the prompt's end).

Three tables, all mean acceptance length (accepted draft tokens + the bonus token, vLLM's
convention) at γ 12:
1. by method x prompt length, over each request's whole run (every sparsity pooled);
2. by method x (prompt length, cue depth: where in the window the quoted passage starts,
   0.1 far back, 0.95 recent), whole runs, the packaged 1K-7K set;
3. by method x "passage distance / draft budget" (budget: the keys a draft step reads, the
   window size of Stream), over the answer span only (a request's first ANSWER_ITERATIONS
   iterations, while the quoted passage is being produced). Distance <= budget means the
   passage lies inside Stream's window. Rows pool prompts and sparsities; `n` counts
   iterations.
The CSV has one row per (table, temperature, bucket, method).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from vegas_sim.calibrate.workloads import RECALL_DEPTHS, workload_prompts
from vegas_sim.traces.io import load_trace_set

SETS = {"smollm2-135m-real": False, "smollm2-135m-real-yarn4": True}  # name: long windows
ANSWER_ITERATIONS = 3  # ~3 x (γ + 1) tokens: the 64-token passage, at the acceptance seen
RATIO_BINS = [0, 1, 2, 4, 8, 16, np.inf]
RATIO_LABELS = ["<=1", "1-2", "2-4", "4-8", "8-16", ">16"]


def recall_rows(name: str, long: bool) -> pd.DataFrame:
    """The set's recall rows with each request's prompt length and passage distance."""
    ts = load_trace_set(name)
    acc = ts.acceptance[ts.acceptance["workload"] == "recall"].copy()
    prompts = workload_prompts("recall", long=long)
    length = {i: len(p.tokens) for i, p in enumerate(prompts)}
    distance = {i: p.distance for i, p in enumerate(prompts)}
    acc["length"] = acc["request"].map(length)
    acc["distance"] = acc["request"].map(distance)
    # recall_prompts' order: rounds of (length, depth) cells, depth fastest
    acc["depth"] = acc["request"].map(lambda i: RECALL_DEPTHS[i % len(RECALL_DEPTHS)])
    first = acc[acc["iteration"] == 0]
    if (first["context"] != first["length"]).any():  # the request ids must index the prompts
        raise SystemExit(f"{name}: request ids do not match the recall prompts' lengths")
    acc["acceptance_length"] = acc["accepted"] + 1
    acc["set"] = name
    return acc


def by_length(rows: pd.DataFrame) -> pd.DataFrame:
    return (rows.groupby(["temperature", "length", "method"])["acceptance_length"]
            .agg(["mean", "size"]).rename(columns={"size": "n"}).reset_index())


def by_depth(rows: pd.DataFrame) -> pd.DataFrame:
    one = rows[rows["set"] == next(iter(SETS))]
    return (one.groupby(["temperature", "length", "depth", "method"])["acceptance_length"]
            .agg(["mean", "size"]).rename(columns={"size": "n"}).reset_index()
            .assign(cell=lambda d: d["length"].astype(str) + "@" + d["depth"].astype(str)))


def by_window(rows: pd.DataFrame) -> pd.DataFrame:
    span = rows[rows["iteration"] < ANSWER_ITERATIONS].copy()
    span["ratio"] = pd.cut(span["distance"] / span["budget"], RATIO_BINS, labels=RATIO_LABELS)
    return (span.groupby(["temperature", "ratio", "method"], observed=True)
            ["acceptance_length"].agg(["mean", "size"]).rename(columns={"size": "n"})
            .reset_index())


def print_table(title: str, df: pd.DataFrame, key: str) -> None:
    for temp, part in df.groupby("temperature"):
        wide = part.pivot(index=key, columns="method", values="mean")
        if "vegas" in wide:
            wide["stream/vegas"] = wide["magicdec-stream"] / wide["vegas"]
            wide["quest/vegas"] = wide["magicdec-quest"] / wide["vegas"]
        wide["n"] = part.groupby(key, observed=True)["n"].sum()
        print(f"\n{title}, T {temp:g}")
        print(wide.round(2).to_string())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    parts = []
    for name, long in SETS.items():
        try:
            parts.append(recall_rows(name, long))
        except FileNotFoundError:
            print(f"{name}: not packaged, skipped")
    rows = pd.concat(parts, ignore_index=True)
    lengths, depths, window = by_length(rows), by_depth(rows), by_window(rows)
    print_table("mean acceptance length by prompt length (whole runs)", lengths, "length")
    print_table("mean acceptance length by prompt length @ cue depth (whole runs)", depths,
                "cell")
    print_table(f"mean acceptance length over the answer span (first {ANSWER_ITERATIONS} "
                "iterations) by passage distance / draft budget", window, "ratio")
    if a.out:
        out = pd.concat([lengths.assign(table="length", bucket=lengths["length"].astype(str)),
                         depths.assign(table="depth", bucket=depths["cell"]),
                         window.assign(table="window", bucket=window["ratio"].astype(str))])
        out[["table", "temperature", "bucket", "method", "mean", "n"]].to_csv(
            a.out, index=False, float_format="%.4f")
        print(f"\nwrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
