"""Regenerate the committed held-out sets of the H200 validation run (issue #6).

    /work/venv/bin/python benchmarks/validation/make_heldout.py          # writes both CSVs
    /work/venv/bin/python benchmarks/validation/make_heldout.py --check  # prints, writes nothing
    /work/venv/bin/python benchmarks/validation/make_heldout.py --seed 20261130 --regime smollm2
        # a fresh draw beside them: heldout_smollm2_seed20261130.csv
    /work/venv/bin/python benchmarks/validation/make_heldout.py --far --seed 20261203
        # batches 80-128, past every seeded row: heldout_REGIME_far_seed20261203.csv
    /work/venv/bin/python benchmarks/validation/make_heldout.py --workloads --seed 20261209
        # SmolLM2 across every workload and temperature: heldout_smollm2_workloads_seed20261209.csv

Regimes, SEED recorded here and in README.md:
- heldout_smollm2.csv — SmolLM2-135M real weights end to end (8K positions): longdoc prompts
  cut to the context (natural text: validate.prompts_for), contexts 2.5K–6.5K, output 128.
- heldout_qwen3_8b.csv — Qwen3-8B shape, random weights, acceptance replayed: contexts
  2.5K–120K, output 64, and B × (C + output + 16) × 147 KB ≤ MAX_KV_GB at every point.
- heldout_gpt_oss_20b.csv / heldout_qwen3_30b_a3b.csv (`--regime gpt_oss_20b`, ...) — the
  mixture-of-experts shapes, random weights, acceptance replayed, N_MOE rows each, off their
  own latency grids (B {1..128 ×2} × C {1K, 4K, 16K, 64K, 128K} / {1K, 4K, 16K, 40K}) and
  inside the KV memory left beside their bf16 weights (MAX_KV_GB_BY_REGIME).
- heldout_qwen3_8b_tp.csv (`--regime qwen3_8b_tp`) — Qwen3-8B at tensor parallel > 1
  (`validate --tp N` on a set from `calibrate --tp N`, benchmarks/gpu/device.sh `full-tp`),
  random weights, acceptance replayed, N_MOE rows off that set's grid (B {1..128 ×2} ×
  C {1K, 4K, 16K, 64K, 128K}); the same rows at every N, their KV (≤ 90 GB over the group)
  fits two 80 GB H100s beside 8 GB of weights each.

Every configuration is off the calibration grids the lead uses (latency B {1..128 ×2} ×
C {1K..128K ×2} / SmolLM2 {256, 512, 1K, 2K, 4K, 7K}; acceptance s {0.01, 0.02, 0.03, 0.05,
0.07, 0.10, 0.15, 0.20}, γ 12): batch or context is off-grid, and sparsity is always
off-grid. Methods cycle (vanilla + the five), so each appears 4 times in 24 rows.
Temperature is left empty: `validate` runs at the latency grid's temperature (the sampling
cost the latency model knows), when the acceptance set traced it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from vegas_sim.methods import METHODS
from vegas_sim.models import get_preset
from vegas_sim.validate.heldout import HeldOut, check_outside_grid, write_heldout

SEED = 20261129
N = 24
HERE = Path(__file__).resolve().parent
MAX_KV_GB = 90.0  # next to 16 GB of Qwen3-8B weights on a 141 GB H200, with room for buffers
N_MOE = 14  # rows per mixture-of-experts regime (issue: >= 12 held-out configurations)
PRESET = {"qwen3_8b": "qwen3-8b", "gpt_oss_20b": "gpt-oss-20b", "qwen3_30b_a3b": "qwen3-30b-a3b",
          "qwen3_8b_tp": "qwen3-8b"}
# KV left on a 141 GB H200 beside the bf16 weights (41 GB / 61 GB) and the runtime's buffers
MAX_KV_GB_BY_REGIME = {"qwen3_8b": MAX_KV_GB, "gpt_oss_20b": 70.0, "qwen3_30b_a3b": 55.0,
                       "qwen3_8b_tp": MAX_KV_GB}  # TP: over the group
STREAM = {"smollm2": 0, "qwen3_8b": 1, "gpt_oss_20b": 2, "qwen3_30b_a3b": 3,
          "qwen3_8b_tp": 4}  # rng per regime

LATENCY_BATCH = [1, 2, 4, 8, 16, 32, 64, 128]
ACCEPTANCE_SPARSITY = [0.01, 0.02, 0.03, 0.05, 0.07, 0.10, 0.15, 0.20]
GRIDS: dict[str, dict[str, list[Any]]] = {
    "smollm2": {"batch": LATENCY_BATCH, "context": [256, 512, 1024, 2048, 4096, 7168],
                "gamma": [12], "sparsity": ACCEPTANCE_SPARSITY},
    "qwen3_8b": {"batch": LATENCY_BATCH, "context": [1024 << k for k in range(8)],
                 "gamma": [12], "sparsity": ACCEPTANCE_SPARSITY},
    "gpt_oss_20b": {"batch": LATENCY_BATCH, "context": [1024, 4096, 16384, 65536, 131072],
                    "gamma": [12], "sparsity": ACCEPTANCE_SPARSITY},
    "qwen3_30b_a3b": {"batch": LATENCY_BATCH, "context": [1024, 4096, 16384, 40960],
                      "gamma": [12], "sparsity": ACCEPTANCE_SPARSITY},
    "qwen3_8b_tp": {"batch": LATENCY_BATCH, "context": [1024, 4096, 16384, 65536, 131072],
                    "gamma": [12], "sparsity": ACCEPTANCE_SPARSITY},
}
SPARSITIES = [0.025, 0.04, 0.06, 0.085, 0.12, 0.14]
BATCHES = [1, 3, 6, 12, 24, 48]
CONTEXTS = {
    "smollm2": [2560, 3072, 3584, 5120, 6144, 6656],
    "qwen3_8b": [2560, 3072, 6144, 12288, 24576, 49152, 98304, 122880],
    "gpt_oss_20b": [2560, 6144, 12288, 24576, 49152, 98304, 122880],
    "qwen3_30b_a3b": [2560, 6144, 12288, 24576, 32768],
    "qwen3_8b_tp": [2560, 6144, 12288, 24576, 49152, 98304, 122880],
}
OUTPUT_LEN = {"smollm2": 128, "qwen3_8b": 64, "gpt_oss_20b": 64, "qwen3_30b_a3b": 64,
              "qwen3_8b_tp": 64}
# `--far`: batches past every seeded row's 48 and the span rows' 64 (SmolLM2: past its latency
# set's 64 too), at the regime's contexts that fit beside them.
FAR_BATCHES = [80, 96, 112, 128]
N_FAR = 12


# Real weights: requests per configuration, at least. One request's acceptance length scatters
# ~18 % (prompt and sampling); 8 requests at B = 1 measured a sampling error of 6.7-8.7 %,
# so a 2-sigma miss was 13-17 % of throughput. 32 halves that. The longdoc pool has 8-16
# prompts this long, so waves past it repeat prompts with other sampling seeds.
MIN_REQUESTS = 32
# Replay: requests per configuration, at least. The replay prediction reuses the measured
# accept counts, but the headline prediction draws its own: at B 3, one wave of 64 tokens
# scattered the replayed acceptance length by up to 14 % (specextend γ 8, seed 20261207).
MIN_REQUESTS_REPLAY = 16


def waves_for(regime: str, batch: int) -> int:
    """Enough waves for MIN_REQUESTS (real weights) or MIN_REQUESTS_REPLAY requests."""
    least = MIN_REQUESTS if regime == "smollm2" else MIN_REQUESTS_REPLAY
    return -(-least // batch)


def kv_gb(batch: int, context: int, output_len: int, regime: str = "qwen3_8b") -> float:
    spec = get_preset(PRESET[regime])
    return batch * (context + output_len + 16) * spec.kv_bytes_per_token() / 1e9


def feasible(regime: str, batch: int, context: int) -> bool:
    return regime == "smollm2" or (kv_gb(batch, context, OUTPUT_LEN[regime], regime)
                                   <= MAX_KV_GB_BY_REGIME[regime])


def draw(regime: str, rng: np.random.Generator, far: bool = False) -> list[HeldOut]:
    """N configurations (N_FAR at FAR_BATCHES with `far`). Methods cycle; contexts and batches
    are stratified (each listed value used in turn, shuffled) so that both ends of the ranges
    are covered; a batch that does not fit next to the context (Qwen3-8B KV memory) becomes
    the largest that does."""
    out: list[HeldOut] = []
    out_len = OUTPUT_LEN[regime]
    n = N_FAR if far else N if regime in ("smollm2", "qwen3_8b") else N_MOE
    allowed = FAR_BATCHES if far else BATCHES
    fitting = [c for c in CONTEXTS[regime] if feasible(regime, allowed[0], c)]
    contexts = [int(c) for c in rng.permutation(np.resize(fitting, n))]
    batches = [int(b) for b in rng.permutation(np.resize(allowed, n))]
    for i in range(n):
        method = METHODS[i % len(METHODS)]
        context = contexts[i]
        batch = max(b for b in allowed if b <= batches[i] and feasible(regime, b, context))
        gamma = 1 if method == "vanilla" else int(rng.integers(2, 13))
        h = HeldOut(
            method=method, gamma=gamma,
            sparsity=1.0 if method == "vanilla" else float(rng.choice(SPARSITIES)),
            batch=batch, context=context, output_len=out_len,
            workload="longdoc" if regime == "smollm2" else None,
            temperature=None, waves=waves_for(regime, batch))
        while h in out:  # a repeat (same draws twice): another batch that fits
            b = max(x for x in allowed if feasible(regime, x, context) and x != h.batch)
            h = HeldOut(**{**h.__dict__, "batch": b, "waves": waves_for(regime, b)})
        out.append(h)
    check_outside_grid(out, GRIDS[regime])
    return out


# `--workloads`: SmolLM2 real weights across every workload and both temperatures, at
# contexts where real prompts of the workload exist (cut to the context: a book window keeps
# its start, a request its end; validate.prompts_for), off the traced prompt lengths — except
# recall, whose prompts end on a question a cut would lose: its own lengths, whole
WORKLOAD_CONTEXTS = {
    "longdoc": [1536, 2560, 3584, 5120, 6144], "recall": [2048, 3072, 4096, 7168],
    "code-long": [1536, 2560, 3584, 5120, 6144], "chat-long": [1536, 2560, 3584, 5120, 6144],
    "competitive": [400, 520, 640], "code": [104, 136, 168], "chat": [44, 56, 68],
    "reasoning": [80, 96, 108]}
WORKLOAD_OUTPUT = {"competitive": 384}  # a problem's reasoning and code run long
WORKLOAD_BATCHES = [3, 6, 12, 24]
ROWS_PER_WORKLOAD = 4
TEMPERATURES = (0.0, 0.6)


def draw_workloads(rng: np.random.Generator) -> list[HeldOut]:
    """ROWS_PER_WORKLOAD rows per workload, half at each temperature; the five speculative
    methods cycle over all rows; γ 2-12, an off-grid sparsity, an off-grid batch, a context
    from the workload's list (each used in turn, shuffled)."""
    spec = [m for m in METHODS if m != "vanilla"]
    out: list[HeldOut] = []
    for w, contexts in WORKLOAD_CONTEXTS.items():
        picked = rng.permutation(np.resize(rng.permutation(contexts), ROWS_PER_WORKLOAD))
        for j, context in enumerate(picked):
            batch = int(rng.choice(WORKLOAD_BATCHES))
            out.append(HeldOut(
                method=spec[len(out) % len(spec)], gamma=int(rng.integers(2, 13)),
                sparsity=float(rng.choice(SPARSITIES)), batch=batch, context=int(context),
                output_len=WORKLOAD_OUTPUT.get(w, OUTPUT_LEN["smollm2"]), workload=w,
                temperature=TEMPERATURES[j % 2], waves=waves_for("smollm2", batch)))
    check_outside_grid(out, GRIDS["smollm2"])
    return out


