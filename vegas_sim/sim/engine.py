"""SimPy engine: one decode instance running batched draft→verify iterations.

Model (DESIGN.md, "Simulator" → Engine):

- **Continuous batching.** Requests wait in a FCFS queue and join the running batch at an
  iteration boundary when there is a free slot (``max_batch``) and KV-cache room. A request
  reserves ``input_len + output_len + gamma + 1`` KV slots at admission (its whole future plus
  the drafts of its last iteration) and frees them when it finishes. Admission is strict FCFS:
  if the head of the queue does not fit, nobody behind it is admitted.
- **Iterations.** Each iteration's time is ``cost(contexts)`` with every running request's own
  context (tokens in its KV cache at the start of the iteration). A request's tokens per
  iteration are ``accepted + 1`` (bonus token included), capped at the tokens it still needs.
  Vanilla produces one token per iteration.
- **Pre-drawn randomness.** Output lengths and each request's row of accepted-draft counts are
  drawn before the run (``AcceptanceDist.sample``). So a request's number of iterations and
  its per-iteration token increments are known at admission; the per-iteration Python work is
  one ``cost`` call, one SimPy timeout and three numpy ops on the running batch. Per-request
  timelines (first token, finish) are reconstructed afterwards from the iteration log.
- **Arrivals.** Closed loop (N users; a user submits its next request the instant its previous
  one finishes, zero think time), Poisson, or a trace of arrival times.
- **Prefill.** ``"disaggregated"``: requests arrive with the prompt already in the KV cache; no
  prefill time here. ``"co-located"``: newly admitted requests are prefilled on this instance,
  one after the other, stalling decoding; the time is ``prefill_ms(input_lens)`` (see
  ``predict.prefill_fn``: the latency model's 'prefill' phase when traced, else a roofline).
  The prefill fills the KV cache only; all ``output_len`` tokens come from decode iterations.
- **Determinism.** SimPy orders events by (time, priority, insertion counter), a total order;
  all randomness comes from generators seeded by ``np.random.SeedSequence``. Same seed ⇒
  identical result.

Time inside the engine is in milliseconds (``IterationCost`` returns ms).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import simpy

from vegas_sim.errors import UserInputError

PREFILL_MODES = ("disaggregated", "co-located")
BREAKDOWN_STRIDE = 64  # sample IterationCost.breakdown every this many iterations (cheap)


# ---------------------------------------------------------------------------- interfaces
class CostFn(Protocol):
    """What the engine needs of `latency.IterationCost`."""

    def __call__(self, contexts: np.ndarray) -> float: ...

    def breakdown(self, contexts: np.ndarray) -> dict[str, float]: ...


class AcceptanceSampler(Protocol):
    """What the engine needs of `acceptance.AcceptanceDist`."""

    gamma: int

    @property
    def mean_length(self) -> float: ...

    def sample(
        self, rng: np.random.Generator, n_requests: int, n_iterations: int
    ) -> np.ndarray: ...


PrefillFn = Callable[[np.ndarray], float]  # input lengths [k] -> ms to prefill them


# ---------------------------------------------------------------------------- workload
@dataclass(frozen=True)
class Lengths:
    """Input/output lengths of the requests.

    kind:
    - ``"fixed"``: every request has (input_len, output_len).
    - ``"uniform"``: each length uniform in [x·(1−spread), x·(1+spread)], rounded, ≥ 1.
    - ``"lognormal"``: each length x·exp(σ·z − σ²/2) with σ = spread (mean x), rounded, ≥ 1.
    - ``"dataset"``: pairs drawn uniformly with replacement from ``pairs``.
    """

    input_len: int = 1024
    output_len: int = 256
    kind: str = "fixed"
    spread: float = 0.0
    pairs: tuple[tuple[int, int], ...] = ()

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

    def max_total(self) -> int:
        """Upper bound of input + output over the requests this can draw (for memory checks)."""
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
    that override ``Lengths``.
    """

    kind: str = "closed"
    users: int | None = None
    rate_per_s: float = 0.0
    times_s: tuple[float, ...] = ()
    trace_lengths: tuple[tuple[int, int], ...] = ()

    @classmethod
    def parse(cls, text: str) -> Arrivals:
        """'closed', 'closed:<users>' or 'poisson:<rate/s>' (the --arrival option)."""
        kind, _, arg = text.partition(":")
        try:
            if kind == "closed":
                return cls("closed", users=int(arg) if arg else None)
            if kind == "poisson" and arg:
                return cls("poisson", rate_per_s=float(arg))
        except ValueError:
            pass
        raise UserInputError(f"cannot parse arrival {text!r}", where="--arrival",
                             fix="use 'closed', 'closed:<users>' or 'poisson:<rate per second>'")

    @classmethod
    def trace(cls, times_s: Sequence[float],
              lengths: Sequence[tuple[int, int]] | None = None) -> Arrivals:
        return cls("trace", times_s=tuple(float(t) for t in times_s),
                   trace_lengths=tuple((int(i), int(o)) for i, o in (lengths or ())))

    def validate(self, n_requests: int) -> None:
        if self.kind == "closed":
            if self.users is not None and self.users < 1:
                raise UserInputError("closed loop needs >= 1 user", where="--arrival",
                                     fix="use closed:<users> with users >= 1")
        elif self.kind == "poisson":
            if not self.rate_per_s > 0:
                raise UserInputError(f"Poisson rate must be > 0, got {self.rate_per_s}",
                                     where="--arrival", fix="use poisson:<rate/s>, e.g. poisson:2")
        elif self.kind == "trace":
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


