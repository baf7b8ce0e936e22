"""Launch configurations that fit the GPU's shared memory.

The launch tables are tuned on the H200 (227 KB of shared memory per block). A GPU with less
(A100: 163 KB; A10, L4, L40S, RTX 4090: 99 KB) cannot load some of those kernels. Triton
raises OutOfResources when the kernel is first loaded, before it runs anything.
`launch_fitted` then tries the next smaller configuration, and remembers the one that loads,
so later calls with the same key go straight to it. A smaller configuration only changes
speed: the kernels give the same result under every configuration they accept.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

from vegas_sim.errors import UserInputError

C = TypeVar("C")
R = TypeVar("R")

# (kernel, device, launch key) -> the configuration that loaded; process-wide
_FITTED: dict[Hashable, Any] = {}


def out_of_resources() -> type[Exception]:
    """Triton's OutOfResources (runtime.errors since triton 3; re-exported by the autotuner)."""
    try:
        from triton.runtime.errors import OutOfResources
    except ImportError:  # pragma: no cover - older layouts
        from triton.runtime.autotuner import OutOfResources  # type: ignore[attr-defined,no-redef]
    return OutOfResources  # type: ignore[no-any-return]


def launch_fitted(key: Hashable, configs: Sequence[C], launch: Callable[[C], R],
                  what: str) -> R:
    """launch(config) for the first of `configs` (largest first) that this GPU can load.

    Raises UserInputError, naming `what` and Triton's reason, when none of them fits.
    """
    too_big = out_of_resources()
    known = _FITTED.get(key)
    if known is not None:
        try:
            return launch(known)
        except too_big:  # a key that did not capture everything the footprint depends on
            del _FITTED[key]
    reasons = []
    for config in configs:
        try:
            result = launch(config)
        except too_big as e:
            reasons.append(str(e))
            continue
        _FITTED[key] = config
        return result
    raise UserInputError(
        f"no launch configuration of {what} fits this GPU "
        f"({len(reasons)} tried; the smallest: {reasons[-1] if reasons else 'none'})",
        where=f"{what} on this GPU",
        fix="run on a GPU with more shared memory per block (an A100, H100 or H200 has "
            "163-227 KB); the kernels were tuned on the H200")


def forget_fitted() -> None:
    """Drop the remembered configurations (tests)."""
    _FITTED.clear()
