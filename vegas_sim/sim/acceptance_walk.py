"""A traced cell walked again at a smaller γ: what its runs would have accepted drafting fewer
tokens per iteration.

Truncating each traced iteration (accepted' = min(accepted, γ)) under-states a smaller γ: an
easy stretch that one γ_t iteration accepts whole is, at γ, several iterations that each accept
all γ drafts, while truncation counts it once. Acceptance comes in such stretches (text turns
repetitive, a copy runs on), so the bias is largest where acceptance is most bimodal.

The walk instead reads each run as the token stream it generated: every token accepted (a draft
the target agreed with), rejected (the correction after the first rejected draft) or the bonus
after an all-accepted iteration, counted as accepted (the target's own next token, in a stretch
the draft was following). An iteration at γ starting at stream position p accepts the
consecutive accepted tokens from p, at most γ, and the next one starts after its correction
or bonus. So a token's acceptance is taken to depend on where it is in the text, not on where
in the draft it falls. Each walked iteration keeps the recorded acceptance probabilities of the
tokens it drafts (Rao-Blackwellised rates stay exact where the recording is), and its
generated-token count (`gen`), so output-length cuts and the replay work as on a traced cell.
An iteration whose outcome the stream does not decide (it reaches the run's end still
accepting, short of γ) ends its run's walk. Checked where both were traced (docs/RESULTS.md,
"Acceptance at a smaller γ than traced").
"""

from __future__ import annotations

import numpy as np

from vegas_sim.sim.acceptance_cells import pool_cells
from vegas_sim.sim.acceptance_dist import TracedCell


def _token_stream(cell: TracedCell) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(accepted [T] bool, probability [T], run end [T] exclusive flat index) of every token
    the cell's runs generated, runs in order: iteration j gives acc_j accepted drafts, then its
    correction (rejected, with the rejected draft's recorded probability) or, all accepted,
    its bonus (accepted, probability 1)."""
    acc = cell.acc.astype(np.int64)
    n_tok = acc + 1  # [N] tokens per iteration
    first = np.concatenate([[0], np.cumsum(n_tok)[:-1]])  # [N] flat index of its first token
    it = np.repeat(np.arange(len(acc)), n_tok)  # [T] the iteration of each token
    offset = np.arange(int(n_tok.sum())) - first[it]  # [T] 0..acc_j within the iteration
    all_in = acc[it] >= cell.gamma  # [T] the iteration accepted every draft
    accepted = (offset < acc[it]) | all_in
    drafted = offset < cell.gamma  # the bonus was not drafted: no probability recorded
    prob = np.where(drafted, cell.prob[it, np.minimum(offset, cell.gamma - 1)], 1.0)
    run_last = cell.run_start[it] + cell.run_len[it] - 1  # [T] last iteration of its run
    run_end = first[run_last] + n_tok[run_last]
    return accepted, prob, run_end


def _accepted_ahead(accepted: np.ndarray, run_end: np.ndarray) -> np.ndarray:
    """[T] the number of consecutive accepted tokens from each position, within its run."""
    idx = np.arange(len(accepted))
    stop = np.where(accepted, len(accepted), idx)  # a rejected token stops the count
    nxt = np.minimum.accumulate(stop[::-1])[::-1]  # [T] the next rejected token at or after
    return np.minimum(nxt, run_end) - idx


def rewalk(cell: TracedCell, gamma: int) -> TracedCell:
    """The cell's runs walked at `gamma` < its traced γ (module docstring), as a cell traced at
    `gamma`. Runs keep their order; a run's first iteration starts where it started."""
    return rewalk_cells([cell], gamma)[0]


def rewalk_cells(cells: list[TracedCell], gamma: int) -> list[TracedCell]:
    """`rewalk` of several cells of one traced γ, walked together (one pass of array steps
    for all their runs); each cell left as it is where `gamma` is not below its γ."""
    if not cells or gamma >= cells[0].gamma:
        return list(cells)
    pooled = pool_cells(cells)
    walked = _walk(pooled, gamma)
    if walked is None:  # no run decides even one iteration: nothing to walk
        return list(cells)
    run, start, acc, prob, gen = walked
    n_runs = np.array([len(np.unique(c.run_start)) for c in cells])
    owner = np.repeat(np.arange(len(cells)), n_runs)[run]  # [M] the cell of each iteration
    out = []
    for i, c in enumerate(cells):
        keep = owner == i
        if not keep.any():
            out.append(c)
            continue
        out.append(_cell(c, gamma, run[keep], acc[keep], prob[keep], gen[keep]))
    return out


def _cell(cell: TracedCell, gamma: int, run: np.ndarray, acc: np.ndarray, prob: np.ndarray,
          gen: np.ndarray) -> TracedCell:
    """A walked cell from its iterations (runs consecutive, each in order)."""
    change = np.concatenate([[True], run[1:] != run[:-1]])
    first = np.flatnonzero(change)
    lens = np.diff(np.concatenate([first, [len(run)]]))
    run_idx = np.cumsum(change) - 1
    return TracedCell(gamma, cell.sparsity, cell.bucket, acc, prob, first[run_idx],
                      lens[run_idx], cell.ctx_min, cell.ctx_max, gen)


def _walk(cell: TracedCell, gamma: int
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """(run [M], stream start [M], accepted [M], probabilities [M, γ], tokens generated before
    [M]) of every walked iteration, runs in order (run: the index among the cell's runs), or
    None when no run decides an iteration."""
    accepted, prob, run_end = _token_stream(cell)
    ahead = _accepted_ahead(accepted, run_end)
    n_tok = cell.acc.astype(np.int64) + 1
    first_tok = np.concatenate([[0], np.cumsum(n_tok)[:-1]])
    pos = first_tok[np.unique(cell.run_start)]  # [R] where each run's walk stands
    origin = pos.copy()
    end = run_end[pos]
    runs, starts, counts = [], [], []
    active = np.arange(len(pos))
    while len(active):
        p = pos[active]
        k = np.minimum(ahead[p], gamma)
        decided = (k == gamma) | (p + k < end[active])  # a rejection inside the run, or all γ
        r, p, k = active[decided], p[decided], k[decided]
        runs.append(r)
        starts.append(p)
        counts.append(k)
        nxt = p + k + 1
        more = nxt < end[r]
        active = r[more]
        pos[active] = nxt[more]
    run = np.concatenate(runs)
    if len(run) == 0:
        return None
    start = np.concatenate(starts)
    acc = np.concatenate(counts)
    order = np.lexsort((start, run))  # runs in order, each run's iterations in order
    run, start, acc = run[order], start[order], acc[order]
    step = np.arange(gamma)
    tok = start[:, None] + step[None, :]  # [M, γ] the stream tokens each iteration drafts
    drafted = step[None, :] <= acc[:, None]  # the accepted ones and the first rejected
    walked_prob = np.where(drafted, prob[np.minimum(tok, len(prob) - 1)], 0.0)
    return run, start, acc, walked_prob, start - origin[run]
