"""Clearly synthetic trace sets for tests: known ground truth, written through the real writer.

Nothing here is measured. `meta["synthetic"]` is true and the GPU is named "synthetic"; such a
set is refused as a packaged default (see `make_synthetic_trace_set`).

Ground truth, exposed so tests elsewhere can check what a fit recovers:

- Latency (`roofline_ms`): per phase call, fixed overhead + max(weight bytes / BW, GEMM FLOPs /
  FLOP rate) for the B·n_query tokens in flight + max(KV bytes / BW, attention FLOPs / FLOP rate)
  summed over requests + score write-out / read bytes for collect_rows, using the synthetic GPU's
  "measured" rates. Each latency row's median is the truth times exp(N(0, noise)).
- Acceptance (`synthetic_alpha`, `synthetic_rates`): at each drafted position the draft is
  accepted independently with probability alpha(method, sparsity, context, temperature), so the
  per-position rates are r_i = alpha^i. alpha rises with sparsity (saturating exponential),
  falls slowly with context and temperature; Vegas > SpecExtend ≈ Quest > StreamingLLM. Since
  draft cost also rises with sparsity, throughput has an interior optimum in sparsity.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vegas_sim.errors import UserInputError
from vegas_sim.methods import METHODS, SPEC_METHODS, budget, drafts, iteration_plan
from vegas_sim.models import ModelSpec, get_preset
from vegas_sim.traces.io import PACKAGED_DIR, TraceSet, TraceSetWriter
from vegas_sim.traces.schema import SCHEMA_VERSION

SYNTHETIC_GPU: dict[str, Any] = {
    "name": "synthetic",
    "sm_count": 132,
    "memory_gb": 141.0,
    "copy_bandwidth_gbs": 4000.0,  # what a copy kernel would reach on an H200-class part
    "bf16_tflops": 700.0,
}

# Fixed per-call overheads in ms: launch + framework cost of one call of each phase.
FORWARD_OVERHEAD_MS = 0.05
PER_LAYER_OVERHEAD_MS = 0.004
SMALL_PHASE_OVERHEAD_MS = 0.02
_FORWARD_PHASES = ("decode", "draft_step", "verify", "prefill")

# alpha(s) = lo + (hi - lo)·(1 − exp(−s/s0)): (lo, hi, s0) per drafting method.
ALPHA_PARAMS: dict[str, tuple[float, float, float]] = {
    "vegas": (0.55, 0.92, 0.04),
    "vegas-all": (0.55, 0.93, 0.04),
    "specextend": (0.45, 0.88, 0.05),
    "magicdec-quest": (0.45, 0.87, 0.05),
    "magicdec-stream": (0.35, 0.80, 0.08),
}
CONTEXT_SLOPE = 0.01  # alpha lost per doubling of context above 4096
TEMPERATURE_SLOPE = 0.05  # alpha lost per unit of temperature


def _spec(model: str | ModelSpec) -> ModelSpec:
    return model if isinstance(model, ModelSpec) else get_preset(model)


def roofline_ms(
    spec: ModelSpec, gpu: dict[str, Any], phase: str, batch: int, n_query: int,
    kv_read: float, collect_rows: int = 0,
) -> float:
    """Noise-free synthetic time of one call of `phase` (every request reads `kv_read`)."""
    bw = float(gpu["copy_bandwidth_gbs"]) * 1e9 / 1e3  # bytes per ms
    fl = float(gpu["bf16_tflops"]) * 1e12 / 1e3  # FLOPs per ms
    # Score bytes the verify kernel writes (bf16, every query head, every layer); select reads them.
    score_bytes = batch * collect_rows * spec.n_heads * spec.n_layers * kv_read * 2
    if phase in _FORWARD_PHASES:
        tokens = batch * n_query
        gemm = max(spec.weight_bytes() / bw, spec.gemm_flops(tokens) / fl)
        attn = max(batch * kv_read * spec.kv_bytes_per_token() / bw,
                   batch * spec.attn_flops(n_query, kv_read) / fl)
        overhead = FORWARD_OVERHEAD_MS + PER_LAYER_OVERHEAD_MS * spec.n_layers
        return overhead + gemm + attn + score_bytes / bw
    if phase in ("select", "collect"):
        return SMALL_PHASE_OVERHEAD_MS + score_bytes / bw
    if phase == "quest_meta":
        # kv_read = pages scored: min and max keys per page, per KV head and layer (bf16).
        meta_bytes = batch * kv_read * spec.n_layers * spec.n_kv_heads * spec.head_dim * 2 * 2
        return SMALL_PHASE_OVERHEAD_MS + meta_bytes / bw
    if phase == "sample":
        return SMALL_PHASE_OVERHEAD_MS + batch * n_query * spec.vocab * 4 * 2 / bw
    return SMALL_PHASE_OVERHEAD_MS


def synthetic_alpha(method: str, sparsity: float, context: float, temperature: float = 0.0
                    ) -> float:
    """Per-position acceptance probability of the synthetic model (the ground truth)."""
    lo, hi, s0 = ALPHA_PARAMS[method]
    alpha = lo + (hi - lo) * (1.0 - math.exp(-sparsity / s0))
    alpha -= CONTEXT_SLOPE * max(math.log2(max(context, 1.0) / 4096.0), 0.0)
    alpha -= TEMPERATURE_SLOPE * temperature
    return min(max(alpha, 0.01), 0.99)


def synthetic_rates(method: str, gamma: int, sparsity: float, context: float,
                    temperature: float = 0.0) -> np.ndarray:
    """[gamma] true per-position rates r_i = alpha^i (mean acceptance length 1 + Σ r_i)."""
    alpha = synthetic_alpha(method, sparsity, context, temperature)
    return np.asarray(alpha ** np.arange(1, gamma + 1), dtype=np.float64)


def synthetic_meta(
    spec: ModelSpec, *, weights_kind: str = "real", seed: int = 0,
    grid: dict[str, Any] | None = None, workloads: Sequence[str] = ("synthetic",),
    gpu: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A complete meta dict (minus content_hash) for a synthetic set of `spec`."""
    import vegas_sim

    model = {**spec.to_dict(),
             "weights": {"kind": weights_kind, "id": "synthetic", "sha256": ""}}
    return {
        "schema_version": SCHEMA_VERSION,
        "synthetic": True,
        "model": model,
        "gpu": dict(gpu or SYNTHETIC_GPU),
        "software": {"vegas_sim": getattr(vegas_sim, "__version__", "dev"),
                     "generator": "vegas_sim.traces.synthetic"},
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "grid": dict(grid or {}),
        "workload": list(workloads),
        "seeds": {"synthetic": seed},
    }


