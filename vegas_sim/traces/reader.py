"""Reading a trace set (`load_trace_set`): validates meta.json, both files' schemas, every
value range and the content hash. A directory whose parts are newer than its last finalize
is refused (a half-written calibration is not mistaken for a finished one); the message says
to finish by re-running the calibration (it resumes) or `vegas-sim traces finalize DIR`. A
directory without `parts/` (e.g. a packaged set) is read from the consolidated files alone.

A data file's table checks (schema, dtypes, value ranges) run once per content: a file whose
sha256 passed them under this code is recorded in the user's fit cache (`vegas_sim.fitcache`,
HMAC-signed) and not re-checked; its rows are parsed only when first used (`TraceSet.latency`
/ `.acceptance`), from bytes whose sha256 is checked again. `check` always re-checks."""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from vegas_sim import fitcache
from vegas_sim.errors import TraceSetError
from vegas_sim.models import ModelSpec
from vegas_sim.traces.lookup import is_bare_name, packaged_sets, trace_set_dir
from vegas_sim.traces.meta import TraceSetMeta
from vegas_sim.traces.schema import (
    ACCEPTANCE_FILE,
    DATA_FILES,
    LATENCY_DEFAULTS,
    LATENCY_FILE,
    META_FILE,
    SCHEMA_VERSION,
    SCHEMAS,
)
from vegas_sim.traces import schema as schema_module
from vegas_sim.traces import validation as validation_module
from vegas_sim.traces.validation import (
    FIX_RECALIBRATE,
    check_collective_claims,
    check_row_claims,
    conform_table,
    tensor_parallel_size,
    to_pandas,
    validate_file_table,
    validate_meta,
)

PARTS_DIR = "parts"


PROGRESS_FILE = "progress.jsonl"




TABLE_OF_FILE = {LATENCY_FILE: "latency", ACCEPTANCE_FILE: "acceptance"}


FILE_OF_TABLE = {v: k for k, v in TABLE_OF_FILE.items()}


def finalize_command(path: Path) -> str:
    """The command that runs `finalize_trace_set(path)`."""
    return f"vegas-sim traces finalize {shlex.quote(str(path))}"


def _unfinalized_fix(path: Path) -> str:
    return (f"finish the calibration by re-running the same `vegas-sim calibrate ... --out "
            f"{path}` (it resumes where it stopped), or consolidate what is there with "
            f"`{finalize_command(path)}`")


def _hash_mismatch_fix(path: Path) -> str:
    """Restore, rebuild from the parts (only when they are there), or re-calibrate."""
    if not part_files(path, "latency") and not part_files(path, "acceptance"):
        return (f"the file changed after it was written: restore it (e.g. from the copy it "
                f"came from), or {FIX_RECALIBRATE}")
    return ("the file changed after it was written: restore it, or rebuild it from "
            f"{PARTS_DIR}/ (discarding the change) with `{finalize_command(path)}`, or "
            f"{FIX_RECALIBRATE}")


@dataclass(frozen=True)
class _Rows:
    """A data file whose table passed the checks: its rows, parsed on first use."""

    file: Path
    sha256: str
    n_rows: int
    table: pa.Table | None = None  # parsed and checked already (a check that just ran)
    collectives: bool = False  # some row records a collective call (`check_collective_claims`)

    def load(self) -> pd.DataFrame:
        if self.table is not None:
            return to_pandas(self.table)
        data = _read_bytes(self.file)
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise TraceSetError("the file changed after its trace set was read",
                                where=str(self.file), fix="read the trace set again")
        table = _parse_parquet(data, self.file)
        defaults = LATENCY_DEFAULTS if self.file.name == LATENCY_FILE else None
        return to_pandas(conform_table(table, SCHEMAS[self.file.name], self.file, defaults))


