"""Every command's options and its Python function's parameters are one list (README: "every
function takes the CLI's options"): same names, same defaults, and the shared scenario
options agree with `Scenario`'s fields. Compared straight from the click commands and the
function signatures, so a drift on either side fails here."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import click
import pytest

from vegas_sim import api
from vegas_sim.cli import cli
from vegas_sim.grids import grid_text
from vegas_sim.sim.options import options_for
from vegas_sim.sim.predict import Scenario

# What only one side has: the CLI's output options; the function's live reporting.
CLI_ONLY = {"predict": {"fmt", "out"}, "sweep": {"out", "rank_by"}, "tune": {"out"}}
API_ONLY = {"predict": {"progress"}, "sweep": set(), "tune": {"progress", "say"}}
FUNCTIONS = {"predict": api.predict, "sweep": api.sweep, "tune": api.tune}


def _cli_params(command: str) -> dict[str, Any]:
    cmd = cli.get_command(click.Context(cli), command)
    assert isinstance(cmd, click.Command)
    return {p.name: p.default for p in cmd.params
            if isinstance(p, click.Option) and p.name not in CLI_ONLY[command]
            and p.name != "help"}


def _api_params(command: str) -> dict[str, Any]:
    sig = inspect.signature(FUNCTIONS[command])
    return {n: p.default for n, p in sig.parameters.items() if n not in API_ONLY[command]}


def _same(cli_default: Any, api_default: Any) -> bool:
    """One default written as the CLI (text) and as the function (a typed value)."""
    if isinstance(cli_default, tuple) or isinstance(api_default, tuple):
        return tuple(cli_default) == tuple(api_default)
    if cli_default is None or api_default is None:
        return cli_default is api_default
    if isinstance(cli_default, str) and not isinstance(api_default, str):
        return cli_default == grid_text(api_default)
    return bool(cli_default == api_default)


@pytest.mark.parametrize("command", sorted(FUNCTIONS))
def test_a_command_and_its_function_take_the_same_options(command: str) -> None:
    cli_params, api_params = _cli_params(command), _api_params(command)
    assert sorted(set(cli_params) - set(api_params)) == [], "options the function lacks"
    assert sorted(set(api_params) - set(cli_params)) == [], "parameters the command lacks"
    differ = {n: (cli_params[n], api_params[n]) for n in cli_params
              if not _same(cli_params[n], api_params[n])}
    assert differ == {}, "defaults that differ (CLI, function)"


@pytest.mark.parametrize("command", sorted(FUNCTIONS))
def test_the_option_table_is_what_the_command_takes(command: str) -> None:
    table = {o.name: o.default for o in options_for(command)}
    assert table == _cli_params(command)
    for o in options_for(command):
        assert o.help.strip(), f"{o.name} has no help"
        assert o.name in api.options_help(command)


def test_scenario_options_default_as_the_scenario_does() -> None:
    fields = {f.name: f.default for f in dataclasses.fields(Scenario)}
    for command in FUNCTIONS:
        for o in options_for(command):
            if o.scenario:
                assert o.name in fields and fields[o.name] == o.value(o.default), o.name


def test_predict_methods_is_gone() -> None:
    assert not hasattr(api, "predict_methods")


def test_sweep_and_tune_replay_the_workload_and_temperature_asked_for() -> None:
    """--workload/--temperature reach every configuration of sweep and tune (the setting of
    the packaged anchors, reasoning at T 0.6, can be swept and tuned, not only predicted)."""
    kwargs: dict[str, Any] = dict(gamma=6, sparsity=0.07, batch=4, context="4K", workers=1)
    pooled = api.sweep(**kwargs)
    code = api.sweep(**kwargs, workload="code", temperature=0.6)
    assert set(code["workload"]) == {"code"} and set(code["temperature"]) == {0.6}
    vegas = lambda t: float(t.loc[t["method"] == "vegas", "acceptance_length"].iloc[0])  # noqa: E731
    assert vegas(code) != pytest.approx(vegas(pooled), rel=0.01)
    tuned = api.tune(batch=[4], context="4K", workers=1, workload="code", temperature=0.6)
    assert set(tuned.steps["workload"]) == {"code"}
    assert set(tuned.steps["temperature"]) == {0.6}


def test_tensor_parallel_and_model_what_if_reach_sweep_and_tune() -> None:
    """--tp and --model-what-if are options of every command, not only of load_models: the
    rows say the what-if, and a TP 2 group runs a different iteration than one GPU."""
    kwargs: dict[str, Any] = dict(gamma=4, sparsity=0.07, batch=4, context="4K", workers=1)
    one, two = api.sweep(**kwargs), api.sweep(**kwargs, tensor_parallel=2)
    assert "tensor parallel" in str(two["gpu"].iloc[0]) and "what-if" in str(two["gpu"].iloc[0])
    assert not one["throughput_tok_s"].equals(two["throughput_tok_s"])
    llama = api.tune(batch=[4], context="4K", workers=1, model_what_if="llama-3.1-8b")
    assert any("llama-3.1-8b" in n for n in llama.notes)
