"""fitcache: a fitted model is reused only for the same data, meta and code, only from the
user's own folder, only when its HMAC checks; the folder is bounded."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vegas_sim import api, fitcache
from vegas_sim.traces.io import load_trace_set
from vegas_sim.traces.synthetic import make_synthetic_trace_set

META = {"content_hash": {"latency.parquet": "abc"}, "model": {"name": "m"}, "gpu": {"name": "g"},
        "grid": {"min_tokens": 32}}
ACCEPTANCE_CODE = (api.acceptance_module, api.acceptance_dist, api.context_trend,
                   api.sparsity_trend)
NOBODY = 65534
PACKAGED = Path(api.__file__).parent / "traces" / "default"


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("VEGAS_SIM_CACHE_DIR", str(folder))
    monkeypatch.setenv("VEGAS_SIM_CACHE_KEY", str(tmp_path / "config" / "cache.key"))
    monkeypatch.delenv("VEGAS_SIM_CACHE", raising=False)
    monkeypatch.delenv("VEGAS_SIM_CACHE_MAX_MB", raising=False)
    return folder


def _entries(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file())


def test_second_call_reads_the_cache(cache: Path) -> None:
    key = fitcache.cache_key("latency", META, "latency.parquet", (fitcache,))
    calls: list[int] = []

    def fit(value: int) -> dict[str, int]:
        calls.append(value)
        return {"fit": value}

    assert fitcache.cached(key, lambda: fit(1)) == {"fit": 1}
    assert fitcache.cached(key, lambda: fit(2)) == {"fit": 1}
    assert calls == [1]
    assert cache.stat().st_mode & 0o777 == 0o700
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in _entries(cache))


def test_key_changes_with_data_meta_and_code() -> None:
    key = fitcache.cache_key("latency", META, "latency.parquet", (fitcache,))
    other_data = {**META, "content_hash": {"latency.parquet": "abd"}}
    other_gpu = {**META, "gpu": {"name": "h"}}
    assert fitcache.cache_key("latency", other_data, "latency.parquet", (fitcache,)) != key
    assert fitcache.cache_key("latency", other_gpu, "latency.parquet", (fitcache,)) != key
    assert fitcache.cache_key("latency", META, "latency.parquet", (fitcache, api)) != key
    assert fitcache.cache_key("latency", {"model": {}}, "latency.parquet", (fitcache,)) is None


def test_key_covers_the_whole_meta_the_fit_reads() -> None:
    """grid.min_tokens is read by the acceptance fit: an edit of it (or of any meta field)
    must miss; a new hash of another table must not."""
    key = fitcache.cache_key("acceptance", META, "latency.parquet", ACCEPTANCE_CODE)
    edits: list[dict[str, Any]] = [
        {**META, "grid": {"min_tokens": 64}},
        {**META, "model": {"name": "m", "n_layers": 30}},
        {**META, "workload": ["chat"]},
    ]
    for edited in edits:
        assert fitcache.cache_key("acceptance", edited, "latency.parquet",
                                  ACCEPTANCE_CODE) != key, edited
    other_table = {**META, "content_hash": {"latency.parquet": "abc", "acceptance.parquet": "x"}}
    assert fitcache.cache_key("acceptance", other_table, "latency.parquet",
                              ACCEPTANCE_CODE) == key


@pytest.mark.parametrize("module", ["models.py", "methods.py", "gpus.py"])
def test_key_covers_every_module_the_fit_reads(module: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The latency fit reads models.py (the model's shape), methods.py (each method's phases)
    and gpus.py (the GPU's figures): an edit of any of them must refit."""
    meta = json.loads((PACKAGED / "smollm2-135m-h200" / "meta.json").read_text())
    before = fitcache.cache_key("latency", meta, "latency.parquet", api.LATENCY_CODE)
    read_bytes = Path.read_bytes

    def edited(self: Path) -> bytes:
        data = read_bytes(self)
        is_target = self.name == module and self.parent.name == "vegas_sim"
        return data + b"\n# an edit\n" if is_target else data

    monkeypatch.setattr(Path, "read_bytes", edited)
    fitcache._closure.cache_clear() if hasattr(fitcache, "_closure") else None
    after = fitcache.cache_key("latency", meta, "latency.parquet", api.LATENCY_CODE)
    assert after != before


