"""Token sampling and lossless speculative acceptance (Leviathan et al. 2023).

- `probs_from_logits`: temperature, then top-k, then top-p (HF / vLLM order), renormalised,
  as a dense [..., V] tensor; with top-k on, top-p works on the k survivors rather than a
  sort of the whole vocabulary. `probs_by_full_sort` is the same distribution computed by a
  full sort: the reference. This processed distribution *is* the target (and draft)
  distribution: spec decoding is lossless with respect to it.
- `token_probs`: the same distribution as the decoder uses it: with top-k on, held on
  top_k + slack *slots* (`TopKProbs`, token ids ascending) so that drawing, p(d) / q(d) and
  the rejection residual read k + slack values per row instead of V (runtime revision 4;
  benchmarks/sampling.py times both layouts); without top-k, the dense tensor (`DenseProbs`).
- `sample`: greedy argmax when temperature == 0, else a draw from `token_probs`.
- `greedy_accept` / `rejection_accept`: per request, accept drafts sequentially; return the
  accepted count a, the token that follows them (correction on rejection, bonus after all γ),
  and min(1, p/q) for every drafted position (1/0 under greedy).

Draws use inverse-CDF sampling from uniforms of an explicit torch.Generator, so a seed gives
the same tokens on every run (torch.multinomial would too, but uniforms are also what the
accept test needs, from the same stream). Slots are in token-id order, so a draw from
`TopKProbs` picks the token the dense draw picks from the same uniform.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch
from torch import Tensor

from vegas_sim.errors import UserInputError


def check_sampling(temperature: float, top_p: float, top_k: int) -> None:
    if temperature < 0:
        raise UserInputError(f"temperature must be >= 0, got {temperature}", where="temperature",
                             fix="use 0 for greedy decoding or a positive value such as 0.6")
    if not (0.0 < top_p <= 1.0):
        raise UserInputError(f"top_p must be in (0, 1], got {top_p}", where="top_p",
                             fix="use 1.0 to disable nucleus sampling")
    if top_k < 0:
        raise UserInputError(f"top_k must be >= 0, got {top_k}", where="top_k",
                             fix="use 0 to disable top-k")


def sampling_args(temperature: float, top_p: float, top_k: int) -> tuple[float, float, int]:
    """(temperature, top_p, top_k) of one run: greedy (T = 0) ignores the filters."""
    if temperature == 0:
        return 0.0, 1.0, 0
    return temperature, top_p, top_k


def probs_from_logits(logits: Tensor, temperature: float, top_p: float = 1.0,
                      top_k: int = 0) -> Tensor:
    """[..., V] logits → [..., V] fp32 probabilities after temperature, top-k and top-p.

    temperature == 0 gives the one-hot of the argmax (the greedy "distribution"). Top-k keeps
    every token tied with the k-th largest logit (as HF, vLLM and gpt-fast do; see
    `TopKProbs.overflow` for a tie group longer than the slots); top-p keeps the smallest
    prefix of the survivors, sorted by logit, whose mass reaches top_p. With top-k on this is
    `token_probs` laid out over the vocabulary.
    """
    check_sampling(temperature, top_p, top_k)
    logits = logits.float()
    if temperature == 0:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    if 0 < top_k < logits.shape[-1]:
        return token_probs(logits, temperature, top_p, top_k).dense()
    x = logits / temperature
    if top_p < 1.0:
        x = _mask_top_p(x, top_p)
    return torch.softmax(x, dim=-1)


def _mask_top_p(x: Tensor, top_p: float) -> Tensor:
    """Top-p over the whole vocabulary (no top-k): one full sort per row."""
    sorted_x, order = torch.sort(x, dim=-1, descending=True)
    sorted_p = torch.softmax(sorted_x, dim=-1)
    # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass strictly
    # before it already reaches top_p (the first token is always kept).
    before = torch.cumsum(sorted_p, dim=-1) - sorted_p
    drop = torch.zeros_like(before, dtype=torch.bool).scatter_(-1, order, before >= top_p)
    return x.masked_fill(drop, float("-inf"))


def probs_by_full_sort(logits: Tensor, temperature: float, top_p: float,
                       top_k: int) -> Tensor:
    """probs_from_logits's distribution computed the slow way (runtime revision 2's method): mask
    below the k-th logit (the whole tie group kept), then top-p by a sort of the whole
    vocabulary. The reference that tests hold the top-k slots to."""
    x = logits.float() / temperature
    kth = torch.topk(x, top_k, dim=-1).values[..., -1:]  # [..., 1]
    return probs_from_logits(x.masked_fill(x < kth, float("-inf")), 1.0, top_p, top_k=0)


# Extra slots past top_k for the tie group at the k-th logit (bf16 logits tie often). A group
# longer than that is cut at the last slot and flagged (`TopKProbs.overflow`).
TIE_SLACK_MIN = 16


@dataclass(frozen=True)
class DenseProbs:
    """A distribution per row as a dense [..., V] fp32 tensor (no top-k, or top-k >= V)."""

    probs: Tensor  # [..., V]

    def rows(self, *index: Tensor | slice) -> DenseProbs:
        """The distributions at `index` over the leading dimensions."""
        return DenseProbs(self.probs[index])

    def prob_of(self, tokens: Tensor) -> Tensor:
        """[..., n] int64 tokens → [..., n] their probabilities."""
        return self.probs.gather(-1, tokens)

    def draw(self, generator: torch.Generator | None) -> Tensor:
        return draw(self.probs, generator)

    def residual(self, q: DenseProbs, has_draft: Tensor) -> DenseProbs:
        """normalise(max(p − q, 0)) per row where has_draft [...], else p itself."""
        return DenseProbs(_residual(self.probs, q.probs, has_draft))

    def argmax(self) -> Tensor:
        return self.probs.argmax(-1)

    def dense(self) -> Tensor:
        return self.probs


@dataclass(frozen=True)
class TopKProbs:
    """A distribution per row held on K slots: ids [..., K] int64 ascending, probs [..., K]
    fp32 (0 on a slot that holds no survivor); a token not in ids has probability 0.
    overflow [...]: the tie group at the k-th logit ran past the last slot, so the row is the
    dense distribution restricted to the group's members that fit (renormalised)."""

    ids: Tensor  # [..., K]
    probs: Tensor  # [..., K]
    overflow: Tensor  # [...] bool
    vocab: int

    def rows(self, *index: Tensor | slice) -> TopKProbs:
        return TopKProbs(self.ids[index], self.probs[index], self.overflow[index], self.vocab)

    def prob_of(self, tokens: Tensor) -> Tensor:
        """[..., n] int64 tokens → [..., n] their probabilities."""
        match = tokens[..., :, None] == self.ids[..., None, :]  # [..., n, K]
        return (match * self.probs[..., None, :]).sum(-1)

    def draw(self, generator: torch.Generator | None) -> Tensor:
        return self.ids.gather(-1, draw(self.probs, generator)[..., None])[..., 0]

    def residual(self, q: TopKProbs, has_draft: Tensor) -> TopKProbs:
        """normalise(max(p − q, 0)) per row where has_draft [...], else p. Its support is within
        p's, so it lives on p's slots."""
        q_here = q.prob_of(self.ids)  # [..., K]: q at p's tokens
        return TopKProbs(self.ids, _residual(self.probs, q_here, has_draft), self.overflow,
                         self.vocab)

    def argmax(self) -> Tensor:
        return self.ids.gather(-1, self.probs.argmax(-1, keepdim=True))[..., 0]

    def dense(self) -> Tensor:
        """[..., V]: the reference's layout (tests)."""
        full = torch.zeros(self.ids.shape[:-1] + (self.vocab,), device=self.ids.device)
        return full.scatter_(-1, self.ids, self.probs)


