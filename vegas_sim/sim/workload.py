"""What the decode instance is asked to do: request lengths and arrivals.

`Lengths` draws (input, output) pairs; `OutputLengths` is the output-length distribution of
``--output-len`` (a fixed N, a lognormal with mean and coefficient of variation, or samples
such as a file of measured lengths); `Arrivals` says when requests reach the instance. All
draws come from the generator passed in (the engine's length or arrival stream).
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from vegas_sim.bounds import ARRIVAL_RATE, MAX_ARRIVAL_S
from vegas_sim.errors import UserInputError
from vegas_sim.grids import one_int

OUTPUT_KINDS = ("fixed", "lognormal", "samples")
ARRIVAL_FIX = ("use 'closed', 'closed:<users>', 'poisson:<rate per second>' or "
               "'trace:<file of arrival times>'")


def _tokens(text: str, whole: bool = True) -> float:
    """A number of tokens: plain (an int where `whole`, else a float such as 19680.5 or 1e4,
    any value, so `validate` says what is wrong with it) or as --context writes one ('8K',
    '1.5K')."""
    try:
        return int(text) if whole else float(text)
    except ValueError:
        return one_int(text.strip(), "--output-len", "one length such as 1024 or 8K")


@dataclass(frozen=True)
class OutputLengths:
    """Output lengths of the requests (the ``--output-len`` distribution).

    kind:
    - ``"fixed"``: every request generates ``mean`` tokens.
    - ``"lognormal"``: mean ``mean``, coefficient of variation ``cv`` (σ² = ln(1 + cv²),
      length = mean·exp(σ·z − σ²/2)), rounded and clipped to [1, ``max_len``].
    - ``"samples"``: drawn uniformly with replacement from ``samples`` (e.g. a file of
      measured output lengths).

    ``max_len`` (None: unclipped) is the model's positions left after the prompt: a real
    engine stops a generation there, so draws above it are clipped to it.
    """

    kind: str
    mean: float
    cv: float = 0.0
    samples: tuple[int, ...] = ()
    max_len: int | None = None
    label: str = ""  # how the user wrote it, for rows ("lognormal:19680,0.5", "file:x.txt")

    @classmethod
    def fixed(cls, n: int) -> OutputLengths:
        return cls("fixed", float(n), label=str(n))

    @classmethod
    def lognormal(cls, mean: float, cv: float, label: str = "") -> OutputLengths:
        return cls("lognormal", float(mean), float(cv),
                   label=label or f"lognormal:{mean:g},{cv:g}")

    @classmethod
    def from_samples(cls, lengths: Sequence[int], label: str) -> OutputLengths:
        tup = tuple(int(x) for x in lengths)
        if not tup:
            raise UserInputError("the file of output lengths holds no length", where=label,
                                 fix="give one length per line, or a CSV column of lengths")
        return cls("samples", float(np.mean(tup)), samples=tup, label=label)

    @classmethod
    def parse(cls, text: str) -> OutputLengths:
        """'N' or 'lognormal:MEAN,CV' (``file:PATH`` is read by the command line); N and MEAN
        take --context's K / M suffixes ('8K' is 8192)."""
        kind, _, arg = text.strip().partition(":")
        try:
            if not arg:
                return cls.fixed(int(_tokens(kind)))
            if kind == "lognormal":
                mean, cv = arg.split(",")
                return cls.lognormal(_tokens(mean, whole=False), float(cv), label=text.strip())
        except (ValueError, UserInputError):
            pass
        raise UserInputError(f"cannot parse output length {text!r}", where="--output-len",
                             fix="use N (e.g. 1024 or 8K), lognormal:MEAN,CV (e.g. "
                                 "lognormal:19680,0.5) or file:PATH (one length per line, or a "
                                 "CSV column)")

    def validate(self) -> None:
        if self.kind not in OUTPUT_KINDS:
            raise UserInputError(f"unknown output-length kind {self.kind!r}",
                                 where="--output-len", fix=f"use one of {OUTPUT_KINDS}")
        if not self.mean >= 1:
            raise UserInputError(f"output length must be >= 1, got {self.mean:g}",
                                 where="--output-len", fix="pass a mean output length >= 1")
        if self.kind == "lognormal" and not 0 <= self.cv < 100:
            raise UserInputError(f"the coefficient of variation must be in [0, 100), got "
                                 f"{self.cv:g}", where="--output-len",
                                 fix="use lognormal:MEAN,CV with e.g. CV 0.5")
        if self.kind == "samples" and min(self.samples) < 1:
            raise UserInputError("output lengths must be >= 1", where=self.label,
                                 fix="drop zero or negative lengths from the file")
        if self.max_len is not None and self.max_len < 1:
            raise UserInputError("no position is left for the output", where="--context",
                                 fix="shorten --context")

    def clipped(self, max_len: int) -> OutputLengths:
        """The same distribution with draws clipped to ``max_len`` (the tighter clip wins)."""
        cap = max_len if self.max_len is None else min(max_len, self.max_len)
        return replace(self, max_len=cap)

    def max_output(self) -> int:
        """The longest output this can draw (for the does-one-request-fit check)."""
        if self.kind == "fixed":
            top = round(self.mean)
        elif self.kind == "samples":
            top = max(self.samples)
        else:
            top = self.max_len if self.max_len is not None else -1  # unbounded: -1
        return top if self.max_len is None or top < 0 else min(top, self.max_len)

    def moments(self) -> tuple[float, float]:
        """(E[L], E[L²]) of the distribution, before rounding and clipping."""
        if self.kind == "samples":
            x = np.asarray(self.samples, dtype=np.float64)
            if self.max_len is not None:
                x = np.minimum(x, self.max_len)
            return float(x.mean()), float(np.mean(x * x))
        var = (self.cv * self.mean) ** 2 if self.kind == "lognormal" else 0.0
        return self.mean, self.mean**2 + var

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """[n] output lengths, int64, in [1, max_len]."""
        if self.kind == "fixed":
            out = np.full(n, round(self.mean), np.int64)
        elif self.kind == "samples":
            out = np.asarray(self.samples, dtype=np.int64)[rng.integers(0, len(self.samples),
                                                                        size=n)]
        else:
            s2 = math.log1p(self.cv**2)
            x = self.mean * np.exp(math.sqrt(s2) * rng.standard_normal(n) - s2 / 2)
            out = np.maximum(np.rint(x), 1).astype(np.int64)
        if self.max_len is not None:
            np.minimum(out, self.max_len, out=out)
        return out


