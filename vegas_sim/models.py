"""Model shapes: the `ModelSpec` dataclass, named presets, and the byte/FLOP accounting
that both the latency model (sim/) and the runtime (calibrate/) use.

Nothing here imports torch: the CPU half of the product needs shapes, not weights.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from vegas_sim.errors import UserInputError

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
ROPE_SCALING_TYPES = ("llama3", "yarn")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE scaling past the window a model was trained on, in transformers' terms
    (`rope_scaling` / `rope_parameters` of config.json).

    llama3  Llama-3.1: wavelengths longer than original_max / low_freq_factor slowed by
            `factor`, shorter than original_max / high_freq_factor kept, the band between
            interpolated.
    yarn    YaRN (Peng et al. 2023; Qwen3 past 32K): dimensions rotating fewer than
            `beta_slow` times over original_max are interpolated by `factor`, more than
            `beta_fast` times kept, a linear ramp between (over dimension indices, floored /
            ceiled when `truncate`); cos and sin are multiplied by `attention_factor`
            (None: 0.1 ln(factor) + 1, the paper's and transformers' default).
    """

    type: str
    factor: float
    original_max_position_embeddings: int
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        if self.type not in ROPE_SCALING_TYPES:
            raise UserInputError(f"unknown rope_scaling type {self.type!r}", where="rope_scaling",
                                 fix=f"use one of: {', '.join(ROPE_SCALING_TYPES)}")
        if not self.factor >= 1.0 or self.original_max_position_embeddings < 1:
            raise UserInputError(
                f"rope_scaling factor {self.factor} / original_max_position_embeddings "
                f"{self.original_max_position_embeddings}", where="rope_scaling",
                fix="factor >= 1 and a positive original window")

    @property
    def cos_sin_scale(self) -> float:
        """What cos and sin are multiplied by (YaRN's attention factor; 1 for llama3)."""
        if self.type != "yarn":
            return 1.0
        if self.attention_factor is not None:
            return self.attention_factor
        return 0.1 * math.log(self.factor) + 1.0 if self.factor > 1.0 else 1.0

    def to_json(self) -> list[float | int] | dict[str, Any]:
        """llama3: the list [factor, low, high, original_max] of schema-v1 meta.json files;
        yarn: a dict with every field."""
        if self.type == "llama3":
            return [self.factor, self.low_freq_factor, self.high_freq_factor,
                    self.original_max_position_embeddings]
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, value: Any) -> RopeScaling:
        """Inverse of to_json; a 4-item list or tuple is llama3."""
        if isinstance(value, RopeScaling):
            return value
        if isinstance(value, (list, tuple)) and len(value) == 4:
            f, lo, hi, orig = value
            return cls("llama3", float(f), int(orig), float(lo), float(hi))
        if isinstance(value, dict):
            known = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise UserInputError(f"rope_scaling has unknown keys {unknown}",
                                     where="rope_scaling", fix=f"use only: {sorted(known)}")
            return cls(**value)
        raise UserInputError(f"rope_scaling {value!r} is neither a 4-item list nor a dict",
                             where="rope_scaling", fix="write it as RopeScaling.to_json does")


def llama3_scaling(factor: float, low_freq_factor: float, high_freq_factor: float,
                   original_max: int) -> RopeScaling:
    """Llama-3.1 scaling from its four numbers."""
    return RopeScaling("llama3", factor, original_max, low_freq_factor, high_freq_factor)


def yarn_scaling(factor: float, original_max: int, **kw: Any) -> RopeScaling:
    """YaRN scaling (beta_fast, beta_slow, attention_factor, truncate as keywords)."""
    return RopeScaling("yarn", factor, original_max, **kw)


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
    rope_scaling: RopeScaling | None = None  # llama3 or yarn (RopeScaling)
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
            d["rope_scaling"] = self.rope_scaling.to_json()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known}
        if kwargs.get("rope_scaling") is not None:
            kwargs["rope_scaling"] = RopeScaling.from_json(kwargs["rope_scaling"])
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
        rope_theta=500000.0, rms_eps=1e-5, rope_scaling=llama3_scaling(8.0, 1.0, 4.0, 8192),
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
