"""Weights: GGUF files (dequantized), Hugging Face checkpoint dirs (config.json + safetensors).

Both map onto the runtime's parameter names (runtime.Transformer):

    embed, norm, lm_head (absent when tied),
    layers.N.{attn_norm, wqkv, bqkv (Qwen2), q_norm, k_norm (Qwen3, Gemma 3), wo, mlp_norm, w13, w2,
              post_attn_norm, post_mlp_norm (Gemma 3)}

where wqkv = [q; k; v] rows and w13 = [gate; up] rows (fused for fewer GEMM launches).

GGUF: llama.cpp's converter permutes the q/k rows of *Llama* models so that its RoPE can rotate
adjacent pairs; we undo that (as transformers' GGUF loader does) and keep the half-split RoPE of
the Hugging Face layout for every architecture. Qwen2/Qwen3/Gemma 3 GGUFs are not permuted.

Gemma 3 (GGUF only): llama.cpp's converter stores every norm weight as Gemma's 1 + w (its
Gemma3Model adds the shift; transformers' GGUF loader subtracts it again), which is the
multiplier our RMSNorm wants, so they load as stored. What Gemma 3 defines and its GGUF does
not say is filled in as llama.cpp does: every 6th layer global, the rest sliding-window with
RoPE base 10000 (GEMMA3_*).

Safetensors: read with the `safetensors` package when installed, otherwise with the small
reader below (the format is a u64 header length, a JSON header, raw little-endian tensors).
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from vegas_sim.calibrate.tokenizer import Tokenizer
from vegas_sim.calibrate.weights_moe import (
    MOE_ARCHITECTURES,
    checkpoint_tensor,
    hf_moe_config,
    hf_moe_fields,
    hf_moe_to_ours,
    ours_to_hf_moe,
)
from vegas_sim.errors import UserInputError
from vegas_sim.files import sha256_file
from vegas_sim.models import PRESETS, ModelSpec, RopeScaling, llama3_scaling, yarn_scaling

ARCHITECTURES = ("llama", "qwen2", "qwen3")
GGUF_ARCHITECTURES = ARCHITECTURES + ("gemma3",)
GEMMA3_GLOBAL_EVERY = 6  # layer i is global when (i + 1) % 6 == 0 (Gemma 3's layer_types)
GEMMA3_WINDOW_ROPE_THETA = 10000.0  # rope_local_base_freq


@dataclass
class Checkpoint:
    """What a weights file gives: its shape, weights in our names (None when not loaded), a
    tokenizer when the file carries one, and trace-set meta {"kind", "id", "sha256", ...}."""

    spec: ModelSpec
    weights: dict[str, Tensor] | None
    tokenizer: Tokenizer | None
    meta: dict[str, Any] = field(default_factory=dict)


def load_checkpoint(path: str | Path, load_weights: bool = True) -> Checkpoint:
    """A .gguf file or a Hugging Face checkpoint dir; `load_weights=False` reads the shape only."""
    path = Path(path)
    if path.is_dir():
        return load_hf_dir(path, load_weights)
    if path.is_file() and path.suffix == ".gguf":
        return load_gguf(path, load_weights)
    problem = (f"{path} is neither a .gguf file nor a checkpoint directory" if path.exists()
               else f"no preset and no file named {path}")
    raise UserInputError(
        problem, where="--model",
        fix=f"pass a preset ({', '.join(sorted(PRESETS))}), a .gguf file, or a directory with "
            "config.json + *.safetensors",
    )


def match_preset(spec: ModelSpec) -> str | None:
    """The preset with exactly this shape, if any (names trace sets like 'smollm2-135m')."""
    keys = ("architecture", "n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "ffn",
            "vocab", "qk_norm", "qkv_bias", "tie_embeddings")
    for name, p in PRESETS.items():
        if all(getattr(p, k) == getattr(spec, k) for k in keys):
            return name
    return None


def _named(spec: ModelSpec, fallback: str) -> ModelSpec:
    name = match_preset(spec) or fallback
    return ModelSpec.from_dict({**spec.to_dict(), "name": name})


# ---- GGUF --------------------------------------------------------------------------------


def _field(reader: Any, key: str, default: Any = None, where: str = "") -> Any:
    f = reader.fields.get(key)
    if f is None:
        if default is None:
            raise UserInputError(f"GGUF metadata lacks {key!r}", where=where,
                                 fix="convert the model with a recent llama.cpp")
        return default
    return f.contents()


def gguf_spec(reader: Any, where: str = "") -> ModelSpec:
    """A ModelSpec from GGUF metadata ({arch}.block_count, ...)."""
    arch = str(_field(reader, "general.architecture", where=where))
    if arch not in GGUF_ARCHITECTURES:
        raise UserInputError(f"unsupported architecture {arch!r}", where=where,
                             fix=f"use a model of the {', '.join(GGUF_ARCHITECTURES)} families")
    names = {t.name for t in reader.tensors}
    n_heads = int(_field(reader, f"{arch}.attention.head_count", where=where))
    hidden = int(_field(reader, f"{arch}.embedding_length", where=where))
    n_tokens = len(reader.fields["tokenizer.ggml.tokens"].data) if "tokenizer.ggml.tokens" in reader.fields else 0
    spec = ModelSpec(
        name="", architecture=arch,
        n_layers=int(_field(reader, f"{arch}.block_count", where=where)),
        hidden=hidden, n_heads=n_heads,
        n_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", n_heads)),
        head_dim=int(_field(reader, f"{arch}.attention.key_length", hidden // n_heads)),
        ffn=int(_field(reader, f"{arch}.feed_forward_length", where=where)),
        vocab=int(_field(reader, f"{arch}.vocab_size", n_tokens or None, where=where)),
        max_positions=int(_field(reader, f"{arch}.context_length", where=where)),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rms_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        tie_embeddings="output.weight" not in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        qkv_bias="blk.0.attn_q.bias" in names,
        rope_scaling=_gguf_rope_scaling(reader, arch, names),
    )
    extra = _gguf_gemma3_fields(reader, spec, where) if arch == "gemma3" else {}
    spec = ModelSpec.from_dict({**spec.to_dict(), "rms_eps": round(spec.rms_eps, 12), **extra})
    base = str(_field(reader, "general.basename", arch))
    return _named(spec, f"{base}-{arch}")


def _gguf_gemma3_fields(reader: Any, spec: ModelSpec, where: str) -> dict[str, Any]:
    """Gemma 3's window layers, local RoPE base, GeGLU, sandwich norms and embedding scale."""
    window = int(_field(reader, "gemma3.attention.sliding_window", where=where))
    return {"sliding_window": window,
            "window_layers": [i for i in range(spec.n_layers) if (i + 1) % GEMMA3_GLOBAL_EVERY],
            "rope_theta_window": GEMMA3_WINDOW_ROPE_THETA, "mlp_activation": "gelu_tanh",
            "sandwich_norms": True, "embed_scale": True}


