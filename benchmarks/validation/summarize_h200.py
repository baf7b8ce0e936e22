"""Summary of the H200 validation tables: median / max |error| per regime and row set, as run
and re-predicted, and the combined re-predicted table that `vegas-sim report` plots.

    python benchmarks/validation/summarize_h200.py   # writes validate_h200_summary.csv,
                                                     # validate_h200.csv and validate_h200_repeat.csv
    vegas-sim report benchmarks/results/validate_h200.csv --out benchmarks/results/validate_h200.html
    python benchmarks/validation/summarize_h200.py --seeds 5   # + validate_h200_seed_spread.csv

`--seeds N` re-predicts every measured table with prediction seeds 0..N-1 (a few minutes on two
cores): the simulator's own Monte-Carlo error, which moves the medians by a few tenths of a
point. `validate_h200_repeat.csv` compares each table with the earlier run of the same rows
(`REPEATS`): how far the measurement itself moved between two machines.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pandas as pd

from vegas_sim.validate.repredict import repredict

RESULTS = Path(__file__).resolve().parents[1] / "results"
REGIMES = (("real-weights (SmolLM2 end to end)", "smollm2"),
           ("random-weights+replay (Qwen3-8B)", "qwen3_8b"))
TABLES = (("as run", ".csv"), ("re-predicted", ".repredicted.csv"))
# (summary column prefix, result column): throughput error, then its two factors
COLUMNS = (("", "error_pct"), ("iter_time_", "iter_time_error_pct"),
           ("acceptance_", "acceptance_error_pct"))
# a second draw of held-out rows (measured again on each runtime revision): stem -> (label, table stem)
FRESH = {"smollm2": ("fresh 24 (seed 20261130)", "smollm2_seed20261130")}
# the throughput columns say "error" in their names, the factors' do not
SUFFIX = {"": "abs_error_pct", "iter_time_": "abs_pct", "acceptance_": "abs_pct"}


def median_max(frame: pd.DataFrame, column: str) -> tuple[float | str, float | str]:
    """(median, max) of |column|, rounded; blanks where the table has none."""
    err = frame[column].abs().dropna() if column in frame else pd.Series(dtype=float)
    return (round(float(err.median()), 2), round(float(err.max()), 2)) if len(err) else ("", "")


def summary_rows() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for regime, stem in REGIMES:
        for table, suffix in TABLES:
            seeded = pd.read_csv(RESULTS / f"validate_h200_{stem}{suffix}")
            span = pd.read_csv(RESULTS / f"validate_h200_{stem}_span{suffix}")
            frames = [("seeded 24", seeded), ("span", span),
                      ("all", pd.concat([seeded, span], ignore_index=True))]
            if stem in FRESH:
                label, fresh = FRESH[stem]
                frames.append((label, pd.read_csv(RESULTS / f"validate_h200_{fresh}{suffix}")))
            for label, frame in frames:
                row: dict[str, object] = {"regime": regime, "table": table, "rows": label,
                                          "n": len(frame)}
                for prefix, column in COLUMNS:
                    med, mx = median_max(frame, column)
                    row[f"{prefix}median_{SUFFIX[prefix]}"] = med
                    row[f"{prefix}max_{SUFFIX[prefix]}"] = mx
                rows.append(row)
    return rows


TRACES = Path(__file__).resolve().parents[2] / "vegas_sim" / "traces" / "default"
# (label, measured tables, latency set): each regime's tables measured on the runtime revision
# of its packaged latency set (revision 3)
SPREAD_TABLES = (
    ("(a) SmolLM2, 27 rows", ("smollm2", "smollm2_span"), "smollm2-135m-h200"),
    ("(b) Qwen3-8B, 28 rows", ("qwen3_8b", "qwen3_8b_span"), "qwen3-8b-h200"),
)


def seed_spread(seeds: int) -> pd.DataFrame:
    """Median / max |error| of each table pair re-predicted with seeds 0..seeds-1."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, stems, latency in SPREAD_TABLES:
            for seed in range(seeds):
                frames = [repredict(RESULTS / f"validate_h200_{stem}.csv", traces=TRACES / latency,
                                    acceptance_traces=TRACES / "smollm2-135m-real",
                                    out=Path(tmp) / f"{stem}_{seed}.csv", seed=seed)[1]
                          for stem in stems]
                med, mx = median_max(pd.concat(frames, ignore_index=True), "error_pct")
                rows.append({"tables": label, "seed": seed, "median_abs_error_pct": med,
                             "max_abs_error_pct": mx})
                print(f"{label}, seed {seed}: median {med} %, max {mx} %", flush=True)
    return pd.DataFrame(rows)


