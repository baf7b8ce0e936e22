"""Mixture-of-experts FFN and sliding-window layers on the CPU: the grouped MoE FFN equals a
per-token dense loop, every method is greedy-lossless on a tiny hybrid MoE model, window
layers never read outside their window, and the accounting of the new presets."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import torch

from vegas_sim.calibrate import moe
from vegas_sim.calibrate.runtime import DenseAttention, Transformer
from vegas_sim.calibrate.specdec import SpecConfig, SpecDecoder
from vegas_sim.errors import UserInputError
from vegas_sim.methods import SPEC_METHODS, window_kv_read
from vegas_sim.models import PRESETS, ModelSpec

from .conftest import tiny_model, tiny_spec

HYBRID = {"architecture": "gpt_oss", "n_layers": 3, "n_experts": 6, "experts_per_token": 2,
          "expert_ffn": 32, "sliding_window": 8, "window_layers": (0, 2),
          "attention_sinks": True, "o_bias": True, "moe_bias": True,
          "moe_activation": "gpt_oss", "qkv_bias": True}


def _hybrid_model(seed: int = 0, **kw: Any) -> Transformer:
    """Tiny gpt-oss-like model: layers 0 and 2 sliding-window (W = 8), layer 1 full; 6 experts,
    top-2; sinks and biases perturbed so that a dropped term shows."""
    model = tiny_model("gpt_oss", seed=seed, **{**HYBRID, **kw})
    gen = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("bo", "brouter", "b13", "b2", "sinks")):
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
        s = model.spec  # sharp, strong full attention: sparse drafts then get rejected
        qk_rows = (s.n_heads + s.n_kv_heads) * s.head_dim
        full = model.layers[1]
        full.wqkv[:qk_rows].mul_(3.0)
        full.wo.mul_(10.0)
    return model


@pytest.mark.parametrize("activation,bias", [("silu", False), ("gpt_oss", True)])
@pytest.mark.parametrize("kernels", ["reference", "triton"])
def test_moe_ffn_equals_the_dense_reference(activation: str, bias: bool, kernels: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    if kernels == "triton":  # the Triton kernels, under the CPU interpreter without a GPU
        pytest.importorskip("triton")
        if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("Triton on the CPU needs TRITON_INTERPRET=1 at import")
    monkeypatch.setenv("VEGAS_SIM_KERNELS", kernels)
    gen = torch.Generator().manual_seed(0)
    e, h, f, k, t = 8, 16, 24, 3, 37

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen)

    args = (rnd(e, h), rnd(e) if bias else None, rnd(e, 2 * f, h) * 0.3,
            rnd(e, 2 * f) if bias else None, rnd(e, h, f) * 0.3, rnd(e, h) if bias else None)
    x = rnd(2, t, h)
    got = moe.moe_ffn(x, *args, k=k, activation=activation)
    want = moe.moe_ffn_reference(x, *args, k=k, activation=activation)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the eager per-expert loop (odd widths: no grouped GEMM) agrees too
    odd = (args[0][:, :15], args[1], args[2][:, :, :15], args[3], args[4][:, :15], None)
    torch.testing.assert_close(moe.moe_ffn(x[..., :15], *odd, k=k, activation=activation),
                               moe.moe_ffn_reference(x[..., :15], *odd, k=k,
                                                     activation=activation),
                               rtol=1e-5, atol=1e-5)


def test_moe_layer_routes_every_token_to_k_experts_and_balances_random_load() -> None:
    model = Transformer(tiny_spec("qwen3_moe", n_experts=16, experts_per_token=4,
                                  expert_ffn=32), None, seed=0)
    layer = model.layers[0]
    x = torch.randn(4096, 64, generator=torch.Generator().manual_seed(1))
    _, experts = moe.route(x, layer.router, None, 4)
    assert experts.shape == (4096, 4)
    assert (experts.sort(dim=1).values.diff(dim=1) > 0).all()  # k distinct experts per token
    load = torch.bincount(experts.reshape(-1), minlength=16).float()
    assert load.max() / load.mean() < 1.25  # near-uniform router: a balanced expert load


@pytest.mark.parametrize("method", SPEC_METHODS)
def test_greedy_lossless_on_a_tiny_hybrid_moe_model(method: str) -> None:
    """Every method emits vanilla's greedy tokens with sparse full-attention drafts, window
    layers running their window in draft and verify; drafts are both accepted and rejected."""
    records = assert_greedy_lossless(_hybrid_model(seed=2), method)
    assert all(r.budget < r.context for r in records)


def assert_greedy_lossless(model: Transformer, method: str) -> list[Any]:
    """`method` (γ 4, s 0.05) emits vanilla's greedy tokens on three prompts, with drafts both
    accepted and rejected; returns its iteration records."""
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 101, (n,), generator=gen) for n in (40, 63, 52)]
    ref = SpecDecoder(model, SpecConfig("vanilla", 1)).generate(prompts, 16).tokens
    res = SpecDecoder(model, SpecConfig(method, 4, sparsity=0.05, min_tokens=6)).generate(
        prompts, 16)
    assert res.tokens == ref
    accepted = [r.accepted for r in res.records]
    assert any(a > 0 for a in accepted) and any(a < 4 for a in accepted), accepted
    return list(res.records)


def _logits_after_perturbing(model: Transformer, prompt: torch.Tensor, lo: int, hi: int,
                             layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Last-row logits of one decode step, before and after scrambling layer `layer`'s cached
    K/V at positions [lo, hi)."""
    cache = model.new_cache(1, 128)
    model.prefill([prompt], cache)
    saved = cache.lens.clone()
    tok = torch.tensor([[5]])
    base = model.forward(tok, cache, DenseAttention())[:, -1]
    cache.rollback(saved)
    cache.k[layer, 0, lo:hi] = torch.randn_like(cache.k[layer, 0, lo:hi]) * 50
    cache.v[layer, 0, lo:hi] = torch.randn_like(cache.v[layer, 0, lo:hi]) * 50
    return base, model.forward(tok, cache, DenseAttention())[:, -1]


