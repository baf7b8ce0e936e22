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

Long grids: `SweepGrid.iter_scenarios` streams the configurations, `fitting` drops those that do
not fit as they pass, `chunked` cuts the stream, and `SweepRunner.imap` runs the chunks with at
most `INFLIGHT_PER_WORKER` chunks per worker submitted at a time, yielding each as it finishes,
so memory and the parent's bookkeeping stay flat whatever the grid's size. Whoever consumes
`imap` decides what to keep (`vegas_sim.runs` checkpoints the chunks to disk). An exception
in the consumer, Ctrl-C included, leaves the `with SweepRunner` block through `terminate`: the
queued chunks are cancelled and the worker processes are killed, not waited for. Workers
ignore SIGINT (the parent alone handles it) and, on Linux, die with their parent.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import os
import pickle
import signal
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pandas as pd

from vegas_sim.errors import DoesNotFitError, UserInputError
from vegas_sim.bounds import check_grid
from vegas_sim.grids import parse_int_grid, parse_name_list, parse_sparsity_grid
from vegas_sim.methods import (
    METHODS,
    VANILLA,
    check_gamma,
    check_method,
    check_sparsity,
    drafts,
    point_of,
)
from vegas_sim.progress import Progress
from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.latency import LatencyModel
from vegas_sim.sim.predict import predict
from vegas_sim.sim.scenario import (
    Scenario,
    SkipLog,
    gpu_memory,
    skipped_notes,
    split_fitting,
    validate_scenario,
    weight_format_of,
)

