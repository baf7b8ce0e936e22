"""Summary of the H200 validation tables: median / max |error| per regime and row set, as run
and re-predicted, and the combined re-predicted table that `vegas-sim report` plots.

    python benchmarks/validation/summarize_h200.py   # writes validate_h200_summary.csv and
                                                     # validate_h200.csv, prints the summary
    vegas-sim report benchmarks/results/validate_h200.csv --out benchmarks/results/validate_h200.html
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

RESULTS = Path(__file__).resolve().parents[1] / "results"
REGIMES = (("real-weights (SmolLM2 end to end)", "smollm2"),
           ("random-weights+replay (Qwen3-8B)", "qwen3_8b"))
TABLES = (("as run", ".csv"), ("re-predicted", ".repredicted.csv"))
# (summary column prefix, result column): throughput error, then its two factors
COLUMNS = (("", "error_pct"), ("iter_time_", "iter_time_error_pct"),
           ("acceptance_", "acceptance_error_pct"))
# the throughput columns say "error" in their names, the factors' do not
SUFFIX = {"": "abs_error_pct", "iter_time_": "abs_pct", "acceptance_": "abs_pct"}


def median_max(frame: pd.DataFrame, column: str) -> tuple[float | str, float | str]:
    """(median, max) of |column|, rounded; blanks where the table has none."""
    err = frame[column].abs().dropna() if column in frame else pd.Series(dtype=float)
    return (round(err.median(), 2), round(err.max(), 2)) if len(err) else ("", "")


def summary_rows() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for regime, stem in REGIMES:
        for table, suffix in TABLES:
            seeded = pd.read_csv(RESULTS / f"validate_h200_{stem}{suffix}")
            span = pd.read_csv(RESULTS / f"validate_h200_{stem}_span{suffix}")
            for label, frame in (("seeded 24", seeded), ("span", span),
                                 ("all", pd.concat([seeded, span], ignore_index=True))):
                row: dict[str, object] = {"regime": regime, "table": table, "rows": label,
                                          "n": len(frame)}
                for prefix, column in COLUMNS:
                    med, mx = median_max(frame, column)
                    row[f"{prefix}median_{SUFFIX[prefix]}"] = med
                    row[f"{prefix}max_{SUFFIX[prefix]}"] = mx
                rows.append(row)
    return rows


def main() -> None:
    summary = pd.DataFrame(summary_rows())
    summary.to_csv(RESULTS / "validate_h200_summary.csv", index=False)
    combined = pd.concat([pd.read_csv(RESULTS / f"validate_h200_{stem}{part}.repredicted.csv")
                          for _, stem in REGIMES for part in ("", "_span")], ignore_index=True)
    combined.to_csv(RESULTS / "validate_h200.csv", index=False)
    print(summary.to_string(index=False))


if __name__ == "__main__":
    main()