@dataclass(frozen=True)
class EngineConfig:
    """One simulated run. ``kv_capacity_tokens`` None = unlimited KV cache."""

    method: str
    gamma: int
    max_batch: int
    n_requests: int
    lengths: Lengths = field(default_factory=Lengths)
    arrivals: Arrivals = field(default_factory=Arrivals)
    kv_capacity_tokens: int | None = None
    prefill: str = "disaggregated"

    @property
    def is_vanilla(self) -> bool:
        return self.method == "vanilla"

    @property
    def slack(self) -> int:
        """KV slots beyond input + output a request reserves: the γ drafts and t0 (1 vanilla)."""
        return 1 if self.is_vanilla else self.gamma + 1

    def validate(self) -> None:
        if self.max_batch < 1:
            raise UserInputError(f"max batch must be >= 1, got {self.max_batch}",
                                 where="--batch", fix="pass --batch 1 or more")
        if self.n_requests < 1:
            raise UserInputError(f"requests must be >= 1, got {self.n_requests}",
                                 where="--requests", fix="pass --requests 1 or more")
        if self.gamma < 1:
            raise UserInputError(f"gamma must be >= 1, got {self.gamma}", where="--gamma",
                                 fix="draft at least one token")
        if self.prefill not in PREFILL_MODES:
            raise UserInputError(f"unknown prefill mode {self.prefill!r}", where="--prefill",
                                 fix=f"use one of: {', '.join(PREFILL_MODES)}")
        self.lengths.validate()
        self.arrivals.validate(self.n_requests)


# ---------------------------------------------------------------------------- result
@dataclass
class EngineResult:
    """Everything one run produced. Times in ms; arrays indexed by request id or iteration."""

    config: EngineConfig
    # per request [R]
    input_len: np.ndarray
    output_len: np.ndarray
    arrival_ms: np.ndarray
    admit_ms: np.ndarray
    first_iter: np.ndarray  # global index of the request's first iteration
    n_iters: np.ndarray  # iterations the request took part in
    first_token_ms: np.ndarray  # end of its first iteration
    finish_ms: np.ndarray  # end of its last iteration
    # per iteration [I]
    iter_start_ms: np.ndarray
    iter_ms: np.ndarray
    iter_batch: np.ndarray  # running requests
    iter_tokens: np.ndarray  # tokens produced
    iter_new: np.ndarray  # requests in their first iteration
    # acceptance actually used (drawn, before truncation at the output length)
    accepted_hist: np.ndarray  # [gamma + 1] count of iterations with k accepted drafts
    breakdown_ms: dict[str, float]  # mean ms per iteration by phase (sampled)
    prefill_ms_total: float
    wall_s: float

    @property
    def iterations(self) -> int:
        return int(self.iter_ms.shape[0])

    @property
    def sim_time_ms(self) -> float:
        return float(self.finish_ms.max()) if self.finish_ms.size else 0.0

    @property
    def iter_end_ms(self) -> np.ndarray:
        return self.iter_start_ms + self.iter_ms


