"""Acceptance hold-outs per workload on real traces, scored on mean acceptance length.

CPU, about a minute. Data: the packaged real-weights set `smollm2-135m-real` (`--set` another,
e.g. `gemma3-270m-real`). For each workload W
in turn the fit is the whole set less W's runs whose prompt lies above a cut, each run kept
whole (a run belongs to its prompt), and the held-out runs are predicted with
`AcceptanceModel.lookup` at their bucket's context (W's own buckets: exact prompt lengths when it
has few, else log2 bins, as the model buckets them), averaged over the traced sparsities:

- `--design third` (default): the cut is the shortest third of W's traced prompt contexts (its
  distinct bucket centres, ceil(K / 3) of them): the context hold-out;
- `--design workload`: the cut keeps only W's shortest bucket: W's long prompts removed, predicted
  from its shortest bucket and the rest of the set (the other workloads' trends cover the
  contexts W's own cannot reach: `sim.context_trend.covering_trend`): the workload hold-out.

measured: the mean over the held-out bucket's runs of 1 + accepted (vLLM's count, bonus
included) averaged over the sparsities; its standard error from the prompt-to-prompt spread.
nearest: the fit's last bucket of W held (no trend). Error: (predicted − measured) / measured;
`covered`: |predicted − measured| within 1.96 × the trend's sd (% of the prediction) and the
measurement's standard error (% of the measured) combined. A held-out bucket of few prompts
cannot measure its own spread: as a prediction sizes a run's (`sim.uncertainty.run_sd`), one
prompt takes the prompt-to-prompt spread of the workload's fitted prompts (`fit_spread`), two
or three the larger of their own and that (`se_from` says which).
`trend` says which trend the prediction followed ('own' or 'covering' beyond the own reach).
Prints per-point rows and per-workload median / max |error|, writes a CSV (the `command` column
reproduces it).

    PYTHONPATH=. python benchmarks/acceptance_holdout.py [--design third|workload] [--out CSV]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vegas_sim.methods import MIN_TOKENS
from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.acceptance_cells import split_runs, workload_buckets
from vegas_sim.sim.context_trend import TREND_SD_SCALE, Z95
from vegas_sim.sim.uncertainty import run_sd
from vegas_sim.traces.io import load_trace_set

SET = "smollm2-135m-real"
RESULTS = Path(__file__).resolve().parent / "results"


def run_table(acceptance: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows with a run id and its bucket, one row per run: keys, bucket, mean length)."""
    df = split_runs(acceptance)
    first = df.groupby("run", sort=True).head(1)
    bucket = workload_buckets(first)  # [runs] as the model buckets them
    df["bucket"] = bucket[df["run"].to_numpy()]
    runs = (df.assign(length=df["accepted"] + 1.0)
            .groupby("run", as_index=False)
            .agg(workload=("workload", "first"), temperature=("temperature", "first"),
                 method=("method", "first"), gamma=("gamma", "first"),
                 sparsity=("sparsity", "first"), request=("request", "first"),
                 bucket=("bucket", "first"), length=("length", "mean")))
    return df, runs


def cut_of(buckets: list[float], design: str) -> float:
    """The largest bucket the fit keeps of a workload's sorted buckets."""
    keep = 1 if design == "workload" else math.ceil(len(buckets) / 3)
    return buckets[keep - 1]


