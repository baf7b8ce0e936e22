"""Why the selection step's Collect-2-Query overhead (run 12: +15.6 % at B 4, C 128K, NQ 8)
differs from the verify grid's at the same shape (+5.8 %): both timings, each way, in turn.

    python benchmarks/gpu/select_probe.py

"grid": kernels.verify_call (the grid's call: partial + rotating over one cache copy);
"select": the selection step's lambda. Also the C2Q call with the scores buffer allocated
once outside the graph, to price the per-call 67 MB allocation inside the captured graph.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernels import HQ, SCALE, bench, make_cache, verify_call


def main() -> int:
    from vegas_sim.kernels import verify_attention as va

    B, C, NQ = 4, 131072, 8
    gen = torch.Generator(device="cuda").manual_seed(3)
    k, v = make_cache(gen, B, C)
    lens = torch.full((B,), C, dtype=torch.int32, device="cuda")
    q = torch.randn(B, NQ, HQ, 128, generator=gen, device="cuda", dtype=torch.bfloat16)
    ways = {
        "grid none": verify_call([(k, v)], q, lens, "none", C),
        "grid c2q": verify_call([(k, v)], q, lens, "first_last", C),
        "select none": lambda: va.verify_attention(q, k, v, lens, SCALE, "none", max_len=C),
        "select c2q": lambda: va.verify_attention(q, k, v, lens, SCALE, "first_last",
                                                  max_len=C),
    }
    best = {name: float("inf") for name in ways}
    for rnd in range(3):
        for name in (ways if rnd % 2 == 0 else reversed(list(ways))):
            ms = bench(ways[name])
            best[name] = min(best[name], ms)
            print(f"round {rnd} {name:12s} {ms:.4f} ms", flush=True)
    for way in ("grid", "select"):
        print(f"{way}: none {best[way + ' none']:.4f} c2q {best[way + ' c2q']:.4f} "
              f"ovh {100 * (best[way + ' c2q'] / best[way + ' none'] - 1):.1f} %", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
