"""What the engine draws acceptance from: `AcceptanceDist`, the accepted-draft counts of one
configuration (whole traced runs replayed, their per-position rates matched to the model's
smoothed cell), `FixedSequences` (a run's own counts, replayed as they were), and the rate
helpers they share (`extend_rates` past the traced γ, `match_rates`). The model that builds
them from a trace set is `acceptance`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vegas_sim.errors import UserInputError

DECAY_FIT_POSITIONS = 4  # last traced positions the conditional-rate decay is fitted on


@dataclass(frozen=True)
class TracedCell:
    """All runs of one traced configuration, flattened in run order.

    acc [N] accepted drafts (0..gamma); prob [N, gamma] acceptance probabilities;
    run_start [N] / run_len [N] the flat index of each position's run start and that run's
    length; gen [N] tokens the request had generated before
    the iteration (context − the run's first context).
    """

    gamma: int
    sparsity: float
    bucket: float
    acc: np.ndarray
    prob: np.ndarray
    run_start: np.ndarray
    run_len: np.ndarray
    ctx_min: int
    ctx_max: int
    gen: np.ndarray

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled (the fit cache) with each array in the narrowest dtype that holds its
        values exactly (accept_prob is recorded as float32, counts are small): the cache
        entry of a large set is half the size and reads back to the same float64 / int64."""
        arrays = tuple(_narrowed(getattr(self, f)) for f in _CELL_ARRAYS)
        return _cell_from, (self.gamma, self.sparsity, self.bucket, self.ctx_min, self.ctx_max,
                            arrays)

    def head(self, output_len: int) -> TracedCell:
        """The iterations a request of `output_len` tokens runs (gen < output_len): a prefix of
        every run, so the runs stay consecutive and the bootstrap stays inside them."""
        keep = self.gen < output_len  # [N]; a run's first iteration (gen 0) is always kept
        if keep.all():
            return self
        new_idx = np.cumsum(keep) - 1  # [N] position in the kept arrays
        start = new_idx[self.run_start[keep]]  # [M] the kept run start of each kept position
        length = np.bincount(start, minlength=int(keep.sum()))[start]  # [M]
        return TracedCell(self.gamma, self.sparsity, self.bucket, self.acc[keep], self.prob[keep],
                     start, length, self.ctx_min, self.ctx_max, self.gen[keep])

    def rates(self) -> np.ndarray:
        """[gamma] r_i = P(accepted ≥ i), i = 1..gamma, Rao-Blackwellised with accept_prob."""
        prev = np.ones(len(self.acc))
        out = np.empty(self.gamma)
        for i in range(1, self.gamma + 1):
            out[i - 1] = float(np.mean(prev * self.prob[:, i - 1]))
            prev = (self.acc >= i).astype(float)
        # the estimator is unbiased but not forced monotone; rates must be
        return np.minimum.accumulate(np.clip(out, 0.0, 1.0))

    def outcome_cond(self, gamma: int) -> np.ndarray:
        """[gamma] P(accepted ≥ i | accepted ≥ i − 1) of the recorded outcomes truncated to
        `gamma` (what a replay of this cell draws); 0 past the traced γ, 1 where none reach i."""
        acc = np.minimum(self.acc, gamma)
        reach = np.array([(acc >= i).sum() for i in range(gamma + 1)], dtype=float)  # [γ+1]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(reach[:-1] > 0, reach[1:] / np.where(reach[:-1] > 0, reach[:-1], 1),
                            1.0)


_CELL_ARRAYS = ("acc", "prob", "run_start", "run_len", "gen")


def _narrowed(a: np.ndarray) -> tuple[np.ndarray, str]:
    """(a in the narrowest of float32 / int8..int32 that holds every value exactly, a's
    dtype): what `_cell_from` widens back."""
    for narrow in ((np.float32,) if a.dtype.kind == "f" else (np.int8, np.int16, np.int32)):
        small = a.astype(narrow)
        if np.array_equal(small, a):  # exact: float32 values, or ints within range
            return small, a.dtype.str
    return a, a.dtype.str


