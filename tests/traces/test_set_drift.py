"""benchmarks/set_drift.py: new / old latency of the grid rows two trace sets share."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGED = ROOT / "vegas_sim" / "traces" / "default" / "smollm2-135m-h200"


def load_set_drift() -> ModuleType:
    spec = importlib.util.spec_from_file_location("set_drift", ROOT / "benchmarks/set_drift.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ratios_match_rows_by_grid_keys_and_reduce_repeats() -> None:
    drift = load_set_drift()
    old = pd.read_parquet(PACKAGED / "latency.parquet")
    key_cols = drift.KEYS
    # the new set: every draft step 10 % faster, one grid point missing, rows shuffled
    new = old.sample(frac=1.0, random_state=0).copy()
    new.loc[new["phase"] == "draft_step", "ms_median"] *= 0.9
    dropped = new.iloc[0][key_cols]
    new = new[~(new[key_cols] == dropped).all(axis=1)]
    both = drift.ratios(old, new)
    assert len(both) == old.groupby(key_cols).ngroups - 1
    assert not (both[key_cols] == dropped).all(axis=1).any()
    by_phase = both.groupby("phase")["ratio"]
    assert by_phase.min()["draft_step"] == pytest.approx(0.9)
    assert by_phase.max()["draft_step"] == pytest.approx(0.9)
    assert by_phase.min()["verify"] == pytest.approx(1.0)


def test_latency_reads_a_folder_or_a_parquet() -> None:
    drift = load_set_drift()
    folder = drift.latency(PACKAGED)
    assert folder.equals(drift.latency(PACKAGED / "latency.parquet"))
