"""What Collect-2-Query's score bytes cost a read stream that does nothing else.

    python benchmarks/gpu/write_mix_probe.py [--shapes 1:32768,4:131072] [--rounds 5] [--out CSV]
    python benchmarks/gpu/write_mix_probe.py --readers 1:32768,1:131072 --out CSV

Runs 20-30 (KERNELS_NOTES.md) traced the Collect-2-Query overhead to the score bytes: with
the stores masked off at run time, the same kernel is within 0-2 % of collect=none. That the
bytes cost 3x their share when they go out among a saturated read stream was an inference.
This probe measures it without verify attention's softmax, register pressure or layouts:
`_stream_kernel` reads K and V exactly as verify attention does (one program per request, KV
head and split, the same splits and 128-key tiles, tensor-core products to keep the loads
live) and optionally stores the 2·G rows Collect-2-Query keeps, bf16, at their
[B, 2, Hq, S_max] places. Per (B, C), CUDA-graph replays over caches rotated past the L2
(`kernels.min_of_rounds`):
- `read`: the stream alone; `mixed`: the stream with the score stores in its loop;
- `fill`: the same score bytes written alone (a memset); `read+fill`: read, then memset;
- `verify none` / `verify c2q`: the real kernels at NQ 1 and 8, for the overheads beside.
`mixed - read` over `fill` says how much dearer the bytes are among the reads than alone.
`--readers`: the plain stream with 1, 2 or 4 programs reading each K/V tile
(`measure_readers`), the L2 traffic of verify programs that split a KV head's query rows.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from kernels import (
    DEV,
    HKV,
    HQ,
    copy_bandwidth,
    kv_bytes,
    min_of_rounds,
    rotating,
    verify_call,
    verify_inputs,
)
from probe_common import write_rows

from vegas_sim.kernels import verify_attention as va

D = 128
G = HQ // HKV
R = 2  # Collect-2-Query's rows: first and last
SHAPES = [(1, 32768), (1, 131072), (4, 32768), (4, 131072), (16, 32768)]


@triton.jit
def _stream_kernel(Q, K, V, SC, OUT, S_MAX, L, HKV, SPLITS, stride_kb, stride_ks,
                   G: tl.constexpr, HQ: tl.constexpr, D: tl.constexpr, READERS: tl.constexpr,
                   BLOCK_N: tl.constexpr, WRITE: tl.constexpr, UPCAST: tl.constexpr):
    """One (request, KV head, split) of verify attention's read pattern without its softmax:
    s = q·kᵀ for a [16, D] q tile, acc += s·v. L is a multiple of BLOCK_N (no masks).
    WRITE: the 2·G rows Collect-2-Query keeps (row r = first/last, head kvh·G + g), bf16.
    UPCAST: fp32 products (the CPU interpreter's bf16 tl.dot is wrong), for the CPU check.
    READERS: programs (adjacent in the grid) that read the same K/V tiles, as programs that
    each took a slice of the query rows would; the L2 serves the copies."""
    pid_bh = tl.program_id(0) // READERS
    split = tl.program_id(1)
    b = pid_bh // HKV
    kvh = pid_bh % HKV
    offs_m = tl.arange(0, 16)
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_N)
    q = tl.load(Q + offs_m[:, None] * D + offs_d[None, :])  # [16, D]
    if UPCAST:
        q = q.to(tl.float32)
    chunk = tl.cdiv(tl.cdiv(L, SPLITS), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, L)
    k_base = K + (b.to(tl.int64) * stride_kb + kvh * D)
    v_base = V + (b.to(tl.int64) * stride_kb + kvh * D)
    sc_base = SC + (b * 2 * HQ + kvh * G).to(tl.int64) * S_MAX
    sc_row = ((offs_m // G) * HQ + offs_m % G) * S_MAX  # [16]: packed row -> score row
    sc_ok = offs_m < 2 * G
    acc = tl.zeros([16, D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        n = tl.max_contiguous(tl.multiple_of(start + offs_n, BLOCK_N), BLOCK_N)
        kv_off = n[:, None] * stride_ks + offs_d[None, :]  # [BLOCK_N, D]
        k = tl.load(k_base + kv_off)
        v = tl.load(v_base + kv_off)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k))  # [16, BLOCK_N]
        if WRITE:
            tl.store(sc_base + sc_row[:, None] + n[None, :], s.to(tl.bfloat16),
                     mask=sc_ok[:, None])
        acc += tl.dot(s.to(v.dtype), v)
    tl.store(OUT + tl.program_id(0) * SPLITS + split, tl.sum(tl.sum(acc, 1), 0))


def stream(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scores: torch.Tensor,
           out: torch.Tensor, C: int, splits: int, block_n: int, write: bool,
           readers: int = 1) -> None:
    B, S_max = k.shape[0], k.shape[1]
    _stream_kernel[(B * HKV * readers, splits)](
        q, k, v, scores, out, S_max, C, HKV, splits, k.stride(0), k.stride(1),
        G=G, HQ=HQ, D=D, READERS=readers, BLOCK_N=block_n, WRITE=write, UPCAST=k.device.type != "cuda",
        num_warps=4, num_stages=3)


def shape_calls(gen: torch.Generator, B: int, C: int
                ) -> tuple[dict[str, Callable[[], Any]], str, int]:
    """The timed calls at (B, C), the stream's launch label (verify's at NQ 1) and the bytes
    of the score rows it stores."""
    _, cfg = va.launch_config(B, HKV, 1, G, C, va.num_sms(torch.device(DEV)), "none")
    caches, lens, q1 = verify_inputs(gen, B, C, 1)
    q8 = torch.randn(B, 8, HQ, D, generator=gen, device=DEV, dtype=torch.bfloat16)
    q16 = torch.randn(16, D, generator=gen, device=DEV, dtype=torch.bfloat16) * 0.01
    S_max = caches[0][0].shape[1]
    scores = torch.empty(B, R, HQ, S_max, device=DEV, dtype=torch.bfloat16)
    out = torch.empty(B * HKV * cfg.splits, device=DEV, dtype=torch.float32)

    def streams(write: bool) -> Callable[[], Any]:
        return rotating([partial(stream, q16, k, v, scores, out, C, cfg.splits, cfg.block_n,
                                 write) for k, v in caches])

    read = streams(False)
    fill = partial(scores.fill_, 0.0)

    def read_fill() -> None:
        read()
        fill()

    calls: dict[str, Callable[[], Any]] = {
        "read": read, "mixed": streams(True), "fill": fill, "read+fill": read_fill}
    for nq, q in ((1, q1), (8, q8)):
        calls[f"verify none nq{nq}"] = verify_call(caches, q, lens, "none", C)
        calls[f"verify c2q nq{nq}"] = verify_call(caches, q, lens, "first_last", C)
    return calls, f"s{cfg.splits} n{cfg.block_n} w4 st3", scores.numel() * scores.element_size()


def measure(gen: torch.Generator, B: int, C: int, rounds: int, copy_bw: float
            ) -> list[dict[str, Any]]:
    calls, label, score = shape_calls(gen, B, C)
    for call in calls.values():  # compile and check before any timing
        call()
    torch.cuda.synchronize()
    ms = min_of_rounds(calls, rounds)
    kv = kv_bytes(B, C)
    rows = []
    for part, t in ms.items():
        base = "verify none" + part[-4:] if part.startswith("verify c2q") else "read"
        rows.append({"batch": B, "context": C, "part": part, "ms": round(t, 5),
                     "kv_gbps": round(kv / t / 1e6, 1),
                     "ratio_copy": round(kv / t / 1e6 / copy_bw, 4),
                     "vs_base_pct": round(100 * (t / ms[base] - 1), 2),
                     "score_bytes_pct": round(100 * score / kv, 2), "launch": label})
    torch.cuda.empty_cache()
    return rows


def measure_readers(gen: torch.Generator, B: int, C: int, rounds: int, copy_bw: float
                    ) -> list[dict[str, Any]]:
    """The read stream with 1, 2 or 4 programs reading each K/V tile (`_stream_kernel`'s
    READERS), at verify's split count and at that count / readers (the same program count):
    what splitting the query rows of a KV head over programs would cost in L2 traffic."""
    _, cfg = va.launch_config(B, HKV, 1, G, C, va.num_sms(torch.device(DEV)), "none")
    caches, _, _ = verify_inputs(gen, B, C, 1)
    q16 = torch.randn(16, D, generator=gen, device=DEV, dtype=torch.bfloat16) * 0.01
    scores = torch.empty(1, device=DEV, dtype=torch.bfloat16)  # WRITE off: never touched
    out = torch.empty(B * HKV * 4 * cfg.splits, device=DEV, dtype=torch.float32)
    calls = {}
    for readers in (1, 2, 4):
        for splits in sorted({cfg.splits, max(1, cfg.splits // readers)}):
            calls[f"r{readers} s{splits}"] = rotating([
                partial(stream, q16, k, v, scores, out, C, splits, cfg.block_n, False, readers)
                for k, v in caches])
    for call in calls.values():
        call()
    torch.cuda.synchronize()
    ms = min_of_rounds(calls, rounds)
    kv = kv_bytes(B, C)
    rows = [{"batch": B, "context": C, "part": f"readers {label}", "ms": round(t, 5),
             "kv_gbps": round(kv / t / 1e6, 1), "ratio_copy": round(kv / t / 1e6 / copy_bw, 4),
             "vs_base_pct": round(100 * (t / ms[f"r1 s{cfg.splits}"] - 1), 2),
             "score_bytes_pct": "", "launch": f"n{cfg.block_n} w4 st3"}
            for label, t in ms.items()]
    for r in rows:
        print(f"B {B} C {C} {r['part']:>16}: {r['ms'] * 1e3:7.1f} us  "
              f"{r['ratio_copy']:.3f} of copy  {r['vs_base_pct']:+.1f} %", flush=True)
    del caches
    torch.cuda.empty_cache()
    return rows


def report(rows: list[dict[str, Any]]) -> None:
    """Per shape: score bytes as a share of KV bytes; what they cost among the reads (mixed),
    alone (fill), after the reads (read+fill), and verify's Collect-2-Query overhead."""
    print(f"{'B':>3} {'C':>7} {'bytes%':>7} {'read':>8} {'mixed%':>7} {'fill%':>6} "
          f"{'r+f%':>6} {'c2q nq1%':>9} {'c2q nq8%':>9}  read/copy")
    shapes = sorted({(r["batch"], r["context"]) for r in rows})
    for B, C in shapes:
        by = {r["part"]: r for r in rows if (r["batch"], r["context"]) == (B, C)}
        read = by["read"]["ms"]
        print(f"{B:>3} {C:>7} {by['read']['score_bytes_pct']:>7.2f} {read * 1e3:>6.1f}us "
              f"{by['mixed']['vs_base_pct']:>7.2f} {100 * by['fill']['ms'] / read:>6.2f} "
              f"{by['read+fill']['vs_base_pct']:>6.2f} {by['verify c2q nq1']['vs_base_pct']:>9.2f} "
              f"{by['verify c2q nq8']['vs_base_pct']:>9.2f}  {by['read']['ratio_copy']:.3f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="", help="B:C,... (default: SHAPES)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--readers", default="", help="B:C,... to time READERS 1/2/4 at instead")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/write_mix_h200.csv"))
    args = p.parse_args(argv)
    shapes = ([tuple(int(x) for x in s.split(":")) for s in args.shapes.split(",")]
              if args.shapes else SHAPES)
    gen = torch.Generator(device=DEV).manual_seed(0)
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth {copy_bw:.0f} GB/s", flush=True)
    rows: list[dict[str, Any]] = []
    if args.readers:
        for B, C in (tuple(int(x) for x in t.split(":")) for t in args.readers.split(",")):
            rows += measure_readers(gen, B, C, args.rounds, copy_bw)
        write_rows(args.out, rows)
        return 0
    for B, C in shapes:
        rows += measure(gen, B, C, args.rounds, copy_bw)
        print(f"B {B} C {C} done", flush=True)
    write_rows(args.out, rows)
    report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
