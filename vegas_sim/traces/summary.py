"""What a trace set covers, for `vegas-sim traces show`: model, GPU, grid, methods and
ranges, and the acceptance length per method."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from vegas_sim.traces.reader import TraceSet
from vegas_sim.traces.schema import (
    ACCEPTANCE_POINT_KEYS,
)
from vegas_sim.traces.validation import GPU_NUMBERS
from vegas_sim.workload_info import describe


# The `gpu` extra's torch and triton (pyproject.toml; tests/traces/test_io.py keeps the two
# equal): (lowest admitted, first excluded).
GPU_EXTRA = {"torch": ((2, 11), (2, 15)), "triton": ((3, 6), (3, 10))}


def _release(version: str) -> tuple[int, ...]:
    """'2.11.0+cu130' -> (2, 11, 0)."""
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])


def gpu_stack(software: dict[str, Any]) -> dict[str, Any]:
    """The torch / triton a set was measured with, the `gpu` extra's range for each, and
    whether the measured versions are inside it."""
    out: dict[str, Any] = {}
    for name, (lo, hi) in GPU_EXTRA.items():
        measured = software.get(name)
        inside = None if measured is None else lo <= _release(str(measured)) < hi
        out[name] = {"measured": measured, "admitted": f">={'.'.join(map(str, lo))},"
                     f"<{'.'.join(map(str, hi))}", "inside": inside}
    return out


def _format_stack(stack: dict[str, Any]) -> str:
    parts = []
    for name, s in stack.items():
        where = {True: "admitted", False: "NOT admitted", None: "not recorded"}[s["inside"]]
        parts.append(f"{name} {s['measured'] or '?'} ({where}; the gpu extra: {s['admitted']})")
    return "  gpu stack " + ", ".join(parts)


# ============================================================================ summaries
def _range(df: pd.DataFrame, col: str) -> list[Any] | None:
    if df.empty:
        return None
    return [df[col].min().item(), df[col].max().item()]


def _sorted_unique(df: pd.DataFrame, col: str) -> list[Any]:
    return sorted(v.item() if hasattr(v, "item") else v for v in df[col].unique())


def summarize(trace_set: TraceSet) -> dict[str, Any]:
    """What a trace set covers (for `vegas-sim traces show`); JSON-serialisable."""
    meta, lat, acc = trace_set.meta, trace_set.latency, trace_set.acceptance
    model, gpu, weights = meta["model"], meta["gpu"], meta["model"]["weights"]
    return {
        "path": str(trace_set.path),
        "synthetic": trace_set.synthetic,
        "model": {"name": model["name"], "architecture": model["architecture"],
                  "n_layers": model["n_layers"], "weights_kind": weights["kind"],
                  "weights_id": weights["id"], "rope": rope_label(meta["grid"], model)},
        "gpu": {k: gpu.get(k) for k in ("name", *GPU_NUMBERS)},
        "date": meta["date"],
        "software": meta["software"],
        "gpu_stack": gpu_stack(meta["software"]),
        "grid": meta["grid"],
        "tensor_parallel": meta.get("tensor_parallel"),
        "collectives": collective_shares(lat),
        "latency": {
            "rows": len(lat), "methods": _sorted_unique(lat, "method"),
            "phases": _sorted_unique(lat, "phase"), "batch": _range(lat, "batch"),
            "context": _range(lat, "context"), "n_query": _range(lat, "n_query"),
        },
        "acceptance": {
            "rows": len(acc), "methods": _sorted_unique(acc, "method"),
            "gamma": _range(acc, "gamma"), "sparsity": _range(acc, "sparsity"),
            "context": _range(acc, "context"), "workloads": _sorted_unique(acc, "workload"),
            "temperatures": _sorted_unique(acc, "temperature"),
            "requests": int(acc.groupby(["method", "gamma", "sparsity", "workload",
                                         "temperature", "request"]).ngroups) if len(acc) else 0,
            "workload_spans": workload_spans(acc),
        },
    }


def collective_shares(lat: pd.DataFrame) -> list[dict[str, Any]]:
    """Per phase that issued collectives: calls and MB per call, and their share of the
    phase's time (median over its rows); [] for a set measured on one GPU."""
    if lat.empty or "collective_calls" not in lat or not (lat["collective_calls"] > 0).any():
        return []
    rows = lat[lat["collective_calls"] > 0]
    out = []
    for phase, g in rows.groupby("phase", sort=True):
        out.append({"phase": str(phase), "calls": float(g["collective_calls"].median()),
                    "mb_per_call": float((g["collective_bytes"] / g["collective_calls"]).median()
                                         / 1e6),
                    "share": float((g["collective_ms"] / g["ms_median"]).median())})
    return out


def _tp_lines(d: dict[str, Any]) -> list[str]:
    tp = d.get("tensor_parallel")
    if not tp:
        return []
    lines = [f"  tensor parallel {tp['size']} ({tp['backend']}, {tp['interconnect']}): one "
             "rank's times, collectives included"]
    for c in d.get("collectives", []):
        lines.append(f"            {c['phase']}: {c['calls']:g} collectives of "
                     f"{c['mb_per_call']:.3g} MB, {100 * c['share']:.0f} % of its time "
                     "(median over its rows)")
    return lines


def workload_spans(acc: pd.DataFrame) -> dict[str, list[int]]:
    """Per workload: [shortest prompt, longest prompt, longest context reached] traced (a
    run's first iteration's context is its prompt; later ones add what it generated)."""
    if acc.empty:
        return {}
    first = acc[acc["iteration"] == 0]
    out: dict[str, list[int]] = {}
    for w, g in acc.groupby("workload", sort=True):
        prompts = first.loc[first["workload"] == w, "context"]
        lo, hi = (prompts.min(), prompts.max()) if len(prompts) else (g["context"].min(),) * 2
        out[str(w)] = [int(lo), int(hi), int(g["context"].max())]
    return out


