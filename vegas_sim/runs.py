"""Sweeps written to a file that survive an interrupt and resume.

`sweep_to_file` streams a grid through `SweepRunner.imap` and checkpoints the finished chunks
in `<out>.partial/` beside the output, so what was computed is never lost:

- `manifest.json`: the run's identity (a hash of the grid, the engine, the seed, the
  replications and the fitted models), the chunk size, and a readable description;
- `segment-NNNNNN.parquet`: finished chunks' rows, as `predict` returns them plus `_order`
  (the configuration's place among the grid's fitting configurations) and `_chunk`, flushed
  every `FLUSH_S` seconds or `FLUSH_ROWS` rows, each file written atomically.

When the grid is done, the table is assembled from the segments in grid order, written to
`--out` atomically (rows identical to an uninterrupted in-memory sweep: chunking never
changes a row), and the checkpoint is removed. On Ctrl-C or SIGTERM the workers are killed,
the buffered chunks are flushed, the complete rows so far are written to `--out` as a partial
table (every row's `partial` column says how far it got; a complete table has no such column),
and `SweepInterrupted` says how far it got. The same command again resumes: chunks
already in the checkpoint are not run again. A different grid, seed, engine or trace set for
the same `--out` is refused (its rows would not belong to one table).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from vegas_sim.errors import UserInputError
from vegas_sim.files import output_lock, write_atomic, write_json
from vegas_sim.progress import Progress, Say
from vegas_sim.reports.csv import PARTIAL_COLUMN, table_format, write_json_doc, write_table
from vegas_sim.sim.options import option_texts
from vegas_sim.sim.scenario import SkipLog
from vegas_sim.sim.sweep import (
    Estimate,
    SweepGrid,
    SweepRunner,
    assemble,
    chunked,
    default_chunk_size,
    engines_of,
    fitting,
)

CHECKPOINT_VERSION = 1
FLUSH_S = 5.0  # a hard kill (SIGKILL, power loss) loses at most this much finished work
FLUSH_ROWS = 20_000
ESTIMATE_OVER_S = 60.0  # say how long a grid will take when it is longer than this
SAMPLE = 16  # configurations timed for the estimate
MANIFEST = "manifest.json"
TIMING = ("wall_s",)  # columns that differ between identical runs


class SweepInterrupted(Exception):
    """Ctrl-C or SIGTERM stopped a sweep; `out` holds its `done` of `total` configurations."""

    def __init__(self, out: Path, done: int, total: int, checkpoint: Path) -> None:
        super().__init__(f"interrupted after {done} of {total} configurations")
        self.out, self.done, self.total, self.checkpoint = out, done, total, checkpoint

    def message(self) -> str:
        if self.done == 0:
            return (f"interrupted before the first of {self.total} configurations finished: "
                    "nothing written")
        return (f"interrupted: wrote {self.out} with the {self.done} of {self.total} "
                f"configurations finished (a partial table); run the same command again to "
                f"resume from {self.checkpoint}/")


@dataclass
class SweepFile:
    """A finished sweep: its table (as written), notes, and how much came from a checkpoint."""

    table: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    resumed: int = 0  # configurations taken from an earlier, interrupted run


def checkpoint_dir(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def run_key(grid: SweepGrid, fingerprint: pd.DataFrame, *, engine: str, seed: int,
            replications: int) -> str:
    """What makes two runs' rows belong to one table: the grid, engine, seed, replications,
    and the models, fingerprinted by rows predicted with them (`SweepRunner.timed_sample`):
    another trace set or fit predicts other numbers."""
    rows = fingerprint.drop(columns=[c for c in TIMING if c in fingerprint.columns])
    h = hashlib.sha256()
    grid_texts = asdict(replace(grid, extra=option_texts(grid.extra)))
    h.update(json.dumps({"version": CHECKPOINT_VERSION, "grid": grid_texts, "engine": engine,
                         "seed": seed, "replications": replications},
                        sort_keys=True, default=str).encode())
    h.update(rows.to_csv(index=False).encode())
    return h.hexdigest()


class Checkpoint:
    """The finished chunks of one run, on disk in `directory` (see the module docstring)."""

    def __init__(self, directory: Path, key: str, chunk_size: int) -> None:
        self.directory, self.key, self.chunk_size = directory, key, chunk_size
        self._buffer: list[pd.DataFrame] = []
        self._buffered_rows = 0
        self._flushed_at = time.monotonic()
        self.done_chunks: set[int] = set()
        self.done_rows = 0
        self._next_segment = 0

    @classmethod
    def open(cls, out: Path, key: str, chunk_size: int, description: dict[str, Any],
             ) -> Checkpoint:
        """The checkpoint of this run: resumed when `out` has one with the same key, new when
        it has none; one of another run is refused."""
        directory = checkpoint_dir(out)
        manifest = directory / MANIFEST
        if manifest.is_file():
            try:
                old = json.loads(manifest.read_text())
            except (OSError, ValueError) as e:
                raise _unusable(directory, f"its manifest cannot be read: {e}") from None
            if old.get("key") != key:
                raise UserInputError(
                    f"{directory} holds an interrupted sweep of another grid, seed, engine or "
                    f"trace set ({_describe(old.get('description', {}))})", where="--out",
                    fix=f"run that sweep's command again to finish it, choose another --out, "
                        f"or delete {directory} to start this one over")
            ckpt = cls(directory, key, int(old["chunk_size"]))
            ckpt._load()
            return ckpt
        if directory.exists() and any(directory.iterdir()):
            raise _unusable(directory, "it has no manifest")
        directory.mkdir(parents=True, exist_ok=True)
        write_json(manifest, {"key": key, "chunk_size": chunk_size,
                              "version": CHECKPOINT_VERSION, "description": description})
        return cls(directory, key, chunk_size)

    def _segments(self) -> list[Path]:
        return sorted(self.directory.glob("segment-*.parquet"))

    def _load(self) -> None:
        for path in self._segments():
            try:
                chunks = pd.read_parquet(path, columns=["_chunk"])["_chunk"]
            except Exception as e:  # noqa: BLE001 - pyarrow raises many types for a bad file
                raise _unusable(self.directory, f"{path.name} cannot be read: {e}") from None
            self.done_chunks |= {int(c) for c in chunks.unique()}
            self.done_rows += len(chunks)
            self._next_segment = max(self._next_segment, int(path.stem.split("-")[1]) + 1)

    def add(self, chunk: int, frame: pd.DataFrame) -> None:
        """Keep one finished chunk; written out every FLUSH_S seconds or FLUSH_ROWS rows."""
        self._buffer.append(frame.assign(_chunk=chunk))
        self._buffered_rows += len(frame)
        self.done_chunks.add(chunk)
        self.done_rows += len(frame)
        if (self._buffered_rows >= FLUSH_ROWS
                or time.monotonic() - self._flushed_at >= FLUSH_S):
            self.flush()

    def flush(self) -> None:
        self._flushed_at = time.monotonic()
        if not self._buffer:
            return
        frame = pd.concat(self._buffer, ignore_index=True)
        path = self.directory / f"segment-{self._next_segment:06d}.parquet"
        write_atomic(path, lambda tmp: frame.to_parquet(tmp, index=False))
        self._next_segment += 1
        self._buffer, self._buffered_rows = [], 0

    def table(self, engines: tuple[str, ...]) -> pd.DataFrame | None:
        """Every finished row, in grid order (None before the first chunk finished)."""
        frames = [pd.read_parquet(p) for p in self._segments()]
        if not frames:
            return None
        return assemble(frames, engines).drop(columns=["_chunk"])

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def _unusable(directory: Path, why: str) -> UserInputError:
    return UserInputError(f"{directory} is not a usable sweep checkpoint: {why}",
                          where="--out", fix=f"delete {directory} to start the sweep over")


def _describe(description: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in description.items()) or "no description"


def write_result(table: pd.DataFrame, out: Path, notes: list[str]) -> Path:
    """The table to `out`: CSV or Parquet flat (`write_table`), JSON as predict writes it,
    {"notes": [...], "rows": [...]}."""
    if out.suffix.lower() == ".json":
        return write_json_doc({"notes": notes,
                               "rows": json.loads(table.to_json(orient="records"))}, out)
    table_format(out)
    return write_table(table, out)


def sweep_to_file(grid: SweepGrid, latency: Any, acceptance: Any, out: Path, *,
                  engine: str = "analytic", seed: int = 0, replications: int = 5,
                  workers: int | None = None, scheduler: Any = None,
                  progress: Progress | None = None, say: Say | None = None,
                  notes: tuple[str, ...] = ()) -> SweepFile:
    """Sweep `grid` into `out` (*.csv, *.parquet or *.json), checkpointed and resumable (see
    the module docstring). `progress(done, total)` is called at once and as chunks finish;
    `say` gets the time estimate of a grid longer than a minute and the resume line.
    Raises SweepInterrupted on Ctrl-C (KeyboardInterrupt) after writing the partial table.
    `out` and its checkpoint have one writer: a second sweep to it is a UserInputError
    naming the first (`files.output_lock`)."""
    with output_lock(out):
        return _sweep_locked(grid, latency, acceptance, out, engine=engine, seed=seed,
                             replications=replications, workers=workers, scheduler=scheduler,
                             progress=progress, say=say, notes=notes)


def _sweep_locked(grid: SweepGrid, latency: Any, acceptance: Any, out: Path, *, engine: str,
                  seed: int, replications: int, workers: int | None, scheduler: Any,
                  progress: Progress | None, say: Say | None,
                  notes: tuple[str, ...]) -> SweepFile:
    run = _FileSweep(grid, latency, acceptance, out, engine=engine, seed=seed,
                     replications=replications, notes=notes)
    try:
        with SweepRunner(latency, acceptance, workers=workers, scheduler=scheduler) as runner:
            run.execute(runner, progress, say)
    except KeyboardInterrupt:
        raise run.interrupted() from None
    except BaseException:
        if run.ckpt is not None and run.ckpt.done_rows == 0:
            run.ckpt.remove()  # nothing to resume: leave no checkpoint in the way
        raise
    return run.finish()


class _FileSweep:
    """One `sweep_to_file` run: its checkpoint, what was skipped, and how it ends."""

    def __init__(self, grid: SweepGrid, latency: Any, acceptance: Any, out: Path, *,
                 engine: str, seed: int, replications: int, notes: tuple[str, ...]) -> None:
        self.grid, self.latency, self.acceptance, self.out = grid, latency, acceptance, out
        self.engine, self.seed, self.replications = engine, seed, replications
        self.engines = engines_of(engine)
        self.notes = notes
        self.skipped = SkipLog()
        self.ckpt: Checkpoint | None = None
        self.resumed = 0

    def total(self) -> int:
        """Configurations that fit (exact once the whole grid has streamed past)."""
        return len(self.grid) - self.skipped.count

    def done(self) -> int:
        return 0 if self.ckpt is None else self.ckpt.done_rows // len(self.engines)

    def _open(self, runner: SweepRunner, say: Say | None) -> Checkpoint:
        sample = [sc for _, sc in fitting(self.grid.sample(SAMPLE), self.latency, SkipLog())]
        per_config, fingerprint = runner.timed_sample(
            sample, engine=self.engine, seed=self.seed, replications=self.replications)
        key = run_key(self.grid, fingerprint, engine=self.engine, seed=self.seed,
                      replications=self.replications)
        description = {"configurations": len(self.grid), "engine": self.engine,
                       "seed": self.seed, "replications": self.replications,
                       "model": self.latency.model.name}
        self.ckpt = Checkpoint.open(self.out, key, default_chunk_size(len(self.grid),
                                                                      runner.parallelism),
                                    description)
        self.resumed = self.done()
        if say and self.resumed:
            say(f"resuming {self.ckpt.directory}/: {self.resumed} configurations already done")
        estimate = Estimate(len(self.grid) - self.resumed, per_config, runner.parallelism)
        if say and estimate.seconds > ESTIMATE_OVER_S:
            say(f"{estimate}; Ctrl-C stops it and keeps the finished rows")
        return self.ckpt

    def execute(self, runner: SweepRunner, progress: Progress | None, say: Say | None) -> None:
        if progress:
            progress(0, self.total())
        ckpt = self._open(runner, say)
        if progress and self.resumed:
            progress(self.resumed, self.total())
        stream = fitting(self.grid.iter_scenarios(), self.latency, self.skipped)
        chunks = ((k, c) for k, c in enumerate(chunked(stream, ckpt.chunk_size))
                  if k not in ckpt.done_chunks)
        for k, frame in runner.imap(chunks, engine=self.engine, seed=self.seed,
                                    replications=self.replications):
            ckpt.add(k, frame)
            if progress:
                progress(self.done(), self.total())

    def interrupted(self) -> SweepInterrupted:
        """After Ctrl-C (the workers are already stopped): the partial table, if any."""
        directory = checkpoint_dir(self.out)
        if self.ckpt is not None:
            _write_partial(self.ckpt, self.engines, self.out,
                           [*self.skipped.notes(), *self.notes], self.total())
        return SweepInterrupted(self.out, self.done(), self.total(), directory)

    def finish(self) -> SweepFile:
        assert self.ckpt is not None
        self.ckpt.flush()
        table = self.ckpt.table(self.engines)
        assert table is not None, "a finished sweep has rows"  # fitting() raised otherwise
        notes = [*self.skipped.notes(), *self.notes]
        table.attrs["skipped"] = self.skipped.notes()
        write_result(table, self.out, notes)
        self.ckpt.remove()
        return SweepFile(table=table, notes=notes, resumed=self.resumed)


def _write_partial(ckpt: Checkpoint, engines: tuple[str, ...], out: Path, notes: list[str],
                   total: int) -> None:
    ckpt.flush()
    table = ckpt.table(engines)
    if table is None:
        ckpt.remove()
        return
    done = len(table) // len(engines)
    partial = (f"interrupted after {done} of {total} configurations; run the same command "
               "again to resume")
    write_result(table.assign(**{PARTIAL_COLUMN: partial}), out,
                 [f"partial: {partial}", *notes])