# ---------------------------------------------------------------------------- pre-draw
def _draw_token_plan(
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
    n_iters = np.sum(cum < out[:, None], axis=1) + 1  # first k with cum >= out, 1-based
    ran = np.arange(acc.shape[1])[None, :] < n_iters[:, None]  # [R, W]
    hist = np.bincount(acc[ran], minlength=gamma + 1).astype(np.int64)
    del acc, ran
    np.minimum(cum, out[:, None], out=cum)
    inc = np.diff(cum, axis=1, prepend=0)  # [R, W] int64, 0 after finishing
    return hist, n_iters.astype(np.int64), inc


# ---------------------------------------------------------------------------- the instance
class _DecodeInstance:
    """State of the decode instance. Running requests are compact in slot arrays [:n]."""

    def __init__(self, env: simpy.Environment, cfg: EngineConfig, cost: CostFn,
                 prefill_fn: PrefillFn | None, inp: np.ndarray, out: np.ndarray,
                 n_iters: np.ndarray, inc: np.ndarray | None) -> None:
        self.env, self.cfg, self.cost, self.prefill_fn = env, cfg, cost, prefill_fn
        self.inp, self.n_iters = inp, n_iters
        self.need = inp + out + cfg.slack  # [R] KV slots reserved per request
        self.free_kv = cfg.kv_capacity_tokens if cfg.kv_capacity_tokens is not None else -1
        self.width = 0 if inc is None else inc.shape[1]
        self.inc_flat = None if inc is None else inc.ravel()  # [R·W] int64
        b = cfg.max_batch
        self.ctx = np.zeros(b, np.int64)  # [B] context of each running slot
        self.pos = np.zeros(b, np.int64)  # [B] flat index of the slot's next increment
        self.fin = np.zeros(b, np.int64)  # [B] global iteration after which it finishes
        self.rid = np.zeros(b, np.int64)  # [B] request id in the slot
        self.tmp = np.zeros(b, np.int64)
        self.n = 0
        self._views()
        self.next_fin = -1
        self.it = 0  # global iteration counter
        self.queue: deque[int] = deque()
        self.wake: simpy.Event | None = None
        self.mem_blocked = False
        self.done = 0
        self.admit_ms = np.full(inp.shape[0], np.nan)
        self.first_iter = np.full(inp.shape[0], -1, np.int64)
        self.starts: list[float] = []
        self.dts: list[float] = []
        self.bd_sum: dict[str, float] = {}
        self.bd_iter_ms = 0.0
        self.prefill_total = 0.0
        self.on_finish: Callable[[int], None] | None = None

    def _views(self) -> None:
        """Views over the running prefix, rebuilt only when membership changes."""
        n = self.n
        self.ctx_v, self.pos_v, self.tmp_v = self.ctx[:n], self.pos[:n], self.tmp[:n]

    # -- queue ------------------------------------------------------------------------
    def submit(self, r: int) -> None:
        self.queue.append(r)
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def _admit(self) -> list[int]:
        """FCFS: admit from the head while a slot and KV room are free."""
        admitted: list[int] = []
        unlimited = self.cfg.kv_capacity_tokens is None
        while self.queue and self.n < self.cfg.max_batch:
            r = self.queue[0]
            need = int(self.need[r])
            if not unlimited and need > self.free_kv:
                self.mem_blocked = True  # until a finish frees KV room
                break
            self.queue.popleft()
            if not unlimited:
                self.free_kv -= need
            s = self.n
            self.ctx[s] = self.inp[r]
            self.pos[s] = r * self.width
            self.fin[s] = self.it + self.n_iters[r]
            self.rid[s] = r
            self.first_iter[r] = self.it
            self.admit_ms[r] = self.env.now
            self.n += 1
            admitted.append(r)
        if admitted:
            self._views()
            self.next_fin = int(self.fin[: self.n].min())
        return admitted

    def _retire(self) -> None:
        """Remove the requests whose last iteration just ended (swap-compact the slots)."""
        n = self.n
        self.mem_blocked = False
        gone = np.flatnonzero(self.fin[:n] == self.it)  # [k] slots, ascending
        finished = [int(r) for r in self.rid[gone]]
        keep = np.flatnonzero(self.fin[:n] != self.it)
        for arr in (self.ctx, self.pos, self.fin, self.rid):
            arr[: keep.shape[0]] = arr[keep]
        self.n = int(keep.shape[0])
        self._views()
        self.next_fin = int(self.fin[: self.n].min()) if self.n else -1
        for r in finished:
            if self.cfg.kv_capacity_tokens is not None:
                self.free_kv += int(self.need[r])
            self.done += 1
            if self.on_finish is not None:
                self.on_finish(r)

    # -- the process --------------------------------------------------------------------
    def run(self) -> Generator[simpy.Event, Any, None]:
        env, n_total = self.env, self.inp.shape[0]
        while self.done < n_total:
            if self.queue and self.n < self.cfg.max_batch:
                admitted = self._admit()
                if admitted and self.prefill_fn is not None:
                    ms = float(self.prefill_fn(self.inp[admitted]))
                    self.prefill_total += ms
                    yield env.timeout(ms)
            if self.n == 0:
                self.wake = env.event()
                yield self.wake
                self.wake = None
                continue
            yield from self._iterate_until_change()

    def _iterate_until_change(self) -> Generator[simpy.Event, Any, None]:
        """Run iterations until a request finishes or one could be admitted.

        The hot loop: membership is fixed inside it, so the views are bound to locals once.
        Per iteration: one cost call and three numpy ops on [n] arrays. The SimPy clock is
        advanced by one timeout per iteration only while another event (an arrival) is
        scheduled; otherwise consecutive iterations are fused into one timeout at the end,
        which is the same timeline (nothing else can happen in between) without the
        per-event cost. An event due at or before an iteration's end is processed before the
        next iteration starts, exactly as with one timeout per iteration.
        """
        env, cost, queue = self.env, self.cost, self.queue
        starts, dts = self.starts, self.dts
        ctx_v, pos_v, tmp_v, inc_flat = self.ctx_v, self.pos_v, self.tmp_v, self.inc_flat
        # only an arrival can make admission possible before the next finish
        room = self.n < self.cfg.max_batch and not self.mem_blocked
        it, next_fin = self.it, self.next_fin
        now = env.now
        while True:
            dt = cost(ctx_v)
            if it % BREAKDOWN_STRIDE == 0:
                self._sample_breakdown(dt)
            starts.append(now)
            dts.append(dt)
            now += dt
            if now >= env.peek():  # an arrival is due during this iteration: let it happen
                yield env.timeout(now - env.now)
                now = env.now
            if inc_flat is None:  # vanilla: one token each
                ctx_v += 1
            else:
                inc_flat.take(pos_v, out=tmp_v)
                ctx_v += tmp_v
                pos_v += 1
            it += 1
            if it == next_fin or (room and queue):
                break
        if now > env.now:  # bring the clock to the end of the last fused iteration
            yield env.timeout(now - env.now)
        self.it = it
        if it == next_fin:
            self._retire()

    def _sample_breakdown(self, dt: float) -> None:
        for phase, ms in self.cost.breakdown(self.ctx_v).items():
            self.bd_sum[phase] = self.bd_sum.get(phase, 0.0) + float(ms)
        self.bd_iter_ms += dt


def _arrival_process(env: simpy.Environment, inst: _DecodeInstance,
                     times_ms: np.ndarray, arrival_ms: np.ndarray
                     ) -> Generator[simpy.Event, Any, None]:
    for r, t in enumerate(times_ms):
        if t > env.now:
            yield env.timeout(float(t) - env.now)
        arrival_ms[r] = env.now
        inst.submit(r)


# ---------------------------------------------------------------------------- entry point
def simulate(
    cfg: EngineConfig,
    cost: CostFn,
    acceptance: AcceptanceSampler | None,
    *,
    seed: int | np.random.SeedSequence = 0,
    prefill_fn: PrefillFn | None = None,
) -> EngineResult:
    """Run one simulation; deterministic for a seed.

    The seed's SeedSequence spawns three streams — lengths, arrivals, acceptance — so a
    vanilla run and a speculative run with the same seed see the same requests at the same
    times (common random numbers). ``acceptance`` is None for vanilla. ``prefill_fn`` is
    required for ``prefill="co-located"``.
    """
    cfg.validate()
    if cfg.is_vanilla != (acceptance is None):
        raise UserInputError("vanilla takes no acceptance distribution; other methods need one",
                             where="simulate", fix="pass acceptance=None only for vanilla")
    if acceptance is not None and acceptance.gamma != cfg.gamma:
        raise UserInputError(f"acceptance is for gamma={acceptance.gamma}, run has {cfg.gamma}",
                             where="simulate", fix="look up the acceptance at the run's gamma")
    if cfg.prefill == "co-located" and prefill_fn is None:
        raise UserInputError("co-located prefill needs a prefill time function",
                             where="--prefill", fix="pass prefill_fn or use disaggregated")
    wall0 = time.perf_counter()
    ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    rng_len, rng_arr, rng_acc = (np.random.default_rng(s) for s in ss.spawn(3))
    n = cfg.n_requests
    inp, out = _request_lengths(cfg, rng_len)
    _check_fits(cfg, inp, out)
    hist, n_iters, inc = _draw_token_plan(acceptance, rng_acc, out, cfg.gamma)

    env = simpy.Environment()
    inst = _DecodeInstance(env, cfg, cost, prefill_fn if cfg.prefill == "co-located" else None,
                           inp, out, n_iters, inc)
    arrival_ms = np.zeros(n)
    if cfg.arrivals.kind == "closed":
        users = min(cfg.arrivals.users or cfg.max_batch, n)
        submitted = [users]

        def next_request(_: int) -> None:  # a user's request finished: submit its next one
            if submitted[0] < n:
                arrival_ms[submitted[0]] = env.now
                inst.submit(submitted[0])
                submitted[0] += 1

        inst.on_finish = next_request
        for r in range(users):
            inst.submit(r)
    else:
        env.process(_arrival_process(env, inst, _arrival_times_ms(cfg, rng_arr), arrival_ms))
    env.process(inst.run())
    env.run()
    return _collect(cfg, inst, hist, inc, inp, out, arrival_ms, time.perf_counter() - wall0)


def _request_lengths(cfg: EngineConfig, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if cfg.arrivals.kind == "trace" and cfg.arrivals.trace_lengths:
        pairs = np.asarray(cfg.arrivals.trace_lengths, dtype=np.int64)  # [R, 2]
        if pairs.min() < 1:
            raise UserInputError("trace lengths must be >= 1", where="arrival trace",
                                 fix="drop requests with zero lengths")
        return pairs[:, 0].copy(), pairs[:, 1].copy()
    return cfg.lengths.draw(rng, cfg.n_requests)


def _check_fits(cfg: EngineConfig, inp: np.ndarray, out: np.ndarray) -> None:
    """A request larger than the whole KV cache would wait forever: refuse up front."""
    if cfg.kv_capacity_tokens is None:
        return
    need = int((inp + out).max()) + cfg.slack
    if need > cfg.kv_capacity_tokens:
        raise UserInputError(
            f"a request needs {need} KV slots (input + output + {cfg.slack}) but the KV cache "
            f"holds {cfg.kv_capacity_tokens} tokens",
            where="--context/--output-len", fix="shorten the request or give more KV capacity")


def _arrival_times_ms(cfg: EngineConfig, rng: np.random.Generator) -> np.ndarray:
    if cfg.arrivals.kind == "poisson":
        gaps = rng.exponential(1000.0 / cfg.arrivals.rate_per_s, size=cfg.n_requests)
        return np.cumsum(gaps)
    return np.asarray(cfg.arrivals.times_s, dtype=np.float64) * 1000.0


# ---------------------------------------------------------------------------- collection
def _collect(cfg: EngineConfig, inst: _DecodeInstance, hist: np.ndarray,
             inc: np.ndarray | None, inp: np.ndarray, out: np.ndarray, arrival_ms: np.ndarray,
             wall_s: float) -> EngineResult:
    """Rebuild per-iteration tokens and per-request timelines from the iteration log."""
    starts = np.asarray(inst.starts, dtype=np.float64)  # [I]
    dts = np.asarray(inst.dts, dtype=np.float64)  # [I]
    n_it = starts.shape[0]
    ends = starts + dts
    g0, k = inst.first_iter, inst.n_iters  # [R]
    # running requests per iteration: +1 at the first iteration, -1 after the last
    delta = np.bincount(g0, minlength=n_it + 1) - np.bincount(g0 + k, minlength=n_it + 1)
    iter_batch = np.cumsum(delta)[:n_it].astype(np.int64)
    if inc is None:
        iter_tokens = iter_batch.copy()  # vanilla: one token per request per iteration
    else:
        # (request, local iteration j < k) ran in global iteration g0 + j
        cols = np.arange(int(k.max()))  # [W']
        ran = cols[None, :] < k[:, None]  # [R, W']
        glob = (g0[:, None] + cols[None, :])[ran]  # [Σk]
        toks = inc[:, : cols.shape[0]][ran]  # [Σk]
        iter_tokens = np.bincount(glob, weights=toks, minlength=n_it).astype(np.int64)
    iter_new = np.bincount(g0, minlength=n_it).astype(np.int64)
    scale = 0.0
    if inst.bd_iter_ms > 0 and n_it:
        # sampled phases scaled so that they sum to the mean iteration time of the whole run
        scale = float(dts.mean()) / inst.bd_iter_ms
    breakdown = {p: v * scale for p, v in inst.bd_sum.items()}
    return EngineResult(
        config=cfg, input_len=inp, output_len=out, arrival_ms=arrival_ms,
        admit_ms=inst.admit_ms, first_iter=g0, n_iters=k,
        first_token_ms=ends[g0], finish_ms=ends[g0 + k - 1],
        iter_start_ms=starts, iter_ms=dts, iter_batch=iter_batch, iter_tokens=iter_tokens,
        iter_new=iter_new, accepted_hist=hist.astype(np.int64), breakdown_ms=breakdown,
        prefill_ms_total=inst.prefill_total, wall_s=wall_s,
    )
