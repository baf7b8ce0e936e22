"""Simulator speed on this machine: iterations/s at batch 128, one predict, a 100-config sweep.

    python benchmarks/sim_speed.py                 # a synthetic trace set (nothing measured)
    python benchmarks/sim_speed.py --traces DIR    # a real trace set

Prints measured numbers and their ratio to the DESIGN.md targets (≥ 50k simulated iterations/s
at batch 128; one predict ≤ 2 s; 1,000 configurations ≤ 60 s, i.e. 100 in ≤ 6 s).
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.engine import EngineConfig, Lengths, simulate
from vegas_sim.sim.latency import LatencyModel
from vegas_sim.sim.predict import Scenario, predict
from vegas_sim.traces.io import TraceSet, load_trace_set

ITERS_PER_S_TARGET = 50_000.0
ENGINE_RUNS = 7  # timed simulate() runs of the engine line (their median is reported)
PREDICT_S_TARGET = 2.0
SWEEP100_S_TARGET = 6.0  # 1,000 configurations in 60 s


def _trace_set(traces: Path | None, workdir: str) -> TraceSet:
    if traces is not None:
        return load_trace_set(traces)
    from vegas_sim.traces.synthetic import make_synthetic_trace_set

    return make_synthetic_trace_set(Path(workdir) / "synthetic", model="qwen3-8b",
                                    methods=("vanilla", "vegas", "magicdec-stream"),
                                    gammas=(2, 4, 7), contexts=(4096, 16384, 32768))


def _models(ts: TraceSet) -> tuple[LatencyModel, AcceptanceModel]:
    """Latency from `ts`; acceptance from `ts` or, for a latency-only set, the packaged
    real-weight set (as `predict` does)."""
    from vegas_sim.traces import catalog

    _, acc, _ = catalog.resolve(ts.model_name, ts.path)
    return (LatencyModel.from_meta(ts.latency, ts.meta),
            AcceptanceModel.from_traces(acc.acceptance, acc.weights_kind))


def bench_iterations(latency: LatencyModel, acceptance: AcceptanceModel, batch: int) -> None:
    cost = latency.iteration_cost("vegas", 7, 0.07)
    dist = acceptance.lookup("vegas", 7, 0.07, 4096)
    cfg = EngineConfig("vegas", 7, batch, 4 * batch, Lengths(4096, 8192))
    simulate(cfg, cost, dist, seed=0)  # warm caches (per-batch-size intercepts)
    rates = []
    for seed in range(1, ENGINE_RUNS + 1):  # one run is ~0.1 s: the median of several
        t0 = time.perf_counter()
        res = simulate(cfg, cost, dist, seed=seed)
        rates.append(res.iterations / (time.perf_counter() - t0))
    rate = float(np.median(rates))
    print(f"engine, vegas γ=7 batch {batch}: {res.iterations} iterations per run, median of "
          f"{ENGINE_RUNS} runs {rate:,.0f} iterations/s (min {min(rates):,.0f}, max "
          f"{max(rates):,.0f}; target ≥ {ITERS_PER_S_TARGET:,.0f}: "
          f"{rate / ITERS_PER_S_TARGET:.2f}×)")
    t0 = time.perf_counter()
    for _ in range(2000):
        cost(res.input_len[:batch])
    per_call = (time.perf_counter() - t0) / 2000 * 1e6
    print(f"  of which IterationCost at batch {batch}: {per_call:.1f} µs per call")


def bench_predict(latency: LatencyModel, acceptance: AcceptanceModel, replications: int
                  ) -> None:
    scen = [Scenario("vanilla", 7, 0.07, 4, 32768, 1024), Scenario("vegas", 7, 0.07, 4, 32768,
                                                                    1024)]
    t0 = time.perf_counter()
    df = predict(scen, latency, acceptance, replications=replications)
    wall = time.perf_counter() - t0
    print(f"predict, vanilla + vegas γ=7 s=0.07 B=4 C=32768 out=1024, {replications} "
          f"replications: {wall:.3f} s (target ≤ {PREDICT_S_TARGET:.0f} s: "
          f"{PREDICT_S_TARGET / wall:.2f}× headroom); "
          f"{int(df['iterations_simulated'].sum())} iterations")


def bench_sweep(latency: LatencyModel, acceptance: AcceptanceModel, replications: int) -> None:
    grid = itertools.product((2, 3, 4, 5, 6), (0.03, 0.05, 0.07, 0.1, 0.15), (1, 4, 16, 48))
    scen = [Scenario("vegas", g, s, b, 16384, 256) for g, s, b in grid]
    t0 = time.perf_counter()
    predict(scen, latency, acceptance, replications=replications)
    wall = time.perf_counter() - t0
    print(f"sweep, {len(scen)} configurations (vegas, C=16384, out=256), sequential, "
          f"{replications} replication(s): {wall:.2f} s (target ≤ {SWEEP100_S_TARGET:.0f} s: "
          f"{SWEEP100_S_TARGET / wall:.2f}× headroom)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=None, help="trace set directory")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--replications", type=int, default=5, help="for the single predict")
    ap.add_argument("--sweep-replications", type=int, default=1)
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs; traces: {args.traces or 'synthetic (not measured)'}")
    with tempfile.TemporaryDirectory() as workdir:
        t0 = time.perf_counter()
        ts = _trace_set(args.traces, workdir)
        latency, acceptance = _models(ts)
        print(f"load + fit models: {time.perf_counter() - t0:.3f} s")
        bench_iterations(latency, acceptance, args.batch)
        bench_predict(latency, acceptance, args.replications)
        bench_sweep(latency, acceptance, args.sweep_replications)


if __name__ == "__main__":
    main()
