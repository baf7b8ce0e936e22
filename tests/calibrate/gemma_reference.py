"""An independent Gemma 3 forward for the tests, written from transformers' Gemma3 semantics
(modeling_gemma3.py / configuration_gemma3.py), on a GGUF file's own tensor names: no KV
cache, no kernels, no runtime code, one causal pass over the whole prompt in fp32.

    x = embed[ids] · sqrt(hidden)
    per layer (global when (i + 1) % 6 == 0, else sliding-window, RoPE base 10000):
        x += RMSNorm_post_attn(Attn(RMSNorm_in(x)))   q, k RMSNormed per head, then rotated
        x += RMSNorm_post_ffw(GeGLU(RMSNorm_pre_ffw(x)))
    logits = RMSNorm_out(x) · embed^T   (tied; no final softcap)

RMSNorm multiplies by the GGUF's stored weight, which llama.cpp's converter wrote as 1 + w.
Attention: scale query_pre_attn_scalar^-0.5 = head_dim^-0.5; a window layer's row p sees keys
(p - window, p]. `write_tiny_gemma_gguf` writes a random Gemma-shaped model as a GGUF file.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

GLOBAL_EVERY = 6
LOCAL_ROPE_BASE = 10000.0


def read_gguf(path: str | Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """(metadata {key: value}, tensors {GGUF name: fp32 tensor}) of a GGUF file."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(path))
    meta = {k: f.contents() for k, f in reader.fields.items()
            if not k.startswith("tokenizer.ggml.")}
    tensors = {t.name: torch.from_numpy(np.array(dequantize(t.data, t.tensor_type),
                                                 dtype=np.float32))
               for t in reader.tensors}
    return meta, tensors


def _rms(x: Tensor, w: Tensor, eps: float) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rotate(x: Tensor, base: float) -> Tensor:
    """Half-split RoPE of x [T, H, D] at positions 0..T-1."""
    t, _, d = x.shape
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None]  # [T, D/2]
    cos, sin = ang.cos().float()[:, None], ang.sin().float()[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def gemma3_logits(meta: dict[str, Any], w: dict[str, Tensor], ids: list[int]) -> Tensor:
    """fp32 logits [T, V] of the token ids `ids` (one sequence, from position 0)."""
    a = "gemma3."
    n_layers, hidden = int(meta[a + "block_count"]), int(meta[a + "embedding_length"])
    hq, hkv = int(meta[a + "attention.head_count"]), int(meta[a + "attention.head_count_kv"])
    d = int(meta[a + "attention.key_length"])
    eps = float(meta[a + "attention.layer_norm_rms_epsilon"])
    window = int(meta[a + "attention.sliding_window"])
    base = float(meta[a + "rope.freq_base"])
    t = len(ids)
    x = w["token_embd.weight"][torch.tensor(ids)] * math.sqrt(hidden)  # [T, H]
    pos = torch.arange(t)
    causal = pos[None, :] <= pos[:, None]  # [T(query), T(key)]
    local = causal & (pos[None, :] > pos[:, None] - window)
    for i in range(n_layers):
        p = f"blk.{i}."
        is_global = (i + 1) % GLOBAL_EVERY == 0
        h = _rms(x, w[p + "attn_norm.weight"], eps)
        q = (h @ w[p + "attn_q.weight"].T).view(t, hq, d)
        k = (h @ w[p + "attn_k.weight"].T).view(t, hkv, d)
        v = (h @ w[p + "attn_v.weight"].T).view(t, hkv, d)
        rope_base = base if is_global else LOCAL_ROPE_BASE
        q = _rotate(_rms(q, w[p + "attn_q_norm.weight"], eps), rope_base)
        k = _rotate(_rms(k, w[p + "attn_k_norm.weight"], eps), rope_base)
        k, v = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
        scores = scores.masked_fill(~(causal if is_global else local), float("-inf"))
        attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(t, hq * d)
        x = x + _rms(attn @ w[p + "attn_output.weight"].T, w[p + "post_attention_norm.weight"], eps)
        h = _rms(x, w[p + "ffn_norm.weight"], eps)
        gate = F.gelu(h @ w[p + "ffn_gate.weight"].T, approximate="tanh")
        mlp = (gate * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
        x = x + _rms(mlp, w[p + "post_ffw_norm.weight"], eps)
    return _rms(x, w["output_norm.weight"], eps) @ w["token_embd.weight"].T


def write_tiny_gemma_gguf(path: Path, *, n_layers: int = 6, hidden: int = 64, n_heads: int = 4,
                          n_kv_heads: int = 2, head_dim: int = 16, ffn: int = 96,
                          vocab: int = 101, window: int = 8, context: int = 256,
                          seed: int = 0) -> Path:
    """A random Gemma-3-shaped GGUF (F32 tensors, no tokenizer). Weights are large enough
    that attention is not flat; norms (stored as 1 + w) scattered around 1."""
    from gguf import GGUFWriter

    rng = np.random.default_rng(seed)
    wr = GGUFWriter(str(path), "gemma3")
    a = "gemma3."
    for key, value in (("block_count", n_layers), ("embedding_length", hidden),
                       ("feed_forward_length", ffn), ("context_length", context),
                       ("attention.head_count", n_heads), ("attention.head_count_kv", n_kv_heads),
                       ("attention.key_length", head_dim), ("attention.value_length", head_dim),
                       ("attention.sliding_window", window)):
        wr.add_uint32(a + key, value)
    wr.add_float32(a + "rope.freq_base", 1000000.0)
    wr.add_float32(a + "attention.layer_norm_rms_epsilon", 1e-6)
    wr.add_uint32(a + "vocab_size", vocab)

    def mat(rows: int, cols: int, std: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * std).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32)

    wr.add_tensor("token_embd.weight", mat(vocab, hidden, 0.1))
    wr.add_tensor("output_norm.weight", norm(hidden))
    for i in range(n_layers):
        p = f"blk.{i}."
        wr.add_tensor(p + "attn_q.weight", mat(n_heads * head_dim, hidden, 0.3))
        wr.add_tensor(p + "attn_k.weight", mat(n_kv_heads * head_dim, hidden, 0.3))
        wr.add_tensor(p + "attn_v.weight", mat(n_kv_heads * head_dim, hidden, 0.3))
        wr.add_tensor(p + "attn_output.weight", mat(hidden, n_heads * head_dim, 0.1))
        wr.add_tensor(p + "ffn_gate.weight", mat(ffn, hidden, 0.2))
        wr.add_tensor(p + "ffn_up.weight", mat(ffn, hidden, 0.2))
        wr.add_tensor(p + "ffn_down.weight", mat(hidden, ffn, 0.1))
        # the global layer strong and peaked (q, k are normed: their norm weights set how
        # peaked attention is), so that sparse drafts of it get rejected
        strong = 3.0 if (i + 1) % GLOBAL_EVERY == 0 else 1.0
        for name, n, scale in (("attn_norm", hidden, 1.0), ("post_attention_norm", hidden, strong),
                               ("ffn_norm", hidden, 1.0), ("post_ffw_norm", hidden, 1.0),
                               ("attn_q_norm", head_dim, strong), ("attn_k_norm", head_dim, strong)):
            wr.add_tensor(p + name + ".weight", scale * norm(n))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path
