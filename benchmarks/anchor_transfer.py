"""Anchor transfer on real SmolLM2 traces: does one anchor per method carry a shape set to
another acceptance level well enough to predict the configurations it did not measure?

CPU, under a minute. Data: the packaged real-weights set `smollm2-135m-real` (SmolLM2-135M;
γ traced 12 on every workload, and 4 on longdoc at T 0.6; sparsities 0.01-0.2; workloads
chat, code, longdoc, reasoning; temperatures 0 and 0.6; output 128-346 tokens per request).

Every number is a mean acceptance length counted from the traces as vLLM counts it
(1 + accepted / drafts over a slice's iterations; drafts of the smallest traced γ ≥ the γ
asked, truncated to it). Anchors are such counts at (γ 6, s 0.07, T 0.6), one per method; a
prediction is `AnchoredAcceptance.range_length` over the held-out slice's context range (the
evaluation the anchors are fitted with). In no design does the shape set hold the held-out
truth:

- workload: the "user's model" is one workload B at T 0.6; the shape is fitted on the OTHER
  three workloads only. Anchors on B; held out: B at every other (γ, s).
- temperature: the "user's model" is the T 0.6 traces, the shape the greedy (T 0) traces.
  Anchors on reasoning; held out: the other workloads at every (γ, s), and reasoning at the
  other (γ, s).
- context: user's model longdoc at T 0.6, shape the T 0 traces. Anchors counted over the
  iterations at KV length ≤ 3K; held out: the iterations above 3K, at every (γ, s).

Held-out points differ from their anchor in the axes named in "held out"
(γ: 2, 3, 4, 5, 7, 8, 10, 12; sparsity: 0.01..0.2). Error: |predicted − counted| / counted.
"shape alone" is the error of the unanchored shape set at the same points. "unmarked" are the
points `predict` would not mark extrapolated (`sim.anchored.far_reasons`: same workload and
temperature, |γ − 6| ≤ GAMMA_NEAR, sparsity within 2× of 0.07, context within 2× of the
anchored range).

    PYTHONPATH=. python benchmarks/anchor_transfer.py [--markdown]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
import pandas as pd

from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.anchored import AnchoredAcceptance, far_reasons
from vegas_sim.traces.anchors import Anchor, AnchorSet
from vegas_sim.traces.io import load_trace_set

SET = "smollm2-135m-real"
ANCHOR_GAMMA, ANCHOR_SPARSITY, TEMPERATURE = 6, 0.07, 0.6
GAMMAS = (2, 3, 4, 5, 6, 7, 8, 10, 12)
CONTEXT_SPLIT = 3072  # context design: anchors at KV length <= this, held out above


@dataclass(frozen=True)
class Slice:
    """The traced iterations of one workload at T 0.6 (optionally a KV-length range)."""

    workload: str
    rows: pd.DataFrame

    def count(self, method: str, gamma: int, sparsity: float
              ) -> tuple[float, int, tuple[int, int]] | None:
        """(vLLM mean acceptance length, drafts, context range) at (method, γ, s)."""
        r = self.rows[(self.rows.method == method) & np.isclose(self.rows.sparsity, sparsity)]
        traced = [g for g in r.gamma.unique() if g >= gamma]
        if not traced:
            return None
        r = r[r.gamma == min(traced)]
        acc = np.minimum(r.accepted.to_numpy(), gamma)
        return 1.0 + float(acc.mean()), len(acc), (int(r.context.min()), int(r.context.max()))


def t06(df: pd.DataFrame, workload: str) -> Slice:
    return Slice(workload, df[(df.workload == workload) & np.isclose(df.temperature, TEMPERATURE)])


def anchor_set(sl: Slice, methods: list[str], label: str) -> AnchorSet:
    anchors = []
    for m in methods:
        counted = sl.count(m, ANCHOR_GAMMA, ANCHOR_SPARSITY)
        assert counted is not None, f"{m} has no γ >= {ANCHOR_GAMMA} traces in {label}"
        length, n, ctx = counted
        anchors.append(Anchor(m, ANCHOR_GAMMA, ANCHOR_SPARSITY, ctx, sl.workload, TEMPERATURE,
                              length, num_drafts=n, source=f"{SET} {label}"))
    return AnchorSet(model="smollm2-135m", source=label, anchors=tuple(anchors), path=label)


def held_out(design: str, model: AnchoredAcceptance, shape: AcceptanceModel, sl: Slice,
             methods: list[str], differs: list[str]) -> list[dict[str, object]]:
    """One row per (method, γ, s) of `sl`: counted vs predicted over its context range.
    `differs`: the axes the slice itself differs from its anchors in (workload, context)."""
    rows = []
    sparsities = sorted(sl.rows.sparsity.unique())
    for m in methods:
        for g in GAMMAS:
            for s in sparsities:
                counted = sl.count(m, g, float(s))
                if counted is None:
                    continue
                axes = [*differs, *(["γ"] if g != ANCHOR_GAMMA else []),
                        *(["sparsity"] if not np.isclose(s, ANCHOR_SPARSITY) else [])]
                if not axes:
                    continue  # the anchor itself
                length, _, ctx = counted
                pred = model.range_length(m, g, float(s), ctx, sl.workload, TEMPERATURE)
                base = shape_length(shape, m, g, float(s), ctx, sl.workload)
                anchor = model.shifts[m].anchors[0]
                far = far_reasons(anchor, g, float(s), (ctx[0] + ctx[1]) // 2, sl.workload,
                                  TEMPERATURE)
                rows.append({"design": design, "workload": sl.workload, "method": m,
                             "gamma": g, "sparsity": float(s), "held out": "+".join(axes),
                             "marked": bool(far), "counted": length, "predicted": pred,
                             "shape": base})
    return rows


def shape_length(shape: AcceptanceModel, method: str, gamma: int, sparsity: float,
                 ctx: tuple[int, int], workload: str) -> float:
    """The unanchored shape over the same context range (an anchored model without anchors)."""
    return AnchoredAcceptance(shape, "shape").range_length(method, gamma, sparsity, ctx,
                                                           workload, TEMPERATURE)


def workload_design(df: pd.DataFrame, methods: list[str]) -> list[dict[str, object]]:
    rows = []
    for wl in sorted(df.workload.unique()):
        shape = AcceptanceModel.from_traces(df[df.workload != wl], "real")
        sl = t06(df, wl)
        model = AnchoredAcceptance(shape, f"{SET} without {wl}",
                                   [anchor_set(sl, methods, f"{wl} T0.6")])
        rows += held_out("workload", model, shape, sl, methods, [])
    return rows


def temperature_design(df: pd.DataFrame, methods: list[str]) -> list[dict[str, object]]:
    shape = AcceptanceModel.from_traces(df[df.temperature == 0.0], "real")
    model = AnchoredAcceptance(shape, f"{SET} T0",
                               [anchor_set(t06(df, "reasoning"), methods, "reasoning T0.6")])
    rows = []
    for wl in sorted(df.workload.unique()):
        rows += held_out("temperature", model, shape, t06(df, wl), methods,
                         [] if wl == "reasoning" else ["workload"])
    return rows


def context_design(df: pd.DataFrame, methods: list[str]) -> list[dict[str, object]]:
    shape = AcceptanceModel.from_traces(df[df.temperature == 0.0], "real")
    ld = t06(df, "longdoc")
    low = Slice("longdoc", ld.rows[ld.rows.context <= CONTEXT_SPLIT])
    high = Slice("longdoc", ld.rows[ld.rows.context > CONTEXT_SPLIT])
    model = AnchoredAcceptance(shape, f"{SET} T0",
                               [anchor_set(low, methods, f"longdoc T0.6 ctx<={CONTEXT_SPLIT}")])
    return held_out("context", model, shape, high, methods, ["context"])


def _stats(design: str, label: str, g: pd.DataFrame) -> dict[str, object]:
    near = g[~g.marked]
    return {"design": design, "held out": label, "points": len(g),
            "median err %": round(float(g.err.median()), 2),
            "p90 err %": round(float(g.err.quantile(0.9)), 2),
            "max err %": round(float(g.err.max()), 2),
            "shape alone median %": round(float(g.shape_err.median()), 2),
            "unmarked points": len(near),
            "unmarked median / max %": (f"{near.err.median():.2f} / {near.err.max():.2f}"
                                        if len(near) else "-")}


def summary(df: pd.DataFrame) -> pd.DataFrame:
    out = []
    for design, d in df.groupby("design", sort=False):
        for axis, g in d.groupby("held out", sort=True):
            out.append(_stats(str(design), str(axis), g))
        if d.workload.nunique() > 1:
            for wl, g in d.groupby("workload", sort=True):
                out.append(_stats(str(design), f"workload {wl} (all its points)", g))
        out.append(_stats(str(design), "all held out", d))
    out.append(_stats("all designs", "all held out", df))
    return pd.DataFrame(out)


def markdown(table: pd.DataFrame) -> str:
    """A GitHub markdown table (pandas' to_markdown needs the optional tabulate)."""
    lines = ["| " + " | ".join(map(str, table.columns)) + " |",
             "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = ap.parse_args()
    df = load_trace_set(SET).acceptance
    methods = sorted(df.method.unique())
    rows = (workload_design(df, methods) + temperature_design(df, methods)
            + context_design(df, methods))
    pts = pd.DataFrame(rows)
    pts["err"] = 100.0 * (pts.predicted - pts.counted).abs() / pts.counted
    pts["shape_err"] = 100.0 * (pts["shape"] - pts.counted).abs() / pts.counted
    table = summary(pts)
    print(markdown(table) if args.markdown else table.to_string(index=False))


if __name__ == "__main__":
    main()