class _PackedCell(TracedCell):
    """A TracedCell read back from the fit cache: each array is widened to its own dtype on
    first use, so that reading a large set's fit costs only the arrays a command uses (a
    count of iterations reads `acc`, not the probabilities). Its arrays are in `_packed`
    (pickled alone) or in the columns of a whole model's cells (`CellColumns`)."""

    def __getattr__(self, name: str) -> Any:  # only for attributes not set yet
        packed = self.__dict__.get("_packed")
        columns = self.__dict__.get("_columns")
        if packed is not None and name in packed:
            array, dtype = packed.pop(name)
            object.__setattr__(self, name, array.astype(dtype))
        elif columns is not None and name in _CELL_ARRAYS:
            object.__setattr__(self, name, columns.array(self.__dict__["_index"], name))
        else:
            raise AttributeError(name)
        return self.__dict__[name]


def _cell_from(gamma: int, sparsity: float, bucket: float, ctx_min: int, ctx_max: int,
               arrays: tuple[tuple[np.ndarray, str], ...]) -> TracedCell:
    cell = object.__new__(_PackedCell)
    for name, value in (("gamma", gamma), ("sparsity", sparsity), ("bucket", bucket),
                        ("ctx_min", ctx_min), ("ctx_max", ctx_max),
                        ("_packed", dict(zip(_CELL_ARRAYS, arrays)))):
        object.__setattr__(cell, name, value)
    return cell


@dataclass(frozen=True)
class DrawSource:
    """One mixture component of a lookup: a cell walked at / extended to γ, or all-accepted.

    Replay draws the cell's recorded accepted counts and then thins / extends each iteration
    position by position so that the replayed per-position rates are `rates` in expectation
    (see `match_rates`): `rates` may be smoothed or Rao-Blackwellised, the outcomes are not.
    """

    cell: TracedCell | None  # None = draft equals target (s = 1): every draft accepted
    rates: np.ndarray  # [γ] this component's per-position rates (extended past γ_t if γ is)
    base_cond: np.ndarray | None = None  # [γ] conditional rates of the replayed outcomes
    # (None only for the all-accepted component, which replays nothing)
    stretch: float = 1.0  # replayed iterations per traced iteration (see `draw_requests`)
    # relative sd of one run's acceptance length about its cell's mean, pooled over its group
    # (`AcceptanceModel.run_spread`): what a cell of too few runs to measure its own spread
    # takes (`uncertainty.acceptance_sampling_pct`); 0 where unknown
    run_spread: float = 0.0

    def draw_requests(self, rng: np.random.Generator, n_requests: int, n_iterations: int,
                      gamma: int) -> np.ndarray:
        """[n_requests, n_iterations] accepted drafts for this component: each request replays
        one traced run from its start.

        Iteration k of a request replays traced iteration ⌊k / stretch⌋ of its run (circular
        past the run's end). stretch = traced acceptance length / this γ's, so a request walks
        through the run at the pace its own tokens advance (1 for a cell walked at a smaller
        γ, whose runs already take that γ's iterations; below 1 past the traced γ). This keeps what a request's position in its
        generation does to acceptance (it rises as the text turns repetitive: on SmolLM2
        longdoc at T 0.6, γ 12, from ~5.5 in the first iteration to ~8 by the tenth) and a
        prompt's persistent level; a closed batch's steady window, which ends when its first
        request finishes, covers the early iterations only.
        """
        if self.cell is None:
            return np.full((n_requests, n_iterations), gamma, dtype=np.int64)
        cell = self.cell
        starts = np.unique(cell.run_start)  # [runs]
        run = starts[rng.integers(0, len(starts), n_requests)]  # [R] flat start of each run
        length = cell.run_len[run]  # [R]
        pos = np.floor(np.arange(n_iterations) / self.stretch).astype(np.int64)  # [W]
        lengths, which = np.unique(length, return_inverse=True)  # a cell's runs share few
        idx = (pos[None, :] % lengths[:, None])[which]  # [R, W] position in each run
        idx += run[:, None]
        vals = np.minimum(cell.acc[idx], gamma)
        assert self.base_cond is not None, "a traced component knows its outcomes' rates"
        # thins to the smoothed rates and extends past the traced γ (base rate 0 there)
        return match_rates(rng, vals, self.base_cond, conditional_rates(self.rates))