def test_window_layers_never_read_outside_their_window() -> None:
    model = _hybrid_model(seed=4)
    prompt = torch.randint(0, 101, (50,), generator=torch.Generator().manual_seed(3))
    # the decode row sits at position 50; window 8 covers keys [43, 50]
    base, after = _logits_after_perturbing(model, prompt, 0, 43, layer=2)
    torch.testing.assert_close(base, after, rtol=0, atol=0)
    base, after = _logits_after_perturbing(model, prompt, 43, 44, layer=2)
    assert (base - after).abs().max() > 1e-3  # the oldest key inside the window is read
    base, after = _logits_after_perturbing(model, prompt, 0, 43, layer=1)  # a full layer
    assert (base - after).abs().max() > 1e-3


@pytest.mark.parametrize("use_kernel", [None, True])  # torch gather; ops (its reference here)
def test_window_attention_rows_and_sinks_match_a_dense_mask(use_kernel: bool | None) -> None:
    gen = torch.Generator().manual_seed(5)
    b, nq, hq, hkv, d, s_max, w = 2, 3, 4, 2, 8, 40, 6
    q = torch.randn(b, nq, hq, d, generator=gen)
    k = torch.randn(b, s_max, hkv, d, generator=gen)
    v = torch.randn(b, s_max, hkv, d, generator=gen)
    lens = torch.tensor([4, 30], dtype=torch.int32)  # request 0: shorter than the window
    sinks = torch.randn(hq, generator=gen)
    got = moe.window_attention(q, k, v, lens, 0.3, w, sinks, use_kernel=use_kernel)
    for bi in range(b):
        for i in range(nq):
            p = int(lens[bi]) - nq + i
            keys = torch.arange(max(0, p - w + 1), p + 1)
            for h in range(hq):
                kv = h // (hq // hkv)
                sc = (k[bi, keys, kv] @ q[bi, i, h]) * 0.3
                pr = torch.softmax(torch.cat([sc, sinks[h:h + 1]]), 0)[:-1]
                torch.testing.assert_close(got[bi, i, h], pr @ v[bi, keys, kv])


