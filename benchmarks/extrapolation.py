"""Range hold-outs: how well the simulator extrapolates beyond what its trace sets measured.

    python benchmarks/extrapolation.py                       # writes the two tables below
    python benchmarks/extrapolation.py --tables A.csv,B.csv  # other validation tables

For each axis, the packaged trace sets are cut to a range (`vegas-sim traces subset`), the
committed validation rows are re-predicted from the cut sets (`validate --repredict`, CPU only,
the measured columns kept), and the rows that lie beyond the range are scored (a row measured
again after a kernel change, `SUPERSEDES`, by its re-measurement):

| axis | latency set cut to | acceptance set cut to | rows scored |
|---|---|---|---|
| batch | batch ≤ 16 | (whole) | batch > 16 |
| context | Qwen3-8B context ≤ 32K, SmolLM2 ≤ 4K | (whole) | context above the cut |
| gamma | n_query ≤ 8 (γ ≤ 7) | γ ≤ 7 (γ 12 traces truncated) | γ ≥ 8 |
| sparsity (between) | (whole) | s ∈ {0.01, 0.05, 0.2} | real weights, s ∉ those |
| sparsity (beyond) | (whole) | s ≤ 0.07 | real weights, s > 0.07 |

Sparsity rows are real-weights rows only: in the replay regime the judged prediction replays
the run's own accept counts, so an acceptance cut does not reach it. Every row is also
predicted from the whole sets (`full_*` columns): the same rows' interpolation error.

Writes `benchmarks/results/extrapolation_by_axis.csv` (per axis and regime: rows, median and
max |error| from the cut sets and from the whole sets, share of rows inside the prediction
interval) and `benchmarks/results/extrapolation_rows.csv.gz` (every scored row), and
`benchmarks/results/pi_coverage.csv`: over every validation row predicted from the whole
sets (per regime, overall and per table), the share inside the prediction interval, its
median half-width and how often each part dominates.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from vegas_sim.traces.subset import subset_trace_set
from vegas_sim.validate.repredict import repredict

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TABLES = ("validate_h200_smollm2.csv", "validate_h200_smollm2_span.csv",
          "validate_h200_smollm2_seed20261130.csv", "validate_h200_qwen3_8b.csv",
          "validate_h200_qwen3_8b_span.csv", "validate_h200_smollm2_seed20261207.csv",
          "validate_h200_qwen3_8b_seed20261207.csv", "validate_h200_qwen3_8b_wave.csv",
          "validate_h200_smollm2_long_generation.csv", "validate_h200_qwen3_8b_aime_point.csv",
          "validate_h200_qwen3_8b_seed20261202.csv", "validate_h200_smollm2_seed20261202.csv",
          "validate_h200_qwen3_8b_far_seed20261203.csv",
          "validate_h200_smollm2_far_seed20261203.csv")
# A re-measurement → the table whose rows of the same configuration it replaces: the wave
# table measured the seed-20261207 vegas row again on verify's kernel launch of now.
SUPERSEDES = {"validate_h200_qwen3_8b_wave.csv": "validate_h200_qwen3_8b_seed20261207.csv"}
# Rows with outputs past the traced runs (the long-generation table) extrapolate output
# length; docs/RESULTS.md scores them there. The axes below score rows up to this output.
AXIS_MAX_OUTPUT = 256
CONFIG = ["method", "gamma", "sparsity", "batch", "context", "output_len", "workload",
          "temperature"]
LATENCY_SET = {"real-weights": "smollm2-135m-h200", "random-weights+replay": "qwen3-8b-h200"}
ACCEPTANCE_SET = "smollm2-135m-real"
COMMAND = "python benchmarks/extrapolation.py"


@dataclass(frozen=True)
class Axis:
    name: str
    latency_where: dict[str, str]  # regime → --where of the latency set ('' = whole)
    acceptance_where: str  # '' = whole
    rows: str  # pandas query selecting the rows scored
    regimes: tuple[str, ...] = tuple(LATENCY_SET)


AXES = (
    Axis("batch", {r: "batch<=16" for r in LATENCY_SET}, "", "batch > 16"),
    Axis("context", {"real-weights": "context<=4K", "random-weights+replay": "context<=32K"},
         "", "(regime == 'real-weights' and context > 4096) or "
             "(regime != 'real-weights' and context > 32768)"),
    Axis("gamma", {r: "n_query<=8" for r in LATENCY_SET}, "gamma<=7", "gamma >= 8"),
    Axis("sparsity-between", {}, "sparsity in 0.01|0.05|0.2",
         "method != 'vanilla' and sparsity not in (0.01, 0.05, 0.2)", ("real-weights",)),
    Axis("sparsity-beyond", {}, "sparsity<=0.07", "method != 'vanilla' and sparsity > 0.07",
         ("real-weights",)),
)


def _cut(source: str, where: str, scratch: Path, cache: dict[tuple[str, str], Path]) -> Path:
    """The subset of `source` by `where` (the whole packaged set when `where` is empty)."""
    if not where:
        return Path(source)
    key = (source, where)
    if key not in cache:
        cache[key] = scratch / f"{source}-{len(cache)}"
        subset_trace_set(source, cache[key], where)
    return cache[key]


def _repredict(table: Path, latency: Path, acceptance: Path, out: Path) -> pd.DataFrame:
    return repredict(table, traces=latency, acceptance_traces=acceptance, out=out)[1]


def _score(axis: Axis, regime: str, rows: pd.DataFrame, where: str) -> dict[str, object]:
    err, full = rows["error_pct"].abs(), rows["full_error_pct"].abs()
    inside = ((rows["measured"] >= rows["pi_low"]) & (rows["measured"] <= rows["pi_high"])
              if "pi_low" in rows else pd.Series(dtype=bool))
    return {"axis": axis.name, "regime": regime, "cut": where, "rows": len(rows),
            "median_abs_error_pct": err.median(), "max_abs_error_pct": err.max(),
            "full_median_abs_error_pct": full.median(), "full_max_abs_error_pct": full.max(),
            "pi_coverage": inside.mean() if len(inside) else float("nan"),
            "command": COMMAND}


def coverage(full: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Per regime, overall, then per validation table: rows whose measured throughput lies in
    [pi_low, pi_high], and the interval's median half-width ((pi_high − pi_low) / 2, % of the
    prediction)."""
    recs = []
    every = pd.concat(list(full.values()), ignore_index=True)
    frames = [*full.items(), ("all", every)]
    if "table" in every:
        frames += [(f"{regime}: {name}", t) for regime, r in full.items()
                   for name, t in r.groupby("table", sort=True)]
    for regime, t in frames:
        inside = (t["measured"] >= t["pi_low"]) & (t["measured"] <= t["pi_high"])
        half = 100.0 * (t["pi_high"] - t["pi_low"]) / 2.0 / t["predicted"]
        recs.append({"regime": regime, "rows": len(t), "pi_coverage": inside.mean(),
                     "pi_median_half_width_pct": half.median(),
                     "median_abs_error_pct": t["error_pct"].abs().median(),
                     "max_abs_error_pct": t["error_pct"].abs().max(),
                     "dominant": ";".join(f"{k}={v}" for k, v in
                                          t["pi_dominant"].value_counts().items()),
                     "command": COMMAND})
    return pd.DataFrame(recs)


