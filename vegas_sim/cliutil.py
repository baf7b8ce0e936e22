"""Shared pieces of the command line: user errors → exit 1, progress bars with ETA."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

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

    bar = Progress(
        TextColumn(description), TextColumn("{task.description}"), BarColumn(),
        MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
        console=Console(stderr=True), transient=True,
    )
    with bar:
        task = bar.add_task("", total=None)

        def progress(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label)

        yield progress
