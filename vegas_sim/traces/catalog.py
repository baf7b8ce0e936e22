"""Packaged trace sets and the choice of which sets answer a prediction.

Packaged sets live in `vegas_sim/traces/default/<name>/` (made by `vegas-sim calibrate`; never
synthetic); `<name>` alone names one wherever a trace-set directory is expected
(`io.trace_set_dir`). A prediction needs two sets:

- a **latency** set for the model being predicted (any weights: random weights time the same);
- an **acceptance** set with *real* weights (a random-weight model's acceptance is meaningless).

`resolve` picks both and returns human-readable notes saying what was used, for every output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vegas_sim.errors import UserInputError
from vegas_sim.gpus import datasheet_for_device, get_gpu
from vegas_sim.models import PRESETS
from vegas_sim.traces import io
from vegas_sim.traces.io import TraceSet, load_trace_set, require_real_acceptance
from vegas_sim.traces.meta import TraceSetMeta
from vegas_sim.traces.schema import (ACCEPTANCE_FILE, CHANGED_PHASES, META_FILE,
                                     RUNTIME_REVISION)

# The GPU whose packaged set answers a prediction that names none (--gpu): every packaged
# latency model was measured on it, so the default prediction is the same for every model.
DEFAULT_GPU = "h200"

_HOW_TO_MAKE = (
    "make one on a GPU with `vegas-sim calibrate --model MODEL --out DIR` and pass "
    "`--traces DIR`"
)


def describe(ts: TraceSet) -> str:
    """E.g. 'qwen3-8b-h200 (random weights, NVIDIA H200 measured)'."""
    if ts.synthetic:
        where = "SYNTHETIC, not measured"
    else:
        where = f"{ts.gpu_name} measured"
    factor = ts.info.grid.rope_extension
    extended = f", YaRN-extended x{factor:g} past the trained window" if factor else ""
    return f"{ts.name} ({ts.weights_kind} weights, {where}{extended})"


@dataclass(frozen=True)
class _Entry:
    """A packaged set known by its meta.json only (cheap); loaded fully once chosen."""

    path: Path
    meta: dict[str, Any]

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def model_name(self) -> str:
        return TraceSetMeta.from_dict(self.meta).model_name

    @property
    def synthetic(self) -> bool:
        return TraceSetMeta.from_dict(self.meta).synthetic

    @property
    def may_have_real_acceptance(self) -> bool:
        real = TraceSetMeta.from_dict(self.meta).weights_kind == "real"
        file = self.path / ACCEPTANCE_FILE
        # An empty parquet file is a few hundred bytes; anything with rows is larger.
        return real and file.is_file() and file.stat().st_size > 2048


def _packaged_entries(default_dir: Path | None) -> list[_Entry]:
    entries = []
    for p in io.packaged_sets(default_dir):
        try:
            meta = json.loads((p / META_FILE).read_text())
        except (OSError, ValueError):
            meta = {}  # broken: load_trace_set will say why if this set is ever chosen
        entries.append(_Entry(p, meta if isinstance(meta, dict) else {}))
    return entries


def _what_if_hint(model: str) -> str:
    """How to price a preset that has no trace set of its own (empty for other names)."""
    return (f"; or price its shape on another model's set, not measured: --model-what-if "
            f"{model}" if model in PRESETS else "")


def _model_mismatch(model: str, ts: TraceSet, packaged: list[_Entry]) -> UserInputError:
    available = sorted({s.model_name for s in packaged} | {ts.model_name})
    return UserInputError(
        f"trace set {ts.path} is for model {ts.model_name!r}, not {model!r}",
        where="--model",
        fix=f"pass --model {ts.model_name}, or a trace set for {model!r}; models with trace "
            f"sets: {', '.join(available)}{_what_if_hint(model)}")


class MethodsNote(str):
    """A note that concerns only `methods`: a prediction of none of them leaves it out."""

    methods: frozenset[str]

    def __new__(cls, text: str, methods: Iterable[str]) -> MethodsNote:
        note = super().__new__(cls, text)
        note.methods = frozenset(methods)
        return note


def runtime_note(name: str, revision: str) -> str:
    """What a set of an older runtime revision prices as that runtime ran it: every method, or
    only the methods whose phases the later revisions changed (CHANGED_PHASES; then a
    `MethodsNote` of those methods)."""
    head = (f"{name} was measured on runtime revision {revision}, this code's is "
            f"{RUNTIME_REVISION} (traces/schema.py):")
    since = ([str(r) for r in range(int(revision) + 1, int(RUNTIME_REVISION) + 1)]
             if revision.isdigit() else [])
    if not since or not all(r in CHANGED_PHASES for r in since):
        return f"{head} the latencies are that runtime's; re-calibrate to predict this one"
    changed = {m: p for r in since for m, p in CHANGED_PHASES[r].items()}
    which = "; ".join(f"{m} ({', '.join(p)})" for m, p in sorted(changed.items()))
    return MethodsNote(f"{head} only {which} changed since, and is priced as the older runtime "
                       f"ran it; re-calibrate {', '.join(sorted(changed))} to predict this one",
                       changed)


def _pick_latency(model: str, packaged: list[_Entry], gpu: str | None) -> TraceSet:
    """The packaged latency set of `model` measured on `gpu` (a --gpu datasheet name), else on
    DEFAULT_GPU, else the first by name."""
    if not packaged:
        raise UserInputError(
            "no default trace set is packaged with this build of vegas-sim yet",
            where="--traces", fix=_HOW_TO_MAKE)
    matches = [s for s in packaged if s.model_name == model]
    if not matches:
        raise UserInputError(
            f"no packaged trace set for model {model!r}", where="--model",
            fix=f"use one of: {', '.join(_timed_models(packaged))}; or {_HOW_TO_MAKE}"
                f"{_what_if_hint(model)}")
    # Prefer measured sets over synthetic ones (packaged sets should never be synthetic), and
    # sets that measured latency (an acceptance-only set of the same model may sit beside).
    sets = [load_trace_set(e.path) for e in sorted(matches, key=lambda s: (s.synthetic, s.name))]
    with_latency = [ts for ts in sets if ts.n_rows("latency")]
    if not with_latency:
        raise _acceptance_only(model, sets, packaged)
    for wanted in (gpu, DEFAULT_GPU):
        on_it = [ts for ts in with_latency if measured_on(ts, wanted)]
        if on_it:
            return on_it[0]
    return with_latency[0]


def measured_on(ts: TraceSet, gpu: str | None) -> bool:
    """Whether `ts` was measured on the GPU that --gpu `gpu` names (its datasheet entry)."""
    return (gpu is not None and not ts.synthetic
            and datasheet_for_device(ts.gpu_name) == get_gpu(gpu))


def _timed_models(packaged: list[_Entry]) -> list[str]:
    """The models whose packaged sets measured latency (a prediction's --model), sorted."""
    return sorted({e.model_name for e in packaged if load_trace_set(e.path).n_rows("latency")})


def _acceptance_only(model: str, sets: list[TraceSet], packaged: list[_Entry]) -> UserInputError:
    """A model whose packaged sets measured acceptance only (real weights, no phases timed):
    its acceptance can stand in for another model's, whose latency prices the prediction."""
    timed = [m for m in _timed_models(packaged) if m != model]
    names = ", ".join(ts.name for ts in sets)
    return UserInputError(
        f"the packaged set of model {model!r} ({names}) measured acceptance only: it has no "
        f"latency rows to price {model!r} with", where="--model",
        fix=f"take its acceptance for a model that has latency, e.g. --model {timed[0]} "
            f"--acceptance-traces {sets[0].name} (models with latency: {', '.join(timed)}); "
            f"or {_HOW_TO_MAKE}" if timed else _HOW_TO_MAKE)


# The real model whose acceptance stands in for a model without its own: the shape the
# packaged anchors are fitted on (docs/ACCEPTANCE_ANCHORS.md). Another real set (Gemma-3-270M's)
# is used when named with --acceptance-traces.
PROXY_MODEL = "smollm2-135m"


# Positions a model serves without inference-time RoPE scaling, where that is fewer than its
# `max_positions`: the Qwen3 model cards' native context, extended to their full length with
# YaRN (what the Vegas paper applies at its long-context setting).
NATIVE_POSITIONS = {"qwen3-4b": 32768, "qwen3-8b": 32768, "qwen3-30b-a3b": 32768}


def scaled_companion(acceptance: TraceSet, default_dir: Path | None = None) -> TraceSet | None:
    """The packaged real-weights set of `acceptance`'s model traced with RoPE scaling past its
    trained window (e.g. smollm2-135m-real-yarn4 beside smollm2-135m-real), or None."""
    for entry in sorted(_packaged_entries(default_dir), key=lambda s: s.name):
        model = entry.meta.get("model")
        if (entry.model_name == acceptance.model_name and entry.name != acceptance.name
                and isinstance(model, dict) and model.get("rope_scaling")
                and entry.may_have_real_acceptance):
            return load_trace_set(entry.path)
    return None


def _pick_acceptance(model: str, packaged: list[_Entry]) -> TraceSet | None:
    """A packaged real-weight set with acceptance: the predicted model's own first, then
    PROXY_MODEL's."""
    candidates = [s for s in packaged if s.may_have_real_acceptance]
    candidates.sort(key=lambda s: (s.model_name != model, s.synthetic,
                                   s.model_name != PROXY_MODEL, s.name))
    for entry in candidates:
        ts = load_trace_set(entry.path)
        if ts.has_real_acceptance:
            return ts
    return None


def resolve(
    model: str | None,
    traces: Path | None,
    *,
    acceptance: Path | None = None,
    default_dir: Path | None = None,
    gpu: str | None = None,
) -> tuple[TraceSet, TraceSet, list[str]]:
    """(latency set, real-weight acceptance set, notes) for predicting `model`.

    traces: a trace-set directory (or a packaged set's name) for latency (and acceptance, if
    it has real acceptance; otherwise a packaged real set is used and the notes say so).
    None: the packaged set for `model`. model None: the model of `traces` (or of the only
    packaged model).
    acceptance: an explicit acceptance set (directory or packaged name); it must have real
    weights (TraceSetError if not).
    default_dir: where packaged sets live (tests point it elsewhere).
    gpu: the --gpu datasheet name asked for: among the model's packaged sets, the one measured
    on that GPU, if any (else the one measured on DEFAULT_GPU); `traces` given, unused.

    Raises UserInputError when nothing is packaged and no `traces` is given, or when the latency
    set is for another model (listing the models available); TraceSetError when no real-weight
    acceptance can be found.
    """
    packaged = _packaged_entries(default_dir)
    if traces is not None:
        latency = load_trace_set(traces, packaged_dir=default_dir)
        if model is not None and latency.model_name != model:
            raise _model_mismatch(model, latency, packaged)
    else:
        if model is None:
            models = sorted({s.model_name for s in packaged})
            model = models[0] if len(models) == 1 else ""
        latency = _pick_latency(model or "", packaged, gpu)
    notes = [f"latency: {describe(latency)}"]
    if not latency.synthetic and latency.runtime_revision != RUNTIME_REVISION:
        notes.append(runtime_note(latency.name, latency.runtime_revision))

    if acceptance is not None:
        acc = load_trace_set(acceptance, packaged_dir=default_dir)
        require_real_acceptance(acc)
        notes.append(f"acceptance: {describe(acc)}")
    elif latency.has_real_acceptance:
        acc = latency
        notes.append(f"acceptance: {describe(acc)}")
    else:
        fallback = _pick_acceptance(latency.model_name, packaged)
        if fallback is None:
            require_real_acceptance(latency)  # raises, naming why this set cannot serve
            raise AssertionError("unreachable")  # pragma: no cover
        acc = fallback
        why = ("has random weights" if latency.weights_kind != "real"
               else "has no acceptance rows")
        notes.append(f"acceptance: {describe(acc)} — {latency.name} {why}, "
                     f"so acceptance comes from this packaged real-weight set")
    if acc.model_name != latency.model_name:
        notes.append(f"acceptance measured on {acc.model_name} is used as a proxy for "
                     f"{latency.model_name}")
    for ts in {id(latency): latency, id(acc): acc}.values():
        if ts.synthetic:
            notes.append(f"{ts.name} is SYNTHETIC test data, not a measurement")
    return latency, acc, notes
