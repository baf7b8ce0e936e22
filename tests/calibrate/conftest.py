"""Shared fixtures for calibrate/ tests: SmolLM2 (real weights, CPU fp32, loaded once per
session) and tiny random models of each architecture."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from vegas_sim.calibrate.loading import load_model, smollm2_gguf_path
from vegas_sim.calibrate.runtime import Transformer
from vegas_sim.errors import UserInputError
from vegas_sim.models import ModelSpec


@pytest.fixture(scope="session")
def smollm2() -> tuple[Transformer, Any, dict[str, Any]]:
    """(model, tokenizer, meta) of SmolLM2-135M-Instruct, fp32 on CPU. Shared: do not mutate
    its weights; make your own caches."""
    try:
        smollm2_gguf_path()
    except UserInputError as e:
        pytest.skip(str(e))
    torch.set_num_threads(max(1, torch.get_num_threads()))
    return load_model("smollm2-135m", weights="real", device="cpu", dtype=torch.float32)


def tiny_spec(arch: str = "llama", **kw: Any) -> ModelSpec:
    """A 2-layer model of `arch` with GQA (4 query heads over 2 KV heads), head_dim 16."""
    base: dict[str, Any] = {
        "name": f"tiny-{arch}", "architecture": arch, "n_layers": 2, "hidden": 64,
        "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "ffn": 96, "vocab": 101,
        "max_positions": 256, "rope_theta": 10000.0, "rms_eps": 1e-6,
        "tie_embeddings": arch != "qwen2", "qk_norm": arch == "qwen3", "qkv_bias": arch == "qwen2",
    }
    base.update(kw)
    return ModelSpec(**base)


def tiny_model(arch: str = "llama", seed: int = 0, **kw: Any) -> Transformer:
    """Random tiny model; norms and biases perturbed so that a wrong mapping shows up."""
    model = Transformer(tiny_spec(arch, **kw), None, device="cpu", dtype=torch.float32, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm", "bqkv")):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
            else:  # larger weights than the latency init: attention patterns that are not flat
                p.mul_(10.0 if name == "embed" else 4.0)
    return model


@pytest.fixture
def tiny() -> Transformer:
    return tiny_model("llama")
