"""Writing a trace set (`TraceSetWriter`): every append lands in its own part file, written
atomically and durably, so an interruption at any moment leaves either the whole part or
nothing. An append given a `key` (the grid point) overwrites that point's part, so a point
that was appended but not yet marked done is redone on resume, never duplicated.
`finalize()` concatenates the parts (sorted by name, hence deterministic) into the two
consolidated files, then rewrites meta.json with their hashes and the list of parts it
included. Parts stay on disk: re-running `finalize()` rebuilds the same files, which also
repairs a finalize that was itself interrupted."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from vegas_sim.errors import TraceSetError
from vegas_sim.files import atomic_write, sha256_file, write_json
from vegas_sim.traces.reader import (
    FILE_OF_TABLE,
    PARTS_DIR,
    PROGRESS_FILE,
    TABLE_OF_FILE,
    TraceSet,
    load_trace_set,
    part_files,
    read_meta,
    read_parquet,
)
from vegas_sim.traces.schema import (
    ACCEPTANCE_FILE,
    EXPECTED_ROWS_KEY,
    LATENCY_FILE,
    META_FILE,
    SCHEMA_VERSION,
    SCHEMAS,
)
from vegas_sim.traces.validation import (
    check_row_claims,
    content_hash,
    table_from_frame,
    validate_acceptance,
    validate_file_table,
    validate_latency,
    validate_meta,
)


def _write_parquet_atomic(path: Path, table: pa.Table, durable: bool = True) -> None:
    import pyarrow.parquet as pq  # here: commands that write no set do not pay for it

    # zstd at level 9: acceptance rows are most of the repository, which a device call
    # carries beside a part of the GGUF (sizes and write times: docs/RESULTS.md, Calibration)
    atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd",
                                                  compression_level=9),
                 durable=durable)


# ============================================================================ writing
def _slug(key: str) -> str:
    """A file-name-safe, collision-free name for a grid-point key."""
    readable = re.sub(r"[^A-Za-z0-9_.=-]+", "_", key)[:60]
    return f"{readable}-{hashlib.sha1(key.encode()).hexdigest()[:10]}"


class TraceSetWriter:
    """Creates or resumes a trace set directory; appends rows atomically per grid point.

    `meta` holds every key of schema.META_KEYS except `content_hash` (filled by `finalize`);
    `schema_version` defaults to the current one. Resuming an existing directory keeps its
    meta.json and requires the same model (all of `meta['model']`, weights included) and the same
    GPU name; anything else raises TraceSetError.

        w = TraceSetWriter(out, meta)
        for point in grid:
            if point.key in w.done_points(): continue
            w.append_latency(rows, key=point.key); w.mark_done(point.key)
        w.finalize()
    """

    def __init__(self, path: str | Path, meta: dict[str, Any], *, durable: bool = True) -> None:
        self.path = Path(path)
        self.durable = durable  # False: skip fsyncs (tests); writes stay atomic
        new_meta = {"schema_version": SCHEMA_VERSION, **meta}
        new_meta.pop("content_hash", None)
        validate_meta(new_meta, self.path / META_FILE, require_hash=False)
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / PARTS_DIR).mkdir(exist_ok=True)
        if (self.path / META_FILE).exists():
            self.meta = self._resume(new_meta)
        else:
            self.meta = new_meta
            write_json(self.path / META_FILE, self.meta, durable=durable)
        # Unkeyed parts are numbered after the highest number on disk (never reused).
        numbers = [int(m.group(1)) for t in FILE_OF_TABLE for p in part_files(self.path, t)
                   if (m := re.search(r"-(\d{6})(?:-base)?\.parquet$", p.name))]
        self._seq = max(numbers, default=0)

    @property
    def weights_kind(self) -> str:
        return str(self.meta["model"]["weights"]["kind"])

    def _resume(self, new_meta: dict[str, Any]) -> dict[str, Any]:
        meta_path = self.path / META_FILE
        old = read_meta(self.path, require_hash=False)
        if old["model"] != new_meta["model"]:
            raise TraceSetError(
                f"resuming with a different model: directory has {old['model'].get('name')!r} "
                f"(weights {old['model'].get('weights')}), this run has "
                f"{new_meta['model'].get('name')!r} (weights {new_meta['model'].get('weights')})",
                where=f"{meta_path}, key 'model'",
                fix="write to a new directory, or resume with the same model and weights")
        if old["gpu"]["name"] != new_meta["gpu"]["name"]:
            raise TraceSetError(
                f"resuming on a different GPU: directory has {old['gpu']['name']!r}, this run "
                f"has {new_meta['gpu']['name']!r}", where=f"{meta_path}, key 'gpu.name'",
                fix="write to a new directory, or resume on the same GPU model")
        self._adopt_consolidated(old)
        # the row count a merge/subset expects belongs to that run: a calibration resumed
        # into the directory adds rows of its own (finalize_trace_set passes the same meta)
        old.pop(EXPECTED_ROWS_KEY, None)
        if EXPECTED_ROWS_KEY in new_meta:
            old[EXPECTED_ROWS_KEY] = new_meta[EXPECTED_ROWS_KEY]
        return old

    def _adopt_consolidated(self, meta: dict[str, Any]) -> None:
        """A finalized set without its parts (e.g. copied without parts/) becomes a base part,
        so that parts stay the single source of truth for the next finalize."""
        for name, table in TABLE_OF_FILE.items():
            recorded = set(meta.get("parts", {}).get(table, []))
            present = {p.name for p in part_files(self.path, table)}
            file = self.path / name
            if not file.is_file() or recorded & present:
                continue
            data = read_parquet(file)
            if data.num_rows == 0:
                continue
            expected = meta.get("content_hash", {}).get(name)
            if expected is not None and sha256_file(file) != expected:
                raise TraceSetError(
                    "content hash mismatch: cannot resume from a modified file",
                    where=f"{file} (meta.json key 'content_hash')",
                    fix="restore the file or write to a new directory")
            base = self.path / PARTS_DIR / f"{table}-000000-base.parquet"
            _write_parquet_atomic(base, data, self.durable)

    # ------------------------------------------------------------------ appends
    def _part_path(self, table: str, key: str | None) -> Path:
        if key is not None:
            return self.path / PARTS_DIR / f"{table}-k-{_slug(key)}.parquet"
        self._seq += 1
        return self.path / PARTS_DIR / f"{table}-{self._seq:06d}.parquet"

    def append_latency(self, rows: pd.DataFrame, key: str | None = None) -> Path:
        """Validate and write latency rows as one part; with `key`, replaces that key's part."""
        where = f"{self.path / PARTS_DIR} (latency rows)"
        table = validate_latency(table_from_frame(rows, where), where)
        return self._write_part("latency", table, key)

    def append_acceptance(self, rows: pd.DataFrame, key: str | None = None) -> Path:
        """Validate and write acceptance rows as one part; with `key`, replaces that key's part."""
        where = f"{self.path / PARTS_DIR} (acceptance rows)"
        table = validate_acceptance(table_from_frame(rows, where), where, self.weights_kind)
        return self._write_part("acceptance", table, key)

    def _write_part(self, table_name: str, table: pa.Table, key: str | None) -> Path:
        part = self._part_path(table_name, key)
        _write_parquet_atomic(part, table, self.durable)
        return part

    # ------------------------------------------------------------------ progress
    def _progress_lines(self) -> Iterator[dict[str, Any]]:
        file = self.path / PROGRESS_FILE
        if not file.is_file():
            return
        lines = file.read_text().splitlines()
        for line in lines:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line torn by an interruption: that point was not marked done
            if isinstance(rec, dict) and "key" in rec:
                yield rec

    def progress(self) -> dict[str, dict[str, Any]]:
        """Last record per grid-point key: {'key', 'status', 'detail', 'time'}."""
        return {str(rec["key"]): rec for rec in self._progress_lines()}

    def done_points(self) -> set[str]:
        """Keys of grid points already recorded (for resume), whatever their status."""
        return set(self.progress())

    def mark_done(self, key: str, status: str = "ok", detail: str = "") -> None:
        """Record a finished (or skipped, e.g. 'oom') grid point; fsync'd before returning."""
        rec = {"key": key, "status": status, "detail": detail,
               "time": dt.datetime.now(dt.timezone.utc).isoformat()}
        file = self.path / PROGRESS_FILE
        with open(file, "a+b") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() > 0:  # repair a torn last line so this record starts on its own line
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    f.write(b"\n")
            f.write((json.dumps(rec, sort_keys=True) + "\n").encode())
            f.flush()
            if self.durable:
                os.fsync(f.fileno())

    # ------------------------------------------------------------------ finalize
    def finalize(self) -> TraceSet:
        """Concatenate the parts into latency.parquet / acceptance.parquet, record their hashes
        in meta.json, and return the validated set. Idempotent; safe to re-run after a crash."""
        included: dict[str, list[str]] = {}
        merged: dict[str, pa.Table] = {}
        for name, table_name in TABLE_OF_FILE.items():
            parts = part_files(self.path, table_name)
            tables = [validate_file_table(name, read_parquet(p), p, self.weights_kind)
                      for p in parts]
            merged[name] = pa.concat_tables(tables) if tables else SCHEMAS[name].empty_table()
            included[table_name] = [p.name for p in parts]
        # before any file is replaced: a refused finalize leaves the directory as it was
        check_row_claims(self.meta, merged[LATENCY_FILE].num_rows,
                         merged[ACCEPTANCE_FILE].num_rows, self.path)
        for name, table in merged.items():
            _write_parquet_atomic(self.path / name, table, self.durable)
        self.meta = {**self.meta, "content_hash": content_hash(self.path), "parts": included}
        write_json(self.path / META_FILE, self.meta, durable=self.durable)
        return load_trace_set(self.path)


def finalize_trace_set(path: str | Path) -> TraceSet:
    """Finalize an existing (possibly interrupted) trace-set directory from its parts."""
    root = Path(path)
    meta = read_meta(root, require_hash=False)
    return TraceSetWriter(root, meta).finalize()
