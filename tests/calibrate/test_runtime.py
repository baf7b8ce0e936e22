"""Model runtime: real-weight sanity (SmolLM2), cache correctness, batching, rollback, and an
independent cache-free reference forward for every architecture."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.calibrate.conftest import tiny_model, tiny_spec
from vegas_sim.calibrate.loading import load_model
from vegas_sim.calibrate.runtime import (
    DenseAttention,
    GraphedForward,
    KVCache,
    Layer,
    Transformer,
    equal_runs,
    masked_attention,
    rope_attention_factor,
    rope_inv_freq,
)
from vegas_sim.errors import UserInputError
from vegas_sim.models import get_preset, llama3_scaling, yarn_scaling

FP32_TOL: dict[str, Any] = {"atol": 2e-4, "rtol": 2e-4}


# ---- an independent reference: whole sequence, no cache, explicit GQA and rotate_half -----


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def reference_forward(model: Transformer, tokens: list[int]) -> torch.Tensor:
    """fp32 logits [T, V] of one sequence, computed the Hugging Face way."""
    s = model.spec
    T = len(tokens)
    q_dim, kv_dim = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
    freqs = torch.arange(T, dtype=torch.float64)[:, None] * rope_inv_freq(s).double()[None]
    emb = torch.cat([freqs, freqs], dim=-1)  # [T, D]
    scale = rope_attention_factor(s)
    cos, sin = (emb.cos() * scale).float()[:, None], (emb.sin() * scale).float()[:, None]  # [T, 1, D]
    causal = torch.ones(T, T).tril().bool()
    x = model.embed[torch.tensor(tokens)]
    for layer in model.layers:
        assert isinstance(layer, Layer)
        h = _rms(x, layer.attn_norm, s.rms_eps)
        wq, wk, wv = layer.wqkv.split([q_dim, kv_dim, kv_dim])
        q, k, v = h @ wq.T, h @ wk.T, h @ wv.T
        if layer.bqkv is not None:
            bq, bk, bv = layer.bqkv.split([q_dim, kv_dim, kv_dim])
            q, k, v = q + bq, k + bk, v + bv
        q = q.view(T, s.n_heads, s.head_dim)
        k = k.view(T, s.n_kv_heads, s.head_dim)
        v = v.view(T, s.n_kv_heads, s.head_dim)
        if layer.q_norm is not None and layer.k_norm is not None:
            q, k = _rms(q, layer.q_norm, s.rms_eps), _rms(k, layer.k_norm, s.rms_eps)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k = k.repeat_interleave(s.group_size, dim=1)  # [T, Hq, D]
        v = v.repeat_interleave(s.group_size, dim=1)
        att = torch.einsum("thd,shd->hts", q, k) / math.sqrt(s.head_dim)
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        o = torch.einsum("hts,shd->thd", att, v).reshape(T, q_dim)
        x = x + o @ layer.wo.T
        gate, up = (_rms(x, layer.mlp_norm, s.rms_eps) @ layer.w13.T).chunk(2, dim=-1)
        x = x + (torch.nn.functional.silu(gate) * up) @ layer.w2.T
    head = model.embed if model.lm_head is None else model.lm_head
    return _rms(x, model.norm, s.rms_eps) @ head.T


def incremental_logits(model: Transformer, tokens: list[int], cache: KVCache | None = None) -> torch.Tensor:
    """Decode one token at a time: logits [T, V]."""
    cache = cache or model.new_cache(1, len(tokens) + 4)
    rows = [model.forward(torch.tensor([[t]]), cache)[0, 0] for t in tokens]
    return torch.stack(rows)


ARCHS = [
    ("llama", {}),
    ("qwen2", {}),
    ("qwen3", {}),
    ("llama", {"rope_scaling": llama3_scaling(8.0, 1.0, 4.0, 32), "rope_theta": 500000.0}),
    ("qwen3", {"rope_scaling": yarn_scaling(4.0, 16), "rope_theta": 10000.0}),
]


@pytest.mark.parametrize(("arch", "kw"), ARCHS, ids=["llama", "qwen2", "qwen3", "llama31-scaling", "yarn"])
def test_matches_reference_forward_full_and_incremental(arch: str, kw: dict[str, Any]) -> None:
    model = tiny_model(arch, **kw)
    tokens = torch.randint(0, model.spec.vocab, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    ref = reference_forward(model, tokens)
    assert ref.std() > 0.5  # a live model, not a constant
    cache = model.new_cache(1, 64)
    full = model.forward(torch.tensor([tokens]), cache)[0]
    assert int(cache.lens[0]) == 40
    torch.testing.assert_close(full, ref, **FP32_TOL)
    torch.testing.assert_close(incremental_logits(model, tokens), ref, **FP32_TOL)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_fused_glue_kernels_match_reference_forward(arch: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime with its glue ops on Triton (CPU interpreter), prefill and decode."""
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("CPU interpreter test; test_fused_glue_matches_torch_glue_on_cuda runs here")
    monkeypatch.setenv("VEGAS_SIM_KERNELS", "triton")
    model = tiny_model(arch)
    tokens = torch.randint(0, model.spec.vocab, (12,), generator=torch.Generator().manual_seed(4)).tolist()
    ref = reference_forward(model, tokens)
    cache = model.new_cache(1, 16)
    full = model.forward(torch.tensor([tokens[:9]]), cache)[0]
    torch.testing.assert_close(full, ref[:9], **FP32_TOL)
    torch.testing.assert_close(incremental_logits(model, tokens[9:], cache), ref[9:], **FP32_TOL)


