"""Notebook-friendly entry points: the CLI's commands as functions.

predict, sweep, tune, load_traces, check_traces and show_traces are here (re-exported as
`vegas_sim.predict` etc. with `vegas_sim.report` and `vegas_sim.repredict`, which live with
the reports and validate code); the fits they share (`load_models`, `fit_latency`) too.

    >>> from vegas_sim import api
    >>> table = api.predict(gamma=7, methods=("vegas",), context=32768)
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pandas as pd

from vegas_sim import fitcache
from vegas_sim.bounds import check_grid, check_options
from vegas_sim.errors import UserInputError
from vegas_sim.gpus import GpuSpec, datasheet_for_device, get_gpu, resolve_gpu
from vegas_sim.grids import (
    grid_text,
    int_box,
    one_int,
    one_sparsity,
    parse_int_grid,
    sparsity_box,
)
from vegas_sim.models import get_preset, model_family
from vegas_sim.methods import (
    DEFAULT_SPARSITY,
    VANILLA,
    check_gamma,
    check_method,
    check_sparsity,
    point_of,
)
from vegas_sim.progress import Progress, Say, StepProgress
from vegas_sim.sim import acceptance as acceptance_module
from vegas_sim.sim import (
    acceptance_dist,
    anchored as anchored_module,
    context_trend,
    latency_features,
    latency_fit,
    sparsity_trend,
)
from vegas_sim.sim import latency as latency_module
from vegas_sim.sim.acceptance import AcceptanceModel, PastWindow
from vegas_sim.sim.anchored import AnchoredAcceptance, MethodShift
from vegas_sim.sim.latency import LatencyModel
from vegas_sim.sim.parallel import TensorParallel
from vegas_sim.sim.predict import Scenario
from vegas_sim.sim.predict import predict as predict_scenarios
from vegas_sim.sim.uncertainty import LOO_QUANTILE
from vegas_sim.sim.options import options_for, scenario_extra
from vegas_sim.sim.workload import Arrivals, OutputLengths
from vegas_sim.traces import catalog, io
from vegas_sim.traces.anchors import AnchorSet, load_anchors, packaged_anchor_sets
from vegas_sim.traces.io import TraceSet
from vegas_sim.traces.meta import TraceSetMeta
from vegas_sim.traces.schema import ACCEPTANCE_FILE, LATENCY_FILE
from vegas_sim.workload_info import describe

if TYPE_CHECKING:  # imported where used: a predict does not pay for sweep's and tune's code
    from vegas_sim.sim.sweep import SweepGrid
    from vegas_sim.sim.tune import TuneConfig, TuneResult

DEFAULT_MODEL = "qwen3-8b"  # the model predicted when neither --model nor --traces says
WEIGHT_FORMAT_NOTES = {
    "fp8": "1 byte per layer-projection parameter; router and LM head in bf16",
    "mxfp4": "4.25 bits per expert parameter; attention, router and LM head in bf16",
}
# The modules whose code a cached latency fit depends on: a change to any refits.
LATENCY_CODE = (latency_module, latency_features, latency_fit)
ACCEPTANCE_CODE = (acceptance_module, acceptance_dist, context_trend, sparsity_trend)
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


def fit_latency(trace_set: TraceSet) -> LatencyModel:
    """The latency model of a trace set's model on its measured GPU (cached on disk by the
    set's content hash: `sim.fitcache`)."""
    key = fitcache.cache_key("latency", trace_set.meta, LATENCY_FILE, LATENCY_CODE)

    def build() -> LatencyModel:
        model = LatencyModel.from_meta(trace_set.latency, trace_set.meta)
        model.loo_errors()  # computed once and cached with the fit: prediction intervals use it
        model.fill_loo_quantiles(LOO_QUANTILE)  # (its quantile per group, what they read)
        for mode in model.measured_modes:  # a set of both modes: the other's fits likewise
            other = model.for_temperature(0.0 if mode == "greedy" else 1.0)
            other.loo_errors()
            other.fill_loo_quantiles(LOO_QUANTILE)
        return model

    return _named(fitcache.cached(key, build), trace_set.name)


