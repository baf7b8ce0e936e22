"""One verify call per variant between cudaProfilerStart/Stop, for Nsight Compute:

    ncu --profile-from-start off --set full -k regex:_verify_attention_kernel \\
        python benchmarks/gpu/ncu_verify.py [--shape B:C:NQ]

Variants (VARIANTS): collect none and Collect-2-Query, with pointer and TMA K/V loads, in
that order (ncu numbers the kernels 0..3). Every variant runs once before the profiled
range, so compilation and autotuning stay outside it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernels import SCALE, verify_inputs

from vegas_sim.kernels import verify_attention as va

VARIANTS = [("none", {}), ("none", {"tma": True}), ("first_last", {}),
            ("first_last", {"tma": True})]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="16:32768:16", help="B:C:NQ")
    args = p.parse_args()
    B, C, NQ = (int(x) for x in args.shape.split(":"))
    gen = torch.Generator(device="cuda").manual_seed(7)
    caches, lens, q = verify_inputs(gen, B, C, NQ)
    k, v = caches[0]
    calls = [lambda c=c, kw=kw: va.verify_attention(q, k, v, lens, SCALE, c, max_len=C, **kw)
             for c, kw in VARIANTS]
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("variants:", [f"{c} {kw}" for c, kw in VARIANTS])
    return 0


if __name__ == "__main__":
    sys.exit(main())
