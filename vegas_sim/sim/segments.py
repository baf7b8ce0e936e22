"""Per-iteration series rebuilt from the engine's running segments.

A request runs in one segment — (request, first global iteration, its own iteration index
then, iterations) — or in several when it is preempted and later resumed. Its own iteration
j has the pre-drawn token increment ``inc[request, j]`` (vanilla: one token), so tokens,
running batch and KV blocks per global iteration follow from the segments alone, after the
run, with a few numpy passes instead of work in the engine's hot loop: over every step at
once when segments are short, one slice per segment when they are long (`LONG_SEGMENT`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Mean iterations per segment from which a loop over the segments, adding each one's run as
# a slice, beats indexing every step (docs/RESULTS.md, Simulator).
LONG_SEGMENT = 64


@dataclass(frozen=True)
class Segments:
    """[S] arrays: request id, first global iteration, first own iteration, iterations."""

    request: np.ndarray
    first_iter: np.ndarray
    first_local: np.ndarray
    iters: np.ndarray

    @classmethod
    def from_log(cls, log: list[tuple[int, int, int, int]]) -> Segments:
        seg = np.asarray(log, dtype=np.int64).reshape(-1, 4)  # [S, 4]
        return cls(*(seg[:, i].copy() for i in range(4)))

    def running(self, n_iter: int) -> np.ndarray:
        """[I] running requests per global iteration."""
        end = self.first_iter + self.iters
        delta = (np.bincount(self.first_iter, minlength=n_iter + 1)
                 - np.bincount(end, minlength=n_iter + 1))
        return np.cumsum(delta)[:n_iter].astype(np.int64)

    def last_iter(self, n_req: int) -> np.ndarray:
        """[R] each request's last global iteration."""
        last = np.full(n_req, -1, np.int64)
        np.maximum.at(last, self.request, self.first_iter + self.iters - 1)
        return last

    def _long(self) -> bool:
        return int(self.iters.sum()) >= LONG_SEGMENT * self.iters.shape[0]

    def _add_runs(self, values: np.ndarray, n_iter: int,
                  per_request: np.ndarray | None = None) -> np.ndarray:
        """[I] Σ over the segments of `values` [R, W] at the request's own iterations, placed at
        the global iterations they ran: one slice per segment; each slice's sum is also added
        to its request's entry of `per_request` [R] when given."""
        per_iter = np.zeros(n_iter, np.int64)
        for r, g, j, k in zip(self.request.tolist(), self.first_iter.tolist(),
                              self.first_local.tolist(), self.iters.tolist()):
            run = values[r, j:j + k]
            per_iter[g:g + k] += run
            if per_request is not None:
                per_request[r] += run.sum()
        return per_iter

    def _expand(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(request, global iteration, own iteration) of every [Σ iters] step that ran."""
        total = int(self.iters.sum())
        seg = np.repeat(np.arange(self.iters.shape[0]), self.iters)  # [T]
        off = np.arange(total) - np.repeat(np.cumsum(self.iters) - self.iters, self.iters)
        return self.request[seg], self.first_iter[seg] + off, self.first_local[seg] + off

    def tokens(self, inc: np.ndarray | None, n_req: int, n_iter: int,
               running: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """([I] tokens per global iteration, [R] tokens per request)."""
        if inc is None:  # vanilla: one token per request per iteration
            per_req = np.bincount(self.request, weights=self.iters, minlength=n_req)
            return running.copy(), per_req.astype(np.int64)
        if self._long():
            per_req = np.zeros(n_req, np.int64)
            return self._add_runs(inc, n_iter, per_req), per_req
        req, glob, local = self._expand()
        toks = inc[req, local]  # [T]
        per_iter = np.bincount(glob, weights=toks, minlength=n_iter).astype(np.int64)
        return per_iter, np.bincount(req, weights=toks, minlength=n_req).astype(np.int64)

    def kv_blocks(self, inp: np.ndarray, inc: np.ndarray | None, slack: int, block: int,
                  n_iter: int) -> np.ndarray:
        """[I] KV blocks held during each global iteration: Σ ⌈(context + slack) / block⌉
        over the running requests, context = prompt + tokens generated before the step."""
        if inc is None:
            return self._kv_blocks_vanilla(inp, slack, block, n_iter)
        pad = slack + block - 1
        before = np.cumsum(inc, axis=1)
        before -= inc  # [R, W] tokens generated before own iteration j
        if self._long():
            before += (inp + pad)[:, None]
            before //= block  # [R, W] blocks held at own iteration j
            return self._add_runs(before, n_iter)
        req, glob, local = self._expand()
        blocks = (inp[req] + before[req, local] + pad) // block  # [T]
        return np.bincount(glob, weights=blocks, minlength=n_iter).astype(np.int64)

    def _kv_blocks_vanilla(self, inp: np.ndarray, slack: int, block: int,
                           n_iter: int) -> np.ndarray:
        """Vanilla contexts grow by one per step, so a segment's blocks are a staircase: its
        first value, then +1 every `block` steps. Summed as a difference array over the
        (few) block boundaries instead of every step."""
        c0 = inp[self.request] + self.first_local + slack  # [S] tokens held in the first step
        b0 = (c0 + block - 1) // block
        delta = np.zeros(n_iter + 1, np.int64)
        np.add.at(delta, self.first_iter, b0)
        # step t (t >= 1) of a segment needs one more block when c0 + t - 1 is a multiple of block
        t1 = (-(c0 - 1)) % block
        t1[t1 == 0] = block
        n_up = np.maximum(0, -(-(self.iters - t1) // block))  # [S] boundaries inside
        seg = np.repeat(np.arange(self.iters.shape[0]), n_up)
        k = np.arange(int(n_up.sum())) - np.repeat(np.cumsum(n_up) - n_up, n_up)
        np.add.at(delta, self.first_iter[seg] + t1[seg] + k * block, 1)
        b_last = b0 + n_up
        np.subtract.at(delta, self.first_iter + self.iters, b_last)
        return np.cumsum(delta)[:n_iter]
