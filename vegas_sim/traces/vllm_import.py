"""Acceptance anchors from what vLLM records (`vegas-sim traces import-vllm`).

Three sources, each read as vLLM writes it (docs/VLLM_IMPORT.md has the exact fields):

- **prometheus**: a text dump of `/metrics` (or two: the interval's difference), the counters of
  `vllm/v1/spec_decode/metrics.py`; parsed by `traces/vllm_prometheus.py`.
- **bench**: the JSON of `vllm bench serve --save-result` (`vllm/benchmarks/serve.py`): keys
  `spec_decode_num_drafts`, `spec_decode_draft_tokens`, `spec_decode_accepted_tokens`,
  `spec_decode_acceptance_length`, `spec_decode_acceptance_rate` (percent) and
  `spec_decode_per_position_acceptance_rates`; `--append-result` files hold one run per line.
- **responses**: OpenAI-API responses (one JSON object per line, or a JSON list) carrying
  `metrics.speculative_decoding`, which vLLM adds per request when the server runs with
  `--per-request-spec-decode-metrics summary|detailed` (vLLM PR #48915, docs "Per-Request
  Acceptance Metrics"): `num_spec_steps`, `num_draft_tokens`, `num_accepted_draft_tokens`,
  `num_spec_tokens`, `acceptance_histogram`, and with `detailed` `per_step_accepted` /
  `per_step_drafted`. The Vegas fork's names `num_drafts` / `num_accepted_tokens` are read too.

vLLM does not record the method, sparsity, context, workload or temperature: the user passes
them (`ImportOptions`). The counts become one `Anchor` in vLLM's convention: mean acceptance
length 1 + accepted / drafts, per-position rates accepted_per_pos[i] / drafts. Checks, each an
error naming file and line: drafts > 0; accepted ≤ draft tokens ≤ drafts·γ; γ equal to the
number of positions in the data; per-position counts non-increasing (a draft is accepted only
after all before it: an increase means mixed or corrupt data) and summing to the accepted
tokens.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vegas_sim.errors import UserInputError
from vegas_sim.models import PRESETS
from vegas_sim.traces import vllm_prometheus
from vegas_sim.traces.anchors import Anchor, AnchorSet

FORMATS = ("prometheus", "bench", "responses")
COUNT_TOLERANCE = 1e-6  # relative: bench floats (rates · drafts) against whole counts
BENCH_KEYS = ("spec_decode_num_drafts", "spec_decode_draft_tokens",
              "spec_decode_accepted_tokens")
_DOC = "see docs/VLLM_IMPORT.md"


@dataclass(frozen=True)
class ImportOptions:
    """What vLLM does not record, passed by the user (None: any / unknown)."""

    method: str
    gamma: int
    sparsity: float | None = None
    context: tuple[int, int] | None = None
    workload: str | None = None
    temperature: float | None = None
    model: str | None = None
    engine: str | None = None  # prometheus: select this `engine` label value
    served_model: str | None = None  # prometheus: select this `model_name` label value
    record: int | None = None  # bench: 1-based line of an --append-result file


@dataclass(frozen=True)
class SpecCounts:
    """Spec-decode counts pooled over an interval or over requests, with where they came from
    (`where`: field → "file:line") for messages."""

    num_drafts: float
    num_draft_tokens: float
    num_accepted_tokens: float
    accepted_per_pos: tuple[float, ...] | None
    where: dict[str, str]
    label: str  # one line saying what was read, for the anchor's source
    gamma_recorded: int | None = None  # num_spec_tokens where the source records it


@dataclass(frozen=True)
class RequestRecord:
    """One response's `metrics.speculative_decoding` (responses format)."""

    where: str
    num_spec_steps: int
    num_draft_tokens: int
    num_accepted: int
    num_spec_tokens: int | None
    histogram: tuple[int, ...] | None
    per_step_accepted: tuple[int, ...] | None
    per_step_drafted: tuple[int, ...] | None
    prompt_tokens: int | None
    completion_tokens: int | None