@dataclass(eq=False)
class TraceSet:
    """A read and checked trace set. `latency` and `acceptance` (DataFrames) are parsed from
    their files on first use: a command whose fits are cached never parses them."""

    path: Path
    meta: dict[str, Any]
    _latency: pd.DataFrame | _Rows = field(repr=False)
    _acceptance: pd.DataFrame | _Rows = field(repr=False)

    @property
    def latency(self) -> pd.DataFrame:
        """Columns of schema.LATENCY_SCHEMA."""
        if isinstance(self._latency, _Rows):
            self._latency = self._latency.load()
        return self._latency

    @property
    def acceptance(self) -> pd.DataFrame:
        """Columns of schema.ACCEPTANCE_SCHEMA (may be empty)."""
        if isinstance(self._acceptance, _Rows):
            self._acceptance = self._acceptance.load()
        return self._acceptance

    def n_rows(self, table: str) -> int:
        """Rows of 'latency' or 'acceptance', without parsing them."""
        rows = self._latency if table == "latency" else self._acceptance
        return rows.n_rows if isinstance(rows, _Rows) else len(rows)

    @property
    def info(self) -> TraceSetMeta:
        """meta.json's fields, typed, older sets' missing keys at their defaults."""
        return TraceSetMeta.from_dict(self.meta)

    @property
    def weights_kind(self) -> str:
        """'real' or 'random'."""
        return self.info.weights_kind

    @property
    def name(self) -> str:
        """The directory name, e.g. 'qwen3-8b-h200'."""
        return self.path.name

    @property
    def model_name(self) -> str:
        return self.info.model_name

    @property
    def model_spec(self) -> ModelSpec:
        return ModelSpec.from_dict(self.meta["model"])

    @property
    def gpu_name(self) -> str:
        return self.info.gpu_name

    @property
    def synthetic(self) -> bool:
        """True for sets made by traces/synthetic.py (never measured)."""
        return self.info.synthetic

    @property
    def runtime_revision(self) -> str:
        """The calibration runtime's revision (schema.RUNTIME_REVISION); "1" when unrecorded."""
        return self.info.runtime_revision

    @property
    def has_real_acceptance(self) -> bool:
        """Real weights and at least one acceptance row: usable by the acceptance model."""
        return self.weights_kind == "real" and self.n_rows("acceptance") > 0


# ============================================================================ small utilities
# ============================================================================ reading
def _missing(path: Path) -> TraceSetError:
    return TraceSetError("file is missing", where=str(path),
                         fix=f"a trace set holds {META_FILE}, {LATENCY_FILE} and "
                             f"{ACCEPTANCE_FILE}; {FIX_RECALIBRATE}")


def _read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise _missing(path)
    return path.read_bytes()


def _parse_parquet(data: bytes | Path, path: Path) -> pa.Table:
    import pyarrow.parquet as pq  # here: a command whose tables are checked and fitted
    # already (cached) never parses one, nor pays for this import
    try:
        return pq.read_table(pa.BufferReader(data) if isinstance(data, bytes) else data)
    except (pa.ArrowException, OSError) as e:
        raise TraceSetError(f"unreadable parquet: {e}", where=str(path),
                            fix=f"the file is corrupt or not parquet; {FIX_RECALIBRATE}") from None


def read_parquet(path: Path) -> pa.Table:
    if not path.is_file():
        raise _missing(path)
    return _parse_parquet(path, path)


def read_meta(path: Path, *, require_hash: bool = True) -> dict[str, Any]:
    meta_path = path / META_FILE
    if not meta_path.is_file():
        raise TraceSetError("meta.json is missing", where=str(meta_path),
                            fix=f"point at a trace-set directory; {FIX_RECALIBRATE}")
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceSetError(f"not valid JSON: {e}", where=str(meta_path),
                            fix=f"restore the file; {FIX_RECALIBRATE}") from None
    validate_meta(meta, meta_path, require_hash=require_hash)
    return dict(meta)


def part_files(path: Path, table: str) -> list[Path]:
    """Committed part files of `table` ('latency' | 'acceptance'), sorted by name."""
    parts = path / PARTS_DIR
    if not parts.is_dir():
        return []
    return sorted(p for p in parts.glob(f"{table}-*.parquet") if not p.name.startswith("."))


