"""Measuring the latency grid: for every (batch B, context C) point, a synthetic state (random
KV at C, no prefill, so 128K contexts cost nothing to set up) is timed phase by phase. Each
latency row carries exactly the quantities of `methods.iteration_plan` (phase, method, batch,
context, n_query, kv_read per request, collect_rows), so the latency model is fitted on the
numbers it is later evaluated at:

- ``decode`` and ``sample`` of vanilla: `SpecDecoder.decode` (dense single-token forward,
  n_query 1, kv_read C+1, then sampling);
- ``draft_step`` (and ``quest_meta`` for Quest) for each drafting *kernel path* × sparsity:
  StreamingLLM, Quest, and "selected keys" (shared by vegas, vegas-all and specextend, which
  run the same draft kernel on the same budget — the rows are written once per method);
  one row per draft step of γ = `DRAFT_GAMMA` with that step's kv_read, sparsities whose
  budgets coincide at this C measured once; quest_meta pooled over sparsities (its quantity,
  pages scored, does not depend on them);
- ``verify`` for each n_query = γ+1 of the plan and each score-collection setting its
  methods use (0 rows: magicdec; 2: vegas; all: vegas-all / specextend; 0 is always
  measured as the baseline for the collection overhead), at the reference sparsity;
- ``select`` (vegas: 2 rows averaged; vegas-all: all rows; specextend: the last accepted row)
  and the speculative ``sample`` (acceptance of γ+1 rows) for each n_query; with
  `verify_after_draft` these three are timed inside whole iterations (γ draft steps first).

Host gaps (device idle while the host works: launches, bookkeeping after a sync) are
charged to ``sample``; vanilla and verify repetitions chain `HOST_GAP_CHAIN` iterations so
that a repetition's first launch and last sync are shared, as in the running loop; a
repetition's wall is the timed chain's own.

With `greedy_latency` the phases sampling touches (schema.SAMPLING_PHASES: ``draft_step``,
and ``sample`` of vanilla and of the speculative acceptance) are timed again greedy (T 0: no
top-k / top-p filter, no draw) at the points of `greedy_batches`, the drafts at
`greedy_sparsities`. The greedy pass runs every phase of those points but keeps only the
sampling phases' rows: verify, select, quest_meta and decode run the same kernels either way.
Every row records the temperature it ran at.

Every configuration runs `warmup` untimed, then `reps` timed repetitions through the
SpecDecoder phase API and a PhaseTimer (CUDA events, resolved once at the end); each row
holds the median / p10 / p90 over the timed samples and their count. The synthetic state
rolls every repetition back to the same C, so every sample is at exactly the row's context
(whatever the model accepts). Contexts are capped at max_positions − 2γ − 2 (a 128K grid
point of a 128K model is measured at 131072 − 32 and its rows say so).

Why one module of ~630 lines: every phase's measurement shares the synthetic state, the
rollback to the point's context and the host-gap accounting (`Timed`, `with_host_gap`); the
phases differ only in the few lines that call the decoder.
"""

from __future__ import annotations

import functools
import gc
import math
import time
from collections.abc import Callable, Sequence
import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from vegas_sim.calibrate import hardware
from vegas_sim.calibrate.plan import (
    DRAFT_GAMMA,
    DRAFT_PATHS,
    CalibrationPlan,
    LatencyPoint,
    effective_context,
    greedy_batches,
    greedy_sparsities,
    latency_temperature,
)
from vegas_sim.calibrate.runtime import DenseAttention, GraphedForward, capture_cuda_graph
from vegas_sim.calibrate.sampling import sampling_args, token_probs
from vegas_sim.calibrate.specdec import SpecConfig, SpecDecoder, state_headroom
from vegas_sim.calibrate.timers import PhaseTimer
from vegas_sim.errors import UserInputError
from vegas_sim.kernels import ops
from vegas_sim.methods import (
    INDEX_PREP_METHODS,
    QUEST_PAGE,
    collect_rows,
    draft_kv_read,
    method_of,
)
from vegas_sim.models import ModelSpec
from vegas_sim.traces.schema import (
    LATENCY_SCHEMA,
    SAMPLING_PHASES,
)