def conditional_rates(rates: np.ndarray) -> np.ndarray:
    """[γ] conditional rates a_i = r_i / r_{i−1} (r_0 = 1; 1 where r_{i−1} = 0)."""
    prev = np.concatenate([[1.0], rates[:-1]])
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.clip(np.where(prev > 0, rates / np.where(prev > 0, prev, 1.0), 1.0), 0.0, 1.0)


def match_rates(rng: np.random.Generator, vals: np.ndarray, base: np.ndarray,
                 target: np.ndarray) -> np.ndarray:
    """Thin / extend replayed accepted counts so that P(accepted ≥ i) follows `target`.

    vals [...] recorded counts drawn with conditional rates `base` [γ]; target [γ] the wanted
    conditional rates. Position by position, an iteration that still follows its recording keeps
    a recorded acceptance with probability min(1, t/b) and turns the recorded rejection into an
    acceptance with probability max(0, (t − b)/(1 − b)); once turned it continues with fresh
    draws at rate t. Each step then accepts with probability t exactly, and an iteration whose
    record already matches (t = b) is replayed unchanged, so the run's correlation is kept
    wherever the target is close to the record. One uniform per position, [γ, N] drawn at once
    (a smaller γ uses a prefix of the same draws).

    The uniforms are 16-bit (UNIFORM_LEVELS): cheaper to draw than float64, and this pre-draw
    is a large share of a long simulation's time; probabilities are rounded to 1/65536.
    """
    gamma = len(target)
    with np.errstate(divide="ignore", invalid="ignore"):
        keep = np.where(base > 0, np.minimum(1.0, target / np.where(base > 0, base, 1.0)), 1.0)
        flip = np.where(base < 1, np.maximum(0.0, (target - base) / np.where(base < 1, 1 - base,
                                                                            1.0)), 0.0)
    if np.all(keep >= 1.0 - 1e-12) and np.all(flip <= 1e-12):
        return vals  # the record already has the target rates: replay it as it is
    flat = np.minimum(vals.reshape(-1), gamma).astype(np.int8)  # [N] (γ ≤ 127)
    n = flat.shape[0]
    u = uniform16(rng, n * gamma).reshape(gamma, n)
    out = np.zeros(n, dtype=np.int8)
    following = np.ones(n, dtype=bool)  # alive and still equal to the record
    free = np.zeros(n, dtype=bool)  # alive after a turned rejection
    rec_acc, below, turned = (np.empty(n, dtype=bool) for _ in range(3))  # scratch, in place
    for i in range(1, gamma + 1):
        ui = u[i - 1]
        np.greater_equal(flat, i, out=rec_acc)
        k_lvl, f_lvl, t_lvl = (uniform_levels(p) for p in (keep[i - 1], flip[i - 1], target[i - 1]))
        if f_lvl > 0:  # turned = following & ~rec_acc & (u < f)
            np.greater(following, rec_acc, out=turned)
            turned &= np.less(ui, f_lvl, out=below)
        following &= rec_acc
        if k_lvl < UNIFORM_LEVELS:
            following &= np.less(ui, k_lvl, out=below)
        if t_lvl < UNIFORM_LEVELS:
            free &= np.less(ui, t_lvl, out=below)
        if f_lvl > 0:
            free |= turned
        out += following.view(np.int8)
        out += free.view(np.int8)  # disjoint from following
    return out.astype(vals.dtype).reshape(vals.shape)


UNIFORM_LEVELS = 1 << 16  # match_rates' uniforms: u in {0, …, 65535}, P(u < k) = k / 65536


