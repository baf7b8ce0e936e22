"""Context extrapolation on real traces: fit acceptance on short contexts, predict long ones.

CPU, seconds. Data: the packaged real-weights set `smollm2-135m-real` (whatever its longdoc and
recall rows hold; prompts at start contexts 1K, 2K, 3K, 4K and 7K). The fit set is the runs of
its prompts <= 3K, each run whole (`vegas_sim.traces.subset`, as `vegas-sim traces subset
smollm2-135m-real --where 'context<=3488'` writes it: 3K plus the most tokens a run generates;
the 1K, 2K and 3K prompts of longdoc and recall). Held out: every start-context
bucket of the full set above the subset's traced contexts (4K, 7K), per workload (longdoc,
recall), temperature, method and traced γ.

- measured: the full set's mean acceptance length (1 + accepted, as vLLM counts it, bonus
  included) over the runs starting at the bucket, averaged over the traced sparsities; its
  standard error `measured_se_pct` from the prompt-to-prompt spread (the prompt is the unit);
- predicted: the subset's `AcceptanceModel.lookup(...).mean_length` at the bucket's context,
  same sparsities, averaged: beyond the subset's contexts it follows the context trend
  (`sim.context_trend`); `trend_sd_pct` is the trend's own uncertainty at that distance;
- nearest bucket: the rule the trend replaces (the subset's last bucket held), for comparison.

Error: (predicted − measured) / measured. `covered`: |predicted − measured| within 1.96 × the
trend's sd (% of the prediction) and the measurement's standard error (% of the measured)
combined. Beside the headline: `err_over_measured_se`, the
error in units of the measured mean's own standard error, and `within_2_measured_se` (a point
this close to a noisy measurement is not shown to be a model miss). Prints the table, median / max |error| per rule,
and writes benchmarks/results/context_extrapolation.csv (one row per point; the `command`
column is how to reproduce it).

    PYTHONPATH=. python benchmarks/context_extrapolation.py [--cut 3K] [--out CSV]

Far out: `--cut 8K --held-out smollm2-135m-real-yarn4 --out
benchmarks/results/context_extrapolation_yarn.csv` fits on the whole set (1K-7K) and holds out
the YaRN-extended set's 12K-31K buckets (the same weights with RoPE scaled x4: a slightly
different model, +11-13 % perplexity inside the trained window). `--step` predicts them as
`predict` does a workload its RoPE-scaled set did not trace, past the model's native window
(8K; `AcceptanceModel._scaled_shift`): the native lookup where the native evidence ends,
moved by the mean step of the scaled set's other workloads from there to the row's context
(each held-out workload left out of the scaled set in turn), their spread in the sd.

`--anchor-at 4K` checks how an anchor's δ takes up the trend's error (docs/DESIGN.md, Anchors):
each held-out (workload, temperature, method, γ, sparsity) is anchored at its measured bucket
nearest 4K (the fitted model shifted to it, `sim.anchored.AnchoredAcceptance`, as a user's
anchor would be) and its buckets beyond predicted from there. Per point: the anchored
prediction and the unanchored one, the context term as `predict` counts it (from the
anchor's) and as the shape alone would (`trend_sd_pct`), the anchor's own standard error;
`covered` uses the first with both measurement errors, `covered_full_sd` the second.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from vegas_sim.api import with_calibration
from vegas_sim.methods import MIN_TOKENS
from vegas_sim.sim.acceptance import AcceptanceModel, PastWindow
from vegas_sim.sim.anchored import AnchoredAcceptance
from vegas_sim.traces.anchors import Anchor, AnchorSet
from vegas_sim.traces.io import load_trace_set
from vegas_sim.traces.subset import parse_where, subset_trace_set

SET = "smollm2-135m-real"
WORKLOADS = ("longdoc", "recall")
RESULTS = Path(__file__).resolve().parent / "results"
NATIVE_WINDOW = 8192  # SmolLM2-135M's trained positions: past them it runs RoPE-scaled
RUN_KEYS = ["method", "gamma", "sparsity", "temperature", "workload", "request"]


def fit_where(where: str, source: str = SET) -> tuple[AcceptanceModel, pd.DataFrame]:
    """The acceptance model of `source`'s rows that pass `where` (`vegas-sim traces subset`
    conditions), and those rows."""
    with tempfile.TemporaryDirectory() as tmp:
        sub = subset_trace_set(source, Path(tmp) / "subset", where)
        floor = int(sub.meta.get("grid", {}).get("min_tokens", MIN_TOKENS))
        model = AcceptanceModel.from_traces(sub.acceptance, sub.weights_kind, min_tokens=floor)
        return with_calibration(model, load_trace_set(source).info), sub.acceptance


def fit_subset(cut: str, runs: pd.DataFrame, source: str = SET
               ) -> tuple[AcceptanceModel, int, dict[str, int]]:
    """The acceptance model of the set's runs whose prompt is <= `cut` tokens, each run whole
    (to the prompt plus the most any of `runs` generated), its traced max, and each workload's last
    traced bucket (its longest prompt there: the nearest-bucket rule's).

    Whole runs: a run starting at the cut goes on past it, and its first iterations alone
    would make a biased bucket (acceptance rises along a generation)."""
    prompt_max = int(parse_where(f"context<={cut}")[0].values[0])
    reach = prompt_max + int((runs["end"] - runs["start"]).max())
    if ((runs["start"] > prompt_max) & (runs["start"] <= reach)).any():
        raise SystemExit(f"a prompt above {cut} starts before the cut's runs end ({reach}): "
                         "its first iterations would enter the fit; choose another --cut")
    model, rows = fit_where(f"context<={reach}", source)
    edges = measured(rows).groupby("workload")["start"].max().astype(int).to_dict()
    return model, int(rows["context"].max()), edges


def measured(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (workload, temperature, method, γ, start context, sparsity, request): the run's
    mean acceptance length (runs keyed by their request and first context)."""
    by_run = rows.groupby(RUN_KEYS)["context"]
    rows = rows.assign(start=by_run.transform("min"), end=by_run.transform("max"))
    return (rows.assign(length=rows["accepted"] + 1.0)
            .groupby(["workload", "temperature", "method", "gamma", "start", "sparsity",
                      "request"], as_index=False).agg(length=("length", "mean"),
                                                      end=("end", "max")))


def stepped(model: AcceptanceModel, scaled: pd.DataFrame, workload: str) -> AcceptanceModel:
    """`model` with lookups past SmolLM2's native window stepped by the scaled set's rows of
    every workload but `workload` (`--step`: the held-out workload is not traced there)."""
    rest = scaled[scaled.workload != workload]
    return model.past_window(PastWindow(NATIVE_WINDOW, lambda: AcceptanceModel.from_traces(
        rest, "real"), f"the scaled set less {workload}", "smollm2-135m"))


def held_out_points(model: AcceptanceModel, runs: pd.DataFrame, traced_max: int,
                    edges: dict[str, int], scaled: pd.DataFrame | None = None
                    ) -> list[dict[str, object]]:
    """One row per held-out (workload, temperature, method, γ, bucket) (module docstring);
    `scaled`: the RoPE-scaled set's rows, for `--step`."""
    out: list[dict[str, object]] = []
    keys = ["workload", "temperature", "method", "gamma", "start"]
    models: dict[str, AcceptanceModel] = {}
    for (wl, temp, method, gamma, start), g in runs[runs.start > traced_max].groupby(keys):
        if scaled is not None and wl not in models:
            models[str(wl)] = stepped(model, scaled, str(wl))
        lookup = models.get(str(wl), model).lookup
        sparsities = sorted(g.sparsity.unique())
        per_prompt = g.groupby("request")["length"].mean()  # over the sparsities
        truth = float(g.groupby("sparsity")["length"].mean().mean())
        se = float(per_prompt.std(ddof=1) / math.sqrt(len(per_prompt)))
        dists = [lookup(str(method), int(gamma), float(s), int(start), str(wl), float(temp))
                 for s in sparsities]
        edge = edges[str(wl)]
        nearest = [model.lookup(str(method), int(gamma), float(s), int(edge), str(wl),
                                float(temp)).mean_length for s in sparsities]
        out.append({
            "workload": wl, "temperature": float(temp), "method": method, "gamma": int(gamma),
            "context": int(start), "doublings": math.log2(int(start) / edge),
            "prompts": len(per_prompt), "measured": truth, "measured_se_pct": 100 * se / truth,
            "predicted": float(np.mean([d.mean_length for d in dists])),
            "trend_sd_pct": float(np.mean([d.context_trend_sd_pct for d in dists])),
            "nearest_bucket": float(np.mean(nearest)),
            "note": dists[len(dists) // 2].extrapolated[0] if dists[0].extrapolated else "",
        })
    return out


def anchored_points(model: AcceptanceModel, runs: pd.DataFrame, traced_max: int,
                    anchor_at: int) -> list[dict[str, object]]:
    """`--anchor-at` (module docstring): one row per held-out (workload, temperature, method,
    γ, sparsity, bucket) past its group's anchor bucket."""
    out: list[dict[str, object]] = []
    keys = ["workload", "temperature", "method", "gamma", "sparsity"]
    for (wl, temp, method, gamma, s), g in runs[runs.start > traced_max].groupby(keys):
        starts = sorted(int(c) for c in g.start.unique())
        at = min(starts, key=lambda c: abs(math.log2(c / anchor_at)))
        anchor_runs = g[g.start == at].length
        anchor = Anchor(str(method), int(gamma), float(s), (at, at), str(wl), float(temp),
                        float(anchor_runs.mean()))
        anchored = AnchoredAcceptance(model, "fit", [AnchorSet(None, "measured", (anchor,))])
        anchor_se = float(anchor_runs.std(ddof=1) / math.sqrt(len(anchor_runs)))
        for start in (c for c in starts if c > at):
            runs_at = g[g.start == start].length
            args = (str(method), int(gamma), float(s), start, str(wl), float(temp))
            dist, shape = anchored.lookup(*args), model.lookup(*args)
            truth = float(runs_at.mean())
            out.append({
                "workload": wl, "temperature": float(temp), "method": method,
                "gamma": int(gamma), "sparsity": float(s), "anchor_context": at,
                "context": start, "prompts": len(runs_at), "measured": truth,
                "measured_se_pct": 100 * float(runs_at.std(ddof=1)) / math.sqrt(len(runs_at))
                / truth, "anchor_se_pct": 100 * anchor_se / anchor.mean_acceptance_length,
                "predicted": dist.mean_length, "unanchored": shape.mean_length,
                "context_sd_pct": dist.context_trend_sd_pct,
                "trend_sd_pct": shape.context_trend_sd_pct,
            })
    return out


def score_anchored(points: pd.DataFrame) -> pd.DataFrame:
    """Errors of the anchored and unanchored predictions, and whether the anchored one lies in
    the band of the context term as counted from the anchor (`covered`) and as the shape's
    whole sd (`covered_full_sd`), each with the point's and the anchor's measurement error."""
    points = points.copy()
    for col in ("predicted", "unanchored"):
        points[f"{col}_err_pct"] = 100 * (points[col] - points.measured) / points.measured
    miss = (points.predicted - points.measured).abs()
    for name, sd in (("covered", "context_sd_pct"), ("covered_full_sd", "trend_sd_pct")):
        band = 1.96 * np.sqrt((points[sd] ** 2 + points.anchor_se_pct ** 2)
                              * points.predicted ** 2
                              + (points.measured_se_pct * points.measured) ** 2) / 100.0
        points[name] = miss <= band
    return points


def anchored_summary(points: pd.DataFrame) -> list[str]:
    lines = []
    for label, sel in [("all", points.index == points.index)] + [
            (w, points.workload == w) for w in sorted(points.workload.unique())]:
        p = points[sel]
        lines.append(
            f"{label:<10} {len(p):>4} points  anchored |error| median "
            f"{p.predicted_err_pct.abs().median():5.2f} %  max "
            f"{p.predicted_err_pct.abs().max():6.2f} %   unanchored median "
            f"{p.unanchored_err_pct.abs().median():5.2f} %   context sd median "
            f"{p.context_sd_pct.median():5.2f} % (the shape's {p.trend_sd_pct.median():5.2f} "
            f"%)   covered {p.covered.mean():.0%} (with the shape's sd "
            f"{p.covered_full_sd.mean():.0%})")
    return lines


def score(points: pd.DataFrame) -> pd.DataFrame:
    points = points.copy()
    for col in ("predicted", "nearest_bucket"):
        points[f"{col}_err_pct"] = 100 * (points[col] - points.measured) / points.measured
    # the trend's sd is % of the prediction (the interval is around it), the measurement's %
    # of the measured mean
    band = 1.96 * np.hypot(points.trend_sd_pct * points.predicted,
                           points.measured_se_pct * points.measured) / 100.0
    points["covered"] = (points.predicted - points.measured).abs() <= band
    # beside the headline, never instead of it: the error in units of the measured point's own
    # sampling error (a noisy measurement is not a model miss when within ~2 of them)
    points["err_over_measured_se"] = points.predicted_err_pct / points.measured_se_pct
    points["within_2_measured_se"] = points.err_over_measured_se.abs() <= 2.0
    return points


def summary_lines(points: pd.DataFrame) -> list[str]:
    lines = []
    for label, sel in [("all", points.index == points.index)] + [
            (f"T {t:g}", points.temperature == t) for t in sorted(points.temperature.unique())
    ] + [(w, points.workload == w) for w in sorted(points.workload.unique())]:
        p = points[sel]
        trend, near = p.predicted_err_pct.abs(), p.nearest_bucket_err_pct.abs()
        lines.append(f"{label:<8} {len(p):>3} points  context trend |error| median "
                     f"{trend.median():5.2f} %  max {trend.max():5.2f} %   nearest bucket "
                     f"(old rule) median {near.median():5.2f} %  max {near.max():5.2f} %   "
                     f"trend interval covers {p.covered.mean():.0%}")
    miss = points[points.predicted_err_pct.abs() > 10.0]
    lines.append(f"|error| > 10 %: {len(miss)} of {len(points)} points; of them within 2 "
                 f"measured SE: {int(miss.within_2_measured_se.sum())}; all points within 2 "
                 f"measured SE: {int(points.within_2_measured_se.sum())} of {len(points)}; "
                 f"median |error| / measured SE "
                 f"{points.err_over_measured_se.abs().median():.2f}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--cut", default="3K",
                    help="fit on the runs of prompts <= this, whole (default 3K)")
    ap.add_argument("--out", type=Path, default=RESULTS / "context_extrapolation.csv")
    ap.add_argument("--fit", default=SET, help=f"the set fitted below the cut (default {SET})")
    ap.add_argument("--held-out", default=None,
                    help="the set whose buckets above the fit are predicted (default: --fit)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help=f"the workloads fitted and held out (default {','.join(WORKLOADS)})")
    ap.add_argument("--anchor-at", default=None,
                    help="anchor each held-out group at its bucket nearest this context and "
                         "predict the buckets beyond it (module docstring)")
    ap.add_argument("--step", action="store_true",
                    help="past the 8K native window, step each held-out workload by the "
                         "held-out set's other workloads (module docstring)")
    args = ap.parse_args()
    workloads = tuple(args.workloads.split(","))
    held_out = args.held_out or args.fit
    full = load_trace_set(held_out).acceptance
    runs = measured(full[full.workload.isin(workloads)])
    model, traced_max, edges = fit_subset(args.cut, runs, args.fit)
    if args.anchor_at is not None:
        run_anchored(args, model, runs, traced_max)
        return
    scaled = full[full.workload.isin(workloads)] if args.step else None
    points = score(pd.DataFrame(held_out_points(model, runs, traced_max, edges, scaled)))
    cols = ["workload", "temperature", "method", "gamma", "context", "prompts", "measured",
            "measured_se_pct", "predicted", "predicted_err_pct", "err_over_measured_se",
            "within_2_measured_se", "trend_sd_pct", "covered", "nearest_bucket",
            "nearest_bucket_err_pct"]
    print(f"fit: {args.fit} runs of prompts <= {args.cut}, whole (traced up to {traced_max}); "
          f"held out: {held_out}'s {', '.join(workloads)} buckets above")
    print(points[cols].round(3).to_string(index=False))
    print("\n".join(summary_lines(points)))
    print("e.g.", points.note.iloc[0])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    points[cols + ["note"]].assign(command=command_of(args)).to_csv(args.out, index=False)
    print(f"wrote {args.out}")


def command_of(args: argparse.Namespace) -> str:
    """The command that reproduces a run of these arguments (defaults left out)."""
    held_out = args.held_out or args.fit
    return "PYTHONPATH=. python benchmarks/context_extrapolation.py" + (
        f" --cut {args.cut}" if args.cut != "3K" else "") + (
        f" --fit {args.fit}" if args.fit != SET else "") + (
        f" --held-out {held_out}" if held_out != args.fit else "") + (
        f" --out {args.out}" if args.out != RESULTS / "context_extrapolation.csv" else "") + (
        f" --workloads {args.workloads}" if args.workloads != ",".join(WORKLOADS) else "") + (
        f" --anchor-at {args.anchor_at}" if args.anchor_at is not None else "") + (
        " --step" if args.step else "")


def run_anchored(args: argparse.Namespace, model: AcceptanceModel, runs: pd.DataFrame,
                 traced_max: int) -> None:
    anchor_at = int(parse_where(f"context<={args.anchor_at}")[0].values[0])
    points = score_anchored(pd.DataFrame(anchored_points(model, runs, traced_max, anchor_at)))
    print("\n".join(anchored_summary(points)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    points.round(4).assign(command=command_of(args)).to_csv(args.out, index=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
