"""Grid syntax: values, ordering, and errors that name the option and the bad item."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vegas_sim.errors import UserInputError
from vegas_sim.grids import (
    format_grid,
    parse_float_grid,
    parse_int_grid,
    parse_name_list,
    parse_sparsity_grid,
    parse_temperature_grid,
)
from vegas_sim.methods import METHODS


@pytest.mark.parametrize("text, expected", [
    ("1,2,4", [1, 2, 4]),
    ("4,1,2,2", [1, 2, 4]),
    ("2..5", [2, 3, 4, 5]),
    ("2..12:2", [2, 4, 6, 8, 10, 12]),
    ("2..11:3", [2, 5, 8, 11]),
    ("2..12:4", [2, 6, 10]),
    ("1K,32K,128K", [1024, 32768, 131072]),
    ("1k..8k:x2", [1024, 2048, 4096, 8192]),
    ("1..128:x2", [1, 2, 4, 8, 16, 32, 64, 128]),
    ("1..100:x10", [1, 10, 100]),
    ("1..6:x2", [1, 2, 4]),
    ("1M", [1024 * 1024]),
    (" 1 , 2 ", [1, 2]),
    ("256,1K..4K:x2", [256, 1024, 2048, 4096]),
    ("1.5K,0.5k,.25M", [512, 1536, 262144]),
])
def test_int_grid_values(text: str, expected: list[int]) -> None:
    assert parse_int_grid(text, "batch") == expected


@pytest.mark.parametrize("text, fragment", [
    ("1,x,4", "'x'"),
    ("1,,4", "empty item"),
    ("", "empty grid"),
    ("5..2", "below its start"),
    ("2..12:0", "step 0"),
    ("1.5", "not an integer"),
    ("5.6K", "5734.4, not a whole number"),
    ("1..8:x1", "geometric"),
    ("0..8:x2", "geometric"),
    ("4:2", "needs a range"),
    ("0,1", "below the minimum"),
    ("1..2000000", "more than"),
])
def test_int_grid_errors_name_option_and_item(text: str, fragment: str) -> None:
    with pytest.raises(UserInputError) as ei:
        parse_int_grid(text, "context")
    assert ei.value.where == "--context"
    assert fragment in str(ei.value)
    assert ei.value.fix


def test_int_grid_maximum() -> None:
    with pytest.raises(UserInputError, match="above the maximum 16"):
        parse_int_grid("1..17", "--n-query", maximum=16)
    assert parse_int_grid("0,3", "--x", minimum=0) == [0, 3]


@pytest.mark.parametrize("text, expected", [
    ("0.07", [0.07]),
    ("0.01,0.03,0.07", [0.01, 0.03, 0.07]),
    ("7%,1%", [0.01, 0.07]),
    ("0.01..0.05:0.01", [0.01, 0.02, 0.03, 0.04, 0.05]),
    ("1%..3%:1%", [0.01, 0.02, 0.03]),
    ("0.1..0.25:0.1", [0.1, 0.2]),
    ("0.01,0.05..0.07:0.01", [0.01, 0.05, 0.06, 0.07]),
])
def test_sparsity_grid_values(text: str, expected: list[float]) -> None:
    assert parse_sparsity_grid(text) == expected


def test_float_range_hits_end_exactly() -> None:
    got = parse_sparsity_grid("0.01..0.2:0.01")
    assert len(got) == 20
    assert got[6] == 0.07  # rounded, not 0.07000000000000001
    assert got[-1] == 0.2


@pytest.mark.parametrize("text, fragment", [
    ("0.03..0.07", "explicit step"),
    ("0", "out of range"),
    ("1.5", "above the maximum"),
    ("abc", "not a number"),
    ("nan", "not finite"),
    ("0.1..0.2:-0.1", "must be > 0"),
    ("0.2..0.1:0.01", "below its start"),
])
def test_sparsity_grid_errors(text: str, fragment: str) -> None:
    with pytest.raises(UserInputError) as ei:
        parse_sparsity_grid(text)
    assert ei.value.where == "--sparsity"
    assert fragment in str(ei.value)


def test_float_range_without_step_suggests_one() -> None:
    with pytest.raises(UserInputError) as ei:
        parse_sparsity_grid("0.03..0.07")
    assert "0.03..0.07:0.01" in str(ei.value)


def test_temperature_grid_allows_zero() -> None:
    assert parse_temperature_grid("0,0.6") == [0.0, 0.6]
    with pytest.raises(UserInputError):
        parse_temperature_grid("-1")


def test_float_grid_generic_bounds() -> None:
    assert parse_float_grid("0.5..1.5:0.5", "x", minimum=0.5, maximum=1.5) == [0.5, 1.0, 1.5]


def test_name_list() -> None:
    assert parse_name_list("vegas,vanilla,vegas", "methods", METHODS) == ["vegas", "vanilla"]
    assert parse_name_list("all", "methods", METHODS) == list(METHODS)
    assert parse_name_list("a,b", "workload") == ["a", "b"]
    with pytest.raises(UserInputError) as ei:
        parse_name_list("vegas,veags", "methods", METHODS)
    assert "'veags'" in str(ei.value) and ei.value.where == "--methods"
    assert "magicdec-quest" in str(ei.value)


def test_format_grid_round_trips() -> None:
    values = [256, 1024, 131072]
    assert format_grid(values) == "256,1K,128K"
    assert parse_int_grid(format_grid(values), "c") == values
    assert format_grid([0.01, 0.07]) == "0.01,0.07"


@given(st.lists(st.integers(min_value=1, max_value=1 << 20), min_size=1, max_size=20))
def test_int_list_round_trip(values: list[int]) -> None:
    text = ",".join(str(v) for v in values)
    assert parse_int_grid(text, "b") == sorted(set(values))
    assert parse_int_grid(format_grid(sorted(set(values))), "b") == sorted(set(values))


@given(st.integers(1, 1000), st.integers(0, 1000), st.integers(1, 50))
def test_int_range_matches_python_range(lo: int, span: int, step: int) -> None:
    assert parse_int_grid(f"{lo}..{lo + span}:{step}", "b") == list(range(lo, lo + span + 1, step))
