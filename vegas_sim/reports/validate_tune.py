"""Charts and tables of a validate result (predicted vs measured) and of a tune result (the
chosen configuration per cell against vanilla and the named best baseline)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from vegas_sim.reports.chart import Chart, fmt_tokens, missing, skip
from vegas_sim.reports.provenance import (
    extrapolated_mask,
    has_interval,
    interval_caption,
    mark_column,
)
from vegas_sim.reports.style import LAYOUT, patterns, symbols

WIDE_RANGE = 20.0  # max / min above this: log axes (the points would sit in one corner)
REGIME_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "cross")
CONFIG = ("method", "gamma", "sparsity", "batch", "context", "output_len")


# ---- validate --------------------------------------------------------------------------------
def _with_error(df: pd.DataFrame) -> pd.DataFrame:
    d = df.dropna(subset=["predicted", "measured"])
    if "error_pct" not in d.columns:
        d = d.assign(error_pct=100.0 * (d["predicted"] - d["measured"]) / d["measured"])
    return d if "regime" in d.columns else d.assign(regime="all")


def error_table(df: pd.DataFrame) -> pd.DataFrame:
    """Median and max |error| % per regime (and overall): the protocol's summary. A table
    measured in passes (`validate --passes`) adds the same against the first pass alone and
    the median pass-to-pass standard error of the measurement."""
    d = _with_error(df)
    groups = [*d.groupby("regime", sort=True)]
    if d["regime"].nunique() > 1:
        groups.append(("all", d))
    return pd.DataFrame([{"regime": r, **_error_summary(g)} for r, g in groups])


def _error_summary(g: pd.DataFrame) -> dict[str, float | int]:
    err = g["error_pct"].abs()
    out: dict[str, float | int] = {
        "n": len(g), "median_abs_error_pct": err.median(), "max_abs_error_pct": err.max(),
        "n_extrapolated": int(extrapolated_mask(g).sum())}
    if _has_passes(g):
        first = g["error_first_pass_pct"].abs()
        out |= {"median_abs_error_first_pass_pct": first.median(),
                "max_abs_error_first_pass_pct": first.max(),
                "median_pass_se_pct": g["measured_pass_se_pct"].median()}
    return out


PASS_COLUMNS = ("measured_passes", "measured_pass_se_pct", "error_first_pass_pct")


def _has_passes(d: pd.DataFrame) -> bool:
    """True for a table with some row measured in more than one pass."""
    return all(c in d.columns for c in PASS_COLUMNS) and bool(
        d["measured_pass_se_pct"].notna().any())


def row_errors(df: pd.DataFrame) -> Chart:
    """Every validated configuration: measured, predicted, error, extrapolated."""
    title = "Error per configuration"
    d = _with_error(df)
    cols = [c for c in (*CONFIG, "regime") if c in d.columns]
    passes = list(PASS_COLUMNS) if _has_passes(d) else []
    table = d[[*cols, "measured", "predicted", "error_pct", *passes]].assign(
        extrapolated=mark_column(d)).sort_values("error_pct", key=lambda s: -s.abs())
    return Chart(title, None, caption="largest |error| first", table=table, slug="row-errors",
                 table_only=True)


def _axis_range(values: np.ndarray) -> tuple[str, list[float]]:
    """('linear', [0, hi]) — or ('log', [lo, hi] in log10) when the values span a wide range."""
    pos = values[values > 0]
    hi = float(values.max()) * 1.08 if values.size else 1.0
    if pos.size and float(pos.max()) / float(pos.min()) > WIDE_RANGE:
        return "log", [float(np.log10(pos.min() / 1.3)), float(np.log10(pos.max() * 1.3))]
    return "linear", [0.0, max(hi, 1e-9)]


# The interval a validate table carries for `predicted`, best first: the prediction interval
# (model uncertainty), the simulation's CI (newer and older column names).
PARITY_INTERVALS = (("pi_low", "pi_high", "95 % prediction interval (model uncertainty)"),
                    ("sim_ci_low", "sim_ci_high", "95 % CI of the simulation only"),
                    ("ci_low", "ci_high", "95 % CI of the simulation only"))


def interval_of(d: pd.DataFrame) -> tuple[str, str, str]:
    """(low column, high column, caption) of the first interval the table has; '' caption: none."""
    for low, high, caption in PARITY_INTERVALS:
        if has_interval(d, low, high):
            return low, high, caption
    return "", "", ""


def parity(df: pd.DataFrame) -> Chart:
    """Predicted vs measured throughput on axes from zero (log when the range is wide); the
    diagonal is a perfect prediction."""
    title = "Predicted vs measured (held-out configurations)"
    miss = missing(df, ("predicted", "measured"))
    if miss:
        return skip(title, f"no column {', '.join(miss)}")
    d = _with_error(df)
    if d.empty:
        return skip(title, "no row has both a predicted and a measured value")
    values = np.concatenate([d["predicted"].to_numpy(float), d["measured"].to_numpy(float)])
    kind, rng = _axis_range(values)
    lo, hi = (10 ** rng[0], 10 ** rng[1]) if kind == "log" else (0.0, rng[1])
    fig = go.Figure(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="perfect",
                               line={"color": "gray", "dash": "dot"}, hoverinfo="skip"))
    config = [c for c in CONFIG if c in d.columns]
    low, high, bars = interval_of(d)
    for k, (regime, g) in enumerate(d.groupby("regime", sort=True)):
        err = None
        if bars:
            err = {"type": "data", "symmetric": False,
                   "array": (g[high] - g["predicted"]).clip(lower=0),
                   "arrayminus": (g["predicted"] - g[low]).clip(lower=0)}
        ex = list(extrapolated_mask(g))
        shape = REGIME_SYMBOLS[k % len(REGIME_SYMBOLS)]
        fig.add_trace(go.Scatter(
            x=g["measured"], y=g["predicted"], mode="markers", name=str(regime), error_y=err,
            error_x=_measurement_bars(g),
            text=[", ".join(f"{c}={r[c]}" for c in config) for _, r in g.iterrows()],
            customdata=g["error_pct"],
            marker={"size": 9, "symbol": [s.replace("circle", shape) for s in symbols(ex)]},
            hovertemplate="%{text}<br>measured %{x:.1f}<br>predicted %{y:.1f}"
                          "<br>error %{customdata:+.2f}%<extra>" + str(regime) + "</extra>"))
    fig.update_layout(**LAYOUT, title=title, xaxis_title="measured throughput (tok/s)",
                      yaxis_title="predicted throughput (tok/s)")
    # constrain="domain": the square aspect shrinks the plot area, never widens a range
    fig.update_xaxes(type=kind, range=rng, constrain="domain")
    fig.update_yaxes(type=kind, range=rng, scaleanchor="x", scaleratio=1, constrain="domain")
    caption = ("open markers: extrapolated (outside the calibrated grid); "
               + (f"error bars: {bars}" if bars else "no interval in the table")
               + ("; horizontal bars: ±2 standard errors of the measurement over its passes"
                  if _has_passes(d) else "")
               + ("; log axes (the values span more than "
                  f"{WIDE_RANGE:g}×)" if kind == "log" else "; axes from zero"))
    return Chart(title, fig, caption=caption, table=error_table(d), slug="errors")


def _measurement_bars(g: pd.DataFrame) -> dict[str, object] | None:
    """±2 standard errors of each measured throughput from its passes (none for one pass)."""
    if not _has_passes(g):
        return None
    se = (g["measured"] * g["measured_pass_se_pct"] / 100.0).fillna(0.0)
    return {"type": "data", "array": 2.0 * se, "thickness": 1}


# ---- tune ------------------------------------------------------------------------------------
def _cell_labels(d: pd.DataFrame) -> list[str]:
    return [f"B={int(r['batch'])}, C={fmt_tokens(r['context'])}" for _, r in d.iterrows()]


def _baseline_names(d: pd.DataFrame) -> list[str]:
    if "baseline_method" not in d.columns:
        return [""] * len(d)
    return [f"{r['baseline_method']} γ={int(r['baseline_gamma'])}, s={r['baseline_sparsity']:g}"
            if isinstance(r["baseline_method"], str) and "baseline_gamma" in r.index
            and not pd.isna(r["baseline_gamma"]) else str(r["baseline_method"])
            for _, r in d.iterrows()]


def tune_speedups(df: pd.DataFrame) -> Chart:
    """Speedup of the tuned configuration over vanilla and over the best baseline (named in
    the hover and in the tune table), per cell."""
    title = "Tuned speedup per (batch, context)"
    if missing(df, ("batch", "context", "speedup_vs_vanilla")):
        return skip(title, "no batch/context/speedup_vs_vanilla columns")
    d = df.sort_values(["batch", "context"])
    labels, ex = _cell_labels(d), list(extrapolated_mask(d))
    fig = go.Figure()
    for col, lo, hi, name, text in (
        ("speedup_vs_vanilla", "speedup_ci_low", "speedup_ci_high", "over vanilla", None),
        ("speedup_vs_baseline", "speedup_vs_baseline_ci_low", "speedup_vs_baseline_ci_high",
         "over the best baseline (named in the table and on hover)", _baseline_names(d)),
    ):
        if col not in d.columns or d[col].isna().all():
            continue
        err = None
        if has_interval(d, lo, hi):
            err = {"type": "data", "symmetric": False, "array": (d[hi] - d[col]).clip(lower=0),
                   "arrayminus": (d[col] - d[lo]).clip(lower=0)}
        fig.add_trace(go.Bar(x=labels, y=d[col], name=name, error_y=err,
                             hovertext=text or [""] * len(d), marker={"pattern": patterns(ex)},
                             hovertemplate="%{x}<br>%{y:.2f}×<br>%{hovertext}<extra>" + name
                                           + "</extra>"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray")
    fig.update_layout(**LAYOUT, title=title, barmode="group", yaxis_title="speedup")
    with_ci = has_interval(d, "speedup_ci_low", "speedup_ci_high")
    caption = (interval_caption(d) if with_ci or "engine" in d.columns
               else "no interval in the table")
    return Chart(title, fig, caption=f"{caption}; hatched bars: extrapolated")


def tune_table(df: pd.DataFrame) -> Chart:
    """The chosen configuration per cell, vanilla and the named baseline, side by side."""
    title = "Tuned configuration per cell, against vanilla and the best baseline"
    if missing(df, ("batch", "context", "gamma")):
        return skip(title, "no batch/context/gamma columns")
    d = df.sort_values(["batch", "context"])
    cols = [c for c in ("batch", "context", "method", "gamma", "sparsity", "throughput_tok_s",
                        "vanilla_tok_s", "speedup_vs_vanilla") if c in d.columns]
    table = d[cols].copy()
    if "baseline_method" in d.columns:
        table["baseline"] = _baseline_names(d)
        for c in ("baseline_tok_s", "speedup_vs_baseline"):
            if c in d.columns:
                table[c] = d[c]
    for c in ("roofline_pct", "roofline_binds"):  # the chosen configuration's (sim.roofline)
        if c in d.columns:
            table[c] = d[c]
    table["extrapolated"] = mark_column(d)
    return Chart(title, None, caption="baseline: the best of the other methods at its own best "
                                      "(γ, s) in that cell", table=table, slug="tuned",
                 table_only=True)


def tune_gamma_map(df: pd.DataFrame) -> Chart:
    """The chosen γ over batch × context (what the exported serving table holds)."""
    title = "Chosen γ per batch size and context length"
    if missing(df, ("batch", "context", "gamma")):
        return skip(title, "no batch/context/gamma columns")
    pivot = df.pivot_table(index="batch", columns="context", values="gamma", aggfunc="first")
    ex = df.assign(_ex=extrapolated_mask(df)).pivot_table(
        index="batch", columns="context", values="_ex", aggfunc="max").reindex(
        index=pivot.index, columns=pivot.columns).fillna(False).to_numpy()
    sp = (df.pivot_table(index="batch", columns="context", values="sparsity", aggfunc="first")
          .to_numpy() if "sparsity" in df.columns else np.full(pivot.shape, np.nan))
    text = [[("" if np.isnan(g) else f"γ={int(g)}" + ("" if np.isnan(s) else f"<br>s={s:g}"))
             + ("*" if x else "") for g, s, x in zip(gr, sr, xr)]
            for gr, sr, xr in zip(pivot.to_numpy(), sp, ex)]
    fig = go.Figure(go.Heatmap(
        z=pivot.to_numpy(), x=[fmt_tokens(c) for c in pivot.columns],
        y=[str(b) for b in pivot.index], colorscale="Blues", text=text, texttemplate="%{text}",
        colorbar={"title": "γ"}, hovertemplate="B=%{y}, C=%{x}<br>%{text}<extra></extra>"))
    fig.update_layout(**LAYOUT, title=title, xaxis_title="context", yaxis_title="batch")
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category")
    return Chart(title, fig, caption="'*': extrapolated")
