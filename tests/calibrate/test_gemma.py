"""Gemma 3 on the CPU: the runtime against an independent forward (gemma_reference.py) on a tiny
random Gemma-shaped GGUF and on the real Gemma-3-270M GGUF, every method greedy-lossless, the
window layers honoured, the tokenizer as transformers builds it, and the preset."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from vegas_sim.calibrate.loading import gemma3_gguf_path, load_model
from vegas_sim.calibrate.runtime import Transformer
from vegas_sim.calibrate.specdec import SpecConfig, SpecDecoder
from vegas_sim.calibrate.weights import load_checkpoint
from vegas_sim.errors import UserInputError
from vegas_sim.methods import SPEC_METHODS
from vegas_sim.models import PRESETS, ModelSpec
from vegas_sim.traces.validation import check_fields
from vegas_sim.traces.schema import MODEL_FIELDS

from .gemma_reference import gemma3_logits, read_gguf, write_tiny_gemma_gguf
from .test_moe import _logits_after_perturbing, assert_greedy_lossless


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gemma_gguf(tmp_path_factory.mktemp("gemma") / "tiny-gemma3.gguf")


def _tiny(path: Path) -> Transformer:
    return load_model(str(path), weights="real", device="cpu", dtype=torch.float32)[0]


def test_tiny_gemma_matches_the_reference_in_one_pass_and_decoding(tiny_gguf: Path) -> None:
    """A 40-token prompt (5 windows of 8): one forward, and a prefill of 30 then 10 decode
    steps, give the reference's logits."""
    model = _tiny(tiny_gguf)
    assert model.spec.window_layers == (0, 1, 2, 3, 4) and model.spec.sliding_window == 8
    meta, w = read_gguf(tiny_gguf)
    ids = torch.randint(0, 101, (40,), generator=torch.Generator().manual_seed(0))
    ref = gemma3_logits(meta, w, ids.tolist())  # [40, V]
    got = model.forward(ids[None], model.new_cache(1, 64))[0]
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-4)
    cache = model.new_cache(1, 64)
    model.prefill([ids[:30]], cache)
    steps = [model.forward(ids[None, j:j + 1], cache)[0, 0] for j in range(30, 40)]
    torch.testing.assert_close(torch.stack(steps), ref[30:], rtol=0, atol=1e-4)


def test_reference_sees_each_gemma_feature(tiny_gguf: Path) -> None:
    """The comparison above can fail: dropping any one Gemma feature from the runtime moves
    its logits away from the reference's."""
    meta, w = read_gguf(tiny_gguf)
    ids = torch.randint(0, 101, (40,), generator=torch.Generator().manual_seed(0))
    ref = gemma3_logits(meta, w, ids.tolist())
    base = _tiny(tiny_gguf).spec
    for change in ({"window_layers": (), "sliding_window": 0}, {"rope_theta_window": 0.0},
                   {"mlp_activation": "silu"}, {"embed_scale": False}, {"sandwich_norms": False}):
        model = _tiny(tiny_gguf)
        model.spec = ModelSpec.from_dict({**base.to_dict(), **change})
        for i, layer in enumerate(model.layers):
            layer.spec = model.spec
            layer.window = model.spec.sliding_window if i in model.spec.window_layers else 0
            if not model.spec.sandwich_norms:
                layer.post_attn_norm = layer.post_mlp_norm = None
        model.embed_scale = 8.0 if model.spec.embed_scale else 1.0  # sqrt(64)
        got = model.forward(ids[None], model.new_cache(1, 64))[0]
        assert (got - ref).abs().max() > 1e-2, change


@pytest.mark.parametrize("method", SPEC_METHODS)
def test_greedy_lossless_on_a_tiny_gemma_model(tiny_gguf: Path, method: str) -> None:
    """Every method emits vanilla's greedy tokens: sparse drafts on the global layer, the
    window layers running their window in draft and verify; drafts accepted and rejected."""
    records = assert_greedy_lossless(_tiny(tiny_gguf), method)
    assert all(r.budget < r.context for r in records)


def test_window_layers_ignore_keys_outside_their_window(tiny_gguf: Path) -> None:
    """Scrambling a window layer's cached K/V older than its window leaves the next token's
    logits bit-identical; the oldest key inside it, or the same keys in the global layer, move
    them."""
    model = _tiny(tiny_gguf)
    prompt = torch.randint(0, 101, (50,), generator=torch.Generator().manual_seed(3))
    # the decode row sits at position 50; window 8 covers keys [43, 50]
    base, after = _logits_after_perturbing(model, prompt, 0, 43, layer=2)
    torch.testing.assert_close(base, after, rtol=0, atol=0)
    base, after = _logits_after_perturbing(model, prompt, 43, 44, layer=2)
    assert (base - after).abs().max() > 1e-3
    base, after = _logits_after_perturbing(model, prompt, 0, 43, layer=5)  # the global layer
    assert (base - after).abs().max() > 1e-3


