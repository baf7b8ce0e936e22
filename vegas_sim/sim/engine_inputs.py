"""What a simulated run is given before its clock starts: each request's lengths, arrival time
and pre-drawn token plan, and when a separate prefill stage hands its KV over.

`engine.simulate` draws these up front (the engine's "pre-drawn randomness"), so that the
per-iteration loop only reads them.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

import numpy as np

from vegas_sim.errors import UserInputError
from vegas_sim.sim.engine_config import AcceptanceSampler, EngineConfig, PrefillFn


def draw_token_plan(
    dist: AcceptanceSampler | None, rng: np.random.Generator, out: np.ndarray, gamma: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Per request: iterations needed [R], token increments [R, W] (None for vanilla), and the
    histogram [γ+1] of accepted drafts over the iterations that run (before truncation).

    Draws W ≈ 1.3·max_out/E[len] columns first and redraws twice as wide (rarely) until every
    request's cumulative tokens reach its output length. Vanilla (dist None): one token per
    iteration.
    """
    if dist is None:
        return np.array([int(out.sum())], np.int64), out.copy(), None
    n, max_out = out.shape[0], int(out.max())
    width = min(max_out, math.ceil(1.3 * max_out / max(dist.mean_length, 1.0)) + 16)
    acc = np.asarray(dist.sample(rng, n, width), dtype=np.int64)  # [R, W]
    while True:
        cum = np.cumsum(acc, axis=1)  # [R, W]
        cum += np.arange(1, acc.shape[1] + 1)  # tokens after k+1 iterations (bonus included)
        if np.all(cum[:, -1] >= out):
            break
        # redrawn wider: a request's column k is its k-th iteration (its position matters)
        width = min(max_out, 2 * width)
        acc = np.asarray(dist.sample(rng, n, width), dtype=np.int64)
    short = cum < out[:, None]  # [R, W] still short of its output after iteration k + 1
    n_iters = np.add.reduce(short, axis=1) + 1  # first k with cum >= out, 1-based
    ran = np.ones_like(short)  # [R, W] iteration k ran: k = 0, or still short after k
    ran[:, 1:] = short[:, :-1]
    hist = np.bincount(acc[ran], minlength=gamma + 1).astype(np.int64)
    del acc, ran, short
    np.minimum(cum, out[:, None], out=cum)
    inc = np.diff(cum, axis=1, prepend=0)  # [R, W] int64, 0 after finishing
    return hist, n_iters.astype(np.int64), inc


def request_lengths(cfg: EngineConfig, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if cfg.arrivals.kind == "trace" and cfg.arrivals.trace_lengths:
        pairs = np.asarray(cfg.arrivals.trace_lengths, dtype=np.int64)  # [R, 2]
        if pairs.min() < 1:
            raise UserInputError("trace lengths must be >= 1", where="arrival trace",
                                 fix="drop requests with zero lengths")
        return pairs[:, 0].copy(), pairs[:, 1].copy()
    return cfg.lengths.draw(rng, cfg.n_requests)


def check_fits(cfg: EngineConfig, inp: np.ndarray, out: np.ndarray) -> None:
    """A request whose prompt + output + one step's slack does not fit the whole KV cache
    alone would wait forever: refuse up front. Anything smaller runs (preempted if need be)."""
    cap = cfg.kv_capacity_blocks
    if cap is None:
        return
    tokens = int((inp + out).max())
    if cfg.blocks(tokens) > cap:
        raise UserInputError(
            f"a request needs {tokens + cfg.slack} KV slots (input + output + {cfg.slack}) but "
            f"the KV cache holds {cap * cfg.kv_block_size} tokens "
            f"({cap} blocks of {cfg.kv_block_size})",
            where="--context/--output-len", fix="shorten the request or give more KV capacity")


def arrival_times_ms(cfg: EngineConfig, rng: np.random.Generator) -> np.ndarray:
    if cfg.arrivals.kind == "poisson":
        gaps = rng.exponential(1000.0 / cfg.arrivals.rate_per_s, size=cfg.n_requests)
        return np.cumsum(gaps)
    return np.asarray(cfg.arrivals.times_s, dtype=np.float64) * 1000.0


def prefill_stage(arrival_ms: np.ndarray, input_len: np.ndarray, prefill_ms: PrefillFn | None,
                  gpus: int, transfer_ms_per_token: float) -> np.ndarray:
    """[R] when each request's KV reaches the decode instance: FCFS in arrival order over
    `gpus` prefill GPUs (a prompt on the first GPU free), then the transfer."""
    free = [0.0] * gpus  # heap of the times each GPU is next free
    ready = np.zeros(arrival_ms.shape[0])
    one = prefill_memo(prefill_ms)
    for r in np.argsort(arrival_ms, kind="stable"):
        start = max(float(arrival_ms[r]), heapq.heappop(free))
        done = start + one(int(input_len[r]))
        heapq.heappush(free, done)
        ready[r] = done + transfer_ms_per_token * float(input_len[r])
    return ready


def prefill_memo(prefill_ms: PrefillFn | None) -> Callable[[int], float]:
    """One prompt's prefill time by its length, each length computed once (0 without one)."""
    cache: dict[int, float] = {}

    def one(n: int) -> float:
        if prefill_ms is None:
            return 0.0
        if n not in cache:
            cache[n] = float(prefill_ms(np.array([n], np.int64)))
        return cache[n]

    return one
