"""Open-loop arrivals that no instance can see are refused where they are parsed: an infinite
or NaN Poisson rate, and arrival times that are NaN, infinite, negative or past MAX_ARRIVAL_S
(on fba85c4 poisson:inf was reported 'not saturated' and NaN times ran, both exit 0; inf and
1e300 times ended in a ZeroDivisionError traceback)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from vegas_sim.bounds import MAX_ARRIVAL_RATE, MAX_ARRIVAL_S
from vegas_sim.cli import cli
from vegas_sim.errors import UserInputError
from vegas_sim.sim.workload import Arrivals, read_arrival_trace

SIM = ["predict", "--engine", "sim", "--gamma", "4", "--batch", "1", "--context", "1K",
       "--output-len", "16", "--replications", "1"]


def _predict(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [*SIM, *args])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


@pytest.mark.parametrize("rate", ["inf", "Infinity", "nan", "1e300"])
def test_a_rate_no_instance_sees_is_refused(rate: str) -> None:
    code, output = _predict("--requests", "8", "--arrival", f"poisson:{rate}")
    assert code == 1 and "--arrival" in output and "fix:" in output, output
    assert "saturated" not in output


@pytest.mark.parametrize("time", ["nan", "inf", "-inf", "-1", "1e300", str(2 * MAX_ARRIVAL_S)])
@pytest.mark.parametrize("csv", [False, True])
def test_an_impossible_arrival_time_names_its_line(time: str, csv: bool, tmp_path: Path) -> None:
    path = tmp_path / ("a.csv" if csv else "a.txt")
    path.write_text(("arrival_s\n" if csv else "") + f"0\n0.5\n{time}\n")
    code, output = _predict("--requests", "3", "--arrival", f"trace:{path}")
    assert code == 1, output
    assert f"line {4 if csv else 3}: arrival time" in output and str(path) in output


def test_the_bounds_themselves_pass(tmp_path: Path) -> None:
    Arrivals.parse(f"poisson:{MAX_ARRIVAL_RATE:g}").validate(8)
    path = tmp_path / "a.txt"
    path.write_text(f"0\n{MAX_ARRIVAL_S:g}\n")
    times, _ = read_arrival_trace(str(path))
    Arrivals.trace(times).validate(2)


@pytest.mark.parametrize("times", [(0.0, float("nan")), (0.0, float("inf")), (0.0, -1.0)])
def test_an_arrival_trace_built_in_python_is_checked_too(times: tuple[float, ...]) -> None:
    with pytest.raises(UserInputError, match="arrival 2: arrival time"):
        Arrivals.trace(times).validate(2)


NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0.0, -0.0, 1e-300, 1e300, MAX_ARRIVAL_RATE, MAX_ARRIVAL_S]))


@given(rate=NUMBERS)
def test_any_poisson_rate_is_refused_or_one_an_instance_can_see(rate: float) -> None:
    try:
        Arrivals.parse(f"poisson:{rate!r}").validate(8)
    except UserInputError as e:
        assert e.where == "--arrival" and e.fix
        return
    assert 0 < rate <= MAX_ARRIVAL_RATE


@given(times=st.lists(NUMBERS, min_size=1, max_size=6))
def test_any_arrival_times_are_refused_or_finite_sorted_and_bounded(times: list[float]) -> None:
    try:
        Arrivals.trace(times).validate(len(times))
    except UserInputError as e:
        assert e.where == "arrival trace" and e.fix
        return
    assert all(math.isfinite(t) and 0 <= t <= MAX_ARRIVAL_S for t in times)
    assert times == sorted(times)