@dataclass(frozen=True)
class Imported:
    anchor_set: AnchorSet
    notes: tuple[str, ...]
    requests: tuple[RequestRecord, ...] = field(default=())  # responses format only


# ------------------------------------------------------------------------------ detection
def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserInputError(f"no such file {str(path)!r}", where=str(path),
                             fix="check the path") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserInputError(f"cannot read: {e}", where=str(path), fix="check the file") from None


def detect_format(path: Path) -> str:
    """'prometheus', 'bench' or 'responses', from the file's content."""
    text = _read_text(path).lstrip()
    if not text.startswith(("{", "[")):
        return "prometheus"
    records = _json_records(path, text)
    first = records[0][1] if records else None
    if isinstance(first, dict) and any(k.startswith("spec_decode_") or k == "num_prompts"
                                       for k in first):
        return "bench"
    return "responses"


def _json_records(path: Path, text: str) -> list[tuple[str, Any]]:
    """(where, value) of each JSON record: a whole-file JSON value (a list gives its items),
    or one value per non-empty line (JSON Lines)."""
    try:
        whole = json.loads(text)
    except json.JSONDecodeError as e:
        lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
        try:
            json.loads(lines[0][1]) if lines else None
        except json.JSONDecodeError:
            raise _malformed(path, e, 1) from None  # one broken document, not JSON Lines
        return [(f"{path}:{n}", _decode(path, line, n)) for n, line in lines]
    if isinstance(whole, list):
        return [(f"{path}, item {i + 1}", v) for i, v in enumerate(whole)]
    return [(f"{path}:1", whole)]


def _malformed(path: Path, e: json.JSONDecodeError, line: int) -> UserInputError:
    return UserInputError(f"malformed JSON: {e.msg} (column {e.colno})",
                          where=f"{path}:{line + e.lineno - 1}",
                          fix="import the file vLLM wrote, unedited; JSON Lines files hold "
                              "one complete JSON object per line")


def _decode(path: Path, text: str, line: int) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise _malformed(path, e, line) from None


# ------------------------------------------------------------------------------ prometheus
def prometheus_counts(first: Path, second: Path | None, opts: ImportOptions) -> SpecCounts:
    t = vllm_prometheus.read_counters(first, second, engine=opts.engine,
                                      served_model=opts.served_model)
    where = {"num_drafts": t.where[vllm_prometheus.DRAFTS],
             "num_draft_tokens": t.where[vllm_prometheus.DRAFT_TOKENS],
             "num_accepted_tokens": t.where[vllm_prometheus.ACCEPTED],
             "per_pos": t.where.get(vllm_prometheus.PER_POS, str(second or first))}
    span = f"{first.name} → {second.name} (difference)" if second else first.name
    engines = f", engines {','.join(t.engines)}" if t.engines else ""
    served = f", model_name {','.join(t.model_names)}" if t.model_names else ""
    return SpecCounts(t.num_drafts, t.num_draft_tokens, t.num_accepted_tokens,
                      t.accepted_per_pos or None, where,
                      f"vLLM /metrics {span}{served}{engines}")


# ---------------------------------------------------------------------------------- bench
def _line_of(text: str, key: str, record_line: int) -> int:
    """The line of `"key"` in a pretty-printed JSON document (its record's line otherwise)."""
    at = text.find(f'"{key}"')
    return text.count("\n", 0, at) + 1 if at >= 0 and record_line == 1 else record_line


MAX_COUNT = 1e15  # a counter past this is no server's (1e6 tok/s for 30 years is 1e15)


