"""Cross-model transfer of acceptance: one real model's shape plus a handful of another model's
anchors, scored on every other cell the second model measured.

The default prediction for a large model rests on this step: SmolLM2's acceptance *shape* (how
it moves with γ, sparsity, context, workload, temperature) carried to the target model's level
by a few anchors. Here both models are real and measured, so the step is checked, both ways:

- anchors: the target set's counted mean acceptance length at one context (a workload's
  shortest prompt bucket), γ 6, sparsity 0.07, temperature 0.6: one per method (≤ 5);
- held out: every other (method, workload, temperature, γ, sparsity, prompt bucket) of the
  target set, counted as vLLM counts it (1 + accepted / drafts, drafts of the smallest traced
  γ ≥ the γ asked, truncated to it);
- predicted: `AnchoredAcceptance(shape, anchors).range_length` over the held-out cell's context
  range (the evaluation the anchors are fitted with);
- near / far: a held-out cell is "near" when `predict` would count it anchored (the anchor's
  workload and temperature, sparsity within 2x; `sim.anchored.far_reasons`), else "far";
- interval: 1.96 × (`--transfer-sd`, a shape-transfer sd in %, with the cell's measurement
  standard error from its runs' spread) around the prediction. The product's own intervals
  carry no shape-transfer term, so the default (0) scores what they would cover.

    PYTHONPATH=. python benchmarks/cross_model_transfer.py --shape smollm2-135m-real \
        --target gemma3-270m-real --reverse [--out benchmarks/results/cross_model_transfer.csv.gz]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.anchored import AnchoredAcceptance, far_reasons
from vegas_sim.traces.anchors import Anchor, AnchorSet
from vegas_sim.traces.io import load_trace_set

ANCHOR_GAMMA, ANCHOR_SPARSITY, ANCHOR_TEMPERATURE = 6, 0.07, 0.6
GAMMAS = (2, 4, 6, 8, 12)


def with_buckets(df: pd.DataFrame) -> pd.DataFrame:
    """Each row with its run's prompt bucket (log2 of the run's first context, rounded)."""
    first = df.groupby(["method", "gamma", "sparsity", "temperature", "workload", "request"],
                       sort=False)["context"].transform("min")
    return df.assign(bucket=np.round(np.log2(first)).astype(int))


def count(cell: pd.DataFrame, gamma: int) -> tuple[float, float, tuple[int, int], int] | None:
    """(mean acceptance length, its relative standard error %, context range, drafts) of a
    cell's iterations at γ: the smallest traced γ ≥ it, truncated."""
    traced = [g for g in cell.gamma.unique() if g >= gamma]
    if not traced:
        return None
    c = cell[cell.gamma == min(traced)]
    acc = np.minimum(c.accepted.to_numpy(), gamma)
    mean = 1.0 + float(acc.mean())
    per_run = 1.0 + c.assign(a=acc).groupby("request")["a"].mean()
    se = float(per_run.std(ddof=1) / math.sqrt(len(per_run))) if len(per_run) > 1 else 0.0
    return mean, 100.0 * se / mean, (int(c.context.min()), int(c.context.max())), len(acc)


def anchor_set(target: pd.DataFrame, name: str, workload: str) -> tuple[AnchorSet, int]:
    """One anchor per method at the anchor workload's shortest bucket, at the traced sparsity
    nearest ANCHOR_SPARSITY; (the set, the bucket)."""
    traced = np.array(sorted(target.sparsity.unique()))
    s_anchor = float(traced[np.argmin(np.abs(np.log(traced / ANCHOR_SPARSITY)))])
    sl = target[(target.workload == workload)
                & np.isclose(target.temperature, ANCHOR_TEMPERATURE)
                & np.isclose(target.sparsity, s_anchor)]
    bucket = int(sl.bucket.min())
    anchors = []
    for m in sorted(sl.method.unique()):
        got = count(sl[(sl.method == m) & (sl.bucket == bucket)], ANCHOR_GAMMA)
        if got is None:
            continue
        mean, _, ctx, n = got
        anchors.append(Anchor(m, ANCHOR_GAMMA, s_anchor, ctx, workload,
                              ANCHOR_TEMPERATURE, mean, num_drafts=n, source=name))
    return AnchorSet(model=name, source=f"{name} anchors", anchors=tuple(anchors),
                     path=f"{name}-anchors"), bucket


