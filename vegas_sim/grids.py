"""Grid syntax of the CLI options (`--batch`, `--context`, `--gamma`, `--sparsity`, ...), shared by
calibrate, sweep and tune.

A grid is a comma-separated list of *items*; each item is a single value or a range:

=====================  ===========================================  ==========================
syntax                 meaning                                      example → values
=====================  ===========================================  ==========================
``V``                  one value                                    ``4`` → 4
``A..B``               integers A, A+1, ..., B (inclusive)          ``2..5`` → 2, 3, 4, 5
``A..B:S``             A, A+S, ... up to B (inclusive when hit)     ``2..12:2`` → 2, 4, ..., 12
``A..B:xF``            geometric: A, A·F, A·F², ... up to B         ``1K..128K:x2`` → 1K, 2K, ..., 128K
=====================  ===========================================  ==========================

Integers take the suffixes ``K`` (×1024) and ``M`` (×1024²), case-insensitive, so
``1K,32K,128K`` is 1024, 32768, 131072; a suffixed decimal is taken when it is whole
(``1.5K`` is 1536; ``5.6K``, 5734.4, is an error that names the whole values beside it).

Floats (sparsity) are plain decimals or percentages (``7%`` = 0.07). A float range needs an
explicit step — ``0.01..0.2:0.01`` — because "every float between" has no natural step;
``0.03..0.07`` is an error that says so. Float range values are rounded to 10 decimals so that
``0.01..0.2:0.01`` gives 0.07, not 0.07000000000000001, and the end is included when it is
hit within that rounding.

Numeric grids come back sorted ascending without duplicates (grid order does not matter to the
runner, and duplicates would only cost GPU time). Name lists (``--methods``, ``--workload``)
keep their order and drop duplicates.

Every error is a `UserInputError` whose `where` is the option (e.g. ``--context``) and whose
message quotes the bad item. Nothing here imports torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import TypeVar

from vegas_sim.errors import UserInputError

_T = TypeVar("_T")
_INT_SUFFIX = {"": 1, "k": 1024, "m": 1024 * 1024}
_INT_RE = re.compile(r"^([+-]?\d+)([kKmM]?)$")
_SUFFIXED_DECIMAL_RE = re.compile(r"^([+-]?\d*\.\d+)([kKmM])$")
_MAX_ITEMS = 100_000  # a typo such as 1..1M:1 must not build a million-point grid silently
_FLOAT_DECIMALS = 10

# calibrate --acceptance-cuts (measure_acceptance.acceptance_prompts): here, where the CLI can read it
# without importing torch
ACCEPTANCE_CUTS = ("add", "none", "only")

INT_GRID_HELP = "e.g. '1,2,4', '2..12', '2..12:2', '1K..128K:x2', '1K,32K,128K'"
FLOAT_GRID_HELP = "e.g. '0.07', '0.01,0.03,0.07', '0.01..0.2:0.01', '1%,5%,7%'"


def _where(option: str) -> str:
    return option if option.startswith("-") else f"--{option}"


def _bad(option: str, text: str, item: str, problem: str, fix: str) -> UserInputError:
    return UserInputError(
        f"bad item {item!r} in {text!r}: {problem}", where=_where(option), fix=fix
    )


def _items(text: str, option: str) -> list[str]:
    """Split on commas; empty items (``'1,,2'``, a trailing comma) are errors, not skipped."""
    if not text or not text.strip():
        raise UserInputError("empty grid", where=_where(option), fix="give at least one value")
    items = [t.strip() for t in text.split(",")]
    for t in items:
        if not t:
            raise _bad(option, text, t, "empty item", "remove the extra comma")
    return items


# ---- integers -------------------------------------------------------------------------------
def _parse_int(token: str, option: str, text: str, item: str) -> int:
    m = _INT_RE.match(token.strip())
    if m is not None:
        return int(m.group(1)) * _INT_SUFFIX[m.group(2).lower()]
    d = _SUFFIXED_DECIMAL_RE.match(token.strip())
    if d is None:
        raise _bad(option, text, item, f"{token!r} is not an integer",
                   f"use integers with optional K/M suffix ({INT_GRID_HELP})")
    value = float(d.group(1)) * _INT_SUFFIX[d.group(2).lower()]
    if value != round(value):
        raise _bad(option, text, item, f"{token!r} is {value:g}, not a whole number",
                   f"use {math.floor(value)} or {math.ceil(value)}")
    return int(round(value))


def _int_range(item: str, option: str, text: str) -> list[int]:
    span, _, step_tok = item.partition(":")
    lo_tok, _, hi_tok = span.partition("..")
    lo = _parse_int(lo_tok, option, text, item)
    hi = _parse_int(hi_tok, option, text, item)
    if hi < lo:
        raise _bad(option, text, item, f"range end {hi} is below its start {lo}",
                   "write ranges low..high")
    step = 1 if not step_tok or step_tok.strip().lower().startswith("x") else None
    if step is None:
        step = _parse_int(step_tok, option, text, item)
        if step < 1:
            raise _bad(option, text, item, f"step {step} must be >= 1", "e.g. '2..12:2'")
    if not step_tok.strip().lower().startswith("x") and (hi - lo) // step + 1 > _MAX_ITEMS:
        # refused before the list is built: '1..1000000000' must not allocate a billion ints
        raise _bad(option, text, item, f"the range has more than {_MAX_ITEMS} values",
                   "use a coarser step, or a geometric range such as '1..1M:x2'")
    if not step_tok:
        values = list(range(lo, hi + 1))
    elif step_tok.strip().lower().startswith("x"):
        factor = _parse_int(step_tok.strip()[1:], option, text, item)
        if factor < 2 or lo < 1:
            raise _bad(option, text, item, "a geometric range needs start >= 1 and factor >= 2",
                       "e.g. '1K..128K:x2'")
        values = []
        v = lo
        while v <= hi and len(values) <= _MAX_ITEMS:
            values.append(v)
            v *= factor
    else:
        values = list(range(lo, hi + 1, step))
    return values


def parse_int_grid(text: str, option: str, *, minimum: int | None = 1,
                   maximum: int | None = None) -> list[int]:
    """Parse an integer grid (see module doc) into sorted unique values in [minimum, maximum].

    `option` names the CLI option in error messages (``"context"`` or ``"--context"``).
    """
    values: set[int] = set()
    for item in _items(text, option):
        if ".." in item:
            got = _int_range(item, option, text)
        elif ":" in item:
            raise _bad(option, text, item, "a step needs a range", "write A..B:STEP")
        else:
            got = [_parse_int(item, option, text, item)]
        for v in got:
            if minimum is not None and v < minimum:
                raise _bad(option, text, item, f"{v} is below the minimum {minimum}",
                           f"use values >= {minimum}")
            if maximum is not None and v > maximum:
                raise _bad(option, text, item, f"{v} is above the maximum {maximum}",
                           f"use values <= {maximum}")
        values.update(got)
        if len(values) > _MAX_ITEMS:
            raise _bad(option, text, item, f"the grid has more than {_MAX_ITEMS} values",
                       "use a coarser step")
    return sorted(values)


# ---- floats ---------------------------------------------------------------------------------
def _parse_float(token: str, option: str, text: str, item: str) -> float:
    tok = token.strip()
    pct = tok.endswith("%")
    try:
        v = float(tok[:-1] if pct else tok)
    except ValueError:
        raise _bad(option, text, item, f"{token!r} is not a number",
                   f"use decimals or percentages ({FLOAT_GRID_HELP})") from None
    if not math.isfinite(v):
        raise _bad(option, text, item, f"{token!r} is not finite", FLOAT_GRID_HELP)
    return round(v / 100.0 if pct else v, _FLOAT_DECIMALS)


def _float_range(item: str, option: str, text: str) -> list[float]:
    span, _, step_tok = item.partition(":")
    lo_tok, _, hi_tok = span.partition("..")
    if not step_tok.strip():
        raise _bad(option, text, item, "a float range needs an explicit step",
                   f"write e.g. '{lo_tok.strip()}..{hi_tok.strip()}:0.01'")
    lo = _parse_float(lo_tok, option, text, item)
    hi = _parse_float(hi_tok, option, text, item)
    step = _parse_float(step_tok, option, text, item)
    if hi < lo:
        raise _bad(option, text, item, f"range end {hi} is below its start {lo}",
                   "write ranges low..high")
    if step <= 0:
        raise _bad(option, text, item, f"step {step} must be > 0", "e.g. '0.01..0.2:0.01'")
    # Count steps with a tolerance so that the end is included when it is hit up to rounding.
    n = math.floor((hi - lo) / step + 1e-9) + 1
    if n > _MAX_ITEMS:
        raise _bad(option, text, item, f"the range has more than {_MAX_ITEMS} values",
                   "use a coarser step")
    return [round(lo + i * step, _FLOAT_DECIMALS) for i in range(n)]


def parse_float_grid(text: str, option: str, *, minimum: float | None = None,
                     maximum: float | None = None, open_minimum: bool = False) -> list[float]:
    """Parse a float grid (see module doc) into sorted unique values.

    Bounds are inclusive; `open_minimum=True` makes the lower bound exclusive (sparsity is in
    (0, 1]).
    """
    values: set[float] = set()
    for item in _items(text, option):
        if ".." in item:
            got = _float_range(item, option, text)
        elif ":" in item:
            raise _bad(option, text, item, "a step needs a range", "write A..B:STEP")
        else:
            got = [_parse_float(item, option, text, item)]
        for v in got:
            too_low = minimum is not None and (v <= minimum if open_minimum else v < minimum)
            if too_low:
                rel = ">" if open_minimum else ">="
                raise _bad(option, text, item, f"{v} is out of range",
                           f"use values {rel} {minimum}")
            if maximum is not None and v > maximum:
                raise _bad(option, text, item, f"{v} is above the maximum {maximum}",
                           f"use values <= {maximum}")
        values.update(got)
    return sorted(values)


def parse_sparsity_grid(text: str, option: str = "--sparsity") -> list[float]:
    """Sparsity ratios in (0, 1]: ``'0.01,0.03,0.07'``, ``'1%..20%:1%'``, ``'0.01..0.2:0.01'``."""
    return parse_float_grid(text, option, minimum=0.0, maximum=1.0, open_minimum=True)


def parse_temperature_grid(text: str, option: str = "--temperature") -> list[float]:
    """Sampling temperatures >= 0 (0 = greedy): ``'0,0.6'``."""
    return parse_float_grid(text, option, minimum=0.0)


# ---- names ----------------------------------------------------------------------------------
def parse_name_list(text: str, option: str, choices: Sequence[str] | None = None, *,
                    all_word: str | None = "all") -> list[str]:
    """A comma-separated list of names, order kept, duplicates dropped.

    With `choices`, every name must be one of them, and `all_word` (default ``'all'``) expands
    to all choices.
    """
    out: list[str] = []
    for item in _items(text, option):
        if choices is not None and all_word is not None and item == all_word:
            names: Iterable[str] = choices
        else:
            if choices is not None and item not in choices:
                raise _bad(option, text, item, "unknown name",
                           f"use one of: {', '.join(choices)}"
                           + (f" (or '{all_word}')" if all_word else ""))
            names = [item]
        for n in names:
            if n not in out:
                out.append(n)
    return out


def format_grid(values: Sequence[int] | Sequence[float]) -> str:
    """Compact display of a grid: ints with K suffixes where exact (``1K,2K,128K``)."""
    parts = []
    for v in values:
        if isinstance(v, int) and v >= 1024 and v % 1024 == 0:
            parts.append(f"{v // 1024}K")
        else:
            parts.append(f"{v:g}" if isinstance(v, float) else str(v))
    return ",".join(parts)


def grid_text(value: str | int | float | Sequence[int | float]) -> str:
    """A grid as the CLI writes it: '2..12' stays, 7 → '7', [1, 4, 16] → '1,4,16'."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return f"{value:g}" if isinstance(value, float) else str(value)
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)


