"""tune runs a configuration once per engine: a later step that evaluates it again (the final
ranking of a KV-bound cell re-runs step 4's points) reuses its row."""

from __future__ import annotations

from typing import Any

import pandas as pd

from vegas_sim.sim.predict import Scenario
from vegas_sim.sim.tune import _Steps
from vegas_sim.sim.tune_result import TuneConfig
from vegas_sim.sim.tune_rules import Evidence


class CountingRunner:
    """Rows of throughput γ × 100 + batch; counts the scenarios it was asked to run."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, int, str]] = []

    def run(self, scenarios: list[Scenario], *, engine: str, progress: Any = None,
            **_: Any) -> pd.DataFrame:
        self.ran += [(sc.method, sc.gamma, engine) for sc in scenarios]
        if progress is not None:
            progress(len(scenarios), len(scenarios))
        return pd.DataFrame([{"method": sc.method, "gamma": sc.gamma, "sparsity": sc.sparsity,
                              "batch": sc.batch, "context": sc.context, "engine": engine,
                              "throughput_tok_s": 100.0 * sc.gamma + sc.batch,
                              "pi_low": 90.0 * sc.gamma, "pi_high": 110.0 * sc.gamma}
                             for sc in scenarios])


def test_a_configuration_is_run_once_per_engine() -> None:
    runner = CountingRunner()
    progress: list[tuple[str, int, int]] = []
    steps = _Steps(runner, TuneConfig(), 0, lambda *a: progress.append(a),  # type: ignore[arg-type]
                   Evidence({"vegas": (12, 0.01, 0.2)}))
    a, b, c = (Scenario("vegas", g, 0.07, 4, 4096, 128) for g in (3, 5, 7))
    first = steps.run("4-serving", [a, b], "sim")
    again = steps.run("final", [b, c, b], "sim")  # b twice: run once, both rows
    other = steps.run("final", [b], "analytic")  # another engine: run again
    assert runner.ran == [("vegas", 3, "sim"), ("vegas", 5, "sim"), ("vegas", 7, "sim"),
                          ("vegas", 5, "analytic")]
    assert list(again["gamma"]) == [5, 7, 5] and set(again["step"]) == {"final"}
    assert again.iloc[0]["throughput_tok_s"] == first.iloc[1]["throughput_tok_s"]
    assert list(other["engine"]) == ["analytic"]
    assert progress[1] == ("final", 3, 3)  # the reused row counted as done
    assert len(steps.rows) == 3
