"""Notebook-friendly entry points: every CLI command is one of these functions.

    >>> from vegas_sim import api
    >>> table, notes = api.predict_methods(gamma=7, methods=("vegas",), context=32768)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from vegas_sim import fitcache
from vegas_sim.gpus import get_gpu
from vegas_sim.methods import MIN_TOKENS, check_gamma, check_method, check_sparsity
from vegas_sim.models import ModelSpec

WEIGHT_FORMAT_NOTES = {
    "fp8": "1 byte per layer-projection parameter; router and LM head in bf16",
    "mxfp4": "4.25 bits per expert parameter; attention, router and LM head in bf16",
}
from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.latency import LatencyModel, MeasuredGpu
from vegas_sim.traces.io import TraceSet
from vegas_sim.traces.schema import ACCEPTANCE_FILE, LATENCY_FILE

DEFAULT_MODEL = "qwen3-8b"  # the model predicted when neither --model nor --traces says


def measured_gpu(trace_set: TraceSet) -> MeasuredGpu:
    """The GPU the set was measured on, read (and checked) as the latency model reads it."""
    return MeasuredGpu.from_meta(trace_set.meta["gpu"])


def fit_latency(trace_set: TraceSet) -> LatencyModel:
    """The latency model of a trace set's model on its measured GPU (cached on disk by the
    set's content hash: `sim.fitcache`)."""
    import vegas_sim.sim.latency as latency_code

    spec = ModelSpec.from_dict(trace_set.meta["model"])
    key = fitcache.cache_key("latency", trace_set.meta, LATENCY_FILE, (latency_code,))
    return fitcache.cached(key, lambda: LatencyModel.fit(trace_set.latency, spec,
                                                         measured_gpu(trace_set)))


def fit_acceptance(trace_set: TraceSet) -> AcceptanceModel:
    """The acceptance model of a trace set (cached like `fit_latency`)."""
    import vegas_sim.sim.acceptance as acceptance_code

    key = fitcache.cache_key("acceptance", trace_set.meta, ACCEPTANCE_FILE, (acceptance_code,))
    floor = int(trace_set.meta.get("grid", {}).get("min_tokens", MIN_TOKENS))
    return fitcache.cached(key, lambda: AcceptanceModel.from_traces(
        trace_set.acceptance, trace_set.weights_kind, min_tokens=floor))


@functools.lru_cache(maxsize=8)
def load_models(
    model: str | None, traces: Path | None = None, gpu: str | None = None,
    graph_launch_ms: float | None = None, weight_format: str = "bf16",
) -> tuple[LatencyModel, AcceptanceModel, tuple[str, ...]]:
    """Resolve trace sets (packaged by default), fit both models; notes say what was used.

    model None: the model of `traces`, or DEFAULT_MODEL when no set is given.

    graph_launch_ms: replace the measured per-step host overhead by this launch cost (what a
    CUDA-graph engine would see); the GPU work keeps its fitted/roofline terms.

    weight_format: "fp8" / "mxfp4" rescale the weight bytes along the fitted roofline
    (models.WEIGHT_FORMATS; a what-if, not measured).
    """
    from vegas_sim.traces import catalog

    if model is None and traces is None:
        model = DEFAULT_MODEL
    model = None if model is None else model.lower()  # presets are lower-case: SmolLM2-135M
    latency_set, acceptance_set, notes = catalog.resolve(model, traces)
    latency = fit_latency(latency_set)
    if gpu is not None:
        latency = latency.what_if(get_gpu(gpu))
        notes = [*notes, f"GPU {gpu}: what-if by datasheet ratios — NOT measured"]
    if graph_launch_ms is None and latency.host_bound_share() > 0.5:
        notes = [*notes, (f"{latency.host_bound_share():.0%} of the measured latency points are "
                          "host-bound (the host's work per step exceeds the GPU's: an eager "
                          "runtime, or a small model): predictions are for that runtime; "
                          "--graph-launch-ms 0.5 replaces the host floor by a fixed launch cost "
                          "(what-if, not measured)")]
    if graph_launch_ms is not None:
        latency = latency.without_host_overhead(graph_launch_ms)
        notes = [*notes, (f"host overhead replaced by {graph_launch_ms} ms per step "
                          "(CUDA-graph what-if) — NOT measured")]
    if weight_format != "bf16":
        latency = latency.with_weight_format(weight_format)
        notes = [*notes, (f"{weight_format} weights: what-if — weight bytes rescaled "
                          f"({WEIGHT_FORMAT_NOTES[weight_format]}) and priced at the fitted "
                          "weight-stream efficiency; dequantisation cost not modelled — NOT "
                          "measured")]
    return latency, fit_acceptance(acceptance_set), tuple(notes)


def predict_methods(
    *,
    gamma: int = 7,
    sparsity: float = 0.07,
    batch: int = 4,
    context: int = 32768,
    output_len: int = 1024,
    methods: Sequence[str] = ("vegas",),
    model: str | None = None,
    traces: Path | None = None,
    gpu: str | None = None,
    graph_launch_ms: float | None = None,
    weight_format: str = "bf16",
    requests: int | None = None,
    arrival: str = "closed",
    workload: str | None = None,
    temperature: float = 0.0,
    prefill: str = "disaggregated",
    engine: str = "sim",
    seed: int = 0,
    replications: int = 5,
) -> tuple[pd.DataFrame, list[str]]:
    """Predict one configuration for each method (plus vanilla, the baseline)."""
    from vegas_sim.sim.predict import Scenario, predict

    check_gamma(gamma)
    check_sparsity(sparsity)
    ordered = ["vanilla", *[check_method(m) for m in methods if m != "vanilla"]]
    latency, acceptance, notes = load_models(model, traces, gpu, graph_launch_ms, weight_format)
    # vanilla's row says γ 1, sparsity 1 (one token, full attention), as sweep's rows do
    scenarios = [
        Scenario(method=m, gamma=gamma if m != "vanilla" else 1,
                 sparsity=sparsity if m != "vanilla" else 1.0, batch=batch, context=context,
                 output_len=output_len, requests=requests, arrival=arrival, workload=workload,
                 temperature=temperature, prefill=prefill)
        for m in ordered
    ]
    table = predict(scenarios, latency, acceptance, seed=seed, replications=replications,
                    engine=engine)
    return table, list(notes)