def one_int(value: str | int, option: str, example: str = "a single size such as 32K") -> int:
    """One integer in grid syntax: '32K' → 32768; a grid is refused."""
    return _one(parse_int_grid(grid_text(value), option), value, option, example)


def one_sparsity(value: str | float, option: str = "--sparsity") -> float:
    """One sparsity ratio, as sweep takes them: 0.07, '0.07' or '7%'."""
    return _one(parse_sparsity_grid(grid_text(value), option), value, option,
                "a single ratio such as 0.07 or 7%")


def _one(values: list[_T], text: object, option: str, example: str) -> _T:
    if len(values) != 1:
        raise UserInputError(f"{text!r} is a grid; one value is expected", where=_where(option),
                             fix=f"pass {example} (use `sweep` for grids)")
    return values[0]


def int_box(value: str | Sequence[int] | None, option: str = "--gamma"
            ) -> tuple[int, int] | None:
    """A search box LO..HI (or one value) of integers → (LO, HI); None stays None."""
    if value is None:
        return None
    values = parse_int_grid(grid_text(value), option)
    return min(values), max(values)


def sparsity_box(value: str | Sequence[float] | None, option: str = "--sparsity"
                 ) -> tuple[float, float] | None:
    """A sparsity box LO..HI (or one value; % allowed) → (LO, HI); None stays None."""
    if value is None:
        return None
    if not isinstance(value, str):
        return min(value), max(value)
    parts = value.split("..")
    if len(parts) > 2 or ":" in value or "," in value:
        raise UserInputError(f"--sparsity {value!r} is not a range", where=_where(option),
                             fix="write LO..HI, e.g. 0.01..0.2 or 1%..20%")
    values = [parse_sparsity_grid(p, option)[0] for p in parts]
    return min(values), max(values)
