"""An on-disk cache of fitted models, so that `predict` does not refit a trace set it has seen.

Fitting the latency model of a measured set takes ~1 s (a robust least-squares fit per
phase × method, several starts each) and the acceptance model ~2.5 s (the packaged 492K-row
set; its cells are smoothed), against ~0.1 s for the simulation itself. The fit is a pure
function of the trace set's data files (their sha256 in meta.json 'content_hash'), of its
model / GPU meta, and of the code that fits, so the key is a hash of all three; any change
of data or code misses the cache. Writes are atomic; a cache that cannot be read or written
is skipped silently (it is only a speed-up).

Where: $VEGAS_SIM_CACHE_DIR, else $XDG_CACHE_HOME/vegas-sim, else ~/.cache/vegas-sim.
VEGAS_SIM_CACHE=0 turns it off.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def cache_dir() -> Path | None:
    """The cache folder, or None when caching is off."""
    if os.environ.get("VEGAS_SIM_CACHE", "1") == "0":
        return None
    if os.environ.get("VEGAS_SIM_CACHE_DIR"):
        return Path(os.environ["VEGAS_SIM_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vegas-sim"


def _code_hash(modules: tuple[Any, ...]) -> str:
    h = hashlib.sha256()
    for module in modules:
        h.update(Path(module.__file__).read_bytes())
    return h.hexdigest()


def cache_key(kind: str, meta: dict[str, Any], data_file: str, code: tuple[Any, ...]) -> str | None:
    """Key of a model fitted from `data_file` of a trace set with `meta`; None when the set
    has no content hash (an in-memory set): such fits are not cached."""
    content = meta.get("content_hash", {}).get(data_file)
    if not content:
        return None
    ident = {"kind": kind, "data": content, "model": meta.get("model"), "gpu": meta.get("gpu"),
             "code": _code_hash(code)}
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()


def cached(key: str | None, build: Callable[[], T]) -> T:
    """build(), or its pickled result stored under `key` by an earlier call."""
    folder = cache_dir()
    if key is None or folder is None:
        return build()
    path = folder / f"{key[:32]}.pkl"
    try:
        with open(path, "rb") as f:
            return pickle.load(f)  # type: ignore[no-any-return]
    except Exception:  # noqa: BLE001, S110 - missing, stale or unreadable: fit again
        pass
    value = build()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except Exception:  # noqa: BLE001, S110 - a read-only home or full disk loses the speed-up
        pass
    return value
