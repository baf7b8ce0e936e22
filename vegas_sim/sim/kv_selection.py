"""The KV-selection overhead of an iteration, counted as the Vegas paper counts it (§5.2,
Figure 10b): the time a method spends choosing the keys its draft reads.

It is the method's selection phases (`methods.Method.selection_phases`: the score weighting
and top-k of Vegas and SpecExtend, Quest's page scoring, the StreamingLLM index build) plus
the score write-out inside its verify pass. The write-out is no phase of its own: the verify
kernel stores the collected rows' scores while it attends, so its cost is the method's verify
over the plain verify — a method that collects nothing, measured in the same latency set — at
the same point. One method's own fit cannot separate it from the KV read: every verify of
Collect-2-Query collects the same two rows, so its collect term sits at its lower bound and
the KV term takes the rest.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vegas_sim.methods import SPEC_METHODS, method_of
from vegas_sim.sim.latency import LatencyModel

KV_SELECTION_COLUMNS = ("ms_verify_collect", "kv_selection_pct", "plain_verify_method")


def plain_verify_method(latency: LatencyModel) -> str | None:
    """The first drafting method that collects no scores and whose verify the set measured
    (its verify is the kernel without the write-out), or None."""
    for name in SPEC_METHODS:
        if method_of(name).collects == "none" and latency.measures("verify", name):
            return name
    return None


def collection_share(latency: LatencyModel, method: str, gamma: int, batch: int,
                     context: int) -> float:
    """The share of `method`'s verify time that writes the collected scores, at `batch`
    requests of `context` tokens: 1 − plain verify / its verify (≥ 0); 0 for a method that
    collects nothing, NaN when the set measured no plain verify."""
    return _write_out_share(latency, method, gamma, batch, context,
                            plain_verify_method(latency))


def _write_out_share(latency: LatencyModel, method: str, gamma: int, batch: int,
                     context: int, plain: str | None) -> float:
    """`collection_share` against the plain verify of `plain` (None: none measured)."""
    spec = method_of(method)
    rows = spec.collect_rows(gamma)  # 0 for vanilla and the methods that collect nothing
    if rows == 0:
        return 0.0
    if plain is None:
        return math.nan
    n_query = spec.query_rows(gamma)
    contexts = np.full(max(batch, 1), context, np.int64)  # [B]
    kv_read = contexts + n_query
    own = latency.phase_ms("verify", method, n_query, kv_read, rows, contexts)
    base = latency.phase_ms("verify", plain, n_query, kv_read, 0, contexts)
    return max(0.0, 1.0 - base / own) if own > 0 else math.nan


def kv_selection_columns(latency: LatencyModel, method: str, gamma: int, batch: int,
                         context: int, row: dict[str, Any]) -> dict[str, Any]:
    """The row's KV-selection columns (docs/OUTPUTS.md) from its simulated phase means
    (`ms_<phase>`, `iter_ms`), the write-out's share taken at `batch` requests of `context`
    tokens (the roofline's point)."""
    spec = method_of(method)
    plain = plain_verify_method(latency) if spec.collect_rows(gamma) else None
    share = _write_out_share(latency, method, gamma, batch, context, plain)
    collect_ms = share * float(row.get("ms_verify", 0.0))
    selection_ms = sum(float(row.get(f"ms_{p}", 0.0)) for p in spec.selection_phases)
    iteration = float(row.get("iter_ms", math.nan))
    pct = 100.0 * (selection_ms + collect_ms) / iteration if iteration > 0 else math.nan
    return {"ms_verify_collect": collect_ms, "kv_selection_pct": pct,
            "plain_verify_method": plain or ""}
