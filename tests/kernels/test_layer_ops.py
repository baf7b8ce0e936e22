"""The runtime's fused glue (kernels/layer_ops.py) against its torch reference: fp32 under the
CPU interpreter at small shapes, bf16 at Qwen3-8B's shapes on the GPU."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.conftest import HAS_CUDA
from vegas_sim.calibrate.runtime import rope_table
from vegas_sim.errors import UserInputError
from vegas_sim.kernels import ops, reference
from vegas_sim.models import get_preset

FP32 = {"atol": 1e-5, "rtol": 1e-5}


def _randn(*shape: int, gen: torch.Generator, device: str, dtype: torch.dtype = torch.float32
           ) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)


@pytest.mark.parametrize("hidden", [64, 48])  # 48: a row shorter than its power-of-two block
@pytest.mark.parametrize("with_delta", [True, False])
def test_add_rms_norm_matches_reference(hidden: int, with_delta: bool, device: str,
                                        use_triton: None, poison: None) -> None:
    gen = torch.Generator().manual_seed(hidden)
    x = _randn(2, 3, hidden, gen=gen, device=device)
    delta = _randn(2, 3, hidden, gen=gen, device=device) if with_delta else None
    w = _randn(hidden, gen=gen, device=device)
    normed, total = ops.add_rms_norm(x, delta, w, 1e-6)
    want_normed, want_total = reference.add_rms_norm(x, delta, w, 1e-6)
    torch.testing.assert_close(total, want_total, atol=0, rtol=0)
    torch.testing.assert_close(normed, want_normed, **FP32)
    assert normed.shape == x.shape


def test_silu_mul_matches_reference(device: str, use_triton: None, poison: None) -> None:
    gen = torch.Generator().manual_seed(1)
    gate_up = _randn(3, 2, 2 * 1100, gen=gen, device=device)  # F = 1100: two blocks, the 2nd cut
    torch.testing.assert_close(ops.silu_mul(gate_up), reference.silu_mul(gate_up), **FP32)


def _qkv_case(spec_name: str, B: int, NQ: int, S: int, device: str, dtype: torch.dtype,
              qk_norm: bool, seed: int) -> tuple[torch.Tensor, ...]:
    spec = get_preset(spec_name)
    gen = torch.Generator().manual_seed(seed)
    Hq, Hkv, D = spec.n_heads, spec.n_kv_heads, spec.head_dim
    qkv = _randn(B, NQ, (Hq + 2 * Hkv) * D, gen=gen, device=device, dtype=dtype)
    qn = _randn(D, gen=gen, device=device, dtype=dtype) if qk_norm else None
    kn = _randn(D, gen=gen, device=device, dtype=dtype) if qk_norm else None
    cos, sin = rope_table(spec, S, torch.device(device))
    lens = torch.tensor([S - NQ - 3 * b for b in range(B)], dtype=torch.int32, device=device)
    return qkv, qn, kn, cos, sin, lens


def _run_qkv(fn: object, case: tuple[torch.Tensor, ...], n_heads: int, Hkv: int, D: int,
             S: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    qkv, qn, kn, cos, sin, lens = case
    B = qkv.shape[0]
    # a cache with one request more, viewed from row 1 (the runtime's cache.requests view)
    k_all = torch.full((B + 1, S, Hkv, D), 7.0, dtype=qkv.dtype, device=qkv.device)
    v_all = torch.full_like(k_all, 7.0)
    q = fn(qkv, n_heads, qn, kn, 1e-6, cos, sin, lens, k_all[1:], v_all[1:])  # type: ignore[operator]
    return q, k_all, v_all


@pytest.mark.parametrize(("model", "NQ", "qk_norm"), [
    ("smollm2-135m", 3, False),  # Llama: GQA 9/3, D 64, no q/k norm
    ("qwen3-8b", 1, True),
    ("qwen3-8b", 2, True),
])
def test_qkv_rope_append_matches_reference(model: str, NQ: int, qk_norm: bool, device: str,
                                           use_triton: None, poison: None) -> None:
    spec = get_preset(model)
    S = 40
    case = _qkv_case(model, 2, NQ, S, device, torch.float32, qk_norm, seed=NQ)
    args = (spec.n_heads, spec.n_kv_heads, spec.head_dim, S)
    got = _run_qkv(ops.qkv_rope_append, case, *args)
    want = _run_qkv(reference.qkv_rope_append, case, *args)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **FP32)
    k_all = got[1]
    assert bool((k_all[0] == 7.0).all())  # the request outside the view is untouched
    written = torch.zeros(S, dtype=torch.bool)
    written[int(case[5][0]):int(case[5][0]) + NQ] = True
    assert bool((k_all[1, ~written.to(k_all.device)] == 7.0).all())  # only the new positions


def test_qkv_rope_append_rejects_a_projection_of_the_wrong_width() -> None:
    spec = get_preset("qwen3-8b")
    case = _qkv_case("qwen3-8b", 1, 1, 8, "cpu", torch.float32, True, seed=0)
    qkv = case[0][..., :-1]
    with pytest.raises(UserInputError, match="fused q|k|v"):
        _run_qkv(ops.qkv_rope_append, (qkv, *case[1:]), spec.n_heads, spec.n_kv_heads,
                 spec.head_dim, 8)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_layer_ops_gpu_qwen3_8b_shapes() -> None:
    """bf16 at Qwen3-8B's shapes (hidden 4096, FFN 12288, 32/8 heads of 128): the sums and the
    cache writes exact, normed rows within one bf16 rounding of the reference."""
    spec = get_preset("qwen3-8b")
    gen = torch.Generator().manual_seed(0)
    bf16 = torch.bfloat16
    x = _randn(4, 8, spec.hidden, gen=gen, device="cuda", dtype=bf16)
    delta = _randn(4, 8, spec.hidden, gen=gen, device="cuda", dtype=bf16)
    w = _randn(spec.hidden, gen=gen, device="cuda", dtype=bf16)
    normed, total = ops.add_rms_norm(x, delta, w, spec.rms_eps)
    want_normed, want_total = reference.add_rms_norm(x, delta, w, spec.rms_eps)
    assert torch.equal(total, want_total)
    torch.testing.assert_close(normed, want_normed, atol=2e-2, rtol=1.6e-2)
    gate_up = _randn(4, 8, 2 * spec.ffn, gen=gen, device="cuda", dtype=bf16)
    torch.testing.assert_close(ops.silu_mul(gate_up), reference.silu_mul(gate_up), atol=1e-2,
                               rtol=1.6e-2)
    S = 4096
    case = _qkv_case("qwen3-8b", 4, 8, S, "cuda", bf16, True, seed=5)
    args = (spec.n_heads, spec.n_kv_heads, spec.head_dim, S)
    got = _run_qkv(ops.qkv_rope_append, case, *args)
    want = _run_qkv(reference.qkv_rope_append, case, *args)
    for g, w_ in zip(got, want):
        torch.testing.assert_close(g, w_, atol=3e-2, rtol=1.6e-2)
    assert torch.equal(got[2], want[2])  # v is copied, not computed