# (label, later table stem, earlier table stem): the same held-out rows measured twice. The
# first three pairs ran on one runtime (but for the sparse launch, 0.5-1 % of a draft step): the
# measurement's own run-to-run spread. The last three straddle runtime revision 3's sampler.
REPEATS = (
    ("(a) revision 2, measured twice", "rev2_smollm2", "rev2_sparse4w_smollm2"),
    ("(a) revision 2, measured twice", "rev2_smollm2_span", "rev2_sparse4w_smollm2_span"),
    ("(a) fresh draw, revision 2, measured twice", "rev2_smollm2_seed20261130",
     "rev2_sparse4w_smollm2_seed20261130"),
    ("(b) revision 2, measured twice", "rev2_qwen3_8b", "rev2_sparse4w_qwen3_8b"),
    ("(b) revision 2, measured twice", "rev2_qwen3_8b_span", "rev2_sparse4w_qwen3_8b_span"),
    ("(a) revision 3 vs 2", "smollm2", "rev2_smollm2"),
    ("(a) revision 3 vs 2", "smollm2_span", "rev2_smollm2_span"),
    ("(a) fresh draw, revision 3 vs 2", "smollm2_seed20261130",
     "rev2_smollm2_seed20261130"),
    ("(b) revision 3 vs 2", "qwen3_8b", "rev2_qwen3_8b"),
    ("(b) revision 3 vs 2", "qwen3_8b_span", "rev2_qwen3_8b_span"),
)
KEYS = ["method", "gamma", "sparsity", "batch", "context"]
REPEAT_COLUMNS = (("throughput", "measured"), ("iteration time", "measured_iter_ms"),
                  ("acceptance length", "measured_acceptance_length"),
                  ("prediction", "predicted"))


def repeat_rows() -> pd.DataFrame:
    """|later / earlier - 1| of the measured (and predicted) columns of the rows both runs
    hold, median and max per comparison: the run-to-run spread of the measurement."""
    pairs: dict[str, list[pd.DataFrame]] = {}
    for label, stem, earlier in REPEATS:
        later = pd.read_csv(RESULTS / f"validate_h200_{stem}.csv")
        both = later.merge(pd.read_csv(RESULTS / f"validate_h200_{earlier}.csv"), on=KEYS,
                           suffixes=("", "_earlier"))
        pairs.setdefault(label, []).append(both)
    rows = []
    for label, frames in pairs.items():
        both = pd.concat(frames, ignore_index=True)
        for name, column in REPEAT_COLUMNS:
            change = (both[column] / both[f"{column}_earlier"] - 1.0).abs() * 100.0
            rows.append({"comparison": label, "quantity": name, "n": len(both),
                         "median_abs_change_pct": round(float(change.median()), 2),
                         "max_abs_change_pct": round(float(change.max()), 2)})
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=0,
                    help="also re-predict with this many seeds (validate_h200_seed_spread.csv)")
    args = ap.parse_args()
    if args.seeds:
        seed_spread(args.seeds).to_csv(RESULTS / "validate_h200_seed_spread.csv", index=False)
    repeat = repeat_rows()
    repeat.to_csv(RESULTS / "validate_h200_repeat.csv", index=False)
    summary = pd.DataFrame(summary_rows())
    summary.to_csv(RESULTS / "validate_h200_summary.csv", index=False)
    stems = [f"{stem}{part}" for _, stem in REGIMES for part in ("", "_span")]
    stems += [fresh for _, fresh in FRESH.values()]
    combined = pd.concat([pd.read_csv(RESULTS / f"validate_h200_{stem}.repredicted.csv")
                          for stem in stems], ignore_index=True)
    combined.to_csv(RESULTS / "validate_h200.csv", index=False)
    print(summary.to_string(index=False))
    print(repeat.to_string(index=False))


if __name__ == "__main__":
    main()
