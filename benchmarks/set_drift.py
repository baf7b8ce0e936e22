"""How far one latency trace set moved from another measured on the same grid (CPU).

Matches the two sets' rows on their grid keys and prints new / old of the median latency:
per phase (quartiles), and the draft step by batch × context. Used to say how much a
re-measurement changed a packaged set (docs/RESULTS.md, Calibration; d95cdf6 holds the
revision-2 sets):

    git show d95cdf6:vegas_sim/traces/default/qwen3-8b-h200/latency.parquet > /tmp/old.parquet
    python benchmarks/set_drift.py /tmp/old.parquet vegas_sim/traces/default/qwen3-8b-h200
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

KEYS = ["phase", "method", "batch", "context", "n_query", "kv_read", "collect_rows"]


def latency(path: Path) -> pd.DataFrame:
    """A set's latency table: the parquet itself, or the one inside a trace-set folder."""
    return pd.read_parquet(path / "latency.parquet" if path.is_dir() else path)


def ratios(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """new / old median ms of every grid row both sets hold (rows repeat per temperature
    and draft position, so each key's rows are reduced to their median first)."""
    med = [t.groupby(KEYS, as_index=False)["ms_median"].median() for t in (old, new)]
    both = med[0].merge(med[1], on=KEYS, suffixes=("_old", "_new"))
    both["ratio"] = both["ms_median_new"] / both["ms_median_old"]
    return both


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path, help="the earlier set (folder or latency.parquet)")
    ap.add_argument("new", type=Path, help="the later set (folder or latency.parquet)")
    args = ap.parse_args()
    both = ratios(latency(args.old), latency(args.new))
    print(f"{len(both)} grid rows in both sets; new / old of the median ms")
    quartiles = both.groupby("phase")["ratio"].quantile([0.0, 0.25, 0.5, 0.75, 1.0]).unstack()
    print(quartiles.round(3).to_string())
    draft = both[both["phase"] == "draft_step"]
    print("\ndraft_step, median over methods, n_query and KV reads, by batch (rows) x context")
    print(draft.groupby(["batch", "context"])["ratio"].median().unstack().round(3).to_string())


if __name__ == "__main__":
    main()
