"""Sampling and lossless acceptance (vegas_sim.calibrate.sampling)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from vegas_sim.calibrate.sampling import (
    DenseProbs,
    TopKProbs,
    draw,
    greedy_accept,
    probs_by_full_sort,
    probs_from_logits,
    rejection_accept,
    sample,
    stack_rows,
    token_probs,
)
from vegas_sim.errors import UserInputError

P_MIN = 1e-3  # seeded draws: a correct sampler passes deterministically; a wrong one fails hard


def _chi2_p(tokens: torch.Tensor, expected: np.ndarray) -> float:
    """Chi-square p-value of token counts against probabilities `expected` [V]."""
    n = tokens.numel()
    counts = np.bincount(tokens.numpy(), minlength=expected.size).astype(float)
    expected = np.asarray(expected, dtype=np.float64)
    exp = expected / expected.sum() * n
    keep = exp >= 5  # merge thin cells so the chi-square approximation holds
    obs = np.append(counts[keep], counts[~keep].sum())
    ex = np.append(exp[keep], exp[~keep].sum())
    if ex[-1] == 0:
        assert obs[-1] == 0, "tokens drawn where the target has no mass"
        obs, ex = obs[:-1], ex[:-1]
    return float(stats.chisquare(obs, ex * obs.sum() / ex.sum()).pvalue)


def test_greedy_probs_are_one_hot_argmax() -> None:
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])
    p = probs_from_logits(logits, 0.0)
    assert torch.equal(p, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))
    assert torch.equal(sample(logits, 0.0), torch.tensor([1, 0]))


def test_top_k_and_top_p_filter() -> None:
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    assert torch.allclose(probs_from_logits(logits, 1.0), torch.tensor([0.4, 0.3, 0.2, 0.1]))
    k2 = probs_from_logits(logits, 1.0, top_k=2)
    assert torch.allclose(k2, torch.tensor([4 / 7, 3 / 7, 0.0, 0.0]))
    # top_p = 0.65: 0.4 alone < 0.65, 0.4 + 0.3 reaches it -> keep the first two
    p65 = probs_from_logits(logits, 1.0, top_p=0.65)
    assert torch.allclose(p65, torch.tensor([4 / 7, 3 / 7, 0.0, 0.0]))
    p70 = probs_from_logits(logits, 1.0, top_p=0.7 + 1e-6)
    assert (p70 > 0).sum() == 3
    hot = probs_from_logits(logits, 0.5)  # temperature sharpens: p ∝ p0^2
    assert torch.allclose(hot, torch.tensor([16, 9, 4, 1]) / 30.0, atol=1e-6)


@pytest.mark.parametrize("top_p", [0.5, 0.95, 1.0])
@pytest.mark.parametrize("top_k", [1, 5, 20])
def test_top_k_path_equals_full_sort_without_ties(top_k: int, top_p: float) -> None:
    gen = torch.Generator().manual_seed(top_k)
    logits = 3 * torch.randn(3, 4, 1000, generator=gen)  # [B, rows, V], ties improbable
    fast = probs_from_logits(logits, 0.6, top_p, top_k)
    assert torch.allclose(fast, probs_by_full_sort(logits, 0.6, top_p, top_k), atol=1e-6)
    assert ((fast > 0).sum(-1) <= top_k).all()


def _mass_per_logit_value(logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """The probability each row puts on each distinct logit value (tied tokens pooled)."""
    vocab = logits.shape[-1]
    rows = torch.arange(logits.numel() // vocab, device=logits.device).repeat_interleave(vocab)
    pairs = torch.stack([rows.double(), logits.flatten().double()], dim=1)  # [N·V, 2]
    _, inverse = torch.unique(pairs, dim=0, return_inverse=True)
    mass = torch.zeros(int(inverse.max()) + 1, dtype=torch.float64, device=logits.device)
    return mass.index_add_(0, inverse, probs.flatten().double())


@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.99, 1.0])
def test_top_k_keeps_the_whole_tie_group_at_the_kth_logit(top_p: float) -> None:
    """Logits on a coarse grid tie often at the k-th value (bf16 logits do too). The result
    must be the full sort's up to which tied tokens carry the mass, and the kept tokens of the
    k-th value's tie group must be its lowest token ids."""
    gen = torch.Generator().manual_seed(7)
    logits = torch.round(4 * torch.randn(64, 300, generator=gen)) / 4  # steps of 0.25
    top_k = 12
    slots = token_probs(logits, 1.0, top_p, top_k)
    assert isinstance(slots, TopKProbs) and not slots.overflow.any()  # groups fit the slack
    fast = probs_from_logits(logits, 1.0, top_p, top_k)
    ref = probs_by_full_sort(logits, 1.0, top_p, top_k)
    kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
    assert ((logits >= kth).sum(-1) > top_k).any(), "no tie group crosses the k-th: weak test"
    assert torch.allclose(fast.sort(-1).values, ref.sort(-1).values, atol=1e-6)
    assert torch.allclose(_mass_per_logit_value(logits, fast),
                          _mass_per_logit_value(logits, ref), atol=1e-6)
    assert torch.allclose(fast.sum(-1), torch.ones(64))
    tied = logits == kth
    kept = tied & (fast > 0)
    assert torch.equal(kept, tied & (torch.cumsum(tied, dim=-1) <= kept.sum(-1, keepdim=True)))


