"""Tenth session: verify attention launches against the defaults, timed as the kernel grid
times them (`kernels.min_of_rounds`: interleaved CUDA-graph rounds, fastest kept; caches
rotated past the L2).

    python benchmarks/gpu/tma_probe.py [--rounds 3] [--out FILE.csv] [--shapes B:C:NQ,...]

Candidates (`candidates`): a label, the collect mode and `verify_attention` knobs. Run 22
(results/tma_probe_h200_run22.csv) also timed two module switches that are gone since: the
old combine, whose partial loads waited on the lse load (+0.0 to +1.9 %: the combine now
loads both at once), and bf16 split partials (-0.8 to -2.6 % at B 1, C 32K; +1.1 and +4.8 %
at B 4 NQ 8: not taken). The defaults in runs 22-24 were the code before `wide_config`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_common import HKV, Candidate, add_arguments, parse_shapes, run_probe

from vegas_sim.kernels.verify_attention import splits_per_sm

SHAPES = [(B, C, NQ) for C in (32768, 131072) for B in (1, 4, 16) for NQ in (1, 8, 16)]
N_SMS = 132  # the H200 of runs 22-30


def per_sm_splits(B: int, per_sm: int) -> int:
    """Splits that give ~per_sm programs on every SM (B·HKV programs per split)."""
    return splits_per_sm(B * HKV, N_SMS, per_sm)


def candidates(B: int, NQ: int) -> list[Candidate]:
    """(label, collect, verify_attention knobs) for one shape.

    Run 22 (results/tma_probe_h200_run22.csv): TMA K/V loads, the eager combine, bf16 split
    partials. Run 22b (ncu, B 16 C 32K NQ 16): the Collect-2-Query kernel at one program per
    SM (152 KB of shared memory) issue-bound, where collect=none ran two per SM. Run 23
    (tma_probe_h200_run23.csv): launches sized for two or three programs per SM; 64-key
    tiles at 2 stages and M 16 tiles lost everywhere, 32-key tiles with TMA at 4 stages won at
    B 4 C 128K and B 16. This set (run 24): that launch's neighbours, at every grid shape."""
    s2 = per_sm_splits(B, 2)
    n32 = {"min_m": 64, "block_n": 32, "tma": True}
    out: list[Candidate] = [
        ("none", "none", {}),
        ("none tma", "none", {"tma": True}),
        ("none n32 2/SM tma", "none", {**n32, "num_stages": 4, "splits": s2}),
        ("c2q", "first_last", {}),
        ("c2q n32 2/SM tma", "first_last", {**n32, "num_stages": 4, "splits": s2}),
        ("c2q n32 2/SM tma st3", "first_last", {**n32, "num_stages": 3, "splits": s2}),
        ("c2q n32 2/SM tma st5", "first_last", {**n32, "num_stages": 5, "splits": s2}),
        ("c2q n32 2/SM ptr", "first_last", {**n32, "num_stages": 4, "splits": s2,
                                            "tma": False}),
    ]
    return out


def candidates_run26(B: int, NQ: int) -> list[Candidate]:
    """Run 26: Collect-2-Query stores and grids on `wide_config` (the default since run 25),
    at the long shapes where the plain verify now runs at 1.06-1.10 of copy."""
    n32 = {"min_m": 64, "block_n": 32, "tma": True}
    s2, s3, s4 = (per_sm_splits(B, k) for k in (2, 3, 4))
    return [
        ("none", "none", {}),
        ("c2q", "first_last", {}),
        ("c2q 3/SM st3", "first_last", {**n32, "num_stages": 3, "splits": s3}),
        ("c2q 4/SM", "first_last", {**n32, "num_stages": 4, "splits": s4}),
        ("c2q dot", "first_last", {**n32, "num_stages": 4, "splits": s2, "c2q": "dot"}),
        ("c2q slice", "first_last", {**n32, "num_stages": 4, "splits": s2, "c2q": "slice"}),
        ("c2q m32 n64 st3", "first_last", {"min_m": 16, "block_n": 64, "num_stages": 3,
                                           "splits": s2, "tma": True}),
    ]


def candidates_run27(B: int, NQ: int) -> list[Candidate]:
    """Run 27, a diagnostic: the same score bytes written as one contiguous stream per program
    (a wrong layout), against the real [B, R, Hq, S] rows. The `diag_blocked` knob is in
    results/h200/blocked_diag_run27.patch (apply it to run this set): it gained 0.3-1.6
    points, so the scattered score rows are not what costs (tma_probe_diag_h200_run27.csv)."""
    return [("none", "none", {}), ("c2q", "first_last", {}),
            ("c2q blocked DIAG", "first_last", {"diag_blocked": True}),
            ("c2q rows-ptr blocked DIAG", "first_last", {"diag_blocked": True, "tma": False})]


def candidates_run29(B: int, NQ: int) -> list[Candidate]:
    """Run 29: the collected rows as one [1, R, G, BLOCK_N] TMA store per tile (c2q="tma";
    ncu of run 28b counted 24 % more instructions for the pointer store at B 4 C 128K NQ 16,
    same launch). The knob is in results/h200/tma_score_store_run29.patch (apply it to run
    this set): within 0.6 points on the wide launch, +5 to +50 points elsewhere
    (tma_probe_store_h200_run29.csv), so it was dropped."""
    return [("none", "none", {}), ("c2q", "first_last", {}),
            ("c2q tma-store", "first_last", {"c2q": "tma"})]


def candidates_run30(B: int, NQ: int) -> list[Candidate]:
    """Run 30, a diagnostic: the Collect-2-Query kernel with R = 0 passed at run time, so every
    score store is masked off (same instructions, no score bytes written; wrong scores). The
    `diag_no_store` knob is in results/h200/no_store_diag_run30.patch (apply it to run this
    set). The overhead fell from +8.9 to +13.5 % to +0.0 to +2.0 %
    (tma_probe_nostore_h200_run30.csv): the cost is the score bytes reaching memory."""
    return [("none", "none", {}), ("c2q", "first_last", {}),
            ("c2q no-store DIAG", "first_last", {"diag_no_store": True})]


SETS = {"run30": candidates_run30, "run24": candidates, "run26": candidates_run26, "run27": candidates_run27,
        "run29": candidates_run29}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p, "tma_probe.csv")
    p.add_argument("--set", default="run26", choices=sorted(SETS), help="candidate set")
    args = p.parse_args()
    return run_probe(args, parse_shapes(args.shapes, SHAPES), SETS[args.set], "vs_none_pct")


if __name__ == "__main__":
    sys.exit(main())
