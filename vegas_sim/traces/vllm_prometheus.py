"""vLLM's speculative-decoding counters from Prometheus text dumps of `/metrics`.

Format: the Prometheus text exposition format (version 0.0.4), as `prometheus_client` writes
it: `# HELP` / `# TYPE` lines, other `#` comments, blank lines, and samples
`name{label="value",...} value [timestamp]`, label values escaping `\\`, `\"` and `\n`.

The counters are defined in vLLM's `vllm/v1/spec_decode/metrics.py` (`SpecDecodingProm`):
`vllm:spec_decode_num_drafts`, `vllm:spec_decode_num_draft_tokens`,
`vllm:spec_decode_num_accepted_tokens` and `vllm:spec_decode_num_accepted_tokens_per_pos`
(with a `position` label 0..num_speculative_tokens-1), each labelled with `model_name` and
`engine` (`vllm/v1/metrics/loggers.py`). `prometheus_client` exposes a counter as
`<name>_total` plus `<name>_created` (its creation time); other exporters drop the `_total`
suffix, so both spellings are read. Several engines (data parallel) are summed unless one is
selected. Two dumps (before, after) give the interval's difference, as `vllm bench serve` does
in `vllm/benchmarks/serve.py` (`fetch_spec_decode_metrics`); a counter that went down, a
series that vanished, or a changed `_created` time means the server restarted in between,
which is refused.

Every problem is a UserInputError naming the file and line and the fix.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from vegas_sim.errors import UserInputError

PREFIX = "vllm:spec_decode_"
DRAFTS = PREFIX + "num_drafts"
DRAFT_TOKENS = PREFIX + "num_draft_tokens"
ACCEPTED = PREFIX + "num_accepted_tokens"
PER_POS = PREFIX + "num_accepted_tokens_per_pos"
FAMILIES = (DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POS)
_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_FORMAT_FIX = ("save the server's /metrics response unchanged, e.g. "
               "`curl -s http://HOST:PORT/metrics > metrics.txt`")

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs


@dataclass(frozen=True)
class Sample:
    value: float
    where: str  # "file:line"


@dataclass
class Dump:
    """The spec-decode series of one dump: (family, labels) → sample, and `_created` times."""

    path: Path
    counters: dict[tuple[str, Labels], Sample] = field(default_factory=dict)
    created: dict[tuple[str, Labels], Sample] = field(default_factory=dict)


@dataclass(frozen=True)
class CounterTotals:
    """The counters summed over the selected series (an interval's difference for two dumps).
    `where` maps each family to the file:line of one of its samples, for messages."""

    num_drafts: float
    num_draft_tokens: float
    num_accepted_tokens: float
    accepted_per_pos: tuple[float, ...]
    where: dict[str, str]
    model_names: tuple[str, ...]
    engines: tuple[str, ...]


# ------------------------------------------------------------------------------- parsing
def _bad_line(where: str, problem: str) -> UserInputError:
    return UserInputError(f"not Prometheus text format: {problem}", where=where,
                          fix=_FORMAT_FIX)


def _label_value(line: str, i: int, where: str) -> tuple[str, int]:
    """The quoted label value starting at line[i] == '"'; returns (value, index after it)."""
    out: list[str] = []
    i += 1
    while i < len(line):
        ch = line[i]
        if ch == '"':
            return "".join(out), i + 1
        if ch == "\\":
            nxt = line[i + 1] if i + 1 < len(line) else ""
            if nxt not in _ESCAPES:
                raise _bad_line(where, f"bad escape '\\{nxt}' in a label value (only \\\\, "
                                       "\\\" and \\n are allowed)")
            out.append(_ESCAPES[nxt])
            i += 2
            continue
        out.append(ch)
        i += 1
    raise _bad_line(where, "a label value's closing quote is missing")


def _labels(line: str, i: int, where: str) -> tuple[dict[str, str], int]:
    """Labels from line[i] == '{' to its '}'; returns (labels, index after '}')."""
    labels: dict[str, str] = {}
    i += 1
    while True:
        while i < len(line) and line[i] in " \t":
            i += 1
        if i < len(line) and line[i] == "}":
            return labels, i + 1
        m = _LABEL_RE.match(line, i)
        if m is None:
            raise _bad_line(where, f"expected a label name at column {i + 1}")
        name, i = m.group(0), m.end()
        if line[i:i + 2] != '="':
            raise _bad_line(where, f"expected =\"value\" after label {name!r}")
        if name in labels:
            raise _bad_line(where, f"label {name!r} is given twice")
        labels[name], i = _label_value(line, i + 1, where)
        if i < len(line) and line[i] == ",":
            i += 1
        elif i >= len(line) or line[i] != "}":
            raise _bad_line(where, f"expected ',' or '}}' after label {name!r}")


def parse_sample(line: str, where: str) -> tuple[str, dict[str, str], float]:
    """(metric name, labels, value) of one sample line."""
    m = _NAME_RE.match(line)
    if m is None:
        raise _bad_line(where, "a sample line must start with a metric name")
    name, i = m.group(0), m.end()
    labels: dict[str, str] = {}
    if i < len(line) and line[i] == "{":
        labels, i = _labels(line, i, where)
    rest = line[i:].split()
    if not 1 <= len(rest) <= 2 or (i < len(line) and line[i] not in " \t"):
        raise _bad_line(where, f"expected `{name}{{labels}} VALUE [TIMESTAMP]`")
    try:
        value = float(rest[0])
        if len(rest) == 2:
            int(rest[1])
    except ValueError:
        raise _bad_line(where, f"{' '.join(rest)!r} is not a value [and an integer "
                               "timestamp]") from None
    return name, labels, value


def _family(name: str) -> tuple[str, bool] | None:
    """(family, is_created) for a spec-decode counter sample name, else None."""
    for suffix, created in (("_total", False), ("_created", True), ("", False)):
        base = name[: len(name) - len(suffix)] if suffix else name
        if (not suffix or name.endswith(suffix)) and base in FAMILIES:
            return base, created
    return None


def _check_type_line(line: str, where: str) -> None:
    """A spec-decode family declared anything but a counter is not vLLM's (its `_created`
    series is declared a gauge by prometheus_client, which is fine)."""
    parts = line.split()
    if len(parts) < 4:
        return
    name = parts[2].removesuffix("_total")
    if name in FAMILIES and parts[3] != "counter":
        raise UserInputError(
            f"{parts[2]} is declared a {parts[3]}, vLLM exports it as a counter", where=where,
            fix="import the /metrics dump of a vLLM server (vllm/v1/spec_decode/metrics.py)")


def read_dump(path: Path) -> Dump:
    """The spec-decode series of a /metrics dump (every line is checked)."""
    dump = Dump(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserInputError(f"cannot read: {e}", where=str(path), fix=_FORMAT_FIX) from None
    for number, raw in enumerate(text.splitlines(), start=1):
        line, where = raw.strip(), f"{path}:{number}"
        if not line:
            continue
        if line.startswith("#"):
            if line.startswith("# TYPE"):
                _check_type_line(line, where)
            continue
        name, labels, value = parse_sample(line, where)
        family = _family(name)
        if family is None:
            continue
        base, is_created = family
        key = (base, tuple(sorted(labels.items())))
        table = dump.created if is_created else dump.counters
        if key in table:
            raise UserInputError(
                f"{name} with labels {dict(key[1])} appears twice (first at "
                f"{table[key].where})", where=where,
                fix="import one dump per file (of one server), not two dumps concatenated")
        if not is_created and not (math.isfinite(value) and value >= 0 and value.is_integer()):
            raise UserInputError(f"{name} = {value!r}: a counter of drafts or tokens must be a "
                                 "whole number >= 0", where=where, fix=_FORMAT_FIX)
        if is_created and not math.isfinite(value):
            raise UserInputError(f"{name} = {value!r}: a counter's creation time must be a "
                                 "finite number of seconds", where=where, fix=_FORMAT_FIX)
        table[key] = Sample(value, where)
    if not dump.counters:
        raise UserInputError(
            f"no {PREFIX}* counters in the dump", where=str(path),
            fix="dump /metrics of a vLLM server started with --speculative-config (vLLM "
                "exports the spec-decode counters only when speculative decoding is on)")
    return dump


# ---------------------------------------------------------------------------- difference
def difference(before: Dump, after: Dump) -> dict[tuple[str, Labels], Sample]:
    """after − before per series; refuses a restart between the dumps."""
    restart = (f"the server restarted between the dumps (counters reset): take both dumps "
               f"from one server run, or import {after.path} alone")
    for key, old in before.counters.items():
        if key not in after.counters:
            raise UserInputError(f"{key[0]} with labels {dict(key[1])} is in the first dump "
                                 f"({old.where}) but not in the second", where=str(after.path),
                                 fix=restart)
    for key, old in before.created.items():
        new = after.created.get(key)
        if new is not None and new.value != old.value:
            raise UserInputError(f"{key[0]}_created changed from {old.value} ({old.where}) to "
                                 f"{new.value}", where=new.where, fix=restart)
    delta: dict[tuple[str, Labels], Sample] = {}
    for key, new in after.counters.items():
        old_value = before.counters[key].value if key in before.counters else 0.0
        if new.value < old_value:
            raise UserInputError(
                f"counter {key[0]} with labels {dict(key[1])} went down from {old_value:g} "
                f"({before.counters[key].where}) to {new.value:g}", where=new.where,
                fix=restart + "; or the dumps are in the wrong order: pass the earlier first")
        delta[key] = Sample(new.value - old_value, new.where)
    return delta


# ---------------------------------------------------------------------------- selection
def _select(series: dict[tuple[str, Labels], Sample], engine: str | None,
            served_model: str | None, path: Path) -> dict[tuple[str, Labels], Sample]:
    if engine is not None:
        series = _with_label(series, "engine", engine, f"{path} (--engine-label)", "engines")
    if served_model is not None:
        return _with_label(series, "model_name", served_model, f"{path} (--served-model)",
                           "served models")
    models = _label_values(series, "model_name")
    if len(models) > 1:
        raise UserInputError(f"the dump holds several served models: {models}",
                             where=str(path),
                             fix="pick one with --served-model NAME (their acceptance differs)")
    return series


def _label_values(series: dict[tuple[str, Labels], Sample], name: str) -> list[str]:
    return sorted({dict(key[1]).get(name) or "" for key in series})


def _with_label(series: dict[tuple[str, Labels], Sample], name: str, value: str, where: str,
                what: str) -> dict[tuple[str, Labels], Sample]:
    """The series whose label `name` is `value`; none is an error naming the values there are."""
    kept = {k: v for k, v in series.items() if dict(k[1]).get(name) == value}
    if not kept:
        raise UserInputError(f"no spec-decode series with {name}=\"{value}\"", where=where,
                             fix=f"use one of the {what} in the dump: "
                                 f"{_label_values(series, name)}")
    return kept


def _position(key: tuple[str, Labels], sample: Sample) -> int:
    pos = dict(key[1]).get("position")
    if pos is None or not pos.isdigit():
        raise UserInputError(f"{PER_POS} needs a position label 0, 1, ..., got {pos!r}",
                             where=sample.where, fix=_FORMAT_FIX)
    return int(pos)


def totals(series: dict[tuple[str, Labels], Sample], path: Path, *, engine: str | None = None,
           served_model: str | None = None) -> CounterTotals:
    """Sum the selected series of each family (several engines add up)."""
    series = _select(series, engine, served_model, path)
    sums = {f: 0.0 for f in FAMILIES}
    where: dict[str, str] = {}
    per_pos: dict[int, float] = {}
    for key, sample in sorted(series.items(), key=lambda kv: kv[1].where):
        family = key[0]
        where.setdefault(family, sample.where)
        if family == PER_POS:
            pos = _position(key, sample)
            per_pos[pos] = per_pos.get(pos, 0.0) + sample.value
        else:
            sums[family] += sample.value
    for family in (DRAFTS, DRAFT_TOKENS, ACCEPTED):
        if family not in where:
            raise UserInputError(f"the dump has no {family} counter", where=str(path),
                                 fix="dump the whole /metrics response of a vLLM server "
                                     "running speculative decoding")
    positions = sorted(per_pos)
    if positions != list(range(len(positions))):
        raise UserInputError(f"{PER_POS} positions are {positions}, not 0..{len(positions) - 1}",
                             where=where.get(PER_POS, str(path)), fix=_FORMAT_FIX)
    return CounterTotals(
        num_drafts=sums[DRAFTS], num_draft_tokens=sums[DRAFT_TOKENS],
        num_accepted_tokens=sums[ACCEPTED],
        accepted_per_pos=tuple(per_pos[p] for p in positions), where=where,
        model_names=tuple(sorted({dict(k[1]).get("model_name", "") for k in series} - {""})),
        engines=tuple(sorted({dict(k[1]).get("engine", "") for k in series} - {""})))


def read_counters(first: Path, second: Path | None = None, *, engine: str | None = None,
                  served_model: str | None = None) -> CounterTotals:
    """The counters of one dump, or the difference second − first of two."""
    before = read_dump(first)
    if second is None:
        return totals(before.counters, first, engine=engine, served_model=served_model)
    after = read_dump(second)
    return totals(difference(before, after), second, engine=engine, served_model=served_model)