def test_top_k_path_with_masked_vocabulary() -> None:
    """Fewer finite logits than k (a masked vocabulary): the -inf tokens get no mass."""
    logits = torch.full((2, 50), float("-inf"))
    logits[:, :3] = torch.tensor([1.0, 0.5, 0.0])
    for top_p in (0.7, 1.0):
        fast = probs_from_logits(logits, 1.0, top_p, 20)
        assert torch.isfinite(fast).all() and (fast[:, 3:] == 0).all()
        assert torch.allclose(fast.sum(-1), torch.ones(2))


@pytest.mark.gpu
def test_top_k_path_equals_full_sort_on_the_gpu_at_qwen3_vocabulary() -> None:
    gen = torch.Generator(device="cuda").manual_seed(3)
    logits = (4 * torch.randn(8, 13, 151936, generator=gen, device="cuda")).bfloat16()
    fast = probs_from_logits(logits, 0.6, 0.95, 20)
    ref = probs_by_full_sort(logits, 0.6, 0.95, 20)
    assert torch.allclose(fast.sort(-1).values, ref.sort(-1).values, atol=1e-6)
    assert torch.allclose(_mass_per_logit_value(logits, fast),
                          _mass_per_logit_value(logits, ref), atol=1e-6)


@pytest.mark.parametrize("kw", [{"temperature": -1.0}, {"top_p": 0.0}, {"top_k": -1}])
def test_bad_sampling_args_raise(kw: dict[str, float]) -> None:
    args = {"temperature": 1.0, "top_p": 1.0, "top_k": 0} | kw
    with pytest.raises(UserInputError):
        probs_from_logits(torch.zeros(4), args["temperature"], args["top_p"], int(args["top_k"]))


def test_draw_matches_distribution_and_skips_zero_mass() -> None:
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.0, 0.2, 0.3, 0.0])
    tokens = draw(p.expand(20000, -1), gen)
    assert not torch.isin(tokens, torch.tensor([1, 4])).any()
    assert _chi2_p(tokens, p.numpy()) > P_MIN


def test_greedy_accept_counts_leading_matches() -> None:
    target = torch.tensor([[3, 1, 2, 5], [0, 0, 0, 7], [4, 4, 4, 4]])  # argmax per row
    logits = torch.nn.functional.one_hot(target, 8).float()
    drafts = torch.tensor([[3, 9, 2], [0, 0, 0], [1, 4, 4]])
    a, nxt, prob = greedy_accept(drafts, logits)
    assert a.tolist() == [1, 3, 0]
    assert nxt.tolist() == [1, 7, 4]  # correction, bonus, correction
    assert prob.tolist() == [[1, 0, 1], [1, 1, 1], [0, 1, 1]]


def _random_dists(gen: torch.Generator, rows: int, vocab: int) -> torch.Tensor:
    return torch.softmax(2.0 * torch.randn(rows, vocab, generator=gen), dim=-1)


