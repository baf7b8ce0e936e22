"""Validation result rows: what was measured, what was predicted, the errors, and the
summaries `vegas-sim validate` prints. CPU only."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vegas_sim.calibrate.workloads import (
    BOOK_WINDOW_WORKLOADS,
    WHOLE_PROMPT_WORKLOADS,
    load_workload,
)
from vegas_sim.errors import UserInputError
from vegas_sim.methods import PHASES
from vegas_sim.sim.predict import PROVENANCE_COLUMNS
from vegas_sim.sim.context_trend import Z95
from vegas_sim.sim.metrics import t_quantile
from vegas_sim.sim.uncertainty import interval, parts_of
from vegas_sim.validate.heldout import HeldOut


@dataclasses.dataclass
class Measurement:
    """One (or several pooled) steady-state windows of a real run.

    `accepted` holds, per wave and per request, the accepted-draft counts of the window's
    iterations in order (before truncation at the output length): the acceptance the run
    really had, which `predict_replayed` feeds back into the simulator.
    """

    tokens: int
    seconds: float
    iterations: int
    acceptance_length: float  # 1 + mean accepted drafts per (request, iteration), pre-truncation
    accepted: list[list[list[int]]] = dataclasses.field(default_factory=list)
    phase_ms: dict[str, float] = dataclasses.field(default_factory=dict)  # see phase_means

    @property
    def throughput(self) -> float:
        return self.tokens / self.seconds


def pool(measurements: Sequence[Measurement]) -> Measurement:
    """Waves pooled: tokens and seconds summed (a ratio of sums, like one longer window)."""
    waves = [w for m in measurements for w in m.accepted]
    return Measurement(sum(m.tokens for m in measurements),
                       sum(m.seconds for m in measurements),
                       sum(m.iterations for m in measurements), acceptance_length(waves), waves)


def pool_passes(passes: Sequence[Measurement]) -> Measurement:
    """Passes of one configuration pooled (the same prompts and seeds each pass): tokens,
    seconds and iterations summed, like one longer window spread over time; the acceptance,
    accept counts and phases are the first pass's (the pass that ran the phase wave)."""
    first = passes[0]
    return dataclasses.replace(first, tokens=sum(m.tokens for m in passes),
                               seconds=sum(m.seconds for m in passes),
                               iterations=sum(m.iterations for m in passes))


def pass_columns(passes: Sequence[Measurement], predicted: float) -> dict[str, Any]:
    """What each pass measured, and the two numbers they give:

    - `measured_pass_se_pct`: the standard error of the pooled throughput from the spread of
      the passes, % of it (NaN with one pass) — the measurement's own timing noise: a host
      that runs host-bound code slower for stretches of seconds (docs/RESULTS.md, Validation)
      moves a small model's throughput between passes although nothing of the
      configuration changed;
    - `error_first_pass_pct`: the prediction's error against the first pass alone, what a
      single pass would have scored."""
    tok_s = np.asarray([m.throughput for m in passes], dtype=np.float64)
    return {
        "measured_passes": len(passes),
        "measured_pass_tokens": ";".join(str(m.tokens) for m in passes),
        "measured_pass_seconds": ";".join(f"{m.seconds:.9g}" for m in passes),
        "measured_pass_iterations": ";".join(str(m.iterations) for m in passes),
        "measured_pass_se_pct": se_pct_of(tok_s),
        "error_first_pass_pct": pct_error(predicted, float(tok_s[0])),
    }


def passes_from_row(row: dict[str, Any]) -> list[Measurement]:
    """The measurements a result row recorded, one per pass (a table from before passes: its
    pooled window as one pass); the first carries the row's acceptance, accept counts and
    phases."""
    accepted = decode_accepted(row.get("measured_accepted"))
    first = Measurement(int(row.get("measured_tokens", 0) or 0),
                        float(row.get("measured_seconds", math.nan)),
                        int(row.get("measured_iterations", 0) or 0),
                        float(row.get("measured_acceptance_length", math.nan)), accepted,
                        parse_phases(row.get("measured_phase_ms")))
    if _missing(row.get("measured_pass_tokens")):
        return [first]
    parts = [str(row[f"measured_pass_{k}"]).split(";")
             for k in ("tokens", "seconds", "iterations")]
    passes = [Measurement(int(float(t)), float(s), int(float(i)), first.acceptance_length)
              for t, s, i in zip(*parts, strict=True)]
    passes[0] = dataclasses.replace(first, tokens=passes[0].tokens, seconds=passes[0].seconds,
                                    iterations=passes[0].iterations)
    return passes


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def acceptance_length(waves: Sequence[Sequence[Sequence[int]]]) -> float:
    """1 + mean accepted drafts over every (wave, request, iteration); 1 with none (vanilla
    records nothing)."""
    draws = [a for wave in waves for req in wave for a in req]
    return 1.0 + float(np.mean(draws)) if draws else 1.0


