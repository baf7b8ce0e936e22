"""Acceptance along a long generation: looked up at the context the generation has reached.

A traced run measures acceptance at one prompt context over the ~100–200 tokens that follow
it. A generation of 20,000 tokens from a 182-token prompt spends almost all of its iterations
at KV lengths the prompt lookup never saw, and acceptance moves with the context (on the
SmolLM2 reasoning traces at T 0.6, MagicDec-Stream's mean acceptance length at γ 12 rises
from 2.78 at 105 tokens to 4.06 at 683). So a long generation is cut into *segments*:

    segment 0: tokens [0, b_1), the prompt's own lookup (what the traced runs cover)
    segment k: tokens [b_k, b_{k+1}), looked up at the geometric middle of its contexts

with b_1 = max(tokens the traced runs cover, (STEP − 1) · prompt) and each later segment
spanning a context ratio of STEP. A generation that stays inside segment 0 (every prompt
whose output is short next to it) is the prompt's lookup itself, draw for draw.

Replay (`GenerationDist.sample`): every segment draws a full [R, W] replay; a request's
iteration k takes segment j's draw where j is the segment of the tokens it generated before
iteration k. Column k is iteration k in every segment's draws, so a request entering a
segment continues at its own position in a run (acceptance along a generation keeps its
place), and the tokens before a column never change once it is assigned, so one pass per
segment is exact.

`rates` (the analytic engine's and tune's input, and the rows' `acceptance` summary) are the
segments' rates iteration-weighted over the mean output's tokens in each segment, as a
vLLM counter over the whole generation would average them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from vegas_sim.sim.acceptance_dist import AcceptanceDist

STEP = 2.0  # context ratio one segment spans: an octave (the acceptance model is linear in
# log-context between its buckets, so a lookup at an octave's geometric middle is its mean)


def segment_starts(prompt: int, tokens: int, traced: int) -> list[tuple[int, int]]:
    """(first generated token, lookup context) of each segment of a generation of up to
    `tokens` tokens after a `prompt`-token prompt whose traced runs cover `traced` tokens."""
    segs = [(0, prompt)]
    start = max(prompt + traced, math.ceil(prompt * STEP))
    while start - prompt < tokens:
        end = start * STEP
        segs.append((start - prompt, round(math.sqrt(start * end))))
        start = math.ceil(end)
    return segs


def token_shares(starts: list[int], tokens: int) -> np.ndarray:
    """[K] share of a `tokens`-token generation's tokens generated in each segment."""
    edges = np.minimum(np.asarray([*starts, tokens], dtype=float), tokens)  # [K + 1]
    return np.diff(edges) / max(tokens, 1)


def weighted_rates(dists: list[AcceptanceDist], shares: np.ndarray) -> np.ndarray:
    """[γ] per-position rates over segments: each segment's iterations are its tokens over its
    acceptance length, so a counter over the generation weights its rates by that."""
    its = shares / np.array([d.mean_length for d in dists])  # iterations per generated token
    return np.asarray(sum(w * d.rates for w, d in zip(its / its.sum(), dists)))


@dataclass
class GenerationDist(AcceptanceDist):
    """An `AcceptanceDist` whose lookup follows a generation's context (module docstring)."""

    starts: list[int] = field(default_factory=list, repr=False)  # [K] first token of each
    segments: list[AcceptanceDist] = field(default_factory=list, repr=False)  # [K]

    def sample(self, rng: np.random.Generator, n_requests: int, n_iterations: int,
               first: int = 0) -> np.ndarray:
        """[n_requests, n_iterations − first] accepted drafts, segment by segment (module
        docstring); iterations before `first` are drawn too, for the tokens they generate."""
        out = self.segments[0].sample(rng, n_requests, n_iterations)
        bounds = [*self.starts[1:], n_iterations]
        for k, dist in enumerate(self.segments[1:], start=1):
            # an iteration generates 1..γ+1 tokens: segment k's columns lie in [lo, hi)
            lo = min(bounds[k - 1] // (self.gamma + 1), n_iterations)
            hi = min(bounds[k], n_iterations)
            before = np.cumsum(out + 1, axis=1) - (out + 1)  # [R, W] tokens before each column
            enter = before[:, lo:hi] >= self.starts[k]  # [R, hi − lo]
            if lo >= hi or not enter.any():
                break
            out[:, lo:hi] = np.where(enter, dist.sample(rng, n_requests, hi, lo), out[:, lo:hi])
        return out[:, first:]


Lookup = Callable[[int], AcceptanceDist]  # context -> the configuration's dist there


def generation_dist(lookup: Lookup, prompt: int, mean_tokens: int, max_tokens: int
                    ) -> AcceptanceDist:
    """The acceptance of generations after a `prompt`-token prompt: `lookup(prompt)` itself
    when every generation (up to `max_tokens`) stays in its first segment, else a
    `GenerationDist` over the segments (`mean_tokens` weights its summary `rates`)."""
    first = lookup(prompt)
    if first.gamma == 0:
        return first
    segs = segment_starts(prompt, max_tokens, traced_tokens(first))
    if len(segs) == 1:
        return first
    dists = [first] + [lookup(c) for _, c in segs[1:]]
    starts = [b for b, _ in segs]
    shares = token_shares(starts, mean_tokens)
    # the notes of the farthest segment a generation of the mean length reaches
    notes = _notes(first, dists[int(np.searchsorted(starts, mean_tokens, "left")) - 1])
    sources = [s for d in dists for s in d.sources]
    weights = np.concatenate([sh * d.weights for sh, d in zip(shares, dists)])
    return GenerationDist(
        first.method, first.gamma, weighted_rates(dists, shares), notes, sources,
        weights / weights.sum() if weights.sum() > 0 else weights,
        context_trend_sd_pct=float(shares @ [d.context_trend_sd_pct for d in dists]),
        starts=starts, segments=dists)


def traced_tokens(dist: AcceptanceDist) -> int:
    """Tokens a traced run of `dist` covers (median over its sources' runs; 0: none traced)."""
    covered = [s.traced_tokens for s in dist.sources if s.cell is not None]
    return int(min(covered)) if covered else 0


def _notes(first: AcceptanceDist, last: AcceptanceDist) -> list[str]:
    """The first segment's notes and the `last`'s."""
    out: list[str] = []
    for note in [*first.extrapolated, *last.extrapolated]:
        if note not in out:
            out.append(note)
    return out

