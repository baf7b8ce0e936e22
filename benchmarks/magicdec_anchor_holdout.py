"""Published long-context acceptance as a context hold-out (CPU): MagicDec's Llama-3.1-8B
self-speculation rates (the packaged `llama-3.1-8b-magicdec` anchors: StreamingLLM budget 512,
PG-19, 4K-100K) anchored on their shortest contexts only, every published context predicted.

    PYTHONPATH=. python benchmarks/magicdec_anchor_holdout.py \
        --out benchmarks/results/magicdec_anchor_holdout.csv

For each kept prefix (4K; 4K-8K; 4K-16K) the anchored acceptance (`sim.anchored`) is fitted on
the SmolLM2 real set's longdoc shape with those anchors alone and looked up at every published
point (magicdec-stream, γ 4, sparsity 512 / context, longdoc): mean acceptance length against
the published one, and the band `predict` widens the prediction by at that point, the context
trend's sd and the shape-transfer sd (`AcceptanceDist.context_trend_sd_pct`, `transfer_sd_pct`,
summed as the interval sums its extrapolation axes) at 1.96 sd.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pandas as pd

from vegas_sim import api
from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.anchored import AnchoredAcceptance
from vegas_sim.traces.anchors import AnchorSet, load_anchors
from vegas_sim.traces.io import load_trace_set

SHAPE = "smollm2-135m-real"
ANCHORS = "llama-3.1-8b-magicdec"
METHOD, GAMMA, BUDGET, WORKLOAD = "magicdec-stream", 4, 512, "longdoc"
KEPT = (4000, 8000, 16000)  # fit on the published contexts up to each of these
Z95 = 1.96


def kept(published: AnchorSet, last: int) -> AnchorSet:
    """The anchors whose contexts end at or below `last`."""
    keep = tuple(a for a in published.anchors if a.context is not None and a.context[1] <= last)
    return dataclasses.replace(published, anchors=keep)


def rows(shape: AcceptanceModel, published: AnchorSet) -> list[dict[str, object]]:
    """One row per (kept prefix, published point)."""
    out: list[dict[str, object]] = []
    for last in KEPT:
        model = AnchoredAcceptance(shape, SHAPE, [kept(published, last)])
        for anchor in published.anchors:
            assert anchor.context is not None
            context = anchor.context[0]
            dist = model.lookup(METHOD, GAMMA, BUDGET / context, context, WORKLOAD)
            predicted = 1.0 + float(dist.rates.sum())
            band = Z95 * (dist.context_trend_sd_pct + dist.transfer_sd_pct)
            error = 100.0 * (predicted / anchor.mean_acceptance_length - 1.0)
            out.append({"fit_up_to": last, "context": context, "held_out": context > last,
                        "published": anchor.mean_acceptance_length, "predicted": predicted,
                        "error_pct": error, "band_pct": band, "covered": abs(error) <= band})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="CSV of every point")
    args = parser.parse_args()
    shape = api.fit_acceptance(load_trace_set(SHAPE))
    table = pd.DataFrame(rows(shape, load_anchors(ANCHORS)))
    pd.options.display.float_format = "{:.2f}".format
    print(table.to_string(index=False))
    held = table[table["held_out"]]
    for last, group in held.groupby("fit_up_to"):
        err = group["error_pct"].abs()
        print(f"fit <= {last}: {len(group)} held-out points, |error| median {err.median():.1f} %, "
              f"max {err.max():.1f} %, inside the band {int(group['covered'].sum())} of "
              f"{len(group)} (band half-width median {group['band_pct'].median():.0f} %)")
    if args.out is not None:
        table.to_csv(args.out, index=False)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