def held_out(model: AnchoredAcceptance, target: pd.DataFrame, anchors: AnchorSet,
             anchor_bucket: int, transfer_sd: float) -> pd.DataFrame:
    """Every target cell but the anchors themselves, counted and predicted."""
    rows = []
    keys = ["method", "workload", "temperature", "sparsity", "bucket"]
    anchored = {(a.method, a.workload) for a in anchors.anchors}
    for (m, wl, t, s, b), cell in target.groupby(keys):
        if m not in model.shifts:
            continue
        for g in GAMMAS:
            got = count(cell, g)
            if got is None:
                continue
            is_anchor = ((m, wl) in anchored and b == anchor_bucket and g == ANCHOR_GAMMA
                         and np.isclose(s, anchors.anchors[0].sparsity or 0.0)
                         and np.isclose(t, ANCHOR_TEMPERATURE))
            if is_anchor:
                continue
            mean, se_pct, ctx, _ = got
            pred = model.range_length(m, g, float(s), ctx, wl, float(t))
            far = far_reasons(model.shifts[m].anchors[0], g, float(s), (ctx[0] + ctx[1]) // 2,
                              wl, float(t))
            rows.append({"method": m, "workload": wl, "temperature": float(t), "gamma": g,
                         "sparsity": float(s), "context_lo": ctx[0], "context_hi": ctx[1],
                         "near": not far, "counted": mean, "predicted": pred,
                         "measured_se_pct": se_pct})
    out = pd.DataFrame(rows)
    out["err_pct"] = 100.0 * (out.predicted - out.counted) / out.counted
    band = 1.96 * np.hypot(transfer_sd, out.measured_se_pct)
    out["covered"] = out.err_pct.abs() <= band
    return out


def transfer(shape_name: str, target_name: str, workload: str, transfer_sd: float
             ) -> pd.DataFrame:
    shape_df = load_trace_set(shape_name).acceptance
    target = with_buckets(load_trace_set(target_name).acceptance)
    shape = AcceptanceModel.from_traces(shape_df, "real")
    anchors, bucket = anchor_set(target, target_name, workload)
    model = AnchoredAcceptance(shape, shape_name, [anchors])
    rows = held_out(model, target, anchors, bucket, transfer_sd)
    return rows.assign(shape=shape_name, target=target_name, anchors=len(anchors.anchors))


def _stats(rows: pd.DataFrame) -> str:
    err = rows.err_pct.abs()
    return (f"{len(rows)} cells: |error| median {err.median():.1f} %, p90 "
            f"{err.quantile(0.9):.1f} %, p95 {err.quantile(0.95):.1f} %, max {err.max():.1f} %, "
            f"signed median {rows.err_pct.median():+.1f} %, interval covers "
            f"{rows.covered.mean():.0%}")


def summary(rows: pd.DataFrame, transfer_sd: float) -> str:
    lines = [f"{rows['shape'].iloc[0]} shape -> {rows['target'].iloc[0]} "
             f"({rows['anchors'].iloc[0]} anchors; shape-transfer sd {transfer_sd:g} %): "
             + _stats(rows),
             "  near the anchors: " + _stats(rows[rows.near]),
             "  far from them:    " + _stats(rows[~rows.near])]
    for axis in ("workload", "temperature", "gamma", "method"):
        parts = ", ".join(f"{k} {g.err_pct.abs().median():.1f}/{g.err_pct.abs().max():.1f}"
                          for k, g in rows.groupby(axis))
        lines.append(f"  by {axis} (median/max %): {parts}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--shape", default="smollm2-135m-real")
    ap.add_argument("--target", required=True)
    ap.add_argument("--anchor-workload", default="longdoc")
    ap.add_argument("--reverse", action="store_true", help="also the target's shape -> shape")
    ap.add_argument("--transfer-sd", type=float, default=0.0,
                    help="a shape-transfer sd (%%) for the interval (the product has none)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    runs = [transfer(args.shape, args.target, args.anchor_workload, args.transfer_sd)]
    if args.reverse:
        runs.append(transfer(args.target, args.shape, args.anchor_workload, args.transfer_sd))
    for rows in runs:
        print(summary(rows, args.transfer_sd))
    if args.out is not None:
        pd.concat(runs, ignore_index=True).to_csv(args.out, index=False)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
