"""Hugging Face checkpoints of mixture-of-experts models: Qwen3-MoE (`qwen3_moe`) and gpt-oss
(`gpt_oss`), config keys -> ModelSpec and tensor names <-> the runtime's (weights.py calls in).

Our per-layer names beyond the dense ones (runtime.Layer): router [E, H] (+ brouter [E]),
w13 [E, 2F, H] (gate | up rows per expert, + b13 [E, 2F]), w2 [E, H, F] (+ b2 [E, H]),
bo [H] (output-projection bias), sinks [Hq].

- Qwen3-MoE: mlp.gate.weight (the router), mlp.experts.{e}.{gate,up,down}_proj.weight; every
  layer sparse (decoder_sparse_step 1, no mlp_only_layers) and norm_topk_prob true, or refused.
- gpt-oss: mlp.router.{weight,bias}; mlp.experts.gate_up_proj [E, H, 2F] with gate and up
  interleaved along the last axis (columns 0, 2, ... gate; 1, 3, ... up) and its bias
  [E, 2F]; mlp.experts.down_proj [E, F, H] and bias [E, H]; self_attn.sinks [Hq];
  layer_types names the sliding-window layers. The official openai/gpt-oss-20b ships its
  experts in MXFP4 (quantization_config.quant_method "mxfp4"): gate_up_proj_blocks
  [E, 2F, H/32, 16] uint8 (two e2m1 codes a byte, low nibble first) with gate_up_proj_scales
  [E, 2F, H/32] (e8m0: 2^(s − 127) per 32 values), down_proj_blocks / _scales likewise over F.
  They are dequantised on load (`dequantize_mxfp4`) into the bf16 layout, so the runtime runs
  them in bf16 (the MXFP4 latency is a what-if, `--weight-format mxfp4`). Other quantisation
  methods are refused.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from vegas_sim.errors import UserInputError
from vegas_sim.models import ModelSpec

MOE_ARCHITECTURES = ("qwen3_moe", "gpt_oss")
# the 16 values of an OCP MX e2m1 (FP4) code: sign bit 3, exponent bits 2-1, mantissa bit 0
FP4_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
E8M0_BIAS = 127
_HF_CLASS = {"qwen3_moe": "Qwen3MoeForCausalLM", "gpt_oss": "GptOssForCausalLM"}


def hf_moe_fields(config: dict[str, Any], where: str) -> dict[str, Any]:
    """The ModelSpec fields a qwen3_moe / gpt_oss config.json adds to the dense ones."""
    arch = str(config["model_type"])
    quant = (config.get("quantization_config") or {}).get("quant_method")
    if quant is not None and not (arch == "gpt_oss" and quant == "mxfp4"):
        raise UserInputError(
            f"the checkpoint's weights are quantised ({quant}); only gpt-oss's MXFP4 experts "
            "are dequantised on load", where=where,
            fix="use a bf16 checkpoint of the model, or the preset with random weights for "
                "latency")
    if arch == "qwen3_moe":
        if int(config.get("decoder_sparse_step", 1)) != 1 or config.get("mlp_only_layers"):
            raise UserInputError("dense MLP layers between MoE layers are not supported",
                                 where=where, fix="use a model whose every layer is MoE")
        if not config.get("norm_topk_prob", True):
            raise UserInputError("norm_topk_prob false is not supported", where=where,
                                 fix="the runtime renormalises the top-k router weights")
        return {"n_experts": int(config["num_experts"]),
                "experts_per_token": int(config["num_experts_per_tok"]),
                "expert_ffn": int(config["moe_intermediate_size"]), "qk_norm": True}
    kinds = list(config.get("layer_types") or [])
    n_layers = int(config["num_hidden_layers"])
    if kinds and len(kinds) != n_layers:
        raise UserInputError(f"layer_types has {len(kinds)} entries for {n_layers} layers",
                             where=where, fix="use the checkpoint's original config.json")
    bias = bool(config.get("attention_bias", True))
    return {
        "n_experts": int(config["num_local_experts"]),
        "experts_per_token": int(config.get("num_experts_per_tok")
                                 or config["experts_per_token"]),
        "expert_ffn": int(config["intermediate_size"]),
        "sliding_window": int(config.get("sliding_window") or 0),
        "window_layers": tuple(i for i, k in enumerate(kinds) if k == "sliding_attention"),
        "attention_sinks": True, "qkv_bias": bias, "o_bias": bias, "moe_bias": True,
        "moe_activation": "gpt_oss", "qk_norm": False,
    }


def checkpoint_tensor(hf: dict[str, Tensor], name: str, where: str) -> Tensor:
    """The tensor `name` of a Hugging Face checkpoint, or an error naming the missing one."""
    if name not in hf:
        raise UserInputError(f"checkpoint lacks tensor {name!r}", where=where,
                             fix="check that all *.safetensors shards are in the directory")
    return hf[name]


def hf_moe_to_ours(spec: ModelSpec, hf: dict[str, Tensor], where: str) -> dict[str, Tensor]:
    """Per-layer MoE tensors (and gpt-oss's o bias and sinks) in our names."""
    def get(name: str) -> Tensor:
        return checkpoint_tensor(hf, name, where)

    out: dict[str, Tensor] = {}
    for i in range(spec.n_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        if spec.architecture == "qwen3_moe":
            out[q + "router"] = get(p + "mlp.gate.weight")
            ex = [p + f"mlp.experts.{e}." for e in range(spec.n_experts)]
            out[q + "w13"] = torch.stack([torch.cat([get(x + "gate_proj.weight"),
                                                     get(x + "up_proj.weight")]) for x in ex])
            out[q + "w2"] = torch.stack([get(x + "down_proj.weight") for x in ex])
            continue
        if spec.o_bias:
            out[q + "bo"] = get(p + "self_attn.o_proj.bias")
        out[q + "sinks"] = get(p + "self_attn.sinks")
        out[q + "router"], out[q + "brouter"] = get(p + "mlp.router.weight"), get(
            p + "mlp.router.bias")
        gu = _expert_weight(hf, p + "mlp.experts.gate_up_proj", where)  # [E, H, 2F]
        gub = get(p + "mlp.experts.gate_up_proj_bias")
        out[q + "w13"] = torch.cat([gu[..., ::2], gu[..., 1::2]], dim=-1).transpose(1, 2)
        out[q + "b13"] = torch.cat([gub[..., ::2], gub[..., 1::2]], dim=-1)
        out[q + "w2"] = _expert_weight(hf, p + "mlp.experts.down_proj", where).transpose(1, 2)
        out[q + "b2"] = get(p + "mlp.experts.down_proj_bias")
    return out


def _expert_weight(hf: dict[str, Tensor], name: str, where: str) -> Tensor:
    """gpt-oss's stacked expert weight `name` in the bf16 checkpoint layout [E, in, out]: the
    tensor itself, or its MXFP4 `_blocks` / `_scales` ([E, out, in/32, 16], [E, out, in/32])
    dequantised."""
    if name in hf or name + "_blocks" not in hf:
        return checkpoint_tensor(hf, name, where)
    blocks = hf[name + "_blocks"]
    scales = checkpoint_tensor(hf, name + "_scales", where)
    if blocks.dtype != torch.uint8 or blocks.dim() != 4 or blocks.shape[-1] != 16 \
            or tuple(scales.shape) != tuple(blocks.shape[:-1]):
        raise UserInputError(
            f"{name}_blocks {tuple(blocks.shape)} {blocks.dtype} and _scales "
            f"{tuple(scales.shape)} are not MXFP4 blocks [E, out, in/32, 16] uint8 with scales "
            "[E, out, in/32]", where=where, fix="use the checkpoint's original safetensors")
    return torch.stack([dequantize_mxfp4(b, s) for b, s in zip(blocks, scales, strict=True)]
                       ).transpose(1, 2)


def dequantize_mxfp4(blocks: Tensor, scales: Tensor, dtype: torch.dtype = torch.bfloat16
                     ) -> Tensor:
    """blocks uint8 [..., G, 16] (32 e2m1 codes, low nibble first), scales uint8 [..., G]
    (e8m0) -> [..., G·32]: code value · 2^(scale − 127), exact in fp32 (bf16 holds every
    e2m1 value times a power of two in its range)."""
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).reshape(*blocks.shape[:-1], 32)
    values = torch.tensor(FP4_E2M1, dtype=torch.float32)[codes.long()]  # [..., G, 32]
    exponent = scales.to(torch.int32)[..., None] - E8M0_BIAS
    return torch.ldexp(values, exponent).reshape(*blocks.shape[:-2], -1).to(dtype)


def ours_to_hf_moe(spec: ModelSpec, ours: dict[str, Tensor]) -> dict[str, Tensor]:
    """The inverse of `hf_moe_to_ours` (for writing checkpoints)."""
    hf: dict[str, Tensor] = {}
    f = spec.expert_ffn
    for i in range(spec.n_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        if spec.architecture == "qwen3_moe":
            hf[p + "mlp.gate.weight"] = ours[q + "router"]
            for e in range(spec.n_experts):
                gate, up = ours[q + "w13"][e].split([f, f])
                x = p + f"mlp.experts.{e}."
                hf[x + "gate_proj.weight"], hf[x + "up_proj.weight"] = gate, up
                hf[x + "down_proj.weight"] = ours[q + "w2"][e]
            continue
        if spec.o_bias:
            hf[p + "self_attn.o_proj.bias"] = ours[q + "bo"]
        hf[p + "self_attn.sinks"] = ours[q + "sinks"]
        hf[p + "mlp.router.weight"], hf[p + "mlp.router.bias"] = ours[q + "router"], ours[
            q + "brouter"]
        hf[p + "mlp.experts.gate_up_proj"] = _interleave(ours[q + "w13"].transpose(1, 2), f)
        hf[p + "mlp.experts.gate_up_proj_bias"] = _interleave(ours[q + "b13"], f)
        hf[p + "mlp.experts.down_proj"] = ours[q + "w2"].transpose(1, 2)
        hf[p + "mlp.experts.down_proj_bias"] = ours[q + "b2"]
    return {k: v.contiguous() for k, v in hf.items()}


def _interleave(gate_up: Tensor, f: int) -> Tensor:
    """[..., 2F] gate | up -> [..., 2F] with gate at even and up at odd columns."""
    gate, up = gate_up[..., :f], gate_up[..., f:]
    return torch.stack([gate, up], dim=-1).reshape(gate_up.shape)


def hf_moe_config(spec: ModelSpec) -> dict[str, Any]:
    """The config.json keys a qwen3_moe / gpt_oss checkpoint adds to the dense ones."""
    cfg: dict[str, Any] = {"architectures": [_HF_CLASS[spec.architecture]],
                           "num_experts_per_tok": spec.experts_per_token}
    if spec.architecture == "qwen3_moe":
        cfg.update(num_experts=spec.n_experts, moe_intermediate_size=spec.expert_ffn,
                   norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
        return cfg
    cfg.update(num_local_experts=spec.n_experts, experts_per_token=spec.experts_per_token,
               intermediate_size=spec.expert_ffn, sliding_window=spec.sliding_window,
               attention_bias=spec.qkv_bias,
               layer_types=["sliding_attention" if spec.layer_kind(i) == "window"
                            else "full_attention" for i in range(spec.n_layers)])
    return cfg