def _number(value: Any, key: str, where: str) -> float:
    """A counter of vLLM's: a finite number in [0, MAX_COUNT]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise UserInputError(f"{key} must be a number, got {value!r}", where=where, fix=_DOC)
    if value < 0 or not value <= MAX_COUNT:
        raise UserInputError(f"{key} must be a count in [0, {MAX_COUNT:g}], got {value!r}",
                             where=where, fix="import the counters vLLM wrote, unedited")
    return float(value)


def bench_counts(path: Path, opts: ImportOptions) -> SpecCounts:
    text = _read_text(path)
    records = _json_records(path, text)
    if len(records) > 1 and opts.record is None:
        raise UserInputError(f"the file holds {len(records)} benchmark runs "
                             "(vllm bench serve --append-result)", where=str(path),
                             fix="pick one with --record N (N = its line, 1-based)")
    index = (opts.record or 1) - 1
    if not 0 <= index < len(records):
        raise UserInputError(f"--record {opts.record}: the file holds {len(records)} runs",
                             where=str(path), fix=f"pass --record 1..{len(records)}")
    where, result = records[index]
    if not isinstance(result, dict):
        raise UserInputError("a bench serve result must be a JSON object", where=where, fix=_DOC)
    line = index + 1 if len(records) > 1 else 1

    def at(key: str) -> str:
        return f"{path}:{_line_of(text, key, line)}"

    missing = [k for k in BENCH_KEYS if k not in result]
    if missing:
        raise UserInputError(
            f"no {', '.join(missing)} in the result", where=where,
            fix="run `vllm bench serve --save-result` against a server with "
                "--speculative-config, with a vLLM that records spec-decode results "
                "(vllm/benchmarks/serve.py)")
    counts = {k: _number(result[k], k, at(k)) for k in BENCH_KEYS}
    drafts = counts["spec_decode_num_drafts"]
    per_pos = _bench_per_pos(result, drafts, at("spec_decode_per_position_acceptance_rates"))
    _check_bench_length(result, counts, at("spec_decode_acceptance_length"))
    model = result.get("model_id")
    label = f"vllm bench serve {path.name}" + (f" (model_id {model})" if model else "")
    return SpecCounts(drafts, counts["spec_decode_draft_tokens"],
                      counts["spec_decode_accepted_tokens"], per_pos,
                      {"num_drafts": at("spec_decode_num_drafts"),
                       "num_draft_tokens": at("spec_decode_draft_tokens"),
                       "num_accepted_tokens": at("spec_decode_accepted_tokens"),
                       "per_pos": at("spec_decode_per_position_acceptance_rates")}, label)


def _bench_per_pos(result: dict[str, Any], drafts: float, where: str
                   ) -> tuple[float, ...] | None:
    rates = result.get("spec_decode_per_position_acceptance_rates")
    if rates is None or rates == []:
        return None
    if not isinstance(rates, list):
        raise UserInputError("spec_decode_per_position_acceptance_rates must be a list",
                             where=where, fix=_DOC)
    return tuple(_number(r, "spec_decode_per_position_acceptance_rates", where) * drafts
                 for r in rates)


def _check_bench_length(result: dict[str, Any], counts: dict[str, float], where: str) -> None:
    """The recorded acceptance length must be 1 + accepted / drafts (vLLM computes it so)."""
    recorded = result.get("spec_decode_acceptance_length")
    drafts = counts["spec_decode_num_drafts"]
    if recorded is None or drafts <= 0:
        return
    expected = 1.0 + counts["spec_decode_accepted_tokens"] / drafts
    if abs(_number(recorded, "spec_decode_acceptance_length", where) - expected) > 1e-6 * expected:
        raise UserInputError(
            f"spec_decode_acceptance_length {recorded} is not 1 + accepted / drafts = "
            f"{expected:.6f}", where=where,
            fix="the result was edited or mixes runs: import the file bench serve wrote")


# ------------------------------------------------------------------------------ responses
_ALIASES = {"num_spec_steps": ("num_spec_steps", "num_drafts"),
            "num_accepted": ("num_accepted_draft_tokens", "num_accepted_tokens")}
_ENABLE = "start the vLLM server with --per-request-spec-decode-metrics summary (or detailed)"


def _field(spec: dict[str, Any], names: tuple[str, ...], where: str, *, required: bool = True
           ) -> Any:
    for name in names:
        if name in spec:
            return spec[name]
    if required:
        raise UserInputError(f"metrics.speculative_decoding has no {' / '.join(names)}",
                             where=where, fix=_DOC)
    return None


def _count(value: Any, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UserInputError(f"{name} must be a whole number >= 0, got {value!r}",
                             where=where, fix=_DOC)
    return value


def _counts(value: Any, name: str, where: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise UserInputError(f"{name} must be a list of whole numbers", where=where, fix=_DOC)
    return tuple(_count(v, f"{name} entry", where) for v in value)


def _spec_of(response: Any, where: str) -> dict[str, Any] | None:
    """The response's metrics.speculative_decoding; None for a streaming chunk without it."""
    if not isinstance(response, dict):
        raise UserInputError("a response must be a JSON object", where=where, fix=_DOC)
    metrics = response.get("metrics")
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if spec is None:
        if str(response.get("object", "")).endswith(".chunk") and metrics is None:
            return None  # a streaming chunk: the metrics ride the final usage chunk
        if "metrics" in response and metrics is None:
            return None  # "metrics": null, as vLLM sends for n > 1: skipped, counted
        raise UserInputError("the response has no metrics.speculative_decoding (null for "
                             "n > 1 or when per-request metrics are off)", where=where,
                             fix=f"{_ENABLE}, and send single-sequence requests (n = 1)")
    if not isinstance(spec, dict):
        raise UserInputError("metrics.speculative_decoding must be a JSON object", where=where,
                             fix=_DOC)
    return spec