@pytest.mark.parametrize("gamma", [1, 3])
def test_rejection_sampler_first_token_follows_target(gamma: int) -> None:
    """Draw drafts from q, accept/resample: the first emitted token must follow p_0."""
    vocab, n = 6, 20000
    gen = torch.Generator().manual_seed(1 + gamma)
    q1 = _random_dists(gen, gamma, vocab)  # [γ, V] one q per position, shared by all rows
    p1 = _random_dists(gen, gamma + 1, vocab)  # [γ+1, V]
    q = q1.expand(n, -1, -1).contiguous()
    p = p1.expand(n, -1, -1).contiguous()
    drafts = draw(q, gen)  # [n, γ]
    a, nxt, prob = rejection_accept(drafts, DenseProbs(q), DenseProbs(p), gen)
    first = torch.where(a > 0, drafts[:, 0], nxt)
    assert _chi2_p(first, p1[0].numpy()) > P_MIN
    expected = torch.clamp(p1[:gamma].gather(1, drafts.T).T / q1.gather(1, drafts.T).T, max=1)
    assert torch.allclose(prob, expected)
    assert 0 < a.float().mean() < gamma  # both outcomes exercised
    # A rejection at position 0 must follow normalise(max(p0 - q0, 0)).
    resid = (p1[0] - q1[0]).clamp_min(0)
    assert _chi2_p(nxt[a == 0], (resid / resid.sum()).numpy()) > P_MIN


def test_rejection_sampler_second_token_given_acceptance() -> None:
    """Conditioned on the first draft being accepted, the second token follows p_1."""
    vocab, n, gamma = 5, 40000, 2
    gen = torch.Generator().manual_seed(7)
    q1, p1 = _random_dists(gen, gamma, vocab), _random_dists(gen, gamma + 1, vocab)
    q, p = q1.expand(n, -1, -1).contiguous(), p1.expand(n, -1, -1).contiguous()
    drafts = draw(q, gen)
    a, nxt, _ = rejection_accept(drafts, DenseProbs(q), DenseProbs(p), gen)
    sel = a >= 1
    second = torch.where(a[sel] > 1, drafts[sel, 1], nxt[sel])
    assert _chi2_p(second, p1[1].numpy()) > P_MIN


def test_identical_draft_and_target_accept_everything() -> None:
    gen = torch.Generator().manual_seed(3)
    q = _random_dists(gen, 3, 7)[None].expand(500, -1, -1).contiguous()
    p = torch.cat([q, q[:, :1]], dim=1)
    a, _, prob = rejection_accept(draw(q, gen), DenseProbs(q), DenseProbs(p), gen)
    assert (a == 3).all() and torch.allclose(prob, torch.ones_like(prob))


# ------------------------------------------------------------- the top-k slots (runtime rev 4)
def test_slots_hold_the_survivors_in_token_id_order() -> None:
    gen = torch.Generator().manual_seed(11)
    logits = 3 * torch.randn(4, 5, 1000, generator=gen)
    slots = token_probs(logits, 0.6, 0.95, 20)
    assert isinstance(slots, TopKProbs) and slots.ids.shape == (4, 5, 40)  # 20 + 20 slack
    assert (slots.ids.diff(dim=-1) > 0).all()
    assert torch.equal(slots.dense() > 0, probs_by_full_sort(logits, 0.6, 0.95, 20) > 0)
    assert isinstance(token_probs(logits, 0.6, 0.95, 0), DenseProbs)  # no top-k: dense
    assert isinstance(token_probs(logits, 0.6, 0.95, 1000), DenseProbs)


def test_slot_draws_are_the_dense_draws() -> None:
    """Same uniforms, same tokens: the slots are in the dense layout's order."""
    logits = 2 * torch.randn(4000, 500, generator=torch.Generator().manual_seed(5))
    slots = token_probs(logits, 0.6, 0.95, 20)
    dense = probs_from_logits(logits, 0.6, 0.95, 20)
    tokens = slots.draw(torch.Generator().manual_seed(9))
    assert torch.equal(tokens, draw(dense, torch.Generator().manual_seed(9)))
    assert torch.equal(tokens, sample(logits, 0.6, 0.95, 20, torch.Generator().manual_seed(9)))
    assert (slots.prob_of(tokens[:, None])[:, 0] > 0).all()


