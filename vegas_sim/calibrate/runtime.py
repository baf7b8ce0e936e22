"""The model runtime: a decoder-only transformer (Llama / Qwen2 / Qwen3 / Gemma 3) over a batched
KV cache.

gpt-fast style: one module per layer, plain tensors, shapes in comments. What is specific here:

- The KV cache uses the kernels' layout (kernels/API.md): `[L, B, S_max, Hkv, D]`, request b
  owns row b, its token at position p lives at `[l, b, p]`; `lens[b]` counts valid tokens.
  Append = write at `lens`, rollback = lower `lens`. Positions differ per request.
- Attention is delegated to an `AttentionPolicy`: the dense one here, the sparse draft and
  score-collecting verify policies in specdec.py. The runtime writes the new K/V *before*
  calling the policy, so the policy sees them at `cache_lens - NQ .. cache_lens - 1`.
- Everything that changes per step (positions, lens) is computed on the device from `lens`, with
  in-place updates, so a step can be captured in a CUDA graph (`GraphedForward`).

Mixture-of-experts and hybrid models (moe.py): a MoE layer's `mlp` routes each token to its
top-k experts (grouped per expert); a sliding-window layer attends its window itself in every
pass, so the policy (sparse draft, collecting verify) only ever sees the full-attention layers.

Gemma 3 (spec fields): embeddings scaled by sqrt(hidden), GeGLU, sandwich norms (each block's
attention and MLP outputs RMSNormed before the residual add) and window layers rotated with
their own RoPE base; its norm weights are held as Gemma's (1 + w), so one RMSNorm serves all.

Weights use our own names (fused `wqkv` and `w13` to halve the GEMM launches of a decode step);
weights.py maps GGUF and Hugging Face names onto them. The glue between the GEMMs is three ops
(kernels.ops): add + RMSNorm, q/k-norm + RoPE + K/V append, SiLU·mul: one Triton launch each on
CUDA, the torch code they replace (kernels.reference) on CPU. A layer's output is added to the
residual stream inside the next layer's first norm.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from vegas_sim.calibrate import moe
from vegas_sim.errors import UserInputError
from vegas_sim.kernels import ops
from vegas_sim.methods import MAX_VERIFY_ROWS
from vegas_sim.models import ModelSpec, RopeScaling, yarn_scaling

SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


# ---- attention policies ------------------------------------------------------------------


class AttentionPolicy(Protocol):
    """How one layer attends. Called once per layer per forward, after the new K/V are written."""

    def attend(
        self, layer: int, q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_lens: Tensor,
        scale: float, sinks: Tensor | None = None,
    ) -> Tensor:
        """q [B, NQ, Hq, D] after q-norm and RoPE; k_cache/v_cache [B, S_max, Hkv, D] of this
        layer with the NQ new tokens at cache_lens-NQ .. cache_lens-1; cache_lens [B] int32
        includes them; sinks [Hq] the layer's attention-sink logits (gpt-oss) or None.
        Returns [B, NQ, Hq, D]."""
        ...


def masked_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_lens: Tensor, scale: float,
    max_len: int | None = None, sinks: Tensor | None = None,
) -> Tensor:
    """Causal attention of NQ new rows per request over its cache, with torch SDPA.

    Row i of request b attends keys [0, cache_lens[b] - NQ + i]. Keys are cut at `max_len`, a
    host-side bound on cache_lens, or else at the longest request's length — a host sync per
    call, i.e. per layer, which made eager prefill of long prompts host-bound on the H200.
    sinks [Hq] or None: see `_with_sink_key`. q [B, NQ, Hq, D] -> [B, NQ, Hq, D].
    """
    _B, NQ, Hq, D = q.shape
    s_max = k_cache.shape[1]
    bound = int(cache_lens.max().item()) if max_len is None else max_len
    kv_len = min(bound, s_max)
    k = k_cache[:, :kv_len].transpose(1, 2)  # [B, Hkv, S, D]
    v = v_cache[:, :kv_len].transpose(1, 2)
    key_pos = torch.arange(kv_len, device=q.device)  # [S]
    row_limit = cache_lens.long()[:, None] - NQ + torch.arange(NQ, device=q.device)  # [B, NQ]
    mask = key_pos[None, None, :] <= row_limit[:, :, None]  # [B, NQ, S]
    qt = q.transpose(1, 2)  # [B, Hq, NQ, D]
    if sinks is not None:
        qt, k, v, mask = _with_sink_key(qt, k, v, mask, sinks, scale)
    out = F.scaled_dot_product_attention(
        qt, k, v, attn_mask=mask[:, None], scale=scale, enable_gqa=Hq != k.shape[1],
    )  # [B, Hq, NQ, D]
    return out[..., :D].transpose(1, 2)  # without the sink channels


SINK_CHANNELS = 8  # extra head channels of `_with_sink_key` (keeps D a multiple of 8 for SDPA)


def _with_sink_key(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, sinks: Tensor, scale: float
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The attention sinks as one more key that every row sees, for SDPA (which has no sinks):
    q [B, Hq, NQ, D] gains channels holding sink_h / scale (as a hi + lo pair, so bf16 keeps
    the logit to ~2^-16), k [B, Hkv, S, D] and v zero channels, plus a key S that is 1 in the
    hi and lo channels and 0 elsewhere, with a zero value: its logit is scale · q·k = sink_h,
    the other keys' logits are unchanged. Returns q, k, v [.., D + SINK_CHANNELS] and mask
    [B, NQ, S + 1]."""
    B, Hq, NQ, D = q.shape
    target = sinks.float() / scale  # [Hq]
    hi = target.to(q.dtype)
    lo = (target - hi.float()).to(q.dtype)
    extra = q.new_zeros(B, Hq, NQ, SINK_CHANNELS)
    extra[..., 0], extra[..., 1] = hi[None, :, None], lo[None, :, None]
    sink_key = k.new_zeros(B, k.shape[1], 1, D + SINK_CHANNELS)
    sink_key[..., D:D + 2] = 1.0
    pad = (0, SINK_CHANNELS)
    k = torch.cat([F.pad(k, pad), sink_key], dim=2)  # [B, Hkv, S + 1, D + 8]
    v = torch.cat([F.pad(v, pad), k.new_zeros(B, v.shape[1], 1, D + SINK_CHANNELS)], dim=2)
    mask = F.pad(mask, (0, 1), value=True)
    return torch.cat([q, extra], dim=-1), k, v, mask