def _fmt_range(r: list[Any] | None) -> str:
    if r is None:
        return "-"
    return f"{r[0]}" if r[0] == r[1] else f"{r[0]} .. {r[1]}"


def _num(value: Any) -> str:
    """Measured numbers to 4 significant digits (they are not more precise than that)."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def rope_label(grid: dict[str, Any], model: dict[str, Any]) -> str:
    """'' — or, for a set calibrated with `--rope-scaling`, what extended its positions."""
    factor = grid.get("rope_extension")
    if not factor:
        return ""
    original = (model.get("rope_scaling") or {}).get("original_max_position_embeddings", "?")
    return (f"YaRN-extended: RoPE scaled x{factor:g} past the trained {original} positions "
            f"(to {model.get('max_positions')})")


def format_summary(d: dict[str, Any]) -> str:
    """Human-readable text of `summarize`'s dict."""
    m, g, lat, acc = d["model"], d["gpu"], d["latency"], d["acceptance"]
    lines = [f"trace set {d['path']}"]
    if d["synthetic"]:
        lines.append("  SYNTHETIC: generated by a formula, not measured on a GPU")
    lines += [
        (f"  model     {m['name']} ({m['architecture']}, {m['n_layers']} layers), "
        f"{m['weights_kind']} weights ({m['weights_id']})"),
        *([f"            {m['rope']}"] if m.get("rope") else []),
        (f"  gpu       {g['name']}: copy {_num(g['copy_bandwidth_gbs'])} GB/s, bf16 "
        f"{_num(g['bf16_tflops'])} TFLOP/s measured, {g['sm_count']} SMs, "
        f"{_num(g['memory_gb'])} GB"),
        *_tp_lines(d),
        f"  date      {d['date']}",
        "  software  " + ", ".join(f"{k} {v}" for k, v in sorted(d["software"].items())),
        *([_format_stack(d["gpu_stack"])] if not d["synthetic"] else []),
        f"  latency   {lat['rows']} rows; methods {', '.join(lat['methods']) or '-'}",
        f"            phases {', '.join(lat['phases']) or '-'}",
        (f"            batch {_fmt_range(lat['batch'])}, context {_fmt_range(lat['context'])}, "
        f"n_query {_fmt_range(lat['n_query'])}"),
    ]
    if acc["rows"] == 0:
        lines.append("  acceptance  none (latency-only set)")
    else:
        note = "" if m["weights_kind"] == "real" else "  [random weights: not usable]"
        lines += [
            (f"  acceptance {acc['rows']} rows, {acc['requests']} requests; "
            f"methods {', '.join(acc['methods'])}{note}"),
            (f"            gamma {_fmt_range(acc['gamma'])}, sparsity "
            f"{_fmt_range(acc['sparsity'])}, context {_fmt_range(acc['context'])}"),
            (f"            workloads {', '.join(acc['workloads'])}; temperatures "
            f"{', '.join(str(t) for t in acc['temperatures'])}"),
        ]
        for w, (lo, hi, reached) in acc.get("workload_spans", {}).items():
            lines.append(f"            {w:<11} prompts {lo}..{hi} tokens, contexts reached "
                         f"{reached}: {describe(w)}")
    return "\n".join(lines) + "\n"


def acceptance_summary(acc: pd.DataFrame, at_gamma: int = 6) -> list[dict[str, Any]]:
    """Mean acceptance length (1 + accepted) per (method, γ, sparsity, temperature, workload),
    also truncated to γ = `at_gamma` when traced at γ >= it (the run log's headline)."""
    out: list[dict[str, Any]] = []
    if acc.empty:
        return out
    keys = list(ACCEPTANCE_POINT_KEYS)
    for k, g in acc.groupby(keys, sort=True):
        rec: dict[str, Any] = {c: (v.item() if hasattr(v, "item") else v) for c, v in zip(keys, k)}
        rec["rows"] = len(g)
        rec["acceptance_length"] = float(g["accepted"].mean() + 1)
        if rec["gamma"] >= at_gamma:
            rec[f"acceptance_length_gamma{at_gamma}"] = float(
                np.minimum(g["accepted"].to_numpy(), at_gamma).mean() + 1)
        out.append(rec)
    return out


def format_context_trends(rows: list[dict[str, Any]]) -> str:
    """The acceptance model's context trends (`AcceptanceModel.context_trends` rows), one line
    per (workload, temperature, method, traced γ): the traced buckets, the mean acceptance
    length at the first and last, and the slope followed beyond the last."""
    if not rows:
        return ""
    header = (f"    {'workload':<10} {'T':>4} {'method':<16} {'γ':>3}  "
              f"{'traced contexts':<20} {'length first → last':<20} per doubling")
    lines = [("  acceptance context trend beyond the traced contexts, per workload (logit shift "
              "of the conditional"),
             ("  per-position rates per doubling of context; in % of the last bucket's mean "
              "acceptance length):"), header]
    for r in sorted(rows, key=lambda r: (r["workload"], r["temperature"], r["method"],
                                         r["gamma"])):
        traced = f"{r['context_lo']}..{r['context_hi']} ({r['buckets']})"
        length = f"{r['length_lo']:.2f} → {r['length_hi']:.2f}"
        slope = f"{r['slope_per_doubling']:+.2f} ({r['pct_per_doubling']:+.1f} %)"
        note = f"  [{r['note']}]" if r["note"] else ""
        lines.append(f"    {r['workload']:<10} {r['temperature']:>4g} {r['method']:<16} "
                     f"{r['gamma']:>3}  {traced:<20} {length:<20} {slope}{note}")
    return "\n".join(lines) + "\n"
