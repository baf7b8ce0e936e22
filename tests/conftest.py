"""Project-wide test set-up.

Without a CUDA device, Triton kernels run under the interpreter (TRITON_INTERPRET=1 must be set
before triton is first imported, so it is set here, at the root).
"""

from __future__ import annotations

import os


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Fitted-model cache (vegas_sim.fitcache): tests never touch the user's ~/.cache.
if "VEGAS_SIM_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["VEGAS_SIM_CACHE_DIR"] = tempfile.mkdtemp(prefix="vegas-sim-test-cache-")

# `VEGAS_SIM_TEST_SHARED_MEM=101376 pytest -m gpu tests/kernels tests/calibrate` runs the GPU
# tests as on a GPU with that much shared memory per block (101376 B: an L4 / L40S): Triton
# refuses the larger launches, and the launchers must fall back (vegas_sim/kernels/fit.py).
if os.environ.get("VEGAS_SIM_TEST_SHARED_MEM") and _has_cuda():
    import triton.compiler.compiler as _triton_compiler

    _SHARED_LIMIT = int(os.environ["VEGAS_SIM_TEST_SHARED_MEM"])
    _triton_compiler.max_shared_mem = lambda device: _SHARED_LIMIT  # type: ignore[assignment]