def _latency_rows(
    spec: ModelSpec, gpu: dict[str, Any], method: str, gammas: Sequence[int],
    sparsities: Sequence[float], contexts: Sequence[int], batches: Sequence[int],
    noise: float, rng: np.random.Generator,
) -> pd.DataFrame:
    """One row per distinct phase call of `method` over the grid (uniform batches)."""
    keys: set[tuple[str, int, int, int, int, int]] = set()
    for gamma in (gammas if drafts(method) else [1]):
        for s in (sparsities if drafts(method) else [1.0]):
            for c in contexts:
                for call in iteration_plan(method, gamma, np.array([c]), s, spec.max_positions):
                    for b in batches:
                        keys.add((call.phase, b, c, call.n_query, int(call.kv_read[0]),
                                  call.collect_rows))
    rows = sorted(keys)
    truth = np.array([roofline_ms(spec, gpu, p, b, q, kv, cr) for p, b, c, q, kv, cr in rows])
    median = truth * np.exp(noise * rng.standard_normal(len(rows)))  # [rows]
    spread = 1.2816 * noise  # z of the 10th/90th percentile of the timing noise
    frame = pd.DataFrame(rows, columns=["phase", "batch", "context", "n_query", "kv_read",
                                        "collect_rows"])
    frame.insert(1, "method", method)
    return frame.assign(ms_median=median, ms_p10=median * (1 - spread),
                        ms_p90=median * (1 + spread), n=20)


def _with_greedy_rows(rows: pd.DataFrame, temperature: float, ratio: dict[str, float]
                      ) -> pd.DataFrame:
    """`rows` at `temperature` plus their sampling phases' greedy rows (ms × the phase's
    ratio, temperature 0)."""
    greedy = rows[rows["phase"].isin(list(ratio))].copy()
    scale = greedy["phase"].map(ratio).to_numpy(dtype=float)
    for col in ("ms_median", "ms_p10", "ms_p90"):
        greedy[col] = greedy[col].to_numpy(dtype=float) * scale
    return pd.concat([rows.assign(temperature=float(temperature)),
                      greedy.assign(temperature=0.0)], ignore_index=True)


