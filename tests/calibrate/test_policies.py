"""CollectingVerifyAttention: Vegas's batched fold (every layer's scores, one score_weights
after the last layer) gives the weights and outputs of the per-layer fold."""

from __future__ import annotations

import pytest
import torch

from vegas_sim.calibrate.policies import CollectingVerifyAttention


def forward(policy: CollectingVerifyAttention, shape: tuple[int, ...], nq: int, seed: int,
            dev: torch.device) -> list[torch.Tensor]:
    """One pass over the layers, as runtime.Transformer calls attend; outputs per layer."""
    L, B, Hq, Hkv, D, S = shape
    gen = torch.Generator().manual_seed(seed)
    lens = torch.tensor([S, 37] + [S // 2] * (B - 2), dtype=torch.int32, device=dev)
    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
    outs = []
    for layer in range(L):
        q = torch.randn(B, nq, Hq, D, generator=gen).to(dev, dtype)
        k = torch.randn(B, S, Hkv, D, generator=gen).to(dev, dtype)
        v = torch.randn(B, S, Hkv, D, generator=gen).to(dev, dtype)
        outs.append(policy.attend(layer, q, k, v, lens, D ** -0.5))
    return outs


def check_fold(shape: tuple[int, ...], dev: torch.device, score_format: str = "bf16") -> None:
    L, B, Hq, _Hkv, _D, S = shape
    batched = CollectingVerifyAttention(L, B, S, dev, "first_last", n_heads=Hq,
                                        score_format=score_format)
    per_layer = CollectingVerifyAttention(L, B, S, dev, "first_last", score_format=score_format)
    assert batched.all_scores.numel() == L * B * 2 * Hq * S and per_layer.all_scores.numel() == 0
    assert batched.all_scores.element_size() == (1 if score_format == "fp8" else 2)
    rank = torch.tensor([S - 3, 30] + [S // 2] * (B - 2), device=dev)
    for policy in (batched, per_layer):
        policy.rank_len.copy_(rank)
    for nq, seed in ((5, 0), (1, 1), (8, 2)):  # R = 2, then R = 1 (prefill's one row), then 2
        got = forward(batched, shape, nq, seed, dev)
        want = forward(per_layer, shape, nq, seed, dev)
        for g, w in zip(got, want):
            assert torch.equal(g, w)
        assert torch.allclose(batched.weights, per_layer.weights, rtol=1e-6, atol=0)
        assert bool((batched.weights[:, 0, S - 3:] == 0).all())  # past rank_len
        assert bool((batched.weights[:, 1, :30] > 0).all())


@pytest.mark.parametrize("score_format", ["bf16", "fp8"])
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_fold_all_layers_equals_per_layer(backend: str, score_format: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    if backend == "triton":
        pytest.importorskip("triton")
    monkeypatch.setenv("VEGAS_SIM_KERNELS", backend)
    check_fold((3, 2, 4, 2, 16, 64), torch.device("cpu"), score_format)


@pytest.mark.parametrize("per_row", [False, True])
def test_fp8_weights_follow_the_bf16_weights(per_row: bool) -> None:
    """The same pass in both formats: the keys that carry weight keep it within e4m3's
    rounding (reference kernels, fp32 inputs)."""
    dev = torch.device("cpu")
    shape = (2, 3, 4, 2, 16, 96)
    L, B, Hq, _Hkv, _D, S = shape
    def make(score_format: str) -> CollectingVerifyAttention:
        if per_row:
            return CollectingVerifyAttention(L, B, S, dev, "all", per_row=True, max_rows=4,
                                             score_format=score_format)
        return CollectingVerifyAttention(L, B, S, dev, "first_last", n_heads=Hq,
                                         score_format=score_format)

    fp8, bf16 = make("fp8"), make("bf16")
    for policy in (fp8, bf16):
        policy.rank_len.fill_(30)
        forward(policy, shape, 4, 5, dev)
    w8, w16 = fp8.weights, bf16.weights
    big = w16 >= 1e-2 * w16.amax(-1, keepdim=True)
    top = w16.amax(-1, keepdim=True).expand_as(w8)
    assert big.sum() > 0 and (w8[~big] < 0.05 * top[~big]).all()
    assert ((w8[big] / w16[big] - 1).abs() < 0.15).all()
    assert bool((w8[..., 30:] == 0).all())


def test_spec_config_takes_the_score_format_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from vegas_sim.calibrate.spec_state import SpecConfig
    from vegas_sim.errors import UserInputError

    monkeypatch.delenv("VEGAS_SIM_SCORE_FORMAT", raising=False)
    assert SpecConfig("vegas", 4).score_format == "bf16"
    monkeypatch.setenv("VEGAS_SIM_SCORE_FORMAT", "fp8")
    assert SpecConfig("vegas", 4).score_format == "fp8"
    assert SpecConfig("vegas", 4, score_format="bf16").score_format == "bf16"
    monkeypatch.setenv("VEGAS_SIM_SCORE_FORMAT", "fp16")
    with pytest.raises(UserInputError, match="VEGAS_SIM_SCORE_FORMAT"):
        SpecConfig("vegas", 4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fold_all_layers_equals_per_layer_gpu() -> None:
    """Qwen3-8B attention heads, 4 layers, 3 requests, 8K slots, Triton kernels."""
    check_fold((4, 3, 32, 8, 128, 8192), torch.device("cuda"))


def test_per_row_and_all_rows_keep_the_per_layer_fold() -> None:
    dev = torch.device("cpu")
    assert CollectingVerifyAttention(3, 2, 64, dev, "all", n_heads=4).all_scores.numel() == 0
    spec = CollectingVerifyAttention(3, 2, 64, dev, "all", per_row=True, max_rows=8, n_heads=4)
    assert spec.all_scores.numel() == 0