TokenProbs = Union[DenseProbs, TopKProbs]


def stack_rows(dists: list[TokenProbs]) -> TokenProbs:
    """Per-step distributions ([B] rows each, one kind) → [B, n] rows (the γ draft steps)."""
    if all(isinstance(d, TopKProbs) for d in dists):
        top = [d for d in dists if isinstance(d, TopKProbs)]
        return TopKProbs(torch.stack([d.ids for d in top], dim=1),
                         torch.stack([d.probs for d in top], dim=1),
                         torch.stack([d.overflow for d in top], dim=1), top[0].vocab)
    return DenseProbs(torch.stack([d.probs for d in dists], dim=1))


def _residual(p: Tensor, q: Tensor, has_draft: Tensor) -> Tensor:
    """max(p − q, 0) on the rows with a draft, p on the others; p where the residual is empty
    (p == q up to rounding: reached with probability ~0). Not normalised (draw needn't be)."""
    residual = torch.where(has_draft[..., None], (p - q).clamp_min(0.0), p)
    empty = residual.sum(-1, keepdim=True) <= 0
    return torch.where(empty, p, residual)


def token_probs(logits: Tensor, temperature: float, top_p: float = 1.0,
                top_k: int = 0) -> TokenProbs:
    """[..., V] logits → probs_from_logits's distribution (temperature > 0), on top-k slots
    when 0 < top_k < V."""
    check_sampling(temperature, top_p, top_k)
    if temperature == 0:
        raise UserInputError("token_probs needs a temperature > 0", where="temperature",
                             fix="decode greedily with argmax (sample() does)")
    vocab = logits.shape[-1]
    if not 0 < top_k < vocab:
        return DenseProbs(probs_from_logits(logits, temperature, top_p, top_k))
    slots = min(top_k + max(top_k, TIE_SLACK_MIN), vocab)
    return _top_k_slots(logits, temperature, top_k, top_p, slots)


