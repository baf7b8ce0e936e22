"""Context hold-out of a real-weights trace set: how far the acceptance model's context trend
misses contexts it was not fitted on, and the factor on the trend's sd that covers them.

For each workload W in turn the fit is the whole set less W's runs whose prompt lies above a
cut, each run kept whole (a run belongs to its prompt), and the held-out runs are predicted
with `AcceptanceModel.lookup` at their bucket's context (W's own buckets: exact prompt lengths
when it has few, else log2 bins, as the model buckets them), averaged over the traced
sparsities. Designs (DESIGNS):

- "third": the cut is the shortest third of W's traced prompt contexts (its distinct bucket
  centres, ceil(K / 3) of them): the context hold-out, whose factor calibrates the set;
- "workload": the cut keeps only W's shortest bucket: W's long prompts removed, predicted from
  its shortest bucket and the rest of the set (the other workloads' trends cover the contexts
  W's own cannot reach: `sim.context_trend.covering_trend`).

measured: the mean over the held-out bucket's runs of 1 + accepted (vLLM's count, bonus
included) averaged over the sparsities; its standard error from the prompt-to-prompt spread. A
held-out bucket of few prompts cannot measure its own spread: as a prediction sizes a run's
(`sim.uncertainty.run_sd`), one prompt takes the prompt-to-prompt spread of the workload's
fitted prompts (`fit_spread`), two or three the larger of their own and that (`se_from`).
nearest_bucket: the fit's last bucket of W held (no trend). Errors: (predicted − measured) /
measured. `covered`: |predicted − measured| within 1.96 × the trend's sd (% of the prediction)
and the measurement's standard error (% of the measured) combined, as the printed interval
lies. `scale_needed`: the factor on the trend's model sd (unscaled) that point needs to be
covered; its COVERAGE_QUANTILE over the points, rounded (`calibrated_scale`), is the set's
scale (`needed_scale`), which `write_scale` records in its meta.json.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vegas_sim.api import with_calibration
from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.acceptance_cells import split_runs, workload_buckets
from vegas_sim.sim.context_trend import TREND_SD_SCALE, Z95, calibrated_scale
from vegas_sim.sim.uncertainty import run_sd
from vegas_sim.traces.io import TraceSet
from vegas_sim.traces.meta import TraceSetMeta
from vegas_sim.traces.schema import CALIBRATION_KEY

DESIGNS = ("third", "workload")
# the share of held-out points the scaled interval is to cover: the interval's own level
COVERAGE_QUANTILE = 0.95
# a factor past this is no calibration: the trend misses the points whatever its sd says
MAX_SCALE = 20.0
UNCOVERABLE = 1e6  # the factor of a point missed with a trend sd of 0 (past MAX_SCALE)


def holdout(trace_set: TraceSet, design: str = "third",
            progress: Callable[[str, int], None] | None = None) -> pd.DataFrame:
    """The scored held-out points of every workload of `trace_set` (real weights), predicted
    with the set's trend sd scale, as `predict` scales it (`api.with_calibration`);
    `progress(workload, points)` after each workload."""
    df, runs = run_table(trace_set.acceptance)
    rows: list[dict[str, object]] = []
    for wl in sorted(runs.workload.unique()):
        found = points_for(str(wl), df, runs, design, trace_set.info)
        rows += found
        if progress is not None:
            progress(str(wl), len(found))
    return score(pd.DataFrame(rows)) if rows else pd.DataFrame()


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
               info: TraceSetMeta) -> list[dict[str, object]]:
    """Fit without `workload`'s runs above its cut, predict its held-out buckets (the trend's
    sd scaled by the set's calibration, `info`, as `predict` scales it)."""
    buckets = sorted(runs.loc[runs.workload == workload, "bucket"].unique())
    if len(buckets) < 2:
        return []
    cut = cut_of(buckets, design)
    held_runs = runs[(runs.workload == workload) & (runs.bucket > cut)]
    fit_rows = df[~df["run"].isin(held_runs["run"])]
    model = AcceptanceModel.from_traces(fit_rows.drop(columns=["run", "bucket"]), "real",
                                        min_tokens=info.grid.min_tokens)
    with_calibration(model, info)
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
            "trend_sd_scale": model.trend_sd_scale,
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
    """Errors (% of the measured mean), `covered` and `scale_needed` of the held-out points."""
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
    """The factor on the trend's unscaled sd (the product's / its scale) each point needs
    to fall inside the 95 % interval, its measurement's error beside it (0: inside without
    any trend sd; NaN: outside with a trend sd of 0, which no factor widens)."""
    half = (points.predicted - points.measured).abs() / Z95
    measured = points.measured_se_pct * points.measured / 100.0
    trend = points.trend_sd_pct / points.trend_sd_scale * points.predicted / 100.0
    need = np.sqrt(np.maximum(half ** 2 - measured ** 2, 0.0))
    return (need / trend.where(trend > 0.0, np.nan)).where(need > 0.0, 0.0)


