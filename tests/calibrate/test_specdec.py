"""The spec-decode loop: losslessness on SmolLM2, sampled outputs follow the target, records,
acceptance replay, the phase-level API and the timers."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats

import vegas_sim
from vegas_sim.calibrate.replay import AcceptanceReplay
from vegas_sim.calibrate.runtime import Transformer
from vegas_sim.calibrate.sampling import probs_from_logits
from vegas_sim.calibrate.specdec import GenerationResult, SpecConfig, SpecDecoder
from vegas_sim.calibrate.timers import PhaseTimer
from vegas_sim.errors import UserInputError
from vegas_sim.methods import SPEC_METHODS

from .conftest import tiny_model, tiny_spec

MAX_NEW = 14


# ---------------------------------------------------------------- losslessness on SmolLM2
@pytest.fixture(scope="module")
def smol_prompts(smollm2: Any) -> list[torch.Tensor]:
    """Three prompts of different lengths (~150-260 tokens) of real text (this repo's code)."""
    _model, tok, _meta = smollm2
    text = (Path(vegas_sim.__file__).parent / "methods.py").read_text()
    ids = tok.encode(text)
    return [torch.tensor(ids[a:a + n]) for a, n in ((0, 150), (300, 210), (700, 260))]


@pytest.fixture(scope="module")
def vanilla_tokens(smollm2: Any, smol_prompts: list[torch.Tensor]) -> list[list[int]]:
    model = smollm2[0]
    return SpecDecoder(model, SpecConfig("vanilla", 1)).generate(smol_prompts, MAX_NEW).tokens


def _check_records(res: GenerationResult, gamma: int, prompts: list[torch.Tensor],
                   greedy: bool) -> None:
    """accepted in [0, γ], accept_prob in [0, 1] (1/0 greedy, consistent with accepted),
    contexts advance by 1 + accepted from the prompt length, emitted adds up."""
    for b, prompt in enumerate(prompts):
        recs = sorted((r for r in res.records if r.request == b), key=lambda r: r.iteration)
        assert [r.iteration for r in recs] == list(range(len(recs)))
        ctx = prompt.numel()
        for r in recs:
            assert r.context == ctx
            assert 0 <= r.accepted <= gamma
            assert len(r.accept_prob) == gamma
            assert all(0.0 <= x <= 1.0 for x in r.accept_prob)
            if greedy:
                assert set(r.accept_prob) <= {0.0, 1.0}
                assert r.accept_prob[:r.accepted] == [1.0] * r.accepted
                if r.accepted < gamma:
                    assert r.accept_prob[r.accepted] == 0.0
            assert 1 <= r.emitted <= r.accepted + 1
            assert 0 < r.budget <= r.context
            ctx += r.accepted + 1
        assert 1 + sum(r.emitted for r in recs) == len(res.tokens[b])
        assert all(r.emitted == r.accepted + 1 for r in recs[:-1])


# Every method, γ ∈ {1, 4, 7} spread over them (the full product costs ~2 min on 2 cores).
LOSSLESS_CASES = [
    ("magicdec-stream", 1), ("magicdec-stream", 7), ("magicdec-quest", 4),
    ("specextend", 1), ("specextend", 7), ("vegas", 4), ("vegas", 7), ("vegas-all", 4),
]


@pytest.mark.slow
@pytest.mark.parametrize("method,gamma", LOSSLESS_CASES)
def test_greedy_lossless_on_smollm2(smollm2: Any, smol_prompts: list[torch.Tensor],
                                    vanilla_tokens: list[list[int]], method: str,
                                    gamma: int) -> None:
    """Every method emits exactly vanilla's greedy tokens, with sparse drafts that get both
    accepted and rejected (budget 16 of 150-275 keys)."""
    model = smollm2[0]
    cfg = SpecConfig(method, gamma, sparsity=0.02, min_tokens=16)
    res = SpecDecoder(model, cfg).generate(smol_prompts, MAX_NEW)
    assert res.tokens == vanilla_tokens
    assert all(len(t) == MAX_NEW for t in res.tokens)
    accepted = [r.accepted for r in res.records]
    assert any(a > 0 for a in accepted), "no draft was ever accepted"
    assert any(a < gamma for a in accepted), "no draft was ever rejected"
    assert all(r.budget < r.context for r in res.records)  # drafts really were sparse
    _check_records(res, gamma, smol_prompts, greedy=True)


@pytest.fixture(scope="module")
def smollm2_cuda(smollm2: Any) -> Transformer:
    """SmolLM2's real weights in fp32 on the GPU: our Triton kernels (verify with score
    collection, sparse drafts, selection, the fused glue) under CUDA graphs, at a precision
    where vanilla and verification agree except at exact ties, as on the CPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from vegas_sim.calibrate.loading import load_model

    return load_model("smollm2-135m", weights="real", device="cuda", dtype=torch.float32)[0]


@pytest.fixture(scope="module")
def vanilla_cuda_tokens(smollm2_cuda: Transformer, smol_prompts: list[torch.Tensor]
                        ) -> list[list[int]]:
    return SpecDecoder(smollm2_cuda, SpecConfig("vanilla", 1)).generate(smol_prompts,
                                                                         MAX_NEW).tokens


@pytest.mark.gpu
@pytest.mark.parametrize("method,gamma", LOSSLESS_CASES)
def test_greedy_lossless_on_smollm2_cuda(smollm2_cuda: Transformer,
                                         smol_prompts: list[torch.Tensor],
                                         vanilla_cuda_tokens: list[list[int]], method: str,
                                         gamma: int) -> None:
    """test_greedy_lossless_on_smollm2 on the GPU path: every method emits vanilla's greedy
    tokens, both decoded with the Triton kernels."""
    cfg = SpecConfig(method, gamma, sparsity=0.02, min_tokens=16)
    res = SpecDecoder(smollm2_cuda, cfg).generate(smol_prompts, MAX_NEW)
    assert res.tokens == vanilla_cuda_tokens
    accepted = [r.accepted for r in res.records]
    assert any(a > 0 for a in accepted) and any(a < gamma for a in accepted)
    _check_records(res, gamma, smol_prompts, greedy=True)


# ------------------------------------------------------ sampled outputs follow the target
def _exact_next(model: Transformer, seqs: list[list[int]], cfg: SpecConfig) -> torch.Tensor:
    """Target probabilities [N, V] of the token after each full sequence (dense prefill)."""
    cache = model.new_cache(len(seqs), max(len(s) for s in seqs) + 1)
    logits = model.prefill([torch.tensor(s) for s in seqs], cache)
    return probs_from_logits(logits, cfg.temperature, cfg.top_p, cfg.top_k).double()


def _chi2(tokens: np.ndarray, probs: np.ndarray) -> float:
    counts = np.bincount(tokens, minlength=probs.size).astype(float)
    exp = probs / probs.sum() * tokens.size
    keep = exp >= 5
    obs, ex = np.append(counts[keep], counts[~keep].sum()), np.append(exp[keep], exp[~keep].sum())
    if ex[-1] < 1e-9:
        assert obs[-1] == 0, "tokens emitted where the target has no mass"
        obs, ex = obs[:-1], ex[:-1]
    return float(stats.chisquare(obs, ex * obs.sum() / ex.sum()).pvalue)


def _context_heavy_tiny_model() -> Transformer:
    """V = 8 and sharp, strong attention (q/k ×3, output ×10), so that sparse drafts differ
    clearly from the target (mean min(1, p/q) ≈ 0.5-0.8) and a wrong sampler would show."""
    model = tiny_model("llama", seed=3, vocab=8)
    s = model.spec
    qk_rows = (s.n_heads + s.n_kv_heads) * s.head_dim
    with torch.no_grad():
        for layer in model.layers:
            layer.wqkv[:qk_rows].mul_(3.0)
            layer.wo.mul_(10.0)
    return model


@pytest.mark.parametrize("method,gamma,sampling", [
    ("vegas", 2, (1.0, 1.0, 0)),
    ("magicdec-quest", 2, (0.8, 0.9, 5)),
    ("specextend", 3, (1.0, 1.0, 0)),
])
def test_sampled_tokens_follow_target(method: str, gamma: int,
                                      sampling: tuple[float, float, int]) -> None:
    """Tiny random model, V = 8: the 2nd and 3rd emitted tokens (the first two of the
    speculative loop) over 2000 seeded requests match the exact target marginals."""
    temp, top_p, top_k = sampling
    model = _context_heavy_tiny_model()
    cfg = SpecConfig(method, gamma, sparsity=0.05, min_tokens=4, temperature=temp,
                     top_p=top_p, top_k=top_k)
    gen = torch.Generator().manual_seed(11)
    prompt = torch.randint(0, 8, (60,), generator=gen)
    n = 2000
    res = SpecDecoder(model, cfg).generate([prompt] * n, 3, generator=gen)
    out = np.array(res.tokens)  # [n, 3]
    base = prompt.tolist()
    p_t0 = _exact_next(model, [base], cfg)[0].numpy()  # [V]
    p_x1 = _exact_next(model, [base + [t] for t in range(8)], cfg).numpy()  # [V(t0), V]
    pairs = [base + [t, x] for t in range(8) for x in range(8)]
    p_x2 = _exact_next(model, pairs, cfg).numpy().reshape(8, 8, 8)  # [t0, x1, V]
    m1 = p_t0 @ p_x1  # marginal of the 2nd token
    m2 = np.einsum("t,tx,txv->v", p_t0, p_x1, p_x2)  # marginal of the 3rd token
    assert _chi2(out[:, 0], p_t0) > 1e-3
    assert _chi2(out[:, 1], m1) > 1e-3
    assert _chi2(out[:, 2], m2) > 1e-3
    # The test has power only if drafts differ from the target: many must be rejected.
    first = [r for r in res.records if r.iteration == 0]
    assert np.mean([r.accept_prob[0] for r in first]) < 0.8
    assert 0 < np.mean([r.accepted for r in first]) < gamma
    _check_records(res, gamma, [prompt] * n, greedy=False)


# ------------------------------------------------------------------------- records, replay
def test_records_and_batching_on_tiny_model() -> None:
    model = tiny_model("qwen3", seed=1)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 101, (n,), generator=gen) for n in (30, 55, 41)]
    ref = SpecDecoder(model, SpecConfig("vanilla", 1)).generate(prompts, 20).tokens
    for method in SPEC_METHODS:
        res = SpecDecoder(model, SpecConfig(method, 5, sparsity=0.1, min_tokens=8)).generate(
            prompts, 20)
        assert res.tokens == ref, method
        _check_records(res, 5, prompts, greedy=True)


def test_fp8_scores_keep_greedy_decoding_lossless() -> None:
    """The collecting methods decode with the fp8 score format (reference kernels on the CPU):
    greedy tokens stay the target's, and the verify policy holds fp8 scores."""
    model = tiny_model("qwen3", seed=1)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 101, (n,), generator=gen) for n in (30, 55)]
    ref = SpecDecoder(model, SpecConfig("vanilla", 1)).generate(prompts, 16).tokens
    for method in ("vegas", "vegas-all", "specextend"):
        cfg = SpecConfig(method, 4, sparsity=0.1, min_tokens=8, score_format="fp8")
        dec = SpecDecoder(model, cfg)
        state = dec.prefill_state(prompts, 16)
        assert state.verify_policy.score_format == "fp8"
        assert dec.generate(prompts, 16).tokens == ref, method


