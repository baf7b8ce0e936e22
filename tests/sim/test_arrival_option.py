"""--arrival is parsed once, where the options come in (`options.scenario_extra`, which every
API function calls): scenarios carry an `Arrivals`, and its text comes back only where it is
written out (rows, tune's strategy, a sweep's checkpoint key)."""

from __future__ import annotations

import pandas as pd
import pytest

from vegas_sim.errors import UserInputError
from vegas_sim.runs import run_key
from vegas_sim.sim.options import option_texts, scenario_extra
from vegas_sim.sim.scenario import Scenario
from vegas_sim.sim.sweep import SweepGrid
from vegas_sim.sim.tune_result import TuneConfig
from vegas_sim.sim.workload import Arrivals


@pytest.mark.parametrize("command", ["predict", "sweep", "tune"])
def test_the_arrival_text_becomes_an_arrivals_value(command: str) -> None:
    extra = scenario_extra(command, {"arrival": "poisson:0.50", "temperature": 0.6})
    assert extra["arrival"] == Arrivals("poisson", rate_per_s=0.5, text="poisson:0.50")
    assert extra["temperature"] == 0.6
    assert option_texts(extra) == {"arrival": "poisson:0.50", "temperature": 0.6}


def test_the_default_arrival_stays_out_of_a_grid() -> None:
    """A grid with the default arrival keeps the identity (and checkpoint) it had."""
    assert scenario_extra("sweep", {"arrival": "closed"}) == {}
    assert scenario_extra("sweep", {"arrival": Arrivals()}) == {}
    assert Scenario("vegas", 7, 0.07, 4, 4096, 256).arrival == Arrivals.parse("closed")


def test_a_bad_arrival_text_is_refused_with_its_fix() -> None:
    for bad in ("poisson:x", "poisson", "closed:two", "uniform:3"):
        with pytest.raises(UserInputError, match="cannot parse arrival") as err:
            scenario_extra("predict", {"arrival": bad})
        assert err.value.where == "--arrival" and "poisson:<rate" in (err.value.fix or "")


def test_an_arrivals_value_passes_through_and_prints_its_text() -> None:
    given = Arrivals.trace([0.0, 1.0])
    assert scenario_extra("predict", {"arrival": given})["arrival"] is given
    assert given.text == "trace"
    assert Arrivals("closed", users=3).text == "closed:3"
    assert Arrivals("poisson", rate_per_s=2.0).text == "poisson:2"


def test_written_out_configurations_hold_the_text() -> None:
    extra = scenario_extra("tune", {"arrival": "closed:8"})
    config = TuneConfig(extra=extra)
    assert config.extra["arrival"].users == 8
    grid = SweepGrid(extra=scenario_extra("sweep", {"arrival": "closed:8"}))
    assert {sc.arrival.users for sc in grid.scenarios()} == {8}
    assert option_texts(grid.extra) == {"arrival": "closed:8"}


def test_a_sweep_checkpoint_key_is_the_one_of_the_arrival_text() -> None:
    """The key hashes the grid as its options read, so a run stopped before arrivals were
    parsed at the options resumes."""
    rows = pd.DataFrame({"throughput_tok_s": [1.0]})
    parsed = SweepGrid(extra=scenario_extra("sweep", {"arrival": "closed:8"}))
    as_text = SweepGrid(extra={"arrival": "closed:8"})
    other = SweepGrid(extra=scenario_extra("sweep", {"arrival": "closed:9"}))
    keys = [run_key(g, rows, engine="analytic", seed=0, replications=5)
            for g in (parsed, as_text, other)]
    assert keys[0] == keys[1] != keys[2]




def test_tune_strategy_writes_the_arrival_text() -> None:
    """The strategy section of the JSON `tune --out` writes holds the option text."""
    config = TuneConfig(extra=scenario_extra("tune", {"arrival": "closed:8"}))
    assert config.written()["extra"] == {"arrival": "closed:8"}
    assert config.written()["gamma"] == list(config.gamma)