ENGINES = ("analytic", "sim", "both")
MAX_CHUNK = 64
CHUNKS_PER_WORKER = 8  # enough chunks per worker for load balance and a smooth progress bar
INFLIGHT_PER_WORKER = 2  # chunks submitted ahead per worker: one running, one queued
# The longest the consumer blocks at a time: a process-directed SIGINT may land on one of the
# pool's threads, and Python raises KeyboardInterrupt in the main thread only once it wakes;
# an untimed wait would wake only when a chunk finishes.
SIGNAL_POLL_S = 0.2
Item = tuple[int, Scenario]  # (position in the run, configuration)
K = TypeVar("K")


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
        check_grid("batch", self.batch)
        check_grid("output_len", self.output_len)

    @classmethod
    def parse(cls, *, methods: Sequence[str], gamma: str, sparsity: str, batch: str,
              context: str, output_len: str, include_vanilla: bool = True,
              extra: dict[str, Any] | None = None) -> SweepGrid:
        """Build a grid from CLI grid strings: '2..12', '0.01,0.03', '1K,32K' (`vegas_sim.grids` syntax)."""
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
        return list(self.iter_scenarios())

    def iter_scenarios(self) -> Iterator[Scenario]:
        """`scenarios()` one at a time (a grid of millions need not be held at once)."""
        for cell in itertools.product(self.batch, self.context, self.output_len):
            yield from (self._in_cell(cell, j) for j in range(self._per_cell()))

    def sample(self, n: int) -> list[Scenario]:
        """`n` configurations spread evenly over the grid (for a time estimate)."""
        total = len(self)
        picks = sorted({min(total - 1, round(i * total / max(n, 1))) for i in range(n)})
        per_cell = self._per_cell()
        cells = list(itertools.product(self.batch, self.context, self.output_len))
        return [self._in_cell(cells[i // per_cell], i % per_cell) for i in picks]

    def _spec_methods(self) -> list[str]:
        return [m for m in self.methods if drafts(m)]

    def _has_vanilla(self) -> bool:
        return self.include_vanilla or VANILLA in self.methods

    def _per_cell(self) -> int:
        return int(self._has_vanilla()) + (len(self._spec_methods()) * len(self.gamma)
                                           * len(self.sparsity))

    def _in_cell(self, cell: tuple[int, int, int], j: int) -> Scenario:
        """The j-th configuration of a (batch, context, output_len) cell."""
        where = dict(batch=cell[0], context=cell[1], output_len=cell[2], **self.extra)
        if self._has_vanilla():
            if j == 0:
                gamma, sparsity = point_of(VANILLA, 1, 1.0)
                return Scenario(method=VANILLA, gamma=gamma, sparsity=sparsity, **where)
            j -= 1
        n_g, n_s = len(self.gamma), len(self.sparsity)
        m, rest = divmod(j, n_g * n_s)
        g, s = divmod(rest, n_s)
        return Scenario(method=self._spec_methods()[m], gamma=self.gamma[g],
                        sparsity=self.sparsity[s], **where)

    def __len__(self) -> int:
        return self._per_cell() * len(self.batch) * len(self.context) * len(self.output_len)


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


def run_chunk(chunk: Sequence[Item], latency: LatencyModel,
              acceptance: AcceptanceModel, job: _Job,
              baselines: dict[tuple[Any, ...], Any] | None = None) -> pd.DataFrame:
    """Predict the (order, scenario) pairs of one chunk; adds `_order` and `seed` columns.

    One `predict` call per engine, so vanilla baselines are shared inside the chunk, and with
    the process's earlier chunks through `baselines` (a runner's, or a worker's); every
    scenario gets the same base seed, so the rows do not depend on how the grid was cut.
    """
    orders = [order for order, _ in chunk]
    scenarios = [scenario for _, scenario in chunk]
    frames = []
    for engine in job.engines:
        df = predict(scenarios, latency, acceptance, seed=job.seed,
                     replications=job.replications, engine=engine, baselines=baselines)
        frames.append(df.assign(engine=engine, seed=job.seed, _order=orders))
    return pd.concat(frames, ignore_index=True)


_WORKER_MODELS: tuple[Any, Any] | None = None
_WORKER_BASELINES: dict[tuple[Any, ...], Any] = {}  # a worker's vanilla baselines (its models')


_PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


def _init_worker(payload: bytes) -> None:
    """Pool initializer: unpickle the models once per worker process. The worker ignores
    SIGINT (Ctrl-C reaches the whole process group; the parent decides), takes SIGTERM's
    default (a forked worker would inherit a handler the parent installed) and, on Linux, is
    killed when its parent dies, so a killed sweep leaves no orphan."""
    global _WORKER_MODELS
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        parent = os.getppid()
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):  # no libc prctl: orphans stay possible
            pass
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
    _WORKER_MODELS = pickle.loads(payload)
    _WORKER_BASELINES.clear()  # baselines of these models only


def _run_chunk_in_worker(chunk: Sequence[Item], job: _Job) -> pd.DataFrame:
    assert _WORKER_MODELS is not None, "worker started without models"
    return run_chunk(chunk, _WORKER_MODELS[0], _WORKER_MODELS[1], job, _WORKER_BASELINES)


def fitting(scenarios: Iterable[Scenario], latency: LatencyModel,
            skipped: SkipLog) -> Iterator[Item]:
    """The scenarios that fit the model and the GPU, numbered 0, 1, ... in order; the others
    go to `skipped` as they pass. Any other bad input raises; so does a stream in which
    nothing fits (at its end)."""
    mem = gpu_memory(latency)
    order = 0
    for sc in scenarios:
        try:
            validate_scenario(sc, latency.gpu_model, mem, weight_format_of(latency))
        except DoesNotFitError as e:
            skipped.add(sc, e)
            continue
        yield order, sc
        order += 1
    first = skipped.first_error()
    if order == 0 and first is not None:
        raise first


def chunked(items: Iterable[Item], size: int) -> Iterator[list[Item]]:
    """Consecutive chunks of `size` items (the last may be shorter), read lazily."""
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def default_chunk_size(n: int, workers: int) -> int:
    return max(1, min(MAX_CHUNK, math.ceil(n / (max(workers, 1) * CHUNKS_PER_WORKER))))


# ---- runners ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Estimate:
    """How long a run will take: configurations to go, seconds per configuration measured on
    a sample in this process, and the parallelism they are spread over."""

    configurations: int
    seconds_per_config: float
    workers: int

    @property
    def seconds(self) -> float:
        return self.configurations * self.seconds_per_config / max(self.workers, 1)

    def __str__(self) -> str:
        return (f"{self.configurations} configurations, ~{_duration(self.seconds)} on "
                f"{self.workers} worker{'s' if self.workers != 1 else ''} "
                f"({self.seconds_per_config * 1e3:.1f} ms each, timed on a sample)")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class SweepRunner:
    """Runs batches of scenarios on a pool (or cluster) kept open across calls.

    `tune` runs several dependent sweeps; keeping the pool warm avoids paying process start-up
    and model pickling for each. Use as a context manager, or call `close()`; leaving the
    block by an exception (Ctrl-C included) calls `terminate()` instead of waiting.

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
        # vanilla baselines of the chunks run in this process, shared across them and runs
        self._baselines: dict[tuple[Any, ...], Any] = {}
        if scheduler is not None:
            self._client, self._owns_client = _dask_client(scheduler)

    def __enter__(self) -> SweepRunner:  # noqa: PYI034 - not subclassed
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.terminate()

    def close(self) -> None:
        """Wait for the pool's workers to exit (nothing is running between `run` calls)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._close_client()

    def terminate(self) -> None:
        """Stop now: cancel queued chunks, kill the worker processes, wait for nothing else."""
        pool, self._pool = self._pool, None
        if pool is not None:
            # The executor has no public handle on its processes; without them nothing is
            # killed and the workers exit when their queued chunk is done.
            procs = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            _kill(procs)
        self._close_client()

    def _close_client(self) -> None:
        if self._client is not None and self._owns_client:
            self._client.close()
        self._client = None

    @property
    def parallelism(self) -> int:
        """Chunks that run at once: local workers, or the Dask cluster's threads."""
        if self._client is not None:
            return max(1, sum(self._client.nthreads().values()))
        return self.workers

    def run(self, scenarios: Sequence[Scenario], *, engine: str = "analytic", seed: int = 0,
            replications: int = 5, progress: Progress | None = None,
            chunk_size: int | None = None) -> pd.DataFrame:
        """Predict every scenario; rows in the order of `scenarios` (engine analytic before sim)."""
        engines = _engines(engine)
        items = list(enumerate(scenarios))
        if not items:
            raise UserInputError("nothing to sweep: the grid is empty", fix="give grid values")
        size = chunk_size or default_chunk_size(len(items), self.parallelism)
        frames, done = [], 0
        for _, frame in self.imap(enumerate(chunked(items, size)), engine=engine, seed=seed,
                                  replications=replications):
            frames.append(frame)
            done += len(frame) // len(engines)
            if progress:
                progress(done, len(items))
        return assemble(frames, engines)

    def imap(self, chunks: Iterable[tuple[K, Sequence[Item]]], *, engine: str = "analytic",
             seed: int = 0, replications: int = 5) -> Iterator[tuple[K, pd.DataFrame]]:
        """Run (key, chunk) pairs; yields (key, rows with `_order`) as each chunk finishes, in
        finishing order. At most `INFLIGHT_PER_WORKER` chunks per worker are submitted ahead,
        so a stream of any length costs bounded memory."""
        job = _Job(_engines(engine), int(seed), int(replications))
        it = iter(chunks)
        ahead = list(itertools.islice(it, INFLIGHT_PER_WORKER * self.parallelism + 1))
        if self._client is not None:
            yield from self._imap_dask(itertools.chain(ahead, it), job)
        elif self.workers == 1 or len(ahead) <= 1:
            for key, chunk in itertools.chain(ahead, it):
                yield key, run_chunk(chunk, self.latency, self.acceptance, job, self._baselines)
        else:
            yield from self._imap_pool(itertools.chain(ahead, it), job, len(ahead))

    def timed_sample(self, sample: Sequence[Scenario], *, engine: str = "analytic",
                     seed: int = 0, replications: int = 5, budget_s: float = 1.0,
                     at_least: int = 2) -> tuple[float, pd.DataFrame]:
        """(seconds per configuration, the rows of the first `at_least`) timed here on
        `sample`, one at a time, stopping once `budget_s` is spent after the first
        `at_least` (a slow engine is timed on fewer). Those first rows fingerprint the
        models: the same models and seed give the same rows. The configurations share the
        runner's vanilla baselines, as a run's chunks do, and the first of each (batch,
        context) is not timed where others are: it pays that point's one-time work (its
        baselines, the process's warm-up), which a run pays once per point and worker:
        timed as a configuration, it would put a long analytic run's estimate at many times
        its length."""
        job = _Job(_engines(engine), int(seed), int(replications))
        start, frames, spent, seen = time.perf_counter(), [], [], set()
        for i, sc in enumerate(sample):
            t0 = time.perf_counter()
            frame = run_chunk([(i, sc)], self.latency, self.acceptance, job, self._baselines)
            point = (sc.batch, sc.context)
            spent.append((point in seen, time.perf_counter() - t0))
            seen.add(point)
            if i < at_least:
                frames.append(frame)
            elif time.perf_counter() - start > budget_s:
                break
        timed = [s for warm, s in spent if warm] or [s for _, s in spent]
        rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        return (sum(timed) / len(timed) if timed else 0.0), rows

    def estimate(self, sample: Sequence[Scenario], configurations: int, *,
                 engine: str = "analytic", seed: int = 0, replications: int = 5) -> Estimate:
        """The time `configurations` like `sample` will take on this runner."""
        per, _ = self.timed_sample(sample, engine=engine, seed=seed, replications=replications)
        return Estimate(configurations, per, self.parallelism)

    def _imap_pool(self, chunks: Iterator[tuple[K, Sequence[Item]]], job: _Job,
                   first: int) -> Iterator[tuple[K, pd.DataFrame]]:
        if self._pool is None:
            payload = pickle.dumps((self.latency, self.acceptance))
            self._pool = ProcessPoolExecutor(max_workers=min(self.workers, first),
                                             initializer=_init_worker, initargs=(payload,))
        pool, limit = self._pool, INFLIGHT_PER_WORKER * self.workers
        pending: dict[Future[pd.DataFrame], K] = {}
        try:
            for key, chunk in itertools.islice(chunks, limit):
                pending[pool.submit(_run_chunk_in_worker, chunk, job)] = key
            while pending:
                finished, _ = wait(pending, timeout=SIGNAL_POLL_S, return_when=FIRST_COMPLETED)
                for fut in finished:
                    key = pending.pop(fut)
                    yield key, fut.result()  # re-raises a worker's UserInputError here
                for key, chunk in itertools.islice(chunks, len(finished)):
                    pending[pool.submit(_run_chunk_in_worker, chunk, job)] = key
        finally:
            for fut in pending:
                fut.cancel()

    def _imap_dask(self, chunks: Iterator[tuple[K, Sequence[Item]]],
                   job: _Job) -> Iterator[tuple[K, pd.DataFrame]]:
        from dask.distributed import as_completed

        client = self._client
        if self._scattered is None:
            lat, acc = client.scatter([self.latency, self.acceptance], broadcast=True)
            self._scattered = (lat, acc)
        lat_f, acc_f = self._scattered
        pending: dict[str, tuple[K, Any]] = {}
        queue = as_completed()

        def submit(key: K, chunk: Sequence[Item]) -> None:
            fut = client.submit(run_chunk, chunk, latency=lat_f, acceptance=acc_f, job=job,
                                pure=False)
            pending[fut.key] = (key, fut)
            queue.add(fut)

        try:
            for key, chunk in itertools.islice(chunks, INFLIGHT_PER_WORKER * self.parallelism):
                submit(key, chunk)
            for fut in queue:
                key, _ = pending.pop(fut.key)
                yield key, fut.result()
                for key, chunk in itertools.islice(chunks, 1):
                    submit(key, chunk)
        finally:
            if pending:
                client.cancel([fut for _, fut in pending.values()])


def _kill(procs: Sequence[Any], grace_s: float = 2.0) -> None:
    """SIGTERM the processes, then SIGKILL those still alive after `grace_s`; reap them all."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(1.0)


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


def assemble(frames: Iterable[pd.DataFrame], engines: tuple[str, ...]) -> pd.DataFrame:
    """Chunks' rows (with `_order`) as one table in run order, engines in `engines` order."""
    df = pd.concat(list(frames), ignore_index=True)
    rank = {e: i for i, e in enumerate(engines)}
    df = df.assign(_engine_rank=df["engine"].map(rank))
    df = df.sort_values(["_order", "_engine_rank"], kind="stable")
    return df.drop(columns=["_order", "_engine_rank"]).reset_index(drop=True)


def engines_of(engine: str) -> tuple[str, ...]:
    """The engines a run with `engine` ("analytic", "sim" or "both") writes rows for."""
    return _engines(engine)


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
    scenarios = grid.scenarios() if isinstance(grid, SweepGrid) else list(grid)
    scenarios, skipped = split_fitting(scenarios, latency)
    with SweepRunner(latency, acceptance, workers=workers, scheduler=scheduler) as runner:
        table = runner.run(scenarios, engine=engine, seed=seed, replications=replications,
                           progress=progress, chunk_size=chunk_size)
    table.attrs["skipped"] = skipped_notes(skipped)
    return table