def prompt_lengths(waves: Sequence[Sequence[Sequence[int]]],
                   prompts: Sequence[Sequence[int]] | None = None) -> np.ndarray:
    """[distinct prompts] each prompt's acceptance length in a run: its requests' (1 + mean
    accepted) averaged. `prompts` [wave][request] names each request's prompt (requests of one
    prompt are averaged first: at B 64 and C ≥ 4K the 32 longdoc prompts give 8–16 distinct
    ones, so the requests are not independent); None = every request its own."""
    by_prompt: dict[int, list[float]] = {}
    for w, wave in enumerate(waves):
        for r, req in enumerate(wave):
            if len(req):
                key = prompts[w][r] if prompts is not None else len(by_prompt)
                by_prompt.setdefault(key, []).append(1.0 + float(np.mean(req)))
    return np.asarray([np.mean(v) for v in by_prompt.values()], dtype=np.float64)


def acceptance_se_pct(waves: Sequence[Sequence[Sequence[int]]],
                      prompts: Sequence[Sequence[int]] | None = None) -> float:
    """Sampling error of a run's acceptance length, % of it: the standard deviation of the
    per-prompt acceptance lengths (`prompt_lengths`) / √prompts. Acceptance varies widely from
    prompt to prompt (SmolLM2 on longdoc), so a run of few prompts measures those prompts, not
    the workload the prediction describes: an acceptance error within ~2 of these is noise.
    NaN with fewer than 2 prompts (and for vanilla)."""
    return se_pct_of(prompt_lengths(waves, prompts))


def se_pct_of(values: np.ndarray) -> float:
    """The standard error of the mean of `values` (sd / √n), % of the mean; NaN with fewer
    than 2."""
    if len(values) < 2:
        return float("nan")
    return float(100.0 * values.std(ddof=1) / math.sqrt(len(values)) / values.mean())


def run_error_pct(se_pct: float, prompts: int) -> float:
    """A run's acceptance sampling error as the interval takes it: `se_pct` (from `prompts`
    distinct prompts, so an sd of prompts − 1 degrees of freedom) widened by Student's t over
    the normal quantile the interval uses, t(0.975, prompts − 1) / Z95 (8 prompts: ×1.2); 0
    when unmeasured."""
    if not math.isfinite(se_pct) or prompts < 2:
        return 0.0
    return se_pct * t_quantile(prompts - 1, 0.975) / Z95


def format_phases(phases: dict[str, float]) -> str:
    """'decode=2.81;sample=0.31' (ms per iteration), phases in methods.PHASES order."""
    return ";".join(f"{p}={phases[p]:.4g}" for p in PHASES if p in phases)


def parse_phases(text: Any) -> dict[str, float]:
    if not isinstance(text, str) or not text:
        return {}
    return {k: float(v) for k, v in (item.split("=") for item in text.split(";"))}


def phase_line(row: dict[str, Any]) -> str:
    """'; ms/iteration measured/predicted: verify 5.1/5.0 sample 0.62/0.55' ('' untimed)."""
    meas, pred = parse_phases(row.get("measured_phase_ms")), parse_phases(
        row.get("predicted_phase_ms"))
    if not meas:
        return ""
    parts = [f"{k} {meas.get(k, 0.0):.3g}/{pred.get(k, 0.0):.3g}"
             for k in dict.fromkeys([*pred, *meas])]
    return "; ms/iteration measured/predicted: " + " ".join(parts)


def encode_accepted(accepted: Sequence[Sequence[Sequence[int]]]) -> str:
    """Per wave '|', per request ',', one hex digit per iteration (γ ≤ 15)."""
    return "|".join(",".join("".join(format(a, "x") for a in req) for req in wave)
                    for wave in accepted)


def decode_accepted(text: Any) -> list[list[list[int]]]:
    if not isinstance(text, str) or not text:
        return []
    return [[[int(c, 16) for c in req] for req in wave.split(",")] for wave in text.split("|")]


def pct_error(a: float, b: float) -> float:
    return 100.0 * (a - b) / b if b else float("nan")


