"""Greedy over sampled, per sampling phase, from measurement: the evidence behind
`sim.uncertainty.GREEDY_OVER_SAMPLED` and `GREEDY_SAVED_MS_PER_CALL` (the sampling-mode interval term of a set that timed
one mode only).

Two sources, whichever is given:

- a validation table (`vegas-sim validate --out`) whose rows ran at T 0 and at T > 0 against a
  latency grid timed at one temperature: per phase, the median of measured / predicted phase
  ms over the greedy rows, divided by the same median over the sampled rows (the grid's own
  error at its temperature cancels), and the ms a greedy call saved (median per call);
- a trace set that timed both modes (`calibrate --greedy-latency`): per phase, the median
  over its rows of the greedy row's ms over the sampled row's at the same point.

    python benchmarks/sampling_mode.py --results benchmarks/results/validate_h100_smollm2_workloads_seed20261209.csv

With --results it also prints how many of the table's rows the prediction interval would
cover with the sampling-mode term (`sim.uncertainty.sampling_mode_pct`, from each greedy
row's predicted phase ms) against without it (the table's own pi_low..pi_high).
    python benchmarks/sampling_mode.py --traces /root/tr/smollm2-135m-h200

Nothing runs at import.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from vegas_sim.sim.uncertainty import (
    GREEDY_OVER_SAMPLED,
    GREEDY_SAVED_MS_PER_CALL,
    interval,
)
from vegas_sim.traces import io
from vegas_sim.traces.schema import SAMPLING_PHASES, UNRECORDED_TEMPERATURE

POINT = ["phase", "method", "batch", "context", "n_query", "kv_read", "collect_rows"]


def _phases(text: object) -> dict[str, float]:
    """'draft_step=4.3;verify=1.8' -> {phase: ms}."""
    if not isinstance(text, str) or not text:
        return {}
    return {k: float(v) for k, v in (item.split("=") for item in text.split(";"))}


def _calls(phase: str, gamma: int) -> int:
    """Calls of `phase` in one speculative iteration of draft length γ."""
    return gamma if phase == "draft_step" else 1


def from_results(path: Path) -> dict[str, tuple[float, float]]:
    """{phase: (greedy / sampled, ms saved per call)} from a validation table (see the module
    docstring): the ms a greedy row's phase ran under its sampled pricing (corrected by the
    sampled rows' median measured / predicted), per call of the phase, median over the
    greedy rows."""
    table = pd.read_csv(path)
    out: dict[str, tuple[float, float]] = {}
    for phase in SAMPLING_PHASES:
        pairs = {greedy: [(m[phase], p[phase], int(g)) for m, p, g in
                          ((_phases(a), _phases(b), g) for a, b, g in
                           zip(rows["measured_phase_ms"], rows["predicted_phase_ms"],
                               rows["gamma"]))
                          if phase in m and p.get(phase, 0.0) > 0]
                 for greedy, rows in ((True, table[table["temperature"] == 0]),
                                      (False, table[table["temperature"] > 0]))}
        norm = float(np.median([m / p for m, p, _ in pairs[False]]))
        ratio = float(np.median([m / p for m, p, _ in pairs[True]])) / norm
        saved = float(np.median([(p * norm - m) / _calls(phase, g) for m, p, g in pairs[True]]))
        out[phase] = (ratio, saved)
    return out


def term_pct(phases: dict[str, float], gamma: int) -> float:
    """`sampling_mode_pct` of a greedy row priced as sampled, from its per-phase ms."""
    total = sum(phases.values())
    moved = sum(min(phases[p] * (1.0 - r), GREEDY_SAVED_MS_PER_CALL[p] * _calls(p, gamma))
                for p, r in GREEDY_OVER_SAMPLED.items() if phases.get(p, 0.0) > 0)
    return 100.0 * moved / (total - moved) if total > moved else 0.0


def coverage(path: Path) -> tuple[int, int, int]:
    """(rows, covered by the table's interval, covered with the sampling-mode term added to
    its greedy rows)."""
    table = pd.read_csv(path)
    before = after = 0
    for _, r in table.iterrows():
        parts = {k: float(r[f"pi_{k.replace('-', '_')}_pct"]) for k in
                 ("latency-fit", "acceptance-sampling", "extrapolation-distance", "simulation")}
        mode = term_pct(_phases(r["predicted_phase_ms"]), int(r["gamma"])) if (
            r["temperature"] == 0) else 0.0
        lo, hi, _ = interval(float(r["predicted"]), parts, float(r["pi_host_protocol_pct"]),
                             mode)
        before += int(r["pi_low"] <= r["measured"] <= r["pi_high"])
        after += int(max(lo, 0.0) <= r["measured"] <= hi)
    return len(table), before, after


def from_traces(path: Path) -> dict[str, float]:
    """{phase: greedy / sampled} from a trace set of both modes (see the module docstring)."""
    latency = io.load_trace_set(path).latency
    latency = latency[latency["temperature"] != UNRECORDED_TEMPERATURE]
    greedy = latency[latency["temperature"] == 0]
    sampled = latency[latency["temperature"] > 0]
    joined = greedy.merge(sampled, on=POINT, suffixes=("_g", "_s"))
    return {str(phase): float((g["ms_median_g"] / g["ms_median_s"]).median())
            for phase, g in joined.groupby("phase") if phase in SAMPLING_PHASES}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, help="a validation table")
    ap.add_argument("--traces", type=Path, help="a trace set that timed both modes")
    args = ap.parse_args()
    if args.results is None and args.traces is None:
        ap.error("give --results or --traces")
    if args.results is not None:
        print(f"results {args.results}: " + ", ".join(
            f"{p} greedy/sampled {r:.3f}, saved {ms:.3f} ms per call"
            for p, (r, ms) in from_results(args.results).items()))
        n, before, after = coverage(args.results)
        print(f"interval covers {before} of {n} rows; with the sampling-mode term {after}")
    if args.traces is not None:
        print(f"traces {args.traces}: " + ", ".join(
            f"{p} greedy/sampled {r:.3f}" for p, r in from_traces(args.traces).items()))


if __name__ == "__main__":
    main()
