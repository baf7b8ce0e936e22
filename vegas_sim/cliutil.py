"""Shared pieces of the command line: user errors → exit 1, progress bars with ETA."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

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


def check_out(path: Path, suffixes: tuple[str, ...], option: str = "--out") -> Path:
    """Check an output path before any work is done, so that a long run is not lost to a typo:
    not a directory, a known suffix, and a directory that exists or can be made and takes a
    new file. Returns the path."""
    from vegas_sim.reports.csv import check_writable

    if path.is_dir():
        raise UserInputError(f"{str(path)!r} is a directory", where=option,
                             fix=f"name a file inside it, e.g. {path / ('result' + suffixes[0])}")
    if path.suffix.lower() not in suffixes:
        raise UserInputError(f"cannot tell what to write to {str(path)!r} from its suffix",
                             where=option, fix=f"name the file *{', *'.join(suffixes)}")
    check_writable(path, option)
    return path


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
    bar.disable = not bar.console.is_terminal  # a log file gets no bar leftovers
    with bar:
        task = bar.add_task("", total=None)

        def progress(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label)

        yield progress