def uniform16(rng: np.random.Generator, count: int) -> np.ndarray:
    """[count] uint16: the values of ``np.frombuffer(rng.bytes(2 * count), np.uint16)``, and
    the generator left in the same state, from the bit generator's raw 64-bit outputs.

    `Generator.bytes` draws 32-bit words one at a time (the low half of each 64-bit output, then
    the high half, kept in the bit generator's `has_uint32` / `uinteger` buffer), several times
    slower than `random_raw`; this takes a buffered word first, then the raw outputs' halves in
    that order, and leaves the buffer as `bytes` does (tests/sim/test_acceptance.py holds
    the two equal). A bit generator without that buffer falls back to `bytes`."""
    bg = rng.bit_generator
    state = bg.state
    if "has_uint32" not in state or count == 0:
        return np.frombuffer(rng.bytes(2 * count), dtype=np.uint16)
    words = -(-count // 2)  # 32-bit words `bytes` draws
    head = [np.uint32(state["uinteger"])] if state["has_uint32"] else []
    rest = words - len(head)
    raw = bg.random_raw(-(-rest // 2)).astype("<u8", copy=False).view("<u4")
    if head or rest:  # the last output's high half stays, marked unused when `rest` is odd
        after = dict(bg.state)
        after["has_uint32"] = rest % 2
        if rest:
            after["uinteger"] = int(raw[-1])
        bg.state = after
    u32 = np.concatenate([np.asarray(head, "<u4"), raw[:rest]]) if head else raw[:rest]
    return u32.view(np.uint16)[:count]


def uniform_levels(p: float) -> int:
    """Probability p as a threshold on a 16-bit uniform (0 = never, UNIFORM_LEVELS = always)."""
    return min(UNIFORM_LEVELS, max(0, round(float(p) * UNIFORM_LEVELS)))


@dataclass
class AcceptanceDist:
    """Acceptance of one configuration, ready to replay."""

    method: str
    gamma: int
    rates: np.ndarray  # [gamma] per-position rates r_i = P(at least i drafts accepted)
    extrapolated: list[str] = field(default_factory=list)  # human-readable reasons; [] = inside
    sources: list[DrawSource] = field(default_factory=list, repr=False)
    weights: np.ndarray = field(default_factory=lambda: np.ones(0), repr=False)
    # relative sd (%) of the mean acceptance length from following a context trend beyond the
    # traced contexts (`sim.context_trend`); 0 inside them
    context_trend_sd_pct: float = 0.0
    # the same sd as a logit shift of the trend (what an anchor's fit absorbs, `sim.anchored`),
    # and the sign of the error it stands for relative to such an anchor's: a trend's error is
    # one slope's error times the distance, so errors of one trend add with their signs
    context_trend_sd_logit: float = 0.0
    context_trend_sign: float = 1.0
    # relative sd (%) of the mean acceptance length from carrying a shape set's acceptance to
    # anchors this configuration is far from (`sim.anchored`; 0 without anchors), and its share
    # per axis (the parts add up to it)
    transfer_sd_pct: float = 0.0
    transfer_axes_pct: dict[str, float] = field(default_factory=dict)

    @property
    def mean_length(self) -> float:
        """Mean acceptance length, bonus token included: 1 + Σ r_i."""
        return 1.0 + float(np.sum(self.rates))

    @property
    def is_extrapolated(self) -> bool:
        return bool(self.extrapolated)

    def sample(self, rng: np.random.Generator, n_requests: int, n_iterations: int) -> np.ndarray:
        """[n_requests, n_iterations] accepted drafts (0..gamma); column k is a request's k-th
        iteration.

        Each request replays one traced run from its start (`DrawSource.draw_requests`); with
        two or more mixture components (sparsity / context interpolation) each request picks
        its component with the interpolation weight. Without traced runs (a hand-built dist)
        iterations are drawn independently from `rates`. Deterministic for the state of `rng`.
        """
        if self.gamma == 0 or n_requests == 0 or n_iterations == 0:
            return np.zeros((n_requests, n_iterations), dtype=np.int64)
        if not self.sources:
            u = rng.random((n_requests, n_iterations, 1))
            return np.asarray((u < self.rates[None, None, :]).sum(axis=2), dtype=np.int64)
        if len(self.sources) == 1:
            return self.sources[0].draw_requests(rng, n_requests, n_iterations, self.gamma)
        pick = rng.choice(len(self.sources), size=n_requests, p=self.weights)  # [R]
        out = np.empty((n_requests, n_iterations), dtype=np.int64)
        for k, src in enumerate(self.sources):
            sel = pick == k
            out[sel] = src.draw_requests(rng, int(sel.sum()), n_iterations, self.gamma)
        return out


def extend_rates(rates: np.ndarray, gamma: int) -> tuple[np.ndarray, np.ndarray]:
    """Extend per-position rates [γ_t] to [gamma] with a fitted decay of conditional rates.

    Conditional rates a_i = r_i / r_{i−1} (r_0 = 1); log a_i is fitted linear in i over the last
    `DECAY_FIT_POSITIONS` positions with slope forced ≤ 0, continued from the last observed
    conditional rate (never above it), clamped to [0, 1]. Returns (rates [gamma], the
    conditional rates of the new positions [gamma − γ_t]).
    """
    gt = len(rates)
    if gamma <= gt:
        return rates[:gamma].copy(), np.zeros(0)
    prev = np.concatenate([[1.0], rates[:-1]])
    with np.errstate(divide="ignore", invalid="ignore"):
        cond = np.where(prev > 0, rates / np.where(prev > 0, prev, 1.0), 0.0)
    cond = np.clip(cond, 0.0, 1.0)
    lo = max(0, gt - DECAY_FIT_POSITIONS)
    pos = np.arange(lo + 1, gt + 1, dtype=float)
    tail = cond[lo:]
    ok = tail > 0
    if gt == 0 or cond[-1] <= 0:
        ext = np.zeros(gamma - gt)
    else:
        slope = 0.0
        if ok.sum() >= 2:
            slope = min(0.0, float(np.polyfit(pos[ok], np.log(tail[ok]), 1)[0]))
        steps = np.arange(1, gamma - gt + 1, dtype=float)
        ext = np.clip(cond[-1] * np.exp(slope * steps), 0.0, 1.0)  # non-increasing
    full = np.concatenate([rates, rates[-1] * np.cumprod(ext)]) if gt else np.zeros(gamma)
    return full, ext


class FixedSequences:
    """An `engine.AcceptanceSampler` that replays given per-request sequences.

    `validate` feeds the simulator the accept counts a real run produced (or replayed), so
    that prediction and measurement see the same acceptance and the difference isolates the
    latency model and the batching. Row r of every `sample` call is request r's sequence
    from its start, repeated cyclically past its end; requests beyond the given rows reuse
    them cyclically.
    """

    def __init__(self, gamma: int, sequences: list[list[int]]) -> None:
        if gamma < 1 or not sequences or any(len(s) == 0 for s in sequences):
            raise UserInputError("FixedSequences needs gamma >= 1 and non-empty sequences",
                                 where="acceptance sequences",
                                 fix="give every request at least one accepted count")
        self.gamma = gamma
        self._seqs = [np.minimum(np.asarray(s, dtype=np.int64), gamma) for s in sequences]

    @property
    def mean_length(self) -> float:
        """1 + mean accepted drafts over all given iterations (bonus included)."""
        return 1.0 + float(np.concatenate(self._seqs).mean())

    def sample(self, rng: np.random.Generator, n_requests: int, n_iterations: int) -> np.ndarray:
        """[n_requests, n_iterations] the first columns of each sequence (rng unused)."""
        cols = np.arange(n_iterations)  # [W]
        out = np.empty((n_requests, n_iterations), dtype=np.int64)
        for r in range(n_requests):
            seq = self._seqs[r % len(self._seqs)]
            out[r] = seq[cols % len(seq)]
        return out


RUNNING_STAGE_RATIO = 2.0  # a request's acceptance is looked up again each time its context
# (prompt + generated) grows by this factor: the context buckets are about a doubling apart


def running_stages(prompt: int, output_len: int) -> list[tuple[int, int]]:
    """[(tokens generated when the stage starts, the context looked up)] for a request of
    `prompt` tokens generating `output_len`: one stage per RUNNING_STAGE_RATIO of context,
    each looked up at its first context, the first at the prompt. One stage when the
    request's context grows by less than the ratio."""
    out = [(0, prompt)]
    start = max(prompt, 1) * RUNNING_STAGE_RATIO
    while start < prompt + output_len:
        out.append((int(math.ceil(start)) - prompt, int(math.ceil(start))))
        start *= RUNNING_STAGE_RATIO
    return out


@dataclass
class RunningLengthDist(AcceptanceDist):
    """Acceptance that follows each request's running context: stage j (from `starts[j]`
    generated tokens on) replays `stages[j]`, the acceptance looked up at that stage's context.
    A request enters a stage at the iteration its generated tokens reach the stage's start and
    replays the stage's traced runs from their start from there. `rates`, `sources`, `weights`,
    `extrapolated`, the context trend's and the transfer terms summarise the stages weighted by
    the share of a request's output generated in each (`of`; the trend's with their signs)."""

    starts: tuple[int, ...] = ()
    stages: tuple[AcceptanceDist, ...] = ()

    @classmethod
    def of(cls, starts: list[int], stages: list[AcceptanceDist], output_len: int,
           contexts: list[int]) -> RunningLengthDist:
        bounds = np.minimum(np.array([*starts, output_len], dtype=float), output_len)
        share = np.diff(bounds) / max(output_len, 1)  # [S] share of the output in each stage
        rates = sum((w * d.rates for w, d in zip(share, stages)), np.zeros(stages[0].gamma))
        notes = [f"acceptance follows the running context: {len(stages)} stages at contexts "
                 f"{', '.join(str(c) for c in contexts)} (prompt + generated; shares of the "
                 f"output {', '.join(f'{w:.2f}' for w in share)})"]
        for d in stages:
            notes.extend(n for n in d.extrapolated if n not in notes)
        sources = [s for d in stages for s in d.sources]
        weights = np.concatenate([w * np.asarray(d.weights, dtype=float)
                                  for w, d in zip(share, stages)]) if sources else np.ones(0)
        axes: dict[str, float] = {}
        for w, d in zip(share, stages):
            for k, v in d.transfer_axes_pct.items():
                axes[k] = axes.get(k, 0.0) + float(w) * v
        trend = float(sum(w * d.context_trend_sign * d.context_trend_sd_pct
                          for w, d in zip(share, stages)))
        return cls(stages[0].method, stages[0].gamma, np.asarray(rates), notes, sources,
                   weights, context_trend_sd_pct=abs(trend),
                   context_trend_sd_logit=float(sum(w * d.context_trend_sd_logit
                                                    for w, d in zip(share, stages))),
                   context_trend_sign=-1.0 if trend < 0 else 1.0,
                   transfer_sd_pct=float(sum(w * d.transfer_sd_pct
                                             for w, d in zip(share, stages))),
                   transfer_axes_pct=axes, starts=tuple(starts), stages=tuple(stages))

    def sample(self, rng: np.random.Generator, n_requests: int, n_iterations: int) -> np.ndarray:
        """[n_requests, n_iterations] accepted drafts: the first stage's draws, then from the
        iteration at which a request's generated tokens (accepted + 1 per iteration) reach
        stage j's start, stage j's draws replayed from their first column.

        A request generates at least one token an iteration, so it leaves stage j within
        (start of j+1 − start of j) iterations of entering it: each stage is drawn that many
        columns wide (the last to the end), for the requests that reach it, and the entry
        into the next stage is found inside the segment just drawn."""
        width = n_iterations
        out = np.zeros((n_requests, width), dtype=np.int64)
        spans = [b - a for a, b in zip(self.starts, self.starts[1:])]  # [S − 1] tokens
        rows = np.arange(n_requests)
        enter = np.zeros(n_requests, dtype=np.int64)  # [R] first column of the current stage
        done = np.zeros(n_requests, dtype=np.int64)  # [R] tokens generated before `enter`
        for j, stage in enumerate(self.stages):
            live = rows[enter < width]
            if live.size == 0:
                break
            span = width - int(enter[live].min())
            if j < len(spans):
                span = min(span, spans[j])
            cols = enter[live, None] + np.arange(span)[None, :]  # [L, span]
            fits = cols < width
            draws = stage.sample(rng, live.size, span)  # [L, span] from the stage's start
            out[np.broadcast_to(live[:, None], cols.shape)[fits], cols[fits]] = draws[fits]
            if j == len(spans):
                break
            gen = np.where(fits, draws + 1, 0)  # tokens of each drawn column
            before = done[live, None] + np.cumsum(gen, axis=1) - gen  # [L, span]
            steps = np.sum((before < self.starts[j + 1]) & fits, axis=1)  # columns to stay
            done[live] += np.sum(np.where(np.arange(span)[None, :] < steps[:, None], gen, 0),
                                 axis=1)
            enter[live] += steps  # the width where the request stays to the end
        return out
