"""Terminal tables (rich) for predictions."""

from __future__ import annotations

import math
import sys

import pandas as pd
from rich.console import Console
from rich.table import Table

PHASE_ORDER = ("decode", "draft_step", "quest_meta", "verify", "collect", "select", "sample",
               "prefill")


def _ci(value: float, low: float, high: float, fmt: str) -> str:
    if any(map(math.isnan, (low, high))) or low == high:
        return format(value, fmt)
    return f"{format(value, fmt)} [{format(low, fmt)}, {format(high, fmt)}]"


def _phases_present(df: pd.DataFrame) -> list[str]:
    return [p for p in PHASE_ORDER
            if f"ms_{p}" in df and (df[f"ms_{p}"].fillna(0) > 0).any()]


def is_open_loop(df: pd.DataFrame) -> bool:
    """Rows of Poisson/trace arrivals (their headline is latency, not throughput)."""
    return "arrival" in df and bool(df["arrival"].astype(str).str.match("poisson|trace").any())


def prediction_table(df: pd.DataFrame) -> Table:
    if is_open_loop(df):
        return open_loop_table(df)
    first = df.iloc[0]
    with_ci = (df["throughput_ci_low"] < df["throughput_ci_high"]).any()
    table = Table(title=f"batch {first['batch']}, context {first['context']}, output "
                        f"{first['output_len']} — "
                        + ("95% CI in brackets" if with_ci else "no CI (one replication or "
                           "the analytic engine)")
                        + ("; PI: the 95% prediction interval, the model's uncertainty"
                           if "pi_low" in df.columns else ""))
    with_pi = "pi_low" in df.columns
    names = ("method", "γ", "s", "tok/s", *(["tok/s 95% PI"] if with_pi else []), "speedup",
             "acc len", "TPOT ms", "extrap.")
    for name in names:
        table.add_column(name, no_wrap=True)
    for _, row in df.iterrows():
        spec = row["method"] != "vanilla"
        table.add_row(
            str(row["method"]),
            str(row["gamma"]) if spec else "-",
            f"{row['sparsity']:.3g}" if spec else "-",
            _ci(row["throughput_tok_s"], row["throughput_ci_low"], row["throughput_ci_high"],
                ".0f"),
            *([_pi(row)] if with_pi else []),
            _ci(row["speedup_vs_vanilla"], row["speedup_ci_low"], row["speedup_ci_high"], ".2f"),
            f"{row['acceptance_length']:.2f}",
            f"{row['tpot_ms_p50']:.2f}",
            _extrapolated(row),
        )
    return table


def _pi(row: pd.Series) -> str:
    """The prediction interval of the throughput (model uncertainty, `sim.uncertainty`)."""
    low, high = float(row["pi_low"]), float(row["pi_high"])
    return "-" if math.isnan(low) or math.isnan(high) else f"{low:.0f}–{high:.0f}"


def _extrapolated(row: pd.Series) -> str:
    """'yes', naming the extrapolation axis when it is what widens the interval most."""
    if not row.get("extrapolated"):
        return ""
    dominant = str(row.get("pi_dominant", ""))
    if dominant.startswith("extrapolation-distance (") and dominant.endswith(")"):
        return f"yes: {dominant[len('extrapolation-distance ('):-1]}"
    return "yes"


def _ms(value: float) -> str:
    """Milliseconds, as seconds from 10 s up (queueing delays past capacity are long)."""
    if math.isnan(value):
        return "-"
    return f"{value / 1000:.1f} s" if value >= 10_000 else f"{value:.1f}"


def _duration(value: float) -> str:
    """`_ms` with its unit: '96.6 ms', '282.4 s'."""
    text = _ms(value)
    return text if text.endswith(" s") or text == "-" else f"{text} ms"


def open_loop_table(df: pd.DataFrame) -> Table:
    """Open-loop rows: latency first. The speedup shown is TPOT's (vanilla TPOT / the
    method's); the throughput is the served rate, whose ratio is ≈ 1 below capacity."""
    first = df.iloc[0]
    goodput = "goodput_tok_s" in df and bool(df["goodput_tok_s"].notna().any())
    table = Table(title=f"{first['arrival']}, batch {first['batch']}, context {first['context']}"
                        f", output {first['output_len']}, {first['requests']} requests; TPOT ×"
                        " = vanilla TPOT / method TPOT (the headline); tok/s = served rate; ms unless s")
    names = ["method", "γ", "s", "TPOT", "TPOT ×", "TTFT p50/p99", "E2E p50", "queue",
             "tok/s", "tok/s ×", "saturated", *(["goodput"] if goodput else []), "extrap."]
    for name in names:
        table.add_column(name, no_wrap=True)
    for _, row in df.iterrows():
        spec = row["method"] != "vanilla"
        table.add_row(
            str(row["method"]), str(row["gamma"]) if spec else "-",
            f"{row['sparsity']:.3g}" if spec else "-", f"{row['tpot_ms_p50']:.2f}",
            _ci(row["tpot_speedup"], row["tpot_speedup_ci_low"], row["tpot_speedup_ci_high"],
                ".2f"),
            f"{_ms(row['ttft_ms_p50'])} / {_ms(row['ttft_ms_p99'])}", _ms(row["e2e_ms_p50"]),
            f"{row['queue_len_mean']:.1f}", f"{row['throughput_tok_s']:.0f}",
            f"{row['speedup_vs_vanilla']:.2f}", "yes" if row["saturated"] else "no",
            *([f"{row['goodput_tok_s']:.0f}"] if goodput else []),
            "yes" if row.get("extrapolated") else "",
        )
    return table


