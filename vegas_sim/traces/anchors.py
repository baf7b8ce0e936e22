"""Acceptance anchors: measured acceptance of one model, to set the level of the acceptance model.

A trace set with real weights gives the *shape* of acceptance (how it moves with γ, draft
position, sparsity, context, workload); anchors give its *level* for the model a user cares
about, from any measurement (a vLLM run's spec-decode metrics, a paper's table).
docs/ACCEPTANCE_ANCHORS.md documents the format; `vegas_sim.sim.anchored` applies it.

One anchor: for (method, γ, sparsity, context range, workload, temperature), the mean acceptance
length in vLLM's convention (1 + accepted / drafts: the bonus token included) and optionally
vLLM's per-position rates (`num_accepted_tokens_per_pos[i] / num_drafts`). Fields that are
None mean "any / not recorded".

Files are JSON (`{"format": ANCHOR_FORMAT, "version": 1, "model", "source", "anchors": [...]}`)
or CSV (one row per anchor; `# model: ...` / `# source: ...` comment lines at the top). A bare
name (no suffix, no directory) is a packaged set: `vegas_sim/traces/default/anchors/<name>.json`.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vegas_sim.errors import TraceSetError, UserInputError
from vegas_sim.files import write_atomic
from vegas_sim.methods import SPEC_METHODS

ANCHOR_FORMAT = "vegas-sim.acceptance-anchors"
ANCHOR_VERSION = 1
PACKAGED_ANCHOR_DIR = Path(__file__).parent / "default" / "anchors"
RATE_SUM_TOLERANCE = 1e-3  # relative: mean_acceptance_length vs 1 + sum(per_position_rates)

FIELDS: tuple[str, ...] = (
    "method", "gamma", "sparsity", "context", "workload", "temperature",
    "mean_acceptance_length", "per_position_rates", "num_drafts", "source", "output_len",
)
CSV_COLUMNS: tuple[str, ...] = (
    "method", "gamma", "sparsity", "context_lo", "context_hi", "workload", "temperature",
    "mean_acceptance_length", "num_drafts", "source", "output_len",
)
_REQUIRED = ("method", "gamma", "mean_acceptance_length")
_DOC = "see docs/ACCEPTANCE_ANCHORS.md"


class _FieldError(UserInputError):
    """A bad field of one anchor; the loader re-raises it naming the file and the anchor's
    index (JSON) or line (CSV)."""

    def __init__(self, field: str, problem: str, fix: str):
        self.field = field
        super().__init__(problem, where=f"anchor field {field!r}", fix=fix)


@dataclass(frozen=True)
class Anchor:
    """Measured acceptance at one configuration. Constructing one checks every field
    (UserInputError naming the field and the fix)."""

    method: str  # one of methods.SPEC_METHODS
    gamma: int  # vLLM num_speculative_tokens
    sparsity: float | None  # None = any / not applicable
    context: tuple[int, int] | None  # inclusive range of the counted requests' prompt lengths
    workload: str | None  # reasoning, code, chat, longdoc, ...; None = any
    temperature: float | None
    mean_acceptance_length: float  # 1 + accepted / drafts (bonus included), in [1, gamma + 1]
    per_position_rates: tuple[float, ...] | None = None  # accepted_per_pos[i] / drafts
    num_drafts: int | None = None  # sample size, if known
    source: str = ""
    # mean tokens each counted request generated (the counts pool its whole generation, its
    # context growing from the prompt); None = as long as the shape set's traced runs
    output_len: int | None = None

    def __post_init__(self) -> None:
        _check_anchor(self)

    def describe(self) -> str:
        """E.g. 'vegas γ6 s0.07 reasoning T0.6 ctx 182-182: 6.24'."""
        parts = [self.method, f"γ{self.gamma}"]
        if self.sparsity is not None:
            parts.append(f"s{self.sparsity:g}")
        if self.workload is not None:
            parts.append(self.workload)
        if self.temperature is not None:
            parts.append(f"T{self.temperature:g}")
        if self.context is not None:
            parts.append(f"ctx {self.context[0]}-{self.context[1]}")
        return f"{' '.join(parts)}: {self.mean_acceptance_length:.3g}"


@dataclass(frozen=True)
class AnchorSet:
    """The anchors of one file (or packaged name) for one model."""

    model: str | None
    source: str
    anchors: tuple[Anchor, ...]
    path: str = ""  # where it was read from, or the packaged name

    def name(self) -> str:
        """The packaged name or the file's stem; else the model; else 'anchors'."""
        if self.path:
            return Path(self.path).stem
        return self.model or "anchors"

    def methods(self) -> tuple[str, ...]:
        return tuple(sorted({a.method for a in self.anchors}))