def estimate_s(h: HeldOut, regime: str) -> float:
    """Rough H200 seconds with CUDA graphs (brief's numbers): per-forward ms × forwards per
    iteration × iterations (acceptance length ~3), per wave, + ~0.5 s capture per state."""
    if regime == "smollm2":
        fwd_ms, verify_ms = 1.5, 2.0
    else:
        kv_ms = h.batch * h.context * get_preset(PRESET[regime]).kv_bytes_per_token() / 4.2e9
        fwd_ms, verify_ms = 5.0 + 0.1 * kv_ms, 5.0 + kv_ms
    if h.method == "vanilla":
        per_wave = h.output_len * verify_ms / 1000.0
    else:
        iters = h.output_len / 3.0
        per_wave = iters * (h.gamma * fwd_ms + verify_ms + 0.5) / 1000.0
    return h.waves * (per_wave + 0.5) + 0.5  # + the warm-up state's capture


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="print only, write nothing")
    ap.add_argument("--seed", type=int, default=SEED,
                    help=f"another draw, written as heldout_REGIME_seedN.csv (default {SEED})")
    ap.add_argument("--regime", choices=tuple(STREAM), action="append",
                    help="only this regime (repeatable; default smollm2 and qwen3_8b)")
    ap.add_argument("--far", action="store_true",
                    help=f"{N_FAR} rows at batches {FAR_BATCHES}: heldout_REGIME_far_seedN.csv")
    ap.add_argument("--workloads", action="store_true",
                    help="SmolLM2 rows across every workload and temperature: "
                         "heldout_smollm2_workloads_seedN.csv")
    args = ap.parse_args()
    if args.workloads:
        rng = np.random.default_rng([args.seed, STREAM["smollm2"], 1])
        hs = draw_workloads(rng)
        print(f"smollm2 workloads: {len(hs)} configurations, estimated "
              f"{sum(estimate_s(h, 'smollm2') for h in hs):.0f} s on an H200")
        for h in hs:
            print(f"  {h.label:<45} {h.workload:<12} T {h.temperature}  waves {h.waves}")
        if not args.check:
            write_heldout(hs, HERE / f"heldout_smollm2_workloads_seed{args.seed}.csv")
        return
    seed_part = f"_seed{args.seed}" if args.far or args.seed != SEED else ""
    suffix = ("_far" if args.far else "") + seed_part
    for regime in args.regime or ("smollm2", "qwen3_8b"):
        rng = np.random.default_rng([args.seed, STREAM[regime]])
        hs = draw(regime, rng, far=args.far)
        total = sum(estimate_s(h, regime) for h in hs)
        print(f"{regime}: {len(hs)} configurations, estimated {total:.0f} s on an H200")
        for h in hs:
            extra = (f"  KV {kv_gb(h.batch, h.context, h.output_len, regime):5.1f} GB"
                     if regime != "smollm2" else "")
            print(f"  {h.label:<45} waves {h.waves}  ~{estimate_s(h, regime):4.1f} s{extra}")
        if not args.check:
            write_heldout(hs, HERE / f"heldout_{regime}{suffix}.csv")


if __name__ == "__main__":
    main()
