"""Read, write and validate trace sets (STUB: the traces helper replaces the bodies)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd


@dataclass
class TraceSet:
    path: Path
    meta: dict[str, Any]
    latency: pd.DataFrame  # columns of schema.LATENCY_SCHEMA
    acceptance: pd.DataFrame  # columns of schema.ACCEPTANCE_SCHEMA (may be empty)

    @property
    def weights_kind(self) -> str:
        """'real' or 'random'."""
        return str(self.meta["model"]["weights"]["kind"])


def load_trace_set(path: str | Path) -> TraceSet:
    """Read and fully validate a trace set; raises TraceSetError naming file, column and fix."""
    raise NotImplementedError


class TraceSetWriter:
    """Creates or resumes a trace set directory; appends rows atomically per grid point."""

    def __init__(self, path: str | Path, meta: dict[str, Any]) -> None:
        raise NotImplementedError

    def append_latency(self, rows: pd.DataFrame) -> None:
        raise NotImplementedError

    def append_acceptance(self, rows: pd.DataFrame) -> None:
        raise NotImplementedError

    def done_points(self) -> set[str]:
        """Keys of grid points already recorded (for resume)."""
        raise NotImplementedError

    def mark_done(self, key: str, status: str = "ok", detail: str = "") -> None:
        """Record a finished (or skipped, e.g. 'oom') grid point."""
        raise NotImplementedError