# ============================================================================ statistics/rows
def stats(samples: Sequence[float]) -> dict[str, float | int]:
    """ms_median, ms_p10, ms_p90, n of timed samples (linear percentiles: p10 <= med <= p90)."""
    arr = np.asarray([s for s in samples if math.isfinite(s)], dtype=np.float64)
    if arr.size == 0:
        raise RuntimeError("no finite timing samples")
    p10, med, p90 = np.percentile(arr, [10, 50, 90])
    return {"ms_median": float(med), "ms_p10": float(min(p10, med)),
            "ms_p90": float(max(p90, med)), "n": int(arr.size)}


def latency_row(phase: str, method: str, batch: int, context: int, n_query: int, kv_read: int,
                collect: int, samples: Sequence[float], collectives: tuple[int, int] = (0, 0),
                temperature: float = 0.0) -> dict[str, Any]:
    """One latency row; `collectives`: (calls, bytes) of one call of the phase on a
    tensor-parallel shard (their time, `collective_ms`, is set by calibrate/tp_run.py);
    `temperature`: the sampling temperature the phase ran at (0 = greedy)."""
    return {"phase": phase, "method": method, "batch": int(batch), "context": int(context),
            "n_query": int(n_query), "kv_read": int(kv_read), "collect_rows": int(collect),
            **stats(samples), "collective_calls": int(collectives[0]),
            "collective_bytes": int(collectives[1]), "collective_ms": 0.0,
            "temperature": float(temperature)}


def latency_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=LATENCY_SCHEMA.names)


# ============================================================================ memory helpers
def free_device_memory(device: torch.device) -> None:
    """Return cached blocks after an OOM so the next point starts from a clean allocator."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def oom_types() -> tuple[type[BaseException], ...]:
    return (torch.cuda.OutOfMemoryError,)


def plan_dtype(plan: CalibrationPlan) -> torch.dtype | None:
    if plan.dtype is None:
        return None
    try:
        return {"bfloat16": torch.bfloat16, "float32": torch.float32,
                "float16": torch.float16}[plan.dtype]
    except KeyError:
        raise UserInputError(f"unknown dtype {plan.dtype!r}", where="dtype",
                             fix="use bfloat16, float16 or float32") from None


def model_dtype_bytes(model: Any) -> int:
    """Bytes per element of the loaded model's weights and KV cache (memory estimates)."""
    return torch.tensor([], dtype=model.dtype).element_size()


# ============================================================================ timing helpers
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _random_tokens(batch: int, n: int, vocab: int, device: torch.device,
                   gen: torch.Generator) -> torch.Tensor:
    """[batch, n] int64 token ids."""
    return torch.randint(0, vocab, (batch, n), generator=gen, device=device)


def measure_step_overhead(model: Any, context: int, *, steps: int = 20,
                          seed: int = 0) -> dict[str, Any]:
    """Per-step CPU overhead of single-token (batch 1) steps at `context`: the dense decode
    step (top level of the dict, DenseAttention) and a Vegas draft step (key 'draft_step':
    sparse attention over the selected keys of a synthetic state).

    CUDA: wall time of an eager step minus wall time of the same step replayed from a CUDA graph
    (runtime.GraphedForward), plus the eager step's GPU time (CUDA events) for reference. CPU:
    there is nothing asynchronous to overlap, so only the eager step time is reported.
    """
    device = model.device
    gen = torch.Generator(device=device).manual_seed(seed)
    cache = model.new_cache(1, context + 1)
    lens = torch.full((1,), context, dtype=torch.int32, device=device)
    cache.fill_random(lens, generator=gen)
    tok = _random_tokens(1, 1, model.spec.vocab, device, gen)
    out = {"context": context, "batch": 1,
           **_step_overhead(model, cache, DenseAttention(), lens, tok, steps)}
    del cache
    try:
        dec = _overhead_decoder(model, "vegas")
        state = dec.init_state(1, context, context + 4, seed=seed)
        out["draft_step"] = _step_overhead(model, state.cache, state.draft_policy,
                                           state.context.clone(), tok, steps)
    except Exception as e:  # noqa: BLE001 - a report, not a measurement the set depends on
        out["draft_step"] = {"error": f"{type(e).__name__}: {e}"[:300]}
    return out


