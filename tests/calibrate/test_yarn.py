"""YaRN RoPE scaling: the spec's round trip, the Hugging Face config loader, refusal of
unknown types, logits against transformers' own Qwen3 past the original window, and (GPU) a
Qwen3-4B-shaped model with YaRN factor 4 running a 40K-token prefill and decode."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.calibrate.conftest import tiny_model
from vegas_sim.calibrate import weights as W
from vegas_sim.calibrate.loading import load_model, save_hf_dir
from vegas_sim.calibrate.runtime import Transformer, rope_attention_factor, rope_inv_freq
from vegas_sim.errors import UserInputError
from vegas_sim.models import ModelSpec, RopeScaling, get_preset, llama3_scaling, yarn_scaling

QWEN3_4B_YARN = {  # Qwen3-4B's config.json with the YaRN block its model card gives
    "model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 2560, "head_dim": 128,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 9728,
    "vocab_size": 151936, "max_position_embeddings": 131072, "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
}


def test_spec_round_trip_keeps_yarn_and_reads_legacy_llama3_lists() -> None:
    yarn = yarn_scaling(4.0, 32768, beta_fast=16.0, attention_factor=1.2)
    spec = ModelSpec.from_dict({**get_preset("qwen3-4b").to_dict(), "rope_scaling": yarn.to_json()})
    assert spec.rope_scaling == yarn
    assert ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    legacy = ModelSpec.from_dict({**get_preset("llama-3.1-8b").to_dict()})
    assert legacy.to_dict()["rope_scaling"] == [8.0, 1.0, 4.0, 8192]  # schema-v1 form kept
    assert legacy.rope_scaling == llama3_scaling(8.0, 1.0, 4.0, 8192)


def test_unknown_or_bad_scaling_is_refused_not_ignored() -> None:
    with pytest.raises(UserInputError, match="unknown rope_scaling type 'dynamic'"):
        RopeScaling("dynamic", 2.0, 4096)
    with pytest.raises(UserInputError, match="factor"):
        yarn_scaling(0.5, 4096)
    for kind in ("linear", "dynamic", "longrope"):
        cfg = {**QWEN3_4B_YARN, "rope_scaling": {"rope_type": kind, "factor": 2.0}}
        with pytest.raises(UserInputError, match=f"unsupported rope_scaling type '{kind}'"):
            W.hf_spec(cfg)
    with pytest.raises(UserInputError, match="unknown keys"):
        RopeScaling.from_json({"type": "yarn", "factor": 2.0,
                               "original_max_position_embeddings": 8, "alpha": 1})


def test_hf_loader_reads_qwen3_yarn_block_both_config_layouts() -> None:
    spec = W.hf_spec(QWEN3_4B_YARN)
    assert spec.name == "qwen3-4b" and spec.max_positions == 131072
    assert spec.rope_scaling == yarn_scaling(4.0, 32768)
    assert rope_attention_factor(spec) == pytest.approx(0.1 * math.log(4.0) + 1.0)
    nested = {k: v for k, v in QWEN3_4B_YARN.items() if k not in ("rope_scaling", "rope_theta")}
    nested["rope_parameters"] = {**QWEN3_4B_YARN["rope_scaling"], "rope_theta": 1e6}  # type: ignore[dict-item]
    assert W.hf_spec(nested) == spec
    ds = {**QWEN3_4B_YARN, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "mscale": 1.0,
                                            "mscale_all_dim": 0.5,
                                            "original_max_position_embeddings": 32768}}
    got = W.hf_spec(ds).rope_scaling
    assert got is not None and got.attention_factor == pytest.approx(
        (0.1 * math.log(4) + 1) / (0.05 * math.log(4) + 1))
    assert W.hf_config(spec)["rope_scaling"]["rope_type"] == "yarn"
    assert W.hf_spec(W.hf_config(spec)).rope_scaling == spec.rope_scaling


def test_yarn_keeps_high_frequencies_and_interpolates_low_ones() -> None:
    spec = get_preset("qwen3-4b")
    plain = rope_inv_freq(spec)
    scaled = rope_inv_freq(ModelSpec.from_dict({**spec.to_dict(),
                                                "rope_scaling": yarn_scaling(4.0, 32768).to_json()}))
    assert torch.equal(scaled[:8], plain[:8])  # fast dimensions untouched
    torch.testing.assert_close(scaled[-8:], plain[-8:] / 4.0)  # slow ones slowed by factor
    assert bool((scaled <= plain).all())


def _transformers_logits(path: Path, tokens: list[int]) -> torch.Tensor:
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32,
                                                            attn_implementation="eager")
    with torch.no_grad():
        return ref(torch.tensor([tokens])).logits[0].float()  # type: ignore[no-any-return]


@pytest.mark.parametrize("kw", [{}, {"beta_fast": 8.0, "beta_slow": 2.0, "attention_factor": 1.3}],
                         ids=["defaults", "betas-attention-factor"])
def test_yarn_logits_match_transformers_past_the_original_window(kw: dict[str, Any],
                                                                 tmp_path: Path) -> None:
    """A tiny Qwen3 trained-window 32 positions, YaRN factor 4, 120 tokens: every position's
    logits (most past the window) agree with transformers loading the same checkpoint."""
    pytest.importorskip("transformers")
    model = tiny_model("qwen3", rope_scaling=yarn_scaling(4.0, 32, **kw), max_positions=128)
    save_hf_dir(model, tmp_path, dtype=torch.float32)
    back, _, _ = load_model(str(tmp_path), dtype=torch.float32)
    assert back.spec.rope_scaling == model.spec.rope_scaling
    tokens = torch.randint(0, model.spec.vocab, (120,),
                           generator=torch.Generator().manual_seed(7)).tolist()
    ref = _transformers_logits(tmp_path, tokens)
    ours = back.forward(torch.tensor([tokens]), back.new_cache(1, 128))[0]
    assert ref.std() > 0.5
    torch.testing.assert_close(ours, ref, atol=2e-4, rtol=2e-4)
    plain = tiny_model("qwen3", max_positions=128)  # same weights (same seed), no scaling
    unscaled = plain.forward(torch.tensor([tokens]), plain.new_cache(1, 128))[0]
    assert (unscaled[40:] - ref[40:]).abs().max() > 1e-2  # the test can tell scaling apart


@pytest.mark.gpu
def test_qwen3_yarn_40k_prefill_and_decode_on_gpu() -> None:
    """Qwen3-4B shape, random bf16 weights, YaRN factor 4 from its config.json: a 40K-token
    prompt (past the 32K window) prefills and decodes 16 tokens with finite logits."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    spec = W.hf_spec(QWEN3_4B_YARN)
    model = Transformer(spec, None, device="cuda", dtype=torch.bfloat16, seed=0)
    n = 40_960
    prompt = torch.randint(0, spec.vocab, (n,), generator=torch.Generator().manual_seed(0))
    cache = model.new_cache(1, n + 16)
    logits = model.prefill([prompt], cache, chunk=2048)
    for _ in range(16):
        logits = model.forward(logits.argmax(-1, keepdim=True), cache, last_only=True)[:, 0]
    assert int(cache.lens[0]) == n + 16
    assert bool(torch.isfinite(logits).all()) and float(logits.std()) > 0