@pytest.mark.parametrize("method", SPEC_METHODS)
def test_per_request_sparsity_equals_one_run_per_sparsity(method: str) -> None:
    """A batch whose requests draft at their own sparsities (acceptance calibration) records
    what one run per sparsity records; the sparsities give different budgets."""
    model = tiny_model("llama", seed=3)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 101, (n,), generator=gen) for n in (70, 90)]
    sparsities = (0.05, 0.3)
    mixed = SpecDecoder(model, SpecConfig(method, 4, min_tokens=4)).generate(
        [p for p in prompts for _ in sparsities], 24,
        sparsity=[s for _ in prompts for s in sparsities])
    budgets = {}
    for j, s in enumerate(sparsities):
        alone = SpecDecoder(model, SpecConfig(method, 4, sparsity=s, min_tokens=4)).generate(
            prompts, 24)
        for b in range(len(prompts)):
            req = b * len(sparsities) + j
            assert mixed.tokens[req] == alone.tokens[b]
            got = [(r.context, r.budget, r.accepted) for r in mixed.records if r.request == req]
            want = [(r.context, r.budget, r.accepted) for r in alone.records if r.request == b]
            assert got == want, (method, s, b)
            budgets[s] = [x[1] for x in got]
    assert sum(budgets[0.3]) > sum(budgets[0.05])
    with pytest.raises(UserInputError, match="one sparsity per prompt"):
        SpecDecoder(model, SpecConfig(method, 4)).prefill_state(prompts, 4, sparsity=[0.1])
    with pytest.raises(UserInputError):
        SpecDecoder(model, SpecConfig(method, 4)).prefill_state(prompts, 4, sparsity=[0.1, 1.5])


