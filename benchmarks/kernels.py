"""Kernel benchmark on the GPU: verify attention, sparse draft attention, Vegas selection.

Qwen3-8B attention shapes (Hq 32, Hkv 8, D 128, bf16). Every ratio is against the copy
bandwidth measured in the same run (a large device-to-device copy, read + write bytes).

    python benchmarks/kernels.py --out benchmarks/results/kernels_h200.csv [--quick] [--tune]
    python benchmarks/kernels.py --summary benchmarks/results/kernels_h200.csv   # CPU: reprint

--quick (B 1,4,16; C 32K,128K; NQ 1,8,16; collect none/first_last; no SDPA past NQ 1 at
B 16) takes ~2 GPU-minutes with compilation. Steps, in order: Collect-2-Query candidates
(kind c2q), verify grid, Vegas selection, sparse draft, B=1 C=32K launch configs (b1), then
the caches of >= 2^31 elements (B=16 C=128K) and the int32-offset crash probe (probe). Each
failing shape is an `error` row; a lost CUDA context ends the GPU work; the CSV and the
PASS/FAIL table are always written (also on SIGTERM). --tune adds a small launch-config
sweep of verify attention (~1 minute) and prints `TUNED` entries for
vegas_sim/kernels/verify_attention.py. The last lines are a table of the targets with PASS/FAIL.

Step oss: Collect-2 and Collect-all overhead at gpt-oss-20b's shape (Hq 64, Hkv 8, D 64, 12
rows), beside the Vegas paper's 37 % / 189 %.

Step quest: a Quest draft step against a Stream draft step at the same budget (B 4, C 32K and
120K), with Quest's selection apart and its metadata bytes at the copy bandwidth.

Step c2q also times, per shape, the plain verify and Collect-2-Query in each score format
(bf16, fp8) at the default launch, interleaved (kind c2q_format), with each overhead against
the 6 % target; `--only c2q` runs just that step.

Rows of the CSV: `kind` (copy, quest, c2q, c2q_format, verify, sdpa, sparse, select, b1, oss,
probe, error, tune, variant, sweep), the
shape columns, `ms` (median of CUDA-graph replays, triton.testing.do_bench_cudagraph: host
launch overhead excluded, as in the calibration runtime; inputs rotated past the L2), `gbps`
(bytes counted / time), `ratio_copy` (gbps / copy), and a free-form `note`. Nothing runs at import.
"""

from __future__ import annotations

import argparse
import csv
import math
import signal
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

HQ, HKV, D = 32, 8, 128
DEV = "cuda"  # tests/kernels/test_benchmark_smoke.py runs the control flow on "cpu"
# Shape grids (module constants so the CPU smoke test can shrink them)
BATCHES = [1, 4, 16]
CONTEXTS, CONTEXTS_QUICK = [8192, 32768, 131072], [32768, 131072]
SELECT_SHAPE = (4, 131072, 8)  # B, C, NQ of the Vegas selection share
B1_CONTEXT = 32768
LONG_C = 32768  # the targets are stated for C >= 32K
SCALE = D ** -0.5
LAYERS = 36
FIELDS = ["kind", "batch", "context", "n_query", "collect", "sparsity", "ms", "gbps",
          "ratio_copy", "overhead_pct", "config", "note"]


