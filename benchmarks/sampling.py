"""Sampler benchmark on the GPU: the decoder's top-k slots against the dense layout.

One draft step (token_probs + a draw over [B] rows) and one acceptance (target token_probs
over [B, γ+1] rows, rejection test and residual draw), Qwen3 sampling (T 0.6, top-p 0.95,
top-k 20) on bf16 logits. "slots" is what the decoder runs (calibrate/sampling.py, runtime
revision 4); "dense" is the same distribution laid out over the vocabulary, drawn and
rejected there (the full-vocabulary passes of revision 3's draw and rejection). Both are timed
as CUDA-graph replays (host launch overhead excluded) with the default generator. Prints the
ms of each and their ratio, measured in this run.

    python benchmarks/sampling.py [--out benchmarks/results/sampling_h200.csv]

Nothing runs at import.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vegas_sim.calibrate.sampling import DenseProbs, rejection_accept, token_probs

SAMPLING = (0.6, 0.95, 20)  # Qwen3's temperature, top-p, top-k
# (vocabulary, batch, γ): Qwen3-8B at the paper's AIME25 batch and γ, a mid batch, gpt-oss's V
SHAPES = [(151936, 42, 8), (151936, 32, 4), (201088, 128, 4)]


def median_ms(fn: Callable[[], Any]) -> float:
    import triton.testing

    return float(triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median"))


def draft_step(logits: Any, dense: bool) -> Any:
    q = token_probs(logits, *SAMPLING)
    return (DenseProbs(q.dense()) if dense else q).draw(None)


def acceptance(drafts: Any, q: Any, p_logits: Any, dense: bool) -> Any:
    """q: the draft steps' distributions (not part of this phase's cost on the slots)."""
    p = token_probs(p_logits, *SAMPLING)
    if dense:
        q, p = DenseProbs(q.dense()), DenseProbs(p.dense())
    return rejection_accept(drafts, q, p, None)


def measure(vocab: int, batch: int, gamma: int, device: str = "cuda") -> list[dict[str, Any]]:
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    q_logits = (4 * torch.randn(batch, gamma, vocab, device=device, generator=gen)).bfloat16()
    p_logits = (4 * torch.randn(batch, gamma + 1, vocab, device=device,
                                generator=gen)).bfloat16()
    drafts = torch.randint(0, vocab, (batch, gamma), device=device, generator=gen)
    rows = []
    q_rows = token_probs(q_logits, *SAMPLING)  # the draft steps' q, made before acceptance
    for phase, run in (("draft step", lambda d: draft_step(q_logits[:, 0], d)),
                       ("acceptance", lambda d: acceptance(drafts, q_rows, p_logits, d))):
        slots, dense = median_ms(lambda: run(False)), median_ms(lambda: run(True))
        rows.append({"phase": phase, "vocab": vocab, "batch": batch, "gamma": gamma,
                     "slots_ms": round(slots, 4), "dense_ms": round(dense, 4),
                     "dense_over_slots": round(dense / slots, 2)})
        print(f"{phase:10s} V {vocab} B {batch:3d} γ {gamma}: slots {slots:.3f} ms, "
              f"dense {dense:.3f} ms, dense/slots {dense / slots:.2f}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/sampling_h200.csv"))
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("benchmarks/sampling.py needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = [r for shape in SHAPES for r in measure(*shape)]
    with args.out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
