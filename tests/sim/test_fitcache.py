"""sim.fitcache: a fitted model is reused only for the same data, meta and code."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vegas_sim import api, fitcache
from vegas_sim.traces.io import load_trace_set

META = {"content_hash": {"latency.parquet": "abc"}, "model": {"name": "m"}, "gpu": {"name": "g"}}


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VEGAS_SIM_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("VEGAS_SIM_CACHE", raising=False)
    return tmp_path


def test_second_call_reads_the_cache(cache: Path) -> None:
    key = fitcache.cache_key("latency", META, "latency.parquet", (fitcache,))
    calls: list[int] = []

    def fit(value: int) -> dict[str, int]:
        calls.append(value)
        return {"fit": value}

    assert fitcache.cached(key, lambda: fit(1)) == {"fit": 1}
    assert fitcache.cached(key, lambda: fit(2)) == {"fit": 1}
    assert calls == [1]


def test_key_changes_with_data_meta_and_code() -> None:
    key = fitcache.cache_key("latency", META, "latency.parquet", (fitcache,))
    other_data = {**META, "content_hash": {"latency.parquet": "abd"}}
    other_gpu = {**META, "gpu": {"name": "h"}}
    assert fitcache.cache_key("latency", other_data, "latency.parquet", (fitcache,)) != key
    assert fitcache.cache_key("latency", other_gpu, "latency.parquet", (fitcache,)) != key
    assert fitcache.cache_key("latency", META, "latency.parquet", (fitcache, api)) != key
    assert fitcache.cache_key("latency", {"model": {}}, "latency.parquet", (fitcache,)) is None


def test_off_switch_and_corrupt_entry_refit(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = fitcache.cache_key("latency", META, "latency.parquet", (fitcache,))
    assert key is not None
    (cache / f"{key[:32]}.pkl").write_bytes(b"not a pickle")
    assert fitcache.cached(key, lambda: 7) == 7  # corrupt entry: fitted again, rewritten
    assert fitcache.cached(key, lambda: 8) == 7
    monkeypatch.setenv("VEGAS_SIM_CACHE", "0")
    assert fitcache.cached(key, lambda: 9) == 9


def test_cached_latency_model_predicts_like_a_fresh_fit(cache: Path) -> None:
    ts = load_trace_set(Path(api.__file__).parent / "traces" / "default" / "smollm2-135m-h200")
    first, second = api.fit_latency(ts), api.fit_latency(ts)
    assert list(cache.glob("*.pkl"))
    assert second is not first  # read back from disk
    kv = np.full(4, 2049)
    assert second.phase_ms("decode", "vanilla", 1, kv) == pytest.approx(
        first.phase_ms("decode", "vanilla", 1, kv))
