"""MagicDec's published Llama-3.1-8B self-speculation speedups, predicted, beside what was measured.

Setting (MagicDec, Chen et al., arXiv 2408.11049; project page infini-ai-lab.github.io/MagicDec,
repository Infini-AI-Lab/MagicDec `index.html` and `pages/index.html`): Llama-3.1-8B drafting
for itself with a StreamingLLM KV cache (MagicDec-Stream here), 8-way tensor parallel, PG-19
prompts prefilled to 32,000 tokens (100,000 in one A100 row), a fixed batch decoding on
(`selfspec_benchmark.py --B B --prefix_len P --gen_len P+96`), the speedup over autoregressive
decoding of the same batch at the paper's optimal speculation length:

    8xH100 SXM  32K  B 32 γ 3 1.23 · B 64 γ 3 1.43
    8xA100      32K  B 32 γ 3 1.22 · B 64 γ 3 1.38 · B 128 γ 4 1.47 · 100K B 32 γ 5 1.84

Here: Llama-3.1-8B's shape (preset `llama-3.1-8b`) priced at the efficiencies of the packaged
Qwen3-8B latency set measured on that GPU (the H100 rows: `qwen3-8b-h100`), or of the H200 set
scaled to it by its datasheet (the A100 rows), split 8 ways with modelled all-reduces
(`sim.parallel`; NOT measured); acceptance from MagicDec's own published
acceptance rates for this model and draft (packaged anchors `llama-3.1-8b-magicdec`, PG-19,
budget 512) on SmolLM2's longdoc shape; sparsity = budget / context; closed loop, prefill
done before decoding (not timed, as in the benchmark). Every row is a what-if: no Llama,
no A100 and no TP was measured.

    PYTHONPATH=. python benchmarks/magicdec_check.py [--budget 512] [--engine sim|analytic]

Prints one row per published point and the iteration time by phase; CPU only, under a
minute. Nothing is tuned to the published figures.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import pandas as pd

from vegas_sim import api
from vegas_sim.sim.predict import Scenario, predict

MODEL, LATENCY_SET_MODEL = "llama-3.1-8b", "qwen3-8b"
ANCHORS = ("llama-3.1-8b-magicdec",)
METHOD, WORKLOAD, TP = "magicdec-stream", "longdoc", 8
# MagicDec's benchmark generates 96 tokens past the prefill; its acceptance rates state no
# output length. SmolLM2's longdoc runs accept less in their first ~100 generated tokens, so the
# same point is also predicted at 1,024 generated tokens: the gap is that shape's doing
GENERATED = (96, 1024)


@dataclass(frozen=True)
class Published:
    """One row of MagicDec's self-speculation tables."""
    gpu: str
    context: int
    batch: int
    gamma: int
    speedup: float


PUBLISHED = (
    Published("h100-sxm", 32000, 32, 3, 1.23), Published("h100-sxm", 32000, 64, 3, 1.43),
    Published("a100", 32000, 32, 3, 1.22), Published("a100", 32000, 64, 3, 1.38),
    Published("a100", 32000, 128, 4, 1.47), Published("a100", 100000, 32, 5, 1.84),
)


def predict_point(point: Published, budget: int, generated: int, engine: str,
                  replications: int) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """Vanilla and MagicDec-Stream at one published point (two rows, vanilla first)."""
    latency, acceptance, notes = api.load_models(
        LATENCY_SET_MODEL, None, point.gpu, acceptance_anchors=ANCHORS,
        tensor_parallel=TP, model_what_if=MODEL)
    common = dict(batch=point.batch, context=point.context, output_len=generated,
                  workload=WORKLOAD, prefill="disaggregated")
    scenarios = [Scenario("vanilla", 1, 1.0, **common),  # type: ignore[arg-type]
                 Scenario(METHOD, point.gamma, budget / point.context, **common)]  # type: ignore[arg-type]
    table = predict(scenarios, latency, acceptance, replications=replications, engine=engine)
    return table, notes


def phase_text(row: pd.Series) -> str:
    """The row's iteration time by phase, ms."""
    phases = [c for c in row.index if str(c).startswith("ms_") and float(row[c]) > 0]
    return ", ".join(f"{str(c)[3:]} {float(row[c]):.2f}" for c in phases)


def speedup_of(table: pd.DataFrame) -> tuple[float, float, float, float]:
    """Acceptance length, speedup and its prediction interval (lo, hi) over vanilla."""
    vanilla, spec = float(table.iloc[0]["throughput_tok_s"]), table.iloc[1]
    return (float(spec["acceptance_length"]), float(spec["throughput_tok_s"]) / vanilla,
            float(spec["pi_low"]) / vanilla, float(spec["pi_high"]) / vanilla)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=512, help="StreamingLLM KV budget, tokens")
    ap.add_argument("--engine", choices=("analytic", "sim"), default="sim")
    ap.add_argument("--replications", type=int, default=2)
    args = ap.parse_args()
    t0 = time.perf_counter()
    short, long = GENERATED
    print(f"MagicDec self-speculation: {MODEL} (what-if on the {LATENCY_SET_MODEL} sets), "
          f"TP {TP}, {METHOD}, budget {args.budget}, engine {args.engine}; speedup at {short} "
          f"generated tokens (the benchmark's) with its 95 % PI, and at {long}")
    print(f"{'gpu':9} {'context':>7} {'B':>4} {'γ':>2} {'acc len':>7} {'speedup':>7} "
          f"{'PI':>11} {'@' + str(long):>6} {'published':>9} {'ratio':>6}")
    notes: set[str] = set()
    ratios = []
    for point in PUBLISHED:
        table, point_notes = predict_point(point, args.budget, short, args.engine,
                                           args.replications)
        notes.update(point_notes)
        acc, speedup, lo, hi = speedup_of(table)
        far = speedup_of(predict_point(point, args.budget, long, args.engine,
                                       args.replications)[0])[1]
        ratios.append(speedup / point.speedup)
        print(f"{point.gpu:9} {point.context:7d} {point.batch:4d} {point.gamma:2d} {acc:7.2f} "
              f"{speedup:7.2f} {lo:5.2f}-{hi:<5.2f} {far:6.2f} {point.speedup:9.2f} "
              f"{speedup / point.speedup:6.2f}")
        print(f"    ms by phase — vanilla: {phase_text(table.iloc[0])}; "
              f"{METHOD}: {phase_text(table.iloc[1])}")
    worst = max(ratios, key=lambda r: abs(r - 1))
    print(f"ratio predicted / published at {short} tokens: median "
          f"{pd.Series(ratios).median():.2f}, furthest from 1: {worst:.2f} "
          f"({time.perf_counter() - t0:.0f} s)")
    for note in sorted(notes):
        print(f"note: {note}")


if __name__ == "__main__":
    main()