def _gguf_rope_scaling(reader: Any, arch: str, names: set[str]) -> RopeScaling | None:
    """{arch}.rope.scaling.type "yarn" (llama.cpp's YaRN keys), else Llama-3.1 scaling when
    llama.cpp stored it as a `rope_freqs` factor tensor (parameters under
    {arch}.rope.scaling.*, Llama-3.1's published values when absent); other types refused."""
    kind = str(_field(reader, f"{arch}.rope.scaling.type", "none"))
    if kind == "yarn":
        return yarn_scaling(
            float(_field(reader, f"{arch}.rope.scaling.factor", where=arch)),
            int(_field(reader, f"{arch}.rope.scaling.original_context_length", where=arch)),
            beta_fast=float(_field(reader, f"{arch}.rope.scaling.yarn_beta_fast", 32.0)),
            beta_slow=float(_field(reader, f"{arch}.rope.scaling.yarn_beta_slow", 1.0)),
            attention_factor=_gguf_optional_float(reader, f"{arch}.rope.scaling.attn_factor"))
    if kind not in ("none", "llama3") and "rope_freqs.weight" not in names:
        raise UserInputError(f"unsupported rope scaling type {kind!r}", where=arch,
                             fix="llama3 (rope_freqs) and yarn are implemented")
    if "rope_freqs.weight" not in names:
        return None
    factor = float(_field(reader, f"{arch}.rope.scaling.factor", 8.0))
    orig = int(_field(reader, f"{arch}.rope.scaling.original_context_length", 8192))
    return llama3_scaling(factor, 1.0, 4.0, orig)