def _overhead_decoder(model: Any, method: str) -> Any:
    """A default-config SpecDecoder of `method` with γ = 1 (overhead measurements)."""
    return SpecDecoder(model, SpecConfig(method=method, gamma=1))


def _step_overhead(model: Any, cache: Any, policy: Any, lens: torch.Tensor, tok: torch.Tensor,
                   steps: int) -> dict[str, Any]:
    """Eager vs graph-replayed wall ms of one forward of `tok` with `policy` (see above)."""
    device = model.device

    def eager() -> None:
        model.forward(tok, cache, policy, last_only=True)
        cache.rollback(lens)

    eager_wall = _wall_ms(eager, device, steps)
    out: dict[str, Any] = {"eager_step_wall_ms": eager_wall}
    if device.type != "cuda":
        out["cuda_graphs"] = False
        out["note"] = "CPU: steps are synchronous; no CUDA graphs, no launch overhead to measure"
        return out
    out["eager_step_gpu_ms"] = float(np.median(hardware.time_ms(eager, device, reps=steps)))
    try:
        graphed = GraphedForward(model, cache, policy, 1, 1, last_only=True)

        def replay() -> None:
            graphed(tok)
            cache.rollback(lens)

        graph_wall = _wall_ms(replay, device, steps)
        out.update(cuda_graphs=True, graph_step_wall_ms=graph_wall,
                   cpu_overhead_ms=eager_wall - graph_wall)
    except Exception as e:  # noqa: BLE001 - graphs are an optimisation: report why, keep going
        out.update(cuda_graphs=False, graph_error=f"{type(e).__name__}: {e}"[:300],
                   cpu_overhead_ms=eager_wall - out["eager_step_gpu_ms"],
                   note="overhead = eager wall time - eager GPU time (graphs unavailable)")
    return out


def _wall_ms(fn: Callable[[], None], device: torch.device, steps: int) -> float:
    """Median wall ms of fn() followed by a device sync (what one step costs the loop)."""
    fn()
    _sync(device)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


# ============================================================================ latency point
Sample = tuple[str, float]


def split_iterations(samples: list[Sample], start: str) -> list[list[Sample]]:
    """Cut a timer's ordered samples into iterations, each beginning at phase `start`."""
    out: list[list[Sample]] = []
    for name, ms in samples:
        if name == start or not out:
            out.append([])
        out[-1].append((name, ms))
    return out


def draft_samples(iterations: list[list[Sample]], gamma: int
                  ) -> tuple[list[list[float]], list[list[float]], list[float]]:
    """Per draft step j: draft_step ms and quest_meta ms, one sample per iteration; and per
    iteration the work it does once for all its steps ('other').

    'other' = the draft's index preparation (StreamingLLM index lists, Quest page counts) plus
    Quest's metadata update after acceptance (a top-level quest_meta): methods.iteration_plan
    charges it once per iteration. (Spread evenly over the DRAFT_GAMMA timed steps, an
    iteration of γ steps would be charged γ / DRAFT_GAMMA of it: 3× at γ 12.)
    The scoring nested in step j (the quest_meta sample right after draft_step j) belongs to
    step j.
    """
    steps: list[list[float]] = [[] for _ in range(gamma)]
    quest: list[list[float]] = [[] for _ in range(gamma)]
    once: list[float] = []
    for it in iterations:
        drafts: list[float] = []
        nested: list[float] = []
        other = 0.0
        prev = ""
        # Quest times its scoring nested in each step, or (graphed: no events inside a
        # capture) not at all; its samples are then 0 here and split_quest_scoring adds it
        quest_iteration = any(name == "quest_meta" for name, _ in it)
        for name, ms in it:
            if name == "draft_step":
                drafts.append(ms)
            elif name == "quest_meta" and prev == "draft_step":
                nested.append(ms)
            elif name in ("quest_meta", "other"):
                other += ms
            prev = name
        if len(drafts) != gamma:
            continue  # a truncated iteration (should not happen); do not misattribute it
        once.append(other)
        for j in range(gamma):
            steps[j].append(drafts[j])
            if quest_iteration:
                quest[j].append(nested[j] if j < len(nested) else 0.0)
    return steps, quest, once


