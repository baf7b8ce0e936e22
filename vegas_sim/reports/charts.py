"""Plotly charts of a sweep. Each builder returns a `Chart` (chart.py): a figure, or None with
a note saying why it was skipped.

Figures follow the paper's figures: Fig. 13 (throughput over γ × sparsity, heatmaps.py), Fig. 9
(speedup over vanilla per method), Fig. 10b (iteration time by phase), Fig. 4 (per-position
acceptance); then throughput and TPOT against batch and context, and the throughput–TPOT
trade-off, faceted by the rest of the cell so that a real grid stays readable. Every method has
one colour and every phase one colour in every chart (style.py); extrapolated values are open
markers or hatched bars, and every static table has an `extrapolated` column.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from vegas_sim.methods import PHASES
from vegas_sim.reports.chart import (
    Chart,
    best_per_method,
    cell_columns,
    cell_label,
    config_label,
    fmt_tokens,
    method_order,
    missing,
    skip,
)
from vegas_sim.reports.csv import rate_columns
from vegas_sim.reports.heatmaps import heatmaps
from vegas_sim.reports.provenance import (
    extrapolated_mask,
    has_interval,
    interval_caption,
    mark_column,
)
from vegas_sim.reports.style import (
    DASHES,
    LAYOUT,
    method_color,
    patterns,
    phase_color,
    symbols,
)
from vegas_sim.reports.validate_tune import error_table  # re-exported: tests and notebooks

__all__ = ["best_per_method", "error_table", "heatmaps", "reference_cell", "sweep_charts"]

MAX_FACET_COLUMNS = 3
FACET_PX = 320  # height of one row of facets
OPEN_MARKERS = "open markers: extrapolated"


# ---- speedup, phases, acceptance -------------------------------------------------------------
def method_comparison(df: pd.DataFrame) -> Chart:
    """Speedup over vanilla of each method at its best (γ, s), per cell (Fig. 9)."""
    title = "Speedup over vanilla, each method at its best (γ, s)"
    miss = missing(df, ("method", "speedup_vs_vanilla", "throughput_tok_s"))
    if miss:
        return skip(title, f"no column {', '.join(miss)}")
    best = best_per_method(df)
    best = best[best["method"] != "vanilla"].dropna(subset=["speedup_vs_vanilla"])
    if best.empty:
        return skip(title, "no speculative method with a speedup value")
    cells = cell_columns(best)
    best = best.assign(cell=[cell_label(r, cells) or "all rows" for _, r in best.iterrows()])
    with_ci = has_interval(best, "speedup_ci_low", "speedup_ci_high")
    fig = go.Figure()
    for m in method_order(list(best["method"].unique())):
        g = best[best["method"] == m]
        err = None
        if with_ci:
            err = {"type": "data", "symmetric": False,
                   "array": (g["speedup_ci_high"] - g["speedup_vs_vanilla"]).clip(lower=0),
                   "arrayminus": (g["speedup_vs_vanilla"] - g["speedup_ci_low"]).clip(lower=0)}
        fig.add_trace(go.Bar(
            x=g["cell"], y=g["speedup_vs_vanilla"], name=m, error_y=err,
            marker={"color": method_color(m),
                    "pattern": patterns(list(extrapolated_mask(g)))},
            customdata=np.stack([g["gamma"], g["sparsity"], g["throughput_tok_s"]], axis=1),
            hovertemplate=(f"{m}<br>%{{x}}<br>speedup %{{y:.2f}}×<br>γ=%{{customdata[0]}}, "
                           "s=%{customdata[1]}<br>%{customdata[2]:.1f} tok/s<extra></extra>"),
        ))
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray")
    fig.update_layout(**LAYOUT, title=title, barmode="group", yaxis_title="speedup over vanilla",
                      xaxis_title="")
    table = best[["cell", "method", "gamma", "sparsity", "throughput_tok_s",
                  "speedup_vs_vanilla"]].assign(extrapolated=mark_column(best))
    caption = (interval_caption(best) if with_ci or "engine" in best.columns
               else "no interval in the table")
    return Chart(title, fig, caption=f"{caption}; hatched bars: extrapolated", table=table,
                 slug="speedup")


def reference_cell(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of the cell with the most methods (ties: the largest context, then batch);
    empty for an empty table."""
    cells = cell_columns(df)
    if not cells or df.empty:
        return df
    counts = df.groupby(cells, dropna=False)["method"].nunique().reset_index(name="n_methods")
    sort_by = ["n_methods", *[c for c in ("context", "batch") if c in counts.columns]]
    top = counts.sort_values(sort_by, ascending=False).iloc[0]
    mask = np.ones(len(df), dtype=bool)
    for c in cells:
        mask &= (df[c] == top[c]).to_numpy() | (df[c].isna() & pd.isna(top[c])).to_numpy()
    return df[mask]


