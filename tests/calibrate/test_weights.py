"""Weight loading: HF checkpoint round trips, GGUF written by the gguf package (with llama.cpp's
q/k permutation), safetensors I/O, config parsing, and the GGUF tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.calibrate.conftest import tiny_model
from vegas_sim.calibrate import weights as W
from vegas_sim.calibrate.loading import load_model, save_hf_dir
from vegas_sim.calibrate.runtime import Transformer
from vegas_sim.errors import UserInputError
from vegas_sim.models import llama3_scaling, yarn_scaling


def _logits(model: Transformer, tokens: list[int]) -> torch.Tensor:
    return model.forward(torch.tensor([tokens]), model.new_cache(1, len(tokens)))[0]


# ---- Hugging Face dirs --------------------------------------------------------------------


def test_smollm2_hf_round_trip_gives_equal_logits(smollm2: Any, tmp_path: Path) -> None:
    model, tok, _ = smollm2
    save_hf_dir(model, tmp_path / "ckpt", dtype=torch.float32)
    cfg = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["tie_word_embeddings"] is True
    back, back_tok, meta = load_model(str(tmp_path / "ckpt"), dtype=torch.float32)
    assert back.spec == model.spec  # same shape, named after the matching preset
    assert back_tok is None and meta["kind"] == "real" and len(meta["sha256"]) == 64
    tokens = tok.encode("Round trips keep every weight.")
    assert torch.equal(_logits(back, tokens), _logits(model, tokens))


@pytest.mark.parametrize("arch,kw", [("qwen2", {}), ("qwen3", {"tie_embeddings": False}),
                                     ("llama", {"rope_scaling": llama3_scaling(8.0, 1.0, 4.0, 64)}),
                                     ("qwen3", {"rope_scaling": yarn_scaling(4.0, 64, beta_fast=16.0),
                                               "tie_embeddings": False})])
def test_tiny_hf_round_trip_all_architectures(arch: str, kw: dict[str, Any], tmp_path: Path) -> None:
    model = tiny_model(arch, **kw)
    save_hf_dir(model, tmp_path, dtype=torch.float32)
    names = set(W.read_safetensors(tmp_path / "model.safetensors"))
    if arch == "qwen2":
        assert "model.layers.1.self_attn.k_proj.bias" in names
    if arch == "qwen3":
        assert {"model.layers.0.self_attn.q_norm.weight", "lm_head.weight"} <= names
    back, _, _ = load_model(str(tmp_path), dtype=torch.float32)
    assert back.spec.to_dict() | {"name": ""} == model.spec.to_dict() | {"name": ""}
    tokens = list(range(3, 40))
    assert torch.equal(_logits(back, tokens), _logits(model, tokens))


def test_hf_dir_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="no config.json"):
        W.load_hf_dir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(UserInputError, match="lacks 'num_attention_heads'") as e:
        W.load_hf_dir(tmp_path)
    assert "config.json" in str(e.value)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(UserInputError, match="unsupported model_type"):
        W.load_hf_dir(tmp_path)


def test_hf_spec_reads_llama31_rope_scaling_and_qwen3_preset() -> None:
    llama = {
        "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
        "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    }
    spec = W.hf_spec(llama)
    assert spec.name == "llama-3.1-8b" and spec.rope_scaling == llama3_scaling(8.0, 1.0, 4.0, 8192)
    qwen3 = {
        "model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 4096, "head_dim": 128,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 12288,
        "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "_name_or_path": "Qwen/Qwen3-8B",
    }
    spec = W.hf_spec(qwen3)
    assert spec.name == "qwen3-8b" and spec.qk_norm and spec.max_positions == 40960


# ---- safetensors -------------------------------------------------------------------------


def test_safetensors_fallback_reader_and_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_safetensors(name: str, *a: Any, **k: Any) -> Any:
        if name.startswith("safetensors"):
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_safetensors)
    tensors = {
        "a": torch.randn(3, 5).to(torch.bfloat16), "b": torch.arange(7, dtype=torch.int64),
        "c": torch.randn(2, 2, 2), "empty": torch.zeros(0, 4),
    }
    W.write_safetensors(tmp_path / "x.safetensors", tensors)
    raw = (tmp_path / "x.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    assert header["a"] == {"dtype": "BF16", "shape": [3, 5], "data_offsets": [0, 30]}
    assert (8 + n) % 8 == 0
    back = W.read_safetensors(tmp_path / "x.safetensors")
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v)


def test_safetensors_matches_the_official_package(tmp_path: Path) -> None:
    st = pytest.importorskip("safetensors.torch")
    tensors = {"w": torch.randn(4, 3).to(torch.bfloat16), "i": torch.arange(5, dtype=torch.int32)}
    st.save_file(tensors, str(tmp_path / "o.safetensors"))
    back = W._read_safetensors_fallback(tmp_path / "o.safetensors")
    assert all(torch.equal(back[k], v) for k, v in tensors.items())


def test_corrupt_safetensors_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "bad.safetensors").write_bytes((100).to_bytes(8, "little") + b"{not json")
    with pytest.raises(UserInputError, match="corrupt safetensors header"):
        W._read_safetensors_fallback(tmp_path / "bad.safetensors")


# ---- GGUF --------------------------------------------------------------------------------


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, verbatim."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def test_unpermute_inverts_llama_cpp_permute() -> None:
    w = np.random.default_rng(0).standard_normal((6 * 8, 5)).astype(np.float32)
    back = W.unpermute_rope_rows(torch.from_numpy(llama_cpp_permute(w, 6)), 6)
    assert torch.equal(back, torch.from_numpy(w))
    bias = np.arange(6 * 8, dtype=np.float32)
    assert torch.equal(W.unpermute_rope_rows(torch.from_numpy(llama_cpp_permute(bias, 6)), 6),
                       torch.from_numpy(bias))


def write_gguf(model: Transformer, path: Path) -> None:
    """Write `model` as llama.cpp's converter would (F32, q/k permuted for llama)."""
    import gguf

    s = model.spec
    ours = {n: p.detach().numpy() for n, p in model.named_parameters()}
    hf = {k: v.numpy() for k, v in W.ours_to_hf(s, {n: torch.from_numpy(a) for n, a in ours.items()}).items()}
    w = gguf.GGUFWriter(str(path), s.architecture)
    w.add_block_count(s.n_layers)
    w.add_context_length(s.max_positions)
    w.add_embedding_length(s.hidden)
    w.add_feed_forward_length(s.ffn)
    w.add_head_count(s.n_heads)
    w.add_head_count_kv(s.n_kv_heads)
    w.add_key_length(s.head_dim)
    w.add_rope_freq_base(s.rope_theta)
    w.add_layer_norm_rms_eps(s.rms_eps)
    w.add_vocab_size(s.vocab)
    perm = s.architecture == "llama"
    w.add_tensor("token_embd.weight", hf["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", hf["model.norm.weight"])
    if not s.tie_embeddings:
        w.add_tensor("output.weight", hf["lm_head.weight"])
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "q_norm": "attn_q_norm", "k_norm": "attn_k_norm"}
    for i in range(s.n_layers):
        p = f"model.layers.{i}."
        for key, arr in hf.items():
            if not key.startswith(p):
                continue
            part, kind = key[len(p):].rsplit(".", 1)  # e.g. self_attn.q_proj, weight
            leaf = part.split(".")[-1]
            gname = names.get(leaf) or {"input_layernorm": "attn_norm", "post_attention_layernorm":
                                        "ffn_norm", "gate_proj": "ffn_gate", "up_proj": "ffn_up",
                                        "down_proj": "ffn_down"}[leaf]
            if perm and leaf in ("q_proj", "k_proj"):
                arr = llama_cpp_permute(arr, s.n_heads if leaf == "q_proj" else s.n_kv_heads)
            w.add_tensor(f"blk.{i}.{gname}.{kind}", np.ascontiguousarray(arr))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_gguf_written_like_llama_cpp_loads_back(arch: str, tmp_path: Path) -> None:
    model = tiny_model(arch)
    write_gguf(model, tmp_path / "m.gguf")
    ck = W.load_gguf(tmp_path / "m.gguf")
    assert ck.spec.to_dict() | {"name": ""} == model.spec.to_dict() | {"name": ""}
    assert ck.tokenizer is None and ck.meta["format"] == "gguf"
    back = Transformer(ck.spec, ck.weights)
    tokens = list(range(5, 30))
    torch.testing.assert_close(_logits(back, tokens), _logits(model, tokens), atol=1e-5, rtol=1e-5)