def test_replay_takes_accepted_counts_from_the_trace() -> None:
    model = tiny_model("llama", seed=2)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 101, (n,), generator=gen) for n in (20, 33)]
    replay = AcceptanceReplay([[0, 2, 4, 1], [3, 3, 0]])
    dec = SpecDecoder(model, SpecConfig("vegas", 3, sparsity=0.1, min_tokens=4))
    res = dec.generate(prompts, 25, generator=gen, replay=replay)
    for b in range(2):
        recs = [r for r in res.records if r.request == b]
        want = [replay.accepted(b, i, 3) for i in range(len(recs))]
        assert [r.accepted for r in recs] == want
        assert [r.accept_prob for r in recs[:2]] == [
            [float(i < want[0]) for i in range(3)], [float(i < want[1]) for i in range(3)]]
    _check_records(res, 3, prompts, greedy=True)
    assert min(replay.accepted(0, 2, 3), 3) == 3  # recorded 4 capped at γ


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_replay_pays_for_the_real_acceptance_decision(monkeypatch: pytest.MonkeyPatch,
                                                      temperature: float) -> None:
    """A replayed iteration computes the real acceptance decision (greedy match, or target
    probabilities of all γ+1 rows and the rejection test) before overriding its outcome, so
    that the replay regime's sample phase costs what a real run's does."""
    from vegas_sim.calibrate import specdec

    calls: list[tuple[int, ...]] = []
    real_rule = specdec.rejection_accept if temperature else specdec.greedy_accept
    name = "rejection_accept" if temperature else "greedy_accept"

    def counting(drafts: torch.Tensor, *args: Any) -> Any:
        calls.append(tuple(drafts.shape))
        return real_rule(drafts, *args)

    monkeypatch.setattr(specdec, name, counting)
    model = tiny_model("llama", seed=2)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 101, (n,), generator=gen) for n in (20, 33)]
    replay = AcceptanceReplay([[0, 2, 4, 1], [3, 3, 0]])
    dec = SpecDecoder(model, SpecConfig("vegas", 3, sparsity=0.1, min_tokens=4,
                                        temperature=temperature))
    res = dec.generate(prompts, 12, generator=gen, replay=replay)
    iterations = max(r.iteration for r in res.records) + 1
    assert len(calls) == iterations and all(shape == (2, 3) for shape in calls)
    recs = [r for r in res.records if r.request == 0]
    assert [r.accepted for r in recs] == [replay.accepted(0, i, 3) for i in range(len(recs))]


