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


# Weight formats of the latency what-ifs (`ModelSpec.weight_bytes`): "bf16" as measured;
# "fp8" 1 byte per parameter of every layer projection (attention, dense MLP, experts; the
# router and LM head stay in the model dtype, as fine-grained FP8 checkpoints ship them);
# "mxfp4" 4.25 bits per expert parameter (4-bit values + one 8-bit scale per 32), the rest in
# the model dtype, as gpt-oss ships.
WEIGHT_FORMATS = ("bf16", "fp8", "mxfp4")
MXFP4_BYTES = 4.25 / 8
ATTENTION_KINDS = ("full", "window")
MLP_ACTIVATIONS = ("silu", "gelu_tanh")


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer (Llama / Qwen2 / Qwen3 families; Qwen3-MoE and
    gpt-oss: routed experts and, for gpt-oss, sliding-window layers; Gemma 3: window layers
    with their own RoPE base, GeGLU, sandwich norms, scaled embeddings)."""

    name: str
    architecture: str  # "llama" | "qwen2" | "qwen3" | "qwen3_moe" | "gpt_oss" | "gemma3"
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
    # ---- mixture of experts and hybrid attention (0 / () / False: a dense, full-attention
    # model; `to_dict` leaves these out at their defaults, so dense meta.json files are as before)
    n_experts: int = 0  # routed experts per layer (every layer is MoE when > 0)
    experts_per_token: int = 0  # top-k
    expert_ffn: int = 0  # one expert's FFN width (Qwen3-MoE moe_intermediate_size)
    sliding_window: int = 0  # keys a window layer attends (the newest ones, its own included)
    window_layers: tuple[int, ...] = ()  # indices of the sliding-window layers
    attention_sinks: bool = False  # gpt-oss: a learned per-head logit in every softmax
    o_bias: bool = False  # gpt-oss: bias on the output projection
    moe_bias: bool = False  # gpt-oss: bias on the router and on every expert projection
    moe_activation: str = "silu"  # "silu" (SwiGLU) | "gpt_oss" (clamped, alpha 1.702, limit 7)
    # ---- Gemma 3 (defaults: as Llama / Qwen; `to_dict` leaves them out at their defaults)
    rope_theta_window: float = 0.0  # RoPE base of the window layers (0: rope_theta), unscaled
    mlp_activation: str = "silu"  # dense MLP: "silu" (SwiGLU) | "gelu_tanh" (GeGLU)
    sandwich_norms: bool = False  # RMSNorm on the attention and MLP outputs before the add
    embed_scale: bool = False  # embeddings times sqrt(hidden), rounded to the model dtype

    def __post_init__(self) -> None:
        if self.mlp_activation not in MLP_ACTIVATIONS:
            raise UserInputError(f"unknown MLP activation {self.mlp_activation!r}",
                                 where=f"model {self.name}",
                                 fix=f"use one of: {', '.join(MLP_ACTIVATIONS)}")
        bad = [i for i in self.window_layers if not 0 <= i < self.n_layers]
        if bad or (self.window_layers and self.sliding_window < 1):
            raise UserInputError(
                f"window layers {list(self.window_layers)} with sliding window "
                f"{self.sliding_window} do not fit {self.n_layers} layers",
                where=f"model {self.name}",
                fix="give layer indices in [0, n_layers) and a sliding_window >= 1")
        if self.n_experts and not (0 < self.experts_per_token <= self.n_experts
                                   and self.expert_ffn > 0):
            raise UserInputError(
                f"{self.n_experts} experts need 1 <= experts_per_token <= n_experts and "
                f"expert_ffn > 0 (got {self.experts_per_token}, {self.expert_ffn})",
                where=f"model {self.name}", fix="copy them from the model's config.json")

    # ---- accounting -----------------------------------------------------------------
    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.n_heads // self.n_kv_heads

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    def attention_params(self) -> int:
        """Projection parameters of one layer's attention (q, k, v, o)."""
        q = self.hidden * self.n_heads * self.head_dim
        kv = 2 * self.hidden * self.n_kv_heads * self.head_dim
        o = self.n_heads * self.head_dim * self.hidden
        return q + kv + o

    def expert_params(self) -> int:
        """Parameters of one expert (gate, up, down); 0 for a dense model."""
        return 3 * self.hidden * self.expert_ffn if self.is_moe else 0

    def router_params(self) -> int:
        return self.hidden * self.n_experts

    def layer_params(self) -> int:
        """Matmul parameters of one transformer layer (norms ignored); every expert counted."""
        if self.is_moe:
            return (self.attention_params() + self.router_params()
                    + self.n_experts * self.expert_params())
        return self.attention_params() + 3 * self.hidden * self.ffn

    def active_layer_params(self) -> int:
        """Matmul parameters one token uses in one layer (top-k experts only)."""
        if self.is_moe:
            return (self.attention_params() + self.router_params()
                    + self.experts_per_token * self.expert_params())
        return self.layer_params()

    def matmul_params(self) -> int:
        """Parameters one token's GEMMs use in one forward (layers + LM head; active experts)."""
        return self.n_layers * self.active_layer_params() + self.vocab * self.hidden

    def param_count(self) -> int:
        embed = self.vocab * self.hidden
        head = 0 if self.tie_embeddings else self.vocab * self.hidden
        return self.n_layers * self.layer_params() + embed + head

    def experts_touched(self, tokens: float) -> float:
        """Expected distinct experts one layer reads for `tokens` routed tokens under a
        balanced router: E·(1 − (1 − k/E)^tokens) (k at one token, → E at large batch)."""
        if not self.is_moe:
            return 0.0
        e, k = self.n_experts, self.experts_per_token
        return float(e * (1.0 - (1.0 - k / e) ** max(tokens, 1.0)))

    def weight_bytes(self, tokens: float = 1, weight_format: str = "bf16") -> float:
        """Bytes of weights one forward over `tokens` query rows reads (the GEMM weights):
        attention + router + the experts those tokens touch + LM head. A dense model reads
        the same whatever `tokens`. `weight_format` rescales them (WEIGHT_FORMATS: a what-if)."""
        layer = self._layer_weight_bytes(weight_format)
        if not self.is_moe and weight_format == "bf16":
            return self.matmul_params() * self.dtype_bytes  # int-valued, as before
        experts = self.experts_touched(tokens) * self.expert_bytes(weight_format)
        return self.n_layers * layer + experts + self.vocab * self.hidden * float(self.dtype_bytes)

    def _layer_weight_bytes(self, weight_format: str) -> float:
        """One layer's weight bytes outside its experts (the whole layer when dense): the
        projections in `weight_format`, the router in the model's dtype."""
        if weight_format not in WEIGHT_FORMATS:
            raise UserInputError(f"unknown weight format {weight_format!r}",
                                 where="--weight-format",
                                 fix=f"use one of: {', '.join(WEIGHT_FORMATS)}")
        db = float(self.dtype_bytes)
        proj_b = 1.0 if weight_format == "fp8" else db
        if self.is_moe:
            return self.attention_params() * proj_b + self.router_params() * db
        return self.layer_params() * proj_b

    def expert_bytes(self, weight_format: str = "bf16") -> float:
        """Bytes of one expert over all layers in `weight_format` (0 for a dense model)."""
        per_param = {"bf16": float(self.dtype_bytes), "fp8": 1.0, "mxfp4": MXFP4_BYTES}
        return float(self.n_layers * self.expert_params() * per_param[weight_format])

    def resident_weight_bytes(self, weight_format: str = "bf16") -> float:
        """Bytes the weights occupy in GPU memory (every expert, embedding and LM head), with
        the projections and experts in `weight_format` as `weight_bytes` counts them."""
        db = float(self.dtype_bytes)
        tables = (self.param_count() - self.n_layers * self.layer_params()) * db  # embed, head
        experts = self.n_experts * self.expert_bytes(weight_format)
        return self.n_layers * self._layer_weight_bytes(weight_format) + experts + tables

    def tensor_shard(self, tp: int) -> ModelSpec:
        """The part of the model one GPU of a `tp`-way tensor-parallel group holds, divided as
        vLLM divides it: query heads, the MLP / expert width and the vocabulary (embedding, LM
        head) split `tp` ways; KV heads split too, or replicated one per GPU when `tp` exceeds
        them; the residual width, norms and router whole on every GPU. `tp` = 1 is the model."""
        check_tensor_parallel(self, tp)
        if tp == 1:
            return self
        return dataclasses.replace(
            self, name=f"{self.name} (1/{tp} tensor shard)", n_heads=self.n_heads // tp,
            n_kv_heads=max(1, self.n_kv_heads // tp), ffn=self.ffn // tp,
            expert_ffn=self.expert_ffn // tp, vocab=-(-self.vocab // tp))

    def gemm_flops(self, tokens: int) -> float:
        """FLOPs of the dense part (projections, active experts, LM head) for `tokens` rows."""
        return 2.0 * self.matmul_params() * tokens

    # ---- attention kinds ---------------------------------------------------------------
    def layer_kind(self, layer: int) -> str:
        """"window" for a sliding-window layer, else "full" (ATTENTION_KINDS)."""
        return "window" if layer in self.window_layers else "full"

    @property
    def n_window_layers(self) -> int:
        return len(set(self.window_layers))

    @property
    def n_full_layers(self) -> int:
        return self.n_layers - self.n_window_layers

    def full_kv_bytes_per_token(self) -> int:
        """K and V bytes of one token over the full-attention layers (all layers when dense)."""
        return 2 * self.n_full_layers * self.n_kv_heads * self.head_dim * self.dtype_bytes

    def window_kv_bytes_per_token(self) -> int:
        """K and V bytes of one token over the sliding-window layers."""
        return 2 * self.n_window_layers * self.n_kv_heads * self.head_dim * self.dtype_bytes

    def window_cache_bytes(self, new_tokens: int, block_size: int) -> int:
        """KV-cache bytes one running request's sliding-window layers hold: the window's last
        W − 1 keys plus a step's `new_tokens`, in whole blocks plus the one the window
        straddles, as vLLM's hybrid KV cache manager allocates them (0 for a dense model)."""
        if not self.window_layers:
            return 0
        tokens = min(self.sliding_window - 1 + new_tokens, self.max_positions)
        blocks = -(-tokens // block_size) + 1
        return blocks * block_size * self.window_kv_bytes_per_token()

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
        for f in _MOE_HYBRID_FIELDS:  # left out at their defaults: dense dicts unchanged
            if d[f.name] == f.default:
                del d[f.name]
        if "window_layers" in d:
            d["window_layers"] = list(self.window_layers)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known}
        if kwargs.get("rope_scaling") is not None:
            kwargs["rope_scaling"] = RopeScaling.from_json(kwargs["rope_scaling"])
        if kwargs.get("window_layers") is not None:
            kwargs["window_layers"] = tuple(int(i) for i in kwargs["window_layers"])
        return cls(**kwargs)


_MOE_HYBRID_FIELDS = tuple(f for f in dataclasses.fields(ModelSpec) if f.name in (
    "n_experts", "experts_per_token", "expert_ffn", "sliding_window", "window_layers",
    "attention_sinks", "o_bias", "moe_bias", "moe_activation", "rope_theta_window",
    "mlp_activation", "sandwich_norms", "embed_scale"))


def check_tensor_parallel(model: ModelSpec, tp: int) -> None:
    """Refuse a tensor-parallel size the model's heads and widths cannot be split by (vLLM
    refuses the same: query heads, MLP / expert width divisible by tp; KV heads divisible by
    tp, or tp a multiple of them)."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise UserInputError(f"tensor-parallel size must be a whole number >= 1, got {tp!r}",
                             where="--tp", fix="give e.g. --tp 2, 4 or 8")
    widths = {"attention heads": model.n_heads, "MLP width": model.ffn}
    if model.is_moe:
        widths["expert width"] = model.expert_ffn
    bad = [f"{name} {n}" for name, n in widths.items() if n % tp]
    kv = model.n_kv_heads
    if kv % tp and tp % kv:
        bad.append(f"KV heads {kv} (neither divisible by {tp} nor dividing it)")
    if bad:
        raise UserInputError(f"{model.name} cannot be split {tp} ways: {', '.join(bad)}",
                             where="--tp", fix="use a size that divides the attention heads "
                             f"({model.n_heads}) and the MLP width")


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
    # huggingface.co/Qwen/Qwen3-30B-A3B config.json (model_type qwen3_moe, norm_topk_prob true)
    "qwen3-30b-a3b": ModelSpec(
        name="qwen3-30b-a3b", architecture="qwen3_moe", n_layers=48, hidden=2048, n_heads=32,
        n_kv_heads=4, head_dim=128, ffn=6144, vocab=151936, max_positions=40960,
        rope_theta=1000000.0, rms_eps=1e-6, tie_embeddings=False, qk_norm=True,
        n_experts=128, experts_per_token=8, expert_ffn=768,
    ),
    # huggingface.co/Qwen/Qwen3-30B-A3B-Thinking-2507 config.json: Qwen3-30B-A3B's shape with
    # 262,144 native positions (RoPE base 1e7); the Vegas paper's "Qwen3-30B"
    "qwen3-30b-a3b-thinking-2507": ModelSpec(
        name="qwen3-30b-a3b-thinking-2507", architecture="qwen3_moe", n_layers=48, hidden=2048,
        n_heads=32, n_kv_heads=4, head_dim=128, ffn=6144, vocab=151936, max_positions=262144,
        rope_theta=10000000.0, rms_eps=1e-6, tie_embeddings=False, qk_norm=True,
        n_experts=128, experts_per_token=8, expert_ffn=768,
    ),
    # huggingface.co/openai/gpt-oss-20b config.json (model_type gpt_oss; layer_types
    # [sliding_attention, full_attention] x 12; YaRN factor 32 over 4096 not modelled here)
    "gpt-oss-20b": ModelSpec(
        name="gpt-oss-20b", architecture="gpt_oss", n_layers=24, hidden=2880, n_heads=64,
        n_kv_heads=8, head_dim=64, ffn=2880, vocab=201088, max_positions=131072,
        rope_theta=150000.0, rms_eps=1e-5, tie_embeddings=False, qkv_bias=True,
        n_experts=32, experts_per_token=4, expert_ffn=2880, sliding_window=128,
        window_layers=tuple(range(0, 24, 2)), attention_sinks=True, o_bias=True,
        moe_bias=True, moe_activation="gpt_oss",
    ),
    # Gemma-3-270M (base): its GGUF's metadata plus what Gemma 3 defines and the GGUF does not
    # say (transformers' Gemma3TextConfig): five sliding-window layers (RoPE base 10000) to one
    # global (1e6), query_pre_attn_scalar = head_dim, no logit softcap
    "gemma3-270m": ModelSpec(
        name="gemma3-270m", architecture="gemma3", n_layers=18, hidden=640, n_heads=4,
        n_kv_heads=1, head_dim=256, ffn=2048, vocab=262144, max_positions=32768,
        rope_theta=1000000.0, rms_eps=1e-6, tie_embeddings=True, qk_norm=True,
        sliding_window=512, window_layers=tuple(i for i in range(18) if (i + 1) % 6),
        rope_theta_window=10000.0, mlp_activation="gelu_tanh", sandwich_norms=True,
        embed_scale=True,
    ),
}


def model_family(name: str) -> str:
    """The family a model belongs to, as its name begins: qwen3-4b, qwen3-8b and
    qwen3-30b-a3b are qwen3's; llama-3.1-8b llama's (presets are named family first)."""
    return name.lower().split("-")[0]


def get_preset(name: str) -> ModelSpec:
    """The preset called `name`, or a UserInputError that lists the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise UserInputError(
            f"unknown model {name!r}",
            fix=f"use one of: {', '.join(sorted(PRESETS))}",
        ) from None