def phase_samples(iterations: list[list[Sample]], phase: str) -> list[float]:
    """One sample per iteration: the sum of `phase` in it (0 occurrences → no sample)."""
    out = []
    for it in iterations:
        got = [ms for n, ms in it if n == phase]
        if got:
            out.append(float(sum(got)))
    return out


@dataclass
class PointContext:
    """What every measurement of one latency point shares."""

    model: Any  # runtime.Transformer
    plan: CalibrationPlan
    batch: int
    context: int  # effective context (capped so that context + 2γ + 2 fits max_positions)
    seed: int
    temperature: float = 0.0  # the sampling temperature the decoders run at
    sparsities: tuple[float, ...] = ()  # the drafts' (empty: the plan's)

    @property
    def spec(self) -> ModelSpec:
        return self.model.spec  # type: ignore[no-any-return]

    @property
    def max_len(self) -> int:
        return self.spec.max_positions

    def max_seq(self, gamma: int) -> int:
        return self.context + state_headroom(gamma)


def _decoder(ctx: PointContext, method: str, gamma: int, sparsity: float, timer: Any) -> Any:
    temp, top_p, top_k = sampling_args(ctx.temperature, ctx.plan.top_p, ctx.plan.top_k)
    cfg = SpecConfig(method=method, gamma=gamma, sparsity=sparsity,
                     min_tokens=ctx.plan.min_tokens, temperature=temp, top_p=top_p, top_k=top_k)
    return SpecDecoder(ctx.model, cfg, timer)


# Iterations per timed repetition where the host gap is measured (vanilla decode, verify):
# a repetition starts from an idle device, so its wall includes a first launch and a last sync
# that the running loop overlaps; over a chain of consecutive iterations they are amortised,
# as in the loop. Timed as single iterations, SmolLM2 B = 1 sample + gap scatters 0.40-0.59
# ms over 3 repetitions, and vanilla B = 1 is predicted 9 % slower than it runs.
HOST_GAP_CHAIN = 4


@dataclass
class Timed:
    """The timed repetitions of one body: per iteration, its phase samples (CUDA events: GPU
    time); per repetition (`chain` consecutive body calls) its wall time from an idle device
    to an idle device."""

    iterations: list[list[Sample]]
    walls: list[float]
    chain: int = 1
    collectives: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)

    def per_call(self, phase: str) -> tuple[int, int]:
        """(calls, bytes) of the collectives one call of `phase` issued (median over its
        calls; (0, 0) on one GPU)."""
        got = [(n, b) for name, n, b in self.collectives if name == phase]
        if not got:
            return 0, 0
        return (int(np.median([n for n, _ in got])), int(np.median([b for _, b in got])))

    def host_gaps(self) -> list[float]:
        """Per iteration, its repetition's wall − Σ phase samples (≥ 0), shared evenly by the
        repetition's iterations: time the device sat idle because the host was busy —
        launches, Python bookkeeping, work after a host sync."""
        n = self.chain
        if len(self.walls) * n != len(self.iterations):
            return [0.0] * len(self.iterations)
        gaps: list[float] = []
        for r, wall in enumerate(self.walls):
            its = self.iterations[r * n:(r + 1) * n]
            gpu = sum(ms for it in its for _, ms in it)
            gaps += [max(wall - gpu, 0.0) / n] * n
        return gaps


def _timed(ctx: PointContext, timer: Any, body: Callable[[], None], start: str,
           chain: int = 1) -> Timed:
    """warmup + reps repetitions of `chain` back-to-back calls of body; the timed ones split
    into iterations at phase `start`, with each repetition's wall clock (device synchronised
    before and after the chain)."""
    device = ctx.model.device
    for _ in range(ctx.plan.warmup):
        body()
    timer.reset()
    walls = []
    for _ in range(ctx.plan.reps):
        walls.append(_chain_wall_ms(device, body, chain))
    return Timed(split_iterations(timer.samples(), start), walls, chain,
                 timer.collective_samples())


def phase_timer(model: Any) -> PhaseTimer:
    """A timer on the model's device that also counts a tensor-parallel shard's collectives."""
    tally = getattr(model, "collectives", None)
    return PhaseTimer(model.device, counter=None if tally is None else tally.total)


def _chain_wall_ms(device: torch.device, body: Callable[[], None], chain: int) -> float:
    """Wall time of `chain` back-to-back calls of body, from an idle device to an idle one."""
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(chain):
        body()
    _sync(device)
    return (time.perf_counter() - t0) * 1e3


