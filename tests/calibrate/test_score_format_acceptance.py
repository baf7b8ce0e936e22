"""benchmarks/score_format_acceptance.py off the GPU: its paired statistics and cell order
(the decoding itself is the calibration's acceptance loop, tested elsewhere)."""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "score_format_acceptance", ROOT / "benchmarks/score_format_acceptance.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["score_format_acceptance"] = mod
    spec.loader.exec_module(mod)
    return mod


def frame(accepted: list[list[int]]) -> pd.DataFrame:
    return pd.DataFrame([{"request": r, "iteration": i, "accepted": a}
                         for r, its in enumerate(accepted) for i, a in enumerate(its)])


def test_paired_stats_by_request_and_iteration() -> None:
    mod = load_script()
    a = frame([[2, 3, 4], [1, 1, 1]])
    b = frame([[2, 3, 5], [1, 0, 1]])
    st = mod.paired_stats(a, b)
    assert st["requests"] == 2 and st["iterations"] == 6
    assert st["accepted_bf16"] == pytest.approx(2.0) and st["accepted_fp8"] == pytest.approx(2.0)
    assert st["diff"] == pytest.approx(0.0)
    assert st["identical_share"] == pytest.approx(4 / 6)
    # clustered by request: request means +1/3 and -1/3 -> SE = std([1/3, -1/3]) / sqrt(2)
    assert st["diff_se"] == pytest.approx(math.sqrt(2 / 9) / math.sqrt(2))
    # rows pair on (request, iteration), not on position
    st2 = mod.paired_stats(a, b.iloc[::-1])
    assert st2["identical_share"] == pytest.approx(4 / 6)
    with pytest.raises(ValueError):
        mod.paired_stats(a, frame([]).reindex(columns=["request", "iteration", "accepted"]))


def test_cells_keep_every_workload_and_method_of_the_first_gamma_first() -> None:
    mod = load_script()
    args = argparse.Namespace(gamma=[12, 4], temperatures=[0.0, 0.6],
                              workloads=["longdoc", "reasoning"], methods=["vegas", "vegas-all"])
    got = list(mod.cells(args))
    assert len(got) == 16
    assert {(m, w) for m, g, t, w in got[:4]} == {
        (m, w) for m in args.methods for w in args.workloads}
    assert all(g == 12 and t == 0.0 for _m, g, t, _w in got[:4])
    assert all(g == 4 for _m, g, _t, _w in got[8:])


def test_help_runs_without_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    mod = load_script()
    with pytest.raises(SystemExit) as e:
        mod.main(["--help"])
    assert e.value.code == 0
    assert "--budget-s" in capsys.readouterr().out
