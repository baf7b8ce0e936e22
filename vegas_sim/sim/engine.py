"""SimPy engine: one decode instance running batched draft→verify iterations.

Model (DESIGN.md, "Simulator" → Engine):

- **Continuous batching and KV admission (vLLM V1).** Requests wait in a FCFS queue and join
  the running batch at an iteration boundary while there is a free slot (``max_batch``, vLLM's
  max_num_seqs) and the free KV blocks (``kv_block_size`` tokens each, vLLM's default 16) hold
  the request's context — its prompt, plus what it generated before a preemption — and the
  ``slack`` slots one step reserves (γ drafts + t0; vanilla 1). Admission is strict FCFS: if
  the head of the queue does not fit, nobody behind it is admitted. A running request holds
  ⌈(context + slack) / block⌉ blocks, growing as it generates, and frees them when it finishes.
- **Preemption (recompute).** When the next iteration's blocks would exceed the capacity, the
  most recently admitted running requests are preempted until the rest fit (the longest
  admission-order prefix that fits, as vLLM V1's scheduler pops its running list). They go to
  the front of the queue, earliest-admitted first, keep their pre-drawn token plan, and when
  readmitted are recomputed: their prompt + generated tokens are prefilled again on this
  instance (``recompute_fn``, in both prefill modes: the prefill instance of a disaggregated
  deployment only serves new prompts), stalling decoding. No prefix-cache hit is assumed.
  A request that cannot fit the cache alone is refused before the run (``engine_inputs.check_fits``).
- **Iterations.** Each iteration's time is ``cost(contexts)`` with every running request's own
  context (tokens in its KV cache at the start of the iteration). A request's tokens per
  iteration are ``accepted + 1`` (bonus token included), capped at the tokens it still needs.
  Vanilla produces one token per iteration.
- **Pre-drawn randomness.** Output lengths and each request's row of accepted-draft counts are
  drawn before the run (``AcceptanceDist.sample``). So a request's number of iterations and
  its per-iteration token increments are known at admission; the per-iteration Python work is
  one ``cost`` call, one SimPy timeout and three numpy ops on the running batch. Vanilla, whose
  cost is of Σ contexts alone, prices its iterations in blocks (``IterationCost.of_sums``); a
  drafting method's iterations between two membership changes are evaluated a block at a time
  (``IterationCost.of_contexts``) when the cost offers it: the same times, bit for bit. Per-request
  timelines (first token, finish), tokens and KV blocks per iteration are reconstructed
  afterwards from the iteration log and the running segments (`segments.Segments`).
- **Arrivals.** Closed loop (N users; a user submits its next request the instant its previous
  one finishes, zero think time), Poisson, or a trace of arrival times.
- **Prefill.** ``"co-located"``: newly admitted requests are prefilled on this instance,
  one after the other, stalling decoding; the time is ``prefill_ms(input_lens)`` (see
  ``predict.prefill_fn``: the latency model's 'prefill' phase when traced, else a roofline).
  ``"disaggregated"``: a prefill stage of its own, ``prefill_gpus`` GPUs serving prompts FCFS
  (each prompt on one GPU, ``prefill_ms`` of it), then the prompt's KV cache crosses to this
  instance in ``kv_transfer_ms_per_token`` × its length; open loop, a request joins the decode
  queue when its KV has arrived. A closed loop keeps this instance as the paper measures a
  decode GPU: the prefill stage runs ahead (a user's next prompt is prefilled while its
  previous request decodes), so admissions are not delayed and the request's prefill +
  transfer (``handoff_ms``) is counted before its admission.
- **First token** (``first_output_ms``): the prefill's own token, which no draft waits for,
  streamed once this instance holds the request: co-located, the end of the request's
  prefill here; disaggregated, its admission here (after the prefill stage's queue, the
  prefill and the transfer, and any wait for a decode slot or KV blocks). TTFT is that
  minus the arrival, plus ``handoff_ms`` (metrics). The decode iterations then produce
  the ``output_len`` tokens counted in throughput and TPOT (``first_token_ms`` is the end of
  the first decode iteration: the first decode chunk).
- **Determinism.** SimPy orders events by (time, priority, insertion counter), a total order;
  all randomness comes from generators seeded by ``np.random.SeedSequence``. Same seed ⇒
  identical result.

Time inside the engine is in milliseconds (``IterationCost`` returns ms).

Why one module for the run: the SimPy process, admission and preemption share one run's state
(the running set, the free blocks, the per-request cursors) inside the hot loop; what a run
takes and gives is `engine_config`.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from vegas_sim.errors import UserInputError
from vegas_sim.sim.engine_config import (
    PREFILL_MODES,
    AcceptanceSampler,
    CostFn,
    EngineConfig,
    EngineResult,
    PrefillFn,
)
from vegas_sim.sim.engine_inputs import (
    arrival_times_ms,
    check_fits,
    draw_token_plan,
    prefill_memo,
    prefill_stage,
    request_lengths,
)
from vegas_sim.sim.segments import Segments
from vegas_sim.sim.workload import Arrivals, Lengths, OutputLengths

__all__ = ["PREFILL_MODES", "AcceptanceSampler", "Arrivals", "CostFn", "EngineConfig", "EngineResult",
           "Lengths", "OutputLengths", "prefill_stage", "simulate"]

BREAKDOWN_STRIDE = 64  # sample IterationCost.breakdown every this many iterations (cheap)
VANILLA_BLOCK = 4096  # vanilla iterations evaluated at once, at most (`_iterate_vanilla`)
DRAFT_BLOCK = 128  # drafting iterations evaluated at once, at most (`_iterate_drafting`)


# ---------------------------------------------------------------------------- the instance
class _DecodeInstance:
    """State of the decode instance. Running requests are compact in slot arrays [:n]."""

    def __init__(self, env: simpy.Environment, cfg: EngineConfig, cost: CostFn,
                 prefill_fn: PrefillFn | None, recompute_fn: PrefillFn | None,
                 inp: np.ndarray, n_iters: np.ndarray, inc: np.ndarray | None) -> None:
        self.env, self.cfg, self.cost = env, cfg, cost
        self.prefill_fn, self.recompute_fn = prefill_fn, recompute_fn
        self.inp, self.n_iters = inp, n_iters
        self.cap_blocks = cfg.kv_capacity_blocks  # None: unlimited
        # blocks a running request can add in one iteration (its context grows <= slack)
        self.step_blocks = -(-cfg.slack // cfg.kv_block_size)
        self.width = 0 if inc is None else inc.shape[1]
        self.inc_flat = None if inc is None else inc.ravel()  # [R·W] int64
        n_req = inp.shape[0]
        self.resume_ctx = inp.copy()  # [R] context to hold at (re)admission
        self.done_iters = np.zeros(n_req, np.int64)  # [R] iterations run before preemption
        self.preempted = np.zeros(n_req, bool)  # [R] waiting to be recomputed
        b = cfg.max_batch
        self.ctx = np.zeros(b, np.int64)  # [B] context of each running slot
        self.pos = np.zeros(b, np.int64)  # [B] flat index of the slot's next increment
        self.fin = np.zeros(b, np.int64)  # [B] global iteration after which it finishes
        self.rid = np.zeros(b, np.int64)  # [B] request id in the slot
        self.seq = np.zeros(b, np.int64)  # [B] admission order (preemption takes the latest)
        self.start = np.zeros(b, np.int64)  # [B] global iteration its segment started at
        self.j0 = np.zeros(b, np.int64)  # [B] the request's own iteration index then
        self.tmp = np.zeros(b, np.int64)
        self.n = 0
        self._views()
        self.next_fin = -1
        self.it = 0  # global iteration counter
        self.admissions = 0
        self.check_at = 0  # next iteration whose KV need is computed exactly
        self.overflow = False  # the next iteration would not fit the KV cache
        self.queue: deque[int] = deque()
        self.wake: simpy.Event | None = None
        self.mem_blocked = False
        self.done = 0
        self.admit_ms = np.full(n_req, np.nan)
        self.prefilled_ms = np.full(n_req, np.nan)  # co-located: end of its prefill here
        self.first_iter = np.full(n_req, -1, np.int64)
        self.last_admission = math.nan
        self.segments: list[tuple[int, int, int, int]] = []  # (request, start, j0, iterations)
        self.preemptions = 0
        self.starts: list[float] = []
        self.dts: list[float] = []
        self.bd_sum: dict[str, float] = {}
        self.bd_iter_ms = 0.0
        self.prefill_total = 0.0
        self.recompute_total = 0.0
        self.on_finish: Callable[[int], None] | None = None
        # many iterations' costs at once: of Σ contexts alone (vanilla), or of the contexts
        # (IterationCost.of_contexts, drafting methods)
        self.of_sums = cost.of_sums if getattr(cost, "sum_only", False) else None  # type: ignore[attr-defined]
        self.of_contexts = getattr(cost, "of_contexts", None) if inc is not None else None

    def _views(self) -> None:
        """Views over the running prefix, rebuilt only when membership changes."""
        n = self.n
        self.ctx_v, self.pos_v, self.tmp_v = self.ctx[:n], self.pos[:n], self.tmp[:n]

    def _changed(self) -> None:
        """Membership changed: rebind views, find the next finish, check KV next iteration."""
        self._views()
        self.next_fin = int(self.fin[: self.n].min()) if self.n else -1
        self.check_at = self.it

    def _blocks_in_use(self) -> int:
        """Blocks the running requests need for the next iteration: context + slack each."""
        bs, slack = self.cfg.kv_block_size, self.cfg.slack
        return int(((self.ctx_v + (slack + bs - 1)) // bs).sum())

    # -- queue ------------------------------------------------------------------------
    def submit(self, r: int) -> None:
        self.queue.append(r)
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def _admit(self) -> list[int]:
        """FCFS: admit from the head while a slot is free and the free KV blocks hold the
        request's context (prompt + tokens generated before a preemption) plus one step's
        slack."""
        admitted: list[int] = []
        free = 0 if self.cap_blocks is None else self.cap_blocks - self._blocks_in_use()
        while self.queue and self.n < self.cfg.max_batch:
            r = self.queue[0]
            if self.cap_blocks is not None:
                need = self.cfg.blocks(int(self.resume_ctx[r]))
                if need > free:
                    self.mem_blocked = True  # until a finish or a preemption frees blocks
                    break
                free -= need
            self.queue.popleft()
            self._place(r)
            admitted.append(r)
        if admitted:
            self._changed()
        return admitted

    def _place(self, r: int) -> None:
        s, done = self.n, int(self.done_iters[r])
        self.ctx[s] = self.resume_ctx[r]
        self.pos[s] = r * self.width + done
        self.fin[s] = self.it + self.n_iters[r] - done
        self.rid[s], self.seq[s] = r, self.admissions
        self.start[s], self.j0[s] = self.it, done
        self.admissions += 1
        if self.first_iter[r] < 0:
            self.first_iter[r] = self.it
            self.admit_ms[r] = self.env.now
        self.last_admission = self.env.now
        self.n += 1

    def _end_segment(self, s: int) -> None:
        ran = self.it - int(self.start[s])
        if ran > 0:
            self.segments.append((int(self.rid[s]), int(self.start[s]), int(self.j0[s]), ran))

    def _keep_slots(self, keep: np.ndarray) -> None:
        for arr in (self.ctx, self.pos, self.fin, self.rid, self.seq, self.start, self.j0):
            arr[: keep.shape[0]] = arr[keep]
        self.n = int(keep.shape[0])
        self._changed()

    def _retire(self) -> None:
        """Remove the requests whose last iteration just ended (swap-compact the slots)."""
        n = self.n
        self.mem_blocked = False
        gone = np.flatnonzero(self.fin[:n] == self.it)  # [k] slots, ascending
        finished = [int(r) for r in self.rid[gone]]
        for s in gone:
            self._end_segment(int(s))
        self._keep_slots(np.flatnonzero(self.fin[:n] != self.it))
        for r in finished:
            self.done += 1
            if self.on_finish is not None:
                self.on_finish(r)

    def _preempt(self) -> None:
        """The next iteration does not fit: keep the longest admission-order prefix of the
        running requests that fits, and send the rest (the most recently admitted) to the
        front of the queue, earliest first, to be recomputed (vLLM V1's recompute policy)."""
        assert self.cap_blocks is not None
        n, bs, slack = self.n, self.cfg.kv_block_size, self.cfg.slack
        blocks = (self.ctx[:n] + (slack + bs - 1)) // bs  # [n]
        order = np.argsort(self.seq[:n], kind="stable")  # [n] slots, admission order
        fits = int(np.searchsorted(np.cumsum(blocks[order]), self.cap_blocks, side="right"))
        victims = order[fits:]  # never all: one request alone always fits (check_fits)
        for s in victims:
            r = int(self.rid[s])
            self._end_segment(int(s))
            self.done_iters[r] = int(self.j0[s]) + self.it - int(self.start[s])
            self.resume_ctx[r] = self.ctx[s]
            self.preempted[r] = True
        self.queue.extendleft(int(r) for r in self.rid[victims][::-1])
        self.preemptions += int(victims.shape[0])
        self.mem_blocked = True  # the victims cannot fit until a request finishes
        self.overflow = False
        self._keep_slots(np.sort(order[:fits]))

    # -- the process --------------------------------------------------------------------
    def run(self) -> Generator[simpy.Event, Any, None]:
        env, n_total = self.env, self.inp.shape[0]
        while self.done < n_total:
            if self.queue and self.n < self.cfg.max_batch:
                admitted = self._admit()
                if admitted:
                    yield from self._prefill(admitted)
            if self.n == 0:
                self.wake = env.event()
                yield self.wake
                self.wake = None
                continue
            yield from self._iterate_until_change()
            if self.overflow:
                self._preempt()

    def _prefill(self, admitted: list[int]) -> Generator[simpy.Event, Any, None]:
        """Co-located prefill of new prompts, and recompute of resumed requests (prompt +
        tokens generated before the preemption), one after another, stalling decoding."""
        fresh = [r for r in admitted if not self.preempted[r]]
        resumed = [r for r in admitted if self.preempted[r]]
        ms = 0.0
        if self.prefill_fn is not None and fresh:
            ms_new = float(self.prefill_fn(self.inp[fresh]))
            done = 0.0
            for r in fresh:  # one after another: each one's token exists at its own end
                done += float(self.prefill_fn(self.inp[[r]]))
                self.prefilled_ms[r] = self.env.now + done
            self.prefill_total += ms_new
            ms += ms_new
        if resumed:
            self.preempted[resumed] = False
            if self.recompute_fn is not None:
                ms_again = float(self.recompute_fn(self.resume_ctx[resumed]))
                self.recompute_total += ms_again
                ms += ms_again
        if resumed and ms > 0 or self.prefill_fn is not None and fresh:
            yield self.env.timeout(ms)

    def _iterate_until_change(self) -> Generator[simpy.Event, Any, None]:
        """Run iterations until a request finishes, one could be admitted, or the next
        iteration would overflow the KV cache.

        The hot loop: membership is fixed inside it, so the views are bound to locals once.
        Per iteration: one cost call and three numpy ops on [n] arrays. The SimPy clock is
        advanced by one timeout per iteration only while another event (an arrival) is
        scheduled; otherwise consecutive iterations are fused into one timeout at the end,
        which is the same timeline (nothing else can happen in between) without the
        per-event cost. An event due at or before an iteration's end is processed before the
        next iteration starts, exactly as with one timeout per iteration.

        KV invariant (limited cache): before every iteration runs, the blocks it needs —
        Σ ⌈(context + slack) / block⌉ over the running requests — are at most the capacity.
        The need is computed exactly at ``check_at`` only: with F blocks free then, each of
        the n requests adds at most ``step_blocks`` per iteration, so the next F // (n ·
        step_blocks) iterations fit without looking. When the exact need exceeds the
        capacity, the loop stops before that iteration and the caller preempts. With an
        unlimited cache (``check_at`` −1) the loop never looks.
        """
        if self.of_contexts is not None:
            yield from self._iterate_drafting()
            return
        if self.inc_flat is None and self.of_sums is not None:
            yield from self._iterate_vanilla()
            return
        env, cost, queue = self.env, self.cost, self.queue
        starts, dts = self.starts, self.dts
        ctx_v, pos_v, tmp_v, inc_flat = self.ctx_v, self.pos_v, self.tmp_v, self.inc_flat
        # only an arrival can make admission possible before the next finish
        room = self.n < self.cfg.max_batch and not self.mem_blocked
        it, next_fin = self.it, self.next_fin
        cap = self.cap_blocks
        check_at = -1 if cap is None else self.check_at
        step = self.n * self.step_blocks
        now = env.now
        while True:
            if it == check_at:
                check_at = self._next_check(it, step)
                if check_at < 0:
                    break
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
        yield from self._end_loop(now, it, check_at)

    def _iterate_vanilla(self) -> Generator[simpy.Event, Any, None]:
        """`_iterate_until_change` for vanilla, in blocks priced at once by `cost.of_sums` (bit
        for bit one call each; iteration j's contexts sum to Σ + n·j). A block ends before the
        next finish and the next exact KV check (the KV invariant, kept as there), after one
        iteration when a request could join, and at the first one ending at or after the next
        event, which is then let happen: the same iterations, times and clock."""
        env, queue, n, of_sums = self.env, self.queue, self.n, self.of_sums
        assert of_sums is not None, "a cost of Σ contexts alone"
        room = n < self.cfg.max_batch and not self.mem_blocked
        it, next_fin, cap = self.it, self.next_fin, self.cap_blocks
        check_at = -1 if cap is None else self.check_at
        now = env.now
        while True:
            if it == check_at:
                check_at = self._next_check(it, n * self.step_blocks)
                if check_at < 0:
                    break
            end = it + 1 if room and queue else min(
                next_fin, check_at if check_at >= 0 else next_fin, it + VANILLA_BLOCK)
            base = int(np.add.reduce(self.ctx_v))
            dt = of_sums((base + n * np.arange(end - it)).astype(np.float64), n)
            ctx0 = self.ctx_v
            k, now = yield from self._log_block(dt, now, it, lambda j: ctx0 + j)
            self.ctx_v += k
            it += k
            if it == next_fin or (room and queue):
                break
        yield from self._end_loop(now, it, check_at)

    def _next_check(self, it: int, step: int) -> int:
        """The iteration of the next exact KV check (the KV invariant: the blocks in use grow
        by at most `step` an iteration), or −1 (and `overflow` set) when they exceed the cache
        now."""
        free = self.cap_blocks - self._blocks_in_use()  # type: ignore[operator]
        if free < 0:
            self.overflow = True
            return -1
        return it + 1 + free // step

    def _log_block(self, dt: np.ndarray, now: float, it: int,
                   contexts_at: Callable[[int], np.ndarray]
                   ) -> Generator[simpy.Event, Any, tuple[int, float]]:
        """Log a block of iterations priced at once (`dt` [K] ms, from `now`, the first being
        iteration `it`; `contexts_at(j)`: iteration it + j's contexts, for the sampled
        breakdown) up to the first that ends at or after the next scheduled event, which is
        then let happen. Returns (iterations logged, the clock after them); the clock advances
        by sequential sums, as `now += dt` one at a time."""
        env = self.env
        times = np.cumsum(np.concatenate([[now], dt]))
        due = np.flatnonzero(times[1:] >= env.peek())
        k = int(due[0]) + 1 if due.size else len(dt)
        for j in range(-it % BREAKDOWN_STRIDE, k, BREAKDOWN_STRIDE):
            self._sample_breakdown(float(dt[j]), contexts_at(j))
        self.starts.extend(times[:k].tolist())
        self.dts.extend(dt[:k].tolist())
        now = float(times[k])
        if due.size:  # an event is due during iteration k − 1: let it happen
            yield env.timeout(now - env.now)
            now = env.now
        return k, now

    def _end_loop(self, now: float, it: int, check_at: int) -> Generator[simpy.Event, Any, None]:
        if now > self.env.now:  # bring the clock to the end of the last fused iteration
            yield self.env.timeout(now - self.env.now)
        self.it, self.check_at = it, check_at
        if it == self.next_fin:
            self._retire()

    def _iterate_drafting(self) -> Generator[simpy.Event, Any, None]:
        """`_iterate_until_change` for a drafting method whose cost evaluates many iterations
        at once: the same iterations, times and clock, a block of them per numpy pass.

        Membership is fixed until the next finish, so the contexts at the start of each of the
        next K iterations are the running contexts plus the exclusive cumulative sum of the
        requests' pre-drawn increments [K, n]; their times are `of_contexts` of those rows
        (what the per-iteration call gives, bit for bit). The KV need is computed for every
        row, and the block ends before the first iteration that would overflow (the one the
        per-iteration loop's exact check stops at), after one iteration when a waiting request
        could be admitted, and at the first iteration that ends at or after the next scheduled
        event, which is then processed as there. The clock advances by sequential sums.
        """
        env, queue, n, inc_flat = self.env, self.queue, self.n, self.inc_flat
        assert inc_flat is not None and self.of_contexts is not None
        room = n < self.cfg.max_batch and not self.mem_blocked
        it, next_fin, cap = self.it, self.next_fin, self.cap_blocks
        bs = self.cfg.kv_block_size
        pad = self.cfg.slack + bs - 1
        now = env.now
        while True:
            size = 1 if room and queue else min(next_fin - it, DRAFT_BLOCK)
            inc = inc_flat[self.pos_v[None, :] + np.arange(size)[:, None]]  # [K, n]
            ctx = np.cumsum(inc, axis=0)
            ctx -= inc
            ctx += self.ctx_v  # [K, n] contexts at the start of each iteration
            k = size
            if cap is not None:
                over = np.flatnonzero(np.add.reduce((ctx + pad) // bs, axis=1) > cap)
                k = int(over[0]) if over.size else size
                if k == 0:
                    self.overflow = True
                    break
            dt = self.of_contexts(ctx[:k])
            k, now = yield from self._log_block(dt, now, it, ctx.__getitem__)
            self.ctx_v += np.add.reduce(inc[:k], axis=0)
            self.pos_v += k
            it += k
            if it == next_fin or (room and queue):
                break
        yield from self._end_loop(now, it, it)  # the next loop computes the need exactly

    def _sample_breakdown(self, dt: float, contexts: np.ndarray | None = None) -> None:
        contexts = self.ctx_v if contexts is None else contexts
        for phase, ms in self.cost.breakdown(contexts).items():
            self.bd_sum[phase] = self.bd_sum.get(phase, 0.0) + float(ms)
        self.bd_iter_ms += dt


def _arrival_process(env: simpy.Environment, inst: _DecodeInstance, ready_ms: np.ndarray,
                     submitted_ms: np.ndarray) -> Generator[simpy.Event, Any, None]:
    """Submit each request to the decode queue when it is ready there (its arrival, or its
    KV hand-over from the prefill stage), in the order they become ready; `submitted_ms`
    gets the clock at each submission."""
    for r in np.argsort(ready_ms, kind="stable"):
        t = float(ready_ms[r])
        if t > env.now:
            yield env.timeout(t - env.now)
        submitted_ms[r] = env.now
        inst.submit(int(r))


# ---------------------------------------------------------------------------- entry point
def simulate(
    cfg: EngineConfig,
    cost: CostFn,
    acceptance: AcceptanceSampler | None,
    *,
    seed: int | np.random.SeedSequence = 0,
    prefill_fn: PrefillFn | None = None,
    recompute_fn: PrefillFn | None = None,
) -> EngineResult:
    """Run one simulation; deterministic for a seed.

    The seed's SeedSequence spawns three streams — lengths, arrivals, acceptance — so a
    vanilla run and a speculative run with the same seed see the same requests at the same
    times (common random numbers). ``acceptance`` is None for vanilla. ``prefill_fn`` is
    required for ``prefill="co-located"``; with ``"disaggregated"`` it times the prefill
    stage (none given: the stage takes no time, the transfer alone remains).
    ``recompute_fn`` (default ``prefill_fn``) is the time to recompute resumed requests' KV (their prompt + generated tokens) on this
    instance, in either prefill mode; with neither given, recompute takes no time.
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
    inp, out = request_lengths(cfg, rng_len)
    check_fits(cfg, inp, out)
    hist, n_iters, inc = draw_token_plan(acceptance, rng_acc, out, cfg.gamma)

    env = simpy.Environment()
    inst = _DecodeInstance(env, cfg, cost, prefill_fn if cfg.prefill == "co-located" else None,
                           recompute_fn if recompute_fn is not None else prefill_fn,
                           inp, n_iters, inc)
    arrival_ms = np.zeros(n)
    handoff = np.zeros(n)
    staged = cfg.prefill == "disaggregated"
    if staged and cfg.arrivals.kind == "closed":  # the prefill stage runs ahead (docstring)
        one = prefill_memo(prefill_fn)
        handoff = np.array([one(int(x)) + cfg.kv_transfer_ms_per_token * float(x)
                            for x in inp])
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
        times = arrival_times_ms(cfg, rng_arr)
        ready = (prefill_stage(times, inp, prefill_fn, cfg.prefill_gpus,
                               cfg.kv_transfer_ms_per_token) if staged else times)
        stamped = np.zeros(n)
        env.process(_arrival_process(env, inst, ready, stamped))
    env.process(inst.run())
    env.run()
    if cfg.arrivals.kind != "closed":  # arrivals on the clock, as the process saw them
        arrival_ms[:] = times if staged else stamped
    res = _collect(cfg, inst, hist, inc, inp, out, arrival_ms, time.perf_counter() - wall0)
    # the prefill's token, streamed once the decode instance holds the request
    res.first_output_ms = (inst.prefilled_ms if cfg.prefill == "co-located"
                           else inst.admit_ms).copy()
    res.handoff_ms = handoff
    res.queued_ms = stamped if cfg.arrivals.kind != "closed" else arrival_ms.copy()
    return res


# ---------------------------------------------------------------------------- collection
def _collect(cfg: EngineConfig, inst: _DecodeInstance, hist: np.ndarray,
             inc: np.ndarray | None, inp: np.ndarray, out: np.ndarray, arrival_ms: np.ndarray,
             wall_s: float) -> EngineResult:
    """Rebuild per-iteration tokens, KV and per-request timelines from the iteration log and
    the running segments."""
    starts = np.asarray(inst.starts, dtype=np.float64)  # [I]
    dts = np.asarray(inst.dts, dtype=np.float64)  # [I]
    n_it, n_req = starts.shape[0], inp.shape[0]
    ends = starts + dts
    seg = Segments.from_log(inst.segments)
    g0 = inst.first_iter  # [R]
    last = seg.last_iter(n_req)
    iter_batch = seg.running(n_it)
    iter_tokens, emitted = seg.tokens(inc, n_req, n_it, iter_batch)
    iter_new = np.bincount(g0, minlength=n_it).astype(np.int64)
    scale = 0.0
    if inst.bd_iter_ms > 0 and n_it:
        # sampled phases scaled so that they sum to the mean iteration time of the whole run
        scale = float(dts.mean()) / inst.bd_iter_ms
    breakdown = {p: v * scale for p, v in inst.bd_sum.items()}
    return EngineResult(
        config=cfg, input_len=inp, output_len=out, arrival_ms=arrival_ms,
        admit_ms=inst.admit_ms, first_iter=g0, last_iter=last, n_iters=inst.n_iters,
        first_token_ms=ends[g0], finish_ms=ends[last], emitted=emitted,
        iter_start_ms=starts, iter_ms=dts, iter_batch=iter_batch, iter_tokens=iter_tokens,
        iter_new=iter_new,
        iter_kv_blocks=seg.kv_blocks(inp, inc, cfg.slack, cfg.kv_block_size, n_it),
        seg_request=seg.request, seg_first_iter=seg.first_iter,
        seg_first_local=seg.first_local, seg_iters=seg.iters,
        accepted_hist=hist.astype(np.int64), breakdown_ms=breakdown,
        prefill_ms_total=inst.prefill_total, wall_s=wall_s, preemptions=inst.preemptions,
        recompute_ms_total=inst.recompute_total, last_admission_ms=inst.last_admission,
    )