def test_preset_round_trip_and_trace_meta_fields() -> None:
    spec = PRESETS["gemma3-270m"]
    assert spec.window_layers == tuple(i for i in range(18) if i not in (5, 11, 17))
    assert ModelSpec.from_dict(spec.to_dict()) == spec
    check_fields(spec.to_dict(), MODEL_FIELDS, "meta.json", "model")
    dense = PRESETS["smollm2-135m"].to_dict()  # dense dicts keep their keys
    assert "mlp_activation" not in dense and "sandwich_norms" not in dense
    with pytest.raises(UserInputError, match="MLP activation"):
        ModelSpec.from_dict({**spec.to_dict(), "mlp_activation": "relu"})


# ---------------------------------------------------------------- the real Gemma-3-270M GGUF
@pytest.fixture(scope="module")
def gemma_path() -> Path:
    try:
        return gemma3_gguf_path()
    except UserInputError as e:
        pytest.skip(str(e))


# transformers' tokenizer for this GGUF (AutoTokenizer.from_pretrained(dir, gguf_file=...),
# transformers 5.25.0), recorded: texts with runs of spaces, tabs, digits, accents, CJK, emoji
# and control tokens written in the text
TOKENIZER_CASES = [
    ("The capital of France is", [2, 818, 5279, 529, 7001, 563]),
    ("def fibonacci(n):\n    if n < 2:\n        return n\n",
     [2, 2063, 10779, 78113, 236769, 236749, 1473, 107, 140, 584, 538, 655, 236743, 236778,
      236787, 107, 144, 2060, 538, 107]),
    ("  Hello  world!\n\n\tTabs and 12345 numbers",
     [2, 138, 9259, 138, 12392, 236888, 108, 255968, 76222, 532, 236743, 236770, 236778, 236800,
      236812, 236810, 4945]),
    ("x" * 50 + " <bos> <start_of_turn>user\nhi<end_of_turn>\n",
     [2, 130987, 130987, 130987, 130987, 130987, 130987, 12351, 236743, 2, 236743, 105, 2364,
      107, 2202, 106, 107]),
]


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> tuple[Transformer, Any, dict[str, Any]]:
    return load_model(str(gemma_path), weights="real", device="cpu", dtype=torch.float32)


@pytest.mark.slow
def test_real_gemma_shape_tokenizer_and_meta(gemma: Any) -> None:
    model, tok, meta = gemma
    assert model.spec == PRESETS["gemma3-270m"]
    assert meta["sha256"] == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    for text, ids in TOKENIZER_CASES:
        assert tok.encode(text, add_bos=True) == ids
        assert tok.decode(ids[1:]) == text
    assert not tok.chatml and tok.chat("Say hi.") == tok.encode("Say hi.", add_bos=True)
    assert tok.eos_id == 1 and 106 in tok.stop_ids  # <eos>, <end_of_turn>


@pytest.mark.slow
def test_real_gemma_matches_the_reference(gemma: Any, gemma_path: Path) -> None:
    """A short real prompt: the runtime's logits are the independent forward's, and its
    greedy continuation is the obvious one."""
    model, tok, _ = gemma
    ids = tok.encode("The capital of France is Paris. The capital of Germany is Berlin. "
                     "The capital of Italy is", add_bos=True)
    meta, w = read_gguf(gemma_path)
    ref = gemma3_logits(meta, w, ids)
    got = model.forward(torch.tensor([ids]), model.new_cache(1, 64))[0]
    assert (got - ref).abs().max() < 1e-3
    assert tok.decode([int(got[-1].argmax())]) == " Rome"