def _usage(response: dict[str, Any], key: str, where: str) -> int | None:
    usage = response.get("usage")
    value = usage.get(key) if isinstance(usage, dict) else None
    return None if value is None else _count(value, f"usage.{key}", where)


def _first_usage(response: dict[str, Any], keys: tuple[str, ...], where: str) -> int | None:
    """The first of `keys` present in the response's usage."""
    for key in keys:
        value = _usage(response, key, where)
        if value is not None:
            return value
    return None


def _request(response: dict[str, Any], spec: dict[str, Any], where: str) -> RequestRecord:
    spec_tokens = _field(spec, ("num_spec_tokens",), where, required=False)
    record = RequestRecord(
        where=where,
        num_spec_steps=_count(_field(spec, _ALIASES["num_spec_steps"], where),
                              "num_spec_steps", where),
        num_draft_tokens=_count(_field(spec, ("num_draft_tokens",), where),
                                "num_draft_tokens", where),
        num_accepted=_count(_field(spec, _ALIASES["num_accepted"], where),
                            "num_accepted_draft_tokens", where),
        num_spec_tokens=None if spec_tokens is None else _count(spec_tokens, "num_spec_tokens",
                                                                where),
        histogram=_counts(spec.get("acceptance_histogram"), "acceptance_histogram", where),
        per_step_accepted=_counts(spec.get("per_step_accepted"), "per_step_accepted", where),
        per_step_drafted=_counts(spec.get("per_step_drafted"), "per_step_drafted", where),
        # Chat/Completions usage names, else the Responses API's (input_tokens, output_tokens)
        prompt_tokens=_first_usage(response, ("prompt_tokens", "input_tokens"), where),
        completion_tokens=_first_usage(response, ("completion_tokens", "output_tokens"), where))
    _check_request(record)
    return record


def _check_request(r: RequestRecord) -> None:
    """The fields of one request must agree with each other (vLLM derives them so)."""
    def bad(problem: str) -> UserInputError:
        return UserInputError(problem, where=r.where,
                              fix="import the responses vLLM sent, unedited (" + _DOC + ")")

    if r.histogram is not None:
        if sum(r.histogram) != r.num_spec_steps:
            raise bad(f"acceptance_histogram sums to {sum(r.histogram)}, num_spec_steps is "
                      f"{r.num_spec_steps}")
        if sum(j * n for j, n in enumerate(r.histogram)) != r.num_accepted:
            raise bad("acceptance_histogram does not add up to num_accepted_draft_tokens "
                      f"{r.num_accepted}")
        if r.num_spec_tokens is not None and len(r.histogram) != r.num_spec_tokens + 1:
            raise bad(f"acceptance_histogram has {len(r.histogram)} entries, "
                      f"num_spec_tokens + 1 = {r.num_spec_tokens + 1}")
    if r.per_step_accepted is not None:
        if len(r.per_step_accepted) != r.num_spec_steps:
            raise bad(f"per_step_accepted has {len(r.per_step_accepted)} steps, num_spec_steps "
                      f"is {r.num_spec_steps}")
        if sum(r.per_step_accepted) != r.num_accepted:
            raise bad(f"per_step_accepted sums to {sum(r.per_step_accepted)}, "
                      f"num_accepted_draft_tokens is {r.num_accepted}")
    if r.per_step_drafted is not None:
        if r.per_step_accepted is None or len(r.per_step_drafted) != len(r.per_step_accepted):
            raise bad("per_step_drafted needs per_step_accepted of the same length")
        if any(a > d for a, d in zip(r.per_step_accepted, r.per_step_drafted)):
            raise bad("a step accepted more drafts than it drafted (per_step_accepted > "
                      "per_step_drafted)")