def _gguf_optional_float(reader: Any, key: str) -> float | None:
    f = reader.fields.get(key)
    return None if f is None else float(f.contents())


def unpermute_rope_rows(w: Tensor, n_heads: int) -> Tensor:
    """Undo llama.cpp's q/k permutation (rows of each head interleaved for adjacent-pair RoPE).

    The converter did w.reshape(H, 2, D/2, ...).swapaxes(1, 2); we invert it.
    w [H*D, ...] (a weight or a bias)."""
    rest = w.shape[1:]
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *rest).transpose(1, 2).reshape(w.shape)


def _gguf_tensor(t: Any) -> Tensor:
    from gguf.quants import dequantize

    return torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32))  # own, writable


def gguf_weights(reader: Any, spec: ModelSpec) -> dict[str, Tensor]:
    """Dequantized fp32 weights in our names."""
    raw = {t.name: t for t in reader.tensors}

    def get(name: str) -> Tensor:
        return _gguf_tensor(raw[name])

    def rope_rows(name: str, heads: int) -> Tensor:
        w = get(name)
        return unpermute_rope_rows(w, heads) if spec.architecture == "llama" else w

    out: dict[str, Tensor] = {"embed": get("token_embd.weight"), "norm": get("output_norm.weight")}
    if not spec.tie_embeddings:
        out["lm_head"] = get("output.weight")
    for i in range(spec.n_layers):
        p, q = f"blk.{i}.", f"layers.{i}."
        out[q + "wqkv"] = torch.cat([
            rope_rows(p + "attn_q.weight", spec.n_heads),
            rope_rows(p + "attn_k.weight", spec.n_kv_heads),
            get(p + "attn_v.weight"),
        ])
        if spec.qkv_bias:
            out[q + "bqkv"] = torch.cat([
                rope_rows(p + "attn_q.bias", spec.n_heads),
                rope_rows(p + "attn_k.bias", spec.n_kv_heads),
                get(p + "attn_v.bias"),
            ])
        if spec.qk_norm:
            out[q + "q_norm"] = get(p + "attn_q_norm.weight")
            out[q + "k_norm"] = get(p + "attn_k_norm.weight")
        out[q + "wo"] = get(p + "attn_output.weight")
        out[q + "attn_norm"] = get(p + "attn_norm.weight")
        out[q + "mlp_norm"] = get(p + "ffn_norm.weight")
        out[q + "w13"] = torch.cat([get(p + "ffn_gate.weight"), get(p + "ffn_up.weight")])
        out[q + "w2"] = get(p + "ffn_down.weight")
        if spec.sandwich_norms:
            out[q + "post_attn_norm"] = get(p + "post_attention_norm.weight")
            out[q + "post_mlp_norm"] = get(p + "post_ffw_norm.weight")
    return out


def load_gguf(path: Path, load_weights: bool = True) -> Checkpoint:
    from gguf import GGUFReader

    where = str(path)
    try:
        reader = GGUFReader(str(path))
    except Exception as e:  # the gguf package raises ValueError/struct errors on bad files
        raise UserInputError(f"cannot read GGUF: {e}", where=where,
                             fix="check the file is a complete GGUF v3 file") from e
    spec = gguf_spec(reader, where)
    tok = Tokenizer.from_gguf(reader) if "tokenizer.ggml.tokens" in reader.fields else None
    meta = {"kind": "real", "id": f"{_field(reader, 'general.name', path.name)} ({path.name})",
            "sha256": sha256_file(path), "format": "gguf"}
    return Checkpoint(spec, gguf_weights(reader, spec) if load_weights else None, tok, meta)


# ---- Hugging Face ------------------------------------------------------------------------