def fit_acceptance(trace_set: TraceSet) -> AcceptanceModel:
    """The acceptance model of a trace set (cached like `fit_latency`)."""
    key = fitcache.cache_key("acceptance with trends", trace_set.meta, ACCEPTANCE_FILE,
                             ACCEPTANCE_CODE)
    floor = trace_set.info.grid.min_tokens

    def build() -> AcceptanceModel:
        model = AcceptanceModel.from_traces(trace_set.acceptance, trace_set.weights_kind,
                                            min_tokens=floor)
        model.context_trends()  # fitted once and cached with the model: lookups past the
        model.coverage()  # traced contexts use them (the first such lookup fits them all);
        return model  # the traced ranges, which every predict row's intervals read

    return with_calibration(_named(fitcache.cached(key, build), trace_set.name), trace_set.info)


def with_calibration(model: AcceptanceModel, info: TraceSetMeta) -> AcceptanceModel:
    """`model` (in place) with the context-trend sd scale of the set `info` describes, where it
    carries one (meta.json `acceptance_calibration`); a model fitted on part of that set's rows
    (a hold-out) takes the set's."""
    if info.context_trend_sd_scale is not None:
        model.trend_sd_scale = info.context_trend_sd_scale
        model.trend_sd_scale_from = "this set's context hold-out"
    return model


_Model = TypeVar("_Model", LatencyModel, AcceptanceModel)


def _named(fitted: _Model, trace_set: str) -> _Model:
    """A shallow copy of a (cached) fitted model that carries its trace set's name: two sets of
    one content share the cached fit but not the name the rows carry."""
    named = copy.copy(fitted)
    named.trace_set = trace_set
    return named


def _default_anchor_sets(model_name: str) -> list[AnchorSet]:
    """The packaged anchor sets measured on `model_name`; without one, those of its family
    (`models.model_family`: Qwen3-8B's published acceptance for Qwen3-4B): a sibling's level
    is nearer than the proxy's own, and its rows carry the `model` transfer axis."""
    sets = [(s, s.model) for s in (load_anchors(name) for name in packaged_anchor_sets())
            if s.model is not None]
    own = [s for s, model in sets if model.lower() == model_name.lower()]
    return own or [s for s, model in sets if model_family(model) == model_family(model_name)]


def anchor_acceptance(
    shape: AcceptanceModel, shape_set: TraceSet, model_name: str,
    acceptance_anchors: Sequence[str | Path] = (),
) -> tuple[AnchoredAcceptance, list[str]]:
    """The acceptance model of `shape_set` at the level of `acceptance_anchors` (files or
    packaged names; `sim.anchored`), and notes saying what was used.

    No anchors given: the packaged anchor sets of `model_name` (else of its family,
    `_default_anchor_sets`) when the shape set was measured on another model (its acceptance
    is then a proxy), else none. ["none"]: none.
    """
    given = [str(a) for a in acceptance_anchors]
    notes: list[str] = []
    sets: list[AnchorSet] = []
    proxy = shape_set.model_name.lower() != model_name.lower()
    if NO_ANCHORS in given:
        if len(given) > 1:
            raise UserInputError("--acceptance-anchor none cannot be combined with anchor files",
                                 where="--acceptance-anchor",
                                 fix="pass either 'none' or the anchor files")
    elif given:
        sets = [load_anchors(a) for a in given]
    elif proxy:
        sets = _default_anchor_sets(model_name)
        if sets:
            notes.append(f"{model_name}: acceptance anchors {', '.join(s.name() for s in sets)} "
                         f"(packaged) set the acceptance level by default, on the shape of "
                         f"{shape_set.name}; --acceptance-anchor none uses {shape_set.name}'s "
                         "own level")
    others = sorted({s.model for s in sets
                     if s.model is not None and s.model.lower() != model_name.lower()})
    for s in sets:
        if s.model in others:
            notes.append(f"acceptance anchors {s.name()} were measured on {s.model}, used for "
                         f"{model_name}: another model's level, its spread in the interval "
                         "('anchors: model')")
    model = _anchored(shape, shape_set, sets, others[0] if others else None,
                      shape_set.model_name if proxy else None)
    return model, [*notes, *model.notes()]


