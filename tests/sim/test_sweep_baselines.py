"""A sweep's chunks share the vanilla baselines its drafting rows run: one baseline run per
setting, whatever the chunk size, and the same rows."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.sim.test_sweep import Models, strip, synthetic_models
from vegas_sim.sim import predict as predict_module
from vegas_sim.sim.predict import Scenario
from vegas_sim.sim.sweep import SweepRunner


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    return synthetic_models(tmp_path_factory.mktemp("baselines") / "ts")


def test_chunks_share_the_vanilla_baseline(models: Models,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    runs = predict_module._runs
    vanilla: list[int] = []

    def counting(sc: Scenario, *a: object, **k: object) -> object:
        if sc.method == "vanilla":
            vanilla.append(sc.batch)
        return runs(sc, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(predict_module, "_runs", counting)
    scen = [Scenario(m, g, 0.07, 4, 4096, 64) for m in ("vegas", "magicdec-stream")
            for g in (2, 4)] + [Scenario("vanilla", 1, 1.0, 4, 4096, 64)]
    frames = {}
    for size in (1, len(scen)):
        vanilla.clear()
        with SweepRunner(*models, workers=1) as runner:
            frames[size] = runner.run(scen, engine="sim", replications=2, chunk_size=size)
            again = runner.run(scen[:1], engine="sim", replications=2)
        # the drafting rows' baseline once, for every chunk and the later run, and the
        # vanilla scenario's own runs (from the seeds' first streams, as in one chunk)
        assert vanilla == [4, 4]
        assert again.iloc[0]["speedup_vs_vanilla"] == frames[size].iloc[0]["speedup_vs_vanilla"]
    pd.testing.assert_frame_equal(strip(frames[1]), strip(frames[len(scen)]))