class DenseAttention:
    """Full causal attention, no score collection: the verify kernel (kernels.ops) for
    NQ <= 16 rows on CUDA, torch SDPA for prefill chunks and on CPU.

    On CPU, SDPA computes the same thing as the kernels' torch reference (tested) at a fraction
    of its cost, which keeps CPU decoding of SmolLM2 usable; `use_kernel=True` forces the ops
    path (e.g. under TRITON_INTERPRET=1 with VEGAS_SIM_KERNELS=triton).
    """

    def __init__(self, use_kernel: bool | None = None, max_len: int | None = None) -> None:
        self.use_kernel = use_kernel
        self.max_len = max_len  # host-side bound on cache_lens (incl. new rows): no sync

    def attend(
        self, layer: int, q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_lens: Tensor,
        scale: float, sinks: Tensor | None = None,
    ) -> Tensor:
        kernel = q.is_cuda if self.use_kernel is None else self.use_kernel
        if kernel and q.shape[1] <= MAX_VERIFY_ROWS:
            out, _lse, _scores = ops.verify_attention(q, k_cache, v_cache, cache_lens, scale,
                                                      sinks=sinks)
            return out
        return masked_attention(q, k_cache, v_cache, cache_lens, scale, self.max_len, sinks)


# ---- KV cache ----------------------------------------------------------------------------


