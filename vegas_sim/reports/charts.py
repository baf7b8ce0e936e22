"""Plotly charts for reports. Each builder returns a `Chart`: a figure, or None with a note
saying why it was skipped (missing columns, a single point, ...). A chart is never drawn from
partial data that would mislead; it is skipped and the report says so.

Figures follow the paper's figures: Fig. 13 (throughput over γ × sparsity), Fig. 9 (speedup
over vanilla per method), Fig. 10b (iteration time by phase), Fig. 4 (per-position acceptance).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from vegas_sim.methods import METHODS
from vegas_sim.reports.csv import rate_columns
from vegas_sim.sim.predict import is_extrapolated

# Columns that identify a configuration (any present subset); the rest are metrics.
CONFIG_COLUMNS = ("method", "gamma", "sparsity", "batch", "context", "output_len", "engine",
                  "temperature", "workload", "arrival", "requests", "prefill",
                  "kv_capacity_tokens")
# A "cell" is what a user fixes before choosing (γ, s): batch, context and the rest of the
# workload; methods are compared within a cell.
CELL_COLUMNS = tuple(c for c in CONFIG_COLUMNS if c not in ("method", "gamma", "sparsity"))
PHASE_ORDER = ("decode", "draft_step", "quest_meta", "verify", "collect", "select", "sample",
               "prefill", "other")
MAX_HEATMAPS = 4
LAYOUT = {"template": "plotly_white", "height": 420,
          "margin": {"l": 60, "r": 20, "t": 60, "b": 60},
          "font": {"family": "Helvetica, Arial, sans-serif", "size": 13}}


@dataclass
class Chart:
    """One chart of the report; `fig` is None when skipped, and `note` says why."""

    title: str
    fig: go.Figure | None
    note: str = ""
    caption: str = ""
    table: pd.DataFrame | None = field(default=None)  # a static table shown under the chart
    # Short name of `table`'s CSV beside the report (<stem>.report-<slug>.csv); titles are too
    # long for file names. Empty: derived from the title.
    slug: str = ""


def _skip(title: str, why: str) -> Chart:
    return Chart(title, None, note=f"skipped: {why}")


def _missing(df: pd.DataFrame, cols: tuple[str, ...]) -> list[str]:
    return [c for c in cols if c not in df.columns or df[c].isna().all()]


def fmt_tokens(n: Any) -> str:
    """32768 → '32K'."""
    n = int(n)
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def cell_columns(df: pd.DataFrame) -> list[str]:
    """The cell columns of `df` that vary or matter (batch, context always if present)."""
    return [c for c in CELL_COLUMNS if c in df.columns
            and (c in ("batch", "context") or df[c].nunique(dropna=False) > 1)]


def cell_label(row: pd.Series, cols: list[str]) -> str:
    parts = []
    for c in cols:
        v = row[c]
        if c == "batch":
            parts.append(f"B={v}")
        elif c == "context":
            parts.append(f"C={fmt_tokens(v)}")
        else:
            parts.append(f"{c}={v}")
    return ", ".join(parts)


def method_order(methods: list[str]) -> list[str]:
    known = [m for m in METHODS if m in methods]
    return known + sorted(m for m in methods if m not in METHODS)


def best_per_method(df: pd.DataFrame, metric: str = "throughput_tok_s") -> pd.DataFrame:
    """For each (cell, method), the row with the highest `metric` (the method at its best γ, s)."""
    keys = [*cell_columns(df), "method"]
    ok = df.dropna(subset=[metric])
    if ok.empty:
        return ok
    idx = ok.groupby(keys, dropna=False)[metric].idxmax()
    return ok.loc[idx.to_numpy()].reset_index(drop=True)


def _config_label(row: pd.Series) -> str:
    if row["method"] == "vanilla":
        return "vanilla"
    return f"{row['method']} (γ={int(row['gamma'])}, s={row['sparsity']:g})"


# ---- sweep charts ----------------------------------------------------------------------------
def heatmaps(df: pd.DataFrame) -> list[Chart]:
    """Throughput over γ × sparsity, one heatmap per (method, cell) with a 2-D grid (Fig. 13)."""
    title = "Throughput over γ × sparsity"
    miss = _missing(df, ("method", "gamma", "sparsity", "throughput_tok_s"))
    if miss:
        return [_skip(title, f"no column {', '.join(miss)}")]
    spec = df[df["method"] != "vanilla"]
    keys = ["method", *cell_columns(df)]
    groups = [(k, g) for k, g in spec.groupby(keys, dropna=False, sort=False)
              if g["gamma"].nunique() >= 2 and g["sparsity"].nunique() >= 2]
    if not groups:
        return [_skip(title, "needs a sweep with at least 2 values of both γ and sparsity")]
    rank = {m: i for i, m in enumerate(method_order(list(spec["method"].unique())))}
    # Vegas first (the paper's figure), then the other methods, smaller cells first.
    groups.sort(key=lambda kg: (0 if kg[0][0] == "vegas" else 1, rank.get(str(kg[0][0]), 99)))
    charts = []
    cells = cell_columns(df)
    for key, g in groups[:MAX_HEATMAPS]:
        pivot = g.pivot_table(index="gamma", columns="sparsity", values="throughput_tok_s",
                              aggfunc="mean")  # [n_gamma, n_sparsity] tok/s
        best = g.iloc[int(np.argmax(g["throughput_tok_s"].to_numpy()))]
        label = cell_label(g.iloc[0], cells)
        fig = go.Figure(go.Heatmap(
            z=pivot.to_numpy(), x=[f"{s:g}" for s in pivot.columns],
            y=[str(int(v)) for v in pivot.index], colorscale="Viridis",
            colorbar={"title": "tok/s"},
            text=np.vectorize(lambda v: "" if np.isnan(v) else f"{v:.0f}")(pivot.to_numpy()),
            texttemplate="%{text}",
            hovertemplate="γ=%{y}<br>s=%{x}<br>%{z:.1f} tok/s<extra></extra>",
        ))
        fig.add_trace(go.Scatter(
            x=[f"{best['sparsity']:g}"], y=[str(int(best["gamma"]))], mode="markers",
            marker={"symbol": "star", "size": 16, "color": "red",
                    "line": {"color": "white", "width": 1}},
            name="best", hovertemplate="best: γ=%{y}, s=%{x}<extra></extra>", showlegend=False,
        ))
        fig.update_layout(**LAYOUT, title=f"{key[0]} — {label}",
                          xaxis_title="sparsity s", yaxis_title="γ (draft tokens)")
        fig.update_xaxes(type="category")
        fig.update_yaxes(type="category")
        charts.append(Chart(
            f"{title}: {key[0]}, {label}", fig,
            caption=f"best γ={int(best['gamma'])}, s={best['sparsity']:g}: "
                    f"{best['throughput_tok_s']:.1f} tok/s (red star)"))
    if len(groups) > MAX_HEATMAPS:
        charts[-1].note = (f"{len(groups) - MAX_HEATMAPS} more (method, cell) grids not drawn; "
                           "all values are in the CSV")
    return charts


def method_comparison(df: pd.DataFrame) -> Chart:
    """Speedup over vanilla of each method at its best (γ, s), per cell (Fig. 9)."""
    title = "Speedup over vanilla, each method at its best (γ, s)"
    miss = _missing(df, ("method", "speedup_vs_vanilla", "throughput_tok_s"))
    if miss:
        return _skip(title, f"no column {', '.join(miss)}")
    best = best_per_method(df)
    best = best[best["method"] != "vanilla"].dropna(subset=["speedup_vs_vanilla"])
    if best.empty:
        return _skip(title, "no speculative method with a speedup value")
    cells = cell_columns(best)
    best = best.assign(cell=[cell_label(r, cells) for _, r in best.iterrows()])
    fig = go.Figure()
    for m in method_order(list(best["method"].unique())):
        g = best[best["method"] == m]
        err = None
        if {"speedup_ci_low", "speedup_ci_high"} <= set(g.columns):
            err = {"type": "data", "symmetric": False,
                   "array": (g["speedup_ci_high"] - g["speedup_vs_vanilla"]).clip(lower=0),
                   "arrayminus": (g["speedup_vs_vanilla"] - g["speedup_ci_low"]).clip(lower=0)}
        fig.add_trace(go.Bar(
            x=g["cell"], y=g["speedup_vs_vanilla"], name=m, error_y=err,
            customdata=np.stack([g["gamma"], g["sparsity"], g["throughput_tok_s"]], axis=1),
            hovertemplate=(f"{m}<br>%{{x}}<br>speedup %{{y:.2f}}×<br>γ=%{{customdata[0]}}, "
                           "s=%{customdata[1]}<br>%{customdata[2]:.1f} tok/s<extra></extra>"),
        ))
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray")
    fig.update_layout(**LAYOUT, title=title, barmode="group", yaxis_title="speedup over vanilla",
                      xaxis_title="")
    table = best[["cell", "method", "gamma", "sparsity", "throughput_tok_s",
                  "speedup_vs_vanilla"]].rename(columns={"cell": "cell"})
    return Chart(title, fig, caption="error bars: 95% CI", table=table, slug="speedup")


def reference_cell(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of the cell with the most methods (ties: the largest context, then batch)."""
    cells = cell_columns(df)
    if not cells:
        return df
    counts = df.groupby(cells, dropna=False)["method"].nunique().reset_index(name="n_methods")
    sort_by = ["n_methods", *[c for c in ("context", "batch") if c in counts.columns]]
    top = counts.sort_values(sort_by, ascending=False).iloc[0]
    mask = np.ones(len(df), dtype=bool)
    for c in cells:
        mask &= (df[c] == top[c]).to_numpy() | (df[c].isna() & pd.isna(top[c])).to_numpy()
    return df[mask]