# ------------------------------------------------------------------------------ field checks
def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(float(v)))


def _check_anchor(a: Anchor) -> None:
    """Raise _FieldError for the first bad field of `a`."""
    if a.method not in SPEC_METHODS:
        raise _FieldError("method", f"unknown method {a.method!r}",
                          f"use one of: {', '.join(SPEC_METHODS)}")
    if not _is_int(a.gamma) or a.gamma < 1:
        raise _FieldError("gamma", f"gamma must be an integer >= 1, got {a.gamma!r}",
                          "give vLLM's num_speculative_tokens, e.g. 6")
    if a.sparsity is not None and not (_is_number(a.sparsity) and 0.0 < a.sparsity <= 1.0):
        raise _FieldError("sparsity", f"sparsity must be in (0, 1] or empty, got {a.sparsity!r}",
                          "give the fraction of the context the draft attends to, e.g. 0.07")
    _check_context(a.context)
    if a.workload is not None and (not isinstance(a.workload, str) or not a.workload.strip()):
        raise _FieldError("workload", f"workload must be a non-empty name or empty, "
                          f"got {a.workload!r}", "e.g. reasoning, code, chat, longdoc")
    if a.temperature is not None and not (_is_number(a.temperature) and a.temperature >= 0):
        raise _FieldError("temperature", f"temperature must be >= 0 or empty, "
                          f"got {a.temperature!r}", "0 means greedy, e.g. 0.6")
    _check_length(a)
    if a.per_position_rates is not None:
        _check_rates(a)
    if a.num_drafts is not None and not (_is_int(a.num_drafts) and a.num_drafts >= 1):
        raise _FieldError("num_drafts", f"num_drafts must be an integer >= 1 or empty, "
                          f"got {a.num_drafts!r}", "give vLLM's num_drafts, or leave it out")
    if a.output_len is not None and not (_is_int(a.output_len) and a.output_len >= 1):
        raise _FieldError("output_len", f"output_len must be an integer >= 1 or empty, "
                          f"got {a.output_len!r}",
                          "give the mean tokens generated per counted request, or leave it out")
    if not isinstance(a.source, str):
        raise _FieldError("source", f"source must be text, got {a.source!r}",
                          "say where the number was measured")


def _check_context(context: object) -> None:
    if context is None:
        return
    ok = (isinstance(context, tuple) and len(context) == 2
          and all(_is_int(v) for v in context) and 0 <= context[0] <= context[1])
    if not ok:
        raise _FieldError("context", f"context must be an inclusive token range [lo, hi] "
                          f"with 0 <= lo <= hi, or empty; got {context!r}",
                          "give the prompt lengths of the requests counted, e.g. [1024, 4096]")


def _check_length(a: Anchor) -> None:
    v = a.mean_acceptance_length
    if not _is_number(v) or not (1.0 <= v <= a.gamma + 1):
        raise _FieldError(
            "mean_acceptance_length",
            f"mean_acceptance_length must be a number in [1, gamma + 1] = [1, {a.gamma + 1}], "
            f"got {v!r}",
            "use vLLM's convention 1 + accepted / drafts (the bonus token included)")


