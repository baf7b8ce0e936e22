"""fitcache: a fitted model is reused only for the same data, meta and code, only from the
user's own folder, only when its HMAC checks; the folder is bounded."""

from __future__ import annotations

import ast
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


def _ast_imports(source: str) -> set[str]:
    """What an AST walk finds: the reference the key's line scan must match."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return {n for n in names if n.split(".")[0] == "vegas_sim"}


@pytest.mark.parametrize("path", sorted(Path(fitcache.__file__).parent.rglob("*.py")),
                         ids=lambda p: str(p.relative_to(Path(fitcache.__file__).parent)))
def test_the_key_finds_every_import_the_ast_finds(path: Path) -> None:
    """The key's import scan (a regex, for speed) sees every vegas_sim import of every module
    of the package, so no module a fit reads is left out of its key."""
    source = path.read_text(encoding="utf-8")
    assert fitcache._imported_names(source) >= _ast_imports(source)


def test_the_import_scan_reads_parentheses_comments_and_continuations() -> None:
    source = ("from vegas_sim.sim import (  # a comment\n    latency,  # its own\n"
              "    acceptance as acc,\n)\nimport vegas_sim.gpus as g, os\n"
              "from vegas_sim.models import \\\n    ModelSpec\ndef f():\n    from vegas_sim import grids\n")
    assert fitcache._imported_names(source) == _ast_imports(source) == {
        "vegas_sim.sim", "vegas_sim.sim.latency", "vegas_sim.sim.acceptance", "vegas_sim.gpus",
        "vegas_sim.models", "vegas_sim.models.ModelSpec", "vegas_sim", "vegas_sim.grids"}


def test_arrays_read_back_equal_and_writable_and_a_flipped_byte_misses(cache: Path) -> None:
    """Arrays travel out of band (not copied on reading); every byte is still signed."""
    key = fitcache.cache_key("latency", META, "latency.parquet", (fitcache,))
    value = {"a": np.arange(50_000, dtype=np.float64), "b": np.ones((3, 4), np.int64)}
    fitcache.cached(key, lambda: value)
    got = fitcache.cached(key, lambda: pytest.fail("a hit must not fit"))
    np.testing.assert_array_equal(got["a"], value["a"])
    assert got["b"].dtype == np.int64 and got["b"].shape == (3, 4)
    got["a"][0] = 7.0  # writable, as an unpickled array is; the file is not changed
    (entry,) = _entries(cache)
    blob = bytearray(entry.read_bytes())
    blob[-100] ^= 1  # inside the first array's bytes, after the pickle
    entry.write_bytes(bytes(blob))
    assert fitcache.cached(key, lambda: "refitted") == "refitted"


def test_a_traced_cell_reads_back_with_its_own_dtypes() -> None:
    """Narrowed for the cache (float32 / small ints where exact), widened on first use."""
    from vegas_sim.sim.acceptance_dist import TracedCell

    rng = np.random.default_rng(0)
    prob = rng.random((40, 3)).astype(np.float32).astype(np.float64)  # float32 values
    cell = TracedCell(3, 0.05, 1024.0, rng.integers(0, 4, 40), prob, np.zeros(40, np.int64),
                      np.full(40, 40), 1000, 1100, np.arange(40) * 100_000)
    back = pickle.loads(pickle.dumps(cell, protocol=5))
    assert len(pickle.dumps(cell, protocol=5)) < len(pickle.dumps(prob)) + 40 * 8
    for name in ("acc", "prob", "run_start", "run_len", "gen"):
        want, got = getattr(cell, name), getattr(back, name)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    assert (back.gamma, back.ctx_min, back.ctx_max) == (3, 1000, 1100)
    exact = rng.random((5, 2))  # float64 values float32 cannot hold: kept as they are
    cell2 = TracedCell(2, 0.1, 1.0, np.zeros(5, np.int64), exact, np.zeros(5, np.int64),
                       np.full(5, 5), 1, 5, np.arange(5))
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(cell2)).prob, exact)


def test_the_t_quantile_is_scipys(cache: Path) -> None:
    from scipy.special import stdtrit

    from vegas_sim.sim import metrics

    metrics.t_quantile.cache_clear()
    for dof in (1, 4, 19):
        assert metrics.t_quantile(dof, 0.975) == float(stdtrit(dof, 0.975))
    metrics.t_quantile.cache_clear()
    assert metrics.t_quantile(4, 0.975) == float(stdtrit(4, 0.975))  # read back from the cache
