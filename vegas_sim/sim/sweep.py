"""Sweeps: `predict` over a grid of configurations, in parallel, locally or on a Dask cluster.

    >>> from vegas_sim.sim.sweep import SweepGrid, sweep
    >>> grid = SweepGrid(methods=("vegas", "magicdec-stream"), gamma=tuple(range(2, 13)),
    ...                  sparsity=(0.01, 0.03, 0.05, 0.07, 0.1), batch=(1, 4), context=(32768,))
    >>> table = sweep(grid, latency, acceptance, engine="analytic", workers=2)

Output: a tidy DataFrame, one row per (configuration, engine) with every column `predict`
returns (throughput and speedup with their CIs, latencies, acceptance, per-phase ms,
extrapolated, ...) plus `seed`. Rows come back in grid order, whatever order the
workers finished in.

Determinism: every configuration runs with the same base seed (`predict` spawns its
replication seeds from it), whatever its position in the grid or its chunk. That makes a local
run, a run with another number of workers or chunk size, and a Dask run give identical rows,
gives a configuration the same result in every grid that contains it, and uses common random
numbers across configurations: comparing two configurations (as `tune` does) is not blurred
by independent noise, and each row's speedup is over vanilla run with the same seeds as the
vanilla row of its cell.

Parallelism: configurations are cut into chunks; a `ProcessPoolExecutor` runs them, the two
models pickled once per worker (the pool initializer), not once per chunk. With `scheduler`
(an address such as "tcp://10.0.0.5:8786", a `dask.distributed.Client`, or a cluster object
such as `LocalCluster`), the models are scattered to every Dask worker once and the chunks are
mapped over the cluster.
"""

from __future__ import annotations

import itertools
import math
import os
import pickle
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from vegas_sim.errors import UserInputError
from vegas_sim.methods import check_gamma, check_method, check_sparsity

if TYPE_CHECKING:
    from vegas_sim.sim.acceptance import AcceptanceModel
    from vegas_sim.sim.latency import LatencyModel
    from vegas_sim.sim.predict import Scenario

ENGINES = ("analytic", "sim", "both")
Progress = Callable[[int, int], None]  # (configurations done, total)
MAX_CHUNK = 64
CHUNKS_PER_WORKER = 8  # enough chunks per worker for load balance and a smooth progress bar


