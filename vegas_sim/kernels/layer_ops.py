"""The runtime's per-layer glue as three fused kernels: add + RMSNorm, SiLU·mul, and
q/k-norm + RoPE + K/V append.

Why: in torch these are ~58 small kernels per layer (RMSNorm alone is eight: cast, pow, mean,
add, rsqrt, mul, cast, mul), and a graphed decode step spent a large share of its time in them
and between them; a draft step pays the same beside a much smaller attention (docs/KERNELS.md,
Layer ops). Fused, a layer is 3 + 4 GEMMs + attention.

Numerics follow `reference` step by step, roundings included: the residual sum is rounded to
the model dtype before it is normed, the normed row is rounded before the weight multiplies,
SiLU's result is rounded before the multiply by `up`, RoPE runs in fp32 on the rounded normed
q/k. What can differ from torch is the order of the fp32 sum of squares (and rsqrt's last bit).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from vegas_sim.kernels.verify_launch import next_pow2

SILU_BLOCK = 1024  # elements of one SiLU·mul program


@triton.jit
def _add_rms_norm_kernel(X, DELTA, W, Y, X_SUM, H, eps, HAS_DELTA: tl.constexpr,
                         BLOCK_H: tl.constexpr):
    """One row of [M, H]: X_SUM = X + DELTA (rounded), Y = rms_norm(X_SUM) · W."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_H)
    ok = offs < H
    x = tl.load(X + row * H + offs, mask=ok, other=0.0)
    if HAS_DELTA:
        d = tl.load(DELTA + row * H + offs, mask=ok, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(X_SUM.dtype.element_ty)
        tl.store(X_SUM + row * H + offs, x, mask=ok)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / H + eps)
    normed = (xf * inv).to(Y.dtype.element_ty).to(tl.float32)
    w = tl.load(W + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + row * H + offs, (normed * w).to(Y.dtype.element_ty), mask=ok)


