"""Held-out configurations H for validation (DESIGN.md, "Validation protocol").

A held-out configuration must not be a point of the calibration grid G: the latency grid is
(batch × context) and the acceptance grid is (method × γ × sparsity). `check_outside_grid`
refuses a configuration whose batch *and* context are both latency-grid values *and* whose
γ and sparsity are both acceptance-grid values — such a point was (or could have been)
measured directly, so predicting it proves nothing.

Columns beyond the configuration itself:
- ``temperature``: empty (None) = "the temperature the latency grid sampled at" (meta.json
  plan.latency_temperature), resolved by `validate` when it runs: the sample phase and the
  sampled draft steps (top-p sorts the vocabulary) cost more than greedy argmax, and the
  latency model only knows the cost at the temperature it was measured at.
- ``waves``: independent closed batches of ``batch`` requests run one after the other
  (different prompts / different replayed acceptance), pooled: tokens and time of every
  wave's steady-state window are summed. A batch of one request over ~30 iterations measures
  one prompt's acceptance; a few waves average over prompts, like the prediction does.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vegas_sim.errors import UserInputError
from vegas_sim.methods import METHODS, check_gamma, check_method, check_sparsity, drafts
from vegas_sim.traces.meta import GridMeta


@dataclass(frozen=True)
class HeldOut:
    method: str
    gamma: int
    sparsity: float
    batch: int
    context: int
    output_len: int = 128
    workload: str | None = None
    temperature: float | None = 0.0  # None: the latency grid's temperature (see above)
    waves: int = 1

    def validated(self) -> HeldOut:
        check_method(self.method)
        check_gamma(self.gamma)
        check_sparsity(self.sparsity)
        if self.batch < 1 or self.context < 1 or self.output_len < 2 or self.waves < 1:
            raise UserInputError(f"bad held-out configuration {self}",
                                 fix="batch >= 1, context >= 1, output_len >= 2, waves >= 1")
        if self.temperature is not None and self.temperature < 0:
            raise UserInputError(f"bad held-out temperature {self.temperature}",
                                 fix="use 0 (greedy), a positive temperature, or leave it empty")
        return self

    @property
    def label(self) -> str:
        s = "" if not drafts(self.method) else f" γ={self.gamma} s={self.sparsity:g}"
        return f"{self.method}{s} B={self.batch} C={self.context}"


FIELDS = [f.name for f in dataclasses.fields(HeldOut)]


def heldout_from_record(row: dict[str, Any]) -> HeldOut:
    """A validated HeldOut from a table row (CSV/JSON/result table): columns that are not
    HeldOut fields are ignored, NaN (an empty CSV cell) is None, integral floats (pandas reads
    an int column holding a NaN as float) are ints."""
    clean: dict[str, Any] = {
        k: (None if isinstance(v, float) and np.isnan(v) else v)
        for k, v in row.items() if k in FIELDS
    }
    for k in ("gamma", "batch", "context", "output_len", "waves"):
        if isinstance(clean.get(k), float) and float(clean[k]).is_integer():
            clean[k] = int(clean[k])
    return HeldOut(**clean).validated()


def read_heldout(path: Path) -> list[HeldOut]:
    """Configurations from a CSV (header = HeldOut fields) or a JSON list of objects."""
    if not path.exists():
        raise UserInputError("file not found", where=str(path),
                             fix="pass a CSV/JSON of held-out configurations or use --random N")
    rows: list[dict[str, Any]]
    if path.suffix.lower() == ".json":
        rows = json.loads(path.read_text())
    else:
        rows = [{str(k): v for k, v in r.items()}
                for r in pd.read_csv(path).to_dict(orient="records")]
    out = []
    for i, row in enumerate(rows):
        unknown = set(row) - set(FIELDS)
        if unknown:
            raise UserInputError(f"row {i}: unknown columns {sorted(unknown)}", where=str(path),
                                 fix=f"use columns {FIELDS}")
        try:
            out.append(heldout_from_record(row))
        except TypeError as e:
            raise UserInputError(f"row {i}: {e}", where=str(path),
                                 fix=f"columns {FIELDS[:5]} are required") from None
    return out


def grid_of(meta: dict[str, Any]) -> dict[str, list[Any]]:
    """The calibration grid recorded in a trace set's meta.json."""
    grid = GridMeta.from_meta(meta)
    return {"batch": list(grid.batch), "context": list(grid.context),
            "gamma": list(grid.gamma), "sparsity": list(grid.sparsity)}


def is_grid_point(h: HeldOut, grid: dict[str, list[Any]]) -> bool:
    on_latency_grid = h.batch in grid["batch"] and h.context in grid["context"]
    on_acceptance_grid = (not drafts(h.method) or (
        h.gamma in grid["gamma"] and any(abs(h.sparsity - s) < 1e-9 for s in grid["sparsity"])))
    return on_latency_grid and on_acceptance_grid


def check_outside_grid(heldout: Sequence[HeldOut], grid: dict[str, list[Any]]) -> None:
    inside = [h.label for h in heldout if is_grid_point(h, grid)]
    if inside:
        raise UserInputError(
            f"{len(inside)} configuration(s) are calibration grid points: {', '.join(inside[:5])}",
            fix="validation needs configurations outside the grid (change batch or context, "
                "or γ / sparsity)",
        )


def random_heldout(
    n: int,
    grid: dict[str, list[Any]],
    rng: np.random.Generator,
    *,
    methods: Sequence[str] = METHODS,
    batches: tuple[int, int] = (1, 64),
    contexts: tuple[int, int] = (2048, 131072),
    gammas: tuple[int, int] = (2, 12),
    sparsities: tuple[float, float] = (0.02, 0.15),
    output_len: int = 128,
    max_tokens: int | None = None,
    workloads: Sequence[str | None] = (None,),
) -> list[HeldOut]:
    """n configurations drawn log-uniformly, every one outside the calibration grid.

    Methods cycle so that all of them (and vanilla) are covered. `max_tokens` bounds
    batch × (context + output) (GPU memory).
    """
    out: list[HeldOut] = []
    while len(out) < n:
        method = methods[len(out) % len(methods)]
        # int(): round() of a NumPy float is a float before NumPy 2
        batch = int(round(np.exp(rng.uniform(*np.log(batches)))))  # noqa: RUF046
        context = int(round(np.exp(rng.uniform(*np.log(contexts)))))  # noqa: RUF046
        if max_tokens is not None and batch * (context + output_len + 16) > max_tokens:
            continue
        h = HeldOut(
            method=method,
            gamma=int(rng.integers(gammas[0], gammas[1] + 1)),
            sparsity=round(float(rng.uniform(*sparsities)), 3),
            batch=batch, context=context, output_len=output_len,
            workload=workloads[len(out) % len(workloads)],
        )
        if not is_grid_point(h, grid):
            out.append(h)
    return out


def write_heldout(heldout: Sequence[HeldOut], path: Path) -> None:
    pd.DataFrame([dataclasses.asdict(h) for h in heldout]).to_csv(path, index=False)