@dataclass
class KVCache:
    """Per-request KV slots in the kernels' layout.

    k, v: [L, B, S_max, Hkv, D]; lens: [B] int32 valid tokens per request (same device).
    All updates are in place, so tensors captured by a CUDA graph stay valid.
    """

    k: Tensor
    v: Tensor
    lens: Tensor

    @property
    def batch(self) -> int:
        return int(self.k.shape[1])

    @property
    def max_seq(self) -> int:
        return int(self.k.shape[2])

    def rollback(self, new_lens: Tensor) -> None:
        """Forget tokens past `new_lens` [B] (must not exceed the current lens). In place."""
        new_lens = new_lens.to(device=self.lens.device, dtype=self.lens.dtype)
        if new_lens.shape != self.lens.shape:
            raise UserInputError(
                f"rollback lens shape {tuple(new_lens.shape)} != cache lens {tuple(self.lens.shape)}",
                fix="pass one new length per request",
            )
        if self.lens.device.type == "cpu" and bool((new_lens > self.lens).any()):
            raise UserInputError(
                "rollback cannot grow the cache", fix="new_lens must be <= cache.lens per request"
            )
        self.lens.copy_(new_lens)

    def requests(self, start: int, stop: int) -> KVCache:
        """A view of requests [start, stop); writes go through to this cache."""
        return KVCache(self.k[:, start:stop], self.v[:, start:stop], self.lens[start:stop])

    def fill_random(self, lens: Tensor, generator: torch.Generator | None = None) -> None:
        """Synthetic context without prefill (latency runs): random K/V, lens set to `lens`."""
        self.k.normal_(0.0, 1.0, generator=generator)
        self.v.normal_(0.0, 1.0, generator=generator)
        self.lens.copy_(lens.to(self.lens))


# ---- building blocks ---------------------------------------------------------------------


def rope_inv_freq(spec: ModelSpec) -> Tensor:
    """[D/2] fp32 inverse frequencies, scaled as spec.rope_scaling says (llama3 or yarn)."""
    d = spec.head_dim
    inv = 1.0 / (spec.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    scaling = spec.rope_scaling
    if scaling is None:
        return inv.float()
    if scaling.type == "llama3":
        return _llama3_inv_freq(inv, scaling).float()
    if scaling.type == "yarn":
        return _yarn_inv_freq(inv, scaling, spec.rope_theta, d).float()
    raise UserInputError(f"unknown rope_scaling type {scaling.type!r}", where=spec.name,
                         fix="use llama3 or yarn")


def _llama3_inv_freq(inv: Tensor, scaling: RopeScaling) -> Tensor:
    """Long wavelengths slowed by `factor`, short ones kept, the band between interpolated."""
    factor, low_ff, high_ff = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    orig_max = scaling.original_max_position_embeddings
    low_wavelen = orig_max / low_ff
    high_wavelen = orig_max / high_ff
    wavelen = 2 * math.pi / inv
    smooth = ((orig_max / wavelen - low_ff) / (high_ff - low_ff)).clamp(0.0, 1.0)
    scaled = (1 - smooth) * inv / factor + smooth * inv
    scaled = torch.where(wavelen < high_wavelen, inv, scaled)
    return torch.where(wavelen > low_wavelen, inv / factor, scaled)


def _yarn_correction_dim(rotations: float, dim: int, base: float, orig_max: int) -> float:
    """The dimension index whose wavelength fits `rotations` times into orig_max positions."""
    return dim * math.log(orig_max / (rotations * 2 * math.pi)) / (2 * math.log(base))


def _yarn_inv_freq(inv: Tensor, scaling: RopeScaling, base: float, dim: int) -> Tensor:
    """YaRN's NTK-by-parts: dimensions below the beta_fast correction index keep their
    frequency, those above beta_slow's are divided by `factor`, a linear ramp between."""
    orig = scaling.original_max_position_embeddings
    low = _yarn_correction_dim(scaling.beta_fast, dim, base, orig)
    high = _yarn_correction_dim(scaling.beta_slow, dim, base, orig)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a step, not a division by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0.0, 1.0)
    return inv / scaling.factor * ramp + inv * (1 - ramp)


def rope_attention_factor(spec: ModelSpec) -> float:
    """What cos and sin are multiplied by: YaRN's attention factor, 1 otherwise. Both q and k
    are rotated, so attention logits scale by its square (transformers does the same)."""
    return 1.0 if spec.rope_scaling is None else spec.rope_scaling.cos_sin_scale


