"""The look shared by every chart of a report: one colour per method and per phase (the same in
every chart), the marks of extrapolated values, and the plotly layout.

Colours are fixed by name (methods.METHODS and methods.PHASES order), never by the order a
chart happens to draw its traces in, so a method keeps its colour from the heatmap to the TPOT
plot. The method palette is Okabe-Ito (distinguishable with the common colour-vision
deficiencies); vegas-all, a variant of vegas, takes the orange next to its vermillion.
"""

from __future__ import annotations

from typing import Any

from vegas_sim.methods import METHODS, PHASES

_METHOD_PALETTE = ("#7f7f7f", "#0072B2", "#CC79A7", "#009E73", "#D55E00", "#E69F00")
_PHASE_PALETTE = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860",
                  "#DA8BC3", "#8C8C8C", "#CCB974")
# Methods a newer table may name that this build does not know: colours after the fixed ones.
_SPARE = ("#56B4E9", "#000000", "#999933", "#882255", "#44AA99")

METHOD_COLORS: dict[str, str] = dict(zip(METHODS, _METHOD_PALETTE))
PHASE_COLORS: dict[str, str] = dict(zip(PHASES, _PHASE_PALETTE))

# Extrapolated values: an open marker in scatter/line charts, hatched bars, '*' in heatmap cells.
MEASURED_SYMBOL = "circle"
EXTRAPOLATED_SYMBOL = "circle-open"
EXTRAPOLATED_PATTERN = "/"
EXTRAPOLATED_MARK = "*"
# Line styles telling apart several lines of one method (one colour): by position.
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")

LAYOUT: dict[str, Any] = {
    "template": "plotly_white", "height": 420,
    "margin": {"l": 60, "r": 20, "t": 60, "b": 60},
    "font": {"family": "Helvetica, Arial, sans-serif", "size": 13},
}


def method_color(method: str) -> str:
    """The method's colour; unknown names get a spare colour fixed by their spelling."""
    if method in METHOD_COLORS:
        return METHOD_COLORS[method]
    return _SPARE[sum(map(ord, method)) % len(_SPARE)]


def phase_color(phase: str) -> str:
    return PHASE_COLORS.get(phase, _SPARE[sum(map(ord, phase)) % len(_SPARE)])


def symbols(extrapolated: list[bool]) -> list[str]:
    """Per-point marker symbols: open for an extrapolated point."""
    return [EXTRAPOLATED_SYMBOL if x else MEASURED_SYMBOL for x in extrapolated]


def patterns(extrapolated: list[bool]) -> dict[str, Any]:
    """A bar trace's `marker.pattern`: hatched bars where extrapolated."""
    return {"shape": [EXTRAPOLATED_PATTERN if x else "" for x in extrapolated],
            "solidity": 0.35}
