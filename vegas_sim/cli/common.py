"""Shared pieces of the command line: user errors → exit 1, one-value options, progress."""

from __future__ import annotations

import importlib
import signal
import threading
from types import ModuleType
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

from vegas_sim.errors import UserInputError
from vegas_sim.grids import one_int, one_sparsity
from vegas_sim.progress import LabelledProgress, Progress, StepProgress
from vegas_sim.sim.options import OPTIONS, Option, options_for



@contextmanager
def user_errors() -> Iterator[None]:
    """Turn library errors a user can fix into a clean message and exit status 1."""
    try:
        yield
    except UserInputError as e:
        raise click.ClickException(e.message()) from None


GPU_PACKAGES = ("torch", "triton", "gguf", "tokenizers")  # pyproject's `gpu` extra


def gpu_import(command: str, module: str) -> ModuleType:
    """Import `module` of the GPU half for `command`, or a UserInputError saying how to install
    the `gpu` extra when one of its packages is missing (a CPU-only install)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in GPU_PACKAGES:
            raise
        raise UserInputError(f"{command} measures on a GPU and needs {e.name}, which is not "
                             "installed", where=command,
                             fix="pip install 'vegas-sim[gpu]' (torch, triton, gguf, "
                                 "tokenizers; docs/INSTALL.md)") from None


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a batch system's kill, `timeout`) is handled as Ctrl-C while the block runs:
    the same clean stop, and a sweep keeps its finished rows. A no-op off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# ----------------------------------------------------------------------- the option table
F = TypeVar("F", bound=Callable[..., Any])
_KINDS: dict[str, Any] = {"int": int, "float": float, "str": str, "arrival": str,
                          "path": click.Path(path_type=Path)}


def click_option(o: Option) -> Callable[[F], F]:
    """The click option of one `sim.options` entry (passed on under its `name`)."""
    kind = click.Choice(o.choices) if o.kind == "choice" else _KINDS[o.kind]
    show = o.default is not None and o.default != ()
    return click.option(*o.flags, o.name, type=kind, default=o.default, multiple=o.multiple,
                        show_default=show, metavar=o.metavar, help=o.help)


def scenario_options(command: str) -> Callable[[F], F]:
    """Every option of `command` from the option table, in its order: the command function
    gets them as keyword arguments named as `vegas_sim.api`'s parameters."""
    def apply(f: F) -> F:
        for o in reversed(options_for(command)):
            f = click_option(o)(f)
        return f
    return apply


def acceptance_anchor_option(f: Any) -> Any:
    """--acceptance-anchor FILE (repeatable), passed on as `acceptance_anchors`."""
    anchor = next(o for o in OPTIONS if o.name == "acceptance_anchors")
    return click_option(anchor)(f)


# ------------------------------------------------------------------------------- one value
def parse_size(value: str, option: str) -> int:
    """One token count: '32K' → 32768, '128k' → 131072, '4096' → 4096."""
    return one_int(value, option)


def parse_sparsity(value: str) -> float:
    """One sparsity ratio, as sweep takes them: '0.07' or '7%'."""
    return one_sparsity(value)


# -------------------------------------------------------------------------------- progress
@contextmanager
def progress_bars(one_task: str | None = None) -> Iterator[StepProgress]:
    """Rich progress bars with ETA on stderr (stdout stays machine-readable), one per label;
    yields update(label, done, total). With `one_task`, a single bar of that name whose label
    changes. Without a terminal (nohup, CI, a batch job): plain lines, one stream per label."""
    console = Console(stderr=True)
    if not console.is_terminal:
        streams: dict[str, LabelledProgress] = {}

        def lines(label: str, done: int, total: int) -> None:
            streams.setdefault(label, progress_lines(label))(done, total, "")

        yield lines
        return
    # imported here: a command without progress bars (predict) does not pay for them
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                  console=console, transient=True) as bar:
        tasks: dict[str, Any] = {}

        def update(label: str, done: int, total: int) -> None:
            key, text = (one_task, f"{one_task} {label}") if one_task else (label, label)
            if key not in tasks:
                tasks[key] = bar.add_task(text, total=total)
            bar.update(tasks[key], completed=done, total=total, description=text)

        yield update


@contextmanager
def progress_task(description: str) -> Iterator[LabelledProgress]:
    """One task whose label changes as it goes (calibrate's points); yields
    progress(done, total, label)."""
    if not Console(stderr=True).is_terminal:
        yield progress_lines(description)
        return
    with progress_bars(one_task=description) as update:
        yield lambda done, total, label: update(label, done, total)


@contextmanager
def heartbeat(description: str, unit: str, every_s: float | None = None
              ) -> Iterator[Progress]:
    """A line on stderr every `every_s` (LOG_EVERY_S) while a job that may run long (a
    predict of many requests) is still at work, terminal or not: what is done of how many
    `unit`, and the time so far; nothing for a job done sooner. Yields progress(done, total).
    The reporting thread is a daemon and stops with the block."""
    every = LOG_EVERY_S if every_s is None else every_s
    state = {"done": 0, "total": 0}
    start = time.monotonic()
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every):
            counted = f"{state['done']}/{state['total']} {unit} done, " if state["total"] else ""
            click.echo(f"{description}: {counted}{time.monotonic() - start:.0f} s", err=True)

    def progress(done: int, total: int) -> None:
        state.update(done=done, total=total)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield progress
    finally:
        stop.set()
        thread.join()


LOG_EVERY_S = 10.0  # without a terminal: a progress line at least this often as work is done,
LOG_EVERY_SHARE = 0.05  # or each time another 5 % of the work is done


def progress_lines(description: str) -> LabelledProgress:
    """progress(done, total, label) as plain stderr lines, for logs: one per new label, then
    one every LOG_EVERY_S or LOG_EVERY_SHARE of the total, and one at the end, each with the
    elapsed time."""
    start = time.monotonic()
    last: dict[str, Any] = {"label": None, "at": -LOG_EVERY_S, "done": 0}

    def progress(done: int, total: int, label: str) -> None:
        now = time.monotonic()
        stepped = total > 0 and done - last["done"] >= LOG_EVERY_SHARE * total
        if (label == last["label"] and now - last["at"] < LOG_EVERY_S and not stepped
                and done < total):
            return
        last.update(label=label, at=now, done=done)
        where = f"{done}/{total} {label}".rstrip()
        click.echo(f"{description}: {where} ({now - start:.0f} s)", err=True)

    return progress
