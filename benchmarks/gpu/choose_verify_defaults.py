"""Pick the verify kernel's two implementation defaults on this GPU, before calibrating.

    python benchmarks/gpu/choose_verify_defaults.py --env /root/verify.env

Times vegas_sim.kernels.verify_attention at shapes the calibration grid uses (Qwen3-8B
attention: Hq 32, Hkv 8, D 128), collect none and first_last, for M-tile minimum 16 / 64 and
Collect-2-Query as rows of the main tile / a separate dot; prints every time and writes the
pick (smallest geometric mean of none + first_last time over the shapes) as
`export VEGAS_SIM_VERIFY_MIN_M=.. VEGAS_SIM_C2Q_DOT=..` lines for the later calibration.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernels import bench, verify_call, verify_inputs

SHAPES = [(1, 8192, 1), (1, 32768, 8), (4, 32768, 1), (4, 32768, 8), (4, 131072, 8),
          (16, 32768, 16), (64, 8192, 4), (1, 131072, 16)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", type=Path, required=True)
    args = p.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    log_cost: dict[tuple[int, bool], float] = {}
    for B, C, NQ in SHAPES:
        caches, lens, q = verify_inputs(gen, B, C, NQ)
        none = {m: bench(verify_call(caches, q, lens, "none", C, min_m=m)) for m in (16, 64)}
        for m, dot in itertools.product((16, 64), (False, True)):
            fl = bench(verify_call(caches, q, lens, "first_last", C, min_m=m, c2q_dot=dot))
            log_cost[(m, dot)] = log_cost.get((m, dot), 0.0) + math.log(none[m] + fl)
            print(f"B={B:3d} C={C:6d} NQ={NQ:2d} min_m={m:2d} c2q_dot={dot!s:5s} "
                  f"none={none[m]:.4f} ms first_last={fl:.4f} ms "
                  f"(+{100 * (fl / none[m] - 1):.1f} %)", flush=True)
        del caches
        torch.cuda.empty_cache()
    m, dot = min(log_cost, key=log_cost.__getitem__)
    for key, cost in sorted(log_cost.items()):
        print(f"min_m={key[0]:2d} c2q_dot={key[1]!s:5s} geo-mean ms "
              f"{math.exp(cost / len(SHAPES)):.4f}")
    args.env.write_text(f"export VEGAS_SIM_VERIFY_MIN_M={m} VEGAS_SIM_C2Q_DOT={int(dot)}\n")
    print(f"chosen: min_m={m} c2q_dot={dot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