def calibration_lines(points: pd.DataFrame,
                      quantile: float = COVERAGE_QUANTILE) -> list[str]:
    """The scale's evidence: the `quantile` of the factors the points need and the scale it
    gives, beside the one the points were predicted with (`trend_sd_scale`); and split by
    workload: each workload's points against the scale of the other workloads' (their coverage is
    then out of sample)."""
    need = _needs(points)
    q = float(np.quantile(need, quantile))
    lines = [f"trend sd scale the points need: {quantile:.0%} quantile {_factor(q)}, scale "
             f"{_factor(calibrated_scale(q))} (predicted with "
             f"{points.trend_sd_scale.iloc[0]:g}; default {TREND_SD_SCALE:g})"]
    if points.workload.nunique() < 2:
        return lines
    covered = 0
    for wl in sorted(points.workload.unique()):
        mine = (points.workload == wl).to_numpy()
        others = calibrated_scale(float(np.quantile(need[~mine], quantile)))
        inside = int((need[mine] <= others).sum())
        covered += inside
        lines.append(f"  {wl:<12} scale of the others {_factor(others)}: covers {inside} of "
                     f"{int(mine.sum())}")
    lines.append(f"  each workload by the others' scale: covers {covered / len(points):.0%} "
                 f"of {len(points)}")
    return lines


def _needs(points: pd.DataFrame) -> np.ndarray:
    """[points] the factors needed; a point no factor covers (missed with a trend sd of 0)
    needs UNCOVERABLE, finite so that a quantile between two such points stays defined."""
    return points.scale_needed.fillna(UNCOVERABLE).to_numpy(dtype=float)


def _factor(x: float) -> str:
    return f"{x:5.2f}" if x < MAX_SCALE else f"> {MAX_SCALE:g} (no scale covers them)"


def summary_lines(points: pd.DataFrame) -> list[str]:
    """Per workload (and all): points, median / max |error| of the trend and of the held
    nearest bucket, the interval's coverage, which trend the predictions followed."""
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


def needed_scale(points: pd.DataFrame, quantile: float = COVERAGE_QUANTILE) -> float:
    """The scale these points give: the `quantile` of the factors they need, rounded
    (`calibrated_scale`); inf when it exceeds MAX_SCALE (the trend misses too many of them for
    an interval to cover: no scale is worth recording)."""
    scale = calibrated_scale(float(np.quantile(_needs(points), quantile)))
    return scale if scale <= MAX_SCALE else math.inf


def write_scale(trace_dir: Path, scale: float, command: str) -> None:
    """Record `scale` in the set's meta.json (`acceptance_calibration`) with the command that
    measured it; the data files and their hashes are untouched."""
    meta_file = trace_dir / "meta.json"
    meta = json.loads(meta_file.read_text())
    meta[CALIBRATION_KEY] = {"context_trend_sd_scale": scale, "from": command}
    meta_file.write_text(json.dumps(meta, indent=2, sort_keys=True))