# The roofline columns a phase table shows (sim.roofline; docs/OUTPUTS.md)
ROOFLINE_SHOWN = ("roofline_ms", "roofline_pct", "roofline_binds", "verify_compute_batch")
# and the KV-selection overhead as the Vegas paper's Fig. 10b counts it (sim.kv_selection)
KV_SELECTION_SHOWN = ("ms_verify_collect", "kv_selection_pct")


def phase_breakdown(df: pd.DataFrame) -> Chart:
    """Iteration time by phase, stacked, for each method's best row in one cell (Fig. 10b)."""
    title = "Iteration time by phase"
    phases = [p for p in PHASES if f"ms_{p}" in df.columns
              and pd.to_numeric(df[f"ms_{p}"], errors="coerce").fillna(0).gt(0).any()]
    if not phases or "method" not in df.columns or "throughput_tok_s" not in df.columns:
        return skip(title, "no per-phase columns (ms_<phase>) in the results")
    cell = reference_cell(df)
    best = best_per_method(cell)
    if best.empty:
        return skip(title, "no row with a throughput value")
    best = best.set_index("method").loc[method_order(list(best["method"]))].reset_index()
    ex = list(extrapolated_mask(best))
    labels = [config_label(r) + (" *" if x else "") for (_, r), x in zip(best.iterrows(), ex)]
    fig = go.Figure()
    for p in phases:
        fig.add_trace(go.Bar(x=labels, y=best[f"ms_{p}"].fillna(0.0), name=p,
                             marker={"color": phase_color(p), "pattern": patterns(ex)},
                             hovertemplate=f"{p}: %{{y:.3f}} ms<extra>%{{x}}</extra>"))
    label = cell_label(cell.iloc[0], cell_columns(df)) or "all rows"
    roof = [c for c in ROOFLINE_SHOWN if c in best.columns]
    if "roofline_ms" in roof:  # the iteration's bound from its bytes and FLOPs (sim.roofline)
        fig.add_trace(go.Scatter(x=labels, y=best["roofline_ms"], name="roofline bound",
                                 mode="markers", marker={"symbol": "line-ew-open", "size": 28,
                                                         "color": "black"},
                                 hovertemplate="roofline bound %{y:.3f} ms<extra>%{x}</extra>"))
    fig.update_layout(**LAYOUT, title=f"{title} — {label}", barmode="stack",
                      yaxis_title="ms per iteration", xaxis_title="")
    cols = [c for c in ("method", "gamma", "sparsity") if c in best.columns]
    cols += [f"ms_{p}" for p in phases] + (["iter_ms"] if "iter_ms" in best.columns else [])
    cols += roof + [c for c in KV_SELECTION_SHOWN if c in best.columns]
    bound = "; black bar: the roofline bound (bytes at copy bandwidth, FLOPs at the matmul " \
        "rate)" if roof else ""
    return Chart(title, fig, caption=f"each method at its best (γ, s) in {label}; hatched, '*': "
                                     f"extrapolated{bound}",
                 table=best[cols].assign(extrapolated=mark_column(best)), slug="phases")


def _rate_lines(cell: pd.DataFrame) -> list[tuple[str, pd.Series]]:
    """(name, row) of the rate lines: each method at its best, or one method's sparsities."""
    methods = cell["method"].unique()
    if len(methods) >= 2 or "sparsity" not in cell.columns or "gamma" not in cell.columns:
        rows = best_per_method(cell) if "throughput_tok_s" in cell.columns else cell
        return [(config_label(r), r) for _, r in rows.iterrows()]
    # One method: its rates at the largest γ for every sparsity (how sparsity moves them).
    top = cell[cell["gamma"] == cell["gamma"].max()].sort_values("sparsity")
    return [(f"{r['method']} s={r['sparsity']:g} (γ={int(r['gamma'])})", r)
            for _, r in top.iterrows()]


