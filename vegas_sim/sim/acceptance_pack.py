"""How a fitted `acceptance.AcceptanceModel` travels through the fit cache: its thousands of
small arrays (every cell's traced runs, the contexts its iterations ran at, the smoothed
rates) packed into a few columns, so that reading a large set's fit back is a handful of
buffers; the cells' arrays are sliced out and widened only when a lookup uses them. The
packed state reads back to the same values, array for array."""

from __future__ import annotations

from typing import Any

import numpy as np

from vegas_sim.sim.acceptance_dist import _CELL_ARRAYS, TracedCell, _narrowed, _PackedCell
from vegas_sim.sim.sparsity_trend import IterationContexts


class CellColumns:
    """Many cells' arrays end to end, one column per field in the narrowest dtype that holds
    every value exactly (`_narrowed`), with each cell's offsets: how a model's cells travel
    through the fit cache. Reading them back is a handful of buffers, not five per cell, and
    a cell's arrays are sliced out and widened only when first used (`cells`)."""

    def __init__(self, scalars: list[tuple[int, float, float, int, int]],
                 columns: dict[str, tuple[np.ndarray, str]],
                 offsets: dict[str, np.ndarray]) -> None:
        self.scalars = scalars  # per cell: gamma, sparsity, bucket, ctx_min, ctx_max
        self.columns = columns  # field → (column, the dtype every cell's array has)
        self.offsets = offsets  # field → [cells + 1] start of each cell's values

    @staticmethod
    def of(cells: list[TracedCell]) -> CellColumns | None:
        """The columns of `cells`; None where one field's arrays differ in dtype, or prob is
        not [N, gamma] (then the cells are pickled one by one)."""
        if not cells:
            return None
        columns, offsets = {}, {}
        for f in _CELL_ARRAYS:
            arrays = [getattr(c, f) for c in cells]
            dtypes = {a.dtype.str for a in arrays}
            shapes_ok = all(a.shape == ((len(c.acc), c.gamma) if f == "prob" else (len(c.acc),))
                            for a, c in zip(arrays, cells))
            if len(dtypes) != 1 or not shapes_ok:
                return None
            columns[f] = (_narrowed(np.concatenate([a.reshape(-1) for a in arrays]))[0],
                          dtypes.pop())
            offsets[f] = np.cumsum([0, *(a.size for a in arrays)])
        scalars = [(c.gamma, c.sparsity, c.bucket, c.ctx_min, c.ctx_max) for c in cells]
        return CellColumns(scalars, columns, offsets)

    def array(self, index: int, field: str) -> np.ndarray:
        """Cell `index`'s array `field`, widened to its own dtype (a copy)."""
        column, dtype = self.columns[field]
        lo, hi = int(self.offsets[field][index]), int(self.offsets[field][index + 1])
        out = column[lo:hi].astype(dtype)
        return out.reshape(-1, self.scalars[index][0]) if field == "prob" else out

    def cells(self) -> list[TracedCell]:
        """The cells, in their order; their arrays are read from the columns on first use."""
        out: list[TracedCell] = []
        for index, (gamma, sparsity, bucket, ctx_min, ctx_max) in enumerate(self.scalars):
            cell = object.__new__(_PackedCell)
            cell.__dict__.update(gamma=gamma, sparsity=sparsity, bucket=bucket,
                                 ctx_min=ctx_min, ctx_max=ctx_max, _columns=self,
                                 _index=index)
            out.append(cell)
        return out


def pack_state(state: dict[str, Any]) -> dict[str, Any]:
    """A model's `__dict__` with its cells, their iteration contexts and the smoothed rates
    packed into columns (each left as it is where it does not pack)."""
    out = dict(state)
    keys = list(state["_cells"])
    columns = CellColumns.of(list(state["_cells"].values()))
    if columns is not None:
        out["_cells"] = (keys, columns)
    contexts = state["_contexts"]
    if list(contexts) == keys:
        out["_contexts"] = (_joined([c.contexts for c in contexts.values()]),
                            _joined([c.counts for c in contexts.values()]))
    out["_smoothed"] = {at: (list(rates), np.stack(list(rates.values())))
                        if rates and _same_shape(list(rates.values())) else rates
                        for at, rates in state["_smoothed"].items()}
    out["_walks"] = {}  # cells walked at another γ: remade on use, not worth their bytes
    return out


def unpack_state(state: dict[str, Any]) -> dict[str, Any]:
    """`pack_state` undone: the cells read their arrays from the columns on first use."""
    out = dict(state)
    if isinstance(state["_cells"], tuple):
        keys, columns = state["_cells"]
        out["_cells"] = dict(zip(keys, columns.cells()))
    if isinstance(state["_contexts"], tuple):
        values, counts = (_split(*part) for part in state["_contexts"])
        out["_contexts"] = {k: IterationContexts(v, n)
                            for k, v, n in zip(out["_cells"], values, counts)}
    out["_smoothed"] = {at: dict(zip(rates[0], rates[1])) if isinstance(rates, tuple) else rates
                        for at, rates in state["_smoothed"].items()}
    return out


def _same_shape(arrays: list[np.ndarray]) -> bool:
    return len({(a.shape, a.dtype.str) for a in arrays}) == 1


def _joined(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(the arrays end to end, [n + 1] their offsets)."""
    return np.concatenate(arrays), np.cumsum([0, *(a.size for a in arrays)])


def _split(column: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    """`_joined` undone: views of `column`, one per array."""
    bounds = offsets.tolist()
    return [column[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])]