def read_responses(path: Path) -> tuple[tuple[RequestRecord, ...], int]:
    """The requests of a responses file (JSON Lines, a JSON list, or one response), and how
    many responses had "metrics": null (vLLM sends it for n > 1): those are skipped."""
    records, nulls = [], 0
    for where, response in _json_records(path, _read_text(path)):
        spec = _spec_of(response, where)
        if spec is not None:
            records.append(_request(response, spec, where))
        elif isinstance(response, dict) and "metrics" in response:
            nulls += 1
    if not records:
        raise UserInputError("no response carries metrics.speculative_decoding"
                             + (f" ({nulls} have \"metrics\": null, as for n > 1)"
                                if nulls else ""), where=str(path),
                             fix=f"{_ENABLE}, and send single-sequence requests (n = 1)")
    return tuple(records), nulls


def _request_per_pos(r: RequestRecord, gamma: int) -> list[int] | None:
    """Steps that accepted position i, i = 0..γ-1, from the per-step list or the histogram."""
    if r.per_step_accepted is not None:
        return [sum(1 for a in r.per_step_accepted if a > i) for i in range(gamma)]
    if r.histogram is not None:
        return [sum(r.histogram[i + 1:]) for i in range(gamma)]
    return None


def response_counts(path: Path, requests: tuple[RequestRecord, ...], opts: ImportOptions
                    ) -> SpecCounts:
    recorded = {r.num_spec_tokens for r in requests if r.num_spec_tokens is not None}
    if len(recorded) > 1:
        first = {r.num_spec_tokens: r.where for r in reversed(requests)}
        raise UserInputError(f"the requests were served with different num_spec_tokens "
                             f"{sorted(recorded)} (first of each: {first})",
                             where=str(path), fix="import the responses of one server "
                                                  "configuration per anchor")
    recorded_gamma = next(iter(recorded)) if recorded else None
    gamma = recorded_gamma or opts.gamma
    per_request = [_request_per_pos(r, gamma) for r in requests]
    per_pos = None
    if all(p is not None for p in per_request):
        per_pos = tuple(float(sum(p[i] for p in per_request if p is not None))
                        for i in range(gamma))
    return SpecCounts(
        float(sum(r.num_spec_steps for r in requests)),
        float(sum(r.num_draft_tokens for r in requests)),
        float(sum(r.num_accepted for r in requests)), per_pos,
        {"num_drafts": str(path), "num_draft_tokens": str(path),
         "num_accepted_tokens": str(path), "per_pos": str(path),
         "gamma": requests[0].where},
        f"vLLM responses {path.name} ({len(requests)} requests)",
        gamma_recorded=recorded_gamma)