def acceptance_rates(df: pd.DataFrame) -> Chart:
    """Per-position acceptance rates r_i = P(at least i drafts accepted) (Fig. 4)."""
    title = "Per-position acceptance rates"
    rates = rate_columns(df)
    if not rates or "method" not in df.columns:
        return skip(title, "no per-position rates (rate_1..rate_K or rates) in the results")
    cell = reference_cell(df[df["method"] != "vanilla"])
    if cell.empty:
        return skip(title, "no speculative method in the results")
    fig = go.Figure()
    seen: dict[str, int] = {}
    for name, r in _rate_lines(cell):
        y = pd.to_numeric(r[rates], errors="coerce").to_numpy(dtype=float)
        keep = ~np.isnan(y)
        if not keep.any():
            continue
        m = str(r["method"])
        n = seen[m] = seen.get(m, -1) + 1
        ex = bool(extrapolated_mask(r.to_frame().T)[0])
        fig.add_trace(go.Scatter(
            x=np.arange(1, len(rates) + 1)[keep], y=y[keep], mode="lines+markers",
            name=name + (" *" if ex else ""),
            line={"color": method_color(m), "dash": DASHES[n % len(DASHES)]},
            marker={"symbol": symbols([ex] * int(keep.sum())), "size": 8},
            hovertemplate="position %{x}: %{y:.3f}<extra>" + name + "</extra>"))
    if not fig.data:
        return skip(title, "the rate columns are empty")
    label = cell_label(cell.iloc[0], cell_columns(df)) or "all rows"
    fig.update_layout(**LAYOUT, title=f"{title} — {label}", yaxis_title="P(≥ i drafts accepted)",
                      xaxis_title="draft position i", yaxis_range=[0, 1.02])
    fig.update_xaxes(dtick=1)
    return Chart(title, fig, caption=f"mean acceptance length = 1 + Σ r_i; {OPEN_MARKERS} (*)")


# ---- lines over batch / context, faceted ----------------------------------------------------
def _facets(best: pd.DataFrame, x: str) -> list[tuple[str, pd.DataFrame]]:
    """(label, rows) per facet: one per value of the cell columns other than `x`."""
    cols = [c for c in cell_columns(best) if c != x]
    if not cols:
        return [("", best)]
    return [(cell_label(g.iloc[0], cols), g) for _, g in best.groupby(cols, sort=True,
                                                                       dropna=False)]


def _axis(fig: go.Figure, x: str, values: list[Any], row: int, col: int) -> None:
    if x in ("batch", "context"):
        vals = sorted(values)
        fig.update_xaxes(type="log", tickvals=vals, row=row, col=col,
                         ticktext=[fmt_tokens(v) if x == "context" else str(v) for v in vals])


def _line(g: pd.DataFrame, x: str, y: str, m: str, show: bool) -> go.Scatter:
    g = g.sort_values(x)
    ex = list(extrapolated_mask(g))
    return go.Scatter(
        x=g[x], y=g[y], mode="lines+markers", name=m, legendgroup=m, showlegend=show,
        line={"color": method_color(m)}, marker={"symbol": symbols(ex), "size": 9},
        customdata=np.stack([g["gamma"], g["sparsity"]], axis=1),
        hovertemplate=f"{x}=%{{x}}<br>%{{y:.2f}}<br>γ=%{{customdata[0]}}, "
                      f"s=%{{customdata[1]}}<extra>{m}</extra>")


