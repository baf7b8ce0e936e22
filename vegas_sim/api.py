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
from vegas_sim.errors import UserInputError
from vegas_sim.gpus import GpuSpec, get_gpu
from vegas_sim.methods import MIN_TOKENS, check_gamma, check_method, check_sparsity
from vegas_sim.models import ModelSpec
from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.anchored import AnchoredAcceptance
from vegas_sim.sim.latency import LatencyModel, MeasuredGpu
from vegas_sim.sim.workload import OutputLengths
from vegas_sim.traces.anchors import AnchorSet, load_anchors, packaged_anchor_sets
from vegas_sim.traces.io import TraceSet
from vegas_sim.traces.schema import ACCEPTANCE_FILE, LATENCY_FILE

DEFAULT_MODEL = "qwen3-8b"  # the model predicted when neither --model nor --traces says
NO_ANCHORS = "none"  # --acceptance-anchor none: the shape set's own acceptance level
OUTPUT_COLUMNS = ("output_len", "output_tokens", "output_length", "num_output_tokens")


def output_lengths(text: str | int) -> tuple[int, OutputLengths | None]:
    """``--output-len``: ``N`` → (N, None); ``lognormal:MEAN,CV`` or ``file:PATH[#COLUMN]`` →
    (the mean, rounded, and the distribution). A file holds one length per line, or is a CSV
    whose COLUMN (default: the first of output_len, output_tokens, output_length,
    num_output_tokens, or its only column) holds the lengths."""
    spec = str(text).strip()
    if spec.startswith("file:"):
        dist = OutputLengths.from_samples(_read_lengths(spec[len("file:"):]), spec)
    else:
        dist = OutputLengths.parse(spec)
    dist.validate()
    if dist.kind == "fixed":
        return round(dist.mean), None
    return max(round(dist.mean), 1), dist


def _read_lengths(where: str) -> list[int]:
    path_text, _, column = where.partition("#")
    path = Path(path_text)
    if not path.is_file():
        raise UserInputError(f"no file {path_text!r}", where="--output-len",
                             fix="pass file:PATH of an existing file of output lengths")
    try:
        first = next((ln for ln in path.read_text().splitlines() if ln.strip()), "")
        if "," not in first and not column:
            return [int(float(x)) for x in path.read_text().split()]
        df = pd.read_csv(path)
        name = column or next((c for c in OUTPUT_COLUMNS if c in df.columns),
                              df.columns[0] if len(df.columns) == 1 else "")
        if name not in df.columns:
            raise UserInputError(f"{path_text} has no column {name or 'of output lengths'!r}",
                                 where="--output-len",
                                 fix=f"name the column: file:{path_text}#COLUMN "
                                     f"(columns: {', '.join(map(str, df.columns))})")
        return [int(x) for x in df[name].dropna()]
    except UserInputError:
        raise
    except ValueError as e:
        raise UserInputError(f"cannot read output lengths from {path_text}: {e}",
                             where="--output-len",
                             fix="one integer per line, or a CSV column of integers") from None


def measured_gpu(trace_set: TraceSet) -> MeasuredGpu:
    """The GPU the set was measured on, read (and checked) as the latency model reads it."""
    return MeasuredGpu.from_meta(trace_set.meta["gpu"])


def fit_latency(trace_set: TraceSet) -> LatencyModel:
    """The latency model of a trace set's model on its measured GPU (cached on disk by the
    set's content hash: `sim.fitcache`)."""
    import vegas_sim.sim.latency as latency_code

    spec = ModelSpec.from_dict(trace_set.meta["model"])
    key = fitcache.cache_key("latency", trace_set.meta, LATENCY_FILE, (latency_code,))
    def build() -> LatencyModel:
        model = LatencyModel.fit(trace_set.latency, spec, measured_gpu(trace_set))
        model.loo_errors()  # computed once and cached with the fit: prediction intervals use it
        return model

    return fitcache.cached(key, build)


def fit_acceptance(trace_set: TraceSet) -> AcceptanceModel:
    """The acceptance model of a trace set (cached like `fit_latency`)."""
    import vegas_sim.sim.acceptance as acceptance_code

    key = fitcache.cache_key("acceptance", trace_set.meta, ACCEPTANCE_FILE, (acceptance_code,))
    floor = int(trace_set.meta.get("grid", {}).get("min_tokens", MIN_TOKENS))
    return fitcache.cached(key, lambda: AcceptanceModel.from_traces(
        trace_set.acceptance, trace_set.weights_kind, min_tokens=floor))


def _default_anchor_sets(model_name: str) -> list[AnchorSet]:
    """The packaged anchor sets measured on `model_name`."""
    sets = [load_anchors(name) for name in packaged_anchor_sets()]
    return [s for s in sets if s.model is not None and s.model.lower() == model_name.lower()]


