"""radix_topk against torch.topk(sorted=False) at the production selection shape.

weights [36, 4, 131200] fp32 built like score_weights' output (softmax-like, floored at the
smallest normal, the last ~1 % of each row exactly 0), k = 9175 (7 %). Checks radix_topk by
values on every row, then times both (median of CUDA-graph replays) per (block, num_warps,
split) setting and prints ms and the ratio to torch.topk. Run on a GPU:
    python benchmarks/gpu/topk_probe.py
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

L, B, S, K = 36, 4, 131200, 9175
SETTINGS = [  # (block, num_warps, split) of the full-row pass; None: the launcher's default
    (None, None, None), (2048, 4, None), (4096, 4, None), (1024, 4, 8), (1024, 8, None),
    (2048, 8, None), (512, 4, None), (1024, 2, None), (4096, 8, None),
]


def kernel_times(fn: Callable[[], object], reps: int = 20) -> None:
    """Per-kernel mean µs of `fn` (torch.profiler, eager launches)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    for ev in prof.key_averages():
        if ev.device_type.name == "CUDA" and ev.count:
            total = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
            print(f"  {ev.key[:40]:40s} {total / ev.count:8.1f} us x {ev.count // reps}",
                  flush=True)


def bench(fn: Callable[[], object]) -> float:
    import triton.testing

    try:
        return float(triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median"))
    except Exception:  # noqa: BLE001 (no graph capture here: time eager launches)
        return float(triton.testing.do_bench(fn, rep=20, return_mode="median"))


def production_weights() -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(0)
    scores = torch.randn(L, B, S, device="cuda", generator=gen) * 2.5
    w = torch.softmax(scores, -1).clamp_min(torch.finfo(torch.float32).tiny)
    rank = S - S // 100 - torch.arange(B, device="cuda") * 7  # [B] rank_len, ~1 % zeros
    return w * (torch.arange(S, device="cuda") < rank[:, None])


def check(idx: torch.Tensor, w: torch.Tensor) -> None:
    got = w.gather(-1, idx.long()).sort(-1).values
    best = torch.topk(w, K, dim=-1).values.sort(-1).values
    unique = idx.long().sort(-1).values.diff(dim=-1).ne(0).all()
    assert bool(unique) and torch.equal(got, best), "radix_topk picked other values"


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("topk_probe.py needs a CUDA GPU")
    from vegas_sim.kernels.topk import radix_topk

    w = production_weights()
    ref_ms = bench(lambda: torch.topk(w, K, dim=-1, sorted=False))
    print(f"{torch.cuda.get_device_name()}: weights {list(w.shape)} k {K}; "
          f"torch.topk(sorted=False) {ref_ms:.4f} ms")
    kernel_times(lambda: radix_topk(w, K))
    for refine_block in (256, 1024, 2048):
        kw = {"refine_block": refine_block}
        check(radix_topk(w, K, **kw), w)
        ms = bench(lambda kw=kw: radix_topk(w, K, **kw))
        print(f"refine_block {refine_block:5d}  {ms:.4f} ms", flush=True)
    for block, warps, split in SETTINGS:
        kw = {"block": block, "num_warps": warps, "split": split}
        check(radix_topk(w, K, **kw), w)
        ms = bench(lambda kw=kw: radix_topk(w, K, **kw))
        print(f"block {block or 'auto':>5} warps {warps or 'auto':>4} split {split or 'auto':>4}"
              f"  {ms:.4f} ms  {ms / ref_ms:.3f}x torch.topk", flush=True)


if __name__ == "__main__":
    main()