@pytest.mark.slow
def test_real_gemma_matches_transformers(gemma: Any, gemma_path: Path) -> None:
    """transformers' Gemma3ForCausalLM loaded from the same GGUF (skipped where transformers
    is not installed: it is no dependency of the package)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # transformers loads GGUF files through it
    model, tok, _ = gemma
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(gemma_path.parent), gguf_file=gemma_path.name, torch_dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(gemma_path.parent),
                                                        gguf_file=gemma_path.name)
    text = Path(__file__).read_text()[:3000]
    ids = tok.encode(text, add_bos=True)[:600]  # past the 512-key window
    assert ids == hf_tok(text).input_ids[:600]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].float()
    got = model.forward(torch.tensor([ids]), model.new_cache(1, 640))[0]
    assert (got - want).abs().max() < 2e-3
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_gemma_path_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VEGAS_SIM_GEMMA3_GGUF", str(tmp_path / "missing.gguf"))
    with pytest.raises(UserInputError, match="VEGAS_SIM_GEMMA3_GGUF"):
        gemma3_gguf_path()
    here = write_tiny_gemma_gguf(tmp_path / "g.gguf")
    monkeypatch.setenv("VEGAS_SIM_GEMMA3_GGUF", str(here))
    assert gemma3_gguf_path() == here
    assert load_checkpoint(here, load_weights=False).spec.architecture == "gemma3"


@pytest.fixture(scope="module")
def head_size_256(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tiny Gemma of Gemma-3-270M's head size (256) and GQA group (4 query heads per KV head)
    on the Triton kernels, a prompt past its 8-key window, and vanilla's greedy tokens; built
    once per worker (the CPU interpreter is slow at this head size: one prompt, not a batch)."""
    pytest.importorskip("triton")
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton on the CPU needs TRITON_INTERPRET=1 at import")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VEGAS_SIM_KERNELS", "triton")
        path = write_tiny_gemma_gguf(tmp_path_factory.mktemp("d256") / "d256.gguf", n_heads=4,
                                     n_kv_heads=1, head_dim=256, hidden=32, ffn=32, seed=1)
        model = _tiny(path)
        gen = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, 101, (n,), generator=gen) for n in (31,)]
        vanilla = SpecDecoder(model, SpecConfig("vanilla", 1)).generate(prompts, 8).tokens
        yield model, prompts, vanilla


@pytest.mark.parametrize("method", ["vegas", "magicdec-quest"])
def test_triton_kernels_at_gemmas_head_size(head_size_256: Any, method: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Gemma-3-270M's head size and GQA group through the Triton kernels (the fused q/k-norm +
    RoPE + append, the norms, sparse draft attention and selection; under the CPU interpreter
    without a GPU): greedy outputs equal vanilla's, with drafts both accepted and rejected."""
    monkeypatch.setenv("VEGAS_SIM_KERNELS", "triton")
    model, prompts, vanilla = head_size_256
    res = SpecDecoder(model, SpecConfig(method, 4, sparsity=0.05, min_tokens=6)).generate(
        prompts, 8)
    assert res.tokens == vanilla
    accepted = [r.accepted for r in res.records]
    assert any(a > 0 for a in accepted) and any(a < 4 for a in accepted), accepted


@pytest.mark.gpu
@pytest.mark.parametrize("method", SPEC_METHODS)
def test_greedy_lossless_on_gemma_cuda(gemma_path: Path, method: str) -> None:
    """The real Gemma-3-270M in fp32 on the GPU (Triton kernels, CUDA graphs): every method
    emits vanilla's greedy tokens on prompts past the 512-key window."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model, tok, _ = load_model(str(gemma_path), weights="real", device="cuda",
                               dtype=torch.float32)
    ids = tok.encode(Path(__file__).read_text(), add_bos=True)
    prompts = [torch.tensor(ids[:n]) for n in (520, 700, 900)]
    ref = SpecDecoder(model, SpecConfig("vanilla", 1)).generate(prompts, 14).tokens
    res = SpecDecoder(model, SpecConfig(method, 4, sparsity=0.02, min_tokens=16)).generate(
        prompts, 14)
    assert res.tokens == ref
    assert all(r.budget < r.context for r in res.records)


def test_shipped_gemma_workloads_are_smollm2s_texts_untemplated() -> None:
    """workloads/gemma3-270m.npz: the same dataset items as SmolLM2's (the workloads cut to a
    token length, recall, code-long and chat-long: the same prompt lengths, their windows' draws
    depend on the tokenizer; competitive: as many statements, kept by their token length), each prompt BOS first, ids inside Gemma's vocabulary, no ChatML
    anywhere (a base model: plain text)."""
    from vegas_sim.calibrate.workloads import WORKLOADS, workload_prompts

    vocab = PRESETS["gemma3-270m"].vocab
    for name in WORKLOADS:
        gemma, smol = workload_prompts(name, "gemma3-270m"), workload_prompts(name)
        if name in ("recall", "code-long", "chat-long"):
            # a window's length in tokens, hence its draw, depends on the tokenizer
            assert [len(p.tokens) for p in gemma] == [len(p.tokens) for p in smol]
        elif name == "competitive":  # statements kept by their length in tokens
            assert len(gemma) == len(smol)
        else:
            assert [p.source for p in gemma] == [p.source for p in smol]
        for p in gemma:
            assert p.tokens[0] == 2 and 0 <= min(p.tokens) and max(p.tokens) < vocab
            assert 2 not in p.tokens[1:]  # one BOS; ChatML's tokens do not exist in Gemma's vocab
