"""What `sweep` and `tune` rank configurations by (``--rank-by``).

- ``throughput``: ``throughput_tok_s``, higher is better (the served rate in open loop).
- ``goodput``: ``goodput_tok_s``, higher is better: tokens/s of the requests that meet the SLOs
  (``--slo-tpot-ms``, ``--slo-ttft-ms``), so it needs at least one.
- ``tpot``: ``tpot_ms_p50``, lower is better.

`score` turns each into one column where higher is better and ≥ 0 (TPOT as tokens per second
of one request, 1000 / TPOT), so ranking code has one direction and relative scores
(score / best) mean the same for all three.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from vegas_sim.errors import UserInputError
from vegas_sim.methods import VANILLA

RANK_BY = ("throughput", "goodput", "tpot")
COLUMN = {"throughput": "throughput_tok_s", "goodput": "goodput_tok_s", "tpot": "tpot_ms_p50"}


def check_rank_by(rank_by: str, slo_given: bool, where: str = "--rank-by") -> str:
    """The metric name, refused when unknown, or goodput without an SLO."""
    if rank_by not in RANK_BY:
        raise UserInputError(f"unknown ranking metric {rank_by!r}", where=where,
                             fix=f"use one of: {', '.join(RANK_BY)}")
    if rank_by == "goodput" and not slo_given:
        raise UserInputError("goodput needs a service-level objective", where=where,
                             fix="add --slo-tpot-ms and/or --slo-ttft-ms, or rank by "
                                 "throughput or tpot")
    return rank_by


def score(df: pd.DataFrame, rank_by: str = "throughput") -> pd.Series:
    """Per row, higher is better (module docstring); NaN (no goodput, no TPOT) scores 0."""
    col = df[COLUMN[rank_by]].astype(float)
    if rank_by == "tpot":
        col = 1000.0 / col.where(col > 0)
    return col.fillna(0.0)


def best_per_cell(df: pd.DataFrame, rank_by: str,
                  cell: tuple[str, ...] = ("batch", "context", "output_len")) -> pd.DataFrame:
    """The best row of each cell, ties to the smaller γ then sparsity, vanilla left out
    unless a cell has nothing else."""
    keys = [k for k in cell if k in df.columns]
    out = []
    for _, rows in df.groupby(keys, sort=True) if keys else [((), df)]:
        spec = rows[rows["method"] != VANILLA]
        rows = spec if not spec.empty else rows
        s = score(rows, rank_by)
        tied = rows[s.to_numpy() >= float(np.max(s.to_numpy())) * (1 - 1e-12)]
        out.append(tied.sort_values(["gamma", "sparsity"], kind="stable").iloc[0])
    return pd.DataFrame(out).reset_index(drop=True)


def describe_best(row: pd.Series, rank_by: str) -> str:
    """One line: the cell, the configuration, and the metric it won on."""
    value = float(row[COLUMN[rank_by]])
    unit = "ms TPOT p50" if rank_by == "tpot" else f"tok/s {rank_by}"
    return (f"best by {rank_by}: B={row['batch']} C={row['context']} out={row['output_len']}: "
            f"{row['method']} γ={row['gamma']} s={row['sparsity']:g} — {value:.2f} {unit}, "
            f"{float(row['throughput_tok_s']):.0f} tok/s"
            + (f", roofline bound {float(row['roofline_pct']):.0f} % of its iteration"
               if "roofline_pct" in row.index and pd.notna(row["roofline_pct"]) else ""))