def _check_rates(a: Anchor) -> None:
    rates = a.per_position_rates
    assert rates is not None
    if not isinstance(rates, tuple) or len(rates) != a.gamma:
        n = len(rates) if isinstance(rates, tuple) else "?"
        raise _FieldError("per_position_rates", f"per_position_rates must hold gamma = "
                          f"{a.gamma} numbers, got {n}",
                          "give num_accepted_tokens_per_pos[i] / num_drafts for i = 0..gamma-1")
    if not all(_is_number(r) and 0.0 <= r <= 1.0 for r in rates):
        raise _FieldError("per_position_rates", f"per_position_rates must be in [0, 1], "
                          f"got {list(rates)}", "divide vLLM's per-position counts by num_drafts")
    if any(later > earlier + 1e-9 for earlier, later in itertools.pairwise(rates)):
        raise _FieldError("per_position_rates", f"per_position_rates must be non-increasing "
                          f"(a draft is accepted only after all before it), got {list(rates)}",
                          "check the order: position 0 first")
    total = 1.0 + sum(rates)
    if abs(total - a.mean_acceptance_length) > RATE_SUM_TOLERANCE * a.mean_acceptance_length:
        raise _FieldError("per_position_rates", f"1 + sum(per_position_rates) = {total:.4f} but "
                          f"mean_acceptance_length = {a.mean_acceptance_length}",
                          "they must agree (vLLM: mean acceptance length = 1 + sum of the "
                          "per-position rates); fix one of them")


# ------------------------------------------------------------------------------------ JSON
def _opt_float(v: object, field: str) -> float | None:
    if v is None:
        return None
    if not _is_number(v):
        raise _FieldError(field, f"{field} must be a number or null, got {v!r}", _DOC)
    return float(v)  # type: ignore[arg-type]


def _anchor_from_dict(d: object) -> Anchor:
    if not isinstance(d, dict):
        raise _FieldError("-", f"an anchor must be an object, got {type(d).__name__}", _DOC)
    unknown = sorted(set(d) - set(FIELDS))
    if unknown:
        raise _FieldError(unknown[0], f"unknown field {unknown[0]!r}",
                          f"the fields are: {', '.join(FIELDS)}")
    for f in _REQUIRED:
        if d.get(f) is None:
            raise _FieldError(f, f"{f} is missing", f"every anchor needs {', '.join(_REQUIRED)}")
    ctx = d.get("context")
    if ctx is not None:
        if not (isinstance(ctx, list) and len(ctx) == 2):
            raise _FieldError("context", f"context must be [lo, hi] or null, got {ctx!r}",
                              "e.g. [1024, 4096]: the prompts' shortest and longest")
        ctx = tuple(ctx)
    rates = d.get("per_position_rates")
    if rates is not None:
        if not isinstance(rates, list):
            raise _FieldError("per_position_rates", "per_position_rates must be a list or null",
                              "e.g. [0.9, 0.8, 0.7]")
        rates = tuple(rates)
    return _make_anchor(
        method=d["method"], gamma=d["gamma"], sparsity=_opt_float(d.get("sparsity"), "sparsity"),
        context=ctx, workload=d.get("workload"),
        temperature=_opt_float(d.get("temperature"), "temperature"),
        mean_acceptance_length=d["mean_acceptance_length"], per_position_rates=rates,
        num_drafts=d.get("num_drafts"), source=d.get("source") or "",
        output_len=d.get("output_len"))


def _make_anchor(**kw: Any) -> Anchor:
    """Anchor(**kw) from parsed, not yet checked values (its checks raise _FieldError)."""
    return Anchor(**kw)


