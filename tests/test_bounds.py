"""Every numeric input bounded where it is parsed (vegas_sim/bounds.py): arbitrary values
through the CLI and the API end in a clear error (exit != 0, the option named, no traceback)
or a finite, bounded result; never a numpy ValueError, a NaN or a run that eats the memory."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vegas_sim import api
from vegas_sim.bounds import BOUNDS, MAX_GAMMA, check_simulated_requests
from vegas_sim.cli import cli
from vegas_sim.errors import UserInputError
from vegas_sim.gpus import load_gpu_spec
from vegas_sim.grids import parse_int_grid

NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1, 32, 33, 300, 10**9, 1e300, -1e300, 1e-300]),
)
SLOW = settings(max_examples=12, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@given(name=st.sampled_from(sorted(BOUNDS)), value=NUMBERS)
@settings(max_examples=300, deadline=None)
def test_a_bound_passes_a_value_in_its_range_or_names_the_option(name: str, value: Any) -> None:
    bound = BOUNDS[name]
    try:
        out = bound.check(value)
    except UserInputError as e:
        assert bound.option in str(e) and e.fix
        return
    assert math.isfinite(out) and bound.lo <= out <= bound.hi
    assert not bound.integer or float(out).is_integer()


def _cli_predict(option: str, value: Any) -> Any:
    args = ["predict", "--engine", "analytic", "--context", "4K", "--output-len", "64",
            "--batch", "2", "--gamma", "4", "--format", "json"]
    return CliRunner().invoke(cli, [*args, option, str(value)])


@pytest.mark.parametrize("option", ["--gamma", "--batch", "--seed", "--temperature",
                                    "--gpu-memory-utilization", "--kv-block-size"])
@given(value=st.one_of(st.integers(min_value=-(2**40), max_value=2**40),
                       st.sampled_from([0, -1, 33, 300, 100000, 10**8, 10**9])))
@SLOW
def test_cli_predict_with_any_number_errors_clearly_or_predicts_finite(option: str,
                                                                       value: int) -> None:
    result = _cli_predict(option, value)
    assert not isinstance(result.exception, Exception) or isinstance(result.exception,
                                                                     SystemExit)
    assert "Traceback" not in result.output
    if result.exit_code != 0:
        assert "Error" in result.output and ("fix:" in result.output
                                             or "Invalid value" in result.output)
        return
    rows = json.loads(result.stdout)["rows"]
    for row in rows:
        tps = row["throughput_tok_s"]
        assert math.isfinite(tps) and tps >= 0
        assert 1.0 <= row["acceptance_length"] <= row["gamma"] + 1 + 1e-9


@given(gamma=st.integers(min_value=-(2**40), max_value=2**40),
       seed=st.integers(min_value=-(2**70), max_value=2**70))
@SLOW
def test_api_predict_with_any_gamma_and_seed_errors_clearly_or_predicts(gamma: int,
                                                                       seed: int) -> None:
    try:
        table = api.predict(gamma=gamma, seed=seed, context="4K", output_len=64, batch=2,
                            engine="analytic")
    except UserInputError as e:
        assert e.where in ("--gamma", "--seed", "gamma", "seed")
        return
    assert 1 <= gamma <= MAX_GAMMA and 0 <= seed
    assert table["throughput_tok_s"].between(0, math.inf).all()


@given(field=st.sampled_from(["memory_gb", "hbm_bandwidth_gbs", "bf16_tflops"]),
       value=NUMBERS)
@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_gpu_spec_with_any_field_is_refused_or_plausible(tmp_path: Path, field: str,
                                                           value: Any) -> None:
    spec = {"name": "what-if", "memory_gb": 80, "hbm_bandwidth_gbs": 3350, "bf16_tflops": 989}
    spec[field] = value
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(spec))  # NaN/Infinity as Python's json writes them
    try:
        gpu = load_gpu_spec(path)
    except UserInputError as e:
        assert field in str(e)
        return
    assert 1 <= gpu.memory_gb <= 1024 and math.isfinite(gpu.bandwidth_gbs)


def test_a_huge_range_is_refused_before_it_is_built() -> None:
    with pytest.raises(UserInputError, match="more than 100000 values"):
        parse_int_grid("1..1000000000", "--gamma")
    assert len(parse_int_grid("1..1M:x2", "--context")) == 21  # a geometric range is cheap


def test_too_many_simulated_requests_are_refused_with_the_memory_they_would_need() -> None:
    check_simulated_requests(1000, 1024, explicit=True)
    with pytest.raises(UserInputError, match=r"GB of memory") as e:
        check_simulated_requests(50_000, 19_680, explicit=False)
    assert e.value.where == "--batch"


def test_mxfp4_on_a_dense_model_is_refused_not_noted_as_applied() -> None:
    with pytest.raises(UserInputError, match="dense") as e:
        api.predict(model="qwen3-8b", weight_format="mxfp4", engine="analytic")
    assert e.value.where == "--weight-format" and "fp8" in e.value.fix


@pytest.mark.parametrize("field", ["memory_gb", "hbm_bandwidth_gbs", "copy_bandwidth_gbs",
                                   "bf16_tflops", "link_bandwidth_gbs", "allreduce_latency_us"])
@pytest.mark.parametrize("value", [1e-300, 1e300])
def test_every_gpu_spec_field_at_1e_minus_300_is_refused_by_predict(
        field: str, value: float, tmp_path: Path) -> None:
    """The issue's case: GPU-spec values of 1e-300 gave NaN/inf tables with exit 0."""
    spec = {"name": "what-if", "memory_gb": 80, "hbm_bandwidth_gbs": 3350, "bf16_tflops": 989,
            field: value}
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(spec))
    result = CliRunner().invoke(cli, ["predict", "--engine", "analytic", "--gpu-spec",
                                      str(path)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert f"--gpu-spec {path}: {field}" in result.output and "fix:" in result.output
