"""Shared fixtures: a small valid synthetic trace set, copied fresh for each test."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vegas_sim.files import sha256_file
from vegas_sim.traces.synthetic import make_synthetic_trace_set

SMALL_GRID: dict[str, Any] = {
    "methods": ("vanilla", "vegas", "magicdec-quest"), "gammas": (2, 4), "sparsities": (0.05, 0.1),
    "contexts": (1024, 4096), "batches": (1, 4), "requests": 2, "iterations": 4,
}


@pytest.fixture(scope="session")
def template_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "small-set"
    make_synthetic_trace_set(path, seed=1, **SMALL_GRID)
    return path


@pytest.fixture
def small_set(template_set: Path, tmp_path: Path) -> Path:
    """A fresh, valid, finalized copy of the template set (safe to mutate)."""
    dst = tmp_path / "set"
    shutil.copytree(template_set, dst)
    return dst


def rewrite_table(path: Path, file: str, table: pa.Table, *, rehash: bool = True) -> None:
    """Replace a data file; with `rehash`, update meta.json's content hash so that only the
    mutation (not the hash) can make loading fail."""
    pq.write_table(table, path / file)
    if rehash:
        rehash_meta(path, file)


def rehash_meta(path: Path, file: str) -> None:
    meta = json.loads((path / "meta.json").read_text())
    meta["content_hash"][file] = sha256_file(path / file)
    (path / "meta.json").write_text(json.dumps(meta))


def edit_meta(path: Path, edit: object) -> None:
    meta = json.loads((path / "meta.json").read_text())
    edit(meta)  # type: ignore[operator]
    (path / "meta.json").write_text(json.dumps(meta))