def _files_stamp(paths: Sequence[str | Path | None]) -> tuple[tuple[str, int, int], ...]:
    """(file, mtime_ns, size) of each named trace set's meta and tables (or of a named file,
    an anchors file): what an edit on disk changes. Names that are no path (packaged sets,
    presets) give nothing: the package does not change under a running process."""
    stamp = []
    for named in paths:
        if named is None:
            continue
        path = Path(named)
        for file in ([path / n for n in ("meta.json", LATENCY_FILE, ACCEPTANCE_FILE)]
                     if path.is_dir() else [path]):
            with contextlib.suppress(OSError):
                st = file.stat()
                stamp.append((str(file), st.st_mtime_ns, st.st_size))
    return tuple(stamp)



def _anchored(shape: AcceptanceModel, shape_set: TraceSet, sets: list[AnchorSet],
              anchor_model: str | None = None, shape_model: str | None = None
              ) -> AnchoredAcceptance:
    """`AnchoredAcceptance(shape, ...)` with its fitted shifts cached on disk: the key is the
    shape's fit key, the anchors and the code that fits them. anchor_model / shape_model: the
    models whose levels stand in for the predicted one's (`AnchoredAcceptance`)."""
    if not sets:
        return AnchoredAcceptance(shape, shape_set.name, sets, anchor_model=anchor_model,
                                  shape_model=shape_model)
    shape_key = fitcache.cache_key("acceptance with trends", shape_set.meta, ACCEPTANCE_FILE,
                                   ACCEPTANCE_CODE)
    key = None if shape_key is None else fitcache.key(
        "anchor shifts", {"shape": shape_key, "anchors": [repr(s) for s in sets],
                          "past_window": shape.past_window_key},
        (*ACCEPTANCE_CODE, anchored_module))
    fitted: list[AnchoredAcceptance] = []

    def fit() -> dict[str, MethodShift]:
        fitted.append(AnchoredAcceptance(shape, shape_set.name, sets, anchor_model=anchor_model,
                                         shape_model=shape_model))
        return fitted[0].shifts

    shifts = fitcache.cached(key, fit)
    return fitted[0] if fitted else AnchoredAcceptance(
        shape, shape_set.name, sets, shifts, anchor_model=anchor_model, shape_model=shape_model)


def load_models(
    model: str | None, traces: Path | None = None, gpu: str | GpuSpec | None = None,
    graph_launch_ms: float | None = None, acceptance_anchors: tuple[str, ...] = (),
    weight_format: str = "bf16", acceptance_traces: Path | None = None,
    tensor_parallel: int = 1, model_what_if: str | None = None,
) -> tuple[LatencyModel, AnchoredAcceptance, tuple[str, ...]]:
    """Resolve trace sets (packaged by default), fit both models; notes say what was used.
    Kept in memory for the next call with the same arguments, until a named set or anchors
    file changes on disk (`_files_stamp`): a notebook that re-finalizes a set gets its new fit.

    model None: the model of `traces`, or DEFAULT_MODEL when no set is given.
    acceptance_anchors: anchor files or packaged names (`anchor_acceptance`).
    acceptance_traces: the real-weights set whose acceptance to use (a directory or a packaged
    name, e.g. smollm2-135m-real-yarn4) [default: `catalog.resolve`'s choice].

    graph_launch_ms: replace the measured per-step host overhead by this launch cost (what a
    CUDA-graph engine would see); the GPU work keeps its fitted/roofline terms.

    weight_format: "fp8" / "mxfp4" rescale the weight bytes along the fitted roofline
    (models.WEIGHT_FORMATS; a what-if, not measured).

    tensor_parallel: GPUs in one tensor-parallel group (`sim.parallel`; > 1 is a what-if whose
    collectives are modelled, not measured). model_what_if: a preset whose shape to price at
    the latency set's fits (`LatencyModel.for_model`; a what-if).
    """
    stamp = _files_stamp([traces, acceptance_traces, *acceptance_anchors])
    return _load_models(model, traces, gpu, graph_launch_ms, acceptance_anchors, weight_format,
                        acceptance_traces, tensor_parallel, model_what_if, stamp)