def test_llama31_rope_scaling_matches_meta_formula() -> None:
    """Meta's reference `apply_scaling` loop (llama3 repo) vs our vectorised version."""
    spec = get_preset("llama-3.1-8b")
    assert spec.rope_scaling is not None
    factor, low = spec.rope_scaling.factor, spec.rope_scaling.low_freq_factor
    high, orig = spec.rope_scaling.high_freq_factor, spec.rope_scaling.original_max_position_embeddings
    base = 1.0 / (spec.rope_theta ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128))
    expected = []
    for freq in base.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < orig / high:
            expected.append(freq)
        elif wavelen > orig / low:
            expected.append(freq / factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            expected.append((1 - smooth) * freq / factor + smooth * freq)
    got = rope_inv_freq(spec)
    torch.testing.assert_close(got.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-6, atol=0)
    assert not torch.allclose(got, base.float())  # scaling did something


def test_prefill_chunks_and_ragged_batch_equal_single_requests() -> None:
    """Different prompt lengths in one batch, chunked prefill, then batched decode steps: each
    request's logits equal its own single-request run."""
    model = tiny_model("qwen3")
    gen = torch.Generator().manual_seed(5)
    # Neighbours of one length (a repeated prompt, then another of the same length) prefill
    # as one batched run (equal_runs); the others alone.
    prompts = [torch.randint(0, 101, (n,), generator=gen) for n in (9, 23, 23, 23, 14)]
    prompts[2] = prompts[1]
    steps = torch.randint(0, 101, (5, 4), generator=gen)  # [B, steps]
    cache = model.new_cache(5, 48)
    batched = [model.prefill(prompts, cache, chunk=5)]  # [B, V]
    assert cache.lens.tolist() == [9, 23, 23, 23, 14]
    for j in range(steps.shape[1]):
        batched.append(model.forward(steps[:, j:j + 1], cache)[:, 0])
    for b, p in enumerate(prompts):
        seq = p.tolist() + steps[b].tolist()
        ref = reference_forward(model, seq)[len(p) - 1:]  # last prompt row + decode rows
        got = torch.stack([row[b] for row in batched])
        torch.testing.assert_close(got, ref[: got.shape[0]], **FP32_TOL)


def test_equal_runs() -> None:
    assert equal_runs([3, 3, 5, 3]) == [(0, 2), (2, 3), (3, 4)]
    assert equal_runs([7]) == [(0, 1)] and equal_runs([]) == []
    assert equal_runs([2, 2, 2]) == [(0, 3)]


def test_rollback_then_redecode_gives_identical_logits(tiny: Transformer) -> None:
    cache = tiny.new_cache(2, 64)
    prompts = [torch.arange(1, 20), torch.arange(30, 41)]
    tiny.prefill(prompts, cache)
    start = cache.lens.clone()
    draft = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    first = tiny.forward(draft, cache)
    # reject: keep 1 token of request 0 and 3 of request 1, write different tokens after them
    cache.rollback(start + torch.tensor([1, 3], dtype=torch.int32))
    tiny.forward(torch.tensor([[50], [51]]), cache)
    cache.rollback(start)
    again = tiny.forward(draft, cache)
    assert torch.equal(first, again)
    assert cache.lens.tolist() == (start + 4).tolist()


def test_rollback_rejects_growth(tiny: Transformer) -> None:
    cache = tiny.new_cache(1, 16)
    with pytest.raises(UserInputError, match="cannot grow"):
        cache.rollback(torch.tensor([3], dtype=torch.int32))


def test_cache_overflow_is_a_user_error(tiny: Transformer) -> None:
    cache = tiny.new_cache(1, 8)
    with pytest.raises(UserInputError, match="KV cache full"):
        tiny.forward(torch.zeros(1, 9, dtype=torch.long), cache)


def test_masked_attention_matches_naive_loop() -> None:
    gen = torch.Generator().manual_seed(1)
    B, NQ, Hq, Hkv, D, S = 2, 5, 4, 2, 8, 20
    q = torch.randn(B, NQ, Hq, D, generator=gen)
    k = torch.randn(B, S, Hkv, D, generator=gen)
    v = torch.randn(B, S, Hkv, D, generator=gen)
    lens = torch.tensor([12, 17], dtype=torch.int32)
    out = masked_attention(q, k, v, lens, 0.3)
    for b in range(B):
        for i in range(NQ):
            n = int(lens[b]) - NQ + i + 1  # keys visible to row i
            for h in range(Hq):
                kv = h // (Hq // Hkv)
                w = torch.softmax(0.3 * k[b, :n, kv] @ q[b, i, h], dim=0)
                torch.testing.assert_close(out[b, i, h], w @ v[b, :n, kv], atol=1e-5, rtol=1e-5)


def test_dense_attention_kernel_path_agrees_with_sdpa_path() -> None:
    """The ops path (verify kernel / its reference) and the SDPA path compute the same."""
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(3, 7, 4, 16, generator=gen)
    k = torch.randn(3, 40, 2, 16, generator=gen)
    v = torch.randn(3, 40, 2, 16, generator=gen)
    lens = torch.tensor([7, 25, 40], dtype=torch.int32)
    torch.testing.assert_close(
        DenseAttention(use_kernel=True).attend(0, q, k, v, lens, 0.25),
        DenseAttention(use_kernel=False).attend(0, q, k, v, lens, 0.25),
        atol=1e-5, rtol=1e-5,
    )


def test_random_init_stays_finite_in_bf16_over_many_layers() -> None:
    spec = tiny_spec("qwen3", n_layers=36, hidden=256, n_heads=8, n_kv_heads=2, head_dim=32, ffn=512)
    model = Transformer(spec, None, dtype=torch.bfloat16, seed=0)
    cache = model.new_cache(2, 64)
    logits = model.prefill([torch.arange(50), torch.arange(30)], cache)
    assert torch.isfinite(logits).all() and logits.std() > 0
    again = Transformer(spec, None, dtype=torch.bfloat16, seed=0)
    assert torch.equal(again.get_parameter("layers.3.wqkv"), model.get_parameter("layers.3.wqkv"))  # seeded


def test_load_model_presets_and_errors(tmp_path: Path) -> None:
    model, tok, meta = load_model("qwen3-4b", weights="random", device="meta")
    assert model.spec == get_preset("qwen3-4b") and tok is None
    assert meta["kind"] == "random"
    with pytest.raises(UserInputError, match="no real weights"):
        load_model("qwen3-8b", weights="real")
    with pytest.raises(UserInputError, match="no preset and no file named"):
        load_model(str(tmp_path / "nothing.gguf"))
    with pytest.raises(UserInputError, match="--weights"):
        load_model("qwen3-8b", weights="fake")


# ---- SmolLM2 (real weights) ---------------------------------------------------------------


def test_smollm2_spec_matches_preset(smollm2: Any) -> None:
    model, tok, meta = smollm2
    assert model.spec == get_preset("smollm2-135m")
    assert meta["kind"] == "real"
    assert meta["sha256"] == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert tok is not None and tok.vocab_size == model.spec.vocab


def _greedy(model: Transformer, prompt: list[int], n: int) -> list[int]:
    cache = model.new_cache(1, len(prompt) + n + 1)
    logits = model.prefill([torch.tensor(prompt)], cache)
    out = []
    for _ in range(n):
        t = logits.argmax(-1)  # [1]
        out.append(int(t))
        logits = model.forward(t[:, None], cache)[:, 0]
    return out


def test_smollm2_greedy_knows_paris(smollm2: Any) -> None:
    model, tok, _ = smollm2
    text = tok.decode(_greedy(model, tok.encode("The capital of France is"), 3))
    assert "Paris" in text
    chat = tok.decode(_greedy(model, tok.chat("What is the capital of France?"), 8))
    assert "Paris" in chat


def test_smollm2_full_prompt_equals_incremental(smollm2: Any) -> None:
    model, tok, _ = smollm2
    tokens = tok.encode("Speculative decoding drafts tokens cheaply.")
    cache = model.new_cache(1, len(tokens) + 1)
    full = model.forward(torch.tensor([tokens]), cache)[0]
    torch.testing.assert_close(incremental_logits(model, tokens), full, atol=1e-3, rtol=1e-3)
    assert full[-1].argmax() != full[-2].argmax() or full.std() > 1  # not degenerate


@pytest.mark.slow
def test_smollm2_matches_transformers_reference(smollm2: Any) -> None:
    """transformers (if installed) loading the same GGUF file: logits agree."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers needs it to load GGUF files
    from vegas_sim.calibrate.loading import smollm2_gguf_path

    model, tok, _ = smollm2
    path = smollm2_gguf_path()
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32)
    tokens = tok.chat("Name three prime numbers.")
    with torch.no_grad():
        ref = ref_model(torch.tensor([tokens])).logits[0].float()
    ours = model.forward(torch.tensor([tokens]), model.new_cache(1, len(tokens)))[0]
    torch.testing.assert_close(ours, ref, atol=2e-3, rtol=2e-3)
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


@pytest.mark.gpu
def test_fused_glue_matches_torch_glue_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 Qwen3-shaped model: the Triton glue (default on CUDA) against the torch glue
    (VEGAS_SIM_KERNELS=reference): logits within bf16 noise, the same greedy tokens."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = Transformer(tiny_spec("qwen3", n_layers=4), None, device="cuda", dtype=torch.bfloat16,
                        seed=0)
    tokens = torch.randint(0, model.spec.vocab, (3, 20), generator=torch.Generator().manual_seed(1))

    def logits() -> torch.Tensor:
        cache = model.new_cache(3, 32)
        return model.forward(tokens.cuda(), cache)

    fused = logits()
    monkeypatch.setenv("VEGAS_SIM_KERNELS", "reference")
    torch_glue = logits()
    torch.testing.assert_close(fused, torch_glue, atol=5e-2, rtol=5e-2)
    assert (fused.argmax(-1) == torch_glue.argmax(-1)).float().mean() > 0.95


# ---- CUDA graphs (GPU only) --------------------------------------------------------------


@pytest.mark.gpu
def test_graphed_forward_matches_eager_on_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = Transformer(tiny_spec("qwen3", n_layers=4), None, device="cuda", dtype=torch.bfloat16, seed=0)
    prompts = [torch.arange(1, 30), torch.arange(5, 50)]
    eager_cache, graph_cache = model.new_cache(2, 128), model.new_cache(2, 128)
    model.prefill(prompts, eager_cache)
    model.prefill(prompts, graph_cache)
    graphed = GraphedForward(model, graph_cache, None, batch=2, n_query=3)
    assert graph_cache.lens.tolist() == eager_cache.lens.tolist()
    for step in range(4):
        toks = torch.tensor([[step, 7, 9], [3, step, 1]], device="cuda")
        want = model.forward(toks, eager_cache)
        got = graphed(toks)
        torch.testing.assert_close(got, want, atol=0, rtol=0)
        assert graph_cache.lens.tolist() == eager_cache.lens.tolist()
    graph_cache.rollback(graph_cache.lens - 2)
    eager_cache.rollback(eager_cache.lens - 2)
    toks = torch.tensor([[1, 2, 3], [4, 5, 6]], device="cuda")
    torch.testing.assert_close(graphed(toks), model.forward(toks, eager_cache), atol=0, rtol=0)


def test_weights_that_cannot_fit_are_refused_before_allocating(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU the alternative is the OOM killer: exit 137 and no message."""
    from vegas_sim.calibrate import hardware

    monkeypatch.setattr(hardware, "free_memory", lambda device: 100 << 20)  # 100 MB free
    with pytest.raises(UserInputError, match=r"smollm2-135m's weights need 0\.\d GB") as err:
        load_model("smollm2-135m", weights="random", device="cpu")
    assert err.value.where == "--model"
