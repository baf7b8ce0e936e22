"""Throughput over γ × sparsity (the paper's Fig. 13): one chart per method, one small heatmap
per cell (batch × context, ...), so that every method and every cell is drawn.

Colour is the share of the cell's best throughput (one scale for all cells of a method, which
differ in absolute tok/s by the batch size); each square prints its tok/s. The best square is
outlined (its number stays readable) and a best point on the edge of the swept grid is
warned about: the optimum may lie outside it. Extrapolated squares print '*' after the number.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from vegas_sim.reports.chart import Chart, cell_columns, cell_label, method_order, missing, skip
from vegas_sim.reports.provenance import extrapolated_mask
from vegas_sim.reports.style import EXTRAPOLATED_MARK, LAYOUT, method_color

TITLE = "Throughput over γ × sparsity"
MAX_COLUMNS = 3  # small multiples per row when the cells are not a batch × context grid
PANEL_PX = 300  # height of one row of small multiples


def edge_warnings(best: pd.Series, gammas: list[float], sparsities: list[float]) -> list[str]:
    """Why the best point of a cell sits on the edge of the swept γ / sparsity grid."""
    out = []
    g, s = float(best["gamma"]), float(best["sparsity"])
    if len(gammas) > 1 and g in (min(gammas), max(gammas)):
        out.append(f"γ={int(g)} is the {'largest' if g == max(gammas) else 'smallest'} γ swept")
    if len(sparsities) > 1 and s in (min(sparsities), max(sparsities)):
        out.append(f"s={s:g} is the {'largest' if s == max(sparsities) else 'smallest'} "
                   "sparsity swept")
    return out


def _layout(cells: list[tuple[object, pd.DataFrame]], cols: list[str]) -> tuple[int, int]:
    """(rows, columns) of the small multiples: batch × context when those are the only cell
    columns and every pair is present, else wrapped in rows of MAX_COLUMNS."""
    n = len(cells)
    if cols == ["batch", "context"]:
        frame = pd.DataFrame([g.iloc[0][cols] for _, g in cells])
        n_b, n_c = frame["batch"].nunique(), frame["context"].nunique()
        if n_b * n_c == n:
            return n_b, n_c
    width = min(MAX_COLUMNS, n)
    return math.ceil(n / width), width


def _panel(g: pd.DataFrame) -> tuple[go.Heatmap, pd.Series, list[str], list[str], list[str]]:
    """The heatmap of one cell, its best row, the axis labels and the edge warnings."""
    g = g.assign(_ex=extrapolated_mask(g))
    pivot = g.pivot_table(index="gamma", columns="sparsity", values="throughput_tok_s",
                          aggfunc="mean")  # [n_gamma, n_sparsity] tok/s
    ex = g.pivot_table(index="gamma", columns="sparsity", values="_ex", aggfunc="max")
    ex = ex.reindex(index=pivot.index, columns=pivot.columns).fillna(False)
    best = g.iloc[int(np.argmax(g["throughput_tok_s"].to_numpy(float)))]
    z = pivot.to_numpy()
    share = z / float(np.nanmax(z))
    text = [[("" if np.isnan(v) else f"{v:.0f}") + (EXTRAPOLATED_MARK if bool(x) else "")
             for v, x in zip(zr, xr)] for zr, xr in zip(z, ex.to_numpy())]
    xs = [f"{s:g}" for s in pivot.columns]
    ys = [str(int(v)) for v in pivot.index]
    heat = go.Heatmap(
        z=share, x=xs, y=ys, coloraxis="coloraxis", text=text, texttemplate="%{text}",
        customdata=z, hovertemplate="γ=%{y}, s=%{x}<br>%{customdata:.1f} tok/s "
                                    "(%{z:.0%} of the cell's best)<extra></extra>")
    warn = edge_warnings(best, [float(v) for v in pivot.index],
                         [float(v) for v in pivot.columns])
    return heat, best, xs, ys, warn


def _outline(fig: go.Figure, best: pd.Series, xs: list[str], ys: list[str], row: int,
             col: int) -> None:
    """A box around the best square (category axes: square i spans i-0.5 .. i+0.5)."""
    i, j = xs.index(f"{best['sparsity']:g}"), ys.index(str(int(best["gamma"])))
    fig.add_shape(type="rect", x0=i - 0.5, x1=i + 0.5, y0=j - 0.5, y1=j + 0.5,
                  line={"color": "#d62728", "width": 3}, row=row, col=col)


def method_heatmaps(df: pd.DataFrame, method: str) -> Chart:
    """Every cell of one method, one small heatmap each."""
    title = f"{TITLE}: {method}"
    cols = cell_columns(df)
    g_all = df[df["method"] == method]
    groups = [g for _, g in g_all.groupby(cols, dropna=False, sort=True)] if cols else [g_all]
    cells: list[tuple[object, pd.DataFrame]] = [
        ((), g) for g in groups if g["gamma"].nunique() >= 2 and g["sparsity"].nunique() >= 2]
    if not cells:
        return skip(title, "needs at least 2 values of both γ and sparsity in one cell")
    n_rows, n_cols = _layout(cells, cols)
    labels = [cell_label(g.iloc[0], cols) or "all rows" for _, g in cells]
    fig = make_subplots(rows=n_rows, cols=n_cols, subplot_titles=labels,
                        horizontal_spacing=0.06, vertical_spacing=min(0.12, 0.5 / n_rows))
    best_rows, notes = [], []
    for k, (_, g) in enumerate(cells):
        r, c = k // n_cols + 1, k % n_cols + 1
        heat, best, xs, ys, warn = _panel(g)
        fig.add_trace(heat, row=r, col=c)
        _outline(fig, best, xs, ys, r, c)
        fig.update_xaxes(type="category", row=r, col=c,
                         title_text="sparsity s" if r == n_rows else None)
        fig.update_yaxes(type="category", row=r, col=c, title_text="γ" if c == 1 else None)
        best_rows.append({"cell": labels[k], "gamma": int(best["gamma"]),
                          "sparsity": float(best["sparsity"]),
                          "throughput_tok_s": float(best["throughput_tok_s"]),
                          "on_grid_edge": "; ".join(warn),
                          "extrapolated": "yes" if extrapolated_mask(best.to_frame().T)[0]
                          else ""})
        if warn:
            notes.append(labels[k])
    height = PANEL_PX * n_rows + 120
    fig.update_layout(**{**LAYOUT, "height": height}, title=f"{method}: throughput over γ × s",
                      coloraxis={"colorscale": "Viridis", "cmin": 0.5, "cmax": 1.0,
                                 "colorbar": {"title": "of cell's best", "tickformat": ".0%"}},
                      title_font_color=method_color(method))
    table = pd.DataFrame(best_rows)
    caption = ("colour: share of the cell's best throughput; numbers: tok/s; red box: the "
               f"cell's best (γ, s); '{EXTRAPOLATED_MARK}': extrapolated")
    note = (f"warning: the best point sits on the edge of the swept grid in {len(notes)} of "
            f"{len(cells)} cells ({', '.join(notes)}; see on_grid_edge): the optimum may lie "
            "outside it; widen --gamma / --sparsity" if notes else "")
    return Chart(title, fig, note=note, caption=caption, table=table,
                 slug=f"heatmap-{method}", height=height)


def heatmaps(df: pd.DataFrame) -> list[Chart]:
    """One chart per speculative method (methods.METHODS order), every cell in it."""
    miss = missing(df, ("method", "gamma", "sparsity", "throughput_tok_s"))
    if miss:
        return [skip(TITLE, f"no column {', '.join(miss)}")]
    spec = df[df["method"] != "vanilla"].dropna(subset=["throughput_tok_s"])
    if spec.empty:
        return [skip(TITLE, "no speculative method in the results")]
    return [method_heatmaps(spec, m) for m in method_order(list(spec["method"].unique()))]