# How a real run cuts a workload's prompts to the row's context C (a table's `prompt_cut`):
# "end": every prompt at least C long, a request keeping its last C tokens (tables before the
# column); "nearest": the prompts nearest above C (those within NEAREST_CUT of it, at least
# NEAREST_PROMPTS), each keeping the workload's template head (the chat template's system turn
# and user tag, the prefix every prompt shares) and losing the start of the text after it. A
# request then stays a whole chat turn of about C tokens, as the traced prompts near C are,
# instead of a fragment of a prompt twice as long without its chat header. Book windows
# (longdoc, recall) keep their first C tokens either way: a window of a book is one at any cut.
PROMPT_CUTS = ("end", "nearest")
PROMPT_CUT = "nearest"
NEAREST_CUT = 0.25  # a request keeps >= 80 % of its prompt's text where enough prompts allow
NEAREST_PROMPTS = 8  # fewer distinct prompts would leave the run's sampling error unmeasured


def request_prompts(h: HeldOut, weights: str, workload_prompts: int | None,
                    cut: str = PROMPT_CUT) -> tuple[list[list[int]] | None, int | None]:
    """([wave][request] prompt of each request of a real run, the workload's prompt count it
    assumes): the run decoded the first `workload_prompts` prompts of h's workload (None:
    all of today's), picked as `cut` picks them. (None, None) for replay, where every request
    draws on its own."""
    if weights == "random":
        return None, None
    workload = load_workload(h.workload or "longdoc")
    n = len(workload) if workload_prompts is None else workload_prompts
    return prompt_index(h, len(long_prompts(h, workload[:n], cut)[0])), n


def long_prompts(h: HeldOut, workload_prompts: Sequence[Sequence[int]], cut: str = PROMPT_CUT
                 ) -> tuple[list[list[int]], str]:
    """The prompts h's requests take in turn, and a note ('' if natural): those at least
    h.context long (under "nearest", the nearest of them, shortest first), or (when none is)
    every prompt, to be repeated up to the context. A recall prompt ends on its question and
    the cue the answer follows, which any cut loses: only those of exactly h.context tokens
    are natural."""
    if h.workload in WHOLE_PROMPT_WORKLOADS:
        whole = [list(p) for p in workload_prompts if len(p) == h.context]
        if whole:
            return whole, ""
        return [list(p) for p in workload_prompts if len(p) >= 2], (
            f"no {h.workload} prompt has exactly {h.context} tokens: prompts cut or repeated "
            "to reach it, without their question (acceptance not the traced workload's)")
    long = [list(p) for p in workload_prompts if len(p) >= h.context]
    if long and cut == "nearest" and not book_window(h):
        return nearest_prompts(long, h.context), ""
    if long:
        return long, ""
    return [list(p) for p in workload_prompts if len(p) >= 2], (
        f"no workload prompt has {h.context} tokens: prompts repeated to reach it "
        "(acceptance not the traced workload's)")


def nearest_prompts(long: list[list[int]], context: int) -> list[list[int]]:
    """The prompts of `long` (each >= context) within NEAREST_CUT of the context, or the
    NEAREST_PROMPTS shortest when fewer are; shortest first, ties in workload order."""
    by_length = sorted(long, key=len)
    close = [p for p in by_length if len(p) <= (1.0 + NEAREST_CUT) * context]
    return close if len(close) >= NEAREST_PROMPTS else by_length[:NEAREST_PROMPTS]


def book_window(h: HeldOut) -> bool:
    """A book window keeps its first tokens; every other request its end (the question)."""
    return (h.workload or "longdoc") in BOOK_WINDOW_WORKLOADS


def template_head(workload_prompts: Sequence[Sequence[int]]) -> int:
    """Tokens every prompt of the workload starts with (its chat template's head); 0 for
    fewer than two prompts."""
    if len(workload_prompts) < 2:
        return 0
    first, n = workload_prompts[0], min(len(p) for p in workload_prompts)
    k = 0
    while k < n and all(p[k] == first[k] for p in workload_prompts):
        k += 1
    return k


