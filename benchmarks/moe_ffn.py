"""MoE FFN benchmark on the GPU: the Triton expert GEMM against the torch reference
(torch._grouped_mm), one layer of gpt-oss-20b and of Qwen3-30B-A3B, bf16.

    python benchmarks/moe_ffn.py --out benchmarks/results/moe_ffn_h200.csv [--sweep]

For T tokens (decode B = T, or verify B·(γ+1) = T) routed by a near-uniform random router
(as the calibration's random weights), each row is the median ms of the whole FFN
(calibrate/moe.moe_ffn: route, both expert GEMMs, activation, combine) replayed from a CUDA
graph, the bytes of the expert weights it touched (experts with ≥ 1 routed token) over that
time, the ratio to the copy bandwidth measured in the same run, and triton / reference.
--sweep adds each expert GEMM alone (gate/up with its fused activation, down) under every
launch config of a small grid at gpt-oss-20b's shape and prints the best per (T, projection).
--window times gpt-oss-20b's sliding-window attention per layer, the kernel against the torch
gather (B 1–128, NQ 1 / 8). Nothing runs at import.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels import bench, copy_bandwidth, n_copies, rotating

from vegas_sim.calibrate import moe
from vegas_sim.kernels import moe as kmoe
from vegas_sim.kernels import moe_gemm, ops
from vegas_sim.models import get_preset

MODELS = ("gpt-oss-20b", "qwen3-30b-a3b")
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
FIELDS = ["kind", "model", "tokens", "backend", "config", "ms", "experts_touched", "gbps",
          "ratio_copy", "triton_over_reference"]


def layer_weights(name: str, gen: torch.Generator) -> dict[str, Any]:
    """One layer's router and experts, random bf16 (router std small: near-uniform routing)."""
    s = get_preset(name)
    E, H, F = s.n_experts, s.hidden, s.expert_ffn
    bias = s.moe_bias

    def rnd(*shape: int, std: float = 0.02) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std).to("cuda", torch.bfloat16)
    return {"router": rnd(E, H, std=1e-3), "router_bias": rnd(E) if bias else None,
            "w13": rnd(E, 2 * F, H), "b13": rnd(E, 2 * F) if bias else None,
            "w2": rnd(E, H, F), "b2": rnd(E, H) if bias else None,
            "k": s.experts_per_token, "activation": s.moe_activation}


def ffn_call(w: dict[str, Any], h: torch.Tensor) -> Any:
    return lambda: moe.moe_ffn(h, w["router"], w["router_bias"], w["w13"], w["b13"], w["w2"],
                               w["b2"], w["k"], w["activation"])


def touched(w: dict[str, Any], h: torch.Tensor) -> int:
    _, experts = moe.route(h, w["router"], w["router_bias"], w["k"])
    return int(torch.unique(experts).numel())


def bench_ffn(name: str, copy_bw: float, gen: torch.Generator, out: list[dict[str, Any]]
              ) -> None:
    # weight copies rotated so a call's experts have left the L2 when they come back
    s = get_preset(name)
    one_expert = 3 * s.expert_ffn * s.hidden * 2.0  # bf16 gate, up and down of one expert
    copies = [layer_weights(name, gen) for _ in range(n_copies(one_expert * s.experts_per_token))]
    H = s.hidden
    for T in TOKENS:
        hs = [torch.randn(T, H, generator=gen).to("cuda", torch.bfloat16) for _ in copies]
        n_touched = touched(copies[0], hs[0])
        nbytes = n_touched * one_expert
        ms = {}
        for backend in ("triton", "reference"):
            fn = rotating([ffn_call(w, h) for w, h in zip(copies, hs, strict=True)])
            os.environ[ops.ENV] = backend
            try:
                fn()
                ms[backend] = bench(fn)
            finally:
                os.environ.pop(ops.ENV, None)
        for backend, t in ms.items():
            gbps = nbytes / t / 1e6
            out.append({"kind": "ffn", "model": name, "tokens": T, "backend": backend,
                        "config": "", "ms": round(t, 4), "experts_touched": n_touched,
                        "gbps": round(gbps, 1), "ratio_copy": round(gbps / copy_bw, 3),
                        "triton_over_reference": round(ms["triton"] / ms["reference"], 3)})
            print_row(out[-1])


SWEEP = [*itertools.product((16,), (32, 64, 128), (64, 128), (4,), (3, 4, 5)),
         *itertools.product((64,), (64, 128), (64,), (4, 8), (3, 4)),
         (128, 128, 64, 8, 3)]


