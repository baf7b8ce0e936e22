"""A scenario and the engine run it becomes refuse the same bad fields the same way: one check
(`engine_config.check_run_fields`) serves `validate_scenario` and `EngineConfig.validate`."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vegas_sim.errors import UserInputError
from vegas_sim.models import get_preset
from vegas_sim.sim.predict import Scenario, engine_config
from vegas_sim.sim.scenario import validate_scenario

GOOD = Scenario("vegas", 4, 0.07, batch=4, context=4096, output_len=64)


@pytest.mark.parametrize(("field", "value", "where"), [
    ("gamma", 0, "--gamma"), ("batch", 0, "--batch"), ("requests", 0, "--requests"),
    ("prefill", "remote", "--prefill"), ("kv_block_size", 0, "--kv-block-size"),
    ("prefill_gpus", 0, "--prefill-gpus"),
])
def test_scenario_and_engine_refuse_a_field_alike(field: str, value: object, where: str) -> None:
    bad = replace(GOOD, **{field: value})
    with pytest.raises(UserInputError) as as_scenario:
        validate_scenario(bad, get_preset("qwen3-8b"), None)
    with pytest.raises(UserInputError) as as_engine:
        engine_config(bad, None).validate()
    assert as_scenario.value.where == as_engine.value.where == where
    assert str(as_scenario.value) == str(as_engine.value)


def test_a_good_scenario_passes_both() -> None:
    validate_scenario(GOOD, get_preset("qwen3-8b"), None)
    engine_config(GOOD, None).validate()