def faceted_lines(df: pd.DataFrame, x: str, y: str, title: str, y_title: str) -> Chart:
    """`y` against `x`, one line per method at its best-throughput (γ, s) at every point, one
    facet per value of the rest of the cell."""
    miss = missing(df, ("method", "gamma", "sparsity", x, y, "throughput_tok_s"))
    if miss:
        return skip(title, f"no column {', '.join(miss)}")
    if df[x].nunique() < 2:
        return skip(title, f"the results have a single {x} ({df[x].iloc[0]})")
    best = best_per_method(df).dropna(subset=[y])
    facets = _facets(best, x)
    fig, n_rows, n_cols = _facet_grid(facets)
    shown: set[str] = set()
    for k, (_, g) in enumerate(facets):
        r, c = k // n_cols + 1, k % n_cols + 1
        for m in method_order(list(g["method"].unique())):
            fig.add_trace(_line(g[g["method"] == m], x, y, m, m not in shown), row=r, col=c)
            shown.add(m)
        _axis(fig, x, list(g[x].unique()), r, c)
        fig.update_xaxes(title_text=x if r == n_rows else None, row=r, col=c)
        fig.update_yaxes(title_text=y_title if c == 1 else None, row=r, col=c)
    height = FACET_PX * n_rows + 120
    fig.update_layout(**{**LAYOUT, "height": height}, title=title)
    return Chart(title, fig, height=height,
                 caption=f"each method at its best-throughput (γ, s) at every point; "
                         f"{OPEN_MARKERS}")


def _facet_grid(facets: list[tuple[str, pd.DataFrame]]) -> tuple[go.Figure, int, int]:
    """(figure, rows, columns) of small multiples, one panel per facet, at most
    MAX_FACET_COLUMNS a row."""
    n_cols = min(MAX_FACET_COLUMNS, len(facets))
    n_rows = math.ceil(len(facets) / n_cols)
    fig = make_subplots(rows=n_rows, cols=n_cols, subplot_titles=[f for f, _ in facets],
                        horizontal_spacing=0.07, vertical_spacing=min(0.15, 0.6 / n_rows))
    return fig, n_rows, n_cols


def tradeoff(df: pd.DataFrame) -> Chart:
    """Throughput against TPOT: each method's best configuration per batch size, joined in
    batch order (the serving trade-off), one facet per context (and the rest of the cell)."""
    title = "Throughput–TPOT trade-off"
    miss = missing(df, ("method", "gamma", "sparsity", "batch", "tpot_ms_p50",
                        "throughput_tok_s"))
    if miss:
        return skip(title, f"no column {', '.join(miss)}")
    best = best_per_method(df).dropna(subset=["tpot_ms_p50"])
    if best.empty or best["batch"].nunique() < 2:
        return skip(title, "needs at least 2 batch sizes with a TPOT")
    facets = _facets(best, "batch")
    fig, n_rows, n_cols = _facet_grid(facets)
    shown: set[str] = set()
    for k, (_, g) in enumerate(facets):
        r, c = k // n_cols + 1, k % n_cols + 1
        for m in method_order(list(g["method"].unique())):
            gm = g[g["method"] == m].sort_values("batch")
            ex = list(extrapolated_mask(gm))
            fig.add_trace(go.Scatter(
                x=gm["tpot_ms_p50"], y=gm["throughput_tok_s"], mode="lines+markers+text",
                text=[f"B={b}" for b in gm["batch"]], textposition="top center", name=m,
                legendgroup=m, showlegend=m not in shown, line={"color": method_color(m)},
                marker={"symbol": symbols(ex), "size": 9},
                hovertemplate="TPOT %{x:.2f} ms<br>%{y:.1f} tok/s<br>%{text}<extra>" + m
                              + "</extra>"), row=r, col=c)
            shown.add(m)
        fig.update_xaxes(title_text="TPOT p50 (ms)" if r == n_rows else None, row=r, col=c)
        fig.update_yaxes(title_text="throughput (tok/s)" if c == 1 else None, row=r, col=c)
    height = FACET_PX * n_rows + 120
    fig.update_layout(**{**LAYOUT, "height": height}, title=title)
    return Chart(title, fig, height=height,
                 caption="each method at its best-throughput (γ, s) per batch size; up and to "
                         f"the left is better; {OPEN_MARKERS}")


def sweep_charts(df: pd.DataFrame) -> list[Chart]:
    return [
        *heatmaps(df), method_comparison(df), phase_breakdown(df), acceptance_rates(df),
        faceted_lines(df, "batch", "throughput_tok_s", "Throughput vs batch size",
                      "throughput (tok/s)"),
        faceted_lines(df, "context", "throughput_tok_s", "Throughput vs context length",
                      "throughput (tok/s)"),
        faceted_lines(df, "batch", "tpot_ms_p50", "TPOT vs batch size", "TPOT p50 (ms)"),
        faceted_lines(df, "context", "tpot_ms_p50", "TPOT vs context length", "TPOT p50 (ms)"),
        tradeoff(df),
    ]
