"""How fast the simulator answers on this machine, part by part, with the load beside each.

    python benchmarks/predict_speed.py                    # this checkout
    python benchmarks/predict_speed.py --before DIR       # and another checkout, same run

Prints, each with the 1-minute load average when it was measured (the machine may be shared:
compare numbers measured in one run, not across runs):

- `vegas-sim predict --gamma 7` as a user runs it (a fresh Python process, bytecode cached as
  an installed package has it): cold (an empty fit cache: every trace set checked and fitted)
  and warm (the fit cache filled by the cold run), wall and CPU seconds;
- the warm run's parts, timed inside its process (wall and CPU, median of 3 processes):
  importing numpy, pandas and the rest, loading the models (trace sets checked, fits read
  from the cache), simulating and printing;
- the engine's simulated iterations/s (Vegas γ 7 and vanilla, batch 128, the packaged
  qwen3-8b models), per wall and per CPU second, each tree in a child process;
- a 1,000-configuration analytic sweep of the packaged qwen3-8b models on all cores.

Every run uses a fit cache of its own (a temporary VEGAS_SIM_CACHE_DIR), so the cold run is
cold and another user's entries do not answer. With --before DIR the CLI runs of DIR (another
checkout, e.g. a `git worktree` of an older commit) alternate with this checkout's, and the
two printed tables are compared (the text is deterministic: seeded replications), as are the
two engines' runs; the engine lines print this / before.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
PREDICT_ARGS = ("predict", "--gamma", "7")
CLI = "from vegas_sim.cli import main; main()"
WARM_TARGET_S = 1.0  # docs/DESIGN.md's target for a warm predict on 2 cores
ENGINE_RUNS = 7
PARTS = r"""
import contextlib, io, sys, time
marks = [(time.perf_counter(), time.process_time(), "start")]
def mark(name):
    marks.append((time.perf_counter(), time.process_time(), name))
import numpy
mark("import numpy")
import pandas
mark("import pandas (pyarrow with it)")
import vegas_sim.cli.predict
from vegas_sim import api
mark("import click, simpy, rich, vegas_sim")
from vegas_sim.cli import main
models_for, predict_scenarios = api.models_for, api.predict_scenarios
def timed_models(values):
    mark("parse the options")
    out = models_for(values)
    mark("load (sets checked and fits read from the cache)")
    return out
def timed_predict(*args, **kwargs):
    mark("build the scenarios")
    out = predict_scenarios(*args, **kwargs)
    mark("simulate (lookups, 10 runs, rows)")
    return out
api.models_for, api.predict_scenarios = timed_models, timed_predict
sys.argv = ["vegas-sim", "predict", "--gamma", "7"]
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main()
    except SystemExit:
        pass
mark("print the tables")
for (w0, c0, _), (w1, c1, name) in zip(marks, marks[1:]):
    print(f"{name}\t{w1 - w0:.4f}\t{c1 - c0:.4f}")
"""


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


def env_for(tree: Path, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=str(tree), VEGAS_SIM_CACHE_DIR=str(cache / "fits"),
               VEGAS_SIM_CACHE_KEY=str(cache / "key"))
    env.pop("VEGAS_SIM_CACHE", None)
    return env


def timed(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, str]:
    """(wall s, CPU s of the child, stdout) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, out.stdout


