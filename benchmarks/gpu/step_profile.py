"""Where a decode step's time goes in the calibration runtime: the CUDA-graph replay time of one
vanilla decode step (Qwen3-8B random weights, B 4, C 32K by default) beside the kernels one
eager step launches (torch.profiler): their count, their summed time, and the largest by name.
The difference between the replay time and the summed kernel time is what the GPU spends
between kernels. Eleventh session, run 37 (torch glue); twelfth session: both glues in one run,
the fused Triton glue (kernels/layer_ops.py, the runtime's default on CUDA) and the torch code
it replaced (kernels/reference.py), and their ratio.

    python benchmarks/gpu/step_profile.py [--model qwen3-8b] [--batch 4] [--context 32768]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from vegas_sim.calibrate.runtime import GraphedForward, KVCache, Transformer, load_model
from vegas_sim.kernels import ops, reference

GLUE_OPS = ("add_rms_norm", "silu_mul", "qkv_rope_append")
FUSED = {name: getattr(ops, name) for name in GLUE_OPS}  # ops' dispatchers, saved at import


def use_glue(glue: str) -> None:
    """Route the runtime's glue ops ("fused" or "torch") by rebinding them in `ops`."""
    for name in GLUE_OPS:
        setattr(ops, name, getattr(reference, name) if glue == "torch" else FUSED[name])


def graphed_step_ms(model: Transformer, cache: KVCache, batch: int, reps: int = 20) -> float:
    """Median ms of a graphed decode step (each replay appends one token; lens restored)."""
    saved = cache.lens.clone()
    step = GraphedForward(model, cache, None, batch, 1, last_only=True)
    tokens = torch.zeros(batch, 1, dtype=torch.long, device=model.device)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(tokens)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
        cache.lens.copy_(saved)
    return sorted(times)[len(times) // 2]


def kernel_table(model: Transformer, cache: KVCache, batch: int, top: int) -> None:
    """Kernels of one eager step: count, summed device time, the `top` names by time."""
    tokens = torch.zeros(batch, 1, dtype=torch.long, device=model.device)
    saved = cache.lens.clone()
    model.forward(tokens, cache, None, True)  # warm: compiles, cuBLAS handles
    cache.lens.copy_(saved)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model.forward(tokens, cache, None, True)
        torch.cuda.synchronize()
    cache.lens.copy_(saved)
    by_name: dict[str, list[float]] = defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by_name[e.name].append(e.time_range.elapsed_us() / 1e3)  # us -> ms
    n = sum(len(v) for v in by_name.values())
    total = sum(sum(v) for v in by_name.values())
    print(f"one eager step: {n} kernels, {total:.3f} ms of kernel time "
          f"({n / model.spec.n_layers:.1f} kernels per layer)", flush=True)
    rows = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    for name, ms in rows:
        print(f"  {sum(ms):8.3f} ms  {len(ms):5d} x  {sum(ms) / len(ms) * 1e3:8.1f} us  "
              f"{name[:90]}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="qwen3-8b")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    model, _, _ = load_model(args.model, weights="random", device="cuda")
    cache = model.new_cache(args.batch, args.context + 64)
    lens = torch.full((args.batch,), args.context, dtype=torch.int32, device="cuda")
    cache.fill_random(lens, torch.Generator(device="cuda").manual_seed(0))
    ms = {}
    for glue in ("torch", "fused"):
        use_glue(glue)
        ms[glue] = graphed_step_ms(model, cache, args.batch)
        print(f"{args.model} B {args.batch} C {args.context}, {glue} glue: graphed decode step "
              f"{ms[glue]:.3f} ms", flush=True)
    print(f"fused / torch glue: {ms['fused'] / ms['torch']:.3f}", flush=True)
    for glue in ("torch", "fused"):
        use_glue(glue)
        print(f"{glue} glue:", flush=True)
        kernel_table(model, cache, args.batch, args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