def test_replay_from_frame_and_errors() -> None:
    import pandas as pd

    df = pd.DataFrame({"method": ["vegas"] * 4 + ["x"], "workload": ["w"] * 5,
                       "request": [1, 0, 0, 1, 0], "iteration": [0, 1, 0, 1, 0],
                       "accepted": [5, 2, 1, 6, 9]})
    r = AcceptanceReplay.from_frame(df, method="vegas")
    assert r.sequences == [[1, 2], [5, 6]]
    with pytest.raises(UserInputError):
        AcceptanceReplay([])
    with pytest.raises(UserInputError):
        AcceptanceReplay.from_frame(df, method="nope")


# ------------------------------------------------------------------------ phase-level API
@pytest.mark.parametrize("method", ["vanilla", *SPEC_METHODS])
def test_synthetic_state_phases_keep_context_fixed(method: str) -> None:
    model = tiny_model("llama", seed=4)
    timer = PhaseTimer("cpu")
    dec = SpecDecoder(model, SpecConfig(method, 3, sparsity=0.1, min_tokens=8), timer)
    state = dec.init_state(2, 100, 120, seed=0)
    assert timer.summary() == {}  # setup is not timed
    for _ in range(2):
        dec.step(state)
        assert state.cache.lens.tolist() == [100, 100]
        assert state.ctx_host.tolist() == [100, 100]
    got = {k: len(v) for k, v in timer.summary().items()}
    if method == "vanilla":
        assert got == {"decode": 2, "sample": 2}
        return
    assert got["draft_step"] == 6 and got["verify"] == 2 and got["sample"] == 2
    assert ("select" in got) == (method in ("vegas", "vegas-all", "specextend"))
    assert ("quest_meta" in got) == (method == "magicdec-quest")
    assert state.records == []