def points_for(workload: str, df: pd.DataFrame, runs: pd.DataFrame, design: str,
               floor: int) -> list[dict[str, object]]:
    """Fit without `workload`'s runs above its cut, predict its held-out buckets."""
    buckets = sorted(runs.loc[runs.workload == workload, "bucket"].unique())
    if len(buckets) < 2:
        return []
    cut = cut_of(buckets, design)
    held_runs = runs[(runs.workload == workload) & (runs.bucket > cut)]
    fit_rows = df[~df["run"].isin(held_runs["run"])]
    model = AcceptanceModel.from_traces(fit_rows.drop(columns=["run", "bucket"]), "real",
                                        min_tokens=floor)
    out: list[dict[str, object]] = []
    keys = ["temperature", "method", "gamma", "bucket"]
    for key, g in held_runs.groupby(keys):
        k: tuple[Any, ...] = tuple(key)  # type: ignore[arg-type]
        temp, method, gamma, bucket = float(k[0]), str(k[1]), int(k[2]), float(k[3])
        sparsities = sorted(g.sparsity.unique())
        per_prompt = g.groupby("request")["length"].mean()  # over the sparsities
        truth = float(g.groupby("sparsity")["length"].mean().mean())
        spread = fit_spread(runs, workload, temp, method, gamma, cut)
        sd = run_sd(per_prompt.to_numpy(), spread)  # as a prediction sizes a run's sd
        se = sd / math.sqrt(len(per_prompt))
        se_from = ("own prompts" if len(per_prompt) > 1 and sd <= float(per_prompt.std(ddof=1))
                   else "fitted prompts' spread")
        dists = [model.lookup(str(method), int(gamma), float(s), int(round(bucket)), workload,
                              float(temp)) for s in sparsities]
        nearest = [model.lookup(str(method), int(gamma), float(s), int(round(cut)), workload,
                                float(temp)).mean_length for s in sparsities]
        note = next((n for n in dists[0].extrapolated if "context trend" in n), "")
        out.append({
            "design": design, "workload": workload, "temperature": float(temp),
            "method": method, "gamma": int(gamma), "fit_up_to": int(round(cut)),
            "context": int(round(bucket)), "spans_beyond": _spans(buckets, cut, bucket),
            "prompts": len(per_prompt), "measured": truth, "measured_se_pct": 100 * se / truth,
            "se_from": se_from,
            "predicted": float(np.mean([d.mean_length for d in dists])),
            "trend_sd_pct": float(np.mean([d.context_trend_sd_pct for d in dists])),
            "nearest_bucket": float(np.mean(nearest)),
            "trend": "covering" if "covering" in note else ("own" if note else "none"),
            "note": note,
        })
    return out


def fit_spread(runs: pd.DataFrame, workload: str, temperature: float, method: str, gamma: int,
               cut: float) -> float:
    """The relative sd of one prompt's mean length (over the sparsities) around its bucket's
    mean, among the fitted prompts of (workload, T, method, γ) at buckets <= cut (0 with
    fewer than two)."""
    fit = runs[(runs.workload == workload) & np.isclose(runs.temperature, temperature)
               & (runs.method == method) & (runs.gamma == gamma) & (runs.bucket <= cut)]
    per_prompt = fit.groupby(["bucket", "request"])["length"].mean()
    if len(per_prompt) < 2:
        return 0.0
    dev = per_prompt / per_prompt.groupby(level="bucket").transform("mean")
    if per_prompt.index.get_level_values("bucket").nunique() == len(per_prompt):
        dev = per_prompt / per_prompt.mean()  # one prompt a bucket: around the fitted mean
    return float(dev.std(ddof=1))


def _spans(buckets: list[float], cut: float, bucket: float) -> float:
    """Doublings of the held-out bucket past the cut, in units of the fitted span (inf when the
    fit holds one bucket of the workload)."""
    fitted = [b for b in buckets if b <= cut]
    span = math.log2(fitted[-1] / fitted[0]) if len(fitted) > 1 else 0.0
    return math.log2(bucket / cut) / span if span > 0 else math.inf


def score(points: pd.DataFrame) -> pd.DataFrame:
    points = points.copy()
    for col in ("predicted", "nearest_bucket"):
        points[f"{col}_err_pct"] = 100 * (points[col] - points.measured) / points.measured
    # the trend's sd is % of the prediction (the interval is around it), the measurement's %
    # of the measured mean
    band = Z95 * np.hypot(points.trend_sd_pct * points.predicted,
                           points.measured_se_pct * points.measured) / 100.0
    points["covered"] = (points.predicted - points.measured).abs() <= band
    points["scale_needed"] = scale_needed(points)
    return points