@pytest.mark.parametrize("gamma", [1, 4])
def test_rejection_on_slots_decides_as_the_dense_rule(gamma: int) -> None:
    """Accept counts, next tokens and accept probabilities equal the dense path's for the same
    seed: drafts from a draft model's logits, targets from nearby logits (both outcomes)."""
    gen = torch.Generator().manual_seed(gamma)
    target = 2 * torch.randn(600, gamma + 1, 400, generator=gen)
    draft = target[:, :gamma] + 0.7 * torch.randn(600, gamma, 400, generator=gen)
    q, p = token_probs(draft, 0.6, 0.95, 20), token_probs(target, 0.6, 0.95, 20)
    q_dense, p_dense = DenseProbs(q.dense()), DenseProbs(p.dense())  # type: ignore[union-attr]
    drafts = q.draw(torch.Generator().manual_seed(1))
    assert torch.equal(drafts, q_dense.draw(torch.Generator().manual_seed(1)))
    on_slots = rejection_accept(drafts, q, p, torch.Generator().manual_seed(2))
    on_dense = rejection_accept(drafts, q_dense, p_dense, torch.Generator().manual_seed(2))
    assert torch.equal(on_slots[0], on_dense[0]) and torch.equal(on_slots[1], on_dense[1])
    assert torch.allclose(on_slots[2], on_dense[2], atol=1e-6)
    assert 0 < on_slots[0].float().mean() < gamma  # rejections and full acceptances
    assert (on_slots[0] == gamma).any()


def test_residual_draws_follow_max_p_minus_q_on_slots() -> None:
    vocab, n = 60, 30000
    gen = torch.Generator().manual_seed(4)
    p = token_probs(torch.randn(1, vocab, generator=gen), 1.0, 1.0, 8)
    q = token_probs(torch.randn(1, vocab, generator=gen), 1.0, 1.0, 8)
    assert isinstance(p, TopKProbs) and isinstance(q, TopKProbs)
    resid = (p.dense() - q.dense()).clamp_min(0)[0]
    rows = torch.zeros(n, dtype=torch.long)
    tokens = p.rows(rows).residual(q.rows(rows), torch.ones(n, dtype=torch.bool)).draw(gen)
    assert _chi2_p(tokens, (resid / resid.sum()).numpy()) > P_MIN
    bonus = p.rows(rows).residual(q.rows(rows), torch.zeros(n, dtype=torch.bool)).draw(gen)
    assert _chi2_p(bonus, p.dense()[0].numpy()) > P_MIN  # no draft at that row: p itself


def test_a_tie_group_longer_than_the_slots_is_flagged_and_stays_a_distribution() -> None:
    logits = torch.zeros(2, 300)
    logits[0, :3] = torch.tensor([3.0, 2.0, 1.0])  # row 0: 297 tokens tie at the 5th logit
    logits[1] = torch.randn(300, generator=torch.Generator().manual_seed(0))
    slots = token_probs(logits, 1.0, 1.0, 5)
    assert isinstance(slots, TopKProbs)
    assert slots.overflow.tolist() == [True, False]
    assert torch.allclose(slots.probs.sum(-1), torch.ones(2))
    assert (slots.probs[0] > 0).sum() == slots.ids.shape[-1]  # every slot holds a survivor


def test_stacked_draft_rows_keep_each_step() -> None:
    logits = torch.randn(3, 2, 100, generator=torch.Generator().manual_seed(2))
    steps = [token_probs(logits[:, j], 0.8, 0.9, 10) for j in range(2)]
    stacked = stack_rows(steps)
    assert torch.equal(stacked.dense(), token_probs(logits, 0.8, 0.9, 10).dense())
    dense = stack_rows([token_probs(logits[:, j], 0.8, 0.9, 0) for j in range(2)])
    assert isinstance(dense, DenseProbs) and dense.probs.shape == (3, 2, 100)


def test_draw_never_picks_a_zero_mass_token_when_u_rounds_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """u just below 1 times the total can round to the total: the last token with mass is
    drawn, not the zero-mass token after it."""
    rand = torch.rand
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.full_like(rand(*a, **k),
                                                                       1 - 2 ** -24))
    probs = torch.tensor([[0.3, 0.7 + 1e-7, 0.0]])
    assert draw(probs, None).tolist() == [1]