def phase_breakdown(df: pd.DataFrame) -> Chart:
    """Iteration time by phase, stacked, for each method's best row in one cell (Fig. 10b)."""
    title = "Iteration time by phase"
    phases = [p for p in PHASE_ORDER if f"ms_{p}" in df.columns and df[f"ms_{p}"].fillna(0).gt(0).any()]
    if not phases or "method" not in df.columns or "throughput_tok_s" not in df.columns:
        return _skip(title, "no per-phase columns (ms_<phase>) in the results")
    cell = reference_cell(df)
    best = best_per_method(cell)
    best = best.set_index("method").loc[method_order(list(best["method"]))].reset_index()
    labels = [_config_label(r) for _, r in best.iterrows()]
    fig = go.Figure()
    for p in phases:
        fig.add_trace(go.Bar(x=labels, y=best[f"ms_{p}"].fillna(0.0), name=p,
                             hovertemplate=f"{p}: %{{y:.3f}} ms<extra>%{{x}}</extra>"))
    label = cell_label(cell.iloc[0], cell_columns(df))
    fig.update_layout(**LAYOUT, title=f"{title} — {label}", barmode="stack",
                      yaxis_title="ms per iteration", xaxis_title="")
    cols = ["method", "gamma", "sparsity", *[f"ms_{p}" for p in phases]]
    if "iter_ms" in best.columns:
        cols.append("iter_ms")
    return Chart(title, fig, caption=f"each method at its best (γ, s) in {label}",
                 table=best[cols], slug="phases")


