"""The per-iteration series rebuilt from running segments: the loop over long segments and
the step-by-step expansion give the same arrays."""

from __future__ import annotations

import numpy as np
import pytest

from vegas_sim.sim import segments as seg_mod
from vegas_sim.sim.segments import Segments


def _random_segments(rng: np.random.Generator, n_req: int, width: int
                     ) -> tuple[Segments, np.ndarray, np.ndarray, int]:
    """Each request's own iterations cut into 1-3 segments at increasing global iterations
    (a preempted request resumes later), with its token increments [R, W] and prompts [R]."""
    log, clock = [], 0
    inc = rng.integers(1, 9, size=(n_req, width))
    for r in range(n_req):
        n_it = int(rng.integers(1, width))
        cuts = np.sort(rng.choice(np.arange(1, n_it), size=min(int(rng.integers(0, 3)),
                                                                 n_it - 1), replace=False))
        bounds = [0, *cuts.tolist(), n_it]
        for j0, j1 in zip(bounds[:-1], bounds[1:]):
            clock += int(rng.integers(0, 5))
            log.append((r, clock, j0, j1 - j0))
    seg = Segments.from_log(log)
    n_iter = int((seg.first_iter + seg.iters).max())
    return seg, inc, rng.integers(16, 5000, size=n_req), n_iter


@pytest.mark.parametrize("seed", range(6))
def test_long_segment_loop_equals_the_step_expansion(monkeypatch: pytest.MonkeyPatch,
                                                     seed: int) -> None:
    seg, inc, inp, n_iter = _random_segments(np.random.default_rng(seed), 12, 200)
    running = seg.running(n_iter)

    def series(long: int) -> list[np.ndarray]:
        monkeypatch.setattr(seg_mod, "LONG_SEGMENT", long)
        return [*seg.tokens(inc, len(inp), n_iter, running),
                seg.kv_blocks(inp, inc, 8, 16, n_iter)]

    looped, expanded = series(1), series(10**9)
    assert seg._long() is False  # the last call took the expansion
    for a, b in zip(looped, expanded):
        assert a.dtype == b.dtype == np.int64
        np.testing.assert_array_equal(a, b)
    assert looped[0].sum() == looped[1].sum() > 0  # every step's tokens counted once