def anchor_acceptance(
    shape: AcceptanceModel, shape_set: TraceSet, model_name: str,
    acceptance_anchors: Sequence[str | Path] = (),
) -> tuple[AnchoredAcceptance, list[str]]:
    """The acceptance model of `shape_set` at the level of `acceptance_anchors` (files or
    packaged names; `sim.anchored`), and notes saying what was used.

    No anchors given: the packaged anchor sets of `model_name` when the shape set was
    measured on another model (its acceptance is then a proxy), else none. ["none"]: none.
    """
    given = [str(a) for a in acceptance_anchors]
    notes: list[str] = []
    sets: list[AnchorSet] = []
    if NO_ANCHORS in given:
        if len(given) > 1:
            raise UserInputError("--acceptance-anchor none cannot be combined with anchor files",
                                 where="--acceptance-anchor",
                                 fix="pass either 'none' or the anchor files")
    elif given:
        sets = [load_anchors(a) for a in given]
    elif shape_set.model_name.lower() != model_name.lower():
        sets = _default_anchor_sets(model_name)
        if sets:
            notes.append(f"{model_name}: acceptance anchors {', '.join(s.name() for s in sets)} "
                         f"(packaged) set the acceptance level by default, on the shape of "
                         f"{shape_set.name}; --acceptance-anchor none uses {shape_set.name}'s "
                         "own level")
    else:
        sets = []
    for s in sets:
        if s.model is not None and s.model.lower() != model_name.lower():
            notes.append(f"acceptance anchors {s.name()} were measured on {s.model}, used for "
                         f"{model_name}")
    model = AnchoredAcceptance(shape, shape_set.name, sets)
    return model, [*notes, *model.notes()]


@functools.lru_cache(maxsize=8)
def load_models(
    model: str | None, traces: Path | None = None, gpu: str | GpuSpec | None = None,
    graph_launch_ms: float | None = None, acceptance_anchors: tuple[str, ...] = (),
) -> tuple[LatencyModel, AnchoredAcceptance, tuple[str, ...]]:
    """Resolve trace sets (packaged by default), fit both models; notes say what was used.

    model None: the model of `traces`, or DEFAULT_MODEL when no set is given.
    acceptance_anchors: anchor files or packaged names (`anchor_acceptance`).

    graph_launch_ms: replace the measured per-step host overhead by this launch cost (what a
    CUDA-graph engine would see); the GPU work keeps its fitted/roofline terms.
    """
    from vegas_sim.traces import catalog

    if model is None and traces is None:
        model = DEFAULT_MODEL
    model = None if model is None else model.lower()  # presets are lower-case: SmolLM2-135M
    latency_set, acceptance_set, notes = catalog.resolve(model, traces)
    latency = fit_latency(latency_set)
    if gpu is not None:  # a datasheet name (--gpu) or a GpuSpec (--gpu-spec FILE)
        target = get_gpu(gpu) if isinstance(gpu, str) else gpu
        latency = latency.what_if(target)
        notes = [*notes, target.label() if isinstance(gpu, GpuSpec) else
                 f"GPU {gpu}: what-if by datasheet ratios — NOT measured"]
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
    acceptance, anchor_notes = anchor_acceptance(
        fit_acceptance(acceptance_set), acceptance_set, latency_set.model_name,
        acceptance_anchors)
    return latency, acceptance, (*notes, *anchor_notes)


def predict_methods(
    *,
    gamma: int = 7,
    sparsity: float = 0.07,
    batch: int = 4,
    context: int = 32768,
    output_len: int | str = 1024,
    methods: Sequence[str] = ("vegas",),
    model: str | None = None,
    traces: Path | None = None,
    gpu: str | GpuSpec | None = None,
    graph_launch_ms: float | None = None,
    requests: int | None = None,
    arrival: str = "closed",
    workload: str | None = None,
    temperature: float = 0.0,
    prefill: str = "disaggregated",
    engine: str = "sim",
    seed: int = 0,
    replications: int = 5,
    kv_block_size: int = 16,
    acceptance_anchors: Sequence[str | Path] = (),
) -> tuple[pd.DataFrame, list[str]]:
    """Predict one configuration for each method (plus vanilla, the baseline).

    ``output_len``: N, ``lognormal:MEAN,CV`` or ``file:PATH`` (`output_lengths`)."""
    from vegas_sim.sim.predict import Scenario, predict

    check_gamma(gamma)
    check_sparsity(sparsity)
    ordered = ["vanilla", *[check_method(m) for m in methods if m != "vanilla"]]
    out_mean, out_dist = output_lengths(output_len)
    latency, acceptance, notes = load_models(model, traces, gpu, graph_launch_ms,
                                             tuple(str(a) for a in acceptance_anchors))
    # vanilla's row says γ 1, sparsity 1 (one token, full attention), as sweep's rows do
    scenarios = [
        Scenario(method=m, gamma=gamma if m != "vanilla" else 1,
                 sparsity=sparsity if m != "vanilla" else 1.0, batch=batch, context=context,
                 output_len=out_mean, requests=requests, arrival=arrival, workload=workload,
                 temperature=temperature, prefill=prefill, output_dist=out_dist,
                 kv_block_size=kv_block_size)
        for m in ordered
    ]
    table = predict(scenarios, latency, acceptance, seed=seed, replications=replications,
                    engine=engine)
    return table, list(notes)


def latency_loo(trace_set: TraceSet) -> tuple[LatencyModel, pd.DataFrame]:
    """The latency model of a trace set and its leave-one-out error per phase
    (`LatencyModel.loo_errors`: phase, n_points, median_pct, max_pct), both cached on disk
    like `fit_latency`: the leave-one-out refits every group once per measured point."""
    import vegas_sim.sim.latency as latency_code

    model = fit_latency(trace_set)
    key = fitcache.cache_key("latency-loo", trace_set.meta, LATENCY_FILE, (latency_code,))
    return model, fitcache.cached(key, model.loo_errors)
