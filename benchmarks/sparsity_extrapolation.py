"""Sparsity hold-outs on real traces: fit acceptance on some sparsities, predict the others.

CPU, seconds. Data: the packaged real-weights set `smollm2-135m-real` (sparsities 0.01, 0.02,
0.03, 0.05, 0.07, 0.1, 0.15, 0.2 at every method, γ 4 and 12, T 0 and 0.6, five workloads).
Two cuts (`vegas_sim.traces.subset`, as `vegas-sim traces subset --where` writes them):

- between: the subset with s ∈ {0.01, 0.05, 0.2}, predicted at 0.02, 0.03, 0.07, 0.1, 0.15;
- beyond: the subset with s <= 0.07, predicted at 0.1, 0.15, 0.2.

One point per (case, workload, temperature, method, traced γ, held-out sparsity), pooled over
context buckets (each run predicted at its own start context, where its budget sets the
sparsity rule's weights, and averaged like the measurement): a single bucket holds 3-16
prompts (a grid measured twice differs by ~5 % per bucket, as large as the errors to be told
apart).

- measured: the full set's mean acceptance length (1 + accepted, as vLLM counts it, bonus
  included) over the point's runs; `measured_se_pct` its standard error from the
  prompt-to-prompt spread (the prompt is the unit);
- predicted: the subset's `AcceptanceModel.lookup(...).mean_length` at each run's start
  context (at the traced γ), averaged over the runs like the measurement;
- whole_set: the same lookup on the whole set (the held-out sparsity traced): what the
  model's smoothing alone leaves, the floor of the cut's error.

Error: (predicted − measured) / measured; `within_2_measured_se`: |error| within twice the
measurement's standard error (a point this close to a noisy measurement is not shown to be a
model miss). Prints the table, median / max |error| per case (all workloads; the long-prompt
workloads longdoc and recall, where sparsity sets the draft's budget; the short-prompt ones,
which sit at the budget floor at low sparsity), and writes
benchmarks/results/sparsity_extrapolation.csv (one row per point; the `command` column is how
to reproduce it).

    PYTHONPATH=. python benchmarks/sparsity_extrapolation.py [--out CSV]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from context_extrapolation import RESULTS, SET, fit_where, measured  # noqa: E402

from vegas_sim.methods import MIN_TOKENS  # noqa: E402
from vegas_sim.sim.acceptance import AcceptanceModel  # noqa: E402
from vegas_sim.traces.io import load_trace_set  # noqa: E402

# case → (the subset's --where, the sparsities predicted)
CASES = {"between": ("sparsity in 0.01|0.05|0.2", (0.02, 0.03, 0.07, 0.1, 0.15)),
         "beyond": ("sparsity<=0.07", (0.1, 0.15, 0.2))}
LONG_PROMPTS = ("longdoc", "recall")
POINT = ["workload", "temperature", "method", "gamma", "sparsity"]
COMMAND = "PYTHONPATH=. python benchmarks/sparsity_extrapolation.py"


def _mean_prediction(model: AcceptanceModel, g: pd.DataFrame, key: tuple[Any, ...]) -> float:
    """The lookup's mean acceptance length at each run's start context, averaged over runs."""
    wl, temp, method, gamma, s = key
    at = {int(c): model.lookup(str(method), int(gamma), float(s), int(c), str(wl),
                               float(temp)).mean_length for c in g.start.unique()}
    return float(np.mean([at[int(c)] for c in g.start]))


def points(case: str, model: AcceptanceModel, whole: AcceptanceModel,
           runs: pd.DataFrame) -> list[dict[str, object]]:
    """One row per held-out (workload, temperature, method, γ, sparsity) of `case`."""
    held = CASES[case][1]
    out: list[dict[str, object]] = []
    sel = runs[np.isclose(runs.sparsity.to_numpy()[:, None], held).any(axis=1)]
    for key, g in sel.groupby(POINT):
        per_prompt = g.groupby("request")["length"].mean()
        truth = float(g.length.mean())
        se = float(per_prompt.std(ddof=1) / math.sqrt(len(per_prompt)))
        note = model.lookup(str(key[2]), int(key[3]), float(key[4]), int(g.start.iloc[0]),
                            str(key[0]), float(key[1])).extrapolated
        out.append({"case": case, **dict(zip(POINT, key)), "prompts": len(per_prompt),
                    "measured": truth, "measured_se_pct": 100 * se / truth,
                    "predicted": _mean_prediction(model, g, key),
                    "whole_set": _mean_prediction(whole, g, key),
                    "note": next((n for n in note if "sparsity" in n), "")})
    return out


def score(pts: pd.DataFrame) -> pd.DataFrame:
    pts = pts.copy()
    for col in ("predicted", "whole_set"):
        pts[f"{col}_err_pct"] = 100 * (pts[col] - pts.measured) / pts.measured
    pts["err_over_measured_se"] = pts.predicted_err_pct / pts.measured_se_pct
    pts["within_2_measured_se"] = pts.err_over_measured_se.abs() <= 2.0
    return pts


def summary_lines(pts: pd.DataFrame) -> list[str]:
    lines = []
    for case in CASES:
        c = pts[pts.case == case]
        for label, sel in (("all", c.index == c.index), ("long prompts", c.workload.isin(
                LONG_PROMPTS)), ("short prompts", ~c.workload.isin(LONG_PROMPTS))):
            p = c[sel]
            err, floor = p.predicted_err_pct, p.whole_set_err_pct.abs()
            lines.append(
                f"{case:<8} {label:<13} {len(p):>3} points  |error| median "
                f"{err.abs().median():5.2f} %  max {err.abs().max():5.2f} %  bias "
                f"{err.median():+5.2f} %  within 2 measured SE {int(p.within_2_measured_se.sum())}"
                f" of {len(p)}   whole set median {floor.median():5.2f} %  max "
                f"{floor.max():5.2f} %")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--out", type=Path, default=RESULTS / "sparsity_extrapolation.csv")
    args = ap.parse_args()
    full = load_trace_set(SET)
    floor = int(full.meta.get("grid", {}).get("min_tokens", MIN_TOKENS))
    whole = AcceptanceModel.from_traces(full.acceptance, full.weights_kind, min_tokens=floor)
    runs = measured(full.acceptance)
    rows: list[dict[str, object]] = []
    for case, (where, _) in CASES.items():
        rows += points(case, fit_where(where)[0], whole, runs)
    pts = score(pd.DataFrame(rows))
    cols = ["case"] + POINT + ["prompts", "measured", "measured_se_pct", "predicted",
                               "predicted_err_pct", "err_over_measured_se",
                               "within_2_measured_se", "whole_set", "whole_set_err_pct"]
    print(f"fit: {SET} cut to {'; '.join(f'{c}: {w}' for c, (w, _) in CASES.items())}")
    print(pts[cols].round(3).to_string(index=False))
    print("\n".join(summary_lines(pts)))
    for case in CASES:
        noted = pts[(pts.case == case) & (pts.note != "")]
        if len(noted):
            print(f"e.g. ({case})", noted.note.iloc[len(noted) // 2])
    command = COMMAND + (f" --out {args.out}" if args.out != RESULTS /
                         "sparsity_extrapolation.csv" else "")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pts[cols + ["note"]].assign(command=command).to_csv(args.out, index=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
