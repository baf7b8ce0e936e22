"""Kernel tests: run Triton in its CPU interpreter when no GPU is present.

TRITON_INTERPRET must be set before the kernel modules are imported (triton.jit reads it when
a kernel is defined); the kernel modules are imported lazily by the tests, after this file.
"""

from __future__ import annotations

import os
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


@pytest.fixture
def use_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    """Route vegas_sim.kernels.ops to the Triton launchers (interpreter on CPU)."""
    if not triton_available():
        pytest.skip("triton not installed")
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
