"""Verify attention's wide launch fills one wave, and the packaged latency sets still describe it.

`wide_config` takes the most splits that fit one wave of two programs per SM
(`splits_one_wave`), or the wave model's count where the heads alone exceed one wave
(`wide_splits`); the packaged latency sets were measured with the split count rounded to two
programs per SM. These tests pin that the two agree at every shape those sets' grids ran,
so their latency rows describe the launch the product runs; and that the one-wave count never
leaves a second, partial wave where the rounded one did.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vegas_sim.kernels import verify_launch as vl

SETS = Path(__file__).resolve().parents[2] / "vegas_sim" / "traces" / "default"
COLLECT_MODES = ("none", "first_last", "all")


def rounded_splits(n_heads: int, n_sms: int, per_sm: int) -> int:
    """The split count the packaged latency sets were measured with: ~per_sm programs per SM."""
    return max(1, round(per_sm * n_sms / n_heads))


def latency_grids() -> list[tuple[str, dict[str, Any]]]:
    """(set name, meta.json) of every packaged set that measured latency."""
    out = []
    for meta_path in sorted(SETS.glob("*/meta.json")):
        meta = json.loads(meta_path.read_text())
        if meta["grid"].get("latency"):
            out.append((meta_path.parent.name, meta))
    return out


def grid_calls(meta: dict[str, Any]) -> Iterator[tuple[int, int, int, int, int, int, str]]:
    """(batch, Hkv, n_query, G, max_len, SMs, collect) of every verify call shape the grid
    names: its batches × contexts (as listed, capped at the model's positions, and with the
    state headroom the runner adds) × query counts (verify_n_query, n_query, γ + 1) × modes."""
    grid, model = meta["grid"], meta["model"]
    hkv, group = int(model["n_kv_heads"]), int(model["n_heads"]) // int(model["n_kv_heads"])
    n_sms = int(meta["gpu"]["sm_count"])
    n_queries = {*grid["verify_n_query"], *grid["n_query"], *(g + 1 for g in grid["gamma"])}
    for context in grid["context"]:
        capped = min(int(context), int(model["max_positions"]) - 32)
        for max_len in {int(context), capped, int(context) + 2 * 15 + 2}:
            for batch in grid["batch"]:
                for n_query in sorted(n_queries):
                    for collect in COLLECT_MODES:
                        yield batch, hkv, n_query, group, max_len, n_sms, collect


GRIDS = latency_grids()


def test_the_packaged_latency_grids_are_found() -> None:
    names = {name for name, _ in GRIDS}
    assert {"qwen3-8b-h200", "smollm2-135m-h200", "gpt-oss-20b-h200",
            "qwen3-30b-a3b-h200"} <= names


@pytest.mark.parametrize(("name", "meta"), GRIDS, ids=[name for name, _ in GRIDS])
def test_launch_unchanged_at_every_calibrated_shape(
        name: str, meta: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    calls = list(grid_calls(meta))
    now = [vl.launch_config(*call) for call in calls]
    with monkeypatch.context() as m:
        m.setattr(vl, "wide_splits", lambda heads, max_len, sms: rounded_splits(heads, sms, 2))
        measured = [vl.launch_config(*call) for call in calls]
    changed = [(call, old, new) for call, old, new in zip(calls, measured, now) if old != new]
    assert not changed, f"{name}: launch differs from the measured one at {changed[:5]}"
    wide = sum(cfg.block_n == 32 and cfg.tma and cfg.num_stages == 4 for _, cfg in now)
    if name != "smollm2-135m-h200":  # its contexts (<= 7K) stay below WIDE_KEYS
        assert wide > 0, f"{name}: no grid shape on the wide launch; the test checks nothing"


def test_wide_launch_is_one_wave_with_every_sm_busy() -> None:
    n_sms = 132
    slots = vl.WIDE_PER_SM * n_sms
    for n_heads in range(1, slots + 1):
        programs = n_heads * vl.wide_config(n_heads, n_sms).splits
        assert slots // 2 < programs <= slots, n_heads
    # more heads than slots: the wave model over the slots. B 48 Hkv 8: 1 split is 384
    # programs, 1.45 waves; 2 splits fill 2.9. B 64 and 128 (grid batches): 1 split, 1.94 and
    # 3.88 waves, as measured
    assert [vl.wide_config(h, n_sms, 32768).splits for h in (384, 512, 1024)] == [2, 1, 1]
    for n_heads in (slots + 1, 300, 384, 456, 700, 2048):
        for max_len in (8192, 131072):
            splits = vl.wide_config(n_heads, n_sms, max_len).splits
            assert (vl.split_cost(n_heads, max_len, splits, vl.WIDE_BLOCK_N, slots)
                    <= vl.split_cost(n_heads, max_len, 1, vl.WIDE_BLOCK_N, slots))


def test_batches_where_the_rounded_count_left_a_second_wave() -> None:
    # Qwen3-8B (Hkv 8, G 4), vegas γ 6 (NQ 7, first_last: M 64), B 12, C 48K: the rounded
    # count ran 3 splits, 288 programs on 264 slots; one wave is 2 splits, 192 programs
    block_m, cfg = vl.launch_config(12, 8, 7, 4, 49152 + 64, 132, "first_last")
    assert block_m == 64 and cfg == vl.VerifyConfig(2, 32, 4, 4, tma=True)
    assert rounded_splits(96, 132, 2) == 3
    moved = [b for b in range(1, 65)
             if vl.wide_config(8 * b, 132, 32768).splits != rounded_splits(8 * b, 132, 2)]
    assert moved == [5, 6, 7, 9, 12, 13, 17, 18, 19, 20, 21, 22, *range(34, 63)]