def test_cached_fit_equals_a_fresh_one_after_an_edit_of_min_tokens(
        cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ts = make_synthetic_trace_set(tmp_path / "set", methods=("vanilla", "vegas"), gammas=(4,),
                                  sparsities=(0.05,), contexts=(1024,), batches=(1,),
                                  requests=2, iterations=8)
    ts.meta.setdefault("grid", {})["min_tokens"] = 32
    assert api.fit_acceptance(ts).min_tokens == 32
    ts.meta["grid"]["min_tokens"] = 256  # the set edited: the cached fit must not answer
    cached_fit = api.fit_acceptance(ts)
    monkeypatch.setenv("VEGAS_SIM_CACHE", "0")
    fresh = api.fit_acceptance(ts)
    assert cached_fit.min_tokens == fresh.min_tokens == 256


def test_off_switch_and_corrupt_entry_refit(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = fitcache.cache_key("latency", META, "latency.parquet", (fitcache,))
    assert key is not None
    assert fitcache.cached(key, lambda: 6) == 6
    for entry in _entries(cache):
        entry.write_bytes(b"not a pickle")
    assert fitcache.cached(key, lambda: 7) == 7  # corrupt entry: fitted again, rewritten
    assert fitcache.cached(key, lambda: 8) == 7
    monkeypatch.setenv("VEGAS_SIM_CACHE", "0")
    assert fitcache.cached(key, lambda: 9) == 9


class _Planted:
    """A pickle that, when loaded, creates `marker`: what an attacker's file would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def _plant(folder: Path, marker: Path) -> None:
    """Every entry of `folder` replaced by the attacker's pickle (same names)."""
    payload = pickle.dumps(_Planted(marker))
    for entry in _entries(folder):
        entry.write_bytes(payload)


def test_a_tampered_entry_is_never_unpickled(cache: Path, tmp_path: Path) -> None:
    key = fitcache.cache_key("latency", META, "latency.parquet", (fitcache,))
    assert fitcache.cached(key, lambda: {"fit": 1}) == {"fit": 1}
    marker = tmp_path / "planted-code-ran"
    _plant(cache, marker)
    assert fitcache.cached(key, lambda: {"fit": 2}) == {"fit": 2}
    assert not marker.exists()
    assert fitcache.cached(key, lambda: {"fit": 3}) == {"fit": 2}  # rewritten, signed


def _as_another_user(paths: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """`paths` owned by another user: chowned to nobody when running as root, else the
    process pretends to be another uid."""
    if os.geteuid() == 0:
        for p in paths:
            os.chown(p, NOBODY, NOBODY)
    else:
        uid = os.getuid() + 1
        monkeypatch.setattr(os, "getuid", lambda: uid)


def test_a_planted_file_of_another_user_is_never_unpickled(
        cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attack: a shared cache folder (0777, another user's), their pickle under the name
    the next fit reads."""
    key = fitcache.cache_key("latency", META, "latency.parquet", (fitcache,))
    assert fitcache.cached(key, lambda: {"fit": 1}) == {"fit": 1}
    marker = tmp_path / "planted-code-ran"
    _plant(cache, marker)
    os.chmod(cache, 0o777)
    for entry in _entries(cache):
        os.chmod(entry, 0o666)
    _as_another_user([cache, *_entries(cache)], monkeypatch)
    assert fitcache.cached(key, lambda: {"fit": 2}) == {"fit": 2}
    assert not marker.exists()


def test_an_entry_of_another_user_in_my_folder_is_refused(
        cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to another user")
    key = fitcache.cache_key("latency", META, "latency.parquet", (fitcache,))
    assert fitcache.cached(key, lambda: {"fit": 1}) == {"fit": 1}
    for entry in _entries(cache):
        os.chown(entry, NOBODY, NOBODY)
    assert fitcache.cached(key, lambda: {"fit": 2}) == {"fit": 2}


def test_the_folder_is_bounded_and_evicts_the_least_recently_used(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blob = np.zeros(2000, np.uint8)  # ~2.2 KB pickled
    keys = [fitcache.cache_key("latency", {**META, "n": i}, "latency.parquet", (fitcache,))
            for i in range(4)]
    monkeypatch.setenv("VEGAS_SIM_CACHE_MAX_MB", "0.005")  # room for two
    seen: set[Path] = set()
    for i, key in enumerate(keys):
        fitcache.cached(key, lambda: blob)
        for entry in set(_entries(cache)) - seen:  # the entry just written: i seconds old
            os.utime(entry, (1e9 + i, 1e9 + i))
            seen.add(entry)
    assert len(_entries(cache)) == 2
    assert sum(p.stat().st_size for p in _entries(cache)) <= 5000
    calls: list[int] = []

    def fit(i: int) -> np.ndarray:
        calls.append(i)
        return blob

    for i in (3, 2, 0, 1):
        fitcache.cached(keys[i], lambda i=i: fit(i))  # type: ignore[misc]
    assert calls == [0, 1]  # the two oldest were evicted, the newest two were kept


def test_a_value_that_cannot_be_stored_leaves_nothing_behind(cache: Path) -> None:
    key = fitcache.cache_key("latency", META, "latency.parquet", (fitcache,))
    value = {"f": lambda: 1}  # not picklable: the store fails part-way
    assert fitcache.cached(key, lambda: value) is value
    assert not cache.exists() or not _entries(cache)


def test_cached_latency_model_predicts_like_a_fresh_fit(cache: Path) -> None:
    ts = load_trace_set(PACKAGED / "smollm2-135m-h200")
    first, second = api.fit_latency(ts), api.fit_latency(ts)
    assert _entries(cache)
    assert second is not first  # read back from disk
    kv = np.full(4, 2049)
    assert second.phase_ms("decode", "vanilla", 1, kv) == pytest.approx(
        first.phase_ms("decode", "vanilla", 1, kv))