def bench_cli(trees: dict[str, Path], warm_runs: int, tmp: Path) -> None:
    """Cold, then warm runs of each tree's CLI, alternating between trees run by run."""
    envs = {name: env_for(tree, tmp / name) for name, tree in trees.items()}
    outputs: dict[str, str] = {}
    for name, tree in trees.items():
        subprocess.run([sys.executable, "-c", "import vegas_sim.cli"], env=envs[name],
                       cwd=tree, check=True)  # compile the bytecode: not what is timed
        at = load()
        wall, cpu, outputs[name] = timed([sys.executable, "-c", CLI, *PREDICT_ARGS],
                                         envs[name], tree)
        print(f"[{name}] cold predict --gamma 7 (empty fit cache): {wall:.2f} s wall, "
              f"{cpu:.2f} s CPU ({at})")
    runs: dict[str, list[tuple[float, float, str]]] = {name: [] for name in trees}
    for _ in range(warm_runs):
        for name, tree in trees.items():
            at = load()
            wall, cpu, out = timed([sys.executable, "-c", CLI, *PREDICT_ARGS], envs[name],
                                   tree)
            runs[name].append((wall, cpu, at))
            if out != outputs[name]:
                print(f"[{name}] WARNING: a warm run printed another table than the cold")
    for name, rs in runs.items():
        walls = [r[0] for r in rs]
        cpus = [r[1] for r in rs]
        print(f"[{name}] warm predict --gamma 7, {len(rs)} runs: median "
              f"{statistics.median(walls):.2f} s wall (min {min(walls):.2f}, max "
              f"{max(walls):.2f}), median {statistics.median(cpus):.2f} s CPU (min {min(cpus):.2f}); loads "
              f"{', '.join(r[2].split()[1] for r in rs)}; target ≤ {WARM_TARGET_S:.0f} s "
              "on an idle 2-core machine")
    if len(outputs) > 1:
        same = len(set(outputs.values())) == 1
        print(f"predict --gamma 7 output identical across {', '.join(outputs)}: "
              f"{'yes' if same else 'NO'}")
    for name, tree in trees.items():
        bench_parts(name, tree, envs[name])


def bench_parts(name: str, tree: Path, env: dict[str, str], runs: int = 3) -> None:
    """A warm predict's parts, timed inside its process (wall and CPU s, the median of
    `runs` processes); the parts sum to the process's work less the interpreter's start."""
    at = load()
    walls: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", PARTS], env=env, cwd=tree,
                             capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            part, wall, cpu = line.split("\t")
            walls.setdefault(part, []).append(float(wall))
            cpus.setdefault(part, []).append(float(cpu))
    print(f"[{name}] warm predict --gamma 7 by part, median of {runs} processes ({at} → "
          f"{load().split()[1]}): wall s / CPU s")
    for part in walls:
        print(f"  {part}: {statistics.median(walls[part]):.3f} / "
              f"{statistics.median(cpus[part]):.3f}")
    print(f"  sum: {sum(statistics.median(w) for w in walls.values()):.3f} / "
          f"{sum(statistics.median(c) for c in cpus.values()):.3f}")


ENGINE = r"""
import hashlib, json, sys, time
import numpy as np
from vegas_sim import api
from vegas_sim.sim.engine import EngineConfig, Lengths, simulate
latency, acceptance, _ = api.load_models("qwen3-8b")
rows = {}
for method, gamma in (("vegas", 7), ("vanilla", 1)):
    cost = latency.iteration_cost(method, gamma, 0.07)
    dist = acceptance.lookup(method, gamma, 0.07, 4096) if method != "vanilla" else None
    cfg = EngineConfig(method, gamma, 128, 4 * 128, Lengths(4096, 8192))
    simulate(cfg, cost, dist, seed=0)  # warm the per-batch caches
    wall, cpu, digest = [], [], hashlib.sha256()
    for seed in range(1, int(sys.argv[1]) + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        res = simulate(cfg, cost, dist, seed=seed)
        wall.append(res.iterations / (time.perf_counter() - t0))
        cpu.append(res.iterations / max(time.process_time() - c0, 1e-9))
        for a in (res.iter_ms, res.iter_tokens, res.iter_kv_blocks, res.finish_ms):
            digest.update(np.ascontiguousarray(a).tobytes())
    rows[method] = {"iterations": res.iterations, "wall": wall, "cpu": cpu,
                    "digest": digest.hexdigest()[:16]}
print(json.dumps(rows))
"""