def _load_json(path: Path) -> AnchorSet:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise TraceSetError(f"not valid JSON: {e}", where=str(path),
                            fix=f"write an anchors document, {_DOC}") from None
    if not isinstance(doc, dict) or doc.get("format") != ANCHOR_FORMAT:
        raise TraceSetError(f"not an acceptance-anchors document (its \"format\" must be "
                            f"{ANCHOR_FORMAT!r})", where=str(path),
                            fix=f"start it with {{\"format\": \"{ANCHOR_FORMAT}\", \"version\": "
                                f"{ANCHOR_VERSION}, ...}}; {_DOC}")
    if doc.get("version") != ANCHOR_VERSION:
        raise TraceSetError(f"anchors version {doc.get('version')!r} is not supported",
                            where=f"{path}: \"version\"",
                            fix=f"this vegas-sim reads version {ANCHOR_VERSION}")
    entries = doc.get("anchors")
    if not isinstance(entries, list) or not entries:
        raise TraceSetError("\"anchors\" must be a non-empty list", where=str(path),
                            fix=f"give at least one anchor; {_DOC}")
    for key in ("model", "source"):
        if doc.get(key) is not None and not isinstance(doc[key], str):
            raise TraceSetError(f"\"{key}\" must be text", where=f"{path}: \"{key}\"", fix=_DOC)
    anchors = []
    for i, d in enumerate(entries):
        try:
            anchors.append(_anchor_from_dict(d))
        except _FieldError as e:
            raise TraceSetError(e.problem, where=f"{path}: anchor {i}, field {e.field!r}",
                                fix=e.fix) from None
    return AnchorSet(model=doc.get("model"), source=doc.get("source") or "",
                     anchors=tuple(anchors), path=str(path))


def _anchor_to_dict(a: Anchor) -> dict[str, Any]:
    return {
        "method": a.method, "gamma": a.gamma, "sparsity": a.sparsity,
        "context": list(a.context) if a.context is not None else None,
        "workload": a.workload, "temperature": a.temperature,
        "mean_acceptance_length": a.mean_acceptance_length,
        "per_position_rates": list(a.per_position_rates) if a.per_position_rates else None,
        "num_drafts": a.num_drafts, "source": a.source, "output_len": a.output_len,
    }


# ------------------------------------------------------------------------------------- CSV
def _cell_float(row: dict[str, str], col: str) -> float | None:
    text = (row.get(col) or "").strip()
    if not text:
        return None
    try:
        v = float(text)
    except ValueError:
        raise _FieldError(col, f"{col} must be a number or empty, got {text!r}", _DOC) from None
    if not math.isfinite(v):
        raise _FieldError(col, f"{col} must be finite, got {text!r}", _DOC)
    return v


def _cell_int(row: dict[str, str], col: str) -> int | None:
    v = _cell_float(row, col)
    if v is None:
        return None
    if v != int(v):
        raise _FieldError(col, f"{col} must be an integer, got {row[col].strip()!r}", _DOC)
    return int(v)


def _rate_columns(header: list[str]) -> list[str]:
    rate_cols = [c for c in header if c.startswith("rate_")]
    expected = [f"rate_{i}" for i in range(1, len(rate_cols) + 1)]
    if rate_cols != expected:
        raise _FieldError(rate_cols[0] if rate_cols else "rate_1",
                          f"rate columns must be rate_1..rate_K in order, got {rate_cols}", _DOC)
    return rate_cols