# ---- calibrate --rope-scaling: positions past the trained window --------------------------
def test_extend_positions_applies_yarn_over_the_trained_window() -> None:
    model = tiny_model("llama")
    trained = model.spec.max_positions
    before = model(torch.tensor([[1, 2, 3]]), model.new_cache(1, 8))
    model.extend_positions(4.0)
    assert model.spec.max_positions == 4 * trained
    assert model.spec.rope_scaling == yarn_scaling(4.0, trained)
    after = model(torch.tensor([[1, 2, 3]]), model.new_cache(1, 8))
    assert not torch.allclose(before, after)  # the rotation changed (rebuilt, not cached)
    with pytest.raises(UserInputError, match="already scales its RoPE"):
        model.extend_positions(2.0)


def test_rope_extension_option_is_parsed_and_checked() -> None:
    from vegas_sim.calibrate.plan import parse_rope_extension

    assert parse_rope_extension("yarn:4") == 4.0
    for bad in ("yarn", "yarn:x", "yarn:1", "llama3:8"):
        with pytest.raises(UserInputError, match="--rope-scaling"):
            parse_rope_extension(bad)


def test_calibration_records_the_extension_in_the_set(tmp_path: Path) -> None:
    from tests.calibrate.test_grid import RANDOM_META, tiny_plan
    from vegas_sim.calibrate.runner import run_calibration
    from vegas_sim.traces.io import load_trace_set

    model = tiny_model("llama")
    trained = model.spec.max_positions
    plan = tiny_plan(methods=("vanilla",), batch=(1,), context=(2 * trained,),
                     rope_extension=4.0)
    lines: list[str] = []
    run_calibration(plan, tmp_path / "ts", model=(model, RANDOM_META), log_fn=lines.append)
    ts = load_trace_set(tmp_path / "ts")
    assert ts.model_spec.max_positions == 4 * trained
    assert ts.model_spec.rope_scaling == yarn_scaling(4.0, trained)
    assert set(ts.latency["context"]) == {2 * trained}  # past the trained window: measured
    assert any("YaRN" in x for x in lines)