def hf_spec(config: dict[str, Any], where: str = "config.json") -> ModelSpec:
    """A ModelSpec from a transformers config.json (llama / qwen2 / qwen3; qwen3_moe and
    gpt_oss through weights_moe)."""
    arch = str(config.get("model_type", ""))
    if arch not in ARCHITECTURES + MOE_ARCHITECTURES:
        raise UserInputError(f"unsupported model_type {arch!r}", where=where,
                             fix="use a model of the "
                                 f"{', '.join(ARCHITECTURES + MOE_ARCHITECTURES)} families")
    try:
        n_heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        rope = config.get("rope_parameters") or {}  # transformers >= 5 nests rope settings here
        scaling = config.get("rope_scaling") or (rope if "rope_type" in rope else None)
        spec = ModelSpec(
            name="", architecture=arch, n_layers=int(config["num_hidden_layers"]), hidden=hidden,
            n_heads=n_heads, n_kv_heads=int(config.get("num_key_value_heads") or n_heads),
            head_dim=int(config.get("head_dim") or hidden // n_heads),
            ffn=int(config["intermediate_size"]), vocab=int(config["vocab_size"]),
            max_positions=int(config["max_position_embeddings"]),
            rope_theta=float(config.get("rope_theta", rope.get("rope_theta", 10000.0))),
            rms_eps=float(config.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            qk_norm=arch == "qwen3",
            qkv_bias=arch == "qwen2" or bool(config.get("attention_bias", False)),
            rope_scaling=_hf_rope_scaling(scaling, int(config["max_position_embeddings"]), where),
        )
        if arch in MOE_ARCHITECTURES:
            spec = ModelSpec.from_dict({**spec.to_dict(), **hf_moe_fields(config, where)})
    except KeyError as e:
        raise UserInputError(f"config lacks {e.args[0]!r}", where=where,
                             fix="use the checkpoint's original config.json") from None
    return _named(spec, str(config.get("_name_or_path") or arch).split("/")[-1].lower())


def _hf_rope_scaling(scaling: dict[str, Any] | None, max_positions: int, where: str
                     ) -> RopeScaling | None:
    """llama3 or yarn from config.json's rope_scaling (or rope_parameters); none / default
    means no scaling; any other type is refused (a model run with the wrong positions
    would give wrong outputs, not an error)."""
    kind = None if not scaling else scaling.get("rope_type", scaling.get("type"))
    if scaling is None or kind in (None, "default"):
        return None
    where = f"{where}: rope_scaling"
    try:
        if kind == "llama3":
            return llama3_scaling(float(scaling["factor"]), float(scaling["low_freq_factor"]),
                                  float(scaling["high_freq_factor"]),
                                  int(scaling["original_max_position_embeddings"]))
        if kind == "yarn":
            return _hf_yarn(scaling, max_positions)
    except KeyError as e:
        raise UserInputError(f"{kind} rope scaling lacks {e.args[0]!r}", where=where,
                             fix="use the checkpoint's original config.json") from None
    raise UserInputError(f"unsupported rope_scaling type {kind!r}", where=where,
                         fix="llama3 (Llama-3.1) and yarn are implemented; remove rope_scaling "
                             "to run without scaling")


def _hf_yarn(scaling: dict[str, Any], max_positions: int) -> RopeScaling:
    """transformers' reading: original window defaults to max_position_embeddings, factor to
    their ratio; attention_factor from mscale / mscale_all_dim when both are given."""
    orig = int(scaling.get("original_max_position_embeddings") or max_positions)
    factor = float(scaling.get("factor") or max_positions / orig)
    attention = scaling.get("attention_factor")
    mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if attention is None and mscale and mscale_all:
        attention = _yarn_mscale(factor, float(mscale)) / _yarn_mscale(factor, float(mscale_all))
    return yarn_scaling(factor, orig, beta_fast=float(scaling.get("beta_fast") or 32.0),
                        beta_slow=float(scaling.get("beta_slow") or 1.0),
                        attention_factor=None if attention is None else float(attention),
                        truncate=bool(scaling.get("truncate", True)))


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _hf_to_ours(spec: ModelSpec, hf: dict[str, Tensor], where: str) -> dict[str, Tensor]:
    def get(name: str) -> Tensor:
        return checkpoint_tensor(hf, name, where)

    out = {"embed": get("model.embed_tokens.weight"), "norm": get("model.norm.weight")}
    if not spec.tie_embeddings:
        out["lm_head"] = get("lm_head.weight")
    for i in range(spec.n_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        a = p + "self_attn."
        out[q + "wqkv"] = torch.cat([get(a + f"{x}_proj.weight") for x in "qkv"])
        if spec.qkv_bias:
            out[q + "bqkv"] = torch.cat([get(a + f"{x}_proj.bias") for x in "qkv"])
        if spec.qk_norm:
            out[q + "q_norm"], out[q + "k_norm"] = get(a + "q_norm.weight"), get(a + "k_norm.weight")
        out[q + "wo"] = get(a + "o_proj.weight")
        out[q + "attn_norm"] = get(p + "input_layernorm.weight")
        out[q + "mlp_norm"] = get(p + "post_attention_layernorm.weight")
        if not spec.is_moe:
            out[q + "w13"] = torch.cat([get(p + "mlp.gate_proj.weight"),
                                        get(p + "mlp.up_proj.weight")])
            out[q + "w2"] = get(p + "mlp.down_proj.weight")
    if spec.is_moe:
        out.update(hf_moe_to_ours(spec, hf, where))
    return out


def ours_to_hf(spec: ModelSpec, ours: dict[str, Tensor]) -> dict[str, Tensor]:
    """Our names back to Hugging Face names (for writing checkpoints)."""
    q_dim, kv_dim = spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
    hf = {"model.embed_tokens.weight": ours["embed"], "model.norm.weight": ours["norm"]}
    if not spec.tie_embeddings:
        hf["lm_head.weight"] = ours["lm_head"]
    for i in range(spec.n_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        a = p + "self_attn."
        for x, w in zip("qkv", ours[q + "wqkv"].split([q_dim, kv_dim, kv_dim])):
            hf[a + f"{x}_proj.weight"] = w
        if spec.qkv_bias:
            for x, w in zip("qkv", ours[q + "bqkv"].split([q_dim, kv_dim, kv_dim])):
                hf[a + f"{x}_proj.bias"] = w
        if spec.qk_norm:
            hf[a + "q_norm.weight"], hf[a + "k_norm.weight"] = ours[q + "q_norm"], ours[q + "k_norm"]
        hf[a + "o_proj.weight"] = ours[q + "wo"]
        hf[p + "input_layernorm.weight"] = ours[q + "attn_norm"]
        hf[p + "post_attention_layernorm.weight"] = ours[q + "mlp_norm"]
        if not spec.is_moe:
            gate, up = ours[q + "w13"].chunk(2)
            hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"] = gate, up
            hf[p + "mlp.down_proj.weight"] = ours[q + "w2"]
    if spec.is_moe:
        hf.update(ours_to_hf_moe(spec, ours))
    return hf


def hf_config(spec: ModelSpec, torch_dtype: str = "bfloat16") -> dict[str, Any]:
    """A transformers-style config.json for `spec`."""
    cfg: dict[str, Any] = {
        "model_type": spec.architecture,
        "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                           "qwen3": "Qwen3ForCausalLM"}.get(spec.architecture, "")],
        "num_hidden_layers": spec.n_layers, "hidden_size": spec.hidden,
        "num_attention_heads": spec.n_heads, "num_key_value_heads": spec.n_kv_heads,
        "head_dim": spec.head_dim, "intermediate_size": spec.ffn, "vocab_size": spec.vocab,
        "max_position_embeddings": spec.max_positions, "rope_theta": spec.rope_theta,
        "rms_norm_eps": spec.rms_eps, "tie_word_embeddings": spec.tie_embeddings,
        "hidden_act": "silu", "torch_dtype": torch_dtype, "_name_or_path": spec.name,
    }
    if spec.architecture == "llama":
        cfg["attention_bias"] = spec.qkv_bias
    if spec.rope_scaling is not None:
        cfg["rope_scaling"] = hf_rope_scaling(spec.rope_scaling)
    if spec.is_moe:
        cfg.update(hf_moe_config(spec))
    return cfg


def hf_rope_scaling(scaling: RopeScaling) -> dict[str, Any]:
    """config.json's rope_scaling for `scaling` (what _hf_rope_scaling reads back)."""
    r = scaling
    if r.type == "llama3":
        return {"rope_type": "llama3", "factor": r.factor, "low_freq_factor": r.low_freq_factor,
                "high_freq_factor": r.high_freq_factor,
                "original_max_position_embeddings": r.original_max_position_embeddings}
    out: dict[str, Any] = {"rope_type": "yarn", "factor": r.factor,
                           "original_max_position_embeddings": r.original_max_position_embeddings,
                           "beta_fast": r.beta_fast, "beta_slow": r.beta_slow,
                           "truncate": r.truncate}
    if r.attention_factor is not None:
        out["attention_factor"] = r.attention_factor
    return out


def load_hf_dir(path: Path, load_weights: bool = True) -> Checkpoint:
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise UserInputError("no config.json", where=str(path),
                             fix="pass a Hugging Face checkpoint dir (config.json + *.safetensors)")
    try:
        config = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise UserInputError(f"invalid JSON: {e}", where=str(cfg_path), fix="restore the file") from e
    spec = hf_spec(config, str(cfg_path))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise UserInputError("no *.safetensors files", where=str(path),
                             fix="download the safetensors shards (PyTorch .bin files are not loaded)")
    weights = None
    if load_weights:
        hf: dict[str, Tensor] = {}
        for f in files:
            hf.update(read_safetensors(f))
        weights = _hf_to_ours(spec, hf, str(path))
    tok = Tokenizer.from_hf_dir(path) if (path / "tokenizer.json").is_file() else None
    meta = {"kind": "real", "id": str(config.get("_name_or_path") or path.name),
            "sha256": safetensors_digest(files), "format": "safetensors"}
    return Checkpoint(spec, weights, tok, meta)


# ---- safetensors -------------------------------------------------------------------------

_ST_DTYPES: dict[str, torch.dtype] = {
    "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}


def read_safetensors(path: Path) -> dict[str, Tensor]:
    """All tensors of one .safetensors file (CPU)."""
    try:
        from safetensors.torch import load_file
    except ImportError:
        return _read_safetensors_fallback(path)
    return dict(load_file(str(path)))


def _read_header(f: Any, path: Path) -> tuple[dict[str, Any], int]:
    raw = f.read(8)
    if len(raw) != 8:
        raise UserInputError("truncated safetensors file", where=str(path), fix="download it again")
    (n,) = struct.unpack("<Q", raw)
    try:
        header = json.loads(f.read(n))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserInputError(f"corrupt safetensors header: {e}", where=str(path),
                             fix="download it again") from e
    header.pop("__metadata__", None)
    return header, 8 + n


def _read_safetensors_fallback(path: Path) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    with open(path, "rb") as f:
        header, base = _read_header(f, path)
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # private copy-on-write pages
    for name, info in header.items():
        start, end = info["data_offsets"]
        dtype = _ST_DTYPES[info["dtype"]]
        count = (end - start) // torch.empty(0, dtype=dtype).element_size()
        t = torch.frombuffer(buf, dtype=dtype, count=count, offset=base + start) if count else \
            torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"]).clone()  # own memory: the mmap is closed by GC
    return out


def _safetensors_writer() -> Any:
    """safetensors' save_file where the package is installed, else None (our own writer)."""
    try:
        from safetensors.torch import save_file
    except ImportError:
        return None
    return save_file


def write_safetensors(path: Path, tensors: dict[str, Tensor]) -> None:
    """Write contiguous CPU tensors as one .safetensors file (atomically)."""
    save_file = _safetensors_writer()
    tmp = path.with_suffix(path.suffix + ".tmp")
    if save_file is not None:
        save_file(tensors, str(tmp))
    else:
        header: dict[str, Any] = {}
        offset = 0
        for name, t in tensors.items():
            n = t.numel() * t.element_size()
            header[name] = {"dtype": _ST_NAMES[t.dtype], "shape": list(t.shape),
                            "data_offsets": [offset, offset + n]}
            offset += n
        hbytes = json.dumps(header, separators=(",", ":")).encode()
        hbytes += b" " * (-len(hbytes) % 8)  # the format pads the header to 8 bytes
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(hbytes)) + hbytes)
            for t in tensors.values():
                f.write(t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    tmp.replace(path)


def safetensors_digest(files: list[Path]) -> str:
    """sha256 identifying a checkpoint without reading 16 GB: every file's name, size and
    header (names, dtypes, shapes, offsets) — a re-quantised or edited shard changes it."""
    import hashlib

    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            header, _ = _read_header(fh, f)
        h.update(f.name.encode())
        h.update(str(f.stat().st_size).encode())
        h.update(json.dumps(header, sort_keys=True).encode())
    return h.hexdigest()

