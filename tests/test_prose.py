"""Product prose says what and why; measured numbers live in docs/RESULTS.md beside the command
that reproduces them, where they can be re-run and kept current (issue #44).

A measured number in a docstring or comment is a number with the unit of a measurement: a
duration (ms, µs, minutes, GPU-minutes, a decimal number of seconds), a rate (tok/s, GB/s,
TB/s, TFLOP/s), a speed ratio (N× faster / slower / cheaper) or a percentage that reads as a
result (with a decimal point, or after ~ ≈ ± + − or as a range, e.g. "±2 %", "4-14 %").
Whole percentages that state a rule ("the first 10 % of arrivals", "95 % CI") and anything
quoted (input examples such as '7%') are prose. One exception: a constant may cite its
evidence in one line, as a comment at the end of the line that holds the value, or as a
single comment line directly above its assignment.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "vegas_sim"

_NUM = (r"(?:(?<![\w.])[~≈±+\-−]\s?|(?<![\w.\-−+~≈±])|(?<=\d[-–])|(?<=\d\.\.))"
        r"\d+(?:[.,]\d+)*")
MEASURED = re.compile(
    "|".join([
        _NUM + r"\s?(?:ms|µs|us|GPU-minutes?|GPU-min|minutes?|tok/s|tokens?/s|GB/s|TB/s"
               r"|TFLOP/s)(?![\w/])",
        r"(?<![\w.])\d+\.\d+\s?(?:s|seconds?)(?![\w/])",  # 0.4 s (a whole "10 s" is a rule)
        r"(?<![\w.])\d+(?:\.\d+)?\s?[×x]\s?(?:faster|slower|cheaper|dearer|costlier)\b",
        r"(?<![\w.])\d+\.\d+\s?%",  # 1.9 %
        r"[~≈±+\-−]\s?\d+(?:\.\d+)?\s?%",  # ~5 %, ±2 %, −3 %
        r"(?<![\w.])\d+(?:\.\d+)?\s?(?:-|–|\.\.)\s?\d+(?:\.\d+)?\s?%",  # 4-14 %
    ]))
QUOTED = re.compile(r"``[^`]*``|`[^`]*`|'[^'\n]*'|\"[^\"\n]*\"")
DELIMITERS = re.compile(r"^[rbuRBU]*(\"\"\"|'''|\"|')|(\"\"\"|'''|\"|')$")
ASSIGNMENT = re.compile(r"^\s*(?:[A-Z][A-Z0-9_]*\s*(?::[^=]+)?=|[\"'][\w.-]+[\"']\s*:)")


def measured(text: str) -> str | None:
    """The first measured number in a line of prose, or None."""
    m = MEASURED.search(QUOTED.sub("''", text))
    return m.group(0) if m else None


def _prose_lines(source: str) -> list[tuple[int, str]]:
    """(line number, text) of every docstring line and every comment that is not a constant's
    one-line evidence."""
    lines = source.splitlines()
    out: list[tuple[int, str]] = []
    prev = tokenize.NEWLINE
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row = tok.start[0]
            code = lines[row - 1][: tok.start[1]].strip()
            if code and re.search(r"\d", code):
                continue  # beside the value it explains
            if not code:
                above = lines[row - 2].strip() if row >= 2 else ""
                below = lines[row].strip() if row < len(lines) else ""
                if not above.startswith("#") and ASSIGNMENT.match(below):
                    continue  # one comment line directly above a constant
            out.append((row, tok.string))
        elif tok.type == tokenize.STRING and prev in (tokenize.NEWLINE, tokenize.NL,
                                                      tokenize.INDENT, tokenize.DEDENT):
            body = DELIMITERS.sub("", tok.string)
            out.extend((tok.start[0] + k, text) for k, text in enumerate(body.splitlines()))
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            prev = tok.type
    return out


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_measured_numbers_in_product_prose() -> None:
    found = [f"{path.relative_to(PACKAGE.parent)}:{row}: {hit!r} in {text.strip()[:90]!r}"
             for path in _modules()
             for row, text in _prose_lines(path.read_text(encoding="utf-8"))
             if (hit := measured(text))]
    assert not found, ("measured numbers in docstrings/comments; move them to docs/RESULTS.md "
                       "with their command, or drop them:\n" + "\n".join(found))


@pytest.mark.parametrize("text", [
    "# decode B=1 8.26 ms on the graphed H200 set",
    "in 2.6 GPU-minutes; one point at a time: 17.1",
    "median 1.9 % between, 3.3 % beyond",
    "still rises by up to ~30 % (SmolLM2)",
    "3 per cell left 4-14 % standard error",
    "importing scipy.stats would cost ~0.4 s",
    "sample and select take 0.1-1.1 ms more",
    "drawing them is 3× cheaper than float64",
    "the engine runs 38k iterations at 4262 GB/s",
])
def test_the_lint_sees_a_measured_number(text: str) -> None:
    assert measured(text)


@pytest.mark.parametrize("text", [
    "with its 95 % CI (docs/OUTPUTS.md)",
    "the open-loop window drops the first 10 % of arrivals",
    "sparsity 0.07 or '7%'; ``'1%..20%:1%'``",
    "default requests = 4 × batch (closed loop)",
    "as seconds from 10 s up",
    "a 3-layer model of 16 heads",
    "1e300 GB gives a NaN KV capacity, 1e-300 GB/s infinite times",
])
def test_the_lint_lets_rules_and_examples_be(text: str) -> None:
    assert measured(text) is None


def test_a_constant_may_cite_its_evidence_in_one_line() -> None:
    source = ('# the copy kernel reaches 0.9 of 4262 GB/s on the H200\n'
              'COPY_EFFICIENCY = 0.9\n'
              'SLACK = 1.25  # 1.9 % median error at 1.25\n'
              'def f() -> None:\n'
              '    """Measured 3.2 ms."""\n'
              '    # two lines of\n'
              '    # evidence: 12.5 ms\n'
              '    x = 1\n')
    flagged = [row for row, text in _prose_lines(source) if measured(text)]
    assert flagged == [5, 7]