def acceptance_rates(df: pd.DataFrame) -> Chart:
    """Per-position acceptance rates r_i = P(at least i drafts accepted) (Fig. 4)."""
    title = "Per-position acceptance rates"
    rates = rate_columns(df)
    if not rates or "method" not in df.columns:
        return _skip(title, "no per-position rates (rate_1..rate_K or rates) in the results")
    cell = reference_cell(df[df["method"] != "vanilla"])
    if cell.empty:
        return _skip(title, "no speculative method in the results")
    methods = cell["method"].unique()
    if len(methods) >= 2 or "sparsity" not in cell.columns:
        rows = best_per_method(cell) if "throughput_tok_s" in cell.columns else cell
        named = [(_config_label(r), r) for _, r in rows.iterrows()]
    else:
        # One method: its rates at the largest γ for every sparsity (how sparsity moves them).
        top = cell[cell["gamma"] == cell["gamma"].max()].sort_values("sparsity")
        named = [(f"{r['method']} s={r['sparsity']:g} (γ={int(r['gamma'])})", r)
                 for _, r in top.iterrows()]
    fig = go.Figure()
    for name, r in named:
        y = r[rates].to_numpy(dtype=float)
        keep = ~np.isnan(y)
        if not keep.any():
            continue
        x = np.arange(1, len(rates) + 1)[keep]
        fig.add_trace(go.Scatter(x=x, y=y[keep], mode="lines+markers", name=name,
                                 hovertemplate="position %{x}: %{y:.3f}<extra>" + name
                                 + "</extra>"))
    if not fig.data:
        return _skip(title, "the rate columns are empty")
    label = cell_label(cell.iloc[0], cell_columns(df))
    fig.update_layout(**LAYOUT, title=f"{title} — {label}", yaxis_title="P(≥ i drafts accepted)",
                      xaxis_title="draft position i", yaxis_range=[0, 1.02])
    fig.update_xaxes(dtick=1)
    return Chart(title, fig, caption="mean acceptance length = 1 + Σ r_i")


