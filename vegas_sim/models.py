"""Model shapes: the `ModelSpec` dataclass, named presets, and the byte/FLOP accounting
that both the latency model (sim/) and the runtime (calibrate/) use.

Nothing here imports torch: the CPU half of the product needs shapes, not weights.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from vegas_sim.errors import UserInputError

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer (Llama / Qwen2 / Qwen3 families)."""

    name: str
    architecture: str  # "llama" | "qwen2" | "qwen3"
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    max_positions: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tie_embeddings: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm on q and k per head
    qkv_bias: bool = False  # Qwen2: bias on q, k, v projections
    # Llama-3.1 style RoPE scaling: (factor, low_freq_factor, high_freq_factor, original_max)
    rope_scaling: tuple[float, float, float, int] | None = None
    dtype: str = "bfloat16"

    # ---- accounting -----------------------------------------------------------------
    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.n_heads // self.n_kv_heads

    def layer_params(self) -> int:
        """Matmul parameters of one transformer layer (norms ignored)."""
        q = self.hidden * self.n_heads * self.head_dim
        kv = 2 * self.hidden * self.n_kv_heads * self.head_dim
        o = self.n_heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.ffn
        return q + kv + o + mlp

    def matmul_params(self) -> int:
        """Parameters touched by the GEMMs of one forward (layers + LM head)."""
        return self.n_layers * self.layer_params() + self.vocab * self.hidden

    def param_count(self) -> int:
        embed = self.vocab * self.hidden
        head = 0 if self.tie_embeddings else self.vocab * self.hidden
        return self.n_layers * self.layer_params() + embed + head

    def weight_bytes(self) -> int:
        """Bytes of weights one forward reads from memory (the GEMM weights)."""
        return self.matmul_params() * self.dtype_bytes

    def gemm_flops(self, tokens: int) -> float:
        """FLOPs of the dense part (projections, MLP, LM head) for `tokens` query rows."""
        return 2.0 * self.matmul_params() * tokens

    def kv_bytes_per_token(self) -> int:
        """K and V bytes of one token over all layers."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.dtype_bytes

    def attn_flops(self, n_query: int, kv_read: float) -> float:
        """FLOPs of attention for one request: QK^T and PV over `kv_read` keys, all layers."""
        return 4.0 * self.n_layers * self.n_heads * self.head_dim * n_query * kv_read

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if self.rope_scaling is not None:
            d["rope_scaling"] = list(self.rope_scaling)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known}
        if kwargs.get("rope_scaling") is not None:
            kwargs["rope_scaling"] = tuple(kwargs["rope_scaling"])
        return cls(**kwargs)


PRESETS: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        name="smollm2-135m", architecture="llama", n_layers=30, hidden=576, n_heads=9,
        n_kv_heads=3, head_dim=64, ffn=1536, vocab=49152, max_positions=8192,
        rope_theta=100000.0, rms_eps=1e-5, tie_embeddings=True,
    ),
    "qwen3-4b": ModelSpec(
        name="qwen3-4b", architecture="qwen3", n_layers=36, hidden=2560, n_heads=32,
        n_kv_heads=8, head_dim=128, ffn=9728, vocab=151936, max_positions=131072,
        rope_theta=1000000.0, rms_eps=1e-6, tie_embeddings=True, qk_norm=True,
    ),
    "qwen3-8b": ModelSpec(
        name="qwen3-8b", architecture="qwen3", n_layers=36, hidden=4096, n_heads=32,
        n_kv_heads=8, head_dim=128, ffn=12288, vocab=151936, max_positions=131072,
        rope_theta=1000000.0, rms_eps=1e-6, tie_embeddings=False, qk_norm=True,
    ),
    "llama-3.1-8b": ModelSpec(
        name="llama-3.1-8b", architecture="llama", n_layers=32, hidden=4096, n_heads=32,
        n_kv_heads=8, head_dim=128, ffn=14336, vocab=128256, max_positions=131072,
        rope_theta=500000.0, rms_eps=1e-5, rope_scaling=(8.0, 1.0, 4.0, 8192),
    ),
}


def get_preset(name: str) -> ModelSpec:
    """The preset called `name`, or a UserInputError that lists the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise UserInputError(
            f"unknown model {name!r}",
            fix=f"use one of: {', '.join(sorted(PRESETS))}",
        ) from None
