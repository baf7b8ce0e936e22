"""Where revision 3's sampler spends its time beyond torch.topk (a probe for a next revision).

    python benchmarks/gpu/tie_rank_probe.py [--out CSV]

`probs_from_logits` (top-k 20 then top-p over the survivors) ranks the tie group at the k-th
logit with a cumulative sum along the whole vocabulary. Per row that scan is serial when rows
are few. This times, at V 151936 and the sample probe's row counts (CUDA-graph replay, ms):
- `topk`: torch.topk(x, 20) alone, the floor of any top-k sampler;
- `cumsum`: torch.cumsum of the tie mask along V, as revision 3 ranks it;
- `blocked`: the same ranks from a two-level scan (cumsum within 1024-token blocks, then over
  the block totals), checked equal to `cumsum`;
- `probs_from_logits`: the whole of revision 3's step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from kernels import bench
from probe_common import write_rows

from vegas_sim.calibrate.sampling import probs_from_logits

T, TOP_P, TOP_K = 0.6, 0.95, 20
ROWS = (4, 32, 128, 832)  # vanilla B 4; γ 7 at B 4; γ 7 at B 16; γ 12 at B 64


def blocked_rank(tied: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """cumsum(tied, -1) as int32 from a two-level scan: [..., V] bool → [..., V] int32."""
    vocab = tied.shape[-1]
    t = F.pad(tied.to(torch.int32), (0, (-vocab) % block))
    inner = t.view(*t.shape[:-1], -1, block).cumsum(-1, dtype=torch.int32)  # [..., nb, block]
    totals = inner[..., -1]  # [..., nb]
    offset = totals.cumsum(-1, dtype=torch.int32) - totals  # exclusive prefix of the blocks
    return (inner + offset[..., None]).flatten(-2)[..., :vocab]


def probe_rows(gen: torch.Generator, rows: int, vocab: int) -> list[dict[str, Any]]:
    x = (4 * torch.randn(rows, vocab, generator=gen, device="cuda")).bfloat16().float() / T
    kth = torch.topk(x, TOP_K, dim=-1).values[:, -1:]
    tied = x == kth
    same = torch.equal(blocked_rank(tied), torch.cumsum(tied, -1, dtype=torch.int32))
    ops = {
        "topk": lambda: torch.topk(x, TOP_K, dim=-1),
        "cumsum": lambda: torch.cumsum(tied, -1, dtype=torch.int32),
        "blocked": lambda: blocked_rank(tied),
        "probs_from_logits": lambda: probs_from_logits(x, 1.0, TOP_P, TOP_K),
    }
    out, line = [], [f"rows={rows:4d}"]
    for name, fn in ops.items():
        ms = bench(fn)
        out.append({"rows": rows, "op": name, "ms": f"{ms:.4f}", "blocked_equal": same})
        line.append(f"{name} {ms:.3f}")
    print("  ".join(line) + f"  (blocked == cumsum: {same})", flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/tie_rank_probe.csv"))
    args = p.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(11)
    rows = [r for n in ROWS for r in probe_rows(gen, n, args.vocab)]
    write_rows(args.out, rows)
    print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