def window_rope_spec(spec: ModelSpec) -> ModelSpec | None:
    """The spec whose RoPE the window layers use when it is not the model's (Gemma 3: base
    rope_theta_window, never scaled), else None."""
    if not spec.window_layers or not spec.rope_theta_window:
        return None
    return dataclasses.replace(spec, rope_theta=spec.rope_theta_window, rope_scaling=None)


def rope_table(spec: ModelSpec, n_pos: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """cos, sin [n_pos, D/2] fp32, times the attention factor (rope_attention_factor)."""
    pos = torch.arange(n_pos, dtype=torch.float64)
    angles = pos[:, None] * rope_inv_freq(spec).double()[None, :]  # [n_pos, D/2]
    scale = rope_attention_factor(spec)
    return (angles.cos() * scale).float().to(device), (angles.sin() * scale).float().to(device)


def _param(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.empty(shape, device=device, dtype=dtype), requires_grad=False)


class Layer(torch.nn.Module):
    """One pre-norm transformer block: GQA attention + SwiGLU (GeGLU) MLP, and Gemma's norms
    of both outputs (`post_attn_norm`, `post_mlp_norm`) when the spec has sandwich norms."""

    def __init__(self, spec: ModelSpec, device: torch.device, dtype: torch.dtype,
                 index: int = 0):
        super().__init__()
        self.spec = spec
        q_dim = spec.n_heads * spec.head_dim
        kv_dim = spec.n_kv_heads * spec.head_dim
        self.attn_norm = _param((spec.hidden,), device, dtype)
        self.wqkv = _param((q_dim + 2 * kv_dim, spec.hidden), device, dtype)  # rows: q | k | v
        self.bqkv = _param((q_dim + 2 * kv_dim,), device, dtype) if spec.qkv_bias else None
        self.q_norm = _param((spec.head_dim,), device, dtype) if spec.qk_norm else None
        self.k_norm = _param((spec.head_dim,), device, dtype) if spec.qk_norm else None
        self.wo = _param((spec.hidden, q_dim), device, dtype)
        self.bo = _param((spec.hidden,), device, dtype) if spec.o_bias else None
        self.mlp_norm = _param((spec.hidden,), device, dtype)
        self.post_attn_norm = _param((spec.hidden,), device, dtype) if spec.sandwich_norms else None
        self.post_mlp_norm = _param((spec.hidden,), device, dtype) if spec.sandwich_norms else None
        self.window = spec.sliding_window if spec.layer_kind(index) == "window" else 0
        self.sinks = _param((spec.n_heads,), device, dtype) if spec.attention_sinks else None
        if spec.is_moe:  # every expert's gate | up rows and down projection, and the router
            e, f = spec.n_experts, spec.expert_ffn
            self.router = _param((e, spec.hidden), device, dtype)
            self.brouter = _param((e,), device, dtype) if spec.moe_bias else None
            self.w13 = _param((e, 2 * f, spec.hidden), device, dtype)
            self.b13 = _param((e, 2 * f), device, dtype) if spec.moe_bias else None
            self.w2 = _param((e, spec.hidden, f), device, dtype)
            self.b2 = _param((e, spec.hidden), device, dtype) if spec.moe_bias else None
        else:
            self.w13 = _param((2 * spec.ffn, spec.hidden), device, dtype)  # rows: gate | up
            self.w2 = _param((spec.hidden, spec.ffn), device, dtype)

    def attention_input(self, h: Tensor, cos_table: Tensor, sin_table: Tensor,
                        k_cache: Tensor, v_cache: Tensor, cache_lens: Tensor) -> Tensor:
        """h [B, NQ, H] (normed) -> q [B, NQ, Hq, D], normed (Qwen3) and rotated; the new k, v
        are written into this layer's caches at positions cache_lens[b] + i (one fused op)."""
        s = self.spec
        return ops.qkv_rope_append(
            F.linear(h, self.wqkv, self.bqkv), s.n_heads, self.q_norm, self.k_norm, s.rms_eps,
            cos_table, sin_table, cache_lens, k_cache, v_cache)

    def mlp(self, h: Tensor) -> Tensor:
        """SwiGLU, GeGLU (Gemma) or the routed experts of the normed h [B, NQ, H] -> [B, NQ, H]."""
        if self.spec.is_moe:
            return moe.moe_ffn(h, self.router, self.brouter, self.w13, self.b13, self.w2,
                               self.b2, self.spec.experts_per_token, self.spec.moe_activation)
        if self.spec.mlp_activation == "gelu_tanh":
            gate, up = F.linear(h, self.w13).chunk(2, dim=-1)  # [B, NQ, F] each
            return F.linear(F.gelu(gate, approximate="tanh") * up, self.w2)
        return F.linear(ops.silu_mul(F.linear(h, self.w13)), self.w2)

    def post_norm(self, out: Tensor, weight: Tensor | None) -> Tensor:
        """A block output [B, NQ, H] RMSNormed by `weight` (sandwich norms), else as it is."""
        return out if weight is None else ops.add_rms_norm(out, None, weight, self.spec.rms_eps)[0]

    def attend(self, i: int, q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_lens: Tensor,
               scale: float, policy: AttentionPolicy) -> Tensor:
        """A sliding-window layer attends its window (in draft and verify alike); a
        full-attention layer asks the policy (the method's sparse draft, or verify). Both
        use the layer's attention sinks (gpt-oss; None for models without)."""
        if self.window:
            return moe.window_attention(q, k_cache, v_cache, cache_lens, scale, self.window,
                                        self.sinks)
        return policy.attend(i, q, k_cache, v_cache, cache_lens, scale, self.sinks)


class Transformer(torch.nn.Module):
    """Decoder-only transformer over a `KVCache`. Inference only (no autograd)."""

    def __init__(
        self, spec: ModelSpec, weights: dict[str, Tensor] | None = None, *,
        device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
        seed: int | None = None,
    ):
        """weights: our names (see `param_names`); None = random init for latency runs, seeded
        by `seed` (or by torch's global RNG when seed is None)."""
        super().__init__()
        self.spec = spec
        self.device = torch.device(device)
        self.dtype = dtype
        self.embed = _param((spec.vocab, spec.hidden), self.device, dtype)
        self.layers = torch.nn.ModuleList(Layer(spec, self.device, dtype, i)
                                          for i in range(spec.n_layers))
        self.norm = _param((spec.hidden,), self.device, dtype)
        self.lm_head = None if spec.tie_embeddings else _param((spec.vocab, spec.hidden), self.device, dtype)
        self._rope_cos = torch.empty(0, device=self.device)
        self._rope_sin = torch.empty(0, device=self.device)
        self._window_cos = self._window_sin = self._rope_cos  # window layers' own (Gemma 3)
        self.scale = 1.0 / math.sqrt(spec.head_dim)  # Gemma 3 270M: query_pre_attn_scalar = D
        # Gemma: sqrt(hidden) rounded to the model dtype, as its embedding multiplies by it
        self.embed_scale = (float(torch.tensor(spec.hidden ** 0.5, dtype=dtype))
                            if spec.embed_scale else 1.0)
        if weights is None:
            self.init_random(seed)
        else:
            self.load_weights(weights)

    def extend_positions(self, factor: float) -> None:
        """YaRN past the trained window: `factor` x max_positions, the old window as YaRN's
        original (a model that already scales its RoPE is refused: its window is not the
        trained one)."""
        if self.spec.rope_scaling is not None:
            raise UserInputError(
                f"{self.spec.name} already scales its RoPE ({self.spec.rope_scaling.type})",
                where="--rope-scaling", fix="drop --rope-scaling for this model")
        original = self.spec.max_positions
        self.spec = dataclasses.replace(self.spec, rope_scaling=yarn_scaling(factor, original),
                                        max_positions=int(factor * original))
        self._rope_cos = torch.empty(0, device=self.device)  # rebuilt for the new spec
        self._rope_sin = torch.empty(0, device=self.device)

    # ---- weights -------------------------------------------------------------------------
    def param_names(self) -> list[str]:
        return [name for name, _ in self.named_parameters()]

    def init_random(self, seed: int | None = None) -> None:
        """Normal(0, 0.02) matrices, output projections scaled by 1/sqrt(2L) (GPT-2) so the
        residual stream stays O(1) over many layers in bf16; norms = 1, biases = 0."""
        if self.device.type == "meta":  # shape-only model (tests, accounting): no values
            return
        gen = torch.Generator(self.device).manual_seed(seed) if seed is not None else None
        out_std = 0.02 / math.sqrt(2 * self.spec.n_layers)
        for name, p in self.named_parameters():
            if name.endswith(("norm", "bqkv", "bo", "brouter", "b13", "b2", "sinks")):
                p.data.fill_(1.0 if name.endswith("norm") else 0.0)
            else:
                std = out_std if name.endswith(("wo", "w2")) else 0.02
                p.data.normal_(0.0, std, generator=gen)
                if name.endswith("router"):  # near-uniform: no expert favoured by its norm
                    p.data.mul_(std * p.shape[1] ** 0.5 / p.data.norm(dim=1, keepdim=True))

    @torch.no_grad()
    def load_weights(self, weights: dict[str, Tensor]) -> None:
        """Copy `weights` (our names) in, casting to the model's dtype; all must be present."""
        params = dict(self.named_parameters())
        missing = sorted(set(params) - set(weights))
        unknown = sorted(set(weights) - set(params))
        if missing or unknown:
            raise UserInputError(
                f"weights do not fit {self.spec.name}: missing {missing[:5]}, unexpected {unknown[:5]}",
                fix="check that the checkpoint's architecture matches the model spec",
            )
        for name, p in params.items():
            w = weights[name]
            if tuple(w.shape) != tuple(p.shape):
                raise UserInputError(
                    f"weight {name} has shape {tuple(w.shape)}, expected {tuple(p.shape)}",
                    fix="check the checkpoint's config (heads, kv heads, hidden, ffn)",
                )
            # alias rather than copy when device and dtype already match (no second copy)
            p.data = w.to(device=self.device, dtype=self.dtype).contiguous()

    # ---- cache ---------------------------------------------------------------------------
    def new_cache(self, batch: int, max_seq: int) -> KVCache:
        """An empty cache for `batch` requests of up to `max_seq` tokens each."""
        s = self.spec
        if max_seq > s.max_positions:
            raise UserInputError(
                f"max_seq {max_seq} exceeds {s.name}'s {s.max_positions} positions",
                fix=f"use a context + output length <= {s.max_positions}",
            )
        shape = (s.n_layers, batch, max_seq, s.n_kv_heads, s.head_dim)
        k = torch.zeros(shape, device=self.device, dtype=self.dtype)
        v = torch.zeros(shape, device=self.device, dtype=self.dtype)
        lens = torch.zeros(batch, device=self.device, dtype=torch.int32)
        self._ensure_rope(max_seq)
        return KVCache(k, v, lens)

    def _ensure_rope(self, n_pos: int) -> None:
        # Built once for every position the model has: a table reallocated later would leave
        # the CUDA graphs captured before reading freed memory.
        if self._rope_cos.shape[0] < n_pos:
            n = max(n_pos, self.spec.max_positions)
            self._rope_cos, self._rope_sin = rope_table(self.spec, n, self.device)
            window = window_rope_spec(self.spec)
            self._window_cos, self._window_sin = (
                (self._rope_cos, self._rope_sin) if window is None
                else rope_table(window, n, self.device))

    # ---- forward -------------------------------------------------------------------------
    @torch.no_grad()
    def forward(
        self, tokens: Tensor, cache: KVCache, policy: AttentionPolicy | None = None,
        last_only: bool = False,
    ) -> Tensor:
        """tokens [B, NQ] int64 at positions cache.lens[b] + i. Writes their K/V, advances
        cache.lens by NQ, returns fp32 logits [B, NQ, V] ([B, 1, V] if last_only).

        No host syncs on CUDA (capturable); on CPU it checks the cache has room."""
        policy = policy if policy is not None else DenseAttention()
        tokens = tokens.to(self.device)  # no-op when already there (graph buffers are)
        NQ = tokens.shape[1]
        self._ensure_rope(cache.max_seq)
        if tokens.device.type == "cpu" and int(cache.lens.max()) + NQ > cache.max_seq:
            raise UserInputError(
                f"KV cache full: {int(cache.lens.max())} + {NQ} tokens > max_seq {cache.max_seq}",
                fix="create the cache with a larger max_seq",
            )
        new_lens = cache.lens + NQ  # [B] int32, includes the new tokens
        x = self._embed(tokens)  # [B, NQ, H] residual stream
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        delta: Tensor | None = None  # the last block's output, not yet added to x
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, Layer)
            x, delta = self._block(i, layer, x, delta, cache, new_lens, policy)
        if last_only:
            x, delta = x[:, -1:], (delta[:, -1:] if delta is not None else None)
        h, _ = ops.add_rms_norm(x, delta, self.norm, self.spec.rms_eps)
        logits = self._logits(h)  # [B, NQ or 1, V] fp32
        cache.lens.copy_(new_lens)
        return logits

    # Where a tensor-parallel shard (calibrate/tensor_parallel.py) joins its GPUs' parts; on
    # one GPU each is the plain operation.
    def _embed(self, tokens: Tensor) -> Tensor:
        """tokens [B, NQ] -> embeddings [B, NQ, H]."""
        return F.embedding(tokens, self.embed)

    def _logits(self, h: Tensor) -> Tensor:
        """Final-normed h [B, NQ, H] -> fp32 logits [B, NQ, V]."""
        head = self.embed if self.lm_head is None else self.lm_head
        return F.linear(h, head).float()

    def all_reduce(self, x: Tensor) -> Tensor:
        """Sum of `x` over the GPUs of a tensor-parallel group (in place; `x` on one GPU)."""
        return x

    def captured_collectives(self) -> list[tuple[str, int]]:
        """The (kind, bytes) of the collectives a CUDA-graph capture just recorded (none)."""
        return []

    def replayed(self, collectives: list[tuple[str, int]]) -> None:
        """Count a graph replay's `captured_collectives` (nothing to count on one GPU)."""

    def _block(
        self, i: int, layer: Layer, x: Tensor, delta: Tensor | None, cache: KVCache,
        new_lens: Tensor, policy: AttentionPolicy,
    ) -> tuple[Tensor, Tensor]:
        """One layer on the residual stream x [B, NQ, H] plus the previous layer's pending
        output `delta` (added inside the first norm). Returns (stream, this layer's output)."""
        B, NQ, _ = x.shape
        eps = self.spec.rms_eps
        h, x = ops.add_rms_norm(x, delta, layer.attn_norm, eps)
        cos, sin = ((self._window_cos, self._window_sin) if layer.window
                    else (self._rope_cos, self._rope_sin))
        q = layer.attention_input(h, cos, sin, cache.k[i], cache.v[i], cache.lens)
        attn = layer.attend(i, q, cache.k[i], cache.v[i], new_lens, self.scale,
                            policy)  # [B, NQ, Hq, D]
        out = self.all_reduce(F.linear(attn.reshape(B, NQ, -1), layer.wo, layer.bo))
        h, x = ops.add_rms_norm(x, layer.post_norm(out, layer.post_attn_norm), layer.mlp_norm, eps)
        return x, layer.post_norm(self.all_reduce(layer.mlp(h)), layer.post_mlp_norm)

    @torch.no_grad()
    def prefill(
        self, prompts: list[Tensor], cache: KVCache, policy: AttentionPolicy | None = None,
        chunk: int = 512,
    ) -> Tensor:
        """Append each prompt (1-D int64) to its request's cache; fp32 logits [B, V] of each
        prompt's last token.

        Prompts may differ in length. All but the last m = min(shortest, chunk) tokens are
        prefilled with dense attention, batched over each run of neighbouring requests whose
        prefixes have one length (a batch that repeats each prompt, e.g. once per sparsity,
        prefills each prompt in one forward); the final m tokens of every prompt go through
        one batched forward with `policy`, so a score-collecting policy sees each prompt's
        last row, batched over requests.
        """
        if len(prompts) != cache.batch:
            raise UserInputError(
                f"{len(prompts)} prompts for a cache of batch {cache.batch}",
                fix="create the cache with batch = number of prompts",
            )
        lengths = [int(p.numel()) for p in prompts]
        if min(lengths) < 1:
            raise UserInputError("empty prompt", fix="every prompt needs at least one token")
        m = min(min(lengths), chunk)
        prompts = [p.to(self.device, torch.long).reshape(-1) for p in prompts]
        prefixes = [p[: len(p) - m] for p in prompts]
        base = [int(x) for x in cache.lens.tolist()]  # one sync; lengths are tracked on host
        for start, stop in equal_runs([len(p) for p in prefixes]):
            self._prefill_chunks(torch.stack(prefixes[start:stop]), cache.requests(start, stop),
                                 chunk, max(base[start:stop]))
        tail = torch.stack([p[len(p) - m:] for p in prompts])  # [B, m]
        if policy is None:
            policy = DenseAttention(max_len=max(b + n for b, n in zip(base, lengths)))
        return self.forward(tail, cache, policy, last_only=True)[:, 0]

    def _prefill_chunks(self, tokens: Tensor, cache: KVCache, chunk: int, start_len: int
                        ) -> None:
        """tokens [B, T] appended in chunks of `chunk` with dense attention; start_len bounds
        the caches' lengths before the first chunk (host-side, so no per-layer sync)."""
        for start in range(0, tokens.shape[1], chunk):
            piece = tokens[:, start:start + chunk]
            dense = DenseAttention(max_len=start_len + start + piece.shape[1])
            self.forward(piece, cache, dense, last_only=True)


