"""Kernel benchmark on the GPU: verify attention, sparse draft attention, Vegas selection.

Qwen3-8B attention shapes (Hq 32, Hkv 8, D 128, bf16). Every ratio is against the copy
bandwidth measured in the same run (a large device-to-device copy, read + write bytes).

    python benchmarks/kernels.py --out benchmarks/results/kernels_h200.csv [--quick] [--tune]

--quick (B 1,4,16; C 32K,128K; NQ 1,8,16; no SDPA past NQ 1 at B 16) takes ~2 GPU-minutes
with compilation; --tune adds a small launch-config sweep of verify attention (~1 minute)
and prints `TUNED` entries for vegas_sim/kernels/verify_attention.py. The last lines are a
table of the four targets with PASS/FAIL.

Rows of the CSV: `kind` (copy, verify, sdpa, sparse, select, gemm, tune), the shape columns, `ms`
(median of triton.testing.do_bench), `gbps` (bytes counted / time), `ratio_copy` (gbps / copy),
and a free-form `note`. Nothing runs at import.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

HQ, HKV, D = 32, 8, 128
SCALE = D ** -0.5
LAYERS = 36
FIELDS = ["kind", "batch", "context", "n_query", "collect", "sparsity", "ms", "gbps",
          "ratio_copy", "overhead_pct", "config", "note"]


def bench(fn: Callable[[], Any]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def copy_bandwidth(gib: float = 4.0) -> float:
    """GB/s of a large device-to-device copy, counting bytes read + written."""
    n = int(gib * 2**30) // 2
    x = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    del x, y
    return 2 * n * 2 / ms / 1e6


def make_cache(gen: torch.Generator, B: int, C: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Caches for contexts up to C; S_max = C + 128 (a multiple of 128, as the runtime should
    allocate it: the score write-out then needs no key mask)."""
    S = C + 128
    k = torch.randn(B, S, HKV, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, S, HKV, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    return k, v


def kv_bytes(B: int, tokens: int) -> float:
    return 2.0 * B * tokens * HKV * D * 2  # K and V, bf16


def row(kind: str, **kw: Any) -> dict[str, Any]:
    r: dict[str, Any] = {f: "" for f in FIELDS}
    r["kind"] = kind
    r.update(kw)
    return r


def sdpa_ms(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, C: int) -> float:
    """torch SDPA on the same cache (views [B, Hkv, C, D]) with a bottom-right causal mask."""
    NQ = q.shape[1]
    qt = q.transpose(1, 2)  # [B, Hq, NQ, D]
    kt, vt = k[:, :C].transpose(1, 2), v[:, :C].transpose(1, 2)  # [B, Hkv, C, D] views
    mask = torch.ones(NQ, C, dtype=torch.bool, device="cuda").tril(C - NQ)
    f = torch.nn.functional.scaled_dot_product_attention
    return bench(lambda: f(qt, kt, vt, attn_mask=mask, scale=SCALE, enable_gqa=True))


def bench_verify(args: argparse.Namespace, copy_bw: float, out: list[dict[str, Any]]) -> None:
    from vegas_sim.kernels import verify_attention as va

    gen = torch.Generator(device="cuda").manual_seed(0)
    for C in args.contexts:
        for B in args.batches:
            if kv_bytes(B, C) > 40e9:
                continue
            k, v = make_cache(gen, B, C)
            lens = torch.full((B,), C, dtype=torch.int32, device="cuda")
            for NQ in args.n_query:
                q = torch.randn(B, NQ, HQ, D, generator=gen, device="cuda", dtype=torch.bfloat16)
                cfg = va.choose_config(B, HKV, NQ, HQ // HKV, C, va.num_sms(q.device)).label()
                base = None
                for collect in ("none", "first_last", "all"):
                    ms = bench(lambda: va.verify_attention(q, k, v, lens, SCALE, collect,
                                                           max_len=C))
                    gb = kv_bytes(B, C) / ms / 1e6
                    base = ms if collect == "none" else base
                    assert base is not None
                    out.append(row("verify", batch=B, context=C, n_query=NQ, collect=collect,
                                   ms=ms, gbps=gb, ratio_copy=gb / copy_bw,
                                   overhead_pct=100 * (ms / base - 1), config=cfg))
                    print_row(out[-1])
                if args.quick and (B * C > 4 * 131072 or NQ not in (1, 8)):
                    continue  # SDPA is a reference line (~0.2 of copy); keep --quick short
                try:
                    ms = sdpa_ms(q, k, v, C)
                    gb = kv_bytes(B, C) / ms / 1e6
                    out.append(row("sdpa", batch=B, context=C, n_query=NQ, ms=ms, gbps=gb,
                                   ratio_copy=gb / copy_bw, note="torch SDPA, bool mask"))
                except Exception as e:  # noqa: BLE001 - a reference line must not stop the run
                    out.append(row("sdpa", batch=B, context=C, n_query=NQ, note=repr(e)[:80]))
                print_row(out[-1])
            del k, v
            torch.cuda.empty_cache()


TUNE_SHAPES = [(1, 32768, 8), (1, 131072, 16), (4, 32768, 16), (4, 131072, 8),
               (16, 32768, 16)]


def tune_candidates(B: int, C: int, NQ: int, n_sms: int) -> list[Any]:
    """The heuristic config, its neighbours in splits (the full-wave counts around it, ×2) and
    tile sizes; 128-key tiles with 4 stages only at M <= 32 (shared memory)."""
    from vegas_sim.kernels import verify_attention as va

    auto = va.choose_config(B, HKV, NQ, HQ // HKV, C, n_sms)
    block_m = max(16, 1 << (NQ * HQ // HKV - 1).bit_length())
    waves = sorted({s for s in (auto.splits, max(1, auto.splits // 2), 2 * auto.splits,
                                max(1, n_sms // (B * HKV)), max(1, 2 * n_sms // (B * HKV)))})
    out = [auto]
    for splits in waves:
        for block_n in (64, 128):
            for stages in (3, 4):
                if block_n == 128 and stages == 4 and block_m >= 64:
                    continue
                cfg = va.VerifyConfig(splits, block_n, 4, stages)
                if cfg not in out:
                    out.append(cfg)
    return out


def bench_tune(args: argparse.Namespace, copy_bw: float, out: list[dict[str, Any]]) -> None:
    """Time launch configs of verify attention (collect none) at a few shapes; print the best
    and a `TUNED` line when it beats the heuristic by > 3 %."""
    from vegas_sim.kernels import verify_attention as va

    gen = torch.Generator(device="cuda").manual_seed(1)
    n_sms = va.num_sms(torch.device("cuda"))
    for B, C, NQ in TUNE_SHAPES:
        k, v = make_cache(gen, B, C)
        lens = torch.full((B,), C, dtype=torch.int32, device="cuda")
        q = torch.randn(B, NQ, HQ, D, generator=gen, device="cuda", dtype=torch.bfloat16)
        timed: list[tuple[float, Any]] = []
        for i, cfg in enumerate(tune_candidates(B, C, NQ, n_sms)):
            label = cfg.label() + (" (auto)" if i == 0 else "")
            try:
                ms = bench(lambda: va.verify_attention(
                    q, k, v, lens, SCALE, "none", splits=cfg.splits, block_n=cfg.block_n,
                    num_warps=cfg.num_warps, num_stages=cfg.num_stages, max_len=C))
            except Exception as e:  # noqa: BLE001 - out of resources is a result
                out.append(row("tune", batch=B, context=C, n_query=NQ, config=label,
                               note=repr(e)[:60]))
                continue
            timed.append((ms, cfg))
            gb = kv_bytes(B, C) / ms / 1e6
            out.append(row("tune", batch=B, context=C, n_query=NQ, ms=ms, gbps=gb,
                           ratio_copy=gb / copy_bw, config=label))
        if not timed:
            continue
        auto_ms = timed[0][0]
        best_ms, best = min(timed, key=lambda t: t[0])
        ratio = kv_bytes(B, C) / best_ms / 1e6 / copy_bw
        print(f"tune B={B:2d} C={C:6d} NQ={NQ:2d}: auto {timed[0][1].label()} "
              f"{kv_bytes(B, C) / auto_ms / 1e6 / copy_bw:.2f} of copy; best {best.label()} "
              f"{ratio:.2f}", flush=True)
        if best_ms < 0.97 * auto_ms:
            block_m = max(16, 1 << (NQ * HQ // HKV - 1).bit_length())
            print(f"    TUNED: ({n_sms}, {B * HKV}, {block_m}, {C.bit_length() - 1}): "
                  f"VerifyConfig({best.splits}, {best.block_n}, {best.num_warps}, "
                  f"{best.num_stages}),  # {ratio:.2f} of copy", flush=True)
        del k, v
        torch.cuda.empty_cache()


def bench_sparse(args: argparse.Namespace, copy_bw: float, out: list[dict[str, Any]]) -> None:
    from vegas_sim.kernels import sparse_attention as sa

    gen = torch.Generator(device="cuda").manual_seed(2)
    q1 = torch.randn(1, HQ, D, device="cuda", dtype=torch.bfloat16)
    k1, v1 = make_cache(gen, 1, 64)
    one = torch.ones(1, dtype=torch.int32, device="cuda")
    idx1 = torch.zeros(1, 1, dtype=torch.int32, device="cuda")
    launch = bench(lambda: sa.sparse_draft_attention(q1, k1, v1, idx1, one, one, one + 1, SCALE))
    out.append(row("sparse", batch=1, context=2, ms=launch, note="launch: 2 keys"))
    for C in [c for c in args.contexts if c >= 32768]:
        for B in args.batches:
            if kv_bytes(B, C) > 40e9:
                continue
            k, v = make_cache(gen, B, C)
            q = torch.randn(B, HQ, D, generator=gen, device="cuda", dtype=torch.bfloat16)
            for s in ((0.01, 0.05, 0.2) if args.quick else (0.01, 0.05, 0.1, 0.2)):
                K = math.ceil(s * C)
                idx = torch.stack([torch.randperm(C, generator=gen, device="cuda")[:K]
                                   for _ in range(B)]).int()
                n = torch.full((B,), K, dtype=torch.int32, device="cuda")
                tail = torch.full((B,), C, dtype=torch.int32, device="cuda")
                lens = tail + 4
                ms = bench(lambda: sa.sparse_draft_attention(q, k, v, idx, n, tail, lens, SCALE))
                byt = kv_bytes(B, K + 4)
                bound = byt / copy_bw / 1e6 + launch
                out.append(row("sparse", batch=B, context=C, sparsity=s, ms=ms,
                               gbps=byt / ms / 1e6, ratio_copy=byt / ms / 1e6 / copy_bw,
                               note=f"ms / (bytes/copy + launch) = {ms / bound:.2f}"))
                print_row(out[-1])
            del k, v
            torch.cuda.empty_cache()


def qwen3_8b_gemm_ms(tokens: int) -> float:
    """Measured: the per-layer bf16 GEMMs of Qwen3-8B (qkv, o, gate+up, down) for `tokens`
    rows, × 36 layers, + lm_head. Norms, RoPE, sampling are not included."""
    h, ffn, vocab = 4096, 12288, 151936
    x = torch.randn(tokens, h, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(tokens, ffn, device="cuda", dtype=torch.bfloat16)
    ws = [torch.randn(n, h, device="cuda", dtype=torch.bfloat16) * 0.02
          for n in (h + 2 * 1024, h, 2 * ffn)]
    wd = torch.randn(h, ffn, device="cuda", dtype=torch.bfloat16) * 0.02
    wl = torch.randn(vocab, h, device="cuda", dtype=torch.bfloat16) * 0.02

    def layer() -> None:
        for w in ws:
            torch.nn.functional.linear(x, w)
        torch.nn.functional.linear(y, wd)

    per_layer = bench(layer)
    head = bench(lambda: torch.nn.functional.linear(x[-1:].expand(tokens, h), wl))
    return LAYERS * per_layer + head


def bench_selection(args: argparse.Namespace, copy_bw: float, out: list[dict[str, Any]]) -> None:
    """Vegas selection at B=4, C=128K (NQ 8, Collect-2-Query) vs one verify iteration."""
    from vegas_sim.kernels import ops, reference
    from vegas_sim.kernels import verify_attention as va

    B, C, NQ = 4, 131072, 8
    gen = torch.Generator(device="cuda").manual_seed(3)
    k, v = make_cache(gen, B, C)
    lens = torch.full((B,), C, dtype=torch.int32, device="cuda")
    q = torch.randn(B, NQ, HQ, D, generator=gen, device="cuda", dtype=torch.bfloat16)
    plain = bench(lambda: va.verify_attention(q, k, v, lens, SCALE, "none", max_len=C))
    coll = bench(lambda: va.verify_attention(q, k, v, lens, SCALE, "first_last", max_len=C))
    _, lse, scores = va.verify_attention(q, k, v, lens, SCALE, "first_last", max_len=C)
    assert scores is not None
    lse2 = lse[:, [0, NQ - 1]].contiguous()
    rank = lens - NQ + 1
    w_ms = bench(lambda: ops.score_weights(scores, lse2, SCALE, rank))
    w = ops.score_weights(scores, lse2, SCALE, rank)
    weights = torch.stack([w] * LAYERS)  # [36, B, S]
    budget = torch.full((B,), math.ceil(0.07 * (C - NQ + 1)), dtype=torch.int32, device="cuda")
    topk_ms = bench(lambda: ops.topk_select(weights, budget))
    topk_sorted_ms = bench(lambda: reference.topk_select(weights, budget))
    del k, v, weights
    torch.cuda.empty_cache()
    gemm = qwen3_8b_gemm_ms(B * NQ)
    verify_iter = LAYERS * coll + gemm
    select = LAYERS * w_ms + topk_ms
    collect_extra = LAYERS * (coll - plain)
    for name, ms in [("verify_attention_plain_x36", LAYERS * plain),
                     ("verify_attention_c2q_x36", LAYERS * coll),
                     ("gemm_measured", gemm), ("score_weights_x36", LAYERS * w_ms),
                     ("topk_36_layers", topk_ms), ("topk_36_layers_sorted_ref", topk_sorted_ms)]:
        out.append(row("select", batch=B, context=C, n_query=NQ, ms=ms, note=name))
    share = (select + collect_extra) / verify_iter
    out.append(row("select", batch=B, context=C, n_query=NQ, ms=select + collect_extra,
                   overhead_pct=100 * share,
                   note="selection (collect extra + weights + topk) / verify iteration "
                        "(36 x C2Q attention + measured GEMMs)"))
    print(f"Vegas selection at B=4 C=128K: {select + collect_extra:.3f} ms of a "
          f"{verify_iter:.3f} ms verify iteration = {100 * share:.1f} % "
          f"(weights {LAYERS * w_ms:.3f}, topk {topk_ms:.3f} [sorted {topk_sorted_ms:.3f}], "
          f"collect {collect_extra:.3f}, gemm {gemm:.3f})", flush=True)


def print_row(r: dict[str, Any]) -> None:
    def f(x: Any, spec: str) -> str:
        return format(x, spec) if isinstance(x, float) else str(x)

    print(f"{r['kind']:7s} B={r['batch']!s:>2} C={r['context']!s:>6} NQ={r['n_query']!s:>2} "
          f"{r['collect'] or r['sparsity']!s:>10} ms={f(r['ms'], '.4f'):>8} "
          f"GB/s={f(r['gbps'], '.0f'):>5} copy={f(r['ratio_copy'], '.2f'):>5} "
          f"ovh%={f(r['overhead_pct'], '.1f'):>5} {r['note']}", flush=True)


def _verdict(ok: bool | None) -> str:
    return "n/a " if ok is None else ("PASS" if ok else "FAIL")


def summary(rows: list[dict[str, Any]]) -> None:
    """Per-NQ detail, then the four targets (DESIGN.md) with PASS/FAIL from this run's rows."""
    ver = [r for r in rows if r["kind"] == "verify" and r["context"] >= 32768
           and r["ms"] != ""]
    plain = [r for r in ver if r["collect"] == "none"]
    c2q = [r for r in ver if r["collect"] == "first_last"]
    if ver:
        print("\nverify attention, C >= 32K (ratio to copy: min over B, C; overhead % max):")
        for nq in sorted({r["n_query"] for r in ver}):
            sel = [r for r in ver if r["n_query"] == nq]
            parts = [f"  NQ={nq:2d}: copy ratio min "
                     f"{min(r['ratio_copy'] for r in sel if r['collect'] == 'none'):.2f}"]
            for mode in ("first_last", "all"):
                o = [r["overhead_pct"] for r in sel if r["collect"] == mode]
                if o:
                    parts.append(f"{mode} ovh max {max(o):5.1f} %")
            print("  ".join(parts))
        for b in sorted({r["batch"] for r in plain}):
            for c in sorted({r["context"] for r in plain}):
                sel = [r for r in plain if r["batch"] == b and r["context"] == c]
                if sel:
                    print(f"  B={b:2d} C={c:6d}: copy ratio "
                          + " ".join(f"{r['ratio_copy']:.2f}" for r in sel)
                          + f"  ({sel[0]['config']})")
    sparse = [r for r in rows if r["kind"] == "sparse" and "=" in str(r["note"])
              and r["ms"] != ""]
    sparse_ratio = [float(str(r["note"]).rsplit("=", 1)[1]) for r in sparse]
    share = [r["overhead_pct"] for r in rows if r["kind"] == "select" and r["overhead_pct"] != ""]
    v_min = min((r["ratio_copy"] for r in plain), default=None)
    c_max = max((r["overhead_pct"] for r in c2q), default=None)
    c_spread = None
    if c2q:
        by_nq = {nq: max(r["overhead_pct"] for r in c2q if r["n_query"] == nq)
                 for nq in {r["n_query"] for r in c2q}}
        c_spread = max(by_nq.values()) - min(by_nq.values())
    s_max = max(sparse_ratio, default=None)
    sh = share[-1] if share else None

    def fmt(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    print("\n| target | measured | goal | verdict |\n|---|---|---|---|")
    print(f"| verify attention / copy BW, C>=32K, NQ<=16 (min) | {fmt(v_min, '.2f')} | >= 0.85 | "
          f"{_verdict(None if v_min is None else v_min >= 0.85)} |")
    print(f"| Collect-2-Query overhead (max; spread over NQ) | {fmt(c_max, '.1f')} % "
          f"({fmt(c_spread, '.1f')} pts) | <= 6 % | "
          f"{_verdict(None if c_max is None else c_max <= 6.0)} |")
    print(f"| sparse draft / (bytes/copy + launch) (max) | {fmt(s_max, '.2f')} | <= 1.3 | "
          f"{_verdict(None if s_max is None else s_max <= 1.3)} |")
    print(f"| Vegas selection share, B=4 C=128K | {fmt(sh, '.1f')} % | <= 8 % | "
          f"{_verdict(None if sh is None else sh <= 8.0)} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/kernels_h200.csv"))
    p.add_argument("--quick", action="store_true", help="B 1,4,16; C 32K,128K; NQ 1,8,16")
    p.add_argument("--tune", action="store_true", help="also sweep verify launch configs")
    p.add_argument("--only", default="verify,sparse,select",
                   help="comma list of verify,sparse,select")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/kernels.py needs a CUDA GPU", file=sys.stderr)
        return 2
    args.batches = [1, 4, 16]
    args.contexts = [32768, 131072] if args.quick else [8192, 32768, 131072]
    args.n_query = [1, 8, 16] if args.quick else [1, 4, 8, 12, 16]
    rows: list[dict[str, Any]] = []
    copy_bw = copy_bandwidth()
    rows.append(row("copy", gbps=copy_bw, ratio_copy=1.0,
                    note=f"{torch.cuda.get_device_name()} torch {torch.__version__}"))
    print(f"copy bandwidth {copy_bw:.0f} GB/s (read+write)")
    only = set(args.only.split(","))
    steps = [("verify", bench_verify), ("sparse", bench_sparse), ("select", bench_selection)]
    try:
        if args.tune:
            bench_tune(args, copy_bw, rows)
        for name, fn in steps:
            if name in only:
                fn(args, copy_bw, rows)
    finally:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=FIELDS)
            w.writeheader()
            for r in rows:
                w.writerow({k: (f"{v:.5g}" if isinstance(v, float) else v) for k, v in r.items()})
        summary(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