@functools.lru_cache(maxsize=8)
def _load_models(
    model: str | None, traces: Path | None, gpu: str | GpuSpec | None,
    graph_launch_ms: float | None, acceptance_anchors: tuple[str, ...], weight_format: str,
    acceptance_traces: Path | None, tensor_parallel: int, model_what_if: str | None,
    stamp: tuple[tuple[str, int, int], ...],
) -> tuple[LatencyModel, AnchoredAcceptance, tuple[str, ...]]:
    """`load_models`, memoised by its arguments and the named files' `stamp`."""
    if model is None and traces is None:
        model = DEFAULT_MODEL
    model = None if model is None else model.lower()  # presets are lower-case: SmolLM2-135M
    gpu_name = gpu if isinstance(gpu, str) else None
    latency_set, acceptance_set, notes = catalog.resolve(model, traces,
                                                         acceptance=acceptance_traces,
                                                         gpu=gpu_name)
    latency = fit_latency(latency_set)
    if model_what_if is not None:
        latency = latency.for_model(get_preset(model_what_if.lower()))
        notes = [*notes, (f"model {latency.model.name}: its shape priced at the efficiencies "
                          f"fitted on {latency_set.model_name} ({latency_set.name}) — NOT "
                          "measured")]
    target = None
    if gpu is not None:  # a datasheet name (--gpu) or a GpuSpec (--gpu-spec FILE)
        target = get_gpu(gpu) if isinstance(gpu, str) else gpu
        if catalog.measured_on(latency_set, gpu_name):  # the set was measured on that GPU
            notes = [*notes, f"GPU {gpu}: measured ({latency_set.name})"]
        else:
            latency = latency.what_if(target)
            notes = [*notes, target.label() if isinstance(gpu, GpuSpec) else
                     f"GPU {gpu}: what-if by datasheet ratios — NOT measured"]
    measured_tp = latency.tensor_parallel
    if measured_tp.measured and tensor_parallel == measured_tp.size:
        notes = [*notes, measured_tp.label]
    elif tensor_parallel != 1 or measured_tp.measured:  # a what-if, or refused on a TP-N set
        link = target or datasheet_for_device(latency.measured_gpu.name)
        tp = TensorParallel.of(latency.model, tensor_parallel, link)
        latency = latency.with_tensor_parallel(tp)
        notes = [*notes, tp.label]
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
    shape = fit_acceptance(acceptance_set)
    if acceptance_traces is None:  # a lookup that uses it says so in its row's notes
        shape = _past_native_window(shape, acceptance_set, latency.model.name)
    acceptance, anchor_notes = anchor_acceptance(
        shape, acceptance_set, latency.model.name, acceptance_anchors)
    return latency, acceptance, (*notes, *anchor_notes)


def _past_native_window(shape: AcceptanceModel, shape_set: TraceSet, model: str
                        ) -> AcceptanceModel:
    """`shape`, answering contexts past `model`'s native positions (`catalog.NATIVE_POSITIONS`:
    it runs RoPE-scaled there) from the shape model's RoPE-scaled set where one is packaged
    (`AcceptanceModel.past_window`); unchanged otherwise."""
    window = catalog.NATIVE_POSITIONS.get(model)
    scaled = None if window is None else catalog.scaled_companion(shape_set)
    if window is None or scaled is None:
        return shape
    past = PastWindow(window, functools.partial(_fit_packaged, scaled.name), scaled.name, model)
    return shape.past_window(past)