def bench_sweep(name: str, copy_bw: float, gen: torch.Generator, out: list[dict[str, Any]]
                ) -> None:
    """Each projection's GEMM alone under every (block_m, BLOCK_N, BLOCK_K, warps, stages)."""
    w = layer_weights(name, gen)
    H = get_preset(name).hidden
    for T in (1, 16, 128, 1024):
        h = torch.randn(T, H, generator=gen).to("cuda", torch.bfloat16)
        _, experts = moe.route(h, w["router"], w["router_bias"], w["k"])
        nbytes = {"w13": 0.0, "w2": 0.0}
        n_touched = int(torch.unique(experts).numel())
        for proj in nbytes:
            nbytes[proj] = n_touched * w[proj][0].numel() * 2.0
        best: dict[str, tuple[float, str]] = {}
        for bm, bn, bk, warps, stages in SWEEP:
            routing = kmoe.moe_routing(experts, w["w13"].shape[0], block_m=bm)
            act = torch.randn(T * w["k"], w["w2"].shape[2], generator=gen).to(
                "cuda", torch.bfloat16)
            for proj, x, gather, activation in (("w13", h, True, w["activation"]),
                                                ("w2", act, False, None)):
                label = f"{proj} m{bm} n{bn} k{bk} w{warps} s{stages}"
                call = partial(moe_gemm.moe_gemm, x, w[proj], None, routing, gather,
                               activation, None, (bn, bk, warps, stages))
                try:
                    t = bench(call)
                except (triton.runtime.errors.OutOfResources, RuntimeError) as e:
                    print(f"  {name} T{T} {label}: {type(e).__name__}")  # does not fit: skip
                    continue
                gbps = nbytes[proj] / t / 1e6
                out.append({"kind": "sweep", "model": name, "tokens": T, "backend": "triton",
                            "config": label, "ms": round(t, 4), "experts_touched": n_touched,
                            "gbps": round(gbps, 1), "ratio_copy": round(gbps / copy_bw, 3),
                            "triton_over_reference": ""})
                if proj not in best or t < best[proj][0]:
                    best[proj] = (t, f"{label}: {t:.4f} ms, {gbps / copy_bw:.2f} of copy")
        for proj, (_, text) in best.items():
            print(f"best {name} T{T} {text}")


def bench_window(copy_bw: float, gen: torch.Generator, out: list[dict[str, Any]]) -> None:
    """gpt-oss-20b's sliding-window attention per layer (calibrate/moe.window_attention): the
    verify kernel with its window mask against the torch gather, same inputs, one run; the
    phase that decode and drafting share on its 12 window layers."""
    s = get_preset("gpt-oss-20b")
    hq, hkv, d, window = s.n_heads, s.n_kv_heads, s.head_dim, s.sliding_window
    for B in (1, 8, 32, 128):
        for nq in (1, 8):
            k = torch.randn(B, 4096, hkv, d, generator=gen).to("cuda", torch.bfloat16)
            v = torch.randn_like(k)
            q = torch.randn(B, nq, hq, d, generator=gen).to("cuda", torch.bfloat16)
            lens = torch.full((B,), 4096, dtype=torch.int32, device="cuda")
            sinks = torch.zeros(hq, device="cuda")
            args = (q, k, v, lens, d ** -0.5, window, sinks)
            t_kernel = bench(partial(moe.window_attention, *args))
            t_torch = bench(partial(moe.gathered_window_attention, *args))
            nbytes = 2.0 * B * (window + nq - 1) * hkv * d * 2
            for backend, t in (("triton", t_kernel), ("torch", t_torch)):
                out.append({"kind": "window", "model": "gpt-oss-20b", "tokens": B * nq,
                            "backend": backend, "config": f"B{B} NQ{nq}", "ms": round(t, 4),
                            "experts_touched": "", "gbps": round(nbytes / t / 1e6, 1),
                            "ratio_copy": round(nbytes / t / 1e6 / copy_bw, 3),
                            "triton_over_reference": round(t_kernel / t_torch, 3)})
            print(f"window gpt-oss-20b B{B} NQ{nq}: kernel {t_kernel:.4f} ms, torch "
                  f"{t_torch:.4f} ms per layer (kernel/torch {t_kernel / t_torch:.2f}); "
                  f"{12 * t_kernel:.2f} vs {12 * t_torch:.2f} ms over the 12 window layers")


def print_row(r: dict[str, Any]) -> None:
    print(f"{r['kind']:5} {r['model']:14} T{r['tokens']:<5} {r['backend']:9} "
          f"{r['ms']:8.4f} ms  {r['experts_touched']:3} experts  {r['gbps']:7.1f} GB/s "
          f"({r['ratio_copy']:.2f} of copy)  triton/reference {r['triton_over_reference']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--window", action="store_true",
                   help="also time gpt-oss-20b's sliding-window attention per layer (kernel, torch)")
    args = p.parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth {copy_bw:.0f} GB/s")
    out: list[dict[str, Any]] = [{"kind": "copy", "gbps": round(copy_bw, 1)}]
    try:
        for name in args.models.split(","):
            bench_ffn(name, copy_bw, gen, out)
            if args.sweep and name == MODELS[0]:
                bench_sweep(name, copy_bw, gen, out)
        if args.window:
            bench_window(copy_bw, gen, out)
    finally:
        with args.out.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