def unfinalized_parts(path: str | Path) -> list[str]:
    """Part files written after the last finalize (empty for a finished set)."""
    root = Path(path)
    try:
        meta = json.loads((root / META_FILE).read_text())
        recorded = meta.get("parts", {}) if isinstance(meta, dict) else {}
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        recorded = {}
    out = []
    for table in FILE_OF_TABLE:
        known = set(recorded.get(table, []) if isinstance(recorded, dict) else [])
        out += [p.name for p in part_files(root, table) if p.name not in known]
    return out


def _not_a_set_dir(root: Path, packaged_dir: Path | None) -> TraceSetError:
    """Why `root` (not a directory) cannot be a trace set, and what to pass instead."""
    names = ", ".join(p.name for p in packaged_sets(packaged_dir)) or "none"
    if root.is_file():
        inside = root.name == META_FILE or root.name in DATA_FILES
        return TraceSetError(
            "is a file, not a trace-set directory", where=str(root),
            fix=f"pass the directory that holds it, {root.parent}" if inside else
                f"pass the directory that holds {META_FILE}, {LATENCY_FILE} and "
                f"{ACCEPTANCE_FILE} (made by `vegas-sim calibrate`), or the name of a "
                f"packaged set ({names})")
    if root.exists():
        return TraceSetError("is not a directory (a trace set is a directory)",
                             where=str(root), fix="pass a trace-set directory")
    if is_bare_name(root):
        return TraceSetError(
            "no such directory, and no packaged trace set has this name", where=str(root),
            fix=f"name a packaged set ({names}; `vegas-sim traces list`), or pass a "
                "directory made by `vegas-sim calibrate`")
    return TraceSetError("trace-set directory does not exist", where=str(root),
                         fix="pass a directory made by `vegas-sim calibrate`, or the name of a "
                             f"packaged set ({names}; `vegas-sim traces list`)")


def _load(path: str | Path, passed: list[str], packaged_dir: Path | None = None, *,
          use_cache: bool = True) -> TraceSet:
    """Validation in order; each step that succeeds appends a line to `passed`. use_cache:
    skip the table checks of a file whose content passed them before (`_checked_rows`)."""
    root = trace_set_dir(path, packaged_dir)
    if not root.is_dir():
        raise _not_a_set_dir(root, packaged_dir)
    meta = read_meta(root, require_hash=False)
    pending = unfinalized_parts(root)
    if pending:
        raise TraceSetError(
            f"unfinished trace set: {len(pending)} part file(s) in {PARTS_DIR}/ are newer than "
            f"the last finalize (e.g. {pending[0]})", where=str(root),
            fix=_unfinalized_fix(root))
    validate_meta(meta, root / META_FILE)
    passed.append(f"{META_FILE}: keys present, schema_version {SCHEMA_VERSION}, model and gpu "
                  f"well-formed")
    kind = str(meta["model"]["weights"]["kind"])
    tables = {name: _checked_rows(root / name, kind, use_cache=use_cache) for name in DATA_FILES}
    for name, rows in tables.items():
        passed.append(f"{name}: {rows.n_rows} rows, columns and dtypes match schema v1, "
                      f"value ranges valid")
    check_row_claims(meta, tables[LATENCY_FILE].n_rows, tables[ACCEPTANCE_FILE].n_rows, root)
    passed.append("rows: the set holds rows, and as many as its meta.json records")
    check_collective_claims(meta, tables[LATENCY_FILE].collectives, root)
    if tensor_parallel_size(meta) > 1:
        passed.append(f"tensor parallel {tensor_parallel_size(meta)}: the model splits that "
                      "many ways, collective columns consistent")
    for name, rows in tables.items():
        actual, recorded = rows.sha256, meta["content_hash"][name]
        if actual != recorded:
            raise TraceSetError(
                f"content hash mismatch: sha256 is {actual[:12]}…, meta.json records "
                f"{recorded[:12]}…", where=f"{root / name} (meta.json key 'content_hash')",
                fix=_hash_mismatch_fix(root))
    passed.append("content hash matches meta.json for " + ", ".join(DATA_FILES))
    return TraceSet(root, meta, tables[LATENCY_FILE], tables[ACCEPTANCE_FILE])


