"""Acceptance hold-outs per workload on real traces, scored on mean acceptance length.

CPU, about a minute. Data: the packaged real-weights set `smollm2-135m-real` (`--set` another,
e.g. `gemma3-270m-real`). The hold-out itself is the product's (`vegas_sim.validate.
context_holdout`, also `vegas-sim traces trend-holdout`): for each workload in turn the fit is
the set less that workload's longer prompts, which are predicted along the context trend.
`--design third` (default) keeps each workload's shortest third of buckets (the context
hold-out); `--design workload` only its shortest bucket (the workload hold-out).

Prints per-point rows, per-workload median / max |error| and coverage, the factor on the
trend's sd the points need (in sample, and per workload from the others); writes a CSV (the
`command` column reproduces it); `--write-scale` records the scale in the set's meta.json.

    PYTHONPATH=. python benchmarks/acceptance_holdout.py [--design third|workload] [--set NAME]
        [--write-scale] [--out CSV]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vegas_sim.traces.io import load_trace_set
from vegas_sim.validate.context_holdout import (
    DESIGNS,
    calibration_lines,
    holdout,
    needed_scale,
    summary_lines,
    write_scale,
)

SET = "smollm2-135m-real"
RESULTS = Path(__file__).resolve().parent / "results"
COLUMNS = ["workload", "temperature", "method", "gamma", "fit_up_to", "context", "spans_beyond",
           "prompts", "measured", "measured_se_pct", "predicted", "predicted_err_pct",
           "trend_sd_pct", "covered", "nearest_bucket_err_pct", "trend"]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--design", choices=DESIGNS, default="third")
    ap.add_argument("--set", default=SET, help=f"the real-weights trace set (default {SET})")
    ap.add_argument("--write-scale", action="store_true",
                    help="record the sd scale the points give in the set's meta.json (the "
                         "third design: the context hold-out the product's scale means)")
    ap.add_argument("--out", type=Path, default=None,
                    help="CSV (default benchmarks/results/acceptance_holdout_<design>.csv)")
    args = ap.parse_args()
    if args.write_scale and args.design != "third":
        raise SystemExit("--write-scale: the scale is the context hold-out's (--design third)")
    out = args.out or RESULTS / f"acceptance_holdout_{args.design}.csv"
    ts = load_trace_set(args.set)
    points = holdout(ts, args.design,
                     lambda wl, n: print(f"{wl}: {n} held-out points", flush=True))
    print(points[COLUMNS].round(3).to_string(index=False))
    print("\n".join(summary_lines(points)))
    print("\n".join(calibration_lines(points)))
    command = f"PYTHONPATH=. python benchmarks/acceptance_holdout.py --design {args.design}"
    if args.set != SET:
        command += f" --set {args.set}"
    out.parent.mkdir(parents=True, exist_ok=True)
    points.assign(command=command).to_csv(out, index=False)
    print(f"wrote {out}")
    if args.write_scale:
        scale = needed_scale(points)
        write_scale(ts.path, scale, command)
        print(f"wrote scale {scale:g} to {ts.path / 'meta.json'}")


if __name__ == "__main__":
    main()