def current(rows: pd.DataFrame) -> pd.Series:
    """False for each row whose configuration a re-measurement (SUPERSEDES) replaced."""
    config = rows[CONFIG].astype(str).apply(tuple, axis=1)
    stale = pd.Series(False, index=rows.index)
    for newer, older in SUPERSEDES.items():
        again = set(config[rows["table"] == newer])
        stale |= (rows["table"] == older) & config.isin(again)
    return ~stale


def run(tables: list[Path], scratch: Path, coverage_out: Path,
        ) -> tuple[pd.DataFrame, pd.DataFrame]:
    cache: dict[tuple[str, str], Path] = {}
    by_regime: dict[str, list[Path]] = {}
    for t in tables:
        regime = str(pd.read_csv(t, usecols=["regime"])["regime"].iloc[0])
        by_regime.setdefault(regime, []).append(t)
    full: dict[str, pd.DataFrame] = {}
    keep: dict[str, pd.Series] = {}
    for regime, paths in by_regime.items():
        every = pd.concat([
            _repredict(t, Path(LATENCY_SET[regime]), Path(ACCEPTANCE_SET),
                       scratch / f"full-{t.name}").assign(table=t.name) for t in paths],
            ignore_index=True)
        keep[regime] = current(every)
        full[regime] = every[keep[regime]].reset_index(drop=True)
    cov = coverage(full)
    cov.to_csv(coverage_out, index=False)
    print(cov.round(2).to_string(index=False), flush=True)
    summary, scored = [], []
    for axis in AXES:
        for regime in axis.regimes:
            if regime not in by_regime:
                continue
            lat_where = axis.latency_where.get(regime, "")
            lat = _cut(LATENCY_SET[regime], lat_where, scratch, cache)
            acc = _cut(ACCEPTANCE_SET, axis.acceptance_where, scratch, cache)
            new = pd.concat([_repredict(t, lat, acc, scratch / f"{axis.name}-{t.name}")
                             for t in by_regime[regime]], ignore_index=True)
            new = new[keep[regime]].reset_index(drop=True)
            new["full_predicted"] = full[regime]["predicted"].to_numpy()
            new["full_error_pct"] = full[regime]["error_pct"].to_numpy()
            rows = new.query(f"({axis.rows}) and output_len <= {AXIS_MAX_OUTPUT}").copy()
            where = "; ".join(w for w in (f"latency {lat_where}" if lat_where else "",
                                          f"acceptance {axis.acceptance_where}"
                                          if axis.acceptance_where else "") if w)
            rows.insert(0, "axis", axis.name)
            rows.insert(1, "cut", where)
            scored.append(rows)
            summary.append(_score(axis, regime, rows, where))
            print(f"{axis.name:<17} {regime:<22} {len(rows):>3} rows beyond ({where}): "
                  f"|error| median {summary[-1]['median_abs_error_pct']:.1f} %, max "
                  f"{summary[-1]['max_abs_error_pct']:.1f} % (whole sets: "
                  f"{summary[-1]['full_median_abs_error_pct']:.1f} / "
                  f"{summary[-1]['full_max_abs_error_pct']:.1f} %)", flush=True)
    return pd.DataFrame(summary), pd.concat(scored, ignore_index=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tables", default=",".join(str(RESULTS / t) for t in TABLES),
                    help="comma-separated validation tables (default: the committed ones)")
    ap.add_argument("--out", type=Path, default=RESULTS / "extrapolation_by_axis.csv")
    ap.add_argument("--rows-out", type=Path, default=RESULTS / "extrapolation_rows.csv.gz")
    ap.add_argument("--coverage-out", type=Path, default=RESULTS / "pi_coverage.csv")
    args = ap.parse_args(argv)
    tables = [Path(t) for t in args.tables.split(",")]
    with tempfile.TemporaryDirectory(prefix="vegas-extrap-") as tmp:
        summary, rows = run(tables, Path(tmp), args.coverage_out)
    summary.to_csv(args.out, index=False)
    rows.to_csv(args.rows_out, index=False)
    print(f"wrote {args.out}, {args.rows_out} and {args.coverage_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