def _fit_packaged(name: str) -> AcceptanceModel:
    """The fitted acceptance of a packaged set, by name (picklable for sweep workers)."""
    return fit_acceptance(io.load_trace_set(name))


def latency_loo(trace_set: TraceSet) -> tuple[LatencyModel, pd.DataFrame]:
    """The latency model of a trace set and its leave-one-out error per phase
    (`LatencyModel.loo_errors`: phase, n_points, median_pct, max_pct), both cached on disk
    like `fit_latency`: the leave-one-out refits every group once per measured point."""
    model = fit_latency(trace_set)
    key = fitcache.cache_key("latency-loo", trace_set.meta, LATENCY_FILE, LATENCY_CODE)
    return model, fitcache.cached(key, model.loo_errors)


# ---------------------------------------------------------------------------------------------
# The commands as functions, with the CLI's options and defaults (`vegas_sim.predict` etc. are
# these, re-exported by vegas_sim/__init__.py with `report` and `repredict`). Their parameters
# are the entries of `sim.options` for the command (tests/test_api_cli_parity.py keeps the two
# one list; the options' help is in `vegas-sim COMMAND --help` and `options_help`). They return
# tables and objects and print nothing; writing files is the caller's (DataFrame.to_csv, or
# `vegas_sim.reports.csv.write_table` for the CLI's flat layout).

Grid = str | int | float | Sequence[int | float]  # '2..12', '1K,32K', 7, [1, 4, 16]


def options_help(command: str) -> str:
    """Every parameter of `command`'s function (predict, sweep, tune) with its default and its
    help: the CLI's --help text of the same options."""
    return "\n".join(f"{o.name} = {o.default!r}: {o.help}" for o in options_for(command))


def _what_if_gpu(gpu: str | GpuSpec | None, gpu_spec: str | Path | None
                 ) -> str | GpuSpec | None:
    if isinstance(gpu, GpuSpec):
        if gpu_spec is not None:
            raise UserInputError("gpu and gpu_spec both name a target GPU", where="gpu",
                                 fix="give one of them")
        return gpu
    if gpu is not None and gpu_spec is None:
        get_gpu(gpu)  # unknown names fail before any fitting
        return gpu
    return resolve_gpu(gpu, None if gpu_spec is None else Path(gpu_spec))


def _path(value: str | Path | None) -> Path | None:
    return None if value is None else Path(value)


def models_for(values: Mapping[str, Any]
               ) -> tuple[LatencyModel, AnchoredAcceptance, list[str]]:
    """`load_models` of a command's option values (model, traces, acceptance_traces,
    acceptance_anchors, gpu, gpu_spec, graph_launch_ms, weight_format)."""
    latency, acceptance, notes = load_models(
        values["model"], _path(values["traces"]),
        _what_if_gpu(values["gpu"], values["gpu_spec"]), values["graph_launch_ms"],
        tuple(str(a) for a in values["acceptance_anchors"]), values["weight_format"],
        _path(values["acceptance_traces"]), values["tensor_parallel"],
        values["model_what_if"])
    workload = values.get("workload")
    asked = set(values.get("methods") or ())  # predict's and sweep's; tune ranks every method
    kept = [n for n in notes if not (asked and isinstance(n, catalog.MethodsNote)
                                     and n.methods.isdisjoint(asked))]
    return latency, acceptance, [*kept, f"workload {workload or 'all'}: {describe(workload)}"]


