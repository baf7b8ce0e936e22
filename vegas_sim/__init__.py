"""vegas-sim: predict self-speculative decoding performance from GPU-measured trace sets.

From Python (a notebook), the commands are functions; each returns tables or objects and
prints nothing (README, "From Python"):

    >>> import vegas_sim
    >>> table = vegas_sim.predict(gamma=7, context="32K", engine="analytic")
    >>> table.attrs["notes"][0].startswith("latency: qwen3-8b-h200")
    True

predict, sweep, tune, load_traces, check_traces, show_traces: `vegas_sim.api`;
report: `vegas_sim.reports.html.write_report`; repredict (`validate --repredict`):
`vegas_sim.validate.repredict.repredict`. They are imported on first use, so that
`import vegas_sim` stays light for the CLI.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "predict": ("vegas_sim.api", "predict"),
    "sweep": ("vegas_sim.api", "sweep"),
    "tune": ("vegas_sim.api", "tune"),
    "load_traces": ("vegas_sim.api", "load_traces"),
    "check_traces": ("vegas_sim.api", "check_traces"),
    "show_traces": ("vegas_sim.api", "show_traces"),
    "report": ("vegas_sim.reports.html", "write_report"),
    "repredict": ("vegas_sim.validate.repredict", "repredict"),
}
__all__ = [
    "__version__",
    "check_traces",
    "load_traces",
    "predict",
    "report",
    "repredict",
    "show_traces",
    "sweep",
    "tune",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'vegas_sim' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    return getattr(importlib.import_module(module), attr)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