def test_presets_and_accounting() -> None:
    q3, oss = PRESETS["qwen3-30b-a3b"], PRESETS["gpt-oss-20b"]
    assert q3.param_count() == pytest.approx(30.5e9, rel=0.01)
    assert q3.matmul_params() == pytest.approx(3.04e9, rel=0.01)  # ~3B active
    assert oss.param_count() == pytest.approx(20.9e9, rel=0.01)
    assert oss.matmul_params() == pytest.approx(3.6e9, rel=0.01)
    assert oss.n_full_layers == oss.n_window_layers == 12
    assert [oss.layer_kind(i) for i in range(4)] == ["window", "full", "window", "full"]
    # one token reads k experts per layer; a large batch reads them all
    one = q3.n_layers * (q3.attention_params() + q3.router_params()) + q3.vocab * q3.hidden
    assert q3.weight_bytes(1) == pytest.approx(
        2 * (one + q3.n_layers * 8 * q3.expert_params()))
    assert q3.weight_bytes(10 ** 6) == pytest.approx(2 * (one + q3.n_layers * 128
                                                          * q3.expert_params()))
    e, k = 128, 8
    assert q3.experts_touched(16) == pytest.approx(e * (1 - (1 - k / e) ** 16))
    assert q3.gemm_flops(16) == 16 * q3.gemm_flops(1)  # FLOPs: only the k experts per token
    # formats: mxfp4 shrinks only gpt-oss's experts, fp8 every projection
    expert_bytes = oss.expert_bytes()
    assert oss.weight_bytes(1) - oss.weight_bytes(1, "mxfp4") == pytest.approx(
        4 * expert_bytes * (1 - 4.25 / 16))
    dense = PRESETS["qwen3-8b"]
    assert dense.weight_bytes(64) == dense.weight_bytes(1) == dense.matmul_params() * 2
    assert dense.weight_bytes(1, "fp8") < dense.weight_bytes(1)
    assert ModelSpec.from_dict(oss.to_dict()) == oss
    assert "n_experts" not in dense.to_dict()  # dense meta.json files unchanged
    np.testing.assert_array_equal(window_kv_read(128, np.array([10, 5000]), 8), [18, 135])
    with pytest.raises(UserInputError, match="window layers"):
        ModelSpec.from_dict({**oss.to_dict(), "window_layers": [30]})


@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss"])
def test_hf_checkpoint_round_trip_of_moe_models(arch: str, tmp_path: Any) -> None:
    """The project's save path writes Hugging Face names; the loader reads them back into the
    same spec and the same logits (gpt-oss: interleaved gate/up, sinks, biases, layer_types)."""
    from vegas_sim.calibrate import weights as W
    from vegas_sim.calibrate.loading import load_model, save_hf_dir

    if arch == "gpt_oss":
        model = _hybrid_model(seed=5, ffn=32)
        want = {"model.layers.0.self_attn.sinks", "model.layers.1.mlp.experts.gate_up_proj",
                "model.layers.2.mlp.router.bias", "model.layers.0.self_attn.o_proj.bias"}
    else:
        model = tiny_model(arch, seed=5, n_experts=6, experts_per_token=2, expert_ffn=32,
                           qk_norm=True)
        want = {"model.layers.1.mlp.gate.weight", "model.layers.0.mlp.experts.5.down_proj.weight"}
    save_hf_dir(model, tmp_path, dtype=torch.float32)
    assert want <= set(W.read_safetensors(tmp_path / "model.safetensors"))
    back, _, _ = load_model(str(tmp_path), dtype=torch.float32)
    assert back.spec.to_dict() | {"name": ""} == model.spec.to_dict() | {"name": ""}
    tokens = torch.arange(3, 40)[None]
    cache_a, cache_b = model.new_cache(1, 64), back.new_cache(1, 64)
    assert torch.equal(model.forward(tokens, cache_a), back.forward(tokens, cache_b))