def with_host_gap(samples: list[float], gaps: list[float]) -> list[float]:
    """Phase samples with their iteration's share of the host gap added (one per iteration)."""
    if len(samples) != len(gaps):
        return samples
    return [ms + gap for ms, gap in zip(samples, gaps)]


def measure_vanilla(ctx: PointContext) -> list[dict[str, Any]]:
    """decode + sample of vanilla at (B, C): dense one-token forward, then sampling; the
    synthetic state rolls back to C after every step, so every sample is at exactly C."""
    timer = phase_timer(ctx.model)
    dec = _decoder(ctx, "vanilla", 1, ctx.plan.ref_sparsity, timer)
    state = dec.init_state(ctx.batch, ctx.context, ctx.max_seq(1), seed=ctx.seed)
    timed = _timed(ctx, timer, functools.partial(dec.decode, state), "decode", HOST_GAP_CHAIN)
    its = timed.iterations
    B, C = ctx.batch, ctx.context
    # Vanilla syncs every step (the host needs the token): the host's share is not hidden.
    sample = with_host_gap(phase_samples(its, "sample"), timed.host_gaps())
    return [latency_row("decode", "vanilla", B, C, 1, C + 1, 0, phase_samples(its, "decode"),
                        timed.per_call("decode")),
            latency_row("sample", "vanilla", B, C, 1, C + 1, 0, sample)]


