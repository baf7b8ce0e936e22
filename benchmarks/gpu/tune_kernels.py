"""Launch-config sweeps behind the kernel defaults (issue #3), one GPU call:

    python benchmarks/gpu/tune_kernels.py --out /tmp/tune.csv [--parts collect,b1,weights]

- `collect`: Collect-2-Query (first_last) launch configs — store (rows / dot), M tile, BLOCK_N,
  pipeline stages, split count — at every shape of `kernels.py --quick` except the big cache,
  each against the default collect="none" call at the same shape. A first round times every
  candidate once; a second round re-times the default, the none baseline and the three best,
  interleaved, and keeps each one's faster time (timing noise only ever adds).
- `b1`: the split combine as a programmatic dependent launch (pdl) vs two plain launches at
  B = 1, where the combine is a visible share of a ~40 µs verify.
- `weights`: score_weights block shapes (keys × lines per tile, warps, stages) on the
  Collect-2-Query scores of the selection shape (B 4, C 128K, NQ 8).

Rows: kind (tune_c2q, tune_b1, tune_weights), shape, ms, ratio to copy, overhead % over the
none baseline (tune_c2q), config label, note ("default", "round 2"). The summary prints the
best config per shape next to the default. Nothing runs at import.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernels import (
    HKV,
    HQ,
    SCALE,
    bench,
    copy_bandwidth,
    kv_bytes,
    make_cache,
    n_copies,
    rotating,
    verify_call,
    verify_inputs,
)

G = HQ // HKV
SHAPES = [(B, C, NQ) for C in (32768, 131072) for B in (1, 4, 16) for NQ in (1, 8, 16)
          if B * C < 16 * 131072]
FIELDS = ["kind", "batch", "context", "n_query", "ms", "ratio_copy", "overhead_pct", "config",
          "note"]
# (store, min_m, block_n, stages) per tile; M 16 tiles only where NQ·G <= 16 (else M >= 32
# mma.sync tiles, which lost by 20-40 points in runs 4, 5 and 9)
TILE_SETS = {
    # run 10: the register-store candidates (none beat the defaults by more than noise,
    # except 2 splits at B 16 with M 64)
    "rows": ([("rows", 16, 128, 3), ("rows", 16, 64, 4), ("rows", 16, 64, 3),
              ("rows", 16, 128, 2)],
             [("rows", 64, 64, 4), ("rows", 64, 64, 3), ("rows", 64, 64, 2),
              ("dot", 64, 64, 3), ("dot", 64, 64, 4)]),
    # run 11 timed a "tma" set — the same tiles with c2q="tma", the TMA store of
    # results/h200/tma_store_run11.patch (dropped: an illegal instruction on the H200)
}


def label(kw: dict[str, Any]) -> str:
    return (f"{kw['c2q']} m{kw['min_m']} n{kw['block_n']} st{kw['num_stages']} "
            f"s{kw['splits']}")


def auto_splits(B: int, C: int, NQ: int, min_m: int, block_n: int, n_sms: int) -> int:
    """The split count the launcher picks for this tile when collecting first_last (table
    entry, else the wave model). Run 10 generated its candidates from collect=none's count,
    before the B 16 Collect-2-Query table entries existed (TUNED_COLLECT, replaced since run 25
    by verify_attention.wide_config)."""
    from vegas_sim.kernels import verify_attention as va

    return va.launch_config(B, HKV, NQ, G, C, n_sms, "first_last", min_m=min_m,
                            block_n=block_n)[1].splits


def collect_candidates(B: int, C: int, NQ: int, n_sms: int,
                       tile_set: str = "rows") -> list[dict[str, Any]]:
    """Every tile of `tile_set` at its auto split count and twice it (two programs per SM
    where shared memory allows); 4-stage M 64 tiles also at half, and at 1-2 splits for
    B >= 16."""
    m16, m64 = TILE_SETS[tile_set]
    tiles = (m16 if NQ * G <= 16 else []) + m64
    out: list[dict[str, Any]] = []
    for c2q, min_m, block_n, stages in tiles:
        a = auto_splits(B, C, NQ, min_m, block_n, n_sms)
        splits = {a, 2 * a}
        if (min_m, stages) == (64, 4):
            splits |= {max(1, a // 2)} | ({1, 2} if B >= 16 else set())
        for s in sorted(splits):
            kw = {"c2q": c2q, "min_m": min_m, "block_n": block_n, "num_stages": stages,
                  "splits": s}
            if kw not in out:
                out.append(kw)
    return out


def default_kw(B: int, C: int, NQ: int, n_sms: int) -> dict[str, Any]:
    """What verify_attention(collect="first_last") picks with no knobs, in candidate form."""
    from vegas_sim.kernels import verify_attention as va

    _, cfg = va.launch_config(B, HKV, NQ, G, C, n_sms, "first_last")
    return {"c2q": "dot" if va.C2Q_DOT_DEFAULT else "rows",
            "min_m": va.default_min_m(NQ, G, "first_last"), "block_n": cfg.block_n,
            "splits": cfg.splits, "num_stages": cfg.num_stages}


def timed(fn: Any) -> float:
    try:
        return bench(fn)
    except Exception as e:  # noqa: BLE001 - out of shared memory etc. is a result
        print(f"    failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
        return math.inf


def tune_collect(out: list[dict[str, Any]], copy_bw: float, n_sms: int, budget: float,
                 t0: float, tile_set: str) -> None:
    gen = torch.Generator(device="cuda").manual_seed(10)
    for B, C, NQ in SHAPES:
        if time.time() - t0 > budget:
            print(f"collect: budget spent before B={B} C={C} NQ={NQ}", flush=True)
            return
        caches, lens, q = verify_inputs(gen, B, C, NQ)
        torch.cuda.synchronize()
        dflt = default_kw(B, C, NQ, n_sms)
        cands = collect_candidates(B, C, NQ, n_sms, tile_set)
        if dflt not in cands:
            cands.insert(0, dflt)
        call = partial(verify_call, caches, q, lens, "first_last", C)
        best: dict[str, float] = {"none": timed(verify_call(caches, q, lens, "none", C))}
        for kw in cands:
            best[label(kw)] = timed(call(**kw))
        # round 2: the default, none and the three fastest again, interleaved
        by_label = {label(kw): kw for kw in cands}
        top = sorted(by_label, key=best.__getitem__)[:3]
        for name in ["none", label(dflt)] + [t for t in top if t != label(dflt)]:
            fn = (verify_call(caches, q, lens, "none", C) if name == "none"
                  else call(**by_label[name]))
            best[name] = min(best[name], timed(fn))
        base = best["none"]
        gb = kv_bytes(B, C) / 1e6
        for name, ms in best.items():
            if math.isinf(ms):
                continue
            out.append({"kind": "tune_c2q", "batch": B, "context": C, "n_query": NQ, "ms": ms,
                        "ratio_copy": gb / ms / copy_bw, "overhead_pct": 100 * (ms / base - 1),
                        "config": name,
                        "note": "default" if name == label(dflt) else ""})
        win = min((n for n in best if n != "none"), key=best.__getitem__)
        print(f"c2q B={B:2d} C={C:6d} NQ={NQ:2d} none {base:.4f} ms; default "
              f"{label(dflt)} +{100 * (best[label(dflt)] / base - 1):.1f} %; best {win} "
              f"+{100 * (best[win] / base - 1):.1f} %", flush=True)
        del caches
        torch.cuda.empty_cache()


def tune_b1(out: list[dict[str, Any]], copy_bw: float) -> None:
    gen = torch.Generator(device="cuda").manual_seed(11)
    for C in (32768, 131072):
        for NQ in (1, 8, 16):
            caches, lens, q = verify_inputs(gen, 1, C, NQ)
            torch.cuda.synchronize()
            for collect in ("none", "first_last"):
                t = {False: math.inf, True: math.inf}
                for _ in range(3):  # interleaved rounds, faster time kept
                    for pdl in (False, True):
                        t[pdl] = min(t[pdl], timed(verify_call(caches, q, lens, collect, C,
                                                               pdl=pdl)))
                for pdl, ms in t.items():
                    out.append({"kind": "tune_b1", "batch": 1, "context": C, "n_query": NQ,
                                "ms": ms, "ratio_copy": kv_bytes(1, C) / ms / 1e6 / copy_bw,
                                "config": f"{collect} pdl={int(pdl)}"})
                print(f"b1 C={C:6d} NQ={NQ:2d} {collect:10s} two launches "
                      f"{kv_bytes(1, C) / t[False] / 1e6 / copy_bw:.3f} of copy, pdl "
                      f"{kv_bytes(1, C) / t[True] / 1e6 / copy_bw:.3f}", flush=True)
            del caches
            torch.cuda.empty_cache()


WEIGHT_BLOCKS = [  # (BLOCK_S keys, BLOCK_R lines, warps, stages or None = triton's default)
    # run 10 measured 16 shapes: 1024 x 4 (the default) 0.54 of copy, 2048 x 8 at 8 warps 0.66,
    # every narrower tile 0.19-0.54; run 11 looks around the winner
    (1024, 4, 4, None), (2048, 8, 8, None), (2048, 8, 8, 2), (2048, 8, 8, 4),
    (2048, 16, 8, None), (4096, 4, 8, None), (4096, 8, 8, None), (4096, 8, 16, None),
    (2048, 8, 16, None), (4096, 16, 16, None), (8192, 4, 16, None), (2048, 4, 4, None),
]


def tune_weights(out: list[dict[str, Any]], copy_bw: float) -> None:
    from vegas_sim.kernels import selection
    from vegas_sim.kernels import verify_attention as va

    B, C, NQ = 4, 131072, 8
    gen = torch.Generator(device="cuda").manual_seed(12)
    k, v = make_cache(gen, B, C)
    lens = torch.full((B,), C, dtype=torch.int32, device="cuda")
    q = torch.randn(B, NQ, HQ, 128, generator=gen, device="cuda", dtype=torch.bfloat16)
    _, lse, scores = va.verify_attention(q, k, v, lens, SCALE, "first_last", max_len=C)
    assert scores is not None
    del k, v
    lse2 = lse[:, [0, NQ - 1]].contiguous()
    rank = lens - NQ + 1
    copies = [scores] + [scores.clone() for _ in range(n_copies(scores.numel() * 2) - 1)]
    ref = selection.score_weights(scores, lse2, SCALE, rank)
    nbytes = scores.numel() * 2.0 + B * scores.shape[-1] * 4.0
    for bs, br, w, st in WEIGHT_BLOCKS:
        kw = {"block_s": bs, "block_r": br, "num_warps": w, "num_stages": st}
        name = f"s{bs} r{br} w{w} st{st or 'auto'}"
        try:
            got = selection.score_weights(scores, lse2, SCALE, rank, **kw)
            same = bool(torch.allclose(got, ref, rtol=1e-5, atol=0))
            ms = bench(rotating([partial(selection.score_weights, sc, lse2, SCALE, rank, **kw)
                                 for sc in copies]))
        except Exception as e:  # noqa: BLE001 - out of resources is a result
            print(f"weights {name} failed: {type(e).__name__}: {str(e)[:100]}", flush=True)
            continue
        ratio = nbytes / ms / 1e6 / copy_bw
        out.append({"kind": "tune_weights", "batch": B, "context": C, "n_query": NQ, "ms": ms,
                    "ratio_copy": ratio, "config": name,
                    "note": "equal to default" if same else "DIFFERS from default"})
        print(f"weights {name:22s} {ms * 1e3:6.1f} us {ratio:.2f} of copy"
              f"{'' if same else '  DIFFERS'}", flush=True)


def write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS, restval="")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.5g}" if isinstance(v, float) else v) for k, v in r.items()})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--parts", default="collect,b1,weights")
    p.add_argument("--collect-budget-s", type=float, default=240.0)
    p.add_argument("--tiles", default="rows", choices=sorted(TILE_SETS),
                   help="Collect-2-Query candidate set (rows: run 10's)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("tune_kernels.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from vegas_sim.kernels import verify_attention as va

    n_sms = va.num_sms(torch.device("cuda"))
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth {copy_bw:.0f} GB/s", flush=True)
    rows: list[dict[str, Any]] = [{"kind": "copy", "ratio_copy": 1.0,
                                   "note": f"{copy_bw:.0f} GB/s {torch.cuda.get_device_name()}"}]
    parts = args.parts.split(",")
    t0 = time.time()
    try:
        if "weights" in parts:
            tune_weights(rows, copy_bw)
            write(args.out, rows)
        if "b1" in parts:
            tune_b1(rows, copy_bw)
            write(args.out, rows)
        if "collect" in parts:
            tune_collect(rows, copy_bw, n_sms, args.collect_budget_s, time.time(), args.tiles)
    finally:
        write(args.out, rows)
        print(f"done in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
