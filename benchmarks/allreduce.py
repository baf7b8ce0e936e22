"""All-reduce and all-gather measured at TP N, beside the datasheet model `sim.parallel` assumes.

`predict --tp N` on a set measured on one GPU prices each collective as
α + k (N − 1) / N · bytes / link (k = 2 for an all-reduce, 1 for a gather), with `link` the
GPU's datasheet NVLink per direction (`gpus.GpuSpec.link_gbs`) and α an assumed per-call cost
(`allreduce_latency_us`). This measures both on the group: N ranks (NCCL, one GPU each; gloo
on the CPU for a smoke run), every message size timed `--iters` times after a warm-up, each
call's time the slowest rank's (a collective ends when its last rank does), eagerly and, on
CUDA, replayed from a CUDA graph of `--graph-calls` back-to-back calls (as calibrate's graphed
forward issues them). A size is the all-reduce's payload, or the gather's whole output (the
logits of all ranks), as `sim.parallel` counts them. Per size it prints the median time per call, the bus bandwidth
(nccl-tests' convention: bytes / t · k (N − 1) / N, comparable with the link's per-direction
figure) and the modelled time with their ratio; then the per-call latency α (the smallest
message's time) and the bus bandwidth at the largest message beside the model's. The sizes
include one forward's all-reduce for Qwen3-8B (rows · 4096 · 2 bytes) at 1..256 rows.

    PYTHONPATH=. python benchmarks/allreduce.py --tp 2 --tp 4 --tp 8 [--gpu h200] [--out F]
    PYTHONPATH=. python benchmarks/allreduce.py --tp 2 --device cpu --sizes 4K,64K --iters 5

Writes one CSV row per (tp, op, mode, size) with --out.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist

from vegas_sim.calibrate import tp_run
from vegas_sim.gpus import GpuSpec, datasheet_for_device, get_gpu
from vegas_sim.grids import parse_int_grid
from vegas_sim.sim.parallel import TensorParallel

QWEN3_8B_ROW_BYTES = 4096 * 2  # one row of the residual stream in bf16
DEFAULT_SIZES = sorted({*(r * QWEN3_8B_ROW_BYTES for r in (1, 4, 16, 64, 256)),
                        *(4 ** i * 1024 for i in range(0, 10))})  # 1 KiB .. 256 MiB


def _time_ms(fn: Any, device: torch.device, iters: int) -> list[float]:
    """Per call: this rank's ms (CUDA events, or perf_counter around a barrier-free call)."""
    out = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(float(start.elapsed_time(end)))
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def _slowest(samples: list[float], device: torch.device) -> list[float]:
    """Each call's time over the ranks' maximum."""
    t = torch.tensor(samples, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.cpu().tolist()


def _graphed(op: Any, calls: int) -> Any:
    """A CUDA graph of `calls` back-to-back `op`s (a replay per timed call, divided)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        op()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            op()
    return graph.replay


def measure(group: tp_run.RankGroup, device_kind: str, sizes: list[int], iters: int,
            graph_calls: int) -> list[dict[str, Any]]:
    """Every rank runs this; rank 0's return value is the table."""
    device = group.device(device_kind)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows: list[dict[str, Any]] = []
    modes = ["eager"] + (["graph"] if device.type == "cuda" and graph_calls > 0 else [])
    elsize = torch.tensor([], dtype=dtype).element_size()
    for nbytes in sizes:
        numel = max(group.size, nbytes // elsize)
        x = torch.ones(numel, dtype=dtype, device=device)  # the all-reduce's payload
        part = torch.ones(numel // group.size, dtype=dtype, device=device)  # one gather part
        parts = [torch.empty_like(part) for _ in range(group.size)]
        ops = {"all_reduce": lambda: dist.all_reduce(x),
               "all_gather": lambda: dist.all_gather(parts, part)}
        for op_name, op in ops.items():
            for mode in modes:
                fn, per = (op, 1) if mode == "eager" else (_graphed(op, graph_calls), graph_calls)
                _time_ms(fn, device, 3)  # warm-up (NCCL channels, graph upload)
                dist.barrier()
                ms = [t / per for t in _slowest(_time_ms(fn, device, iters), device)]
                total = x.numel() if op_name == "all_reduce" else part.numel() * group.size
                rows.append({"tp": group.size, "op": op_name, "mode": mode,
                             "bytes": total * elsize, "ms": statistics.median(ms),
                             "ms_p90": sorted(ms)[int(0.9 * (len(ms) - 1))]})
        del x, part, parts
    return rows


def with_model(rows: pd.DataFrame, link: TensorParallel) -> pd.DataFrame:
    """Bus bandwidth and the datasheet model's time beside each measured row."""
    n = rows["tp"]
    k = rows["op"].map({"all_reduce": 2.0, "all_gather": 1.0})
    frac = k * (n - 1) / n
    rows = rows.assign(bus_gbs=rows["bytes"] / (rows["ms"] * 1e-3) * frac / 1e9)
    model = link.allreduce_latency_us * 1e-3 + frac * rows["bytes"] / (link.link_gbs * 1e9) * 1e3
    return rows.assign(model_ms=model, measured_over_model=rows["ms"] / model)


def _summary(df: pd.DataFrame, link: TensorParallel) -> str:
    lines = []
    for (tp, op, mode), g in df.groupby(["tp", "op", "mode"], sort=True):
        small, big = g.loc[g["bytes"].idxmin()], g.loc[g["bytes"].idxmax()]
        lines.append(f"TP {tp} {op} ({mode}): per-call latency {small['ms'] * 1e3:.1f} µs at "
                     f"{int(small['bytes'])} B (model α {link.allreduce_latency_us:g} µs); bus "
                     f"bandwidth {big['bus_gbs']:.0f} GB/s at {big['bytes'] / 2**20:.0f} MiB "
                     f"(model link {link.link_gbs:g} GB/s per direction)")
    return "\n".join(lines)


def _datasheet(name: str | None, device: str) -> GpuSpec:
    """The datasheet entry compared with: --gpu, else the GPU's own (a CPU smoke run: h200's)."""
    if name is not None:
        return get_gpu(name)
    if device == "cuda":
        found = datasheet_for_device(torch.cuda.get_device_name(0))
        if found is None:
            raise SystemExit(f"no datasheet for {torch.cuda.get_device_name(0)}: pass --gpu")
        return found
    return get_gpu("h200")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, action="append", help="group size (repeatable)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--sizes", default=None, help="message sizes in bytes, e.g. 4K,1M,64M")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--graph-calls", type=int, default=16,
                    help="calls per CUDA graph in the graphed mode (0: eager only)")
    ap.add_argument("--gpu", default=None, help="datasheet entry to compare with (default: "
                    "the GPU's own, by name)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    sizes = DEFAULT_SIZES if args.sizes is None else parse_int_grid(args.sizes, "--sizes")
    spec = _datasheet(args.gpu, args.device)
    tables = []
    for tp in args.tp or [2]:
        link = TensorParallel(tp, spec.link_gbs, spec.allreduce_latency_us)
        rows = tp_run.run_ranks(tp, args.device, measure,
                                (args.device, sizes, args.iters, args.graph_calls))
        tables.append(with_model(pd.DataFrame(rows), link))
    df = pd.concat(tables, ignore_index=True)
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu (gloo)"
    print(f"{device}; model: {spec.name} datasheet, link {spec.link_gbs:g} GB/s per direction, "
          f"α {spec.allreduce_latency_us:g} µs (sim.parallel)")
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(df.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(_summary(df, TensorParallel(2, spec.link_gbs, spec.allreduce_latency_us)))
    if args.out is not None:
        df.to_csv(args.out, index=False)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