def _acceptance_rows(
    spec: ModelSpec, method: str, gamma: int, sparsity: float, context: int, temperature: float,
    workload: str, requests: int, iterations: int, request_spread: float, weights_kind: str,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """requests × iterations rows (as columns) of independent per-position Bernoulli(alpha)
    acceptance."""
    alpha = synthetic_alpha(method, sparsity, context, temperature)
    alpha_r = np.clip(alpha + request_spread * rng.standard_normal(requests), 0.0, 1.0)  # [R]
    ok = rng.random((requests, iterations, gamma)) < alpha_r[:, None, None]  # [R, I, γ]
    accepted = np.cumprod(ok, axis=-1).sum(axis=-1)  # [R, I] leading accepted drafts
    # Context at the start of each iteration grows by the tokens produced before it.
    ctx = context + np.cumsum(accepted + 1, axis=1) - (accepted + 1)  # [R, I]
    if temperature == 0.0:
        prob = ok.astype(np.float32)  # greedy: min(1, p/q) is the 1/0 outcome
    else:
        prob = np.broadcast_to(alpha_r[:, None, None], ok.shape).astype(np.float32)
    n = requests * iterations
    ctx_flat = ctx.reshape(n)
    return {
        "method": [method] * n, "gamma": np.full(n, gamma), "sparsity": np.full(n, sparsity),
        "budget": budget(sparsity, ctx_flat + 1, spec.max_positions),
        "context": ctx_flat, "temperature": np.full(n, temperature), "workload": [workload] * n,
        "request": np.repeat(np.arange(requests), iterations),
        "iteration": np.tile(np.arange(iterations), requests),
        "accepted": accepted.reshape(n), "accept_prob": list(prob.reshape(n, gamma)),
        "model_weights": [weights_kind] * n,
    }


def _concat_columns(chunks: list[dict[str, Any]]) -> pd.DataFrame:
    """One DataFrame from column chunks (much faster than concatenating small DataFrames)."""
    out: dict[str, Any] = {}
    for name in chunks[0]:
        parts = [c[name] for c in chunks]
        out[name] = (np.concatenate(parts) if isinstance(parts[0], np.ndarray)
                     else [v for p in parts for v in p])
    return pd.DataFrame(out)


def make_synthetic_trace_set(
    path: str | Path,
    *,
    model: str | ModelSpec = "qwen3-8b",
    seed: int = 0,
    methods: Sequence[str] = METHODS,
    gammas: Sequence[int] = (2, 4, 6),
    sparsities: Sequence[float] = (0.03, 0.07, 0.15),
    contexts: Sequence[int] = (1024, 4096, 16384),
    batches: Sequence[int] = (1, 4, 16),
    weights_kind: str = "real",
    acceptance: bool = True,
    workloads: Sequence[str] = ("synthetic",),
    temperatures: Sequence[float] = (0.0,),
    requests: int = 4,
    iterations: int = 16,
    noise: float = 0.02,
    request_spread: float = 0.0,
    gpu: dict[str, Any] | None = None,
    latency_temperature: float = 0.0,
    greedy_over_sampled: dict[str, float] | None = None,
) -> TraceSet:
    """Write a synthetic trace set to `path` through TraceSetWriter and return it (validated).

    model: preset name or ModelSpec. seed: seeds every random draw (same seed ⇒ same rows).
    methods/gammas/sparsities/contexts/batches: the grid; latency rows cover every phase of
    methods.iteration_plan for each method at every grid point (vanilla ignores γ and s).
    weights_kind: 'real' or 'random' (random sets still get acceptance rows, labelled random,
    so the refusal can be tested). acceptance: False makes a latency-only set.
    workloads/temperatures/requests/iterations: the acceptance grid per (method, γ, s, context).
    noise: log-normal sigma of the latency medians (0 = exact roofline_ms).
    request_spread: std-dev of a per-request offset of alpha (correlates a request's
    iterations; 0 = every request has the same alpha). gpu: meta 'gpu' dict, default
    SYNTHETIC_GPU. latency_temperature: the grid's (recorded in meta.json when not 0);
    greedy_over_sampled {phase: ratio}: with a latency_temperature > 0, the latency rows also
    hold the sampling phases (schema.SAMPLING_PHASES) timed greedy, at ratio × their sampled
    ms (a set of both modes, `calibrate --greedy-latency`); every row then records its
    temperature.
    """
    _refuse_package_dir(Path(path))
    spec, gpu_d = _spec(model), dict(gpu or SYNTHETIC_GPU)
    rng = np.random.default_rng(seed)
    grid = {"methods": list(methods), "gamma": list(gammas), "sparsity": list(sparsities),
            "context": list(contexts), "batch": list(batches),
            "temperature": list(temperatures)}
    if latency_temperature:
        grid["latency_temperature"] = float(latency_temperature)
    meta = synthetic_meta(spec, weights_kind=weights_kind, seed=seed, grid=grid,
                          workloads=workloads, gpu=gpu_d)
    writer = TraceSetWriter(path, meta, durable=False)  # throwaway test data: skip fsyncs
    for method in methods:
        rows = _latency_rows(spec, gpu_d, method, gammas, sparsities, contexts, batches, noise,
                             rng)
        if greedy_over_sampled is not None and latency_temperature:
            rows = _with_greedy_rows(rows, latency_temperature, greedy_over_sampled)
        writer.append_latency(rows, key=f"latency/{method}")
        writer.mark_done(f"latency/{method}")
    if acceptance:
        for method in (m for m in methods if m in SPEC_METHODS):
            chunks = [
                _acceptance_rows(spec, method, g, s, c, t, w, requests, iterations,
                                 request_spread, weights_kind, rng)
                for g in gammas for s in sparsities for c in contexts
                for t in temperatures for w in workloads
            ]
            writer.append_acceptance(_concat_columns(chunks),
                                     key=f"acceptance/{method}")
            writer.mark_done(f"acceptance/{method}")
    return writer.finalize()


def _refuse_package_dir(path: Path) -> None:
    default_dir = PACKAGED_DIR.resolve()
    target = path.resolve()
    if target == default_dir or default_dir in target.parents:
        raise UserInputError(
            "synthetic trace sets must never be written into the packaged defaults",
            where=str(path), fix="write it to a temporary directory (e.g. pytest's tmp_path)")
