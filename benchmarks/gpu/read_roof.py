"""Fourteenth session: what a plain contiguous read of N bytes reaches on this GPU, timed as
the kernel grid times its kernels (CUDA-graph replays, fastest of interleaved rounds, inputs
rotated past the L2). It prices two of #3's targets against the best a read of the same bytes
can do here, not against the 4 GiB copy alone:
- sparse draft: DESIGN's ms <= 1.3 x (bytes / copy) + launch, at the mid-size selections'
  bytes (20-27 MB), with this kernel's own launch (the same read of 2 KB);
- verify at B 1, C 32K (134 MB of KV): the ratio bytes / ms / copy.
A read kernel does no math and writes one float per program, so it is a floor for any kernel
that must read those bytes, not a kernel we would ship. Run 55 (results/read_roof_h200_run55.csv):
1.08-1.13 at the sparse sizes; at 134 MB only 0.63 of copy, slower than verify attention itself
(its loop of 16 tiles a program is not pipelined), so it is no roof for verify. The pipelined
stream of `write_mix_probe.py` (verify's grid and tiles, tensor-core products, no softmax) is:
0.978 of copy at 134 MB (run 85).

    python benchmarks/gpu/read_roof.py [--rounds 3] [--out FILE.csv] [--mb 1.3,20,27,134]
"""

from __future__ import annotations

import argparse
import math
import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernels import copy_bandwidth, min_of_rounds, n_copies, rotating, sparse_ratio
from probe_common import write_rows

# the sparse mid-size selections' bytes (kernels.kv_bytes(B, K + 4)): B 4 C 128K s 1 %,
# B 4 C 32K s 5 % / B 1 C 128K s 5 %, B 1 C 32K s 20 %; B 1 C 32K s 1 %; verify B 1 C 32K and
# C 128K
SIZES_MB = [21.5, 26.9, 26.9, 1.36, 134.2, 536.9]
SMS = 132
# (BLOCK elements, warps, programs per SM): the best per size is kept
LAUNCHES = [(4096, 4, 4), (8192, 8, 2), (8192, 8, 4), (16384, 8, 2), (4096, 4, 8)]


@triton.jit
def _read_kernel(X, OUT, N, TILES, BLOCK: tl.constexpr):
    """Program p sums X[p·TILES·BLOCK, (p+1)·TILES·BLOCK): one contiguous streaming read."""
    base = tl.program_id(0).to(tl.int64) * TILES * BLOCK
    acc = tl.zeros([BLOCK], tl.float32)
    for t in range(TILES):
        offs = base + t * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(X + offs, mask=offs < N, other=0.0).to(tl.float32)
    tl.store(OUT + tl.program_id(0), tl.sum(acc, 0))


def programs(n: int, block: int, per_sm: int) -> int:
    """Programs of one read of n elements: per_sm per SM, or fewer when n is short."""
    return max(1, min(per_sm * SMS, math.ceil(n / block)))


def read(x: torch.Tensor, out: torch.Tensor, block: int, warps: int, per_sm: int) -> None:
    n = x.numel()
    grid = programs(n, block, per_sm)
    _read_kernel[(grid,)](x, out, n, math.ceil(n / (grid * block)), BLOCK=block, num_warps=warps)


def read_ms(nbytes: float, rounds: int) -> tuple[float, str]:
    """The fastest launch's ms for a read of nbytes (bf16), and its label."""
    n = max(1, int(nbytes) // 2)
    bufs = [torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(n_copies(nbytes))]
    out = torch.empty(8 * SMS, device="cuda", dtype=torch.float32)
    want = float(bufs[0].float().sum())
    calls = {}
    for block, warps, per_sm in LAUNCHES:
        fns = [partial(read, b, out, block, warps, per_sm) for b in bufs]
        fns[0]()
        torch.cuda.synchronize()
        got = float(out[:programs(n, block, per_sm)].sum())
        if not math.isclose(got, want, rel_tol=1e-3, abs_tol=1e-2 * math.sqrt(n)):
            print(f"{nbytes / 1e6:.1f} MB n{block} w{warps} {per_sm}/SM: WRONG sum", flush=True)
            continue
        calls[f"n{block} w{warps} {per_sm}/SM"] = rotating(fns)
    best = min_of_rounds(calls, rounds)
    label = min(best, key=best.__getitem__)
    del bufs
    torch.cuda.empty_cache()
    return best[label], label


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("read_roof.csv"))
    p.add_argument("--mb", default="", help="sizes in MB, comma-separated (default: SIZES_MB)")
    args = p.parse_args()
    sizes = [float(s) for s in args.mb.split(",")] if args.mb else SIZES_MB
    copy_bw = copy_bandwidth()
    launch, _ = read_ms(2048, args.rounds)
    print(f"copy {copy_bw:.0f} GB/s, read of 2 KB (launch) {launch * 1e3:.2f} us", flush=True)
    rows: list[dict[str, Any]] = []
    for mb in dict.fromkeys(sizes):
        ms, label = read_ms(mb * 1e6, args.rounds)
        ratio = mb * 1e6 / ms / 1e6 / copy_bw
        over = sparse_ratio(ms, launch, mb * 1e6, copy_bw)
        rows.append({"mb": mb, "ms": f"{ms:.5f}", "launch_ms": f"{launch:.5f}",
                     "ratio_copy": f"{ratio:.3f}", "target_ratio": f"{over:.3f}",
                     "launch": label, "copy_gbps": f"{copy_bw:.0f}"})
        print(f"{mb:7.2f} MB {ms * 1e3:8.2f} us  bytes/ms/copy {ratio:.3f}  "
              f"(ms - launch) / (bytes / copy) {over:.2f}  [{label}]", flush=True)
    write_rows(args.out, rows)
    print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