def test_config_validation() -> None:
    for kw in ({"method": "nope", "gamma": 2}, {"method": "vegas", "gamma": 0},
               {"method": "vegas", "gamma": 16}, {"method": "vegas", "gamma": 2, "sparsity": 0.0},
               {"method": "vegas", "gamma": 2, "temperature": -1.0}):
        with pytest.raises(UserInputError):
            SpecConfig(**kw)  # type: ignore[arg-type]
    model = tiny_model("llama")
    with pytest.raises(UserInputError):
        SpecDecoder(model, SpecConfig("vegas", 2)).generate([torch.tensor([1])], 4)


# ------------------------------------------------------------------------------- timers
def test_timer_nested_phases_are_excluded_and_merged() -> None:
    timer = PhaseTimer("cpu")
    with timer.phase("draft_step"):
        time.sleep(0.02)
        for _ in range(3):
            with timer.phase("quest_meta"):
                time.sleep(0.01)
    with timer.phase("verify"):
        time.sleep(0.005)
    samples = timer.samples()
    assert [name for name, _ in samples] == ["draft_step", "quest_meta", "verify"]
    ms = dict(samples)
    # 20 ms own; with the 30 ms nested it would be >= 50 (loose bounds: a busy CI machine)
    assert 18 <= ms["draft_step"] < 48
    assert ms["quest_meta"] >= 28  # three nested intervals summed into one sample
    timer.reset()
    assert timer.summary() == {}
    with pytest.raises(UserInputError), timer.phase("bogus"):
        pass