def _versus(df: pd.DataFrame, x: str, other: str, title: str) -> Chart:
    if _missing(df, ("method", x, "throughput_tok_s")):
        return _skip(title, f"no column {x!r} or throughput")
    if df[x].nunique() < 2:
        return _skip(title, f"the results have a single {x} ({df[x].iloc[0]})")
    best = best_per_method(df)
    fig = go.Figure()
    lines = ["method"] + ([other] if other in best.columns and best[other].nunique() > 1 else [])
    for key, g in best.groupby(lines, sort=False):
        parts: tuple[Any, ...] = key if isinstance(key, tuple) else (key,)
        value = fmt_tokens(parts[1]) if len(parts) > 1 and other == "context" else parts[-1]
        name = str(parts[0]) if len(parts) == 1 else f"{parts[0]} @ {other}={value}"
        g = g.sort_values(x)
        fig.add_trace(go.Scatter(
            x=g[x], y=g["throughput_tok_s"], mode="lines+markers", name=name,
            customdata=np.stack([g["gamma"], g["sparsity"]], axis=1),
            hovertemplate=f"{x}=%{{x}}<br>%{{y:.1f}} tok/s<br>γ=%{{customdata[0]}}, "
                          f"s=%{{customdata[1]}}<extra>{name}</extra>"))
    fig.update_layout(**LAYOUT, title=title, yaxis_title="throughput (tok/s)", xaxis_title=x)
    if x == "context":
        fig.update_xaxes(type="log", tickvals=sorted(best[x].unique()),
                         ticktext=[fmt_tokens(v) for v in sorted(best[x].unique())])
    if x == "batch":
        fig.update_xaxes(type="log", tickvals=sorted(best[x].unique()))
    return Chart(title, fig, caption="each method at its best (γ, s) at every point")


def throughput_vs_batch(df: pd.DataFrame) -> Chart:
    return _versus(df, "batch", "context", "Throughput vs batch size")


def throughput_vs_context(df: pd.DataFrame) -> Chart:
    return _versus(df, "context", "batch", "Throughput vs context length")


def sweep_charts(df: pd.DataFrame) -> list[Chart]:
    return [*heatmaps(df), method_comparison(df), phase_breakdown(df), acceptance_rates(df),
            throughput_vs_batch(df), throughput_vs_context(df)]


# ---- validate --------------------------------------------------------------------------------
def error_table(df: pd.DataFrame) -> pd.DataFrame:
    """Median and max |error| % per regime (and overall): the protocol's summary."""
    d = df.assign(abs_err=df["error_pct"].abs())
    if "regime" not in d.columns:
        d = d.assign(regime="all")
    rows = [{"regime": r, "n": len(g), "median_abs_error_pct": g["abs_err"].median(),
             "max_abs_error_pct": g["abs_err"].max()} for r, g in d.groupby("regime", sort=True)]
    if d["regime"].nunique() > 1:
        rows.append({"regime": "all", "n": len(d), "median_abs_error_pct": d["abs_err"].median(),
                     "max_abs_error_pct": d["abs_err"].max()})
    return pd.DataFrame(rows)


