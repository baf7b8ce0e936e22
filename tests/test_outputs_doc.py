"""docs/OUTPUTS.md lists every column predict, sweep and tune write."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.sim.test_sweep import Models, synthetic_models
from vegas_sim.sim.predict import Scenario, predict
from vegas_sim.sim.tune import TuneConfig, tune
from vegas_sim.sim.workload import Arrivals

DOC = Path(__file__).resolve().parents[1] / "docs" / "OUTPUTS.md"


def documented() -> set[str]:
    """Column names in the first cell of the doc's table rows (`a, b`, `x_p50/p90/p99`)."""
    names: set[str] = set()
    for line in DOC.read_text().splitlines():
        if not line.startswith("| ") or line.startswith("|---"):
            continue
        for item in line.split("|")[1].split(","):
            item = item.strip().strip("`")
            head, *alts = item.split("/")
            names.add(head)
            stem = re.sub(r"[a-z]*\d+$", "", head)
            names.update(stem + alt for alt in alts)
    return names


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    return synthetic_models(tmp_path_factory.mktemp("outputs") / "ts")


def test_every_predict_column_is_documented(models: Models) -> None:
    scen = [Scenario("vegas", 4, 0.05, batch=2, context=4096, output_len=32),
            Scenario("vegas", 4, 0.05, batch=2, context=4096, output_len=32,
                     arrival=Arrivals.parse("poisson:5"), requests=20, slo_ttft_ms=500.0)]
    cols = set(predict(scen[:1], *models, engine="analytic").columns)
    cols |= set(predict(scen[1:], *models, engine="sim", replications=1).columns)
    missing = sorted(cols - documented())
    assert not missing, f"docs/OUTPUTS.md lacks predict columns {missing}"


def test_every_tune_cell_column_is_documented(models: Models) -> None:
    cfg = TuneConfig(sparsity_coarse=(0.03, 0.07), gamma=(2, 4), probe_gamma=4,
                     refine_step=0.02, baselines=("magicdec-stream",), baseline_gamma=(2,),
                     output_len=32)
    res = tune([(2, 4096)], *models, config=cfg, workers=1)
    missing = sorted(set(res.cells.columns) - documented())
    assert not missing, f"docs/OUTPUTS.md lacks tune columns {missing}"