def measure_drafts(ctx: PointContext, path: str, methods_here: Sequence[str]
                   ) -> list[dict[str, Any]]:
    """draft_step (+ quest_meta) rows of one drafting kernel path at every planned sparsity
    (once per distinct kv_read: rows have no sparsity column, only the budget it implies).

    One state serves all sparsities: the budget is recomputed per draft (stream, quest) or by
    re-selecting from the state's (random) collected weights (selected-keys path). Stream and
    selected-keys iterations are draft + rollback to C; Quest runs whole iterations so that its
    metadata update after acceptance is measured too.
    """
    timer = phase_timer(ctx.model)
    gamma = DRAFT_GAMMA
    # The largest sparsity sizes the state's index buffers for every sparsity (no regrowth,
    # so the captured draft graph serves them all).
    base = _decoder(ctx, path, gamma, max(ctx.plan.sparsity), timer)
    state = base.init_state(ctx.batch, ctx.context, ctx.max_seq(gamma), seed=ctx.seed)
    B, C = ctx.batch, ctx.context
    contexts = np.full(B, C, dtype=np.int64)
    rows: list[dict[str, Any]] = []
    seen: set[tuple[int, ...]] = set()
    emitted: set[tuple[str, int]] = set()
    # quest_meta's quantity (pages scored at step j) does not depend on the sparsity: its
    # samples are pooled over sparsities, and over the steps that score as many pages.
    quest_pool: dict[int, list[float]] = {}
    once: list[float] = []  # 'other' per iteration, pooled over sparsities likewise
    draft = method_of(path)
    for s in ctx.sparsities or ctx.plan.sparsity:
        # Sparsities whose budgets coincide here (the min_tokens floor at short contexts) give
        # the same kv_read: measure such a draft once.
        kv_key = tuple(int(draft_kv_read(m, s, contexts, ctx.max_len, j, ctx.plan.min_tokens)[0])
                       for m in methods_here for j in range(1, gamma + 1))
        if kv_key in seen:
            continue
        seen.add(kv_key)
        dec = _decoder(ctx, path, gamma, s, timer)
        if draft.selects_keys:
            dec.select(state)  # this sparsity's budget from the same collected weights
        if draft.quest_pages:
            body = functools.partial(dec.step, state)
        else:
            body = functools.partial(_draft_and_rollback, dec, state)
        timed = _timed(ctx, timer, body, "other")
        steps, quest, other = draft_samples(timed.iterations, gamma)
        once += other
        if draft.quest_pages and dec.graphs:
            steps, quest = split_quest_scoring(steps, quest, quest_scoring_ms(dec, state))
        for j in range(1, gamma + 1):
            if quest[j - 1]:
                quest_pool.setdefault((C + j) // QUEST_PAGE + 1, []).extend(quest[j - 1])
            for m in methods_here:
                kv = int(draft_kv_read(m, s, contexts, ctx.max_len, j, ctx.plan.min_tokens)[0])
                if (m, kv) not in emitted:  # step j of one budget = step j' of another
                    emitted.add((m, kv))
                    rows.append(latency_row("draft_step", m, B, C, 1, kv, 0, steps[j - 1],
                                            timed.per_call("draft_step")))
    for pages, samples in quest_pool.items():
        rows.append(latency_row("quest_meta", "magicdec-quest", B, C, 1, pages, 0, samples))
    rows += [latency_row("other", m, B, C, 1, C, 0, once)
             for m in methods_here if m in INDEX_PREP_METHODS]
    return rows


def quest_scoring_ms(dec: Any, state: Any, reps: int = 10) -> float:
    """Median GPU ms of one draft step's Quest page scoring + page top-k over all layers,
    replayed as a CUDA graph on the state's current metadata and page counts.

    Inside a graphed draft step the scoring cannot be timed on its own (no events inside a
    capture), so it is measured here, alone, and `split_quest_scoring` moves it from
    draft_step to quest_meta — the phases methods.iteration_plan sums."""
    policy = state.draft_policy
    spec = dec.spec
    gen = torch.Generator(device=dec.device).manual_seed(0)
    q = torch.randn(state.batch, spec.n_heads, spec.head_dim, generator=gen, device=dec.device,
                    dtype=dec.model.dtype)  # [B, Hq, D]

    def score_all_layers() -> None:
        for layer in range(spec.n_layers):
            ops.quest_select(q, policy.kmin[layer], policy.kmax[layer], policy.context,
                             policy.n_pages, policy.max_pages)


    graph, _ = capture_cuda_graph(score_all_layers)
    return float(np.median(hardware.time_ms(graph.replay, dec.device, reps=reps)))


def split_quest_scoring(steps: list[list[float]], quest: list[list[float]], scoring_ms: float
                        ) -> tuple[list[list[float]], list[list[float]]]:
    """Move `scoring_ms` of every graphed Quest draft-step sample to its quest_meta sample."""
    steps = [[max(ms - scoring_ms, 0.0) for ms in step] for step in steps]
    quest = [[ms + scoring_ms for ms in q] for q in quest]
    return steps, quest


def _draft_and_rollback(dec: Any, state: Any) -> None:
    dec.draft(state)
    state.cache.rollback(state.context)


def _verify_iteration(dec: Any, state: Any) -> None:
    dec.verify(state)
    dec.accept_and_rollback(state)
    dec.select(state)


def fill_drafts(dec: Any, state: Any, seed: int) -> None:
    """Stand-in drafts for timing verify and acceptance: under sampling a random draft
    distribution q ([B, γ] rows, through the decoder's own top-p/top-k) and its argmax tokens;
    under greedy random tokens. Verify's cost does not depend on the drafted values, and really
    drafting γ ≤ 15 tokens per configuration would double the GPU time of the verify sweep."""
    drafts = state.drafts  # [B, γ] int64
    B, gamma = drafts.shape
    V = dec.spec.vocab
    gen = torch.Generator(device=drafts.device).manual_seed(seed)
    cfg = dec.config
    if cfg.temperature == 0:
        drafts.copy_(torch.randint(0, V, (B, gamma), generator=gen, device=drafts.device))
        return
    logits = torch.randn(B, gamma, V, generator=gen, device=drafts.device)
    q = token_probs(logits, cfg.temperature, cfg.top_p, cfg.top_k)  # [B, γ] rows
    drafts.copy_(q.argmax())
    state.draft_probs = q


def _verify_samples(ctx: PointContext, run_method: str, gamma: int) -> Timed:
    """Timed iterations of verify → accept → select of `run_method` (its state is freed on
    return, before the next configuration allocates its own).

    Default: the drafts are stand-ins (`fill_drafts`) and the iterations are verify → accept
    → select alone. With `plan.verify_after_draft` every iteration drafts its γ tokens first
    (`SpecDecoder.step`, as the decoding loop does): the host then meets acceptance and
    selection after a long device wait, as in a real run: timed phase by phase in the real
    loop, a small model's host-bound sample and select take longer than verify → accept →
    select alone measures (docs/RESULTS.md, Validation). Costs γ draft steps per
    timed iteration (little for a small model, about the verify sweep again for a large one).
    """
    timer = phase_timer(ctx.model)
    dec = _decoder(ctx, run_method, gamma, ctx.plan.ref_sparsity, timer)
    state = dec.init_state(ctx.batch, ctx.context, ctx.max_seq(gamma), seed=ctx.seed)
    if ctx.plan.verify_after_draft:
        dec.select(state)  # a selection to draft from (selected-keys methods; else no-op)
        return _timed(ctx, timer, functools.partial(dec.step, state), "other", HOST_GAP_CHAIN)
    fill_drafts(dec, state, ctx.seed)
    return _timed(ctx, timer, functools.partial(_verify_iteration, dec, state), "verify",
                  HOST_GAP_CHAIN)


def verify_configs(plan: CalibrationPlan, n_query: int) -> list[tuple[str, list[str]]]:
    """(method to run, methods whose verify/select/sample rows it provides) for one n_query.

    Collection 0 (magicdec-stream; quest verifies identically) always runs: it is the baseline
    of the collection overhead; its rows are labelled 'any' when no planned method uses it.
    """
    gamma = n_query - 1
    planned = plan.spec_methods
    plain = [m for m in planned if collect_rows(m, gamma) == 0]
    out: list[tuple[str, list[str]]] = [("magicdec-stream", plain or ["any"])]
    for m in ("vegas", "vegas-all", "specextend"):
        if m in planned:
            out.append((m, [m]))
    return out


def measure_verify(ctx: PointContext, n_query: int) -> list[dict[str, Any]]:
    """verify, select and speculative sample rows at n_query = γ+1 for each collection setting.

    The drafted values do not change verify's cost, so the drafts are stand-ins
    (`fill_drafts`) and every timed iteration is verify → accept (rolled back to C by the
    synthetic state) → select.
    """
    gamma = n_query - 1
    B, C = ctx.batch, ctx.context
    rows: list[dict[str, Any]] = []
    for run_method, labels in verify_configs(ctx.plan, n_query):
        timed = _verify_samples(ctx, run_method, gamma)
        its = timed.iterations
        rc = collect_rows(run_method, gamma)
        for label in labels:
            rows.append(latency_row("verify", label, B, C, n_query, C + n_query, rc,
                                    phase_samples(its, "verify"), timed.per_call("verify")))
            if label == "any":
                continue
            # The acceptance syncs with the host (records, emission, selection's budgets):
            # the device's idle time around it is charged to the sample phase.
            rows.append(latency_row("sample", label, B, C, n_query, C + n_query, 0,
                                    with_host_gap(phase_samples(its, "sample"),
                                                  timed.host_gaps())))
            sel = phase_samples(its, "select")
            if rc and sel:
                rows.append(latency_row("select", label, B, C, 1, C + 1, rc, sel,
                                        timed.per_call("select")))
    return rows


def measure_latency_point(model: Any, plan: CalibrationPlan, point: LatencyPoint
                          ) -> list[dict[str, Any]]:
    """Every latency row of one (batch, context) point (see the module docstring)."""
    ctx = PointContext(model, plan, point.batch, effective_context(plan, model.spec, point.context),
                       seed=plan.seed + 7919 * point.batch + point.context,
                       temperature=latency_temperature(plan))
    with torch.no_grad():
        rows = _point_rows(ctx)
        if plan.greedy_latency and point.batch in greedy_batches(plan):
            greedy = dataclasses.replace(ctx, temperature=0.0, sparsities=greedy_sparsities(plan))
            rows += [r for r in _point_rows(greedy) if r["phase"] in SAMPLING_PHASES]
    return rows


def _point_rows(ctx: PointContext) -> list[dict[str, Any]]:
    """The rows of one point at the context's temperature, each recording it."""
    plan = ctx.plan
    rows = measure_vanilla(ctx)
    for path, group in DRAFT_PATHS.items():
        here = [m for m in group if m in plan.methods]
        if here:
            rows += measure_drafts(ctx, path, here)
    if plan.spec_methods:
        for nq in plan.verify_n_query():
            rows += measure_verify(ctx, nq)
    return [{**r, "temperature": float(ctx.temperature)} for r in rows]