@triton.jit
def _silu_mul_kernel(GU, OUT, F, BLOCK: tl.constexpr):
    """OUT[row, j] = silu(GU[row, j]) · GU[row, F + j] for one block of j."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < F
    g = tl.load(GU + row * 2 * F + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(GU + row * 2 * F + F + offs, mask=ok, other=0.0).to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(OUT.dtype.element_ty).to(tl.float32)
    tl.store(OUT + row * F + offs, (silu * u).to(OUT.dtype.element_ty), mask=ok)


@triton.jit
def _rms_rows(x1, x2, W, eps, D: tl.constexpr, HALF: tl.constexpr):
    """Per-head RMSNorm of one head split in halves x1, x2 [HALF] fp32, rounded like torch
    to the weight's dtype (the model's)."""
    offs = tl.arange(0, HALF)
    inv = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / D + eps)
    dt = W.dtype.element_ty
    w1 = tl.load(W + offs).to(tl.float32)
    w2 = tl.load(W + HALF + offs).to(tl.float32)
    y1 = ((x1 * inv).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
    y2 = ((x2 * inv).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
    return y1, y2


@triton.jit
def _qkv_rope_append_kernel(
    QKV, QN, KN, COS, SIN, LENS, Q_OUT, K_CACHE, V_CACHE,
    NQ, HQ, HKV, eps, stride_kb, stride_ks,
    D: tl.constexpr, HALF: tl.constexpr, QK_NORM: tl.constexpr,
):
    """One (token, head) of the fused projection: head h < HQ is q (normed, rotated, to Q_OUT),
    HQ <= h < HQ + HKV is k (normed, rotated, to K_CACHE at the token's position), the rest v
    (copied to V_CACHE). Token t = b·NQ + i sits at position LENS[b] + i."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    b = t // NQ
    pos = (tl.load(LENS + b) + t % NQ).to(tl.int64)
    offs = tl.arange(0, HALF)
    src = QKV + t.to(tl.int64) * (HQ + 2 * HKV) * D + h * D
    x1 = tl.load(src + offs)
    x2 = tl.load(src + HALF + offs)
    slot = b.to(tl.int64) * stride_kb + pos * stride_ks  # the token's row of a [S, Hkv, D] cache
    if h < HQ + HKV:
        f1 = x1.to(tl.float32)
        f2 = x2.to(tl.float32)
        if QK_NORM:
            if h < HQ:
                f1, f2 = _rms_rows(f1, f2, QN, eps, D, HALF)
            else:
                f1, f2 = _rms_rows(f1, f2, KN, eps, D, HALF)
        c = tl.load(COS + pos * HALF + offs)
        s = tl.load(SIN + pos * HALF + offs)
        dt = Q_OUT.dtype.element_ty
        y1 = (f1 * c - f2 * s).to(dt)
        y2 = (f2 * c + f1 * s).to(dt)
        if h < HQ:
            dst = Q_OUT + (t.to(tl.int64) * HQ + h) * D
        else:
            dst = K_CACHE + slot + (h - HQ) * D
        tl.store(dst + offs, y1)
        tl.store(dst + HALF + offs, y2)
    else:
        dst = V_CACHE + slot + (h - HQ - HKV) * D
        tl.store(dst + offs, x1)
        tl.store(dst + HALF + offs, x2)


def _rows(x: Tensor) -> tuple[Tensor, int]:
    """x as a contiguous [M, H] matrix, and H."""
    H = x.shape[-1]
    return x.reshape(-1, H).contiguous(), H


def add_rms_norm(x: Tensor, delta: Tensor | None, weight: Tensor, eps: float
                 ) -> tuple[Tensor, Tensor]:
    """(RMSNorm(x + delta) · weight, x + delta) in one launch: one program per row [..., H]."""
    x2d, H = _rows(x)
    delta2d = _rows(delta)[0] if delta is not None else x2d
    normed = torch.empty_like(x2d)
    total = torch.empty_like(x2d) if delta is not None else x2d
    block = next_pow2(H)
    if x2d.shape[0] > 0:
        _add_rms_norm_kernel[(x2d.shape[0],)](
            x2d, delta2d, weight, normed, total, H, eps, HAS_DELTA=delta is not None,
            BLOCK_H=block, num_warps=max(1, min(16, block // 512)),
        )
    return normed.view(x.shape), total.view(x.shape)


def silu_mul(gate_up: Tensor) -> Tensor:
    """silu(gate) · up of gate_up [..., 2F] (gate | up) -> [..., F]."""
    gu, two_f = _rows(gate_up)
    F = two_f // 2
    out = torch.empty(gu.shape[0], F, dtype=gu.dtype, device=gu.device)
    if gu.shape[0] > 0:
        _silu_mul_kernel[(gu.shape[0], triton.cdiv(F, SILU_BLOCK))](
            gu, out, F, BLOCK=SILU_BLOCK, num_warps=4)
    return out.view(*gate_up.shape[:-1], F)


def qkv_rope_append(
    qkv: Tensor, n_heads: int, q_norm: Tensor | None, k_norm: Tensor | None, eps: float,
    cos_table: Tensor, sin_table: Tensor, cache_lens: Tensor, k_cache: Tensor, v_cache: Tensor,
) -> Tensor:
    """One launch, one program per (token, head): q [B, NQ, Hq, D] out, k and v into the cache
    (see reference.qkv_rope_append)."""
    B, NQ, _ = qkv.shape
    Hkv, D = k_cache.shape[2], k_cache.shape[3]
    qkv = qkv.contiguous()
    q = torch.empty(B, NQ, n_heads, D, dtype=qkv.dtype, device=qkv.device)
    qn = q_norm if q_norm is not None else qkv  # unread without QK_NORM
    kn = k_norm if k_norm is not None else qkv
    if B * NQ > 0:
        _qkv_rope_append_kernel[(B * NQ, n_heads + 2 * Hkv)](
            qkv, qn, kn, cos_table, sin_table, cache_lens, q, k_cache, v_cache,
            NQ, n_heads, Hkv, eps, k_cache.stride(0), k_cache.stride(1),
            D=D, HALF=D // 2, QK_NORM=q_norm is not None and k_norm is not None, num_warps=1,
        )
    return q