# ---- the grid --------------------------------------------------------------------------------
@dataclass(frozen=True)
class SweepGrid:
    """The cross product methods × γ × sparsity × batch × context × output_len.

    Vanilla ignores γ and sparsity, so it contributes one configuration per (batch, context,
    output_len) — with `include_vanilla` it is added even when not listed in `methods`, as the
    baseline every speedup refers to. `extra` holds further `Scenario` fields shared by every
    configuration (e.g. {"workload": "code", "temperature": 0.6, "requests": 64}).
    """

    methods: tuple[str, ...] = ("vegas",)
    gamma: tuple[int, ...] = (7,)
    sparsity: tuple[float, ...] = (0.07,)
    batch: tuple[int, ...] = (4,)
    context: tuple[int, ...] = (32768,)
    output_len: tuple[int, ...] = (1024,)
    include_vanilla: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("methods", "gamma", "sparsity", "batch", "context", "output_len"):
            if not getattr(self, name):
                raise UserInputError(f"the sweep grid has no {name}", where=f"--{name}",
                                     fix="give at least one value")
        for m in self.methods:
            check_method(m)
        for g in self.gamma:
            check_gamma(g)
        for s in self.sparsity:
            check_sparsity(s)

    @classmethod
    def parse(cls, *, methods: Sequence[str], gamma: str, sparsity: str, batch: str,
              context: str, output_len: str, include_vanilla: bool = True,
              extra: dict[str, Any] | None = None) -> SweepGrid:
        """Build a grid from CLI grid strings: '2..12', '0.01,0.03', '1K,32K' (`vegas_sim.grids` syntax)."""
        from vegas_sim.grids import (
            parse_int_grid,
            parse_name_list,
            parse_sparsity_grid,
        )
        from vegas_sim.methods import METHODS

        names: list[str] = []
        for text in methods:
            names += [n for n in parse_name_list(text, "--method", METHODS) if n not in names]
        return cls(
            methods=tuple(names), gamma=tuple(parse_int_grid(gamma, "--gamma")),
            sparsity=tuple(parse_sparsity_grid(sparsity, "--sparsity")),
            batch=tuple(parse_int_grid(batch, "--batch")),
            context=tuple(parse_int_grid(context, "--context")),
            output_len=tuple(parse_int_grid(output_len, "--output-len")),
            include_vanilla=include_vanilla, extra=dict(extra or {}),
        )

    def scenarios(self) -> list[Scenario]:
        """Every configuration, in a fixed order: cells (batch, context, output_len) outer,
        then vanilla, then methods × γ × sparsity."""
        from vegas_sim.sim.predict import Scenario

        methods = [m for m in self.methods if m != "vanilla"]
        vanilla = self.include_vanilla or "vanilla" in self.methods
        out: list[Scenario] = []
        for batch, context, out_len in itertools.product(self.batch, self.context,
                                                          self.output_len):
            cell = dict(batch=batch, context=context, output_len=out_len, **self.extra)
            if vanilla:
                out.append(Scenario(method="vanilla", gamma=1, sparsity=1.0, **cell))
            out += [Scenario(method=m, gamma=g, sparsity=s, **cell)
                    for m, g, s in itertools.product(methods, self.gamma, self.sparsity)]
        return out

    def __len__(self) -> int:
        n_spec = len([m for m in self.methods if m != "vanilla"])
        vanilla = int(self.include_vanilla or "vanilla" in self.methods)
        per_cell = vanilla + n_spec * len(self.gamma) * len(self.sparsity)
        return per_cell * len(self.batch) * len(self.context) * len(self.output_len)


# ---- one chunk (runs in a worker) ------------------------------------------------------------
@dataclass(frozen=True)
class _Job:
    engines: tuple[str, ...]
    seed: int
    replications: int


def _engines(engine: str) -> tuple[str, ...]:
    if engine not in ENGINES:
        raise UserInputError(f"unknown engine {engine!r}", where="--engine",
                             fix=f"use one of: {', '.join(ENGINES)}")
    return ("analytic", "sim") if engine == "both" else (engine,)


def run_chunk(chunk: Sequence[tuple[int, Scenario]], latency: LatencyModel,
              acceptance: AcceptanceModel, job: _Job) -> pd.DataFrame:
    """Predict the (order, scenario) pairs of one chunk; adds `_order` and `seed` columns.

    One `predict` call per engine, so vanilla baselines are shared inside the chunk; every
    scenario gets the same base seed, so the rows do not depend on how the grid was cut.
    """
    from vegas_sim.sim.predict import predict

    orders = [order for order, _ in chunk]
    scenarios = [scenario for _, scenario in chunk]
    frames = []
    for engine in job.engines:
        df = predict(scenarios, latency, acceptance, seed=job.seed,
                     replications=job.replications, engine=engine)
        frames.append(df.assign(engine=engine, seed=job.seed, _order=orders))
    return pd.concat(frames, ignore_index=True)


_WORKER_MODELS: tuple[Any, Any] | None = None


def _init_worker(payload: bytes) -> None:
    """Pool initializer: unpickle the models once per worker process."""
    global _WORKER_MODELS
    _WORKER_MODELS = pickle.loads(payload)


def _run_chunk_in_worker(chunk: Sequence[tuple[int, Scenario]], job: _Job) -> pd.DataFrame:
    assert _WORKER_MODELS is not None, "worker started without models"
    return run_chunk(chunk, _WORKER_MODELS[0], _WORKER_MODELS[1], job)


