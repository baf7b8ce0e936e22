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
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from vegas_sim.errors import UserInputError
from vegas_sim.gpus import GpuSpec, get_gpu, resolve_gpu
from vegas_sim.grids import parse_int_grid, parse_sparsity_grid
from vegas_sim.models import WEIGHT_FORMATS

ProgressFn = Callable[[int, int, str], None]  # progress(done, total, label)
BarsFn = Callable[[str, int, int], None]  # update(label, done, total): one bar per label
T = TypeVar("T")


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


# --------------------------------------------------------------------------------- anchors
ACCEPTANCE_ANCHOR_HELP = (
    "Measured acceptance that sets the acceptance level (docs/ACCEPTANCE_ANCHORS.md): a "
    ".json/.csv anchors file or a packaged name (qwen3-8b-published); repeatable. "
    "'none': the acceptance trace set's own level [default: the packaged anchors of the "
    "model predicted when its acceptance comes from another model's traces].")


def acceptance_anchor_option(f: Any) -> Any:
    """--acceptance-anchor FILE (repeatable), passed on as `acceptance_anchors`."""
    return click.option("--acceptance-anchor", "acceptance_anchors", multiple=True,
                        metavar="FILE|NAME", help=ACCEPTANCE_ANCHOR_HELP)(f)


def acceptance_traces_option(f: Any) -> Any:
    """--acceptance-traces PATH|NAME, passed on as `acceptance_traces`."""
    return click.option(
        "--acceptance-traces", type=click.Path(path_type=Path), default=None,
        metavar="PATH|NAME",
        help="Real-weights trace set whose acceptance to use (a directory or a packaged name, "
             "e.g. smollm2-135m-real-yarn4 for contexts past 8K) [default: the model's own, "
             "else the packaged real set].")(f)


GPU_HELP = ("Hardware what-if: rescale to this GPU's datasheet (a100, h100-sxm, h100-nvl, "
            "h200, b200). Not measured.")
GPU_SPEC_HELP = ("Hardware what-if for a GPU not in --gpu's list: a JSON or TOML file with "
                 "name, memory_gb, hbm_bandwidth_gbs (datasheet; or copy_bandwidth_gbs, "
                 "measured), bf16_tflops (dense, datasheet). Not measured.")


def gpu_options(f: Any) -> Any:
    """--gpu NAME and --gpu-spec FILE; `gpu_target` turns them into the what-if target."""
    f = click.option("--gpu-spec", "gpu_spec", type=click.Path(path_type=Path), default=None,
                     metavar="FILE", help=GPU_SPEC_HELP)(f)
    return click.option("--gpu", default=None, help=GPU_HELP)(f)


def gpu_target(gpu: str | None, gpu_spec: Path | None) -> str | GpuSpec | None:
    """What api.load_models takes as `gpu`: the --gpu name, the --gpu-spec file's GpuSpec
    (checked now), or None."""
    if gpu_spec is None and gpu is not None:
        get_gpu(gpu)  # the unknown-GPU error now, before any fitting
        return gpu
    return resolve_gpu(gpu, gpu_spec)


# ------------------------------------------------------------------------------- one value
def parse_size(value: str, option: str) -> int:
    """One token count: '32K' → 32768, '128k' → 131072, '4096' → 4096."""
    return _one(parse_int_grid(value, option), value, option, "a single size such as 32K")


def parse_sparsity(value: str) -> float:
    """One sparsity ratio, as sweep takes them: '0.07' or '7%'."""
    return _one(parse_sparsity_grid(value, "--sparsity"), value, "--sparsity",
                "a single ratio such as 0.07 or 7%")


def _one(values: list[T], text: str, option: str, example: str) -> T:
    if len(values) != 1:
        raise UserInputError(f"{text!r} is a grid; one value is expected", where=option,
                             fix=f"pass {example} (use `sweep` for grids)")
    return values[0]


# -------------------------------------------------------------------------------- progress
@contextmanager
def progress_bars(one_task: str | None = None) -> Iterator[BarsFn]:
    """Rich progress bars with ETA on stderr (stdout stays machine-readable), one per label;
    yields update(label, done, total). With `one_task`, a single bar of that name whose label
    changes. Without a terminal (nohup, CI, a batch job): plain lines, one stream per label."""
    console = Console(stderr=True)
    if not console.is_terminal:
        streams: dict[str, ProgressFn] = {}

        def lines(label: str, done: int, total: int) -> None:
            streams.setdefault(label, progress_lines(label))(done, total, "")

        yield lines
        return
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
def progress_task(description: str) -> Iterator[ProgressFn]:
    """One task whose label changes as it goes (calibrate's points); yields
    progress(done, total, label)."""
    if not Console(stderr=True).is_terminal:
        yield progress_lines(description)
        return
    with progress_bars(one_task=description) as update:
        yield lambda done, total, label: update(label, done, total)


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


weight_format_option = click.option(
    "--weight-format", type=click.Choice(WEIGHT_FORMATS), default="bf16", show_default=True,
    help="What-if: weights in fp8 (1 byte per layer-projection parameter) or mxfp4 (4.25 "
         "bits per expert parameter, as gpt-oss ships), weight bytes rescaled along the "
         "fitted roofline. Not measured.")
