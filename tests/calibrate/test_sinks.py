"""Attention sinks on gpt-oss's full-attention layers (CPU): every policy the runtime can hand a
full layer computes the model's softmax with the sink column, the runtime passes each layer's
sinks, and every method stays greedy-lossless with strong sinks."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import Tensor

from vegas_sim.calibrate.policies import (
    CollectingVerifyAttention,
    QuestDraftAttention,
    SparseDraftAttention,
)
from vegas_sim.calibrate.runtime import AttentionPolicy, DenseAttention, Layer, Transformer
from vegas_sim.kernels import ops
from vegas_sim.methods import QUEST_PAGE, SPEC_METHODS

from .test_moe import _hybrid_model, assert_greedy_lossless

FULL = 1  # the hybrid test model's full-attention layer (0 and 2 are sliding-window)


def _layer(model: Transformer, i: int) -> Layer:
    layer = model.layers[i]
    assert isinstance(layer, Layer)
    return layer


def _strong_sinks(model: Transformer, seed: int) -> None:
    """Sinks ~ N(0, 2²) on every layer, one head per layer at +4 (most of its mass on the sink)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for i in range(model.spec.n_layers):
            layer = _layer(model, i)
            assert layer.sinks is not None
            layer.sinks.copy_(torch.randn(layer.sinks.shape, generator=gen) * 2.0)
            layer.sinks[0] = 4.0


