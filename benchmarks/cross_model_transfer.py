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
- needed_shift: the further logit shift of the cell's anchored level that would give the
  count (`range_length_fn`; ±DELTA_BOUND where out of reach): where the miss lives. A miss
  that is a level keeps its needed shift flat along γ and sparsity while its error in length
  grows with γ;
- far_<axis>: the cell's distance from the anchor per transfer axis (`sim.anchored.
  transfer_axes` with unit sds: an indicator for workload and temperature, octaves past the
  near radius for sparsity and context);
- interval: the product's shape-transfer term (`sim.anchored.TRANSFER_SD` on those axes,
  turned into a relative sd of the length as a lookup turns it: `shifted_sd_pct`, % of the
  prediction) with the cell's measurement standard error from its runs' spread (% of the
  count; and `--transfer-sd`, a flat extra sd in % of the prediction, default 0), 1.96 × in
  quadrature, around the prediction: `covered` when |predicted − counted| is within it;
- `--calibrate`: the per-axis sds fitted on each direction and on both (moments of the
  needed shifts, `calibrate`), each scored on every direction (the one-way fits scored on
  the other way are the out-of-sample check), and the error left were each (method,
  workload, temperature)'s level known (`oracle`: what anchors there would give, about).

    PYTHONPATH=. python benchmarks/cross_model_transfer.py --shape smollm2-135m-real \
        --target gemma3-270m-real --reverse --calibrate \
        [--out benchmarks/results/cross_model_transfer.csv.gz]

Across a RoPE scaling (the YaRN x4 set's 12K-31K, anchored at its shortest bucket):
`--target smollm2-135m-real-yarn4 --out benchmarks/results/cross_model_transfer_yarn.csv.gz`.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from scipy.optimize import brentq, nnls

from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.acceptance_cells import make_cell, split_runs
from vegas_sim.sim.acceptance_walk import rewalk
from vegas_sim.sim.anchored import (TRANSFER_SD, AnchoredAcceptance, TransferSd, far_reasons,
                                    transfer_axes)
from vegas_sim.sim.context_trend import DELTA_BOUND, shifted_sd_pct
from vegas_sim.traces.anchors import Anchor, AnchorSet
from vegas_sim.traces.io import load_trace_set

ANCHOR_GAMMA, ANCHOR_SPARSITY, ANCHOR_TEMPERATURE = 6, 0.07, 0.6
GAMMAS = (2, 4, 6, 8, 12)
UNIT = TransferSd(1.0, 1.0, 1.0, 1.0, 1.0)  # each axis's distance: an indicator or octaves
CLIP = 4.0  # logit: a needed shift past this moves a conditional rate across most of (0, 1)


def with_buckets(df: pd.DataFrame) -> pd.DataFrame:
    """Each row with its run's prompt bucket (log2 of the run's first context, rounded)."""
    first = df.groupby(["method", "gamma", "sparsity", "temperature", "workload", "request"],
                       sort=False)["context"].transform("min")
    return df.assign(bucket=np.round(np.log2(first)).astype(int))


def walked(c: pd.DataFrame, gamma: int) -> tuple[np.ndarray, np.ndarray]:
    """(accepted [M], request [M]) of one traced γ's rows walked again at `gamma`
    (`sim.acceptance_walk`: what drafting γ accepts over the same runs, not each iteration
    truncated, which under-states a smaller γ: benchmarks/gamma_walk.py)."""
    runs = split_runs(c)
    traced = int(runs.gamma.iloc[0])
    cell = make_cell(runs, traced, float(runs.sparsity.iloc[0]), 0.0)
    out = rewalk(cell, gamma)
    first = runs.groupby("run", sort=True)["request"].first().to_numpy()  # [runs]
    run_of = np.cumsum(np.concatenate([[True], out.run_start[1:] != out.run_start[:-1]])) - 1
    return out.acc, first[run_of]


def count(cell: pd.DataFrame, gamma: int) -> tuple[float, float, tuple[int, int], int] | None:
    """(mean acceptance length, its relative standard error %, context range, drafts) of a
    cell's iterations at γ: the smallest traced γ ≥ it, its runs walked again at γ."""
    traced = [g for g in cell.gamma.unique() if g >= gamma]
    if not traced:
        return None
    c = cell[cell.gamma == min(traced)]
    acc, request = walked(c, gamma)
    mean = 1.0 + float(acc.mean())
    per_run = 1.0 + pd.Series(acc).groupby(request).mean()
    se = float(per_run.std(ddof=1) / math.sqrt(len(per_run))) if len(per_run) > 1 else 0.0
    return mean, 100.0 * se / mean, (int(c.context.min()), int(c.context.max())), len(acc)


def anchor_set(target: pd.DataFrame, name: str, workload: str,
               temperature: float = ANCHOR_TEMPERATURE) -> tuple[AnchorSet, int]:
    """One anchor per method at the anchor workload's shortest bucket, at the traced sparsity
    nearest ANCHOR_SPARSITY; (the set, the bucket)."""
    traced = np.array(sorted(target.sparsity.unique()))
    s_anchor = float(traced[np.argmin(np.abs(np.log(traced / ANCHOR_SPARSITY)))])
    sl = target[(target.workload == workload)
                & np.isclose(target.temperature, temperature)
                & np.isclose(target.sparsity, s_anchor)]
    bucket = int(sl.bucket.min())
    anchors = []
    for m in sorted(sl.method.unique()):
        got = count(sl[(sl.method == m) & (sl.bucket == bucket)], ANCHOR_GAMMA)
        if got is None:
            continue
        mean, _, ctx, n = got
        anchors.append(Anchor(m, ANCHOR_GAMMA, s_anchor, ctx, workload,
                              temperature, mean, num_drafts=n, source=name))
    return AnchorSet(model=name, source=f"{name} anchors", anchors=tuple(anchors),
                     path=f"{name}-anchors"), bucket


def held_out(model: AnchoredAcceptance, target: pd.DataFrame, anchors: AnchorSet,
             anchor_bucket: int) -> tuple[pd.DataFrame, list[Callable[[float], float]]]:
    """Every target cell but the anchors themselves, counted and predicted; with each cell's
    anchored length as a function of a further logit shift (`range_length_fn`)."""
    rows, fns = [], []
    keys = ["method", "workload", "temperature", "sparsity", "bucket"]
    anchored = {(a.method, a.workload) for a in anchors.anchors}
    for (m, wl, t, s, b), cell in target.groupby(keys):
        if m not in model.shifts:
            continue
        anchor = model.shifts[m].anchors[0]
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
            fn = model.range_length_fn(m, g, float(s), ctx, wl, float(t))
            mid = (ctx[0] + ctx[1]) // 2
            far = far_reasons(anchor, g, float(s), mid, wl, float(t))
            unit = transfer_axes(anchor, g, float(s), mid, wl, float(t), UNIT)
            rows.append({"method": m, "workload": wl, "temperature": float(t), "gamma": g,
                         "sparsity": float(s), "context_lo": ctx[0], "context_hi": ctx[1],
                         "near": not far, "counted": mean, "predicted": fn(0.0),
                         "measured_se_pct": se_pct, "needed_shift": needed_shift(fn, mean),
                         **{f"far_{k}": v for k, v in unit.items()}})
            fns.append(fn)
    out = pd.DataFrame(rows)
    out["err_pct"] = 100.0 * (out.predicted - out.counted) / out.counted
    return out, fns


def needed_shift(fn: Callable[[float], float], counted: float) -> float:
    """The further logit shift x with fn(x) = counted (clamped to ±DELTA_BOUND): how far in
    logit the anchored prediction is from the count."""
    lo, hi = fn(-DELTA_BOUND) - counted, fn(DELTA_BOUND) - counted
    if lo >= 0:
        return -DELTA_BOUND
    if hi <= 0:
        return DELTA_BOUND
    return float(brentq(lambda x: fn(x) - counted, -DELTA_BOUND, DELTA_BOUND, xtol=1e-6))


def axis_sds(rows: pd.DataFrame, sds: TransferSd) -> np.ndarray:
    """[rows] the combined transfer sd (logit) of each row under `sds`."""
    per = {"anchor": sds.near, "workload": sds.workload, "temperature": sds.temperature,
           "sparsity": sds.per_sparsity_octave, "context": sds.per_context_octave}
    var = sum((rows[f"far_{k}"].to_numpy() * v) ** 2 for k, v in per.items())
    return np.sqrt(np.asarray(var, dtype=float))


def scored(rows: pd.DataFrame, fns: list[Callable[[float], float]], sds: TransferSd,
           transfer_sd: float) -> pd.DataFrame:
    """`rows` with the interval the product would print (the transfer term of `sds`, plus a
    flat `transfer_sd` %, with the cell's measurement error) and whether it covers."""
    sd = axis_sds(rows, sds)
    pct = np.array([shifted_sd_pct(f, x) for f, x in zip(fns, sd)])
    # the model's parts are % of the prediction (the interval is around it), the
    # measurement's % of the count
    pred, counted = rows.predicted.to_numpy(), rows.counted.to_numpy()
    band = 1.96 * np.sqrt((pct ** 2 + transfer_sd ** 2) * pred ** 2
                          + (rows.measured_se_pct.to_numpy() * counted) ** 2) / 100.0
    return rows.assign(transfer_sd_logit=sd, transfer_pct=pct,
                       covered=np.abs(pred - counted) <= band)


def calibrate(rows: pd.DataFrame) -> TransferSd:
    """The sds (logit) that explain the rows' needed shifts, by moments, each shift clipped
    to ±CLIP (a few cells are out of the shape's reach, the rest within it): `near` the
    root mean square over the near rows; the axes' variances the non-negative least squares
    of the far rows' squared shifts, less near², on each axis's squared distance."""
    x = rows.needed_shift.clip(-CLIP, CLIP).to_numpy(dtype=float)
    near = rows.near.to_numpy(dtype=bool)
    near_var = float(np.mean(x[near] ** 2)) if near.any() else 0.0
    axes = ["workload", "temperature", "sparsity", "context"]
    a = np.stack([rows.loc[~near, f"far_{k}"].to_numpy(dtype=float) ** 2 for k in axes], axis=1)
    var, _ = nnls(a, x[~near] ** 2 - near_var)
    sd = np.sqrt(var)
    return TransferSd(near=math.sqrt(near_var), workload=float(sd[0]), temperature=float(sd[1]),
                      per_sparsity_octave=float(sd[2]), per_context_octave=float(sd[3]))


def transfer(shape_name: str, target_name: str, workload: str
             ) -> tuple[pd.DataFrame, list[Callable[[float], float]]]:
    shape_df = load_trace_set(shape_name).acceptance
    target = with_buckets(load_trace_set(target_name).acceptance)
    shape = AcceptanceModel.from_traces(shape_df, "real")
    anchors, bucket = anchor_set(target, target_name, workload)
    model = AnchoredAcceptance(shape, shape_name, [anchors])
    rows, fns = held_out(model, target, anchors, bucket)
    return rows.assign(shape=shape_name, target=target_name, anchors=len(anchors.anchors)), fns


def _stats(rows: pd.DataFrame) -> str:
    err = rows.err_pct.abs()
    return (f"{len(rows)} cells: |error| median {err.median():.1f} %, p90 "
            f"{err.quantile(0.9):.1f} %, p95 {err.quantile(0.95):.1f} %, max {err.max():.1f} %, "
            f"signed median {rows.err_pct.median():+.1f} %, interval covers "
            f"{rows.covered.mean():.0%} (median half-width "
            f"{1.96 * rows.transfer_pct.median():.0f} %)")


def summary(rows: pd.DataFrame, label: str) -> str:
    lines = [f"{rows['shape'].iloc[0]} shape -> {rows['target'].iloc[0]} "
             f"({rows['anchors'].iloc[0]} anchors; {label}): " + _stats(rows),
             "  near the anchors: " + _stats(rows[rows.near]),
             "  far from them:    " + _stats(rows[~rows.near])]
    for axis in ("workload", "temperature", "gamma", "sparsity", "method"):
        parts = ", ".join(f"{k} {g.err_pct.abs().median():.1f}/{g.err_pct.abs().max():.1f}/"
                          f"{g.needed_shift.median():+.2f}"
                          for k, g in rows.groupby(axis))
        lines.append(f"  by {axis} (|error| median/max %, needed shift median): {parts}")
    return "\n".join(lines)


def describe(sds: TransferSd) -> str:
    return (f"near {sds.near:.2f}, workload {sds.workload:.2f}, temperature "
            f"{sds.temperature:.2f}, per sparsity octave {sds.per_sparsity_octave:.2f}, per "
            f"context octave {sds.per_context_octave:.2f} (logit sd)")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--shape", default="smollm2-135m-real")
    ap.add_argument("--target", required=True)
    ap.add_argument("--anchor-workload", default="longdoc")
    ap.add_argument("--reverse", action="store_true", help="also the target's shape -> shape")
    ap.add_argument("--transfer-sd", type=float, default=0.0,
                    help="a flat shape-transfer sd (%%) added to the interval (the product's "
                         "is per axis, sim.anchored.TRANSFER_SD)")
    ap.add_argument("--calibrate", action="store_true",
                    help="fit the per-axis sds on each direction and score them on the other")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    runs = [transfer(args.shape, args.target, args.anchor_workload)]
    if args.reverse:
        runs.append(transfer(args.target, args.shape, args.anchor_workload))
    label = (f"the product's transfer term ({describe(TRANSFER_SD)})"
             + (f" and a flat {args.transfer_sd:g} %" if args.transfer_sd else ""))
    out = [scored(rows, fns, TRANSFER_SD, args.transfer_sd) for rows, fns in runs]
    for rows in out:
        print(summary(rows, label))
    if args.calibrate:
        print(calibration(runs))
    if args.out is not None:
        pd.concat(out, ignore_index=True).to_csv(args.out, index=False, float_format="%.6g")
        print(f"wrote {args.out}")


def calibration(runs: list[tuple[pd.DataFrame, list[Callable[[float], float]]]]) -> str:
    """The sds fitted on each direction and on both, each scored on every direction."""
    fits = [(f"fitted on {rows['target'].iloc[0]}", calibrate(rows)) for rows, _ in runs]
    if len(runs) > 1:
        both = pd.concat([rows for rows, _ in runs], ignore_index=True)
        fits.append(("fitted on both", calibrate(both)))
    lines = []
    for label, sds in fits:
        lines.append(f"{label}: {describe(sds)}")
        for rows, fns in runs:
            got = scored(rows, fns, sds, 0.0)
            lines.append(f"  scored on {rows['target'].iloc[0]}: interval covers "
                         f"{got.covered.mean():.0%} (near {got[got.near].covered.mean():.0%}, "
                         f"far {got[~got.near].covered.mean():.0%}), median half-width "
                         f"{1.96 * got.transfer_pct.median():.0f} %")
    lines += [oracle(rows, fns) for rows, fns in runs]
    return "\n".join(lines)


def oracle(rows: pd.DataFrame, fns: list[Callable[[float], float]]) -> str:
    """The error left were each (method, workload, temperature)'s level known: every cell
    shifted by its group's mean needed shift (what an anchor at each would give, about)."""
    keys = ["method", "workload", "temperature"]
    level = rows.groupby(keys)["needed_shift"].transform("mean").to_numpy()
    got = np.array([f(x) for f, x in zip(fns, level)])
    err = np.abs(100.0 * (got - rows.counted.to_numpy()) / rows.counted.to_numpy())
    return (f"{rows['target'].iloc[0]} with each (method, workload, temperature) level known: "
            f"|error| median {np.median(err):.1f} %, p90 {np.quantile(err, 0.9):.1f} %, max "
            f"{err.max():.1f} %")


if __name__ == "__main__":
    main()