# ------------------------------------------------------------------ CUDA graphs (GPU only)
@pytest.mark.gpu
@pytest.mark.parametrize("method", ["vanilla", *SPEC_METHODS])
def test_graphed_decoding_matches_eager_on_cuda(method: str) -> None:
    """Replaying the draft / verify / decode steps as CUDA graphs changes nothing: the same
    greedy tokens and the same per-iteration acceptance as eager steps (same kernels, same
    shapes), while contexts grow, budgets change and requests finish at different times."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    spec = tiny_spec("qwen3", n_layers=3, max_positions=1024)
    model = Transformer(spec, None, device="cuda", dtype=torch.bfloat16, seed=0)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 101, (n,), generator=gen) for n in (300, 420, 530)]
    cfg = SpecConfig(method, 5, sparsity=0.05, min_tokens=16)
    eager = SpecDecoder(model, cfg, graphs=False).generate(prompts, 40)
    graphed_decoder = SpecDecoder(model, cfg, graphs=True)
    graphed = graphed_decoder.generate(prompts, 40)
    assert graphed.tokens == eager.tokens
    assert [r.accepted for r in graphed.records] == [r.accepted for r in eager.records]
    assert [r.budget for r in graphed.records] == [r.budget for r in eager.records]


def test_index_buffer_growth_marks_captured_graphs_stale() -> None:
    """A draft policy whose index buffer is reallocated bumps its generation (SpecDecoder
    then recaptures the draft graph instead of replaying one that reads the freed buffer)."""
    from vegas_sim.calibrate.policies import SparseDraftAttention

    policy = SparseDraftAttention(2, 1, 8, torch.device("cpu"), shared=False)
    small = torch.zeros(2, 1, 8, dtype=torch.int32)
    policy.set(small, torch.tensor([8]), torch.tensor([9]))
    assert policy.generation == 0
    policy.set(torch.zeros(2, 1, 12, dtype=torch.int32), torch.tensor([12]), torch.tensor([13]))
    assert policy.generation == 1 and policy.indices.shape[-1] == 12


def test_quest_select_never_takes_more_pages_than_max_pages() -> None:
    from vegas_sim.kernels import reference

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 16, generator=gen)
    kmin = torch.randn(1, 8, 2, 16, generator=gen)
    kmax = kmin + 1
    idx, n_idx = reference.quest_select(q, kmin, kmax, torch.tensor([128]), torch.tensor([6]),
                                        max_pages=2)
    assert idx.shape[1] == 16 * 3 and int(n_idx[0]) == 32  # 2 pages, no partial page at 128


@pytest.mark.gpu
def test_graphed_drafts_survive_a_larger_selection_on_cuda() -> None:
    """The latency grid re-selects one state at several sparsities: a budget beyond the index
    buffer reallocates it, and the next graphed draft must read the new buffer (recapture),
    giving the eager drafts."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    spec = tiny_spec("qwen3", n_layers=3, max_positions=4096)
    model = Transformer(spec, None, device="cuda", dtype=torch.bfloat16, seed=0)
    drafts = {}
    for graphs in (False, True):
        small = SpecDecoder(model, SpecConfig("vegas", 3, sparsity=0.02, min_tokens=16),
                            graphs=graphs)
        state = small.init_state(2, 3000, 3100, seed=0)
        small.draft(state)
        state.cache.rollback(state.context)
        large = SpecDecoder(model, SpecConfig("vegas", 3, sparsity=0.3, min_tokens=16),
                            graphs=graphs)
        large.select(state)
        large.draft(state)
        drafts[graphs] = state.drafts.clone()
    assert torch.equal(drafts[True], drafts[False])


def test_graphs_are_a_cuda_option() -> None:
    """On the CPU graphs are off by default, refused when asked for, and prepare_graphs is a
    no-op (so validate and the grid call it unconditionally)."""
    model = tiny_model("llama", seed=0)
    cfg = SpecConfig("vegas", 2, sparsity=0.1, min_tokens=4)
    dec = SpecDecoder(model, cfg)
    assert dec.graphs is False
    state = dec.init_state(1, 40, 60, seed=0)
    dec.prepare_graphs(state)
    assert state.graphs == {}
    with pytest.raises(UserInputError, match="CUDA graphs"):
        SpecDecoder(model, cfg, graphs=True)