def _checked_rows(file: Path, weights_kind: str, *, use_cache: bool) -> _Rows:
    """`file`'s table checked (`validate_file_table`), or known to have passed: its sha256
    is recorded in the fit cache as checked by this code with `weights_kind`, with its row
    count and whether a row records a collective call. use_cache False: read, hashed and
    checked again."""
    digest = _content_sha256(file) if use_cache else ""
    checked: list[tuple[pa.Table, str]] = []

    def check_table() -> tuple[int, bool]:
        data = _read_bytes(file)
        actual = hashlib.sha256(data).hexdigest()
        if use_cache and actual != digest:
            raise TraceSetError("the file changed while it was read", where=str(file),
                                fix="read the trace set again")
        table = validate_file_table(file.name, _parse_parquet(data, file), file, weights_kind)
        checked.append((table, actual))
        return table.num_rows, _records_collectives(table)

    key = fitcache.key("trace table checked, collectives", {
        "file": file.name, "sha256": digest, "weights_kind": weights_kind}, _CHECK_CODE)
    n_rows, collectives = fitcache.cached(key if use_cache else None, check_table)
    table, actual = checked[0] if checked else (None, digest)
    return _Rows(file, actual, int(n_rows), table, bool(collectives))


def _records_collectives(table: pa.Table) -> bool:
    """Some row's collective_calls is above 0 (a set without the column records none)."""
    if "collective_calls" not in table.column_names or table.num_rows == 0:
        return False
    return bool(pc.any(pc.greater(table["collective_calls"], 0)).as_py())


def _content_sha256(file: Path) -> str:
    """sha256 of `file`'s bytes, recorded in the fit cache under the file's identity and
    change stamp (device, inode, size, mtime and ctime, which every write moves), so that a
    command does not read a large unchanged table only to hash it again."""
    if not file.is_file():
        raise _missing(file)
    st = file.stat()
    stamp = [str(file.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
             st.st_ctime_ns]
    return str(fitcache.cached(fitcache.key("file sha256", {"file": stamp}, (fitcache,)),
                               lambda: hashlib.sha256(_read_bytes(file)).hexdigest()))


_CHECK_CODE = (validation_module, schema_module)  # the code whose checks a cache entry records


def load_trace_set(path: str | Path, *, packaged_dir: Path | None = None) -> TraceSet:
    """Read and fully validate a trace set; raises TraceSetError naming file, column and fix.

    `path`: a trace-set directory, or the bare name of a packaged set when no such path
    exists (`trace_set_dir`). Refuses a set with parts newer than its last finalize (see the
    module docstring).
    """
    return _load(path, [], packaged_dir)


def check(path: str | Path) -> list[str]:
    """The checks a trace set passes (for `vegas-sim traces check`); raises on the first failure.
    `path` as for `load_trace_set`."""
    passed: list[str] = []
    _load(path, passed, use_cache=False)
    return passed


def require_real_acceptance(trace_set: TraceSet) -> None:
    """Raise TraceSetError unless `trace_set` has acceptance rows from real weights."""
    if trace_set.weights_kind != "real":
        raise TraceSetError(
            "random-weight model's acceptance is meaningless",
            where=f"{trace_set.path / META_FILE}, key 'model.weights.kind'",
            fix="calibrate with --weights real for acceptance (random weights are for latency)")
    if trace_set.n_rows("acceptance") == 0:
        raise TraceSetError(
            "latency-only trace set: no acceptance rows",
            where=str(trace_set.path / ACCEPTANCE_FILE),
            fix="calibrate a real-weight model with acceptance, or use a packaged one")