def dense_with_sink_column(q: Tensor, k: Tensor, v: Tensor, lens: list[int], scale: float,
                           sinks: Tensor | None) -> Tensor:
    """fp64 causal attention of q [B, NQ, Hq, D] over k/v [B, S, Hkv, D]: per row and head a
    softmax over [scale·q·k of keys 0..p, sink_h], the sink's share dropped (it has no value)."""
    B, NQ, Hq, _D = q.shape
    group = Hq // k.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(B):
        for i in range(NQ):
            p = lens[b] - NQ + i
            for h in range(Hq):
                kk, vv = k[b, : p + 1, h // group].double(), v[b, : p + 1, h // group].double()
                logits = kk @ q[b, i, h].double() * scale
                if sinks is not None:
                    logits = torch.cat([logits, sinks[h:h + 1].double()])
                out[b, i, h] = torch.softmax(logits, 0)[: p + 1] @ vv
    return out


def _policies(n_layers: int, batch: int, s_max: int, nq: int, lens: Tensor, hq: int,
              k: Tensor) -> dict[str, AttentionPolicy]:
    """Every policy a full layer may get, set up to attend all keys (sparse: everything
    selected; Quest: every page) so that each must equal dense attention."""
    dev = k.device
    out: dict[str, AttentionPolicy] = {
        "dense-sdpa": DenseAttention(), "dense-kernel": DenseAttention(use_kernel=True)}
    for collect, kw in (("none", {}), ("first_last", {"n_heads": hq}),
                        ("all", {"per_row": True, "max_rows": nq})):
        verify = CollectingVerifyAttention(n_layers, batch, s_max, dev, collect,
                                           fold_layer=FULL, **kw)  # type: ignore[arg-type]
        verify.rank_len.copy_(lens - nq + 1)
        out[f"verify-{collect}"] = verify
    if nq == 1:
        sparse = SparseDraftAttention(n_layers, batch, s_max, dev, shared=False)
        tail = lens - 3  # 3 tail keys, everything before them selected
        idx = torch.arange(s_max, dtype=torch.int32, device=dev).repeat(n_layers, batch, 1)
        sparse.set(idx.masked_fill(idx >= tail[None, :, None], -1), tail, tail)
        out["sparse-draft"] = sparse
        pages = s_max // QUEST_PAGE
        kmin = torch.zeros(n_layers, batch, pages, *k.shape[2:], device=dev, dtype=k.dtype)
        kmax = torch.zeros_like(kmin)
        ops.quest_update_meta(kmin[FULL], kmax[FULL], k, torch.zeros_like(lens), lens)
        quest = QuestDraftAttention(kmin, kmax, batch, dev)
        quest.set(lens - 1, torch.full((batch,), pages, dtype=torch.int32, device=dev))
        out["quest-draft"] = quest
    return out


def check_full_layer(nq: int, device: str, dtype: torch.dtype, tol: float) -> None:
    """Layer.attend of the full layer, through each policy, against the fp64 dense
    reference with the sink column; dropping the sinks (even zero ones) would be caught."""
    model = _hybrid_model(seed=3)
    _strong_sinks(model, seed=4)
    s = model.spec
    layer = _layer(model, FULL)
    layer.to(device=device, dtype=dtype)  # the sinks in the model's dtype, as at run time
    assert layer.window == 0 and layer.sinks is not None
    gen = torch.Generator().manual_seed(nq)
    B, S = 2, 48
    lens_l = [48, 29]
    lens = torch.tensor(lens_l, dtype=torch.int32, device=device)
    q, k, v = (torch.randn(B, n, h, s.head_dim, generator=gen).to(device, dtype)
               for n, h in ((nq, s.n_heads), (S, s.n_kv_heads), (S, s.n_kv_heads)))
    q_, k_, v_, sinks = (t.cpu() for t in (q, k, v, layer.sinks))
    want = dense_with_sink_column(q_, k_, v_, lens_l, model.scale, sinks)
    plain = dense_with_sink_column(q_, k_, v_, lens_l, model.scale, None)
    zero = dense_with_sink_column(q_, k_, v_, lens_l, model.scale, torch.zeros(s.n_heads))
    assert (want - plain).abs().max() > 0.05 and (zero - plain).abs().max() > 0.01
    for name, policy in _policies(s.n_layers, B, S, nq, lens, s.n_heads, k).items():
        if nq > 16 and name != "dense-sdpa":
            continue  # the kernels take at most 16 rows; longer chunks are prefill (SDPA)
        got = layer.attend(FULL, q, k, v, lens, model.scale, policy)
        err = float((got.cpu().double() - want).abs().max())
        assert err < tol, (name, err)


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("nq", [1, 5, 20])
def test_full_attention_layer_with_sinks_equals_dense_softmax_with_a_sink_column(
    nq: int, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if backend == "triton":
        pytest.importorskip("triton")  # under TRITON_INTERPRET=1 (tests/conftest.py)
    monkeypatch.setenv("VEGAS_SIM_KERNELS", backend)
    check_full_layer(nq, "cpu", torch.float32, 1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("nq", [1, 12, 20])
def test_full_attention_layer_with_sinks_gpu(nq: int) -> None:
    """The same on CUDA in bf16: Triton kernels, and SDPA (with the sink key) for 20 rows."""
    check_full_layer(nq, "cuda", torch.bfloat16, 3e-2)


def test_collected_weights_are_normalised_with_the_sink() -> None:
    """Vegas's weights (first_last, mean over rows and heads) with sinks: each row and head
    puts 1 − p_sink on the keys, so the weights sum to less than without sinks."""
    model = _hybrid_model(seed=3)
    _strong_sinks(model, seed=4)
    s, layer = model.spec, _layer(model, FULL)
    gen = torch.Generator().manual_seed(9)
    B, S, nq = 2, 48, 5
    lens = torch.tensor([48, 29], dtype=torch.int32)
    q = torch.randn(B, nq, s.n_heads, s.head_dim, generator=gen)
    k = torch.randn(B, S, s.n_kv_heads, s.head_dim, generator=gen)
    v = torch.randn(B, S, s.n_kv_heads, s.head_dim, generator=gen)
    sums = []
    for sinks in (layer.sinks, None):
        verify = CollectingVerifyAttention(s.n_layers, B, S, torch.device("cpu"), "first_last",
                                           n_heads=s.n_heads, fold_layer=FULL)
        verify.rank_len.copy_(lens)
        verify.attend(FULL, q, k, v, lens, model.scale, sinks)
        sums.append(verify.weights[FULL].sum(-1))
    with_sinks, without = sums
    torch.testing.assert_close(without, torch.ones(B), rtol=2e-2, atol=0)
    assert bool((with_sinks < without - 0.05).all())


class _Spy:
    """A dense policy that records which layers asked it, with which sinks."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, Tensor | None]] = []

    def attend(self, layer: int, q: Tensor, k_cache: Tensor, v_cache: Tensor,
               cache_lens: Tensor, scale: float, sinks: Tensor | None = None) -> Tensor:
        self.calls.append((layer, sinks))
        return DenseAttention().attend(layer, q, k_cache, v_cache, cache_lens, scale, sinks)


def test_runtime_hands_each_full_layer_its_sinks() -> None:
    model = _hybrid_model(seed=5)
    spy = _Spy()
    cache = model.new_cache(1, 64)
    model.forward(torch.arange(3, 20)[None], cache, spy)  # type: ignore[arg-type]
    assert [layer for layer, _ in spy.calls] == [FULL]
    assert spy.calls[0][1] is _layer(model, FULL).sinks
    plain = Transformer(dataclasses.replace(model.spec, attention_sinks=False), None, seed=0)
    spy = _Spy()
    plain.forward(torch.arange(3, 20)[None], plain.new_cache(1, 64), spy)  # type: ignore[arg-type]
    assert spy.calls == [(FULL, None)]  # models without sinks pass None


@pytest.mark.parametrize("method", SPEC_METHODS)
def test_greedy_lossless_with_strong_sinks(method: str) -> None:
    """Every method emits vanilla's greedy tokens on the tiny hybrid model with strong sinks
    (draft and verify both see the sinks on the full layer); drafts are accepted and
    rejected."""
    model = _hybrid_model(seed=2)
    _strong_sinks(model, seed=6)
    assert_greedy_lossless(model, method)