def scale_needed(points: pd.DataFrame) -> pd.Series:
    """The factor on the trend's unscaled sd (the product's / TREND_SD_SCALE) each point needs
    to fall inside the 95 % interval, its measurement's error beside it (0: inside without
    any trend sd; NaN: outside with a trend sd of 0, which no factor widens)."""
    half = (points.predicted - points.measured).abs() / Z95
    measured = points.measured_se_pct * points.measured / 100.0
    trend = points.trend_sd_pct / TREND_SD_SCALE * points.predicted / 100.0
    need = np.sqrt(np.maximum(half ** 2 - measured ** 2, 0.0))
    return (need / trend.where(trend > 0.0, np.nan)).where(need > 0.0, 0.0)


def calibration(points: pd.DataFrame, quantile: float = 0.95) -> list[str]:
    """TREND_SD_SCALE's evidence: the `quantile` of the factors the points need (a point
    no factor covers, the trend's sd 0, counts as needing more than any), and split by
    workload: each workload's points against the quantile of the other workloads' (their
    coverage is then out of sample)."""
    need = points.scale_needed.fillna(np.inf)
    lines = [f"trend sd scale the points need: {quantile:.0%} quantile "
             f"{np.quantile(need, quantile):.2f} (TREND_SD_SCALE {TREND_SD_SCALE:g})"]
    covered = 0
    for wl in sorted(points.workload.unique()):
        mine = points.workload == wl
        scale = float(np.quantile(need[~mine], quantile))
        inside = int((need[mine] <= scale).sum())
        covered += inside
        lines.append(f"  {wl:<12} scale of the others {scale:5.2f}: covers {inside} of "
                     f"{int(mine.sum())}")
    lines.append(f"  each workload by the others' scale: covers {covered / len(points):.0%} "
                 f"of {len(points)}")
    return lines


def summary(points: pd.DataFrame) -> list[str]:
    lines = []
    groups = [("all", points.index == points.index)] + [
        (w, points.workload == w) for w in sorted(points.workload.unique())]
    for label, sel in groups:
        p = points[sel]
        err, near = p.predicted_err_pct.abs(), p.nearest_bucket_err_pct.abs()
        lines.append(f"{label:<10} {len(p):>3} points  |error| median {err.median():5.2f} %  "
                     f"max {err.max():5.2f} %   nearest bucket median {near.median():5.2f} %  "
                     f"max {near.max():5.2f} %   interval covers {p.covered.mean():.0%}   "
                     f"trend {', '.join(f'{k} {v}' for k, v in p.trend.value_counts().items())}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--design", choices=("third", "workload"), default="third")
    ap.add_argument("--set", default=SET, help=f"the real-weights trace set (default {SET})")
    ap.add_argument("--out", type=Path, default=None,
                    help="CSV (default benchmarks/results/acceptance_holdout_<design>.csv)")
    args = ap.parse_args()
    out = args.out or RESULTS / f"acceptance_holdout_{args.design}.csv"
    ts = load_trace_set(args.set)
    floor = int(ts.meta.get("grid", {}).get("min_tokens", MIN_TOKENS))
    df, runs = run_table(ts.acceptance)
    rows: list[dict[str, object]] = []
    for wl in sorted(runs.workload.unique()):
        rows += points_for(str(wl), df, runs, args.design, floor)
        print(f"{wl}: {sum(r['workload'] == wl for r in rows)} held-out points", flush=True)
    points = score(pd.DataFrame(rows))
    cols = ["workload", "temperature", "method", "gamma", "fit_up_to", "context",
            "spans_beyond", "prompts", "measured", "measured_se_pct", "predicted",
            "predicted_err_pct", "trend_sd_pct", "covered", "nearest_bucket_err_pct", "trend"]
    print(points[cols].round(3).to_string(index=False))
    print("\n".join(summary(points)))
    print("\n".join(calibration(points)))
    command = f"PYTHONPATH=. python benchmarks/acceptance_holdout.py --design {args.design}"
    if args.set != SET:
        command += f" --set {args.set}"
    out.parent.mkdir(parents=True, exist_ok=True)
    points.assign(command=command).to_csv(out, index=False)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
