"""Per-phase timers for the spec-decode loop: CUDA events on the GPU, perf_counter on the CPU.

    timer = PhaseTimer("cuda")
    with timer.phase("verify"):
        ...                       # enqueue GPU work; nothing synchronises here
    timer.summary()               # {"verify": [ms, ...]}; synchronises once, then resolves

On CUDA each phase records a start and an end event on the current stream; the events are
resolved lazily in `summary()`/`samples()` (one synchronisation at the end), so timing does not
serialise the loop (vLLM / gpt-fast style). On the CPU, work is synchronous and perf_counter is
exact.

Nesting: a phase opened inside another (e.g. "quest_meta" — Quest page scoring inside each layer
of a "draft_step") is recorded as its own sample, and the parent's sample *excludes* the nested
time, so the phases of an iteration add up to its wall time without double counting (the latency
model sums phases: methods.iteration_plan). Nested occurrences of the same name inside one
parent occurrence are summed into one sample (30 per-layer Quest scorings of one draft step
give one "quest_meta" sample for that step).

With a `counter` (a tensor-parallel shard's collective tally: `(calls, bytes)` so far), each
phase also records the collectives it issued, nested phases excluded likewise
(`collective_samples`, in the order of `samples`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from vegas_sim.errors import UserInputError
from vegas_sim.methods import PHASES


@dataclass
class _Interval:
    name: str
    start: Any  # float (perf_counter seconds) or torch.cuda.Event
    end: Any = None
    parent: int = -1  # index into PhaseTimer._intervals, -1 = top level
    children: list[int] = field(default_factory=list)
    counts: tuple[tuple[int, int], tuple[int, int]] | None = None  # counter at start, end


Counter = Callable[[], tuple[int, int]]  # collective (calls, bytes) issued so far


class PhaseTimer:
    """Records durations of named phases (methods.PHASES); see the module docstring."""

    def __init__(self, device: str | torch.device = "cpu", enabled: bool = True,
                 counter: Counter | None = None) -> None:
        self.device = torch.device(device)
        self.enabled = enabled
        self.counter = counter
        self._cuda = self.device.type == "cuda"
        self._intervals: list[_Interval] = []
        self._stack: list[int] = []

    # ---- recording ------------------------------------------------------------------------
    def _marker(self) -> Any:
        if self._cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the enclosed block as phase `name` (one of methods.PHASES)."""
        if not self.enabled:
            yield
            return
        if name not in PHASES:
            raise UserInputError(f"unknown phase {name!r}", where="PhaseTimer.phase",
                                 fix=f"use one of: {', '.join(PHASES)}")
        parent = self._stack[-1] if self._stack else -1
        idx = len(self._intervals)
        start = self.counter() if self.counter is not None else None
        self._intervals.append(_Interval(name, self._marker(), parent=parent))
        if parent >= 0:
            self._intervals[parent].children.append(idx)
        self._stack.append(idx)
        try:
            yield
        finally:
            self._stack.pop()
            iv = self._intervals[idx]
            iv.end = self._marker()
            if start is not None and self.counter is not None:
                iv.counts = (start, self.counter())

    def reset(self) -> None:
        """Forget everything recorded so far (open phases keep working but are dropped)."""
        self._intervals = []
        self._stack = []

    # ---- resolution -----------------------------------------------------------------------
    def _elapsed_ms(self) -> list[float]:
        if self._cuda and self._intervals:
            torch.cuda.synchronize(self.device)
        out: list[float] = []
        for iv in self._intervals:
            if iv.end is None:  # still open: not resolvable yet
                out.append(float("nan"))
            elif self._cuda:
                out.append(float(iv.start.elapsed_time(iv.end)))
            else:
                out.append((iv.end - iv.start) * 1e3)
        return out

    def samples(self) -> list[tuple[str, float]]:
        """(phase, ms) in the order the phases started; nested time excluded from parents."""
        elapsed = self._elapsed_ms()
        result: list[tuple[str, float]] = []
        for idx, iv in enumerate(self._intervals):
            if iv.end is None:
                continue
            if iv.parent < 0:
                result.extend(self._resolve(idx, elapsed))
        return result

    def _resolve(self, idx: int, elapsed: list[float]) -> list[tuple[str, float]]:
        """This interval's exclusive sample, then its children merged by name, recursively."""
        iv = self._intervals[idx]
        own = elapsed[idx] - sum(elapsed[c] for c in iv.children)
        merged: dict[str, float] = {}
        nested: list[tuple[str, float]] = []
        for c in iv.children:
            if self._intervals[c].end is None:
                continue
            for name, ms in self._resolve(c, elapsed):
                merged[name] = merged.get(name, 0.0) + ms
        nested.extend(merged.items())
        return [(iv.name, max(own, 0.0))] + nested

    def collective_samples(self) -> list[tuple[str, int, int]]:
        """(phase, collective calls, bytes) of every sample of `samples`, in its order (0, 0
        without a counter); nested phases' collectives excluded from their parents' and
        merged by name as their time is."""
        result: list[tuple[str, int, int]] = []
        for idx, iv in enumerate(self._intervals):
            if iv.end is not None and iv.parent < 0:
                result.extend(self._resolve_counts(idx))
        return result

    def _counted(self, idx: int) -> tuple[int, int]:
        """What the counter advanced over interval `idx`, nested phases included."""
        iv = self._intervals[idx]
        if iv.counts is None:
            return 0, 0
        (c0, b0), (c1, b1) = iv.counts
        return c1 - c0, b1 - b0

    def _resolve_counts(self, idx: int) -> list[tuple[str, int, int]]:
        iv = self._intervals[idx]
        calls, nbytes = self._counted(idx)
        merged: dict[str, tuple[int, int]] = {}
        for c in iv.children:
            if self._intervals[c].end is None:
                continue
            inner = self._counted(c)
            calls, nbytes = calls - inner[0], nbytes - inner[1]
            for name, n, b in self._resolve_counts(c):
                m = merged.get(name, (0, 0))
                merged[name] = (m[0] + n, m[1] + b)
        return [(iv.name, calls, nbytes)] + [(n, *cb) for n, cb in merged.items()]

    def summary(self) -> dict[str, list[float]]:
        """{phase: [ms per occurrence]} for every phase recorded since the last reset()."""
        out: dict[str, list[float]] = {}
        for name, ms in self.samples():
            out.setdefault(name, []).append(ms)
        return out