def serving_lines(df: pd.DataFrame) -> list[str]:
    """Saturation per method of open-loop rows, and what a throughput ratio means below it."""
    if not is_open_loop(df):
        return []
    lines = []
    for _, r in df.iterrows():
        if r["saturated"]:
            lines.append(f"saturated: {r['method']}: offered {r['offered_rate']:.3g} req/s > "
                         f"capacity {r['served_rate']:.3g} req/s; TTFT grows without bound "
                         f"(here over {int(r['requests'])} requests: a longer run waits longer)")
    if not df["saturated"].all():
        under = ", ".join(str(m) for m in df.loc[~df["saturated"].astype(bool), "method"])
        lines.append(f"under capacity ({under}): served ≈ offered load, so the throughput ratio "
                     "is ≈ 1 whatever the method; the TPOT speedup is the gain")
    return lines + ttft_lines(df)


def ttft_lines(df: pd.DataFrame) -> list[str]:
    """One line per row: what its TTFT p50 is made of (the first token is the prefill's)."""
    if "ttft_includes" not in df.columns:
        return []
    out = []
    for _, r in df.iterrows():
        pre, hand = float(r["prefill_ms"]), float(r["kv_transfer_ms"])
        rest = float(r["ttft_ms_p50"]) - pre - hand
        out.append(f"TTFT {r['method']}: p50 {_duration(r['ttft_ms_p50'])} = prefill "
                   f"{_duration(pre)} + KV transfer {_duration(hand)} + waiting "
                   f"{_duration(max(rest, 0.0))}; {r['ttft_includes']}")
    return out


def breakdown_table(df: pd.DataFrame) -> Table:
    """Mean ms per iteration by phase (and share of the iteration). Co-located prefill is a
    column of its own: its stalls per decode iteration, its share of iteration + prefill."""
    phases = _phases_present(df)
    title = "iteration time by phase, ms (share)"
    if "prefill" in phases:
        title += "; prefill: co-located prefill stalls per iteration, shares of iteration + " \
                 "prefill"
    table = Table(title=title)
    table.add_column("method", no_wrap=True)
    for phase in phases:
        table.add_column(phase.replace("_step", "").replace("_meta", ""), justify="right",
                         no_wrap=True)
    table.add_column("iteration", justify="right")
    for _, row in df.iterrows():
        total = float(row["iter_ms"])
        whole = total + (float(row.get("ms_prefill") or 0.0) if "prefill" in phases else 0.0)
        cells = []
        for phase in phases:
            ms = float(row.get(f"ms_{phase}") or 0.0)
            cells.append(f"{ms:.2f} {100 * ms / whole:.0f}%" if ms > 0 and whole > 0 else "-")
        table.add_row(str(row["method"]), *cells, f"{total:.2f}")
    return table


def draft_step_line(df: pd.DataFrame) -> str:
    """'draft step / vanilla decode step: vegas 0.52, ...' for the rows that draft."""
    if "draft_step_vs_decode" not in df.columns:
        return ""
    parts = [f"{m} {float(v):.2f}" for m, v in zip(df["method"], df["draft_step_vs_decode"])
             if not pd.isna(v)]
    return "draft step / vanilla decode step: " + ", ".join(parts) if parts else ""


def kv_selection_line(df: pd.DataFrame) -> str:
    """'KV selection per iteration ...: vegas 2.41 ms (3.4 %), ...' for the rows that
    draft, as the Vegas paper counts it (sim.kv_selection); the write-out's reference named."""
    if "kv_selection_pct" not in df.columns:
        return ""
    parts, plain = [], ""
    for _, r in df.iterrows():
        pct = float(r["kv_selection_pct"])
        if r["method"] == "vanilla" or not math.isfinite(pct):
            continue
        share = float(r["iter_ms"]) * pct / 100
        parts.append(f"{r['method']} {share:.2f} ms ({pct:.1f} %)")
        plain = plain or str(r.get("plain_verify_method") or "")
    if not parts:
        return ""
    out = f" (verify over {plain}'s plain verify)" if plain else ""
    return ("KV selection per iteration, as the Vegas paper's Figure 10b counts it: selection "
            f"phases + the score write-out{out}: " + ", ".join(parts))


