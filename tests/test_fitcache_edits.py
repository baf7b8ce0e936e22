"""A prediction from cached fits is the prediction from fresh fits after any edit of what the
fits read: a trace set's latency or acceptance rows (edited in a part, then finalized), a
meta.json field (the GPU's measured figures, the acceptance floor), done on disk the way a
user would. Each edit changes the prediction, so a stale cache entry could not pass."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from vegas_sim import api
from vegas_sim.traces.synthetic import make_synthetic_trace_set
from vegas_sim.traces.writer import finalize_trace_set

NOISE = ("wall_s",)


def _edit_part(kind: str, change: Callable[[pd.DataFrame], pd.DataFrame]) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        for part in sorted((path / "parts").glob(f"{kind}-*.parquet")):
            change(pd.read_parquet(part)).to_parquet(part, index=False)
        finalize_trace_set(path)
    return edit


def _edit_meta(change: Callable[[dict], None]) -> Callable[[Path], None]:  # type: ignore[type-arg]
    def edit(path: Path) -> None:
        meta = json.loads((path / "meta.json").read_text())
        change(meta)
        (path / "meta.json").write_text(json.dumps(meta, indent=2))
    return edit


def _slower(df: pd.DataFrame) -> pd.DataFrame:
    ms = [c for c in df.columns if c.startswith("ms_")]
    return df.assign(**{c: df[c] * 1.5 for c in ms})


def _fewer_accepted(df: pd.DataFrame) -> pd.DataFrame:
    return df.assign(accepted=(df["accepted"] // 2))


EDITS = {
    "latency rows": _edit_part("latency", _slower),
    "acceptance rows": _edit_part("acceptance", _fewer_accepted),
    "meta gpu.memory_gb": _edit_meta(lambda m: m["gpu"].update(memory_gb=24.0)),
    "meta grid.min_tokens": _edit_meta(lambda m: m["grid"].update(min_tokens=1000)),
}


def _predict(path: Path, cache: bool, monkeypatch: pytest.MonkeyPatch) -> pd.DataFrame:
    monkeypatch.setenv("VEGAS_SIM_CACHE", "1" if cache else "0")
    table = api.predict(methods=("vegas",), gamma=4, sparsity=0.05, batch=4, context=4096,
                        output_len=64, traces=path, acceptance_anchors=("none",),
                        engine="analytic")
    return table.drop(columns=[c for c in NOISE if c in table.columns])


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_a_cached_prediction_is_the_fresh_one_after_an_edit(
        edit: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VEGAS_SIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("VEGAS_SIM_CACHE_KEY", str(tmp_path / "key" / "cache.key"))
    path = tmp_path / "set"
    make_synthetic_trace_set(path, methods=("vanilla", "vegas"), gammas=(4,),
                             sparsities=(0.05,), contexts=(1024, 4096), batches=(1, 4),
                             requests=4, iterations=32)
    before = _predict(path, True, monkeypatch)
    assert any((tmp_path / "cache").iterdir())  # the fits are cached
    EDITS[edit](path)
    cached, fresh = _predict(path, True, monkeypatch), _predict(path, False, monkeypatch)
    pd.testing.assert_frame_equal(cached, fresh)
    assert not cached.equals(before), "the edit changed nothing: the test would prove nothing"
