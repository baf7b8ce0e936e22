"""The roofline of one iteration: how close a prediction runs to the GPU's physical limit.

Per phase of `methods.iteration_plan`, the bytes its kernels must move and the FLOPs they
must compute (`latency_features.Physics.roofline_ms`, the latency model's own constants at
efficiency 1), priced at the GPU's copy bandwidth and matmul rate (measured, or a what-if's
scaled ones). A phase call's bound is the larger of the two times (perfect overlap), and that
resource binds it; the iteration's bound is the sum over its calls. Beside the bound, the
latency model's prediction at the same point says how far above the floor the runtime sits.

`verify_compute_batch`: the smallest batch at which the verify pass (γ + 1 rows per request
at context C) turns compute-bound, FLOPs / F > bytes / BW — the view of *Scaling Laws for
Speculative Decoding* §3.2 (arithmetic intensity against the GPU's critical intensity). A
long context may never get there: every request adds KV bytes as fast as it adds FLOPs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vegas_sim.methods import iteration_plan, method_of, window_kv_read
from vegas_sim.sim.iteration_cost import IterationCost
from vegas_sim.sim.latency import LatencyModel
from vegas_sim.sim.latency_features import WINDOW_PHASES

MEMORY, COMPUTE = "memory", "compute"

# verify_compute_batch searches batches up to this (beyond it: "never", at this context)
MAX_COMPUTE_BATCH = 1 << 20


@dataclass(frozen=True)
class PhaseBound:
    """One phase's calls in an iteration (draft steps summed over γ): the bytes and FLOPs
    they need, each as time at the GPU's rates, and the bound (the larger, per call)."""

    phase: str
    gbytes: float
    tflop: float
    bytes_ms: float
    flops_ms: float
    bound_ms: float
    predicted_ms: float

    @property
    def binds(self) -> str:
        """'compute' when the FLOPs take longer than the bytes, else 'memory'."""
        return COMPUTE if self.flops_ms > self.bytes_ms else MEMORY


@dataclass(frozen=True)
class IterationRoofline:
    """The roofline of one iteration at `batch` requests of `context` tokens."""

    method: str
    batch: int
    context: int
    bandwidth_gbs: float
    tflops: float
    phases: tuple[PhaseBound, ...]

    @property
    def bound_ms(self) -> float:
        return sum(p.bound_ms for p in self.phases)

    @property
    def predicted_ms(self) -> float:
        return sum(p.predicted_ms for p in self.phases)

    @property
    def share(self) -> float:
        """The bound over the predicted time (1 = at the physical limit)."""
        return self.bound_ms / self.predicted_ms if self.predicted_ms > 0 else math.nan

    @property
    def gbytes(self) -> float:
        return sum(p.gbytes for p in self.phases)

    @property
    def tflop(self) -> float:
        return sum(p.tflop for p in self.phases)

    def binds(self) -> str:
        """'phase:resource,...' for the phases that have a bound (e.g. 'verify:memory')."""
        return ",".join(f"{p.phase}:{p.binds}" for p in self.phases if p.bound_ms > 0)


def iteration_roofline(latency: LatencyModel, cost: IterationCost, contexts: np.ndarray
                       ) -> IterationRoofline:
    """The roofline of `cost`'s iteration (its method, γ, sparsity, budget floor) for requests
    holding `contexts` tokens, with the model's predicted ms per phase at the same point."""
    phys = latency.physics
    c = np.asarray(contexts, dtype=np.int64)
    plan = iteration_plan(cost.method, cost.gamma, c, cost.sparsity,
                          latency.model.max_positions, cost.min_tokens)
    predicted = cost.breakdown(c)
    sums: dict[str, list[float]] = {}
    for call in plan:
        window = (float(window_kv_read(phys.window, c, call.n_query).sum())
                  if phys.window and call.phase in WINDOW_PHASES else 0.0)
        byte_ms, flop_ms = phys.roofline_ms(call.phase, call.batch, call.n_query,
                                            float(call.kv_read.sum()), call.collect_rows,
                                            window)
        acc = sums.setdefault(call.phase, [0.0, 0.0, 0.0])
        acc[0] += call.repeats * byte_ms
        acc[1] += call.repeats * flop_ms
        acc[2] += call.repeats * max(byte_ms, flop_ms)
    phases = tuple(
        PhaseBound(phase, gbytes=b / phys.ms_per_byte / 1e9, tflop=f / phys.ms_per_flop / 1e12,
                   bytes_ms=b, flops_ms=f, bound_ms=bound,
                   predicted_ms=float(predicted.get(phase, 0.0)))
        for phase, (b, f, bound) in sums.items())
    return IterationRoofline(cost.method, int(c.shape[0]), int(c.max()) if c.size else 0,
                             latency.gpu.copy_bandwidth_gbs, latency.gpu.bf16_tflops, phases)


def verify_compute_batch(latency: LatencyModel, method: str, gamma: int, context: int
                         ) -> int | None:
    """The smallest batch whose verify pass (γ + 1 rows per request over `context` tokens)
    is compute-bound on this GPU, or None when none up to MAX_COMPUTE_BATCH is (vanilla:
    its decode step). Bytes grow with the batch by each request's KV, FLOPs by its rows'
    GEMM and attention work; the weight stream is paid once."""
    spec = method_of(method)
    phase = "verify" if spec.drafts else "decode"
    n_query, rows = spec.query_rows(gamma), spec.collect_rows(gamma)
    phys = latency.physics
    kv_read = context + n_query
    window = float(window_kv_read(phys.window, np.array([context]), n_query)[0]) \
        if phys.window else 0.0

    def compute_bound(batch: int) -> bool:
        byte_ms, flop_ms = phys.roofline_ms(phase, batch, n_query, float(batch * kv_read),
                                            rows, batch * window)
        return flop_ms > byte_ms

    if not compute_bound(MAX_COMPUTE_BATCH):
        return None
    lo, hi = 0, MAX_COMPUTE_BATCH  # compute_bound(hi); not at lo (0 requests: weights only)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if compute_bound(mid) else (mid, hi)
    return hi


ROOFLINE_COLUMNS = ("roofline_ms", "roofline_pct", "roofline_gb", "roofline_tflop",
                    "roofline_binds", "roofline_bandwidth_gbs", "roofline_tflops",
                    "verify_compute_batch")


def roofline_columns(latency: LatencyModel, cost: IterationCost, batch: int, context: int
                     ) -> dict[str, float | str]:
    """The row columns of the roofline at `batch` requests of `context` tokens each
    (docs/OUTPUTS.md); verify_compute_batch is NaN where verify stays memory-bound."""
    roof = iteration_roofline(latency, cost, np.full(max(batch, 1), context, np.int64))
    turn = verify_compute_batch(latency, cost.method, cost.gamma, context)
    return {
        "roofline_ms": roof.bound_ms,
        "roofline_pct": 100.0 * roof.share,
        "roofline_gb": roof.gbytes,
        "roofline_tflop": roof.tflop,
        "roofline_binds": roof.binds(),
        "roofline_bandwidth_gbs": roof.bandwidth_gbs,
        "roofline_tflops": roof.tflops,
        "verify_compute_batch": math.nan if turn is None else float(turn),
    }