def roofline_lines(df: pd.DataFrame) -> list[str]:
    """One line per method: the iteration's bound from its bytes and FLOPs (sim.roofline), the
    predicted iteration's share of it, what binds each phase, and where verify turns
    compute-bound; a heading line with the GPU rates first."""
    if "roofline_ms" not in df.columns or df.empty:
        return []
    first = df.iloc[0]
    lines = [f"roofline (bytes at {float(first['roofline_bandwidth_gbs']):.0f} GB/s copy, FLOPs "
             f"at {float(first['roofline_tflops']):.0f} TFLOP/s bf16; each request halfway "
             "through its output):"]
    for _, r in df.iterrows():
        binds = str(r["roofline_binds"] or "")
        by_kind: dict[str, list[str]] = {}
        for part in filter(None, binds.split(",")):
            phase, kind = part.split(":")
            by_kind.setdefault(kind, []).append(phase.replace("_step", "").replace("_meta", ""))
        where = "; ".join(f"{kind}-bound: {', '.join(p)}" for kind, p in by_kind.items())
        turn = float(r["verify_compute_batch"])
        phase = "decode" if r["method"] == "vanilla" else f"verify (γ {int(r['gamma'])})"
        crossing = (f"{phase} compute-bound from B {turn:.0f}" if math.isfinite(turn)
                    else f"{phase} memory-bound at any batch")
        lines.append(f"  {r['method']}: bound {float(r['roofline_ms']):.2f} ms per iteration "
                     f"({float(r['roofline_gb']):.1f} GB, {float(r['roofline_tflop']):.2f} "
                     f"TFLOP), {float(r['roofline_pct']):.0f} % of the predicted; {where}; "
                     f"{crossing}")
    return lines


def kv_lines(df: pd.DataFrame) -> list[str]:
    """One line per method whose KV cache held fewer than its max batch, or preempted."""
    if "mean_running_batch" not in df.columns:
        return []
    lines = []
    for _, r in df.iterrows():
        running, pre = float(r["mean_running_batch"]), float(r.get("preemptions", 0.0))
        if running < 0.99 * float(r["batch"]) or pre > 0:
            what = "" if math.isnan(pre) else f", {pre:g} preemptions per run"  # NaN: analytic
            lines.append(f"{r['method']} runs {running:.1f} of max {int(r['batch'])} sequences "
                         f"on average (the cache holds {r['kv_capacity_blocks']:.0f} blocks of "
                         f"{int(r['kv_block_size'])}){what}")
    return lines


def acceptance_sources(df: pd.DataFrame, column: str = "acceptance_source"
                       ) -> dict[str, list[str]]:
    """{acceptance_source: its methods} of the rows that draft (vanilla's source is ''); or
    of another per-row source `column` (latency_sampling: the mode that priced the row)."""
    out: dict[str, list[str]] = {}
    if column not in df:
        return out
    for method, source in zip(df["method"], df[column].fillna("")):
        if source and str(method) not in out.setdefault(str(source), []):
            out[str(source)].append(str(method))
    return out


def extrapolation_reasons(df: pd.DataFrame) -> dict[str, list[str]]:
    """Each extrapolation reason of the rows (sorted), with the methods whose rows name it."""
    if "extrapolated" not in df.columns:
        return {}
    found: dict[str, list[str]] = {}
    for method, text in zip(df["method"], df["extrapolated"].fillna("")):
        for reason in (r.strip() for r in str(text).split(";")):
            if reason and str(method) not in found.setdefault(reason, []):
                found[reason].append(str(method))
    return dict(sorted(found.items()))


def print_prediction(df: pd.DataFrame, notes: list[str], console: Console | None = None) -> None:
    # Piped output is not wrapped at 80 columns: tables stay one line per method.
    console = console or (Console() if sys.stdout.isatty() else Console(width=140))
    console.print(prediction_table(df))
    console.print(breakdown_table(df))
    for line in (draft_step_line(df), kv_selection_line(df)):
        if line:
            console.print(line, soft_wrap=True)
    for line in serving_lines(df):
        console.print(f"[red]{line}[/red]" if line.startswith("saturated") else line,
                      soft_wrap=True)
    for line in roofline_lines(df):
        console.print(line, soft_wrap=True)
    for line in kv_lines(df):
        console.print(f"[yellow]KV cache:[/yellow] {line}", soft_wrap=True)
    # notes are sentences: one line each, never cut at the table's width
    for reason, methods in extrapolation_reasons(df).items():
        console.print(f"[yellow]extrapolated ({', '.join(methods)}):[/yellow] {reason}",
                      soft_wrap=True)
    for source, methods in acceptance_sources(df).items():
        console.print(f"[dim]acceptance of {', '.join(methods)}:[/dim] {source}", soft_wrap=True)
    for mode, methods in acceptance_sources(df, "latency_sampling").items():
        console.print(f"[dim]sampling phases of {', '.join(methods)} priced:[/dim] {mode}",
                      soft_wrap=True)
    for note in notes:
        console.print(f"[dim]note:[/dim] {note}", soft_wrap=True)
