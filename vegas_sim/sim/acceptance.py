"""Acceptance model: per (method, sparsity, context bucket, workload, temperature) from traces.

Data: acceptance.parquet, one row per (request, iteration). A *run* is the sequence of
iterations one traced request went through at one grid point (method, gamma, sparsity,
temperature, workload, request); rows of a run are in file order with increasing iteration and
context (a reset of either starts a new run, so a request id reused at another context is a
different run). A run belongs to the context bucket of its first iteration's context.

A *cell* is all runs of one (method, temperature, workload, sparsity, bucket, traced γ). A lookup
picks cells and turns them into an `AcceptanceDist`:

- γ ≤ traced γ_t (the smallest traced γ_t ≥ γ is used): truncation accepted' = min(accepted, γ),
  exact for the first γ positions of those runs.
- γ > max traced γ: every all-accepted iteration is extended position by position with
  conditional rates a_i = r_i / r_{i−1} extrapolated by a decay fitted to the last traced
  positions (log a_i linear in i, slope ≤ 0, clamped to [0, 1]). Marked extrapolated.
- sparsity between traced values: a mixture of the two neighbouring cells with linear weight
  (the mean is linearly interpolated); above the max traced: mixture with "draft = target"
  (s = 1, everything accepted); below the min traced: clamped. The last two are marked.
- context: the two neighbouring buckets, weights linear in log-context; outside the traced
  range → nearest, marked. (A leave-one-prompt-out CV on the SmolLM2 H200 traces found no
  smoother alternative clearly better, per-prompt variation dominating the error: a Gaussian
  kernel over log-context (bandwidth 0.3–0.5) gained ≈ 1 point of mean |error| on the short
  prompts but lost 0.5 on longdoc; local-linear and logit-linear trends were within ±0.3;
  pooling all contexts was clearly worse on longdoc.)
- output length (`lookup(..., output_len=)`): each run keeps only the iterations a request of
  that many tokens runs (tokens generated before the iteration < output_len), a prefix of the
  run. Acceptance rises along a generation (text turns repetitive): on the SmolLM2 longdoc
  traces at T 0.6, the mean over whole 32-iteration runs exceeds the first-128-token mean by
  2 / 5 / 8 % at γ 4 / 8 / 12. Longer than the traced runs → every iteration, marked.
- temperature: nearest traced (0 = greedy), marked when not exact.

Rates r_i = P(accepted ≥ i) use the recorded acceptance probabilities where that is exact:
P(accepted ≥ i) = E[1{accepted ≥ i−1} · accept_prob_i] (Rao-Blackwellised: the probability of
accepting d_i given the first i−1 were accepted is recorded, the coin flip adds only noise).
Replay (`AcceptanceDist.sample`) is a circular block bootstrap of the real runs (of their kept
prefixes when `output_len` is given).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from vegas_sim.errors import TraceSetError, UserInputError
from vegas_sim.methods import METHODS, check_gamma, check_sparsity

ACCEPTANCE_WHERE = "acceptance.parquet"
BLOCK_LEN = 8  # iterations per bootstrap block: keeps the short-range correlation of a request
DECAY_FIT_POSITIONS = 4  # last traced positions the conditional-rate decay is fitted on
MAX_EXACT_BUCKETS = 12  # more distinct start contexts than this → log2-wide buckets

_RUN_KEYS = ["method", "gamma", "sparsity", "temperature", "workload", "request"]
_REQUIRED = ("method", "gamma", "sparsity", "context", "temperature", "workload", "request",
             "iteration", "accepted", "accept_prob")


# ---- replay sources -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Cell:
    """All runs of one traced configuration, flattened in run order.

    acc [N] accepted drafts (0..gamma); prob [N, gamma] acceptance probabilities;
    run_start [N] / run_len [N] the flat index of each position's run start and that run's
    length (for circular blocks inside a run); gen [N] tokens the request had generated before
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

    def head(self, output_len: int) -> _Cell:
        """The iterations a request of `output_len` tokens runs (gen < output_len): a prefix of
        every run, so the runs stay consecutive and the bootstrap stays inside them."""
        keep = self.gen < output_len  # [N]; a run's first iteration (gen 0) is always kept
        if keep.all():
            return self
        new_idx = np.cumsum(keep) - 1  # [N] position in the kept arrays
        start = new_idx[self.run_start[keep]]  # [M] the kept run start of each kept position
        length = np.bincount(start, minlength=int(keep.sum()))[start]  # [M]
        return _Cell(self.gamma, self.sparsity, self.bucket, self.acc[keep], self.prob[keep],
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


@dataclass(frozen=True)
class _Source:
    """One mixture component of a lookup: a cell truncated / extended to γ, or all-accepted."""

    cell: _Cell | None  # None = draft equals target (s = 1): every draft accepted
    cond_ext: np.ndarray  # [γ − γ_t] conditional rates for the extended positions (may be [])
    rates: np.ndarray  # [γ] this component's per-position rates

    def draw_blocks(self, rng: np.random.Generator, n_blocks: int, gamma: int,
                    block_len: int) -> np.ndarray:
        """[n_blocks, block_len] accepted drafts for this component."""
        if self.cell is None:
            return np.full((n_blocks, block_len), gamma, dtype=np.int64)
        cell = self.cell
        start = rng.integers(0, len(cell.acc), n_blocks)  # [n_blocks] uniform over iterations
        rs, rl = cell.run_start[start], cell.run_len[start]
        # circular inside the run: every traced iteration is equally likely to be replayed
        idx = rs[:, None] + (start - rs)[:, None] + np.arange(block_len)[None, :]
        idx = rs[:, None] + (idx - rs[:, None]) % rl[:, None]  # [n_blocks, block_len]
        vals = np.minimum(cell.acc[idx], gamma)
        if len(self.cond_ext):
            full = vals == cell.gamma
            n_full = int(full.sum())
            if n_full:
                u = rng.random((n_full, len(self.cond_ext)))
                extra = np.cumprod(u < self.cond_ext[None, :], axis=1).sum(axis=1)
                vals[full] += extra
        return vals


@dataclass
class AcceptanceDist:
    """Acceptance of one configuration, ready to replay."""

    method: str
    gamma: int
    rates: np.ndarray  # [gamma] per-position rates r_i = P(at least i drafts accepted)
    extrapolated: list[str] = field(default_factory=list)  # human-readable reasons; [] = inside
    sources: list[_Source] = field(default_factory=list, repr=False)
    weights: np.ndarray = field(default_factory=lambda: np.ones(0), repr=False)
    block_len: int = BLOCK_LEN

    @property
    def mean_length(self) -> float:
        """Mean acceptance length, bonus token included: 1 + Σ r_i."""
        return 1.0 + float(np.sum(self.rates))

    @property
    def is_extrapolated(self) -> bool:
        return bool(self.extrapolated)

    def sample(self, rng: np.random.Generator, n_requests: int, n_iterations: int) -> np.ndarray:
        """[n_requests, n_iterations] accepted drafts (0..gamma), block-bootstrapped.

        Each request is a concatenation of blocks of `block_len` consecutive iterations of one
        traced run (circular inside the run); with two mixture components (sparsity
        interpolation) each block picks its component with the interpolation weight. Without
        traced runs (a hand-built dist) iterations are drawn independently from `rates`.
        Deterministic for the state of `rng`.
        """
        if self.gamma == 0 or n_requests == 0 or n_iterations == 0:
            return np.zeros((n_requests, n_iterations), dtype=np.int64)
        if not self.sources:
            u = rng.random((n_requests, n_iterations, 1))
            return np.asarray((u < self.rates[None, None, :]).sum(axis=2), dtype=np.int64)
        bl = self.block_len
        n_blocks = n_requests * math.ceil(n_iterations / bl)
        if len(self.sources) == 1:
            blocks = self.sources[0].draw_blocks(rng, n_blocks, self.gamma, bl)
        else:
            pick = rng.choice(len(self.sources), size=n_blocks, p=self.weights)
            blocks = np.empty((n_blocks, bl), dtype=np.int64)
            for k, src in enumerate(self.sources):
                sel = pick == k
                blocks[sel] = src.draw_blocks(rng, int(sel.sum()), self.gamma, bl)
        return blocks.reshape(n_requests, -1)[:, :n_iterations]


# ---- decay extrapolation ------------------------------------------------------------------


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


# ---- the model ----------------------------------------------------------------------------


def _split_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Sort rows into runs (stable: file order inside a key) and add a run id column."""
    df = (df.assign(_row=np.arange(len(df)))  # file order breaks ties: a stable sort
          .sort_values(_RUN_KEYS + ["_row"]).drop(columns="_row").reset_index(drop=True))
    new_key = np.zeros(len(df), dtype=bool)
    new_key[0] = True
    for k in _RUN_KEYS:
        v = df[k].to_numpy()
        new_key[1:] |= v[1:] != v[:-1]
    it = df["iteration"].to_numpy()
    ctx = df["context"].to_numpy()
    reset = np.zeros(len(df), dtype=bool)
    reset[1:] = (it[1:] <= it[:-1]) | (ctx[1:] < ctx[:-1])
    df["run"] = np.cumsum(new_key | reset) - 1
    return df


def _buckets(starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bucket centres [K], bucket of each start [n]) for run start contexts."""
    uniq = np.unique(starts)
    if len(uniq) <= MAX_EXACT_BUCKETS:
        return uniq.astype(float), np.searchsorted(uniq, starts)
    # many distinct prompt lengths: factor-of-2 bins, centre = geometric mean of the members
    b = np.floor(np.log2(np.maximum(starts, 1))).astype(np.int64)
    keys, inv = np.unique(b, return_inverse=True)
    centres = np.array([np.exp(np.mean(np.log(np.maximum(starts[inv == k], 1))))
                        for k in range(len(keys))])
    return centres, inv


def _validate(df: pd.DataFrame, weights_kind: str) -> None:
    fix_real = "calibrate acceptance with the real checkpoint (random weights are latency-only)"
    if weights_kind != "real":
        raise TraceSetError(
            f"acceptance was recorded with {weights_kind!r} weights; it is meaningless",
            where=f"{ACCEPTANCE_WHERE}, column model_weights", fix=fix_real)
    missing = [c for c in _REQUIRED if c not in df.columns]
    if missing:
        raise TraceSetError(f"missing columns {missing}", where=ACCEPTANCE_WHERE,
                            fix="write rows with the columns of traces.schema.ACCEPTANCE_SCHEMA")
    if len(df) == 0:
        raise TraceSetError("no acceptance rows", where=ACCEPTANCE_WHERE,
                            fix="calibrate with real weights to record acceptance")
    if "model_weights" in df.columns and (df["model_weights"] != "real").any():
        raise TraceSetError("rows recorded with random weights", fix=fix_real,
                            where=f"{ACCEPTANCE_WHERE}, column model_weights")
    acc, gam = df["accepted"].to_numpy(), df["gamma"].to_numpy()
    if ((acc < 0) | (acc > gam)).any():
        raise TraceSetError("accepted must be in 0..gamma",
                            where=f"{ACCEPTANCE_WHERE}, column accepted",
                            fix="re-record the grid point")


class AcceptanceModel:
    """Acceptance per traced configuration; `lookup` answers any (method, γ, s, C, ...)."""

    def __init__(self, runs: pd.DataFrame, cells: dict[tuple[str, float, str, float, float, int],
                                                        _Cell]) -> None:
        self._runs = runs  # one row per run: keys, bucket, start context
        # key: (method, temperature, workload, sparsity, bucket, gamma)
        self._cells = cells
        self._buckets = sorted({k[4] for k in cells})

    @classmethod
    def from_traces(cls, acceptance: pd.DataFrame, weights_kind: str) -> AcceptanceModel:
        """Raises TraceSetError for random-weight traces (their acceptance is meaningless)."""
        _validate(acceptance, weights_kind)
        df = _split_runs(acceptance)
        first = df.groupby("run", sort=True).head(1)  # first iteration of each run
        centres, bucket_of_run = _buckets(first["context"].to_numpy())
        df["bucket"] = centres[bucket_of_run][df["run"].to_numpy()]
        cells: dict[tuple[str, float, str, float, float, int], _Cell] = {}
        keys = ["method", "temperature", "workload", "sparsity", "bucket", "gamma"]
        for key, rows in df.groupby(keys, sort=True):
            m, temp, wl, s, b, g = (str(v) for v in key)  # type: ignore[union-attr]
            cells[(m, float(temp), wl, float(s), float(b), int(g))] = _make_cell(
                rows, int(g), float(s), float(b))
        runs = first.assign(bucket=centres[bucket_of_run])[keys + ["run", "context"]]
        return cls(runs.reset_index(drop=True), cells)

    # -- lookup --
    def lookup(
        self,
        method: str,
        gamma: int,
        sparsity: float,
        context: int,
        workload: str | None = None,
        temperature: float = 0.0,
        output_len: int | None = None,
    ) -> AcceptanceDist:
        """The acceptance distribution of one configuration (see the module docstring).

        `output_len` (tokens each request generates) restricts every traced run to the
        iterations such a request runs (tokens generated before the iteration < output_len):
        acceptance rises along a generation (the text turns repetitive), so the traced runs'
        later iterations over-state a short output's acceptance. None uses every iteration.
        """
        if method == "vanilla":
            return AcceptanceDist("vanilla", 0, np.zeros(0))
        traced = sorted({k[0] for k in self._cells})
        if method not in METHODS or method not in traced:
            raise TraceSetError(
                f"method {method!r} has no acceptance traces (traced: {', '.join(traced)})",
                where=f"{ACCEPTANCE_WHERE}, column method",
                fix=f"calibrate {method!r} with real weights, or use one of: {', '.join(traced)}")
        check_gamma(gamma)
        check_sparsity(sparsity)
        if output_len is not None and output_len < 1:
            raise UserInputError(f"output length must be >= 1, got {output_len}",
                                 where="output_len", fix="give the tokens each request generates")
        notes: list[str] = []
        keys = [k for k in self._cells if k[0] == method]
        temps = sorted({k[1] for k in keys})
        temp = min(temps, key=lambda t: (abs(t - temperature), t))
        if temp != temperature:
            notes.append(f"temperature {temperature:g} not traced for {method}: using {temp:g}")
        keys = [k for k in keys if k[1] == temp]
        wls = sorted({k[2] for k in keys})
        if workload is not None:
            if workload not in wls:
                raise UserInputError(
                    f"unknown workload {workload!r} for {method} at temperature {temp:g}",
                    where="workload", fix=f"use one of: {', '.join(wls)} (or none to pool all)")
            keys = [k for k in keys if k[2] == workload]
        comps: list[_Source] = []
        w: list[float] = []
        for bucket, bucket_w, note in self._context_mixture(keys, context):
            if note:
                notes.append(note)
            b_comps, b_w, s_notes = self._sparsity_mixture(
                [k for k in keys if k[4] == bucket], sparsity, gamma, output_len)
            notes.extend(n for n in s_notes if n not in notes)
            comps += b_comps
            w += [bucket_w * x for x in b_w]
        rates = sum((wi * c.rates for wi, c in zip(w, comps)), np.zeros(gamma))
        return AcceptanceDist(method, gamma, np.asarray(rates), notes, comps, np.asarray(w))

    def _context_mixture(self, keys: list[tuple[str, float, str, float, float, int]],
                         context: int) -> list[tuple[float, float, str]]:
        """(bucket, weight, note): inside the traced buckets, the two neighbours with weights
        linear in log-context (a monotone interpolation of the rates); outside, the nearest
        bucket alone, labelled extrapolated."""
        buckets = sorted({k[4] for k in keys})
        logc = math.log(max(context, 1))
        if len(buckets) == 1 or not (buckets[0] < context < buckets[-1]):
            bucket, note = self._pick_bucket(keys, context)
            return [(bucket, 1.0, note)]
        j = int(np.searchsorted(buckets, context))
        lo, hi = buckets[j - 1], buckets[j]
        w = (logc - math.log(lo)) / (math.log(hi) - math.log(lo))
        return [(b, bw, "") for b, bw in ((lo, 1.0 - w), (hi, w)) if bw > 0.0]

    def _pick_bucket(self, keys: list[tuple[str, float, str, float, float, int]],
                     context: int) -> tuple[float, str]:
        buckets = sorted({k[4] for k in keys})
        logc = math.log(max(context, 1))
        bucket = min(buckets, key=lambda b: abs(math.log(max(b, 1.0)) - logc))
        cells = [self._cells[k] for k in keys]
        lo, hi = min(c.ctx_min for c in cells), max(c.ctx_max for c in cells)
        if context < lo or context > hi:
            return bucket, (f"context {context} outside traced {lo}..{hi}: using the nearest "
                            f"traced bucket ({bucket:.0f})")
        return bucket, ""

    def _sparsity_mixture(
        self, keys: list[tuple[str, float, str, float, float, int]], sparsity: float, gamma: int,
        output_len: int | None = None,
    ) -> tuple[list[_Source], list[float], list[str]]:
        notes: list[str] = []
        sps = sorted({k[3] for k in keys})
        if sparsity < sps[0]:
            notes.append(f"sparsity {sparsity:g} below traced min {sps[0]:g}: clamped")
            points = [(sps[0], 1.0)]
        elif sparsity > sps[-1]:
            # toward s = 1, where the draft is the target and every draft is accepted
            w = (sparsity - sps[-1]) / (1.0 - sps[-1])
            notes.append(f"sparsity {sparsity:g} above traced max {sps[-1]:g}: interpolated "
                         "toward s = 1 (draft = target)")
            points = [(sps[-1], 1.0 - w), (1.0 + 1e-12, w)]  # 1 + ε: the all-accepted point
        else:
            j = int(np.searchsorted(sps, sparsity))
            if sps[j] == sparsity:
                points = [(sps[j], 1.0)]
            else:
                lo, hi = sps[j - 1], sps[j]
                w = (sparsity - lo) / (hi - lo)
                points = [(lo, 1.0 - w), (hi, w)]
        sources, weights = [], []
        for s, w in points:
            if w <= 0.0:
                continue
            if s > 1.0:
                sources.append(_Source(None, np.zeros(0), np.ones(gamma)))
            else:
                src, src_notes = self._source(keys, s, gamma, output_len)
                sources.append(src)
                notes.extend(n for n in src_notes if n not in notes)
            weights.append(w)
        total = sum(weights)
        return sources, [w / total for w in weights], notes

    def _source(self, keys: list[tuple[str, float, str, float, float, int]], s: float,
                gamma: int, output_len: int | None = None) -> tuple[_Source, list[str]]:
        """Pool the cells at sparsity s (workloads pooled) at the best traced γ for `gamma`,
        restricted to the first `output_len` generated tokens of every run when given."""
        at_s = [k for k in keys if k[3] == s]
        gts = sorted({k[5] for k in at_s})
        above = [g for g in gts if g >= gamma]
        gt = above[0] if above else gts[-1]
        cell = _pool([self._cells[k] for k in at_s if k[5] == gt])
        notes: list[str] = []
        if output_len is not None:
            cell = cell.head(output_len)
            last = np.unique(cell.run_start + cell.run_len - 1)  # [runs] last kept iteration
            traced = int(np.median(cell.gen[last] + np.minimum(cell.acc[last], gt) + 1))
            if output_len > traced:
                notes.append(f"output length {output_len} beyond the {traced} tokens traced per "
                             "request (median): later output positions replay the traced ones")
        rates, ext = extend_rates(cell.rates(), gamma)
        if gamma > gt:
            notes.append(f"gamma {gamma} above traced max {gt}: positions {gt + 1}..{gamma} "
                         "extrapolated by a fitted decay")
        return _Source(cell, ext, rates), notes

    def coverage(self) -> dict[str, object]:
        """Traced ranges: methods, gamma max, sparsities, context range, workloads, temperatures."""
        keys = list(self._cells)
        per_method: dict[str, dict[str, object]] = {}
        for m in sorted({k[0] for k in keys}):
            mk = [k for k in keys if k[0] == m]
            per_method[m] = {
                "gamma": sorted({k[5] for k in mk}),
                "sparsity": sorted({k[3] for k in mk}),
                "temperature": sorted({k[1] for k in mk}),
            }
        cells = list(self._cells.values())
        return {
            "methods": sorted(per_method),
            "gamma_max": max(k[5] for k in keys),
            "sparsities": sorted({k[3] for k in keys}),
            "context_range": (min(c.ctx_min for c in cells), max(c.ctx_max for c in cells)),
            "context_buckets": [float(b) for b in self._buckets],
            "workloads": sorted({k[2] for k in keys}),
            "temperatures": sorted({k[1] for k in keys}),
            "per_method": per_method,
            "n_runs": int(len(self._runs)),
            "n_iterations": int(sum(len(c.acc) for c in cells)),
        }


def _make_cell(rows: pd.DataFrame, gamma: int, sparsity: float, bucket: float) -> _Cell:
    """Flatten the runs of one cell (rows already in run order)."""
    acc = rows["accepted"].to_numpy(dtype=np.int64)
    probs = rows["accept_prob"].to_numpy()
    try:
        prob = np.concatenate([np.asarray(p, dtype=float) for p in probs]).reshape(len(acc), gamma)
    except ValueError:
        raise TraceSetError(
            f"accept_prob lists must have gamma = {gamma} entries",
            where=f"{ACCEPTANCE_WHERE}, column accept_prob", fix="re-record the grid point",
        ) from None
    run = rows["run"].to_numpy()
    change = np.concatenate([[True], run[1:] != run[:-1]])
    starts = np.flatnonzero(change)  # [n_runs] flat index of each run's first iteration
    lens = np.diff(np.concatenate([starts, [len(acc)]]))
    run_idx = np.cumsum(change) - 1
    ctx = rows["context"].to_numpy()
    gen = ctx - ctx[starts][run_idx]  # [N] tokens generated before each iteration
    return _Cell(gamma, sparsity, bucket, acc, prob, starts[run_idx], lens[run_idx],
                 int(ctx.min()), int(ctx.max()), gen)


def _pool(cells: list[_Cell]) -> _Cell:
    """Concatenate cells of the same γ (workloads pooled), re-basing run starts."""
    if len(cells) == 1:
        return cells[0]
    offsets = np.cumsum([0] + [len(c.acc) for c in cells[:-1]])
    return _Cell(
        cells[0].gamma, cells[0].sparsity, cells[0].bucket,
        np.concatenate([c.acc for c in cells]),
        np.concatenate([c.prob for c in cells]),
        np.concatenate([c.run_start + o for c, o in zip(cells, offsets)]),
        np.concatenate([c.run_len for c in cells]),
        min(c.ctx_min for c in cells), max(c.ctx_max for c in cells),
        np.concatenate([c.gen for c in cells]),
    )


# ---- given sequences (common random numbers) -------------------------------------------


class FixedSequences:
    """An `engine.AcceptanceSampler` that replays given per-request sequences.

    `validate` feeds the simulator the accept counts a real run produced (or replayed), so
    that prediction and measurement see the same acceptance and the difference isolates the
    latency model and the batching. Row r of every `sample` call is request r's sequence,
    continued from where the previous call stopped (the engine extends its plan in chunks)
    and repeated cyclically past its end; requests beyond the given rows reuse them cyclically.
    """

    def __init__(self, gamma: int, sequences: list[list[int]]) -> None:
        if gamma < 1 or not sequences or any(len(s) == 0 for s in sequences):
            raise UserInputError("FixedSequences needs gamma >= 1 and non-empty sequences",
                                 where="acceptance sequences",
                                 fix="give every request at least one accepted count")
        self.gamma = gamma
        self._seqs = [np.minimum(np.asarray(s, dtype=np.int64), gamma) for s in sequences]
        self._cursor = 0

    @property
    def mean_length(self) -> float:
        """1 + mean accepted drafts over all given iterations (bonus included)."""
        return 1.0 + float(np.concatenate(self._seqs).mean())

    def sample(self, rng: np.random.Generator, n_requests: int, n_iterations: int) -> np.ndarray:
        """[n_requests, n_iterations] the next columns of each sequence (rng unused)."""
        cols = self._cursor + np.arange(n_iterations)  # [W]
        out = np.empty((n_requests, n_iterations), dtype=np.int64)
        for r in range(n_requests):
            seq = self._seqs[r % len(self._seqs)]
            out[r] = seq[cols % len(seq)]
        self._cursor += n_iterations
        return out