@dataclass(frozen=True)
class Lengths:
    """Input/output lengths of the requests.

    kind:
    - ``"fixed"``: every request has (input_len, output_len).
    - ``"uniform"``: each length uniform in [x·(1−spread), x·(1+spread)], rounded, ≥ 1.
    - ``"lognormal"``: each length x·exp(σ·z − σ²/2) with σ = spread (mean x), rounded, ≥ 1.
    - ``"dataset"``: pairs drawn uniformly with replacement from ``pairs``.

    ``output`` (None: as ``kind`` says) replaces the output lengths by that distribution,
    drawn after the input lengths from the same generator.
    """

    input_len: int = 1024
    output_len: int = 256
    kind: str = "fixed"
    spread: float = 0.0
    pairs: tuple[tuple[int, int], ...] = ()
    output: OutputLengths | None = None

    @classmethod
    def dataset(cls, pairs: Sequence[tuple[int, int]]) -> Lengths:
        tup = tuple((int(i), int(o)) for i, o in pairs)
        if not tup:
            raise UserInputError("the dataset of (input_len, output_len) pairs is empty",
                                 where="lengths", fix="give at least one pair")
        return cls(input_len=max(i for i, _ in tup), output_len=max(o for _, o in tup),
                   kind="dataset", pairs=tup)

    def validate(self) -> None:
        if self.kind not in ("fixed", "uniform", "lognormal", "dataset"):
            raise UserInputError(f"unknown length distribution {self.kind!r}", where="lengths",
                                 fix="use fixed, uniform, lognormal or dataset")
        if self.input_len < 1 or self.output_len < 1:
            raise UserInputError("input and output lengths must be >= 1", where="lengths",
                                 fix="pass positive lengths")
        if self.kind == "dataset" and any(i < 1 or o < 1 for i, o in self.pairs):
            raise UserInputError("dataset lengths must be >= 1", where="lengths",
                                 fix="drop pairs with a zero or negative length")
        if self.kind in ("uniform", "lognormal") and self.spread < 0:
            raise UserInputError("spread must be >= 0", where="lengths", fix="pass spread >= 0")
        if self.output is not None:
            self.output.validate()

    def max_total(self) -> int:
        """Upper bound of input + output over the requests this can draw (for memory checks);
        -1 when unbounded."""
        if self.output is not None:
            top = self.output.max_output()
            if top < 0 or self.kind == "lognormal":
                return -1
            grow = 1.0 + self.spread if self.kind == "uniform" else 1.0
            inp = max(i for i, _ in self.pairs) if self.kind == "dataset" else math.ceil(
                self.input_len * grow)
            return inp + top
        if self.kind == "dataset":
            return max(i + o for i, o in self.pairs)
        if self.kind == "uniform":
            grow = 1.0 + self.spread
            return math.ceil(self.input_len * grow) + math.ceil(self.output_len * grow)
        if self.kind == "lognormal":
            return -1  # unbounded: checked on the drawn lengths
        return self.input_len + self.output_len

    def draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """([n] input lengths, [n] output lengths), int64, all >= 1."""
        if self.output is not None:
            inp = self._draw_pairs(rng, n)[0]
            return inp, self.output.draw(rng, n)
        return self._draw_pairs(rng, n)

    def _draw_pairs(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        if self.kind == "fixed":
            return (np.full(n, self.input_len, np.int64), np.full(n, self.output_len, np.int64))
        if self.kind == "dataset":
            pairs = np.asarray(self.pairs, dtype=np.int64)  # [P, 2]
            pick = pairs[rng.integers(0, len(pairs), size=n)]
            return pick[:, 0].copy(), pick[:, 1].copy()
        return self._draw_one(rng, self.input_len, n), self._draw_one(rng, self.output_len, n)

    def _draw_one(self, rng: np.random.Generator, mean: int, n: int) -> np.ndarray:
        if self.kind == "uniform":
            x = rng.uniform(mean * (1 - self.spread), mean * (1 + self.spread), size=n)
        else:  # lognormal with mean `mean`
            s = self.spread
            x = mean * np.exp(s * rng.standard_normal(n) - s * s / 2)
        return np.maximum(np.rint(x), 1).astype(np.int64)


@dataclass(frozen=True)
class Arrivals:
    """How requests reach the decode instance.

    ``closed``: ``users`` concurrent users (None = max batch); ``poisson``: rate per second;
    ``trace``: arrival times in seconds (one per request, sorted), optionally with lengths
    that override ``Lengths``. ``text`` is the ``--arrival`` form it was parsed from, what
    the rows print (built from the fields when it is not given).
    """

    kind: str = "closed"
    users: int | None = None
    rate_per_s: float = 0.0
    times_s: tuple[float, ...] = ()
    trace_lengths: tuple[tuple[int, int], ...] = ()
    text: str = ""

    def __post_init__(self) -> None:
        if not self.text:
            object.__setattr__(self, "text", self._label())

    def _label(self) -> str:
        if self.kind == "closed":
            return "closed" if self.users is None else f"closed:{self.users}"
        if self.kind == "poisson":
            return f"poisson:{self.rate_per_s:g}"
        return self.kind

    @property
    def is_open(self) -> bool:
        """Open loop: requests arrive on their own schedule (Poisson or a trace), whatever the
        instance's speed, so a queue can grow without bound."""
        return self.kind in ("poisson", "trace")

    def offered_rate_per_s(self) -> float:
        """Requests per second offered: the Poisson rate, or the trace's (n − 1) / its span
        (NaN for a closed loop or a trace without a span)."""
        if self.kind == "poisson":
            return self.rate_per_s
        if self.kind == "trace" and len(self.times_s) > 1:
            span = self.times_s[-1] - self.times_s[0]
            return (len(self.times_s) - 1) / span if span > 0 else math.nan
        return math.nan

    @classmethod
    def of(cls, value: str | Arrivals) -> Arrivals:
        """An ``--arrival`` value as given to the CLI or the API: its text parsed, or an
        Arrivals passed through."""
        return value if isinstance(value, Arrivals) else cls.parse(value)

    @classmethod
    def parse(cls, text: str) -> Arrivals:
        """'closed', 'closed:<users>', 'poisson:<rate/s>' or 'trace:<file>' (the --arrival
        option; the file as `read_arrival_trace` reads it)."""
        if not isinstance(text, str):
            raise UserInputError(f"cannot parse arrival {text!r}: not a text", where="--arrival",
                                 fix=ARRIVAL_FIX)
        kind, _, arg = text.partition(":")
        if kind == "trace" and arg:
            times, lengths = read_arrival_trace(arg)
            return cls.trace(times, lengths or None, text=text)
        try:
            if kind == "closed":
                return cls("closed", users=int(arg) if arg else None, text=text)
            if kind == "poisson" and arg:
                return cls("poisson", rate_per_s=float(arg), text=text)
        except ValueError:
            pass
        raise UserInputError(f"cannot parse arrival {text!r}", where="--arrival",
                             fix=ARRIVAL_FIX)

    @classmethod
    def trace(cls, times_s: Sequence[float],
              lengths: Sequence[tuple[int, int]] | None = None, text: str = "") -> Arrivals:
        return cls("trace", times_s=tuple(float(t) for t in times_s),
                   trace_lengths=tuple((int(i), int(o)) for i, o in (lengths or ())),
                   text=text)

    def validate(self, n_requests: int) -> None:
        if self.kind == "closed":
            if self.users is not None and self.users < 1:
                raise UserInputError("closed loop needs >= 1 user", where="--arrival",
                                     fix="use closed:<users> with users >= 1")
        elif self.kind == "poisson":
            if not self.rate_per_s > 0:
                raise UserInputError(f"Poisson rate must be > 0, got {self.rate_per_s}",
                                     where="--arrival", fix="use poisson:<rate/s>, e.g. poisson:2")
            ARRIVAL_RATE.check(self.rate_per_s)
        elif self.kind == "trace":
            for i, t in enumerate(self.times_s):
                _check_time(t, f"arrival {i + 1}", "arrival trace")
            if len(self.times_s) != n_requests:
                raise UserInputError(
                    f"the arrival trace has {len(self.times_s)} times for {n_requests} requests",
                    where="arrival trace", fix="give one arrival time per request")
            if any(b < a for a, b in zip(self.times_s, self.times_s[1:])) or (
                    self.times_s and self.times_s[0] < 0):
                raise UserInputError("arrival times must be >= 0 and sorted",
                                     where="arrival trace", fix="sort the times")
            if self.trace_lengths and len(self.trace_lengths) != n_requests:
                raise UserInputError("the trace has a different number of lengths and times",
                                     where="arrival trace", fix="give one length pair per time")
        else:
            raise UserInputError(f"unknown arrival kind {self.kind!r}", where="--arrival",
                                 fix="use closed, poisson or trace")


TRACE_COLUMNS = ("arrival_s", "input_len", "output_len")  # input/output lengths optional


@functools.lru_cache(maxsize=16)
def read_arrival_trace(path: str) -> tuple[tuple[float, ...], tuple[tuple[int, int], ...]]:
    """(arrival times in seconds, (input, output) lengths or ()) of an arrival-trace file:
    one time per line, or a CSV whose header names `arrival_s` and, optionally, `input_len`
    and `output_len` (then every request carries its own lengths). Times must be sorted."""
    where = f"--arrival trace:{path}"
    try:
        with open(path, newline="") as f:
            rows = [r for r in csv.reader(f) if r and any(c.strip() for c in r)]
    except OSError as e:
        raise UserInputError(f"cannot read the arrival trace: {e.strerror or e}", where=where,
                             fix="pass a file of arrival times (one per line, seconds)") from None
    if not rows:
        raise UserInputError("the arrival trace is empty", where=where,
                             fix="one arrival time per line, or a CSV with an arrival_s column")
    header = [c.strip() for c in rows[0]]
    has_header = not _is_number(header[0])
    if has_header and "arrival_s" not in header:
        raise UserInputError(f"the header {header} has no arrival_s column", where=where,
                             fix="name the arrival-time column arrival_s")
    cols = [header.index(c) if c in header else -1 for c in TRACE_COLUMNS] if has_header \
        else [0, -1, -1]
    times, lengths = [], []
    for line, row in enumerate(rows[1:] if has_header else rows, start=2 if has_header else 1):
        try:
            times.append(float(row[cols[0]]))
            if cols[1] >= 0 and cols[2] >= 0:
                lengths.append((int(row[cols[1]]), int(row[cols[2]])))
        except (ValueError, IndexError):
            what = "an arrival time and lengths" if cols[1] >= 0 else "an arrival time"
            raise UserInputError(f"line {line} is not {what}: {row}",
                                 where=where, fix="one number per line (seconds), or the CSV "
                                 "columns arrival_s, input_len, output_len") from None
        _check_time(times[-1], f"line {line}", where)
    return tuple(times), tuple(lengths)


def _check_time(t: float, what: str, where: str) -> float:
    """`t` when it is an arrival time (finite, in [0, MAX_ARRIVAL_S] seconds); else a
    UserInputError naming `what` (the line or the request)."""
    if not 0 <= t <= MAX_ARRIVAL_S:  # NaN and ±inf too
        raise UserInputError(
            f"{what}: arrival time {t:g} is not in [0, {MAX_ARRIVAL_S:g}] seconds (finite, from "
            f"the first request; {MAX_ARRIVAL_S:g} s is {MAX_ARRIVAL_S / 86400:.0f} days)",
            where=where, fix="give each request's arrival in seconds from the first one")
    return t


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