def parity(df: pd.DataFrame) -> Chart:
    """Predicted vs measured throughput; the diagonal is a perfect prediction."""
    title = "Predicted vs measured (held-out configurations)"
    miss = _missing(df, ("predicted", "measured"))
    if miss:
        return _skip(title, f"no column {', '.join(miss)}")
    d = df.dropna(subset=["predicted", "measured"])
    if "error_pct" not in d.columns:
        d = d.assign(error_pct=100.0 * (d["predicted"] - d["measured"]) / d["measured"])
    if "regime" not in d.columns:
        d = d.assign(regime="all")
    fig = go.Figure()
    lo = float(min(d["predicted"].min(), d["measured"].min())) * 0.9
    hi = float(max(d["predicted"].max(), d["measured"].max())) * 1.1
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="perfect",
                             line={"color": "gray", "dash": "dot"}, hoverinfo="skip"))
    config = [c for c in ("method", "gamma", "sparsity", "batch", "context") if c in d.columns]
    for regime, g in d.groupby("regime", sort=True):
        err = None
        # the prediction interval of `predicted`; older tables: the simulation's CI
        low, high = ("pi_low", "pi_high") if "pi_low" in g.columns else ("ci_low", "ci_high")
        if {low, high} <= set(g.columns) and not g[low].isna().all():
            err = {"type": "data", "symmetric": False,
                   "array": (g[high] - g["predicted"]).clip(lower=0),
                   "arrayminus": (g["predicted"] - g[low]).clip(lower=0)}
        text = [", ".join(f"{c}={r[c]}" for c in config) for _, r in g.iterrows()]
        symbols = (["circle-open" if is_extrapolated(x) else "circle" for x in g["extrapolated"]]
                   if "extrapolated" in g.columns else "circle")
        fig.add_trace(go.Scatter(
            x=g["measured"], y=g["predicted"], mode="markers", name=str(regime), error_y=err,
            text=text, customdata=g["error_pct"], marker={"size": 9, "symbol": symbols},
            hovertemplate="%{text}<br>measured %{x:.1f}<br>predicted %{y:.1f}"
                          "<br>error %{customdata:+.2f}%<extra>" + str(regime) + "</extra>"))
    fig.update_layout(**LAYOUT, title=title, xaxis_title="measured throughput (tok/s)",
                      yaxis_title="predicted throughput (tok/s)")
    fig.update_xaxes(range=[lo, hi])
    fig.update_yaxes(range=[lo, hi], scaleanchor="x", scaleratio=1)
    return Chart(title, fig, caption="open markers: extrapolated (outside the calibrated grid); "
                                     "error bars: predicted 95% CI",
                 table=error_table(d), slug="errors")


# ---- tune ------------------------------------------------------------------------------------
def tune_speedups(df: pd.DataFrame) -> Chart:
    """Speedup of the tuned configuration over vanilla and over the best baseline, per cell."""
    title = "Tuned speedup per (batch, context)"
    if _missing(df, ("batch", "context", "speedup_vs_vanilla")):
        return _skip(title, "no batch/context/speedup_vs_vanilla columns")
    d = df.sort_values(["batch", "context"])
    labels = [f"B={int(r['batch'])}, C={fmt_tokens(r['context'])}" for _, r in d.iterrows()]
    fig = go.Figure()
    for col, lo, hi, name in (
        ("speedup_vs_vanilla", "speedup_ci_low", "speedup_ci_high", "over vanilla"),
        ("speedup_vs_baseline", "speedup_vs_baseline_ci_low", "speedup_vs_baseline_ci_high",
         "over the best baseline"),
    ):
        if col not in d.columns or d[col].isna().all():
            continue
        err = None
        if {lo, hi} <= set(d.columns):
            err = {"type": "data", "symmetric": False, "array": (d[hi] - d[col]).clip(lower=0),
                   "arrayminus": (d[col] - d[lo]).clip(lower=0)}
        fig.add_trace(go.Bar(x=labels, y=d[col], name=name, error_y=err,
                             hovertemplate="%{x}<br>%{y:.2f}×<extra>" + name + "</extra>"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray")
    fig.update_layout(**LAYOUT, title=title, barmode="group", yaxis_title="speedup")
    return Chart(title, fig, caption="error bars: 95% CI")


def tune_gamma_map(df: pd.DataFrame) -> Chart:
    """The chosen γ over batch × context (what the exported serving table holds)."""
    title = "Chosen γ per batch size and context length"
    if _missing(df, ("batch", "context", "gamma")):
        return _skip(title, "no batch/context/gamma columns")
    pivot = df.pivot_table(index="batch", columns="context", values="gamma", aggfunc="first")
    if "sparsity" in df.columns:
        sp = df.pivot_table(index="batch", columns="context", values="sparsity", aggfunc="first")
        text = [[f"γ={int(g)}<br>s={s:g}" if not np.isnan(g) else "" for g, s in zip(gr, sr)]
                for gr, sr in zip(pivot.to_numpy(), sp.to_numpy())]
    else:
        text = [[f"γ={int(g)}" if not np.isnan(g) else "" for g in gr] for gr in pivot.to_numpy()]
    fig = go.Figure(go.Heatmap(
        z=pivot.to_numpy(), x=[fmt_tokens(c) for c in pivot.columns],
        y=[str(b) for b in pivot.index], colorscale="Blues", text=text, texttemplate="%{text}",
        colorbar={"title": "γ"}, hovertemplate="B=%{y}, C=%{x}<br>%{text}<extra></extra>"))
    fig.update_layout(**LAYOUT, title=title, xaxis_title="context", yaxis_title="batch")
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category")
    return Chart(title, fig)