def _top_k_slots(logits: Tensor, temperature: float, top_k: int, top_p: float,
                 slots: int) -> TopKProbs:
    """Top-k then top-p of logits [..., V] / T on `slots` > top_k slots, from one topk of the
    logits in their own dtype (dividing by T keeps their order and their ties; bf16 topk took
    2/3 of fp32's time at [378, 152K] on the H200).

    The survivors of top-k, sorted, are the tokens strictly above the k-th logit (among the
    first k slots) followed by the whole tie group at the k-th logit, whole in the slots
    unless the last slot still ties (then `overflow`). Its tokens all weigh the same, so top-p
    keeps the first n of them, n from the mass before the group, without a host sync; the
    kept ones are the n lowest token ids (a full sort would keep an arbitrary n).
    """
    vals, idx = torch.topk(logits, slots, dim=-1)  # [..., K], descending
    vals = vals.float() / temperature
    kth = vals[..., top_k - 1:top_k]  # [..., 1]
    above = vals > kth  # [..., K]
    tied = vals == kth  # [..., K]
    overflow = (vals[..., -1:] == kth)[..., 0] & (slots < logits.shape[-1])  # [...]
    n_tied = tied.sum(-1, keepdim=True).float()  # [..., 1]
    w = torch.exp(vals - vals[..., :1]).masked_fill(~above, 0.0)  # [..., K], unnormalised
    w_tie = torch.exp(kth - vals[..., :1])  # [..., 1]
    n_keep = n_tied
    if top_p < 1.0:
        w_above = w.sum(-1, keepdim=True)
        total = w_above + n_tied * w_tie
        before = (torch.cumsum(w, dim=-1) - w) / total  # mass strictly before each token
        fits = torch.ceil((top_p - w_above / total) / (w_tie / total)).nan_to_num(0.0)
        n_keep = torch.minimum(fits.clamp(min=0.0), n_keep)
        w = w.masked_fill(before >= top_p, 0.0)
    norm = w.sum(-1, keepdim=True) + n_keep * w_tie  # [..., 1]
    ids, order = idx.sort(dim=-1)  # token-id order: the dense path's draw order
    tied = tied.gather(-1, order)
    kept_tied = tied & (torch.cumsum(tied, dim=-1, dtype=torch.int32) <= n_keep)
    probs = torch.where(kept_tied, w_tie / norm, w.gather(-1, order) / norm)  # [..., K]
    return TopKProbs(ids, probs, overflow, logits.shape[-1])


