"""validate: held-out configurations outside the grid, and the replayed measurement run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.calibrate.conftest import tiny_model
from vegas_sim.calibrate.validate import measure_replayed
from vegas_sim.errors import UserInputError
from vegas_sim.sim.heldout import (HeldOut, check_outside_grid, is_grid_point, random_heldout,
                                   read_heldout, write_heldout)

GRID = {"batch": [1, 4, 16], "context": [1024, 4096], "gamma": [4, 8], "sparsity": [0.05, 0.1]}


def test_random_heldout_is_outside_the_grid_and_seeded() -> None:
    a = random_heldout(30, GRID, np.random.default_rng(3), batches=(1, 16),
                       contexts=(1024, 4096))
    b = random_heldout(30, GRID, np.random.default_rng(3), batches=(1, 16),
                       contexts=(1024, 4096))
    assert a == b
    assert not any(is_grid_point(h, GRID) for h in a)
    assert {h.method for h in a} >= {"vanilla", "vegas", "magicdec-quest"}


def test_grid_point_is_refused() -> None:
    on_grid = HeldOut("vegas", 4, 0.05, 4, 1024)
    with pytest.raises(UserInputError, match="grid points"):
        check_outside_grid([on_grid], GRID)
    check_outside_grid([HeldOut("vegas", 4, 0.05, 3, 1024)], GRID)  # batch 3 is off-grid


def test_heldout_file_round_trip_and_bad_column(tmp_path: Path) -> None:
    hs = [HeldOut("vegas", 6, 0.07, 3, 3000), HeldOut("vanilla", 1, 1.0, 2, 5000)]
    write_heldout(hs, tmp_path / "h.csv")
    assert read_heldout(tmp_path / "h.csv") == hs
    (tmp_path / "bad.csv").write_text("method,gamma,sparsity,batch,context,colour\n"
                                      "vegas,6,0.07,3,3000,red\n")
    with pytest.raises(UserInputError, match="colour"):
        read_heldout(tmp_path / "bad.csv")


def test_replayed_run_follows_the_replayed_acceptance() -> None:
    torch.manual_seed(0)
    model = tiny_model("qwen3")
    h = HeldOut("vegas", gamma=3, sparsity=0.5, batch=2, context=40, output_len=24)
    seqs = np.array([[3, 0, 1, 2] * 10, [1, 1, 1, 1] * 10])
    m = measure_replayed(model, h, seqs, seed=0)
    # Request 0 emits 4, 1, 2, 3 tokens per cycle of 4 iterations and reaches 24 first, in
    # the 9th iteration (4+1+2+3+4+1+2+3+4); request 1 emits 2 per iteration: 18 by then.
    assert m.iterations == 9
    assert m.tokens == 24 + 18
    assert m.throughput > 0


def test_run_validation_end_to_end_on_cpu(tmp_path: Path) -> None:
    """validate's whole path on CPU: held-out file → predict from the trace set → a real
    (random-weight, replayed-acceptance) run → a result table with errors."""
    from vegas_sim.calibrate.validate import run_validation, summarize
    from vegas_sim.traces.synthetic import make_synthetic_trace_set

    traces = tmp_path / "traces"
    make_synthetic_trace_set(traces, model="smollm2-135m", gammas=(2, 4),
                             contexts=(64, 256), batches=(1, 2))
    hs = [HeldOut("vegas", 2, 0.5, 2, 80, output_len=8), HeldOut("vanilla", 1, 1.0, 1, 100, 8)]
    write_heldout(hs, tmp_path / "h.csv")
    out = tmp_path / "val.csv"
    table = run_validation(traces=traces, acceptance_traces=None, heldout_file=tmp_path / "h.csv",
                           n_random=None, model="smollm2-135m", weights="random", max_batch=2,
                           contexts=(64, 256), output_len=8, device="cpu", seed=0, out=out,
                           replications=2)
    assert out.exists() and len(table) == 2
    assert (table["measured"] > 0).all() and (table["predicted"] > 0).all()
    assert set(table["regime"]) == {"random-weights+replay"}
    assert "configurations" in summarize(table)