def bench(fn: Callable[[], Any], graph: bool = True) -> float:
    """Median ms of one call of `fn`, replayed from a CUDA graph (as the calibration runtime
    replays every decode/verify step), so host launch overhead is not counted; `graph=False`
    (or a triton without do_bench_cudagraph) times eager launches with do_bench. No L2 flush
    under graphs: callers rotate over enough input copies (`rotating`) to defeat the L2."""
    import triton.testing

    if graph and hasattr(triton.testing, "do_bench_cudagraph"):
        try:
            return float(triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median"))
        except TypeError:  # an older signature without return_mode
            return float(triton.testing.do_bench_cudagraph(fn, rep=20))
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


L2_DEFEAT_BYTES = 256e6  # > 4x the H200's 50 MB L2


def n_copies(nbytes: float) -> int:
    """Input copies to rotate over so one call's data has left the L2 when it comes back."""
    return max(1, min(4, math.ceil(L2_DEFEAT_BYTES / max(nbytes, 1.0))))


def rotating(calls: Sequence[Callable[[], Any]]) -> Callable[[], Any]:
    """A function that runs calls[0], calls[1], ... in turn (captured unrolled by the graph)."""
    state = [0]

    def step() -> Any:
        i = state[0]
        state[0] = (i + 1) % len(calls)
        return calls[i]()
    return step


def copy_bandwidth(gib: float = 4.0) -> float:
    """GB/s of a large device-to-device copy, counting bytes read + written: the faster of
    the graph-replayed and the eager timing."""
    n = int(gib * 2**30) // 2
    x = torch.empty(n, dtype=torch.bfloat16, device=DEV).normal_()
    y = torch.empty_like(x)
    for _ in range(50):  # ~0.1 s of copies: clocks up before the first timing
        y.copy_(x)
    # on the H200 the graph timer once read 2772 GB/s right after start against 4256 eager:
    # keep the larger of the two, so ratios are never inflated by a low denominator
    ms = min(bench(partial(y.copy_, x)), bench(partial(y.copy_, x), graph=False))
    del x, y
    return 2 * n * 2 / ms / 1e6


def make_cache(gen: torch.Generator, B: int, C: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Caches for contexts up to C; S_max = C + 128 (a multiple of 128, as the runtime should
    allocate it: the score write-out then needs no key mask). Filled one request at a time
    (no single random op over >= 2^31 elements: an illegal-address crash at B=16 C=128K came at
    the first sync after such a fill) and synchronised, so a setup failure is reported here and
    not by the next timed kernel."""
    S = C + 128
    k = torch.empty(B, S, HKV, D, device=DEV, dtype=torch.bfloat16)
    v = torch.empty_like(k)
    for b in range(B):
        k[b].normal_(generator=gen)
        v[b].normal_(generator=gen)
    torch.cuda.synchronize()
    return k, v


def big_cache(B: int, C: int) -> bool:
    """True when the cache spans >= 2^31 elements (B=16 C=128K): the shapes run last, after
    everything else is measured, because an illegal address there kills the CUDA context."""
    return B * (C + 128) * HKV * D >= 2**31


class ContextLost(RuntimeError):
    """A sticky CUDA error (illegal address, ...): nothing else can run in this process."""


def failed(out: list[dict[str, Any]], kind: str, e: BaseException, **shape: Any) -> None:
    """Record a failed shape as a CSV row (kind `error`, ms empty); raise ContextLost when the
    CUDA context is gone (probed with a synchronize), else let the run go on."""
    msg = f"{kind} FAILED: {type(e).__name__}: {e}".replace("\n", " ")[:300]
    out.append(row("error", note=msg, **shape))
    print(f"error   {shape} {msg}", flush=True)
    try:
        torch.cuda.synchronize()
    except Exception as e2:  # the probe itself failing is the answer
        raise ContextLost(msg) from e2
    if "illegal" in str(e) or "unspecified launch failure" in str(e):
        raise ContextLost(msg) from e


def verify_inputs(gen: torch.Generator, B: int, C: int, NQ: int
                  ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor]:
    """Cache copies to rotate over (`n_copies`), cache_lens [B] = C, q [B, NQ, HQ, D]."""
    caches = [make_cache(gen, B, C) for _ in range(n_copies(kv_bytes(B, C)))]
    lens = torch.full((B,), C, dtype=torch.int32, device=DEV)
    q = torch.randn(B, NQ, HQ, D, generator=gen, device=DEV, dtype=torch.bfloat16)
    return caches, lens, q


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
    mask = torch.ones(NQ, C, dtype=torch.bool, device=DEV).tril(C - NQ)
    f = torch.nn.functional.scaled_dot_product_attention
    return bench(lambda: f(qt, kt, vt, attn_mask=mask, scale=SCALE, enable_gqa=True))


def bench_verify(args: argparse.Namespace, copy_bw: float, out: list[dict[str, Any]],
                 big: bool = False) -> None:
    """Verify attention over the B × C × NQ grid, collect none / first_last (/ all without
    --quick). `big` selects the caches of >= 2^31 elements (run last), else the others. A
    failing shape is recorded (`failed`) and the grid goes on."""
    gen = torch.Generator(device=DEV).manual_seed(0)
    for C in args.contexts:
        for B in args.batches:
            if kv_bytes(B, C) > 40e9 or big_cache(B, C) != big:
                continue
            try:
                verify_shape(args, copy_bw, out, gen, B, C)
            except ContextLost:
                raise
            except Exception as e:  # noqa: BLE001 - one shape must not stop the run
                failed(out, "verify", e, batch=B, context=C)
            torch.cuda.empty_cache()


def verify_shape(args: argparse.Namespace, copy_bw: float, out: list[dict[str, Any]],
                 gen: torch.Generator, B: int, C: int) -> None:
    caches = [make_cache(gen, B, C) for _ in range(n_copies(kv_bytes(B, C)))]
    k, v = caches[0]
    lens = torch.full((B,), C, dtype=torch.int32, device=DEV)
    for NQ in args.n_query:
        q = torch.randn(B, NQ, HQ, D, generator=gen, device=DEV, dtype=torch.bfloat16)
        base = None
        collects = ("none", "first_last") if args.quick else ("none", "first_last", "all")
        best = min_of_rounds({c: verify_call(caches, q, lens, c, C) for c in collects},
                             args.rounds)
        for collect in collects:
            cfg = launch_label(B, NQ, C, collect)
            ms = best[collect]
            gb = kv_bytes(B, C) / ms / 1e6
            base = ms if collect == "none" else base
            assert base is not None
            out.append(row("verify", batch=B, context=C, n_query=NQ, collect=collect,
                           ms=ms, gbps=gb, ratio_copy=gb / copy_bw,
                           overhead_pct=100 * (ms / base - 1), config=cfg))
            print_row(out[-1])
        assert base is not None
        score_floor(out, caches, B, C, NQ, base)
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
    del k, v, caches


def min_of_rounds(calls: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Each call timed `rounds` times, interleaved (order reversed every other round), keeping
    its fastest time: one CUDA-graph timing of a Collect-2-Query verify at B=4 C=128K varied
    0.518-0.586 ms back to back (git show 65890e3:benchmarks/results/h200/select_probe_run12.log), and
    noise only ever adds time."""
    best = {name: math.inf for name in calls}
    for r in range(max(1, rounds)):
        for name in (list(calls) if r % 2 == 0 else list(reversed(calls))):
            best[name] = min(best[name], bench(calls[name]))
    return best


def launch_label(B: int, NQ: int, C: int, collect: str, **kw: Any) -> str:
    """The launch config verify_attention picks for this call (M tile, splits, tiles)."""
    from vegas_sim.kernels import verify_launch as vl

    block_m, cfg = vl.launch_config(B, HKV, NQ, HQ // HKV, C, vl.num_sms(torch.device(DEV)),
                                    collect, min_m=kw.get("min_m"))
    return f"m{block_m} {cfg.label()}"


def verify_call(caches: list[tuple[torch.Tensor, torch.Tensor]], q: torch.Tensor,
                lens: torch.Tensor, collect: str, C: int, **kw: Any) -> Callable[[], Any]:
    """verify_attention over the cache copies in turn (see `rotating`)."""
    from vegas_sim.kernels import verify_attention as va

    return rotating([partial(va.verify_attention, q, kk, vv, lens, SCALE, collect, max_len=C,
                             **kw) for kk, vv in caches])


TUNE_SHAPES = [(1, 32768, 8), (1, 131072, 16), (4, 32768, 16), (4, 131072, 8),
               (16, 32768, 16)]


def tune_candidates(B: int, C: int, NQ: int, n_sms: int) -> list[Any]:
    """The heuristic config, its neighbours in splits (the full-wave counts around it, ×2) and
    tile sizes; 128-key tiles with 4 stages only at M <= 32 (shared memory)."""
    from vegas_sim.kernels import verify_launch as vl

    auto = vl.choose_config(B, HKV, NQ, HQ // HKV, C, n_sms)
    block_m = max(vl.MIN_M_DEFAULT, 1 << (NQ * HQ // HKV - 1).bit_length())
    waves = sorted({s for s in (auto.splits, max(1, auto.splits // 2), 2 * auto.splits,
                                max(1, n_sms // (B * HKV)), max(1, 2 * n_sms // (B * HKV)))})
    out = [auto]
    for splits in waves:
        for block_n in (64, 128):
            for stages in (3, 4):
                if block_n == 128 and stages == 4 and block_m >= 64:
                    continue
                cfg = vl.VerifyConfig(splits, block_n, 4, stages)
                if cfg not in out:
                    out.append(cfg)
    return out


def bench_tune(args: argparse.Namespace, copy_bw: float, out: list[dict[str, Any]]) -> None:
    """Time launch configs of verify attention (collect none) at a few shapes; print the best
    and a `TUNED` line when it beats the heuristic by > 3 %."""
    from vegas_sim.kernels import verify_launch as vl

    gen = torch.Generator(device=DEV).manual_seed(1)
    n_sms = vl.num_sms(torch.device(DEV))
    for B, C, NQ in TUNE_SHAPES:
        caches, lens, q = verify_inputs(gen, B, C, NQ)
        timed: list[tuple[float, Any]] = []
        for i, cfg in enumerate(tune_candidates(B, C, NQ, n_sms)):
            label = cfg.label() + (" (auto)" if i == 0 else "")
            try:
                ms = bench(verify_call(caches, q, lens, "none", C, splits=cfg.splits,
                                       block_n=cfg.block_n, num_warps=cfg.num_warps,
                                       num_stages=cfg.num_stages))
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
            block_m = max(vl.MIN_M_DEFAULT, 1 << (NQ * HQ // HKV - 1).bit_length())
            print(f"    TUNED: ({n_sms}, {B * HKV}, {block_m}, {C.bit_length() - 1}): "
                  f"VerifyConfig({best.splits}, {best.block_n}, {best.num_warps}, "
                  f"{best.num_stages}),  # {ratio:.2f} of copy", flush=True)
        del caches
        torch.cuda.empty_cache()


VARIANT_SHAPES = [(4, 131072, 8), (16, 32768, 8), (4, 32768, 1)]


def bench_variants(args: argparse.Namespace, copy_bw: float, out: list[dict[str, Any]]) -> None:
    """--tune: the M tile minimum (16: mma.sync, 64: wgmma) with and without Collect-2-Query
    at the shapes that missed the verify target, so a run can confirm or flip the defaults
    (MIN_M_DEFAULT, MIN_M_COLLECT). Rows kind=variant."""
    from vegas_sim.kernels import verify_launch as vl

    gen = torch.Generator(device=DEV).manual_seed(5)
    n_sms = vl.num_sms(torch.device(DEV))
    for B, C, NQ in VARIANT_SHAPES:
        caches, lens, q = verify_inputs(gen, B, C, NQ)
        base: dict[int, float] = {}
        for label, collect, kw in sweep_verify_variants(B, C, NQ, n_sms)[:4]:
            ms = bench(verify_call(caches, q, lens, collect, C, **kw))
            gb = kv_bytes(B, C) / ms / 1e6
            if collect == "none":
                base[kw["min_m"]] = ms
            ovh = 100 * (ms / base[kw["min_m"]] - 1)
            out.append(row("variant", batch=B, context=C, n_query=NQ, collect=collect, ms=ms,
                           gbps=gb, ratio_copy=gb / copy_bw, overhead_pct=ovh, config=label))
            print(f"variant B={B:2d} C={C:6d} NQ={NQ:2d} {label:16s} ms={ms:.4f} "
                  f"copy={gb / copy_bw:.2f} ovh%={ovh:5.1f}", flush=True)
        del caches
        torch.cuda.empty_cache()


# DESIGN.md's sparse target, ms <= 1.3 x (selected bytes / copy bandwidth) + launch, as the
# ratio that must stay <= 1.3. (Runs 1-31 divided ms by (bytes / copy + launch), which also
# gave the launch term the 1.3 allowance.)
SPARSE_RATIO = "(ms - launch) / (bytes / copy)"


def sparse_ratio(ms: float, launch: float, nbytes: float, copy_bw: float) -> float:
    return (ms - launch) / (nbytes / copy_bw / 1e6)


def random_selection(gen: torch.Generator, B: int, n: int, K: int) -> torch.Tensor:
    """int32 [B, K]: K distinct random slots of [0, n) per request, unsorted."""
    return torch.stack([torch.randperm(n, generator=gen, device=DEV)[:K]
                        for _ in range(B)]).int()


def sparse_launch_ms(gen: torch.Generator, **knobs: Any) -> float:
    """The sparse target's "launch": the same op on 2 keys (one selected, one tail)."""
    from vegas_sim.kernels import sparse_attention as sa

    q1 = torch.randn(1, HQ, D, device=DEV, dtype=torch.bfloat16)
    k1, v1 = make_cache(gen, 1, 64)
    one = torch.ones(1, dtype=torch.int32, device=DEV)
    idx1 = torch.zeros(1, 1, dtype=torch.int32, device=DEV)
    return bench(lambda: sa.sparse_draft_attention(q1, k1, v1, idx1, one, one, one + 1, SCALE,
                                                   **knobs))


def bench_sparse(args: argparse.Namespace, copy_bw: float, out: list[dict[str, Any]],
                 big: bool = False) -> None:
    """Sparse draft attention at C >= 32K; `big` as in bench_verify. Failures are recorded."""
    gen = torch.Generator(device=DEV).manual_seed(2)
    launch = sparse_launch_ms(gen)
    out.append(row("sparse", batch=1, context=2, ms=launch,
                   note="launch: the same op on 2 keys, CUDA-graph replayed"))
    for C in [c for c in args.contexts if c >= LONG_C]:
        for B in args.batches:
            if kv_bytes(B, C) > 40e9 or big_cache(B, C) != big:
                continue
            try:
                sparse_shape(args, copy_bw, out, gen, B, C, launch)
            except ContextLost:
                raise
            except Exception as e:  # noqa: BLE001 - one shape must not stop the run
                failed(out, "sparse", e, batch=B, context=C)
            torch.cuda.empty_cache()


def sparse_shape(args: argparse.Namespace, copy_bw: float, out: list[dict[str, Any]],
                 gen: torch.Generator, B: int, C: int, launch: float) -> None:
    from vegas_sim.kernels import sparse_attention as sa

    caches = [make_cache(gen, B, C) for _ in range(n_copies(kv_bytes(B, C)))]
    q = torch.randn(B, HQ, D, generator=gen, device=DEV, dtype=torch.bfloat16)
    for s in ((0.01, 0.05, 0.2) if args.quick else (0.01, 0.05, 0.1, 0.2)):
        K = math.ceil(s * C)
        n = torch.full((B,), K, dtype=torch.int32, device=DEV)
        tail = torch.full((B,), C, dtype=torch.int32, device=DEV)
        lens = tail + 4
        calls = []
        for i in range(max(len(caches), n_copies(kv_bytes(B, K)))):
            idx = random_selection(gen, B, C, K)
            kk, vv = caches[i % len(caches)]
            calls.append(partial(sa.sparse_draft_attention, q, kk, vv, idx, n, tail,
                                 lens, SCALE))
        ms = bench(rotating(calls))
        byt = kv_bytes(B, K + 4)
        out.append(row("sparse", batch=B, context=C, sparsity=s, ms=ms,
                       gbps=byt / ms / 1e6, ratio_copy=byt / ms / 1e6 / copy_bw,
                       note=f"{SPARSE_RATIO} = {sparse_ratio(ms, launch, byt, copy_bw):.2f}"))
        print_row(out[-1])
    del caches, calls


def qwen3_8b_gemm_ms(tokens: int) -> float:
    """Measured: the per-layer bf16 GEMMs of Qwen3-8B (qkv, o, gate+up, down) for `tokens`
    rows, × 36 layers, + lm_head. Norms, RoPE, sampling are not included."""
    h, ffn, vocab = 4096, 12288, 151936
    x = torch.randn(tokens, h, device=DEV, dtype=torch.bfloat16)
    y = torch.randn(tokens, ffn, device=DEV, dtype=torch.bfloat16)
    ws = [torch.randn(n, h, device=DEV, dtype=torch.bfloat16) * 0.02
          for n in (h + 2 * 1024, h, 2 * ffn)]
    wd = torch.randn(h, ffn, device=DEV, dtype=torch.bfloat16) * 0.02
    wl = torch.randn(vocab, h, device=DEV, dtype=torch.bfloat16) * 0.02

    def layer() -> None:
        for w in ws:
            torch.nn.functional.linear(x, w)
        torch.nn.functional.linear(y, wd)

    per_layer = bench(layer)
    head = bench(lambda: torch.nn.functional.linear(x[-1:].expand(tokens, h), wl))
    return LAYERS * per_layer + head


def bench_radix_topk(weights: torch.Tensor, K: int, out: list[dict[str, Any]]) -> float | None:
    """vegas_sim.kernels.topk.radix_topk on the selection's [36, B, S] weights: checked
    against torch.topk by values on every row and for the same index order in two calls, then
    timed (the returned time); None if it differs or fails."""
    from vegas_sim.kernels import topk

    try:
        got = topk.radix_topk(weights, K)
        want = torch.topk(weights, K, dim=-1, sorted=True).values
        same = bool(torch.equal(weights.gather(-1, got.long()).sort(-1, descending=True).values,
                                want)) and bool(torch.equal(topk.radix_topk(weights, K), got))
        ms = bench(lambda: topk.radix_topk(weights, K))
    except ContextLost:
        raise
    except Exception as e:  # noqa: BLE001 - a failed candidate is a result
        failed(out, "select radix_topk", e, batch=weights.shape[1], context=weights.shape[2])
        return None
    verdict = ("same values as torch.topk, same order twice" if same
               else "DIFFERS from torch.topk (or between calls)")
    out.append(row("select", batch=weights.shape[1], n_query=SELECT_SHAPE[2], ms=ms,
                   note=f"radix_topk_36_layers ({verdict})"))
    print(f"radix_topk of 36 layers: {ms:.3f} ms, {verdict}", flush=True)
    return ms if same else None


def draft_attention_ms(gen: torch.Generator, k: torch.Tensor, v: torch.Tensor, context: int,
                       budget: int, gamma: int) -> float:
    """One layer's sparse draft attention in a draft phase of `gamma` steps over the caches
    k, v [B, S, HKV, D] holding `context` tokens: `budget` selected slots of the verified context per request plus the
    forced tail at the phase's middle step. The calls rotate over index sets of different
    random slots, so one call's slots have left the L2 when its set comes back."""
    from vegas_sim.kernels import sparse_attention as sa

    B = k.shape[0]
    verified = context - gamma - 1  # what the last verify accepted (the selection ranked it)
    q = torch.randn(B, HQ, D, generator=gen, device=DEV, dtype=torch.bfloat16)
    n = torch.full((B,), budget, dtype=torch.int32, device=DEV)
    tail = torch.full((B,), verified, dtype=torch.int32, device=DEV)
    lens = tail + (gamma + 1) // 2
    calls = []
    for _ in range(n_copies(kv_bytes(B, budget))):
        idx = random_selection(gen, B, verified, budget)
        calls.append(partial(sa.sparse_draft_attention, q, k, v, idx, n, tail, lens, SCALE))
    return bench(rotating(calls))


# The selection share's two denominators (row notes start with these): DESIGN.md's iteration
# (γ draft steps + the verify pass: the target's), and the verify pass alone.
SHARE_OF_ITERATION = "share of the iteration"
SHARE_OF_VERIFY = "share of the verify pass"


def fp8_weights(out: list[dict[str, Any]], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                lens: torch.Tensor, lse2: torch.Tensor, rank: torch.Tensor,
                copy_bw: float) -> None:
    """score_weights of all 36 layers in one launch from fp8 scores (kernels/reference.py,
    LogScores), beside the bf16 line of bench_selection: row note
    score_weights_36_layers_one_launch_fp8. A failure is recorded, the step goes on."""
    from vegas_sim.kernels import ops
    from vegas_sim.kernels import verify_attention as va

    B, C = k.shape[0], int(lens.max())
    try:
        _, _, sc = va.verify_attention(q, k, v, lens, SCALE, "first_last", max_len=C,
                                       score_format="fp8")
        assert isinstance(sc, ops.LogScores)
        every = ops.LogScores(sc.d.repeat(LAYERS, 1, 1, 1), sc.m.repeat(LAYERS, 1, 1, 1))
        ms = bench(partial(ops.score_weights, every, lse2.repeat(LAYERS, 1, 1), SCALE,
                           rank.repeat(LAYERS)))
    except ContextLost:
        raise
    except Exception as e:  # noqa: BLE001 - the bf16 selection line does not depend on it
        failed(out, "select fp8 weights", e, batch=B, context=C)
        return
    nbytes = LAYERS * (sc.d.numel() + sc.m.numel() * 4.0 + B * sc.d.shape[-1] * 4.0)
    gbps = nbytes / ms / 1e6
    out.append(row("select", batch=B, context=C, n_query=q.shape[1], ms=ms, gbps=gbps,
                   ratio_copy=gbps / copy_bw, note="score_weights_36_layers_one_launch_fp8"))
    print(f"score_weights of 36 layers in one launch, fp8 scores: {ms:.3f} ms "
          f"({gbps / copy_bw:.2f} of copy)", flush=True)


def bench_selection(args: argparse.Namespace, copy_bw: float, out: list[dict[str, Any]]) -> None:
    """Vegas selection at B=4, C=128K (NQ 8, Collect-2-Query: γ 7) as a share of one
    iteration (7 sparse draft steps + the verify pass) and of the verify pass alone."""
    from vegas_sim.kernels import ops
    from vegas_sim.kernels import verify_attention as va

    B, C, NQ = SELECT_SHAPE
    gen = torch.Generator(device=DEV).manual_seed(3)
    k, v = make_cache(gen, B, C)
    lens = torch.full((B,), C, dtype=torch.int32, device=DEV)
    q = torch.randn(B, NQ, HQ, D, generator=gen, device=DEV, dtype=torch.bfloat16)
    t = min_of_rounds({c: partial(va.verify_attention, q, k, v, lens, SCALE, c, max_len=C)
                       for c in ("none", "first_last")}, args.rounds)
    plain, coll = t["none"], t["first_last"]
    _, lse, scores = va.verify_attention(q, k, v, lens, SCALE, "first_last", max_len=C)
    assert isinstance(scores, torch.Tensor)  # bf16, the default format
    assert scores is not None
    lse2 = lse[:, [0, NQ - 1]].contiguous()
    rank = lens - NQ + 1
    copies = [scores] + [scores.clone() for _ in range(n_copies(scores.numel() * 2) - 1)]
    w_ms = bench(rotating([partial(ops.score_weights, sc, lse2, SCALE, rank)
                           for sc in copies]))
    w = ops.score_weights(scores, lse2, SCALE, rank)
    del copies
    weights = torch.stack([w] * LAYERS)  # [36, B, S]
    budget = torch.full((B,), math.ceil(0.07 * (C - NQ + 1)), dtype=torch.int32, device=DEV)
    K = int(budget[0])
    # topk_select reads max(budget) on the host (one sync, not capturable); its GPU work is
    # this one torch.topk, timed under a graph. The eager op is in the CSV too.
    topk_ms = bench(partial(torch.topk, weights, K, dim=-1, sorted=False))
    topk_eager_ms = bench(partial(ops.topk_select, weights, budget), graph=False)
    topk_sorted_ms = bench(partial(torch.topk, weights, K, dim=-1, sorted=True))
    radix_ms = bench_radix_topk(weights, K, out)
    sparse_ms = draft_attention_ms(gen, k, v, C, K, NQ - 1)
    fp8_weights(out, q, k, v, lens, lse2, rank, copy_bw)
    del k, v, weights
    torch.cuda.empty_cache()
    # What the runtime does for Vegas (policies.CollectingVerifyAttention keeps every layer's
    # scores and folds them after the last layer): all 36 layers' scores in one launch,
    # [36·B, R, Hq, S]; 36 launches of one layer (w_ms, above) beside it.
    scores36 = scores.repeat(LAYERS, 1, 1, 1)
    w36_ms = bench(partial(ops.score_weights, scores36, lse2.repeat(LAYERS, 1, 1), SCALE,
                           rank.repeat(LAYERS)))
    w36_gbps = LAYERS * (scores.numel() * 2.0 + B * scores.shape[-1] * 4.0) / w36_ms / 1e6
    out.append(row("select", batch=B, context=C, n_query=NQ, ms=w36_ms, gbps=w36_gbps,
                   ratio_copy=w36_gbps / copy_bw, note="score_weights_36_layers_one_launch"))
    print(f"score_weights of 36 layers in one launch: {w36_ms:.3f} ms ({w36_gbps / copy_bw:.2f} "
          f"of copy) vs 36 launches {LAYERS * w_ms:.3f} ms", flush=True)
    del scores36
    torch.cuda.empty_cache()
    gemm = qwen3_8b_gemm_ms(B * NQ)
    verify_iter = LAYERS * coll + gemm
    # DESIGN.md's iteration: γ = NQ - 1 sparse draft steps, then the verify pass. Both phases
    # are priced by their GEMMs and attention only (no norms, RoPE, sampling), so the
    # iteration is a lower bound and the share an upper bound on the runtime's.
    draft_gemm = qwen3_8b_gemm_ms(B)
    draft_step = draft_gemm + LAYERS * sparse_ms
    iteration = verify_iter + (NQ - 1) * draft_step
    # the top-k that topk_select runs for equal budgets on the GPU (selection.RADIX_TOPK)
    from vegas_sim.kernels.verify_launch import OVERRIDES

    topk_used = radix_ms if OVERRIDES.radix_topk and radix_ms is not None else topk_ms
    select = w36_ms + topk_used
    collect_extra = LAYERS * (coll - plain)
    for name, ms in [("verify_attention_plain_x36", LAYERS * plain),
                     ("verify_attention_c2q_x36", LAYERS * coll),
                     ("gemm_measured", gemm), ("draft_gemm_measured", draft_gemm),
                     ("sparse_draft_attention_x36", LAYERS * sparse_ms),
                     (f"draft_step (gemm + 36 sparse attention), x{NQ - 1} per iteration",
                      draft_step),
                     ("score_weights_x36_launches", LAYERS * w_ms),
                     ("topk_36_layers", topk_ms), ("topk_36_layers_sorted", topk_sorted_ms),
                     ("topk_select_eager_with_host_sync", topk_eager_ms)]:
        out.append(row("select", batch=B, context=C, n_query=NQ, ms=ms, note=name))
    w_bytes = scores.numel() * 2.0 + B * scores.shape[-1] * 4.0  # bf16 scores in, fp32 out
    out.append(row("select", batch=B, context=C, n_query=NQ, ms=w_ms,
                   gbps=w_bytes / w_ms / 1e6, ratio_copy=w_bytes / w_ms / 1e6 / copy_bw,
                   note="score_weights one layer (bytes = scores read + weights written)"))
    print(f"score_weights one layer: {w_ms * 1e3:.1f} us for {w_bytes / 1e6:.1f} MB = "
          f"{w_bytes / w_ms / 1e6 / copy_bw:.2f} of copy", flush=True)
    sel_ms = select + collect_extra
    share_verify = sel_ms / verify_iter
    share = sel_ms / iteration
    out.append(row("select", batch=B, context=C, n_query=NQ, ms=sel_ms,
                   overhead_pct=100 * share_verify,
                   note=f"{SHARE_OF_VERIFY}: selection (collect extra + weights + topk) / "
                        "(36 x C2Q attention + measured GEMMs)"))
    out.append(row("select", batch=B, context=C, n_query=NQ, ms=sel_ms,
                   overhead_pct=100 * share,
                   note=f"{SHARE_OF_ITERATION}: selection / ({NQ - 1} draft steps + the "
                        f"verify pass = {iteration:.3f} ms)"))
    print(f"Vegas selection at B=4 C=128K: {sel_ms:.3f} ms "
          f"(weights {w36_ms:.3f} in one launch [36 launches {LAYERS * w_ms:.3f}], "
          f"topk {topk_used:.3f} [torch.topk {topk_ms:.3f}, "
          f"sorted {topk_sorted_ms:.3f}], collect {collect_extra:.3f})\n"
          f"  = {100 * share:.1f} % of a {iteration:.3f} ms iteration ({NQ - 1} draft steps of "
          f"{draft_step:.3f} ms [gemm {draft_gemm:.3f}, sparse attention x36 "
          f"{LAYERS * sparse_ms:.3f}] + a {verify_iter:.3f} ms verify pass [gemm {gemm:.3f}])\n"
          f"  = {100 * share_verify:.1f} % of the verify pass alone", flush=True)
    if radix_ms is not None and topk_used != radix_ms:
        alt = (select - topk_used + radix_ms + collect_extra) / iteration
        out.append(row("select", batch=B, context=C, n_query=NQ,
                       ms=select - topk_used + radix_ms + collect_extra, overhead_pct=100 * alt,
                       note="selection share of the iteration with radix_topk "
                            "(VEGAS_SIM_RADIX_TOPK=0 in this run)"))
        print(f"  with radix_topk instead (RADIX_TOPK off in this run): {100 * alt:.1f} %",
              flush=True)


C2Q_SHAPES = [(4, 131072, 8), (16, 32768, 8), (1, 32768, 8), (4, 131072, 1), (4, 131072, 16)]
# collect="none" lines beside the candidates: the M 64 tile alone, and deeper pipelines
C2Q_NONE_CANDIDATES: list[tuple[str, dict[str, Any]]] = [
    ("none m64", {"min_m": 64}), ("none st4", {"num_stages": 4}),
    ("none m64 st4", {"min_m": 64, "num_stages": 4}),
]
# (label, launch knobs) of each Collect-2-Query candidate; the verify kernel stores the
# collected rows of its main score tile ("rows"; a separate dot and a dense slice of the
# leading rows were measured no faster and are gone, docs/KERNELS.md). The per-collection M
# default (64 at NQ·G > 16) is the default.
C2Q_CANDIDATES: list[tuple[str, dict[str, Any]]] = [
    ("rows m16", {"min_m": 16}),
    ("rows m64", {"min_m": 64}),
    ("rows m16 n64", {"min_m": 16, "block_n": 64}),
    # deeper pipelines of the M 64 tile (st 4 won their first H200 sweep: 2.9 / 4.5 / 10.0 %
    # vs st 3's 6.4 / 12.3 / 15.5 %; w8, st2, n32, n128 lost by 20-70 points)
    ("rows m64 st4", {"min_m": 64, "num_stages": 4}),
    ("rows m64 st5", {"min_m": 64, "num_stages": 5}),
    ("rows m64 st6", {"min_m": 64, "num_stages": 6}),
    ("rows m16 n64 st4", {"min_m": 16, "block_n": 64, "num_stages": 4}),
]
# Score formats (kernels/reference.py, SCORE_FORMATS) timed beside the plain verify at every
# C2Q_SHAPES shape, each at the default launch, interleaved over --rounds (min_of_rounds):
# rows kind=c2q_format, config = the format, overhead_pct against the none call of the same
# rounds; C2Q_TARGET_PCT is DESIGN.md's Collect-2-Query target.
C2Q_FORMATS = ("bf16", "fp8")
C2Q_TARGET_PCT = 6.0
# The score bytes' floor: the same [B, 2, Hq, S_max] bf16 written by a plain fill, over the
# collect="none" call (what Collect-2-Query would cost if its stores cost only their bytes).
C2Q_FLOOR = "score bytes by a plain fill / none"


def bench_c2q_candidates(args: argparse.Namespace, copy_bw: float,
                         out: list[dict[str, Any]]) -> None:
    """One line per Collect-2-Query candidate at the three target shapes: ms and overhead %
    over the default collect="none" call (rows kind=c2q). Also the none call at M 64, to
    separate the tile change from the store."""
    from vegas_sim.kernels import verify_launch as vl

    gen = torch.Generator(device=DEV).manual_seed(7)
    G = HQ // HKV
    for B, C, NQ in C2Q_SHAPES:
        try:
            caches, lens, q = verify_inputs(gen, B, C, NQ)
            torch.cuda.synchronize()
            base = bench(verify_call(caches, q, lens, "none", C))
            default = {"min_m": vl.default_min_m(NQ, G, "first_last")}
            cands = [(label, "none", kw) for label, kw in C2Q_NONE_CANDIDATES] + [
                (label, "first_last", kw) for label, kw in C2Q_CANDIDATES]
            for label, collect, kw in cands:
                if kw == default:
                    label += " (default)"
                try:
                    ms = bench(verify_call(caches, q, lens, collect, C, **kw))
                except ContextLost:
                    raise
                except Exception as e:  # noqa: BLE001 - a candidate may not compile
                    failed(out, f"c2q {label}", e, batch=B, context=C, n_query=NQ)
                    continue
                gb = kv_bytes(B, C) / ms / 1e6
                ovh = 100 * (ms / base - 1)
                out.append(row("c2q", batch=B, context=C, n_query=NQ, collect=collect, ms=ms,
                               gbps=gb, ratio_copy=gb / copy_bw, overhead_pct=ovh,
                               config=label, note=f"none (default) {base:.4f} ms"))
                print(f"c2q     B={B:2d} C={C:6d} NQ={NQ:2d} {label:22s} ms={ms:.4f} "
                      f"none={base:.4f} ovh%={ovh:6.1f}", flush=True)
            c2q_formats(args, copy_bw, out, caches, lens, q, B, C, NQ)
            del caches
        except ContextLost:
            raise
        except Exception as e:  # noqa: BLE001 - one shape must not stop the run
            failed(out, "c2q", e, batch=B, context=C, n_query=NQ)
        torch.cuda.empty_cache()


def c2q_formats(args: argparse.Namespace, copy_bw: float, out: list[dict[str, Any]],
                caches: list[Any], lens: torch.Tensor, q: torch.Tensor, B: int, C: int,
                NQ: int) -> None:
    """The plain verify and Collect-2-Query in every score format at the default launch,
    interleaved (min_of_rounds): rows kind=c2q_format, overhead % against this none call."""
    calls = {"none": verify_call(caches, q, lens, "none", C)}
    for fmt in C2Q_FORMATS:
        calls[fmt] = verify_call(caches, q, lens, "first_last", C, score_format=fmt)
    try:
        best = min_of_rounds(calls, args.rounds)
    except ContextLost:
        raise
    except Exception as e:  # noqa: BLE001 - a format that fails is a result
        failed(out, "c2q_format", e, batch=B, context=C, n_query=NQ)
        return
    base = best["none"]
    for fmt in C2Q_FORMATS:
        ms = best[fmt]
        gb = kv_bytes(B, C) / ms / 1e6
        ovh = 100 * (ms / base - 1)
        out.append(row("c2q_format", batch=B, context=C, n_query=NQ, collect="first_last",
                       ms=ms, gbps=gb, ratio_copy=gb / copy_bw, overhead_pct=ovh, config=fmt,
                       note=f"none {base:.4f} ms, same rounds"))
        print(f"c2q_fmt B={B:2d} C={C:6d} NQ={NQ:2d} {fmt:5s} ms={ms:.4f} none={base:.4f} "
              f"ovh%={ovh:6.1f} (target <= {C2Q_TARGET_PCT:.0f} %: "
              f"{_verdict(ovh <= C2Q_TARGET_PCT)})", flush=True)


def format_summary(rows: list[dict[str, Any]]) -> None:
    """The c2q_format rows: overhead % of each score format per shape, with its verdict
    against C2Q_TARGET_PCT, and the worst shape per format."""
    fr = [r for r in rows if r["kind"] == "c2q_format" and r["ms"] != ""]
    if not fr:
        return
    fmts = list(dict.fromkeys(str(r["config"]) for r in fr))
    shapes = sorted({(r["batch"], r["context"], r["n_query"]) for r in fr})
    print(f"\nCollect-2-Query by score format, overhead % over collect=none (same rounds; "
          f"target <= {C2Q_TARGET_PCT:.0f} %):")
    print(f"  {'shape':20s}" + "".join(f"{f:>16s}" for f in fmts))
    for b, c, n in shapes:
        cells = []
        for f in fmts:
            hit = [r for r in fr if r["config"] == f and (r["batch"], r["context"],
                                                          r["n_query"]) == (b, c, n)]
            if hit:
                ovh = hit[0]["overhead_pct"]
                cells.append(f"{ovh:9.1f} {_verdict(ovh <= C2Q_TARGET_PCT)}".rjust(16))
            else:
                cells.append(f"{'-':>16}")
        print(f"  {f'B{b} C{c // 1024}K NQ{n}':20s}" + "".join(cells))
    for f in fmts:
        worst = max((r for r in fr if r["config"] == f), key=lambda r: r["overhead_pct"])
        print(f"  {f}: max {worst['overhead_pct']:.1f} % at B={worst['batch']} "
              f"C={worst['context']} NQ={worst['n_query']} -> "
              f"{_verdict(worst['overhead_pct'] <= C2Q_TARGET_PCT)}")


def score_floor(out: list[dict[str, Any]], caches: list[Any], B: int, C: int, NQ: int,
                base: float) -> None:
    """The Collect-2-Query scores' bytes written by a plain fill (rotated past the L2), as an
    overhead over the none call: what the store costs at the write bandwidth alone."""
    S = caches[0][0].shape[1]
    R = 2 if NQ > 1 else 1
    bufs = [torch.empty(B, R, HQ, S, dtype=torch.bfloat16, device=DEV)
            for _ in range(n_copies(B * R * HQ * S * 2.0))]
    ms = bench(rotating([partial(t.fill_, float("-inf")) for t in bufs]))
    out.append(row("c2q_floor", batch=B, context=C, n_query=NQ, collect="first_last", ms=ms,
                   overhead_pct=100 * ms / base, note=f"{C2Q_FLOOR}; none {base:.4f} ms"))
    print_row(out[-1])


# Quest against Stream, one draft step of Qwen3-8B (36 layers + the draft GEMMs), each at the
# same token budget: (B, C) and the sparsity; the index lists sized for the grid's largest
# sparsity (QUEST_TOP_SPARSITY), as the calibration runtime sizes them.
QUEST_SHAPES = [(4, 32768), (4, 122880)]
QUEST_SPARSITY = 0.05
QUEST_TOP_SPARSITY = 0.2
QUEST_PAGE = 16
# The Quest target: (Quest − Stream − launch) per layer over the metadata bytes at the copy
# bandwidth, at most 1.3 (the sparse target's allowance); launch = quest_select on one
# request of 4 pages (its launches alone), CUDA-graph replayed.
QUEST_RATIO = "(quest - stream - launch) / (metadata bytes / copy)"


def quest_metadata(gen: torch.Generator, B: int, C: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random page min/max [B, P, Hkv, D] bf16 (kmax >= kmin) for C tokens."""
    P = -(-C // QUEST_PAGE)
    kmin = torch.randn(B, P, HKV, D, generator=gen, device=DEV).bfloat16()
    kmax = (kmin.float() + torch.rand(B, P, HKV, D, generator=gen, device=DEV)).bfloat16()
    return kmin, kmax


def quest_layer(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor, ctx: torch.Tensor, n_pages: torch.Tensor, lens: torch.Tensor,
                max_pages: int, select: Callable[..., Any] | None = None) -> torch.Tensor:
    """One layer of a Quest draft step, as policies.QuestDraftAttention runs it (`select`:
    the selection op, ops.quest_select unless given)."""
    from vegas_sim.kernels import sparse_attention as sa

    select = quest_select_with(None) if select is None else select
    idx, n_idx = select(q, kmin, kmax, ctx, n_pages, max_pages)
    return sa.sparse_draft_attention(q, k, v, idx, n_idx, ctx, lens, SCALE)


def quest_picks() -> list[str]:
    """quest_select's picks other than the default (ops.quest_select's), each timed beside it
    (the radix levels whose write re-counts the pages before its chunk, and the old
    one-program search, beside the radix default); none where kernels/quest.py has no choice
    of pick."""
    try:
        from vegas_sim.kernels import quest
    except ImportError:
        return []
    return list(getattr(quest, "PICKS", ()))[1:]


def quest_select_with(pick: str | None) -> Callable[..., Any]:
    """ops.quest_select (pick None), or kernels.quest.quest_select with that pick."""
    from vegas_sim.kernels import ops

    if pick is None:
        return ops.quest_select  # type: ignore[no-any-return]
    from vegas_sim.kernels import quest

    return partial(quest.quest_select, pick=pick)


def bench_quest(args: argparse.Namespace, copy_bw: float, out: list[dict[str, Any]]) -> None:
    """Quest draft step against Stream's at the same budget (rows kind=quest): per layer the
    Stream sparse attention, Quest's selection alone, selection + attention, and the
    metadata bytes at the copy bandwidth; then the draft steps (36 layers + measured GEMMs).
    Every other pick of quest_select (`quest_picks`) the same way (rows kind=quest_variant,
    config "pick NAME"), with its own launch cost and ratio."""
    from vegas_sim.kernels import ops
    from vegas_sim.kernels import sparse_attention as sa

    gen = torch.Generator(device=DEV).manual_seed(10)
    one = torch.ones(1, dtype=torch.int32, device=DEV)
    q1 = torch.randn(1, HQ, D, generator=gen, device=DEV, dtype=torch.bfloat16)
    m1 = quest_metadata(gen, 1, 64)
    launch: dict[str | None, float] = {}
    for pick in [None, *quest_picks()]:
        launch[pick] = bench(partial(quest_select_with(pick), q1, *m1, one * 64, one, 1))
        note = "launch: quest_select on 4 pages, CUDA-graph replayed"
        if pick is None:
            out.append(row("quest", batch=1, context=64, ms=launch[pick], note=note))
        else:
            out.append(row("quest_variant", batch=1, context=64, ms=launch[pick],
                           config=f"pick {pick}", note=note))
        print_row(out[-1])
    for B, C in QUEST_SHAPES:
        try:
            quest_shape(out, gen, B, C, copy_bw, launch, ops, sa)
        except ContextLost:
            raise
        except Exception as e:  # noqa: BLE001 - one shape must not stop the run
            failed(out, "quest", e, batch=B, context=C)
        torch.cuda.empty_cache()


def quest_shape(out: list[dict[str, Any]], gen: torch.Generator, B: int, C: int,
                copy_bw: float, launch: dict[str | None, float], ops: Any, sa: Any) -> None:
    budget = math.ceil(QUEST_SPARSITY * C)
    pages = budget // QUEST_PAGE
    max_pages = math.ceil(QUEST_TOP_SPARSITY * C) // QUEST_PAGE + 1
    ctx = torch.full((B,), C, dtype=torch.int32, device=DEV)
    lens = ctx + 4  # the draft tokens of the phase so far (the tail)
    n_pages = torch.full((B,), pages, dtype=torch.int32, device=DEV)
    meta_bytes = 2.0 * B * (C // QUEST_PAGE) * HKV * D * 2
    copies = max(n_copies(meta_bytes), n_copies(kv_bytes(B, budget)))
    caches = [make_cache(gen, B, C) for _ in range(copies)]
    metas = [quest_metadata(gen, B, C) for _ in range(copies)]
    qs = [torch.randn(B, HQ, D, generator=gen, device=DEV, dtype=torch.bfloat16)
          for _ in range(copies)]
    s_idx, s_n = ops.stream_indices(ctx, torch.full((B,), pages * QUEST_PAGE + C % QUEST_PAGE,
                                                    dtype=torch.int32, device=DEV), 16)
    # the runtime's index buffer holds the grid's largest budget (policies.SparseDraftAttention),
    # as Quest's list does: the same sparse-attention launch for both
    cap = torch.full((B, QUEST_PAGE * (max_pages + 1)), -1, dtype=torch.int32, device=DEV)
    cap[:, : s_idx.shape[1]] = s_idx
    s_idx = cap
    stream = bench(rotating([partial(sa.sparse_draft_attention, q, kk, vv, s_idx, s_n, ctx,
                                     lens, SCALE) for q, (kk, vv) in zip(qs, caches)]))
    meta_ms = meta_bytes / copy_bw / 1e6
    gemm = qwen3_8b_gemm_ms(B)
    shape = {"batch": B, "context": C, "sparsity": QUEST_SPARSITY}
    ratios: dict[str, float] = {}
    select = math.nan
    for pick in launch:
        select_fn = quest_select_with(pick)
        sel_ms = bench(rotating([partial(select_fn, q, kmin, kmax, ctx, n_pages, max_pages)
                                 for q, (kmin, kmax) in zip(qs, metas)]))
        quest = bench(rotating([partial(quest_layer, q, kmin, kmax, kk, vv, ctx, n_pages, lens,
                                        max_pages, select_fn)
                                for q, (kmin, kmax), (kk, vv) in zip(qs, metas, caches)]))
        ratio = (quest - stream - launch[pick]) / meta_ms
        ratios["default" if pick is None else pick] = ratio
        if pick is None:
            select = sel_ms
            quest_rows(out, shape, stream, sel_ms, quest, meta_ms, gemm, ratio)
            print(f"quest   B={B} C={C} s={QUEST_SPARSITY}: draft step quest "
                  f"{gemm + LAYERS * quest:.3f} ms / stream {gemm + LAYERS * stream:.3f} ms "
                  f"(gemm {gemm:.3f}); per layer quest_select {sel_ms * 1e3:.1f} us, + "
                  f"attention {quest * 1e3:.1f} us, stream {stream * 1e3:.1f} us, metadata at "
                  f"copy {meta_ms * 1e3:.1f} us, launch {launch[pick] * 1e3:.1f} us; "
                  f"{QUEST_RATIO} = {ratio:.2f}", flush=True)
            continue
        for note, ms in [("quest layer: quest_select alone", sel_ms),
                         ("quest layer: quest_select + sparse attention", quest),
                         ("quest draft step (gemm + 36 layers)", gemm + LAYERS * quest),
                         (f"{QUEST_RATIO} = {ratio:.2f}", LAYERS * (quest - stream))]:
            out.append(row("quest_variant", ms=ms, config=f"pick {pick}", note=note, **shape))
        print(f"quest   B={B} C={C} pick {pick}: draft step quest {gemm + LAYERS * quest:.3f} "
              f"ms; per layer quest_select {sel_ms * 1e3:.1f} us, + attention "
              f"{quest * 1e3:.1f} us, launch {launch[pick] * 1e3:.1f} us", flush=True)
    print(f"quest   B={B} C={C} {QUEST_RATIO} (target <= 1.3): "
          + ", ".join(f"{name} {r:.2f}" for name, r in ratios.items()), flush=True)
    # the sparse attention alone over Quest's lists (scattered 16-token pages) against
    # Stream's window of the same size: what the scatter costs, apart from the selection
    lists = [ops.quest_select(q, kmin, kmax, ctx, n_pages, max_pages)
             for q, (kmin, kmax) in zip(qs, metas)]
    scattered = bench(rotating([partial(sa.sparse_draft_attention, q, kk, vv, idx, n, ctx, lens,
                                        SCALE) for q, (kk, vv), (idx, n)
                                in zip(qs, caches, lists)]))
    out.append(row("quest_variant", ms=scattered, config="attention alone over quest's list",
                   note=f"stream layer {stream:.4f} ms", **shape))
    print(f"quest   B={B} C={C} sparse attention alone: over quest's pages "
          f"{scattered * 1e3:.1f} us, over stream's window {stream * 1e3:.1f} us", flush=True)
    quest_variants(out, B, C, qs, metas, ctx, n_pages, max_pages, select)
    del caches, metas


def quest_rows(out: list[dict[str, Any]], shape: dict[str, Any], stream: float, select: float,
               quest: float, meta_ms: float, gemm: float, ratio: float) -> None:
    """The default quest_select's rows of one shape (kind=quest)."""
    for note, ms in [("stream layer: sparse attention", stream),
                     ("quest layer: quest_select alone", select),
                     ("quest layer: quest_select + sparse attention", quest),
                     ("metadata bytes / copy, one layer", meta_ms),
                     ("draft_gemm_measured", gemm),
                     ("stream draft step (gemm + 36 layers)", gemm + LAYERS * stream),
                     ("quest draft step (gemm + 36 layers)", gemm + LAYERS * quest)]:
        out.append(row("quest", ms=ms, note=note, **shape))
    out.append(row("quest", ms=LAYERS * (quest - stream), overhead_pct=100 * (quest / stream - 1),
                   note=f"{QUEST_RATIO} = {ratio:.2f}", **shape))


# quest_select's launch settings beside the defaults, for a quest.py with one scoring
# kernel and the search pick only (the kernels before the radix pick): its block and warps
QUEST_VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("score p16 w4", {"score_block_p": 16}), ("score p32 w4", {"score_block_p": 32}),
    ("score p64 w4", {"score_block_p": 64}), ("score p32 w8", {"score_block_p": 32,
                                                               "score_warps": 8}),
    ("score p64 w8", {"score_block_p": 64, "score_warps": 8}),
    ("score p128 w8", {"score_block_p": 128, "score_warps": 8}),
]
# the same for a quest.py with a choice of pick (PICKS) and of scoring kernel (score_wide):
# the scoring kernel looped over the KV heads (the default of runtime revision 6 first), the
# wide one's block and warps, the radix pick's chunk, the metadata loads' eviction policy,
# the search's warps
QUEST_PICK_VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("score looped (revision 6)", {"score_wide": False}),
    ("score looped p64 w4", {"score_wide": False, "score_block_p": 64}),
    ("score looped p32 w8", {"score_wide": False, "score_block_p": 32, "score_warps": 8}),
    ("score looped p128 w8", {"score_wide": False, "score_block_p": 128, "score_warps": 8}),
    ("score wide p4 w4", {"score_block_p": 4}), ("score wide p16 w4", {"score_block_p": 16}),
    ("score wide p8 w8", {"score_block_p": 8, "score_warps": 8}),
    ("score wide p8 w2", {"score_block_p": 8, "score_warps": 2}),
    ("radix chunk 64", {"radix_chunk": 64}), ("radix chunk 128", {"radix_chunk": 128}),
    ("radix chunk 256", {"radix_chunk": 256}), ("radix chunk 512", {"radix_chunk": 512}),
    ("radix, metadata loads evict-normal", {"evict_first": False}),
    ("search pick w16", {"pick": "search", "pick_warps": 16}),
]
QUEST_OLD_VARIANTS: list[tuple[str, dict[str, Any]]] = [  # a quest.py with the search only
    ("pick w4", {"pick_warps": 4}), ("pick w16", {"pick_warps": 16}),
]


def quest_variants(out: list[dict[str, Any]], B: int, C: int, qs: list[torch.Tensor],
                   metas: list[Any], ctx: torch.Tensor, n_pages: torch.Tensor,
                   max_pages: int, default_ms: float) -> None:
    """Quest's launches apart (scores, the picks) and quest_select at other launch settings
    (rows kind=quest_variant, ms of one layer's selection); nothing where the package has no
    kernels/quest.py (the kernels before it)."""
    try:
        from vegas_sim.kernels import quest
    except ImportError:
        return
    has_picks = hasattr(quest, "PICKS")
    scores = [quest.quest_scores(q, kmin, kmax, ctx) for q, (kmin, kmax) in zip(qs, metas)]
    timed = [("scores alone", bench(rotating([partial(quest.quest_scores, q, kmin, kmax, ctx)
                                              for q, (kmin, kmax) in zip(qs, metas)]))),
             ("search pick alone", bench(rotating([partial(quest.quest_pick, sc, ctx, n_pages,
                                                           max_pages) for sc in scores])))]
    if has_picks:
        hists = [quest.radix_histograms(q.shape[0], q.device) for q in qs]
        scores = [quest.quest_scores(q, kmin, kmax, ctx, hist=h)
                  for q, (kmin, kmax), h in zip(qs, metas, hists)]
        timed += [("scores + first digit", bench(rotating([
                       partial(scores_with_hist, quest, q, kmin, kmax, ctx)
                       for q, (kmin, kmax) in zip(qs, metas)]))),
                   ("radix pick alone (+ zeroing its levels)", bench(rotating([
                       partial(radix_pick_alone, quest, sc, h, ctx, n_pages, max_pages)
                       for sc, h in zip(scores, hists)])))]
        if "radix_rescan" in quest.PICKS:
            timed += [("radix_rescan pick alone (+ zeroing its levels)", bench(rotating([
                partial(radix_pick_alone, quest, sc, h, ctx, n_pages, max_pages, rescan=True)
                for sc, h in zip(scores, hists)])))]
    for label, kw in (QUEST_PICK_VARIANTS if has_picks else QUEST_VARIANTS + QUEST_OLD_VARIANTS):
        try:
            timed.append((label, bench(rotating([
                partial(quest.quest_select, q, kmin, kmax, ctx, n_pages, max_pages, **kw)
                for q, (kmin, kmax) in zip(qs, metas)]))))
        except ContextLost:
            raise
        except Exception as e:  # noqa: BLE001 - a setting may not build
            failed(out, f"quest_variant {label}", e, batch=B, context=C)
    for label, ms in timed:
        out.append(row("quest_variant", batch=B, context=C, sparsity=QUEST_SPARSITY, ms=ms,
                       config=label, note=f"default quest_select {default_ms:.4f} ms"))
    print(f"quest   B={B} C={C} quest_select {default_ms * 1e3:.1f} us (default); "
          + ", ".join(f"{label} {ms * 1e3:.1f}" for label, ms in timed), flush=True)


def scores_with_hist(quest: Any, q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor,
                     ctx: torch.Tensor) -> torch.Tensor:
    """The radix path's first launches: the zeroed histograms, the scores counting digit 1."""
    return quest.quest_scores(q, kmin, kmax, ctx,  # type: ignore[no-any-return]
                              hist=quest.radix_histograms(q.shape[0], q.device))


def radix_pick_alone(quest: Any, scores: torch.Tensor, hist: torch.Tensor, ctx: torch.Tensor,
                     n_pages: torch.Tensor, max_pages: int, **kw: Any) -> Any:
    """The radix pick on scores whose first digit `hist` holds: its later levels zeroed first
    (they count up on every call); `kw`: quest_pick_radix's settings."""
    hist[:, 1:].zero_()
    return quest.quest_pick_radix(scores, hist, ctx, n_pages, max_pages, **kw)


# gpt-oss-20b's attention (Hq 64, Hkv 8: G 8, D 64) at the paper's 12 verify rows: B, C, NQ
OSS_SHAPE = (64, 8, 64)  # Hq, Hkv, D
OSS_SHAPES = [(1, 32768, 12), (4, 32768, 12), (4, 131072, 12)]
# Vegas paper, gpt-oss-20b at 12 rows: score collection overhead over plain verify
OSS_PAPER_PCT = {"first_last": 37.0, "all": 189.0}


def bench_gpt_oss_collect(args: argparse.Namespace, copy_bw: float,
                          out: list[dict[str, Any]]) -> None:
    """Collect-2 (first_last) and Collect-all overhead over collect none at gpt-oss-20b's
    head ratio and head dimension (rows kind=oss), printed beside the paper's 37 % / 189 %."""
    global HQ, HKV, D, SCALE
    saved = HQ, HKV, D, SCALE
    HQ, HKV, D = OSS_SHAPE
    SCALE = D ** -0.5
    gen = torch.Generator(device=DEV).manual_seed(9)
    try:
        for B, C, NQ in OSS_SHAPES:
            try:
                caches, lens, q = verify_inputs(gen, B, C, NQ)
                base = bench(verify_call(caches, q, lens, "none", C))
                for collect in ("first_last", "all"):
                    ms = bench(verify_call(caches, q, lens, collect, C))
                    ovh = 100 * (ms / base - 1)
                    gb = kv_bytes(B, C) / ms / 1e6
                    paper = OSS_PAPER_PCT[collect]
                    out.append(row("oss", batch=B, context=C, n_query=NQ, collect=collect,
                                   ms=ms, gbps=gb, ratio_copy=gb / copy_bw, overhead_pct=ovh,
                                   config=f"Hq{HQ} Hkv{HKV} D{D}",
                                   note=f"none {base:.4f} ms; paper {paper:.0f} %"))
                    print(f"oss     B={B:2d} C={C:6d} NQ={NQ:2d} {collect:10s} ms={ms:.4f} "
                          f"none={base:.4f} ovh%={ovh:6.1f} (paper {paper:.0f} %)", flush=True)
                del caches
            except ContextLost:
                raise
            except Exception as e:  # noqa: BLE001 - one shape must not stop the run
                failed(out, "oss", e, batch=B, context=C, n_query=NQ)
    finally:
        HQ, HKV, D, SCALE = saved


B1_SPLITS = [(16, 128), (32, 64), (16, 64), (32, 128)]


def bench_b1_configs(args: argparse.Namespace, copy_bw: float,
                     out: list[dict[str, Any]]) -> None:
    """B=1 C=32K verify (collect none): ratio to copy per split count / BLOCK_N, NQ 1, 8, 16
    (rows kind=b1). 8 KV heads give 8 programs per split; n64 tiles need half the shared
    memory of n128 (3 stages: 96 KB vs 192 KB), so two programs can share an SM."""
    gen = torch.Generator(device=DEV).manual_seed(8)
    B, C = 1, B1_CONTEXT
    for NQ in (1, 8, 16):
        caches, lens, q = verify_inputs(gen, B, C, NQ)
        torch.cuda.synchronize()
        auto = launch_label(B, NQ, C, "none")
        for splits, block_n in B1_SPLITS:
            label = f"s{splits} n{block_n}"
            try:
                ms = bench(verify_call(caches, q, lens, "none", C, splits=splits,
                                       block_n=block_n))
            except ContextLost:
                raise
            except Exception as e:  # noqa: BLE001 - out of resources is a result
                failed(out, f"b1 {label}", e, batch=B, context=C, n_query=NQ)
                continue
            gb = kv_bytes(B, C) / ms / 1e6
            out.append(row("b1", batch=B, context=C, n_query=NQ, collect="none", ms=ms,
                           gbps=gb, ratio_copy=gb / copy_bw, config=label,
                           note=f"auto {auto}"))
            print(f"b1      B=1 C={C:6d} NQ={NQ:2d} {label:10s} ms={ms:.4f} "
                  f"copy={gb / copy_bw:.2f}  (auto {auto})", flush=True)
        del caches
        torch.cuda.empty_cache()


def probe_int32_offsets(args: argparse.Namespace, copy_bw: float,
                        out: list[dict[str, Any]]) -> None:
    """The illegal-address crash at the big cache, isolated (the last step: a crash here
    loses nothing): verify at the
    largest big cache of the grid (B=16 C=128K, NQ 1, collect none) with the int32 tile
    offsets the launcher no longer uses there (offs64=False), against the default int64 path.
    'ok' means the int32 path is sound on this Triton and that illegal address came from
    elsewhere (the >= 2^31-element randn fill, now per request); a crash means the int32
    path itself (keep OFFS64 for such caches). Row kind=probe."""
    from vegas_sim.kernels import verify_attention as va

    big = [(B, C) for C in args.contexts for B in args.batches
           if big_cache(B, C) and kv_bytes(B, C) <= 40e9]
    if not big:
        return
    B, C = max(big)
    gen = torch.Generator(device=DEV).manual_seed(9)
    k, v = make_cache(gen, B, C)
    lens = torch.full((B,), C, dtype=torch.int32, device=DEV)
    q = torch.randn(B, 1, HQ, D, generator=gen, device=DEV, dtype=torch.bfloat16)
    ref, _, _ = va.verify_attention(q, k, v, lens, SCALE, "none", max_len=C, offs64=True)
    torch.cuda.synchronize()
    out.append(row("probe", batch=B, context=C, n_query=1, collect="none",
                   note="int64 tile offsets (default for this cache): ok"))
    print_row(out[-1])
    try:
        got, _, _ = va.verify_attention(q, k, v, lens, SCALE, "none", max_len=C, offs64=False)
        torch.cuda.synchronize()
    except ContextLost:
        raise
    except Exception as e:  # noqa: BLE001 - the answer we are after
        failed(out, "probe int32 tile offsets", e, batch=B, context=C, n_query=1)
        return
    diff = float((got.float() - ref.float()).abs().max())
    out.append(row("probe", batch=B, context=C, n_query=1, collect="none",
                   note=f"int32 tile offsets: no crash; max |out - int64 out| = {diff:.3g}"))
    print_row(out[-1])


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
    ver = [r for r in rows if r["kind"] == "verify" and r["context"] >= LONG_C
           and r["ms"] != ""]
    plain = [r for r in ver if r["collect"] == "none"]
    c2q = [r for r in ver if r["collect"] == "first_last"]
    quest_steps(rows)
    if ver:
        print("\nverify attention, C >= 32K (ratio to copy: min over B, C; overhead % max):")
        for nq in sorted({r["n_query"] for r in ver}):
            sel = [r for r in ver if r["n_query"] == nq]
            low = min(r["ratio_copy"] for r in sel if r["collect"] == "none")
            parts = [f"  NQ={nq:2d}: copy ratio min {low:.2f}"]
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
        copy = [r["gbps"] for r in rows if r["kind"] == "copy" and r["gbps"] != ""]
        if copy:
            fixed_cost_fit(plain, float(copy[0]))
    sparse = [r for r in rows if r["kind"] == "sparse"
              and str(r["note"]).startswith(SPARSE_RATIO) and r["ms"] != ""]
    sparse_ratio = [float(str(r["note"]).rsplit("=", 1)[1]) for r in sparse]
    def select_share(prefix: str) -> float | None:  # the default path's (not radix_topk's)
        found = [r["overhead_pct"] for r in rows if r["kind"] == "select"
                 and r["overhead_pct"] != "" and str(r["note"]).startswith(prefix)]
        return found[-1] if found else None

    v_min = min((r["ratio_copy"] for r in plain), default=None)
    c_max = max((r["overhead_pct"] for r in c2q), default=None)
    c_spread = None
    if c2q:
        by_nq = {nq: max(r["overhead_pct"] for r in c2q if r["n_query"] == nq)
                 for nq in {r["n_query"] for r in c2q}}
        c_spread = max(by_nq.values()) - min(by_nq.values())
    s_max = max(sparse_ratio, default=None)
    quest = [float(str(r["note"]).rsplit("=", 1)[1]) for r in rows if r["kind"] == "quest"
             and str(r["note"]).startswith(QUEST_RATIO) and r["ms"] != ""]
    q_max = max(quest, default=None)
    sh, sh_verify = select_share(SHARE_OF_ITERATION), select_share(SHARE_OF_VERIFY)
    errors = [r for r in rows if r["kind"] == "error"]
    ver_err = [r for r in errors if str(r["note"]).startswith(("verify", "CUDA context"))]
    candidate_summary(rows)
    format_summary(rows)
    b1 = [r for r in plain if r["batch"] == 1 and r["context"] == B1_CONTEXT]
    b1_min = min((r["ratio_copy"] for r in b1), default=None)

    def fmt(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    print("\n| target | measured | goal | verdict |\n|---|---|---|---|")
    v_note = f" ({len(ver_err)} shape(s) failed)" if ver_err else ""
    print(f"| verify attention / copy BW, C>=32K, NQ<=16 (min){v_note} | {fmt(v_min, '.2f')} | "
          f">= 0.85 | {_verdict(None if v_min is None else v_min >= 0.85 and not ver_err)} |")
    print(f"| verify at B=1 C={B1_CONTEXT}, defaults (min over NQ) | {fmt(b1_min, '.2f')} | >= 0.85 | "
          f"{_verdict(None if b1_min is None else b1_min >= 0.85)} |")
    print(f"| Collect-2-Query overhead (max; spread over NQ) | {fmt(c_max, '.1f')} % "
          f"({fmt(c_spread, '.1f')} pts) | <= 6 % | "
          f"{_verdict(None if c_max is None else c_max <= 6.0)} |")
    floor = [r for r in rows if r["kind"] == "c2q_floor" and r["context"] >= LONG_C
             and r["ms"] != ""]
    if floor and c2q:
        worst = max(c2q, key=lambda r: r["overhead_pct"])
        at = [r["overhead_pct"] for r in floor if (r["batch"], r["context"], r["n_query"])
              == (worst["batch"], worst["context"], worst["n_query"])]
        print(f"| Collect-2-Query floor: {C2Q_FLOOR} (max; at the worst shape B={worst['batch']} "
              f"C={worst['context']} NQ={worst['n_query']}: {fmt(at[0] if at else None, '.1f')} %)"
              f" | {max(r['overhead_pct'] for r in floor):.1f} % | - | - |")
    print(f"| sparse draft {SPARSE_RATIO} (max) | {fmt(s_max, '.2f')} | <= 1.3 | "
          f"{_verdict(None if s_max is None else s_max <= 1.3)} |")
    print(f"| Quest draft step: {QUEST_RATIO} (max) | {fmt(q_max, '.2f')} | <= 1.3 | "
          f"{_verdict(None if q_max is None else q_max <= 1.3)} |")
    print(f"| Vegas selection share of an iteration (γ 7), B=4 C=128K | {fmt(sh, '.1f')} % "
          f"(verify pass alone: {fmt(sh_verify, '.1f')} %) | <= 8 % | "
          f"{_verdict(None if sh is None else sh <= 8.0)} |")
    for f in C2Q_FORMATS:
        fo = [r["overhead_pct"] for r in rows if r["kind"] == "c2q_format"
              and r["config"] == f and r["ms"] != ""]
        if fo:
            print(f"| Collect-2-Query, {f} scores, c2q shapes (max) | {max(fo):.1f} % | "
                  f"<= {C2Q_TARGET_PCT:.0f} % | {_verdict(max(fo) <= C2Q_TARGET_PCT)} |")
    print(f"| no failed shape (kind=error rows) | {len(errors)} | 0 | "
          f"{_verdict(not errors)} |", flush=True)
    for r in errors:
        print(f"  error: B={r['batch']} C={r['context']} NQ={r['n_query']}: {r['note']}")


def quest_steps(rows: list[dict[str, Any]]) -> None:
    """The Quest and Stream draft steps of the run (kind=quest), per shape."""
    steps = [r for r in rows if r["kind"] == "quest" and "draft step" in str(r["note"])]
    if steps:
        print("\nQuest vs Stream draft step (Qwen3-8B, 36 layers + GEMMs):")
    for b, c in sorted({(r["batch"], r["context"]) for r in steps}):
        got = {str(r["note"]).split()[0]: r["ms"] for r in steps
               if (r["batch"], r["context"]) == (b, c)}
        print(f"  B={b} C={c}: quest {got.get('quest', math.nan):.3f} ms, stream "
              f"{got.get('stream', math.nan):.3f} ms")


def fixed_cost_fit(plain: list[dict[str, Any]], copy_bw: float) -> None:
    """Per NQ, t = F + bytes / BW through the B=1 collect=none rows at the shortest and the
    longest context (the same tiles and split count; at M >= 32 the longer call also loads by
    TMA): the streaming rate and the fixed cost (launch, ramp, tail, split partials, combine),
    and the F that 0.85 of copy would allow at B=1, C=B1_CONTEXT. A fit of two rows, not a
    measurement of its own."""
    b1 = [r for r in plain if r["batch"] == 1]
    contexts = sorted({r["context"] for r in b1})
    if len(contexts) < 2 or copy_bw <= 0:
        return
    lo, hi = contexts[0], contexts[-1]
    print(f"\nverify, B=1: t = F + bytes / BW through C={lo} and C={hi} (collect none); "
          f"0.85 of copy at C={B1_CONTEXT} allows F up to:")
    for nq in sorted({r["n_query"] for r in b1}):
        ms = {r["context"]: r["ms"] for r in b1 if r["n_query"] == nq}
        if lo not in ms or hi not in ms or ms[hi] <= ms[lo]:
            continue
        us_lo, us_hi = ms[lo] * 1e3, ms[hi] * 1e3
        bw = (kv_bytes(1, hi) - kv_bytes(1, lo)) / (us_hi - us_lo) / 1e3  # bytes/µs -> GB/s
        fixed = us_lo - kv_bytes(1, lo) / bw / 1e3
        target_us = kv_bytes(1, B1_CONTEXT) / (0.85 * copy_bw) / 1e3
        allowed = target_us - kv_bytes(1, B1_CONTEXT) / bw / 1e3
        print(f"  NQ={nq:2d}: BW {bw:6.0f} GB/s ({bw / copy_bw:.2f} of copy), F {fixed:5.1f} us; "
              f"allowed {allowed:4.1f} us")


def candidate_summary(rows: list[dict[str, Any]]) -> None:
    """The Collect-2-Query candidates (overhead % per shape) and the B=1 C=32K configs (ratio
    to copy per NQ), each with the best one marked."""
    c2q = [r for r in rows if r["kind"] == "c2q" and r["ms"] != ""]
    shapes = sorted({(r["batch"], r["context"], r["n_query"]) for r in c2q})
    if c2q:
        print("\nCollect-2-Query candidates, overhead % over collect=none (default launch):")
        print(f"  {'candidate':22s}"
              + "".join(f"{f'B{b} C{c // 1024}K NQ{n}':>15}" for b, c, n in shapes))
        for label in dict.fromkeys(r["config"] for r in c2q):
            cells = []
            for b, c, n in shapes:
                hit = [r for r in c2q if r["config"] == label and (r["batch"], r["context"],
                                                                   r["n_query"]) == (b, c, n)]
                cells.append(f"{hit[0]['overhead_pct']:15.1f}" if hit else f"{'-':>15}")
            print(f"  {label:22s}" + "".join(cells))
        fl = [r for r in c2q if r["collect"] == "first_last"]
        for b, c, n in shapes:
            sel = [r for r in fl if (r["batch"], r["context"], r["n_query"]) == (b, c, n)]
            if sel:
                best = min(sel, key=lambda r: r["overhead_pct"])
                print(f"  best at B={b} C={c} NQ={n}: {best['config']} "
                      f"{best['overhead_pct']:.1f} %")
    b1 = [r for r in rows if r["kind"] == "b1" and r["ms"] != ""]
    if b1:
        print(f"\nB=1 C={B1_CONTEXT} verify (none), ratio to copy per launch config:")
        for nq in sorted({r["n_query"] for r in b1}):
            sel = [r for r in b1 if r["n_query"] == nq]
            best = max(sel, key=lambda r: r["ratio_copy"])
            print(f"  NQ={nq:2d}: " + "  ".join(f"{r['config']} {r['ratio_copy']:.2f}"
                                               for r in sel)
                  + f"   best {best['config']} ({sel[0]['note']})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/kernels_h200.csv"))
    p.add_argument("--quick", action="store_true", help="B 1,4,16; C 32K,128K; NQ 1,8,16")
    p.add_argument("--tune", action="store_true", help="also sweep verify launch configs")
    p.add_argument("--sweep", action="store_true",
                   help="only the variant sweep (see sweep()), then exit")
    p.add_argument("--budget-s", type=float, default=150.0,
                   help="--sweep starts no new item after this many seconds")
    p.add_argument("--step-budget-s", type=float, default=120.0,
                   help="start no benchmark step after this many seconds (the rest is "
                        "recorded as not started)")
    p.add_argument("--rounds", type=int, default=3,
                   help="interleaved timings of each verify call (grid and selection step); "
                        "the fastest is kept")
    p.add_argument("--only", default="quest,c2q,b1,verify,sparse,select,oss,probe",
                   help="comma list of quest,c2q,b1,verify,sparse,select,oss,probe (oss: "
                        "gpt-oss-20b's Hq 64 / Hkv 8 / D 64 collection overhead; quest: "
                        "Quest's draft step against Stream's)")
    p.add_argument("--batches", help="comma list: the verify and sparse grids' batches "
                   "(default 1,4,16)")
    p.add_argument("--contexts", help="comma list: the verify and sparse grids' contexts "
                   "(default 8192,32768,131072; --quick 32768,131072)")
    p.add_argument("--summary", type=Path, metavar="CSV",
                   help="print the summary and target table of a saved run's CSV (no GPU)")
    args = p.parse_args(argv)
    if args.summary is not None:
        if not args.summary.is_file():
            print(f"--summary: no such CSV: {args.summary}", file=sys.stderr)
            return 2
        summary(read_csv(args.summary))
        return 0
    if not torch.cuda.is_available():
        print("benchmarks/kernels.py needs a CUDA GPU", file=sys.stderr)
        return 2
    args.batches = [int(x) for x in args.batches.split(",")] if args.batches else BATCHES
    args.contexts = ([int(x) for x in args.contexts.split(",")] if args.contexts
                     else CONTEXTS_QUICK if args.quick else CONTEXTS)
    args.n_query = [1, 8, 16] if args.quick else [1, 4, 8, 12, 16]
    rows: list[dict[str, Any]] = []
    copy_bw = copy_bandwidth()
    rows.append(row("copy", gbps=copy_bw, ratio_copy=1.0,
                    note=f"{torch.cuda.get_device_name()} torch {torch.__version__}; all ms are "
                         "CUDA-graph replays (do_bench_cudagraph), inputs rotated past the L2"))
    print(f"copy bandwidth {copy_bw:.0f} GB/s (read+write)")
    only = set(args.only.split(","))
    # Caches of >= 2^31 elements (B=16 C=128K) last: an illegal address there (seen once) kills
    # the CUDA context, so everything else is measured first; every step records its
    # failures as `error` rows, and a lost context ends the GPU work but not the report.
    # Order = priority under the time budget: the targets' evidence first, the B=1 configs
    # and the big cache last. No step starts after --step-budget-s seconds (recorded).
    steps: list[tuple[str, Callable[..., None]]] = [
        ("quest", bench_quest), ("c2q", bench_c2q_candidates), ("verify", bench_verify), ("select", bench_selection),
        ("sparse", bench_sparse), ("oss", bench_gpt_oss_collect), ("b1", bench_b1_configs),
        ("verify", partial(bench_verify, big=True)), ("sparse", partial(bench_sparse, big=True)),
        ("probe", probe_int32_offsets)]
    t0 = time.time()
    # `timeout` sends SIGTERM: exit through the finally below (CSV + table) instead of dying
    old_handler = signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    try:
        if args.sweep:
            sweep(args, copy_bw, rows)
            return 0
        if args.tune:
            bench_variants(args, copy_bw, rows)
            bench_tune(args, copy_bw, rows)
        for name, fn in steps:
            if name not in only:
                continue
            if time.time() - t0 > args.step_budget_s:
                rows.append(row("error", note=f"step {name} not started: --step-budget-s "
                                              f"{args.step_budget_s:.0f} s spent"))
                print(rows[-1]["note"], flush=True)
                continue
            try:
                fn(args, copy_bw, rows)
                write_csv(args.out, rows)
            except ContextLost as e:
                rows.append(row("error", note=f"CUDA context lost in step {name}; later "
                                              f"steps not run: {e}"[:300]))
                print(rows[-1]["note"], flush=True)
                break
            except Exception as e:  # noqa: BLE001 - record and go on with the next step
                try:
                    failed(rows, name, e)
                except ContextLost:
                    break
    finally:
        signal.signal(signal.SIGTERM, old_handler)
        write_csv(args.out, rows)
        summary(rows)
    return 0


def read_csv(path: Path) -> list[dict[str, Any]]:
    """A CSV that write_csv wrote, with its numbers as numbers again ("" stays "")."""
    def value(text: str) -> Any:
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return text
    with path.open(newline="") as fh:
        return [{k: value(v) for k, v in r.items()} for r in csv.DictReader(fh)]


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """The CSV so far (rewritten after every step, so a killed run keeps what it measured)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.5g}" if isinstance(v, float) else v) for k, v in r.items()})



# ---------------------------------------------------------------------------------------------
# --sweep: the variants that a one-off H200 sweep decided between. Rows kind=sweep,
# `config` = variant label. Stops starting new items after --budget-s seconds.

SWEEP_VERIFY = [  # (B, C, NQ): the shapes that once missed the verify target + one control
    (4, 131072, 8), (16, 32768, 8), (4, 32768, 16), (4, 32768, 1), (16, 131072, 16),
    (1, 32768, 8), (1, 131072, 8), (1, 32768, 16),
]


def sweep_verify_variants(B: int, C: int, NQ: int, n_sms: int) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, collect, knobs): plain vs Collect-2-Query at M 16 / 64, and for B = 1 more
    splits and smaller tiles (more than one wave, 2 programs per SM)."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    for min_m in (16, 64):
        out.append((f"none m{min_m}", "none", {"min_m": min_m}))
        out.append((f"c2q m{min_m}", "first_last", {"min_m": min_m}))
    if B == 1 or (B, C, NQ) in ((4, 131072, 8), (4, 32768, 16)):
        base = 16 if B == 1 else 4
        for splits in sorted({2 * base, 4 * base}):
            for block_n in (64, 128):
                for collect in ("none", "first_last"):
                    out.append((f"{collect} s{splits} n{block_n}", collect,
                                {"splits": splits, "block_n": block_n}))
    if (B, C, NQ) == (4, 131072, 8):
        for warps, stages in ((8, 3), (4, 2), (4, 4)):
            for collect in ("none", "first_last"):
                out.append((f"{collect} w{warps} st{stages}", collect,
                            {"num_warps": warps, "num_stages": stages}))
    return out


def sweep(args: argparse.Namespace, copy_bw: float, out: list[dict[str, Any]]) -> None:
    import time

    from vegas_sim.kernels import selection
    from vegas_sim.kernels import sparse_attention as sa
    from vegas_sim.kernels import verify_launch as vl

    t0 = time.time()
    gen = torch.Generator(device=DEV).manual_seed(4)
    n_sms = vl.num_sms(torch.device(DEV))

    def left() -> bool:
        return time.time() - t0 < args.budget_s

    def record(kind: str, label: str, ms: float, byt: float, **kw: Any) -> None:
        gb = byt / ms / 1e6
        out.append(row("sweep", config=f"{kind} {label}", ms=ms, gbps=gb,
                       ratio_copy=gb / copy_bw, **kw))
        print(f"sweep {kind:8s} {label:28s} B={kw.get('batch', '')!s:>2} "
              f"C={kw.get('context', '')!s:>6} NQ={kw.get('n_query', '')!s:>2} ms={ms:.4f} "
              f"copy={gb / copy_bw:.2f} t={time.time() - t0:.0f}s", flush=True)

    # score_weights at the Vegas shape (B 4, R 2, Hq 32, S = 128K + 128)
    B, S = 4, 131072 + 128
    scores = [torch.randn(B, 2, HQ, S, generator=gen, device=DEV).bfloat16() * 4
              for _ in range(4)]
    lse = torch.logsumexp(scores[0].float()[..., :131072] * SCALE, -1)
    rank = torch.full((B,), 131065, dtype=torch.int32, device=DEV)
    for bs, br, w, st in [(128, 32, 4, None), (512, 8, 4, None), (1024, 4, 4, None),
                          (1024, 8, 8, None), (2048, 2, 4, None), (2048, 4, 8, None),
                          (1024, 4, 4, 3), (2048, 2, 4, 3), (4096, 2, 8, 3)]:
        if not left():
            break
        ms = bench(rotating([partial(selection.score_weights, sc, lse, SCALE, rank, block_s=bs,
                                     block_r=br, num_warps=w, num_stages=st)
                             for sc in scores]))
        record("weights", f"s{bs} r{br} w{w} st{st}", ms, scores[0].numel() * 2.0 * 2,
               batch=B, context=131072)
    weights = torch.rand(LAYERS, B, S, generator=gen, device=DEV)
    K = math.ceil(0.07 * 131065)
    for srt in (False, True):
        ms = bench(partial(torch.topk, weights, K, dim=-1, sorted=srt))
        record("topk", f"sorted={srt}", ms, weights.numel() * 4.0, batch=B, context=131072)
    del scores, weights
    torch.cuda.empty_cache()

    def verify_shapes(shapes: list[tuple[int, int, int]]) -> None:
        from vegas_sim.kernels import verify_launch as vl
        for B, C, NQ in shapes:
            if not left():
                break
            caches, lens, q = verify_inputs(gen, B, C, NQ)
            auto = vl.choose_config(B, HKV, NQ, HQ // HKV, C, n_sms).label()
            for label, collect, kw in sweep_verify_variants(B, C, NQ, n_sms):
                if not left():
                    break
                try:
                    ms = bench(verify_call(caches, q, lens, collect, C, **kw))
                except Exception as e:  # noqa: BLE001 - out of resources is a result
                    print(f"sweep verify {label}: {e!r}"[:160], flush=True)
                    continue
                record("verify", label, ms, kv_bytes(B, C), batch=B, context=C, n_query=NQ,
                       collect=collect, note=f"auto {auto}")
            del caches
            torch.cuda.empty_cache()

    verify_shapes(SWEEP_VERIFY[:3])
    # sparse draft: the launch term and the default launch against 32/64-key tiles at 4 warps
    ms = sparse_launch_ms(gen)
    record("sparse", "launch-2keys", ms, kv_bytes(1, 2), batch=1, context=2)
    for B, C, s in [(1, 131072, 0.01), (1, 131072, 0.05), (4, 32768, 0.05), (1, 32768, 0.2),
                    (16, 131072, 0.05)]:
        if not left():
            break
        caches = [make_cache(gen, B, C) for _ in range(n_copies(kv_bytes(B, C)))]
        q = torch.randn(B, HQ, D, generator=gen, device=DEV, dtype=torch.bfloat16)
        K = math.ceil(s * C)
        n = torch.full((B,), K, dtype=torch.int32, device=DEV)
        tail = torch.full((B,), C, dtype=torch.int32, device=DEV)
        lens = tail + 4
        idxs = [random_selection(gen, B, C, K) for _ in range(4)]
        for label, kw in (("default", {}), ("n32 w4", {"block_n": 32, "num_warps": 4}),
                          ("n64 w4", {"block_n": 64, "num_warps": 4})):
            ms = bench(rotating([partial(sa.sparse_draft_attention, q, kk, vv, ix, n, tail,
                                         lens, SCALE, **kw)
                                 for (kk, vv), ix in zip(caches * 4, idxs)]))
            record("sparse", label, ms, kv_bytes(B, K + 4), batch=B, context=C, sparsity=s)
        del caches
        torch.cuda.empty_cache()
    verify_shapes(SWEEP_VERIFY[3:])


if __name__ == "__main__":
    raise SystemExit(main())