def _chunks(items: list[tuple[int, Scenario]], size: int) -> list[list[tuple[int, Scenario]]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def default_chunk_size(n: int, workers: int) -> int:
    return max(1, min(MAX_CHUNK, math.ceil(n / (max(workers, 1) * CHUNKS_PER_WORKER))))


# ---- runners ---------------------------------------------------------------------------------
class SweepRunner:
    """Runs batches of scenarios on a pool (or cluster) kept open across calls.

    `tune` runs several dependent sweeps; keeping the pool warm avoids paying process start-up
    and model pickling for each. Use as a context manager, or call `close()`.

    workers: local processes (default os.cpu_count(); 1 = in this process, no pool).
    scheduler: None for local; a Dask scheduler address, a `Client`, or a cluster object.
    """

    def __init__(self, latency: LatencyModel, acceptance: AcceptanceModel, *,
                 workers: int | None = None, scheduler: Any = None) -> None:
        self.latency = latency
        self.acceptance = acceptance
        if workers is not None and workers < 1:
            raise UserInputError(f"workers must be >= 1, got {workers}", where="--workers",
                                 fix="pass --workers 1 or more, or leave it out for all cores")
        self.workers = workers if workers is not None else (os.cpu_count() or 1)
        self._pool: ProcessPoolExecutor | None = None
        self._client: Any = None
        self._owns_client = False
        self._scattered: tuple[Any, Any] | None = None
        if scheduler is not None:
            self._client, self._owns_client = _dask_client(scheduler)

    def __enter__(self) -> SweepRunner:  # noqa: PYI034 - not subclassed
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._client is not None and self._owns_client:
            self._client.close()
        self._client = None

    def run(self, scenarios: Sequence[Scenario], *, engine: str = "analytic", seed: int = 0,
            replications: int = 5, progress: Progress | None = None,
            chunk_size: int | None = None) -> pd.DataFrame:
        """Predict every scenario; rows in the order of `scenarios` (engine analytic before sim)."""
        job = _Job(_engines(engine), int(seed), int(replications))
        items = list(enumerate(scenarios))
        if not items:
            raise UserInputError("nothing to sweep: the grid is empty", fix="give grid values")
        size = chunk_size or default_chunk_size(len(items), self._parallelism())
        chunks = _chunks(items, size)
        if self._client is not None:
            frames = self._run_dask(chunks, job, len(items), progress)
        elif self.workers == 1 or len(chunks) == 1:
            frames = list(self._run_here(chunks, job, len(items), progress))
        else:
            frames = self._run_pool(chunks, job, len(items), progress)
        return _assemble(frames, job.engines)

    def _parallelism(self) -> int:
        if self._client is not None:
            return max(1, sum(self._client.nthreads().values()))
        return self.workers

    def _run_here(self, chunks: list[list[tuple[int, Scenario]]], job: _Job, total: int,
                  progress: Progress | None) -> Iterator[pd.DataFrame]:
        done = 0
        for chunk in chunks:
            yield run_chunk(chunk, self.latency, self.acceptance, job)
            done += len(chunk)
            if progress:
                progress(done, total)

    def _run_pool(self, chunks: list[list[tuple[int, Scenario]]], job: _Job, total: int,
                  progress: Progress | None) -> list[pd.DataFrame]:
        if self._pool is None:
            payload = pickle.dumps((self.latency, self.acceptance))
            self._pool = ProcessPoolExecutor(max_workers=min(self.workers, len(chunks)),
                                             initializer=_init_worker, initargs=(payload,))
        sizes: dict[Future[pd.DataFrame], int] = {
            self._pool.submit(_run_chunk_in_worker, c, job): len(c) for c in chunks}
        return _gather(sizes, total, progress)

    def _run_dask(self, chunks: list[list[tuple[int, Scenario]]], job: _Job, total: int,
                  progress: Progress | None) -> list[pd.DataFrame]:
        from dask.distributed import as_completed

        client = self._client
        if self._scattered is None:
            lat, acc = client.scatter([self.latency, self.acceptance], broadcast=True)
            self._scattered = (lat, acc)
        lat_f, acc_f = self._scattered
        futures = client.map(run_chunk, chunks, latency=lat_f, acceptance=acc_f, job=job,
                             pure=False)
        sizes = {f.key: len(c) for f, c in zip(futures, chunks)}
        frames, done = [], 0
        for fut in as_completed(futures):
            frames.append(fut.result())
            done += sizes[fut.key]
            if progress:
                progress(done, total)
        return frames


def _gather(sizes: dict[Future[pd.DataFrame], int], total: int,
            progress: Progress | None) -> list[pd.DataFrame]:
    frames, done, pending = [], 0, set(sizes)
    try:
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                frames.append(fut.result())  # re-raises a worker's UserInputError here
                done += sizes[fut]
                if progress:
                    progress(done, total)
    finally:
        for fut in pending:
            fut.cancel()
    return frames


def _dask_client(scheduler: Any) -> tuple[Any, bool]:
    """(client, owned) for an address, a Client, or a cluster object."""
    try:
        from dask.distributed import Client
    except ImportError:
        raise UserInputError("--scheduler needs Dask distributed", where="--scheduler",
                             fix="pip install 'vegas-sim[dask]'") from None
    if isinstance(scheduler, Client):
        return scheduler, False
    if isinstance(scheduler, str) or hasattr(scheduler, "scheduler_address"):
        try:
            return Client(scheduler, timeout="10s"), True
        except (OSError, ValueError, TypeError) as e:  # unreachable, or not an address
            raise UserInputError(f"cannot reach the Dask scheduler {scheduler!r}: {e}",
                                 where="--scheduler",
                                 fix="start one with `dask scheduler` and pass its tcp:// "
                                     "address") from None
    raise UserInputError(f"cannot use {type(scheduler).__name__} as a scheduler",
                         where="--scheduler", fix="pass an address, a Client or a cluster")


def _assemble(frames: Iterable[pd.DataFrame], engines: tuple[str, ...]) -> pd.DataFrame:
    df = pd.concat(list(frames), ignore_index=True)
    rank = {e: i for i, e in enumerate(engines)}
    df = df.assign(_engine_rank=df["engine"].map(rank))
    df = df.sort_values(["_order", "_engine_rank"], kind="stable")
    return df.drop(columns=["_order", "_engine_rank"]).reset_index(drop=True)


# ---- the public function ---------------------------------------------------------------------
def sweep(
    grid: SweepGrid | Sequence[Scenario],
    latency: LatencyModel,
    acceptance: AcceptanceModel,
    *,
    engine: str = "analytic",
    seed: int = 0,
    replications: int = 5,
    workers: int | None = None,
    scheduler: Any = None,
    progress: Progress | None = None,
    chunk_size: int | None = None,
) -> pd.DataFrame:
    """Predict every configuration of `grid`; one tidy row per (configuration, engine).

    engine: "analytic" (closed form, fast), "sim" (SimPy engine with `replications` for the
    CIs) or "both" (two rows per configuration, `engine` column tells them apart).
    workers: local processes (default all cores; 1 runs here). scheduler: Dask address /
    Client / cluster (then `workers` is ignored). progress(done, total) is called as chunks
    finish. Writing the table is the caller's (`reports.csv.write_table`).

    Configurations the model or the GPU cannot hold (context + output past the model's
    positions, a batch whose KV cache does not fit) are left out, one line per cell in
    ``table.attrs["skipped"]``; a grid in which nothing fits raises.
    """
    from vegas_sim.sim.predict import skipped_notes, split_fitting

    scenarios = grid.scenarios() if isinstance(grid, SweepGrid) else list(grid)
    scenarios, skipped = split_fitting(scenarios, latency)
    with SweepRunner(latency, acceptance, workers=workers, scheduler=scheduler) as runner:
        table = runner.run(scenarios, engine=engine, seed=seed, replications=replications,
                           progress=progress, chunk_size=chunk_size)
    table.attrs["skipped"] = skipped_notes(skipped)
    return table