def predict(
    *,
    gamma: int = 7,
    sparsity: float | str = DEFAULT_SPARSITY,
    batch: int = 4,
    context: int | str = "32K",
    output_len: int | str = 1024,
    methods: Sequence[str] = ("vegas",),
    model: str | None = None,
    traces: str | Path | None = None,
    acceptance_traces: str | Path | None = None,
    acceptance_anchors: Sequence[str | Path] = (),
    model_what_if: str | None = None,
    gpu: str | GpuSpec | None = None,
    gpu_spec: str | Path | None = None,
    tensor_parallel: int = 1,
    graph_launch_ms: float | None = None,
    weight_format: str = "bf16",
    requests: int | None = None,
    arrival: str | Arrivals = "closed",
    slo_tpot_ms: float | None = None,
    slo_ttft_ms: float | None = None,
    workload: str | None = None,
    temperature: float = 0.0,
    prefill: str = "disaggregated",
    prefill_gpus: int = 1,
    kv_link_gbs: float = 50.0,
    kv_block_size: int = 16,
    gpu_memory_utilization: float = 0.9,
    engine: str = "sim",
    seed: int = 0,
    replications: int = 5,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """`vegas-sim predict` as a function: one row per method (vanilla first), every metric
    with its 95 % CI (docs/OUTPUTS.md); ``table.attrs["notes"]`` says where the inputs came
    from and what was extrapolated (the lines the CLI prints as notes). ``progress(done,
    total)`` is called after each method's row.

    context takes 32768 or '32K'; sparsity 0.07 or '7%'; output_len N, 'lognormal:MEAN,CV'
    or 'file:PATH' (`output_lengths`); arrival the --arrival text or an `Arrivals`; gpu a datasheet name or a GpuSpec, gpu_spec a
    JSON/TOML file (`--gpu-spec`); the SLOs set the goodput column (`sim.metrics.Slo`).
    Every parameter: `options_help("predict")`.

        >>> import vegas_sim
        >>> table = vegas_sim.predict(gamma=7, context="32K", engine="analytic")
        >>> list(table["method"])
        ['vanilla', 'vegas']
    """
    values = {k: v for k, v in locals().items() if k != "progress"}
    check_options(values)  # every bounded number, before any fitting
    shared = scenario_extra("predict", values)  # --arrival parsed here, once
    context_tokens = one_int(context, "--context")
    ratio = one_sparsity(sparsity)
    check_gamma(gamma)
    check_sparsity(ratio)
    ordered = [VANILLA, *[check_method(m) for m in methods if m != VANILLA]]
    out_mean, out_dist = output_lengths(output_len)
    latency, acceptance, notes = models_for(values)
    scenarios = [Scenario(method=m, gamma=point_of(m, gamma, ratio)[0],
                          sparsity=point_of(m, gamma, ratio)[1], batch=batch,
                          context=context_tokens, output_len=out_mean, output_dist=out_dist,
                          **shared)
                 for m in ordered]
    table = predict_scenarios(scenarios, latency, acceptance, seed=seed,
                              replications=replications, engine=engine, progress=progress)
    table.attrs["notes"] = notes
    return table


def sweep_setup(values: Mapping[str, Any]
                ) -> tuple[SweepGrid, LatencyModel, AnchoredAcceptance, list[str]]:
    """The grid and the models of a sweep's option values (`sweep`'s parameters): what
    `sweep` runs, and what the CLI runs with its checkpoint (`runs.sweep_to_file`)."""
    from vegas_sim.sim.sweep import SweepGrid

    check_options(values)
    grid = SweepGrid.parse(methods=values["methods"], gamma=grid_text(values["gamma"]),
                           sparsity=grid_text(values["sparsity"]),
                           batch=grid_text(values["batch"]),
                           context=grid_text(values["context"]),
                           output_len=grid_text(values["output_len"]),
                           extra=scenario_extra("sweep", values))
    latency, acceptance, notes = models_for(values)
    return grid, latency, acceptance, notes


def sweep(
    *,
    gamma: Grid = "2..12",
    sparsity: Grid = "0.01,0.03,0.05,0.07,0.1",
    batch: Grid = "4",
    context: Grid = "32K",
    output_len: Grid = "1024",
    methods: Sequence[str] = ("vegas",),
    model: str | None = None,
    traces: str | Path | None = None,
    acceptance_traces: str | Path | None = None,
    acceptance_anchors: Sequence[str | Path] = (),
    model_what_if: str | None = None,
    gpu: str | GpuSpec | None = None,
    gpu_spec: str | Path | None = None,
    tensor_parallel: int = 1,
    graph_launch_ms: float | None = None,
    weight_format: str = "bf16",
    requests: int | None = None,
    arrival: str | Arrivals = "closed",
    slo_tpot_ms: float | None = None,
    slo_ttft_ms: float | None = None,
    workload: str | None = None,
    temperature: float = 0.0,
    engine: str = "analytic",
    workers: int | None = None,
    scheduler: Any = None,
    seed: int = 0,
    replications: int = 5,
) -> pd.DataFrame:
    """`vegas-sim sweep` as a function: one row per configuration (and engine), the same
    rows the CLI writes to --out (without its checkpoint: a stopped call keeps nothing).
    Grids take the CLI's strings ('2..12', '1K,32K') or lists; ``attrs["notes"]`` has the
    notes, ``attrs["skipped"]`` the configurations that do not fit. Every parameter:
    `options_help("sweep")`.

        >>> import vegas_sim
        >>> rows = vegas_sim.sweep(gamma=[4, 6], sparsity="0.05,0.1", workers=1)
        >>> len(rows)  # 2 γ × 2 sparsities of vegas, and vanilla
        5
    """
    grid, latency, acceptance, notes = sweep_setup(locals())
    from vegas_sim.sim.sweep import sweep as run_sweep

    table = run_sweep(grid, latency, acceptance, engine=engine, seed=seed,
                      replications=replications, workers=workers, scheduler=scheduler)
    table.attrs["notes"] = [*notes, *table.attrs.get("skipped", [])]
    return table


def _one_output_len(value: int | str) -> int:
    """Tune's output length: one number of tokens (its search prices every configuration at
    it); a distribution or a grid is refused with what to pass instead."""
    if isinstance(value, int) and not isinstance(value, bool):
        lengths = [value]
    elif isinstance(value, str) and ":" not in value:
        lengths = parse_int_grid(value, "--output-len")
    else:
        lengths = []
    if len(lengths) != 1:
        raise UserInputError(
            f"tune takes one output length in tokens, got {value!r}", where="--output-len",
            fix="pass one length, e.g. a distribution's mean (--output-len 300); predict "
                "takes a distribution (lognormal:MEAN,CV, file:PATH)")
    return lengths[0]


def tune_setup(values: Mapping[str, Any]) -> tuple[list[tuple[int, int]], TuneConfig]:
    """The (batch, context) cells and the search of a tune's option values."""
    from vegas_sim.sim.tune import TuneConfig

    check_options(values)
    cells = [(b, c) for b in parse_int_grid(grid_text(values["batch"]), "--batch")
             for c in parse_int_grid(grid_text(values["context"]), "--context")]
    check_grid("batch", [b for b, _ in cells])
    check_grid("gamma", int_box(values["gamma"]) or ())
    config = TuneConfig(method=values["method"], output_len=_one_output_len(values["output_len"]),
                        stable_pct=values["stable_pct"], final_engine=values["final_engine"],
                        search_engine=values["search_engine"], rank_by=values["rank_by"],
                        outside_evidence=values["outside_evidence"],
                        tie_pct=values["tie_pct"], gamma_range=int_box(values["gamma"]),
                        sparsity_range=sparsity_box(values["sparsity"]),
                        extra=scenario_extra("tune", values))
    return cells, config


def tune(
    *,
    gamma: str | tuple[int, int] | None = None,
    sparsity: str | tuple[float, float] | None = None,
    batch: Grid = "1,4,16",
    context: Grid = "32K",
    output_len: int = 1024,
    method: str = "vegas",
    model: str | None = None,
    traces: str | Path | None = None,
    acceptance_traces: str | Path | None = None,
    acceptance_anchors: Sequence[str | Path] = (),
    model_what_if: str | None = None,
    gpu: str | GpuSpec | None = None,
    gpu_spec: str | Path | None = None,
    tensor_parallel: int = 1,
    graph_launch_ms: float | None = None,
    weight_format: str = "bf16",
    requests: int | None = None,
    arrival: str | Arrivals = "closed",
    slo_tpot_ms: float | None = None,
    slo_ttft_ms: float | None = None,
    workload: str | None = None,
    temperature: float = 0.0,
    final_engine: str = "analytic",
    search_engine: str = "analytic",
    outside_evidence: str = "pi_low",
    tie_pct: float = 1.0,
    stable_pct: float = 5.0,
    rank_by: str = "throughput",
    workers: int | None = None,
    scheduler: Any = None,
    seed: int = 0,
    progress: StepProgress | None = None,
    say: Say | None = None,
) -> TuneResult:
    """`vegas-sim tune` as a function: the paper's three-step search per (batch, context).
    Returns the TuneResult: ``.cells`` (one row per cell: the chosen γ, sparsity, throughput,
    speedups and CIs), ``.steps`` (every configuration evaluated), ``.notes``, and
    ``.serving_table()`` (the JSON the CLI writes: vLLM, SGLang, TensorRT-LLM sections).
    gamma / sparsity: the search box, 'LO..HI' or (LO, HI) [default: the traces' span].
    progress(step, done, total) and say(text) report as the search goes (the CLI's bars
    and lines). Every parameter: `options_help("tune")`.

        >>> import vegas_sim
        >>> result = vegas_sim.tune(batch=[1, 4], context="32K", workers=1)
        >>> sorted(result.gamma_by_batch())
        [1, 4]
    """
    cells, config = tune_setup(locals())
    latency, acceptance, notes = models_for(locals())
    from vegas_sim.sim.tune import tune as run_tune

    result = run_tune(cells, latency, acceptance, config=config, seed=seed, workers=workers,
                      scheduler=scheduler, progress=progress, say=say,
                      model=latency.model.name)
    result.notes.extend(notes)
    return result


def load_traces(directory: str | Path) -> TraceSet:
    """A trace set (a directory, or a packaged set's name: `vegas-sim traces list`), read and
    checked against its content hash: ``.meta``, ``.latency``, ``.acceptance`` (DataFrames)."""
    return io.load_trace_set(directory)


def check_traces(directory: str | Path) -> list[str]:
    """`vegas-sim traces check` as a function: the checks passed (one line each); a set that
    breaks its contract raises TraceSetError naming the file, the column and the fix."""
    return io.check(directory)


def show_traces(directory: str | Path) -> dict[str, Any]:
    """`vegas-sim traces show` as a function: what the set covers (model, GPU, grid, methods,
    ranges; JSON-serialisable) plus, for a set with latency rows, "latency_loo": the latency
    model's leave-one-out error per phase (DataFrame: phase, n_points, median_pct, max_pct)
    and "host_bound_share". ``traces.io.format_summary`` prints the first part as the CLI.

        >>> import vegas_sim
        >>> shown = vegas_sim.show_traces("qwen3-8b-h200")
        >>> shown["model"]["name"], "verify" in set(shown["latency_loo"]["phase"])
        ('qwen3-8b', True)
    """
    trace_set = io.load_trace_set(directory)
    shown = io.summarize(trace_set)
    if len(trace_set.latency):
        model, loo = latency_loo(trace_set)
        shown["latency_loo"] = loo
        shown["host_bound_share"] = model.host_bound_share()
    return shown