def test_gguf_shape_only_and_bad_file(tmp_path: Path) -> None:
    write_gguf(tiny_model("qwen3"), tmp_path / "m.gguf")
    assert W.load_checkpoint(tmp_path / "m.gguf", load_weights=False).weights is None
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + b"\0" * 20)
    with pytest.raises(UserInputError, match="cannot read GGUF"):
        W.load_gguf(tmp_path / "bad.gguf")


# ---- tokenizer ---------------------------------------------------------------------------


def test_smollm2_tokenizer(smollm2: Any) -> None:
    _, tok, _ = smollm2
    text = "Hello world! Ünïcödé — 12345 tabs\tand\nnewlines  double  spaces 🙂"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(ids) < len(text.encode()) / 2  # merges applied, not bytes
    assert [tok.tok.id_to_token(i) for i in tok.encode("Hello world")] == ["Hello", "Ġworld"]
    assert tok.encode("2024") == [tok.tok.token_to_id(d) for d in "2024"]  # digits split singly
    im_start, im_end = tok.tok.token_to_id("<|im_start|>"), tok.tok.token_to_id("<|im_end|>")
    assert tok.encode("<|im_start|>user") == [im_start] + tok.encode("user")
    chat = tok.chat("Hi")
    assert chat[0] == im_start and chat.count(im_end) == 2
    assert tok.decode(chat).endswith("<|im_start|>assistant\n")
    assert "SmolLM" in tok.decode(chat)  # the template's default system prompt
    assert tok.eos_id == im_end and im_end in tok.stop_ids
    assert tok.bos_id is None  # add_bos_token is false for SmolLM2