def equal_runs(values: list[int]) -> list[tuple[int, int]]:
    """[start, stop) of each run of equal neighbouring values: [3, 3, 5, 3] -> (0, 2), (2, 3),
    (3, 4)."""
    runs: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            runs.append((start, i))
            start = i
    return runs


# ---- CUDA graphs -------------------------------------------------------------------------


def capture_cuda_graph(body: Callable[[], Any], *, warm: Callable[[], Any] | None = None,
                       warmup: int = 1, pool: Any = None) -> tuple[Any, Any]:
    """(graph, what `body` returned while captured: its static outputs).

    `warm` (default: `body`) runs `warmup` times on a side stream first: Triton compilation /
    autotuning and cuBLAS handle creation must happen outside a capture."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            (warm or body)()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = body()
    return graph, out


class GraphedForward:
    """A CUDA graph of `model.forward` for fixed (batch, n_query), replayed per step.

    Static inputs: `tokens` (a buffer copied into each call), the cache tensors and everything
    the policy reads (the policy must keep its tensors at fixed addresses and take no host
    decisions that change between steps). Each replay advances cache.lens by n_query, as an
    eager forward does. CUDA only; warm-up runs on a side stream, then the cache's lens are
    restored (the K/V written during warm-up lie beyond lens and are ignored).
    """

    def __init__(
        self, model: Transformer, cache: KVCache, policy: AttentionPolicy | None, batch: int,
        n_query: int, *, last_only: bool = False, pool: Any = None, warmup: int = 2,
    ):
        if model.device.type != "cuda":
            raise UserInputError("CUDA graphs need a CUDA model", fix="use device='cuda' or run eagerly")
        if cache.batch != batch:
            raise UserInputError(f"cache batch {cache.batch} != graph batch {batch}",
                                 fix="capture the graph at the cache's batch")
        self.model, self.cache = model, cache
        self.policy = policy if policy is not None else DenseAttention()
        self.tokens = torch.zeros(batch, n_query, dtype=torch.long, device=model.device)
        saved = cache.lens.clone()

        def forward() -> Tensor:
            return model.forward(self.tokens, cache, self.policy, last_only)

        def warm() -> None:
            forward()
            cache.lens.copy_(saved)

        self.graph, self.logits = capture_cuda_graph(forward, warm=warm, warmup=warmup,
                                                     pool=pool)
        cache.lens.copy_(saved)  # capture does not execute, but keep lens exact regardless
        self.pool = self.graph.pool()
        self.collectives = model.captured_collectives()  # counted again at every replay

    def __call__(self, tokens: Tensor) -> Tensor:
        """tokens [batch, n_query] -> logits (a static buffer: clone it to keep it)."""
        self.tokens.copy_(tokens, non_blocking=True)
        self.graph.replay()
        self.model.replayed(self.collectives)
        return self.logits
