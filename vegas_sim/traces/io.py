"""The trace-set API in one import: read (`load_trace_set`, `check`), write
(`TraceSetWriter`, `finalize_trace_set`), find (`trace_set_dir`, `packaged_sets`) and
summarize (`summarize`, `format_summary`) a trace set.

The code lives in `reader`, `writer`, `lookup`, `summary` and `validation`; this module only
names what callers use. Layout of a trace-set directory::

    meta.json            schema_version, model, gpu, software, date, grid, workload, seeds,
                         content_hash {file: sha256}, parts {table: [part file names]}
    latency.parquet      consolidated rows (schema.LATENCY_SCHEMA)
    acceptance.parquet   consolidated rows (schema.ACCEPTANCE_SCHEMA), may hold 0 rows
    parts/               one parquet file per appended chunk (the source of truth while writing)
    progress.jsonl       one JSON line per finished / skipped grid point (resume)
"""

from __future__ import annotations

from vegas_sim.files import sha256_file
from vegas_sim.traces.lookup import (
    PACKAGED_DIR,
    is_bare_name,
    packaged_sets,
    trace_set_dir,
)
from vegas_sim.traces.reader import (
    FILE_OF_TABLE,
    PARTS_DIR,
    PROGRESS_FILE,
    TABLE_OF_FILE,
    TraceSet,
    check,
    finalize_command,
    load_trace_set,
    part_files,
    read_meta,
    read_parquet,
    require_real_acceptance,
    unfinalized_parts,
)
from vegas_sim.traces.schema import LATENCY_METHODS
from vegas_sim.traces.summary import (
    acceptance_summary,
    format_summary,
    summarize,
)
from vegas_sim.traces.validation import (
    FIX_RECALIBRATE,
    GPU_NUMBERS,
    conform_table,
    content_hash,
    table_from_frame,
    to_pandas,
    validate_acceptance,
    validate_file_table,
    validate_latency,
    validate_meta,
)
from vegas_sim.traces.writer import (
    TraceSetWriter,
    finalize_trace_set,
)

__all__ = [
    "FILE_OF_TABLE",
    "FIX_RECALIBRATE",
    "GPU_NUMBERS",
    "LATENCY_METHODS",
    "PACKAGED_DIR",
    "PARTS_DIR",
    "PROGRESS_FILE",
    "TABLE_OF_FILE",
    "TraceSet",
    "TraceSetWriter",
    "acceptance_summary",
    "check",
    "conform_table",
    "content_hash",
    "finalize_command",
    "finalize_trace_set",
    "format_summary",
    "is_bare_name",
    "load_trace_set",
    "packaged_sets",
    "part_files",
    "read_meta",
    "read_parquet",
    "require_real_acceptance",
    "sha256_file",
    "summarize",
    "table_from_frame",
    "to_pandas",
    "trace_set_dir",
    "unfinalized_parts",
    "validate_acceptance",
    "validate_file_table",
    "validate_latency",
    "validate_meta",
]
