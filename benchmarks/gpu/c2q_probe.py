"""Collect-2-Query store candidates of the ninth session, against collect="none", timed as
the kernel grid times them (`kernels.min_of_rounds`: interleaved CUDA-graph rounds, the
fastest kept; caches rotated past the L2).

    python benchmarks/gpu/c2q_probe.py [--rounds 3] [--out FILE.csv]

Candidates (verify_attention knobs, see CANDIDATES): the default ("rows": the collected rows
of the main score tile) and the separate dot. One CSV row per (shape, candidate).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_common import Candidate, add_arguments, parse_shapes, run_probe

SHAPES = [(1, 32768, 1), (1, 32768, 8), (4, 32768, 8), (4, 131072, 1), (4, 131072, 8),
          (16, 32768, 8), (16, 32768, 16), (16, 131072, 8)]
CANDIDATES: list[Candidate] = [
    ("none", "none", {}),
    ("rows (default)", "first_last", {}),
    ("dot m64", "first_last", {"c2q": "dot", "min_m": 64}),
]
# Dropped candidates, with the launcher knobs that ran them kept as patches under
# results/h200/ (apply one to measure again):
# - runs 17-18 (c2q_probe_h200_run17.csv, c2q_probe_cs_h200_run18.csv; patch
#   c2q_tdot_hints_run17.patch): "tdot" (min_m 16 / 64, n64 st4) lost at every shape (+7 to
#   +45 %); score stores with cache_modifier ".cs" and K/V loads with eviction_policy
#   "evict_first" changed nothing beyond the noise (run 18, 5 rounds).
# - run 20 (c2q_probe_asm_h200_run20.csv, c2q_probe_sink_h200_run20c.csv; patch
#   c2q_asm_store_sink_run20.patch): score_store "asm" (one st.global.b16 per element from the
#   MMA registers) matched the default within 0.6 points except at C 128K NQ 8 (B 4: +14.4
#   vs +9.2 %, B 16: +6.7 vs +4.4 %); "asm2" (pairs) lost 0.3-17 points; "rows sink" (the stores into small windows
#   that stay in the L2) cut NQ 1 from +8.9 to +6.2 % (B 4 C 128K) but was 10-15 points
#   *slower* at NQ 8 / 16, so it does not isolate the DRAM cost of the writes.


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p, "c2q_probe.csv")
    args = p.parse_args()
    return run_probe(args, parse_shapes(args.shapes, SHAPES), lambda B, NQ: CANDIDATES)


if __name__ == "__main__":
    sys.exit(main())