def cut_prompt(ids: list[int], context: int, keep_end: bool, head: int = 0) -> list[int]:
    """`ids` cut (or, when shorter, repeated) to `context` tokens: its first ones, or its
    first `head` then its last context − head (head capped at half the context)."""
    while len(ids) < context:
        ids = ids + ids
    if not keep_end:
        return ids[:context]
    head = min(head, context // 2)
    return ids[:head] + ids[len(ids) - (context - head):]


def recorded_workload_size(row: dict[str, Any]) -> int | None:
    """A table row's `workload_prompts`, or None (today's) for a table from before the column."""
    n = row.get("workload_prompts")
    return None if n is None or pd.isna(n) else int(n)


def recorded_prompt_cut(row: dict[str, Any]) -> str:
    """A table row's `prompt_cut`, or "end" (how every run cut its prompts before the column)."""
    cut = row.get("prompt_cut")
    if not isinstance(cut, str) or not cut:
        return "end"
    if cut not in PROMPT_CUTS:
        raise UserInputError(f"prompt_cut {cut!r} is none of {', '.join(PROMPT_CUTS)}",
                             where="the results table",
                             fix="re-measure the row, or write the cut its prompts had")
    return cut


def prompt_index(h: HeldOut, n_prompts: int, waves: int | None = None) -> list[list[int]]:
    """[wave][request] index of the prompt each request takes, (w·B + b) mod n: waves see
    other prompts. `waves` defaults to h's."""
    return [[(w * h.batch + b) % n_prompts for b in range(h.batch)]
            for w in range(h.waves if waves is None else waves)]


def result_row(h: HeldOut, pred: pd.Series, m: Measurement, weights: str,
                replayed: float, replayed_iter_ms: float, notes: str,
                wall_s: float, predicted_phase_ms: dict[str, float] | None = None,
                workload_prompts: int | None = None, prompt_cut: str = PROMPT_CUT
                ) -> dict[str, Any]:
    """One result row. `predicted` is what the issue's targets are judged on: the simulator
    from the trace sets alone for real weights; for the replay regime the simulator fed the
    same replayed accept counts as the run (the acceptance there is an input drawn from the
    acceptance model, like an arrival trace; the regime validates the performance model).
    `workload_prompts`: how many prompts the workload had when the run was measured (default
    today's), which with `prompt_cut` fixes the prompt each request decoded."""
    prompts, workload_prompts = request_prompts(h, weights, workload_prompts, prompt_cut)
    sim = float(pred["throughput_tok_s"])
    primary = sim if weights == "real" else replayed
    lengths = prompt_lengths(m.accepted, prompts)
    measured_iter_ms = 1000.0 * m.seconds / max(m.iterations, 1)
    row = {
        **dataclasses.asdict(h),
        "regime": "real-weights" if weights == "real" else "random-weights+replay",
        "predicted": primary,
        "measured": m.throughput,
        "error_pct": pct_error(primary, m.throughput),
        "predicted_sim": sim,
        "error_sim_pct": pct_error(sim, m.throughput),
        "predicted_replay": replayed,
        "error_replay_pct": pct_error(replayed, m.throughput),
        # the simulation's Monte-Carlo CI of predicted_sim (not of `predicted` under replay)
        "sim_ci_low": float(pred["throughput_ci_low"]),
        "sim_ci_high": float(pred["throughput_ci_high"]),
        "predicted_acceptance_length": float(pred["window_acceptance_length"]),
        "measured_acceptance_length": m.acceptance_length,
        "acceptance_error_pct": pct_error(float(pred["window_acceptance_length"]),
                                     m.acceptance_length),
        "acceptance_se_pct": se_pct_of(lengths),
        "acceptance_prompts": len(lengths),
        "workload_prompts": math.nan if workload_prompts is None else workload_prompts,
        "prompt_cut": prompt_cut if weights == "real" else "",
        "measured_iterations": m.iterations,
        "measured_seconds": m.seconds,
        "measured_tokens": m.tokens,
        "predicted_iter_ms": replayed_iter_ms,
        "measured_iter_ms": measured_iter_ms,
        "iter_time_error_pct": pct_error(replayed_iter_ms, measured_iter_ms),
        "measured_phase_ms": format_phases(m.phase_ms),
        "predicted_phase_ms": format_phases(predicted_phase_ms or {}),
        "extrapolated": str(pred.get("extrapolated") or ""),
        # where the prediction's inputs came from (predict's provenance columns)
        **{col: str(pred.get(col) or "") for col in ("engine", "gpu", *PROVENANCE_COLUMNS)},
        "notes": notes,
        "wall_s": wall_s,
        "measured_accepted": encode_accepted(m.accepted),
    }
    row.update(validation_interval(pred, primary, weights, run_error_pct(
        row["acceptance_se_pct"], row["acceptance_prompts"])))
    return row


def validation_interval(pred: pd.Series, predicted: float, weights: str,
                        run_acceptance_error_pct: float) -> dict[str, Any]:
    """pi_low / pi_high / pi_dominant of `predicted` (sim.uncertainty): real weights add the
    run's own acceptance sampling error (`run_error_pct`: finite, 0 unmeasured) to the
    model's; the replay regime feeds the run's accept counts, so neither acceptance term nor
    the Monte-Carlo one applies. The one-sided host-protocol term (sim.uncertainty) lowers
    pi_low in both; the one-sided sampling-mode term (a run in a mode the latency set did not
    time) moves pi_high or pi_low in both."""
    if "pi_latency_fit_pct" not in pred:
        return {"pi_low": math.nan, "pi_high": math.nan, "pi_dominant": ""}
    real = weights == "real"
    parts = parts_of(dict(pred), acceptance=real, simulation=real,
                     extra_acceptance_pct=run_acceptance_error_pct)
    slower = float(pred.get("pi_host_protocol_pct", 0.0))
    mode = float(pred.get("pi_sampling_mode_pct", 0.0))
    lo, hi, dominant = interval(predicted, parts, slower, mode)
    return {"pi_low": max(0.0, lo), "pi_high": hi, "pi_dominant": dominant,
            **{f"pi_{k.replace('-', '_')}_pct": v for k, v in parts.items()},
            "pi_host_protocol_pct": slower, "pi_sampling_mode_pct": mode}


REQUIRED_RESULT_COLUMNS = ("method", "gamma", "sparsity", "batch", "context", "output_len",
                           "regime", "measured")


def read_results(path: Path) -> pd.DataFrame:
    """A result table written by `run_validation` (any version with the required columns)."""
    if not path.is_file():
        raise UserInputError("file not found", where=str(path),
                             fix="pass the CSV written by `vegas-sim validate --out`")
    table = pd.read_csv(path, keep_default_na=True)
    missing = [c for c in REQUIRED_RESULT_COLUMNS if c not in table.columns]
    if missing:
        raise UserInputError(f"missing columns {missing}", where=str(path),
                             fix="pass the CSV written by `vegas-sim validate --out`")
    if table.empty:
        raise UserInputError("the result table has no rows", where=str(path),
                             fix="pass a validation run that measured something")
    return table


def summarize(table: pd.DataFrame, column: str = "error_pct") -> str:
    """Per regime: configurations, median and max |error| (NaN errors are not counted)."""
    lines = []
    for regime, g in table.groupby("regime"):
        err = g[column].abs().dropna() if column in g else pd.Series(dtype=float)
        if err.empty:
            lines.append(f"{regime}: {len(g)} configurations, no {column}")
            continue
        lines.append(f"{regime}: {len(err)} configurations, |error| median {err.median():.1f} %, "
                     f"max {err.max():.1f} %")
        for extra in ("error_sim_pct", "error_replay_pct", "acceptance_error_pct",
                      "iter_time_error_pct"):
            if extra != column and extra in g and g[extra].notna().any():
                e = g[extra].abs().dropna()
                lines.append(f"  {extra}: median {e.median():.1f} %, max {e.max():.1f} %")
        if "measured_pass_se_pct" in g and g["measured_pass_se_pct"].notna().any():
            first = g["error_first_pass_pct"].abs().dropna()
            lines.append(f"  measured in {int(g['measured_passes'].min())}–"
                         f"{int(g['measured_passes'].max())} passes: pass-to-pass SE median "
                         f"{g['measured_pass_se_pct'].median():.1f} %; against the first pass "
                         f"alone |error| median {first.median():.1f} %, max {first.max():.1f} %")
        if "acceptance_se_pct" in g and g["acceptance_se_pct"].notna().any():
            se = g["acceptance_se_pct"].dropna()
            within = (g["acceptance_error_pct"].abs() <= 2 * g["acceptance_se_pct"]).sum()
            lines.append(f"  acceptance sampling error of the runs (prompt-to-prompt): median "
                         f"{se.median():.1f} %; {within} of {len(se)} acceptance errors "
                         "within 2 of it")
    return "\n".join(lines)


def compare(before: pd.DataFrame, after: pd.DataFrame) -> str:
    """Before/after |error| per regime (median, max) and the rows that moved most."""
    lines = []
    for regime in sorted(set(before["regime"]) | set(after["regime"])):
        b = before[before["regime"] == regime]["error_pct"].abs().dropna()
        a = after[after["regime"] == regime]["error_pct"].abs().dropna()
        fmt = lambda e: (f"median {e.median():.1f} %, max {e.max():.1f} %"
                         if len(e) else "no errors")
        lines.append(f"{regime}: before {fmt(b)} ({len(b)}) -> after {fmt(a)} ({len(a)})")
    return "\n".join(lines)