def _anchor_from_row(row: dict[str, str], rate_cols: list[str]) -> Anchor:
    for col in _REQUIRED:
        if not (row.get(col) or "").strip():
            raise _FieldError(col, f"{col} is empty", f"every row needs {', '.join(_REQUIRED)}")
    gamma = _cell_int(row, "gamma")
    lo, hi = _cell_int(row, "context_lo"), _cell_int(row, "context_hi")
    if (lo is None) != (hi is None):
        raise _FieldError("context_lo" if lo is None else "context_hi",
                          "give both context_lo and context_hi, or neither",
                          "the shortest and longest prompt of the requests counted, "
                          "e.g. 1024 and 4096")
    rates = [_cell_float(row, c) for c in rate_cols]
    given = [r for r in rates if r is not None]
    if given and (gamma is None or len(given) != gamma or rates[:gamma] != given):
        raise _FieldError("rate_1", f"give rate_1..rate_{gamma} (one per draft position) or no "
                          f"rates, got {len(given)}", "leave all rate cells empty if unknown")
    workload = (row.get("workload") or "").strip() or None
    return _make_anchor(
        method=(row.get("method") or "").strip(), gamma=gamma,
        sparsity=_cell_float(row, "sparsity"),
        context=(lo, hi) if lo is not None else None, workload=workload,
        temperature=_cell_float(row, "temperature"),
        mean_acceptance_length=_cell_float(row, "mean_acceptance_length"),
        per_position_rates=tuple(given) if given else None,
        num_drafts=_cell_int(row, "num_drafts"), source=(row.get("source") or "").strip(),
        output_len=_cell_int(row, "output_len"))


def _split_header(text: str) -> tuple[dict[str, str], int, str]:
    """(comment keys such as model/source, lines of comments, the CSV text after them)."""
    lines = text.splitlines(keepends=True)
    meta: dict[str, str] = {}
    n = 0
    while n < len(lines) and (lines[n].startswith("#") or not lines[n].strip()):
        key, sep, value = lines[n].lstrip("#").partition(":")
        if sep and key.strip().lower() in ("model", "source"):
            meta[key.strip().lower()] = value.strip()
        n += 1
    return meta, n, "".join(lines[n:])


def _load_csv(path: Path) -> AnchorSet:
    meta, skipped, body = _split_header(path.read_text(encoding="utf-8"))
    reader = csv.DictReader(io.StringIO(body))
    header = list(reader.fieldnames or [])
    missing = [c for c in _REQUIRED if c not in header]
    if missing:
        raise TraceSetError(f"no column {missing[0]!r} (columns: {header})", where=str(path),
                            fix=f"the columns are {', '.join(CSV_COLUMNS)}, rate_1..rate_K")
    known = set(CSV_COLUMNS) | {"model"}
    unknown = [c for c in header if c not in known and not c.startswith("rate_")]
    if unknown:
        raise TraceSetError(f"unknown column {unknown[0]!r}", where=str(path),
                            fix=f"the columns are {', '.join(CSV_COLUMNS)}, rate_1..rate_K")
    try:
        rate_cols = _rate_columns(header)
    except _FieldError as e:
        raise TraceSetError(e.problem, where=f"{path}: header", fix=e.fix) from None
    anchors, models = [], set()
    for row in reader:
        line = skipped + reader.line_num
        try:
            anchors.append(_anchor_from_row(row, rate_cols))
        except _FieldError as e:
            raise TraceSetError(e.problem, where=f"{path}: line {line}, column {e.field!r}",
                                fix=e.fix) from None
        if (row.get("model") or "").strip():
            models.add(row["model"].strip())
    if not anchors:
        raise TraceSetError("no anchor rows", where=str(path),
                            fix=f"give one row per anchor; {_DOC}")
    if meta.get("model"):
        models.add(meta["model"])
    if len(models) > 1:
        raise TraceSetError(f"the file names several models: {sorted(models)}", where=str(path),
                            fix="one anchors file holds one model's anchors")
    sources = {a.source for a in anchors}
    source = meta.get("source") or (sources.pop() if len(sources) == 1 else "")
    model = models.pop() if models else None
    return AnchorSet(model=model, source=source, anchors=tuple(anchors), path=str(path))