def test_hf_spec_of_the_public_configs_and_quantised_checkpoints() -> None:
    from vegas_sim.calibrate.weights import hf_spec

    oss = PRESETS["gpt-oss-20b"]
    cfg = {"model_type": "gpt_oss", "num_hidden_layers": 24, "hidden_size": 2880,
           "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
           "intermediate_size": 2880, "vocab_size": 201088, "max_position_embeddings": 131072,
           "rope_theta": 150000, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
           "attention_bias": True, "num_local_experts": 32, "num_experts_per_tok": 4,
           "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 12}
    assert hf_spec(cfg) == oss
    # the official checkpoint's MXFP4 experts are dequantised on load; other methods refused
    assert hf_spec({**cfg, "quantization_config": {"quant_method": "mxfp4"}}) == oss
    with pytest.raises(UserInputError, match="quantised \\(fp8\\)"):
        hf_spec({**cfg, "quantization_config": {"quant_method": "fp8"}})
    q3 = {"model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048,
          "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
          "intermediate_size": 6144, "moe_intermediate_size": 768, "vocab_size": 151936,
          "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
          "tie_word_embeddings": False, "num_experts": 128, "num_experts_per_tok": 8,
          "norm_topk_prob": True}
    assert hf_spec(q3) == PRESETS["qwen3-30b-a3b"]
    with pytest.raises(UserInputError, match="quantised \\(mxfp4\\)"):
        hf_spec({**q3, "quantization_config": {"quant_method": "mxfp4"}})


def random_mxfp4(gen: torch.Generator, *rows: int, cols: int) -> tuple[torch.Tensor, ...]:
    """(blocks, scales, dense): random e2m1 codes and e8m0 scales of a [*rows, cols] weight,
    and its value computed code by code from the OCP MX definition (sign, exponent, mantissa)."""
    codes = torch.randint(0, 16, (*rows, cols // 32, 32), generator=gen)
    scales = torch.randint(120, 134, (*rows, cols // 32), generator=gen, dtype=torch.uint8)
    sign = 1.0 - 2.0 * (codes >> 3)
    exp, man = (codes >> 1) & 3, (codes & 1).double()
    magnitude = torch.where(exp == 0, 0.5 * man, 2.0 ** (exp.double() - 1) * (1 + 0.5 * man))
    dense = sign * magnitude * 2.0 ** (scales.double()[..., None] - 127)
    blocks = (codes[..., 0::2] | codes[..., 1::2] << 4).to(torch.uint8)
    return blocks, scales, dense.reshape(*rows, cols)


def test_mxfp4_blocks_dequantise_to_their_values() -> None:
    from vegas_sim.calibrate.weights_moe import dequantize_mxfp4

    blocks, scales, dense = random_mxfp4(torch.Generator().manual_seed(0), 3, 5, cols=96)
    assert torch.equal(dequantize_mxfp4(blocks, scales, torch.float64), dense)
    assert torch.equal(dequantize_mxfp4(blocks, scales).double(), dense)  # bf16 holds them


def test_mxfp4_gpt_oss_checkpoint_loads_as_its_dense_twin(tmp_path: Any) -> None:
    """The official gpt-oss layout (experts as _blocks/_scales, quant_method mxfp4) loads to
    the same model as a bf16 checkpoint holding the dequantised values."""
    import json

    from vegas_sim.calibrate import weights as W
    from vegas_sim.calibrate.loading import load_model, save_hf_dir

    model = _hybrid_model(seed=3, ffn=32)
    dense_dir, mx_dir = tmp_path / "dense", tmp_path / "mxfp4"
    save_hf_dir(model, dense_dir, dtype=torch.float32)
    save_hf_dir(model, mx_dir, dtype=torch.float32)
    dense = W.read_safetensors(dense_dir / "model.safetensors")
    mx = dict(dense)
    gen = torch.Generator().manual_seed(4)
    s = model.spec
    for i in range(s.n_layers):
        for name, (n_out, n_in) in {"gate_up_proj": (2 * s.expert_ffn, s.hidden),
                                    "down_proj": (s.hidden, s.expert_ffn)}.items():
            key = f"model.layers.{i}.mlp.experts.{name}"
            blocks, scales, values = random_mxfp4(gen, s.n_experts, n_out, cols=n_in)
            del mx[key]
            # weights of a realistic size: 2^-4 folded into the e8m0 exponents of both
            mx[key + "_blocks"], mx[key + "_scales"] = blocks, scales - 4
            dense[key] = (values * 2.0 ** -4).float().transpose(1, 2).contiguous()  # [E, in, out]
    W.write_safetensors(dense_dir / "model.safetensors", dense)
    W.write_safetensors(mx_dir / "model.safetensors", mx)
    cfg = json.loads((mx_dir / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4"}
    (mx_dir / "config.json").write_text(json.dumps(cfg))
    a, _, _ = load_model(str(dense_dir), dtype=torch.float32)
    b, _, _ = load_model(str(mx_dir), dtype=torch.float32)
    tokens = torch.arange(3, 30)[None]
    assert torch.equal(a.forward(tokens, a.new_cache(1, 64)), b.forward(tokens, b.new_cache(1, 64)))


def test_mxfp4_dequantisation_matches_transformers() -> None:
    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    from vegas_sim.calibrate.weights_moe import _expert_weight

    blocks, scales, _ = random_mxfp4(torch.Generator().manual_seed(1), 4, 64, cols=96)
    hf = {"w_blocks": blocks, "w_scales": scales}
    want = mxfp4.convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16)
    assert torch.equal(_expert_weight(hf, "w", "test"), want)
