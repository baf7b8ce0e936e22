"""How far one model's acceptance level is from another's: the `model` axis of the anchors'
shape-transfer term (`sim.anchored.TRANSFER_SD`).

CPU, about a minute. Data: the two packaged real-weights sets, `smollm2-135m-real` and
`gemma3-270m-real`. At every setting both traced (workload × temperature: T 0 and 0.6), one
anchor per method is counted from each model's own runs as `cross_model_transfer.py` counts
them (the workload's shortest prompt bucket, γ 6 walked from the traced runs, s 0.07, vLLM's
count), and both are fitted on the same shape (SmolLM2's). The difference of the two fitted
logit shifts δ is the level another model would carry at that very setting: what a prediction
inherits when the level comes from a model other than the one predicted (a sibling's anchors,
or the proxy's own level, unanchored). Its root mean square over the settings and methods is
the `model` sd; the mean (one model accepting more overall) is printed beside it, and is
part of the spread a prediction cannot know the sign of.

    PYTHONPATH=. python benchmarks/model_level.py [--out benchmarks/results/model_level.csv]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.anchored import AnchoredAcceptance
from vegas_sim.traces.io import load_trace_set

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cross_model_transfer as cmt  # noqa: E402

SHAPE, OTHER = "smollm2-135m-real", "gemma3-270m-real"
TEMPERATURES = (0.0, 0.6)
RESULTS = Path(__file__).resolve().parent / "results"


def level_differences() -> pd.DataFrame:
    """One row per (temperature, workload, method): δ of OTHER's anchor minus δ of SHAPE's own,
    both fitted on SHAPE's shape at the anchor's configuration."""
    shape_rows = load_trace_set(SHAPE).acceptance
    shape = AcceptanceModel.from_traces(shape_rows, "real")
    mine, other = cmt.with_buckets(shape_rows), cmt.with_buckets(load_trace_set(OTHER).acceptance)
    rows = []
    for temperature in TEMPERATURES:
        for workload in sorted(set(mine.workload) & set(other.workload)):
            own, _ = cmt.anchor_set(mine, SHAPE, workload, temperature)
            theirs, _ = cmt.anchor_set(other, OTHER, workload, temperature)
            fit_own = AnchoredAcceptance(shape, SHAPE, [own]).shifts
            fit_theirs = AnchoredAcceptance(shape, SHAPE, [theirs]).shifts
            for a in theirs.anchors:
                if a.method not in fit_own:
                    continue
                context = int(np.mean(a.context))
                rows.append({"temperature": temperature, "workload": workload,
                             "method": a.method, "context": context,
                             "delta": (fit_theirs[a.method].delta_for(workload, context)
                                       - fit_own[a.method].delta_for(workload, context))})
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--out", type=Path, default=RESULTS / "model_level.csv")
    args = ap.parse_args()
    df = level_differences()
    rms = float(np.sqrt((df.delta ** 2).mean()))
    print(df.round(3).to_string(index=False))
    print(f"{OTHER} level - {SHAPE} level, logit, over {len(df)} (T, workload, method): "
          f"root mean square {rms:.2f} (the model sd), mean {df.delta.mean():+.2f}, "
          f"sd {df.delta.std(ddof=1):.2f}")
    df.assign(command="PYTHONPATH=. python benchmarks/model_level.py").to_csv(args.out,
                                                                              index=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