def _csv_text(anchor_set: AnchorSet) -> str:
    k = max((a.gamma for a in anchor_set.anchors if a.per_position_rates), default=0)
    out = io.StringIO()
    if anchor_set.model:
        out.write(f"# model: {anchor_set.model}\n")
    if anchor_set.source:
        out.write(f"# source: {' '.join(anchor_set.source.split())}\n")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*CSV_COLUMNS, *(f"rate_{i}" for i in range(1, k + 1))])
    for a in anchor_set.anchors:
        rates = list(a.per_position_rates or ())
        writer.writerow([
            a.method, a.gamma, _fmt(a.sparsity), *(a.context or ("", "")), a.workload or "",
            _fmt(a.temperature), repr(float(a.mean_acceptance_length)),
            a.num_drafts if a.num_drafts is not None else "", a.source,
            a.output_len if a.output_len is not None else "",
            *(repr(float(r)) for r in rates), *([""] * (k - len(rates))),
        ])
    return out.getvalue()


def _fmt(v: float | None) -> str:
    return "" if v is None else repr(float(v))


# ---------------------------------------------------------------------------------- public
def packaged_anchor_sets() -> list[str]:
    """Names of the packaged anchor sets (`default/anchors/<name>.json`), sorted."""
    if not PACKAGED_ANCHOR_DIR.is_dir():
        return []
    return sorted(p.stem for p in PACKAGED_ANCHOR_DIR.glob("*.json"))


def _anchor_path(path_or_name: str | Path) -> tuple[Path, str]:
    """(the file to read, the name to record: the packaged name or the path as given)."""
    given = Path(path_or_name)
    if given.suffix.lower() in (".json", ".csv"):
        return given, str(given)
    if len(given.parts) == 1 and not given.is_absolute() and not given.exists():
        packaged = PACKAGED_ANCHOR_DIR / f"{given.name}.json"
        if packaged.is_file():
            return packaged, given.name
        raise UserInputError(f"no packaged acceptance anchors named {given.name!r}",
                             where="--acceptance-anchor",
                             fix=f"packaged: {', '.join(packaged_anchor_sets()) or 'none'}; or "
                                 "pass a file ending in .json or .csv")
    raise UserInputError(f"cannot tell the format of {str(given)!r} from its suffix",
                         where="--acceptance-anchor",
                         fix="name a .json or .csv anchors file, or a packaged name")


def load_anchors(path_or_name: str | Path) -> AnchorSet:
    """Read an anchors file (JSON or CSV, by suffix) or a packaged set by its bare name.
    Every problem is a UserInputError/TraceSetError naming the file, the line (CSV) or anchor
    index (JSON), the field, and the fix."""
    path, recorded = _anchor_path(path_or_name)
    if not path.is_file():
        raise UserInputError(f"no anchors file {str(path)!r}", where="--acceptance-anchor",
                             fix="check the path, or pass a packaged name: "
                                 f"{', '.join(packaged_anchor_sets()) or 'none'}")
    try:
        loaded = _load_json(path) if path.suffix.lower() == ".json" else _load_csv(path)
    except (OSError, UnicodeDecodeError) as e:
        raise TraceSetError(f"cannot read: {e}", where=str(path), fix="check the file") from None
    except csv.Error as e:
        raise TraceSetError(f"malformed CSV: {e}", where=str(path), fix=_DOC) from None
    return AnchorSet(model=loaded.model, source=loaded.source, anchors=loaded.anchors,
                     path=recorded)


def write_anchors(anchor_set: AnchorSet, path: Path) -> Path:
    """Write `anchor_set` as JSON (.json) or CSV (.csv), atomically; `load_anchors` reads it
    back equal (path aside)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".json", ".csv"):
        raise UserInputError(f"cannot tell what to write to {str(path)!r} from its suffix",
                             where="--out", fix="name the file *.json or *.csv")
    if suffix == ".json":
        doc = {"format": ANCHOR_FORMAT, "version": ANCHOR_VERSION, "model": anchor_set.model,
               "source": anchor_set.source,
               "anchors": [_anchor_to_dict(a) for a in anchor_set.anchors]}
        text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    else:
        text = _csv_text(anchor_set)
    return write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
