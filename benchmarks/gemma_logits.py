"""Gemma-3-270M in our runtime against transformers' Gemma3ForCausalLM on the same GGUF (CPU,
fp32): logits of a short prompt and of a 700-token book window (past the 512-key window of
the local layers), the window prefilled then decoded token by token, and the same model with
its window ignored as a control.

    pip install --target /tmp/tf --no-deps transformers safetensors typer kernels accelerate
    PYTHONPATH=/tmp/tf:. VEGAS_SIM_GEMMA3_GGUF=gemma-3-270m-q4_k_m.gguf \\
        python -P benchmarks/gemma_logits.py

transformers is no dependency of the package; it is used here only as the reference (-P keeps
benchmarks/ off the path: benchmarks/kernels.py would shadow the `kernels` package it imports).
"""

from __future__ import annotations

import argparse

import torch

from vegas_sim.calibrate.loading import gemma3_gguf_path, load_model
from vegas_sim.calibrate.runtime import Layer, Transformer
from vegas_sim.calibrate.workloads import book_body, default_datasets_dir

SHORT = ("The capital of France is Paris. The capital of Germany is Berlin. "
         "The capital of Italy is")
BOOK = "pg84_frankenstein.txt"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--long", type=int, default=700, help="tokens of the book window")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM  # the reference, imported only here

    path = gemma3_gguf_path()
    model, tok, _ = load_model(str(path), weights="real", device="cpu", dtype=torch.float32)
    assert tok is not None
    ref = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                               torch_dtype=torch.float32).eval()
    text = book_body(default_datasets_dir() / "gutenberg" / BOOK)[20000:32000]
    for name, ids in (("short", tok.encode(SHORT, add_bos=True)),
                      ("book", tok.encode(text, add_bos=True)[:args.long])):
        with torch.no_grad():
            want = ref(torch.tensor([ids])).logits[0].float()  # [T, V]
        got = model.forward(torch.tensor([ids]), model.new_cache(1, len(ids) + 8))[0]
        diff = (got - want).abs()
        agree = float((got.argmax(-1) == want.argmax(-1)).float().mean())
        print(f"{name}: {len(ids)} tokens, max |logit diff| {diff.max():.3g} "
              f"(max |logit| {want.abs().max():.3g}), greedy argmax agree {agree:.4f}")
        if len(ids) > model.spec.sliding_window:
            _past_the_window(model, ids, want)


def _past_the_window(model: Transformer, ids: list[int], want: torch.Tensor) -> None:
    """Rows past the window, prefill-then-decode, and the control without a window."""
    window = model.spec.sliding_window
    n = len(ids)
    cache = model.new_cache(1, n + 8)
    model.prefill([torch.tensor(ids[:n - 50])], cache)
    steps = torch.stack([model.forward(torch.tensor([[t]]), cache)[0, 0] for t in ids[n - 50:]])
    whole = model.forward(torch.tensor([ids]), model.new_cache(1, n + 8))[0]
    print(f"  rows past {window}: max diff {(whole - want)[window:].abs().max():.3g}; "
          f"prefill {n - 50} + 50 decode steps: {(steps - want[n - 50:]).abs().max():.3g}")
    layers = [layer for layer in model.layers if isinstance(layer, Layer)]
    for layer in layers:
        layer.window = 0  # control: every layer global
    blind = model.forward(torch.tensor([ids]), model.new_cache(1, n + 8))[0]
    print(f"  control, window ignored: rows past {window} max diff "
          f"{(blind - want)[window:].abs().max():.3g}")
    for i, layer in enumerate(layers):
        layer.window = window if i in model.spec.window_layers else 0


if __name__ == "__main__":
    main()