# ------------------------------------------------------------------------- counts → anchor
def check_counts(c: SpecCounts, gamma: int) -> None:
    """The checks every source passes before it becomes an anchor (module doc)."""
    if c.gamma_recorded is not None and c.gamma_recorded != gamma:
        raise UserInputError(f"the server drafted num_spec_tokens = {c.gamma_recorded}, "
                             f"--gamma is {gamma}", where=c.where.get("gamma", c.where["per_pos"]),
                             fix=f"pass --gamma {c.gamma_recorded}")
    if c.accepted_per_pos is not None and len(c.accepted_per_pos) != gamma:
        raise UserInputError(f"the data has {len(c.accepted_per_pos)} draft positions, --gamma "
                             f"is {gamma}", where=c.where["per_pos"],
                             fix=f"pass --gamma {len(c.accepted_per_pos)} (the server's "
                                 "num_speculative_tokens)")
    for name, value in (("num_drafts", c.num_drafts), ("num_draft_tokens", c.num_draft_tokens),
                        ("num_accepted_tokens", c.num_accepted_tokens)):
        if value < 0 or not value <= MAX_COUNT:
            raise UserInputError(
                f"{name} is {value:g}: a count of vLLM's is in [0, {MAX_COUNT:g}]",
                where=c.where[name],
                fix="import the counters unedited; of two /metrics dumps the second must be "
                    "the later one of the same server (a restart resets the counters)")
    if c.num_drafts == 0:
        raise UserInputError("num_drafts is 0: no speculative step in the data",
                             where=c.where["num_drafts"],
                             fix="dump the counters after the server decoded with speculation "
                                 "(for two dumps: after traffic between them)")
    if c.num_accepted_tokens > c.num_drafts * gamma * (1 + COUNT_TOLERANCE):
        raise UserInputError(
            f"{c.num_accepted_tokens:g} accepted tokens in {c.num_drafts:g} drafts is more than "
            f"--gamma {gamma} per draft", where=c.where["num_accepted_tokens"],
            fix="pass the server's num_speculative_tokens as --gamma, or import one server's "
                "counters, unedited")
    if c.num_accepted_tokens > c.num_draft_tokens:
        raise UserInputError(f"accepted tokens {c.num_accepted_tokens:g} exceed draft tokens "
                             f"{c.num_draft_tokens:g}", where=c.where["num_accepted_tokens"],
                             fix="import one server's counters, unedited")
    if c.num_draft_tokens > c.num_drafts * gamma * (1 + COUNT_TOLERANCE):
        raise UserInputError(
            f"{c.num_draft_tokens:g} draft tokens in {c.num_drafts:g} drafts is more than "
            f"--gamma {gamma} per draft", where=c.where["num_draft_tokens"],
            fix="pass the server's num_speculative_tokens as --gamma")
    if c.accepted_per_pos is not None:
        _check_per_pos(c, gamma)


def _check_per_pos(c: SpecCounts, gamma: int) -> None:
    per_pos, where = c.accepted_per_pos, c.where["per_pos"]
    assert per_pos is not None
    for i in range(1, gamma):
        if per_pos[i] > per_pos[i - 1] * (1 + COUNT_TOLERANCE) + COUNT_TOLERANCE:
            raise UserInputError(
                f"accepted tokens at position {i} ({per_pos[i]:g}) exceed those at position "
                f"{i - 1} ({per_pos[i - 1]:g}); a draft is accepted only after all before it",
                where=where, fix="the counts mix servers or were edited: import one server's "
                                 "counters, unedited")
    if per_pos[0] > c.num_drafts * (1 + COUNT_TOLERANCE):
        raise UserInputError(f"position 0 accepted {per_pos[0]:g} times in {c.num_drafts:g} "
                             "drafts", where=where, fix="import one server's counters, unedited")
    total = sum(per_pos)
    if abs(total - c.num_accepted_tokens) > COUNT_TOLERANCE * max(c.num_accepted_tokens, 1):
        raise UserInputError(
            f"the per-position counts sum to {total:g}, the accepted tokens are "
            f"{c.num_accepted_tokens:g}", where=where,
            fix="a dump taken while the counters were being updated, or edited counts: take "
                "the dump again")