def draw(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One token per row of probs [..., V] (need not be normalised): [...] int64."""
    cdf = torch.cumsum(probs.float(), dim=-1)  # [..., V]
    total = cdf[..., -1:]
    u = torch.rand(cdf.shape[:-1] + (1,), generator=generator, device=probs.device)
    # Token i is chosen when cdf[i-1] <= u·total < cdf[i]: a zero-probability token (flat cdf
    # step) has an empty interval and is never chosen. u < 1, but u·total can round up to
    # total: kept just below it, so the last token with mass is chosen, never a zero after it.
    threshold = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return (cdf <= threshold).sum(-1)


def sample(logits: Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0,
           generator: torch.Generator | None = None) -> Tensor:
    """[..., V] logits → [...] int64 tokens; argmax when temperature == 0."""
    if temperature == 0:
        check_sampling(temperature, top_p, top_k)
        return logits.argmax(-1)
    return token_probs(logits, temperature, top_p, top_k).draw(generator)


def greedy_accept(drafts: Tensor, target_logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Greedy verification.

    drafts [B, γ] int64; target_logits [B, γ+1, V] (row i verifies drafts[:, i]).
    Returns accepted [B] int64 in 0..γ, next_token [B] int64 (target argmax at row `accepted`:
    the correction, or the bonus when all γ were accepted), accept_prob [B, γ] fp32 (1/0).
    """
    target = target_logits.argmax(-1)  # [B, γ+1]
    match = (drafts == target[:, :-1]).float()  # [B, γ]
    accepted = torch.cumprod(match, dim=1).sum(1).long()  # [B]
    next_token = target.gather(1, accepted[:, None])[:, 0]
    return accepted, next_token, match


def rejection_accept(drafts: Tensor, q: TokenProbs, p: TokenProbs,
                     generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor]:
    """Lossless speculative sampling.

    drafts [B, γ] int64 drawn from q ([B, γ] rows); p: target distributions, [B, γ+1] rows.
    Draft i is accepted with probability min(1, p_i(d_i) / q_i(d_i)), sequentially; at the first
    rejection (index a) the next token is drawn from normalise(max(p_a − q_a, 0)); after γ
    accepts it is drawn from p_γ. Returns accepted [B], next_token [B], accept_prob [B, γ].
    """
    bsz, gamma = drafts.shape
    p_d = p.rows(slice(None), slice(0, gamma)).prob_of(drafts[:, :, None])[:, :, 0]  # [B, γ]
    q_d = q.prob_of(drafts[:, :, None])[:, :, 0]  # [B, γ]
    ratio = torch.where(q_d > 0, p_d / q_d.clamp_min(1e-30), torch.ones_like(p_d))
    accept_prob = ratio.clamp(max=1.0)  # [B, γ]
    u = torch.rand((bsz, gamma), generator=generator, device=drafts.device)
    ok = (u < accept_prob).float()
    accepted = torch.cumprod(ok, dim=1).sum(1).long()  # [B]
    rows = torch.arange(bsz, device=drafts.device)
    q_a = q.rows(rows, accepted.clamp(max=gamma - 1))  # row γ has no draft: has_draft False
    residual = p.rows(rows, accepted).residual(q_a, accepted < gamma)  # type: ignore[arg-type]
    return accepted, residual.draw(generator), accept_prob
