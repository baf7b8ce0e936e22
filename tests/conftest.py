"""Project-wide test set-up.

Without a CUDA device, Triton kernels run under the interpreter (TRITON_INTERPRET=1 must be set
before triton is first imported, so it is set here, at the root).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

# pytest-xdist workers share the cores: torch's intra-op pool sized to each worker's share.
# Two workers each running the machine's thread count on 2 cores spin against each other
# (measured: a SmolLM2 decoding test 6 s alone, 117 s beside another worker).
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _share = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ.setdefault("OMP_NUM_THREADS", str(_share))
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Fitted-model cache (vegas_sim.fitcache): tests never touch the user's ~/.cache or its key.
if "VEGAS_SIM_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["VEGAS_SIM_CACHE_DIR"] = tempfile.mkdtemp(prefix="vegas-sim-test-cache-")
    os.environ.setdefault("VEGAS_SIM_CACHE_KEY",
                          os.path.join(tempfile.mkdtemp(prefix="vegas-sim-test-key-"), "cache.key"))

# `VEGAS_SIM_TEST_SHARED_MEM=101376 pytest -m gpu tests/kernels tests/calibrate` runs the GPU
# tests as on a GPU with that much shared memory per block (101376 B: an L4 / L40S): Triton
# refuses the larger launches, and the launchers must fall back (vegas_sim/kernels/fit.py).
if os.environ.get("VEGAS_SIM_TEST_SHARED_MEM") and _has_cuda():
    import triton.compiler.compiler as _triton_compiler

    _SHARED_LIMIT = int(os.environ["VEGAS_SIM_TEST_SHARED_MEM"])
    _triton_compiler.max_shared_mem = lambda device: _SHARED_LIMIT  # type: ignore[assignment]


@pytest.fixture(autouse=True)
def _keep_sigint() -> Iterator[None]:
    """`vegas_sim.cli.main` leaves Ctrl-C exiting at once (for its process's exit): the test
    runner's own handler is put back after each test."""
    handler = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, handler)
