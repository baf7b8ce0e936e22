"""Shared pieces of the command line: user errors → exit 1, progress bars with ETA."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from vegas_sim.errors import UserInputError

ProgressFn = Callable[[int, int, str], None]


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn library errors a user can fix into a clean message and exit status 1."""
    try:
        yield
    except UserInputError as e:
        raise click.ClickException(e.message()) from None


@contextmanager
def progress_task(description: str) -> Iterator[ProgressFn]:
    """A rich progress bar with ETA on stderr (stdout stays machine-readable); yields
    progress(done, total, label)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    if not console.is_terminal:  # a log file (nohup, CI, a batch job): plain lines
        yield progress_lines(description)
        return
    bar = Progress(
        TextColumn(description), TextColumn("{task.description}"), BarColumn(),
        MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
        console=console, transient=True,
    )
    with bar:
        task = bar.add_task("", total=None)

        def progress(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label)

        yield progress


LOG_EVERY_S = 30.0  # a plain progress line at least this often while a step's label stays


def progress_lines(description: str) -> ProgressFn:
    """progress(done, total, label) as one stderr line per new label (at most every
    LOG_EVERY_S for the same one) and at the end, with the elapsed time."""
    start = time.monotonic()
    last: dict[str, Any] = {"label": None, "at": -LOG_EVERY_S}

    def progress(done: int, total: int, label: str) -> None:
        now = time.monotonic()
        if label == last["label"] and now - last["at"] < LOG_EVERY_S and done < total:
            return
        last.update(label=label, at=now)
        where = f"{done}/{total} {label}".rstrip()
        click.echo(f"{description}: {where} ({now - start:.0f} s)", err=True)

    return progress