def to_anchor(c: SpecCounts, opts: ImportOptions, where: str) -> Anchor:
    """The checked counts as one anchor in vLLM's convention."""
    check_counts(c, opts.gamma)
    rates = None
    if c.accepted_per_pos is not None:
        rates = tuple(min(n / c.num_drafts, 1.0) for n in c.accepted_per_pos)
    try:
        return Anchor(method=opts.method, gamma=opts.gamma, sparsity=opts.sparsity,
                      context=opts.context, workload=opts.workload,
                      temperature=opts.temperature,
                      mean_acceptance_length=1.0 + c.num_accepted_tokens / c.num_drafts,
                      per_position_rates=rates, num_drafts=round(c.num_drafts),
                      source=c.label)
    except UserInputError as e:
        raise UserInputError(e.problem, where=f"{where} ({e.where})", fix=e.fix) from None


def _response_context(requests: tuple[RequestRecord, ...]) -> tuple[int, int] | None:
    """The requests' prompt lengths: shortest to longest (the context a prediction looks
    acceptance up at, `sim.anchored`)."""
    if any(r.prompt_tokens is None for r in requests):
        return None
    return (min(r.prompt_tokens or 0 for r in requests),
            max(r.prompt_tokens or 0 for r in requests))


def import_vllm(first: Path, second: Path | None, opts: ImportOptions,
                fmt: str | None = None) -> Imported:
    """Read `first` (and `second`, prometheus only) and return one anchor with notes."""
    if opts.model is not None and opts.model.lower() not in PRESETS:
        raise UserInputError(f"unknown model {opts.model!r}: the anchors would set the "
                             "acceptance of no model vegas-sim predicts", where="--model",
                             fix=f"use one of: {', '.join(sorted(PRESETS))}")
    fmt = fmt or detect_format(first)
    if fmt not in FORMATS:
        raise UserInputError(f"unknown format {fmt!r}", where="--format",
                             fix=f"use one of: {', '.join(FORMATS)}")
    if second is not None and fmt != "prometheus":
        raise UserInputError(f"a second file is only for two /metrics dumps; {first} is "
                             f"{fmt}", where=str(second), fix="pass one file")
    notes: list[str] = []
    requests: tuple[RequestRecord, ...] = ()
    if fmt == "prometheus":
        counts = prometheus_counts(first, second, opts)
    elif fmt == "bench":
        counts = bench_counts(first, opts)
    else:
        requests, nulls = read_responses(first)
        if nulls:
            notes.append(f"{nulls} responses skipped: \"metrics\": null (vLLM sends it for "
                         "n > 1, or with per-request metrics off)")
        counts = response_counts(first, requests, opts)
        if opts.context is None and (ctx := _response_context(requests)) is not None:
            opts = replace(opts, context=ctx)
            notes.append(f"context {ctx[0]}..{ctx[1]}: from the responses' usage (shortest "
                         "to longest prompt)")
    if counts.accepted_per_pos is None:
        notes.append("the data has no per-position counts: the anchor gives the mean "
                     "acceptance length only")
    anchor = to_anchor(counts, opts, str(first))
    source = counts.label
    return Imported(AnchorSet(model=opts.model, source=source, anchors=(anchor,)),
                    tuple(notes), requests)


def append_to(existing: AnchorSet, new: AnchorSet, path: Path) -> AnchorSet:
    """`existing` plus `new`'s anchors; refuses another model or a configuration already there."""
    if existing.model and new.model and existing.model != new.model:
        raise UserInputError(f"{path} holds anchors of model {existing.model!r}, these are "
                             f"{new.model!r}", where="--append",
                             fix="append to a file of the same model, or write a new one")
    keys = {_config(a): i for i, a in enumerate(existing.anchors)}
    for a in new.anchors:
        if _config(a) in keys:
            raise UserInputError(f"anchor {keys[_config(a)] + 1} of {path} is already this "
                                 f"configuration ({a.describe()})", where="--append",
                                 fix="remove it from the file first, or write a new file")
    return AnchorSet(model=existing.model or new.model,
                     source="; ".join(s for s in (existing.source, new.source) if s),
                     anchors=existing.anchors + new.anchors)


def _config(a: Anchor) -> tuple[Any, ...]:
    return (a.method, a.gamma, a.sparsity, a.context, a.workload, a.temperature)
