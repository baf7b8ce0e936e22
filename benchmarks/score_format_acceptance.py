"""Acceptance A/B of the collected-score formats (bf16 against fp8) on real SmolLM2 weights.

The fp8 score format (kernels/reference.py, LogScores) may replace bf16 only if the selection
it feeds keeps Vegas's acceptance. This runs the calibration's own acceptance loop
(`measure_acceptance.measure_acceptance_group`: SpecDecoder's prefill + `iterations` steps,
one batch per method × γ × temperature × workload, every sparsity a request of its own) twice
per cell, once per format (env VEGAS_SIM_SCORE_FORMAT, read by SpecConfig), on the same
prompts with the same seeds, and compares the accepted tokens per iteration.

    python benchmarks/score_format_acceptance.py --out $OUT/score_format.csv   # on the GPU

Per cell (method, γ, T, workload, sparsity) it prints the mean accepted tokens per iteration
in each format, their difference fp8 − bf16 and its standard error (paired by request and
iteration, clustered by request: a request's iterations share one context), and at T 0 the
share of iterations whose accepted counts are identical. At T > 0 both formats draw from the
same generator seed, so they stay paired until a draft or a selection first differs. Cells
run in --cells order until --budget-s is spent (each cell's CSV rows are written at once).
Needs the SmolLM2 GGUF (env VEGAS_SIM_SMOLLM2_GGUF; benchmarks/gpu/device.sh `gguf`).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

FORMATS = ("bf16", "fp8")
FORMAT_ENV = "VEGAS_SIM_SCORE_FORMAT"
COLUMNS = ["method", "gamma", "temperature", "workload", "sparsity", "requests", "iterations",
           "accepted_bf16", "accepted_fp8", "diff", "diff_se", "identical_share", "seconds"]


def paired_stats(a: pd.DataFrame, b: pd.DataFrame) -> dict[str, Any]:
    """Mean accepted tokens per iteration of two acceptance frames of one point (a: bf16,
    b: fp8), their difference b − a with its standard error clustered by request, and the
    share of (request, iteration) rows with the same accepted count."""
    key = ["request", "iteration"]
    m = a[key + ["accepted"]].merge(b[key + ["accepted"]], on=key, suffixes=("_a", "_b"))
    if m.empty:
        raise ValueError("the two formats' frames share no (request, iteration)")
    d = m["accepted_b"] - m["accepted_a"]
    per_request = d.groupby(m["request"]).mean()
    n = len(per_request)
    se = float(per_request.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    return {"requests": n, "iterations": len(m),
            "accepted_bf16": float(m["accepted_a"].mean()),
            "accepted_fp8": float(m["accepted_b"].mean()),
            "diff": float(d.mean()), "diff_se": se,
            "identical_share": float((d == 0).mean())}


def cells(args: argparse.Namespace) -> Iterator[tuple[str, int, float, str]]:
    """(method, γ, T, workload) in run order: γ, then T, then workload, then method, so a
    budget cut keeps every workload and method of the first γ and T."""
    for gamma in args.gamma:
        for t in args.temperatures:
            for w in args.workloads:
                for method in args.methods:
                    yield method, gamma, t, w


def run_cell(model: Any, args: argparse.Namespace, method: str, gamma: int, temp: float,
             workload: str) -> list[dict[str, Any]]:
    """One (method, γ, T, workload) in both formats: a CSV row per sparsity."""
    from vegas_sim.calibrate.measure_acceptance import acceptance_prompts, measure_acceptance_group
    from vegas_sim.calibrate.plan import AcceptancePoint, CalibrationPlan

    plan = CalibrationPlan(model="smollm2-135m", weights=args.weights, methods=(method,),
                           gamma=(gamma,), sparsity=tuple(args.sparsity),
                           workloads=(workload,), iterations=args.iterations,
                           temperatures=(temp,), device=args.device, seed=args.seed,
                           acceptance_prompts=args.prompts, acceptance_batch=args.batch,
                           latency=False)
    prompts = acceptance_prompts(plan, model.spec, workload, gamma)
    group = [AcceptancePoint(method, gamma, s, temp, workload) for s in args.sparsity]
    t0 = time.time()
    frames: dict[str, dict[str, pd.DataFrame]] = {}
    old = os.environ.get(FORMAT_ENV)
    try:
        for fmt in FORMATS:
            os.environ[FORMAT_ENV] = fmt
            frames[fmt] = measure_acceptance_group(model, plan, group, prompts)
    finally:
        if old is None:
            os.environ.pop(FORMAT_ENV, None)
        else:
            os.environ[FORMAT_ENV] = old
    seconds = time.time() - t0
    out = []
    for point in group:
        stats = paired_stats(frames["bf16"][point.key], frames["fp8"][point.key])
        if temp > 0:
            stats["identical_share"] = math.nan  # reported at T 0 only (brief's contract)
        out.append({"method": method, "gamma": gamma, "temperature": temp,
                    "workload": workload, "sparsity": point.sparsity, **stats,
                    "seconds": seconds})
    return out


def print_row(r: dict[str, Any]) -> None:
    share = r["identical_share"]
    same = "" if math.isnan(share) else f" identical {100 * share:5.1f} %"
    per_request = r["iterations"] // max(r["requests"], 1)
    print(f"{r['method']:9s} g{r['gamma']:<2d} T{r['temperature']:<3g} {r['workload']:10s} "
          f"s{r['sparsity']:<5g} n={r['requests']:3d}x{per_request:<3d} "
          f"bf16 {r['accepted_bf16']:.3f}  fp8 {r['accepted_fp8']:.3f}  "
          f"diff {r['diff']:+.3f} ± {r['diff_se']:.3f}{same}", flush=True)


def summary(rows: list[dict[str, Any]]) -> None:
    """Pooled over cells: the mean difference and the largest |diff| / SE."""
    if not rows:
        print("no cell measured")
        return
    df = pd.DataFrame(rows)
    z = (df["diff"] / df["diff_se"]).abs().replace([math.inf], math.nan)
    t0 = df[df["temperature"] == 0]
    print(f"\n{len(df)} cells: mean diff (fp8 − bf16) {df['diff'].mean():+.4f} accepted "
          f"tokens/iteration; largest |diff|/SE {z.max():.2f}"
          + (f"; T 0 identical iterations {100 * t0['identical_share'].mean():.1f} % (mean of "
             f"cells)" if len(t0) else ""), flush=True)


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="CSV of the per-cell rows")
    p.add_argument("--methods", default="vegas,vegas-all")
    p.add_argument("--workloads", default="longdoc,code-long,reasoning")
    p.add_argument("--gamma", default="12,4", help="comma list, run in this order")
    p.add_argument("--sparsity", default="0.03,0.1", help="comma list (one batch per cell)")
    p.add_argument("--temperatures", default="0,0.6")
    p.add_argument("--prompts", type=int, default=8, help="prompts per workload")
    p.add_argument("--iterations", type=int, default=16)
    p.add_argument("--batch", type=int, default=None,
                   help="requests per call (default: the calibration's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--weights", default="real", choices=("real", "random"),
                   help="random: SmolLM2's shape with random weights (a plumbing check only)")
    p.add_argument("--budget-s", type=float, default=130.0,
                   help="start no cell after this many seconds (model load included)")
    args = p.parse_args(argv)
    args.methods = args.methods.split(",")
    args.workloads = args.workloads.split(",")
    args.gamma = [int(x) for x in args.gamma.split(",")]
    args.sparsity = floats(args.sparsity)
    args.temperatures = floats(args.temperatures)

    from vegas_sim.calibrate.loading import load_model

    t0 = time.time()
    model, _tok, meta = load_model("smollm2-135m", weights=args.weights, device=args.device)
    print(f"SmolLM2 {meta.get('sha256', '')} on {args.device}: loaded in "
          f"{time.time() - t0:.0f} s", flush=True)
    rows: list[dict[str, Any]] = []
    skipped = []
    for method, gamma, temp, workload in cells(args):
        if time.time() - t0 > args.budget_s:
            skipped.append(f"{method}/g{gamma}/T{temp:g}/{workload}")
            continue
        for r in run_cell(model, args, method, gamma, temp, workload):
            rows.append(r)
            print_row(r)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows, columns=COLUMNS).to_csv(args.out, index=False)
    if skipped:
        print(f"not started (--budget-s {args.budget_s:.0f} s spent): {', '.join(skipped)}")
    summary(rows)
    pd.DataFrame(rows, columns=COLUMNS).to_csv(args.out, index=False)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
