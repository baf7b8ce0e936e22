"""Kernel tests: run Triton in its CPU interpreter when no GPU is present.

TRITON_INTERPRET must be set before the kernel modules are imported (triton.jit reads it when
a kernel is defined); the kernel modules are imported lazily by the tests, after this file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture
def device() -> str:
    return "cuda" if HAS_CUDA else "cpu"


INTERPRETER_MIN = (3, 7)  # Triton 3.6's CPU interpreter fails these kernels (docs/INSTALL.md)


def interpreter_too_old() -> str | None:
    """Why Triton's CPU interpreter cannot run the kernels here (None: it can, or a GPU runs
    them). The gpu extra admits triton 3.6, the GPU stack the packaged sets were measured on;
    its interpreter raises TypeError inside `range()` over tensor bounds."""
    import triton

    found = tuple(int(x) for x in re.findall(r"\d+", triton.__version__)[:2])
    if HAS_CUDA or found >= INTERPRETER_MIN:
        return None
    return (f"triton {triton.__version__}'s CPU interpreter cannot run the Triton kernels "
            f"(they need triton >= {'.'.join(map(str, INTERPRETER_MIN))} on a CPU, or a CUDA "
            "GPU); docs/INSTALL.md")


@pytest.fixture
def use_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    """Route vegas_sim.kernels.ops to the Triton launchers (interpreter on CPU)."""
    if not triton_available():
        pytest.skip("triton not installed")
    too_old = interpreter_too_old()
    if too_old:
        pytest.skip(too_old)
    monkeypatch.setenv("VEGAS_SIM_KERNELS", "triton")


@pytest.fixture
def poison(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make torch.empty return NaN (floats) / a sentinel (ints) so unwritten outputs show up."""
    def poisoned(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def make(*args: Any, **kwargs: Any) -> torch.Tensor:
            t = real(*args, **kwargs)
            return t.fill_(float("nan") if t.is_floating_point() else -12345)
        return make

    monkeypatch.setattr(torch, "empty", poisoned(torch.empty))
    monkeypatch.setattr(torch, "empty_like", poisoned(torch.empty_like))
    yield