def bench_engine(trees: dict[str, Path], tmp: Path, rounds: int = 3) -> None:
    """Simulated iterations per second (wall and CPU) at batch 128, 512 requests of 4K + 8K
    tokens: Vegas γ 7 (its iterations a block at a time between membership changes) and
    vanilla (priced in blocks). Each tree in a child process of its own, the trees alternating
    and their order reversed every other round; with two trees, the ratio of their medians and whether their runs agree
    bit for bit (a digest of the iteration times, tokens, KV blocks and finish times)."""
    rates: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    digests: dict[str, dict[str, str]] = {name: {} for name in trees}
    iterations: dict[str, int] = {}
    for k in range(rounds):
        order = list(trees.items())
        for name, tree in order[::-1] if k % 2 else order:  # neither tree always goes first
            at = load()
            out = subprocess.run([sys.executable, "-c", ENGINE, str(ENGINE_RUNS)],
                                 env=env_for(tree, tmp / name), cwd=tree, capture_output=True,
                                 text=True, check=True).stdout
            for method, row in json.loads(out).items():
                rates[name].setdefault(f"{method} wall", []).extend(row["wall"])
                rates[name].setdefault(f"{method} cpu", []).extend(row["cpu"])
                rates[name].setdefault(f"{method} load", []).append(float(at.split()[1]))
                digests[name][method] = row["digest"]
                iterations[method] = row["iterations"]
    for method in ("vegas", "vanilla"):
        for name in trees:
            r = rates[name]
            print(f"[{name}] engine, {method}, batch 128 (qwen3-8b-h200): "
                  f"{iterations[method]} iterations a run, median of "
                  f"{len(r[method + ' wall'])} runs {statistics.median(r[method + ' wall']):,.0f} "
                  f"iterations/s wall (min {min(r[method + ' wall']):,.0f}), "
                  f"{statistics.median(r[method + ' cpu']):,.0f} per CPU s; loads "
                  f"{', '.join(f'{x:.2f}' for x in r[method + ' load'])}")
        if len(trees) == 2:
            this, before = (rates[name][f"{method} wall"] for name in trees)
            same = len({digests[name][method] for name in trees}) == 1
            print(f"engine, {method}: this / before {statistics.median(this) / statistics.median(before):.2f}x "
                  f"(median iterations/s wall); runs identical: {'yes' if same else 'NO'}")


def bench_sweep(workers: int) -> None:
    """1,000 analytic configurations: of the packaged qwen3-8b models (what `vegas-sim sweep`
    runs by default), and of a small synthetic set (sweep_speed.py's, for comparison)."""
    from vegas_sim import api
    from vegas_sim.sim.acceptance import AcceptanceModel
    from vegas_sim.sim.sweep import SweepGrid, sweep
    from vegas_sim.traces.synthetic import make_synthetic_trace_set

    sparsity = (0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.1, 0.15)
    grid = SweepGrid(methods=("vegas", "magicdec-stream"), gamma=tuple(range(1, 11)),
                     sparsity=sparsity, batch=(1, 4, 16, 64), context=(4096, 32768),
                     output_len=(1024,), include_vanilla=False)
    scenarios = grid.scenarios()[:1000]  # 2·10·10·4·2 = 1,600: the first 1,000
    latency, acceptance, _ = api.load_models("qwen3-8b")
    with tempfile.TemporaryDirectory() as tmp:
        ts = make_synthetic_trace_set(Path(tmp) / "ts", gammas=(2, 4, 8, 12),
                                      sparsities=(0.01, 0.05, 0.1, 0.2),
                                      contexts=(4096, 32768), batches=(1, 16, 64))
        synthetic = (api.fit_latency(ts), AcceptanceModel.from_traces(ts.acceptance,
                                                                      ts.weights_kind))
    for what, (lat, acc) in (("packaged qwen3-8b, anchored", (latency, acceptance)),
                             ("synthetic set (sweep_speed.py's)", synthetic)):
        at = load()
        t0 = time.perf_counter()
        table = sweep(scenarios, lat, acc, engine="analytic", workers=workers)
        wall = time.perf_counter() - t0
        print(f"analytic sweep, {len(table)} configurations, {what}, {workers} workers: "
              f"{wall:.1f} s ({at} → {load().split()[1]})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, default=None,
                    help="another checkout whose CLI to time in the same run")
    ap.add_argument("--warm-runs", type=int, default=5)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}; {load()} at the start")
    trees = {"this": HERE}
    if args.before is not None:
        trees["before"] = args.before.resolve()
    sys.path.insert(0, str(HERE))  # this checkout's vegas_sim, not an installed one
    with tempfile.TemporaryDirectory() as tmp:
        bench_cli(trees, args.warm_runs, Path(tmp))
        bench_engine(trees, Path(tmp))
        os.environ.update(env_for(HERE, Path(tmp) / "this"))  # the fits the CLI runs cached
        bench_sweep(args.workers)


if __name__ == "__main__":
    main()
