"""The Vegas paper's AIME25 serving setting, predicted, beside what the paper measured.

Setting (paper, Table/Figure on AIME25): Qwen3-8B on one H100 NVL (94 GB), vLLM with
max_num_seqs 128, AIME25 prompts ≈ 182 tokens, outputs ≈ 19,680 tokens on average, sampling
T 0.6 / top-p 0.95 / top-k 20, draft sparsity 0.07. Paper throughput: vLLM 940 tok/s,
MagicDec-Stream 1576, MagicDec-Quest 1247, SpecExtend 1493, Vegas 1893; KV-selection share of
the iteration: Quest 21.7 %, SpecExtend 11.2 %, Vegas 5.9 % (Figure 10b; `select%` here is
predict's kv_selection_pct, counted the same way: selection phases plus the score write-out).

Here: `--gpu h100-nvl` (datasheet what-if of the measured latency set), batch 128 (the max
running sequences; the KV cache decides how many run), each method at the γ that `tune`'s step
2 picks at s = 0.07 (analytic search, KV-limited batch), then the SimPy engine (vLLM-style
block admission and preemption) at that γ. Output lengths: lognormal with mean 19,680 and the
CV below — an assumption: AIME25 outputs are model generations, not in any dataset here.

    PYTHONPATH=. python benchmarks/paper_check.py [--cv 0.4] [--requests 256] [--model M]

`--model` another of the paper's four models at the same setting (batch 128; its sampling and
weights as `paper_long_context.SETTINGS` says; Qwen3-4B and Qwen3-30B-2507 priced on their
siblings' latency sets): the paper gives their speedups only as a range over models and
benchmarks (Vegas 1.25-2.70x over vLLM; over Stream 1.15-1.23x), so its columns stay empty.

Prints one row per method; CPU only, about 7 CPU-minutes (docs/RESULTS.md). Nothing is tuned
to the paper.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from vegas_sim import api
from vegas_sim.sim.predict import Scenario, predict
from vegas_sim.sim.tune import TuneConfig, tune
from vegas_sim.sim.workload import OutputLengths

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paper_long_context import SETTINGS, Setting  # noqa: E402

PAPER_TOK_S = {"vanilla": 940.0, "magicdec-stream": 1576.0, "magicdec-quest": 1247.0,
               "specextend": 1493.0, "vegas": 1893.0}
PAPER_SELECT_SHARE = {"magicdec-quest": 0.217, "specextend": 0.112, "vegas": 0.059}
METHODS = ("magicdec-stream", "magicdec-quest", "specextend", "vegas")
BATCH, CONTEXT, MEAN_OUT, SPARSITY = 128, 182, 19680, 0.07
WORKLOAD = "reasoning"  # AIME25 is competition maths with long chains of thought


def tuned_gamma(method: str, extra: dict[str, object], latency: object,
                acceptance: object, model: str = "qwen3-8b") -> tuple[int, str]:
    """tune's γ for `method` at s = 0.07 (its own best γ, no baselines): the serving table's K,
    or, where tune recommends no speculation (K = 0: the interval's low end does not beat
    vanilla), the best speculative γ it found, with tune's reason."""
    cfg = TuneConfig(method=method, sparsity_coarse=(SPARSITY,), baselines=(),
                     output_len=MEAN_OUT, extra=extra)
    res = tune([(BATCH, CONTEXT)], latency, acceptance, config=cfg,  # type: ignore[arg-type]
               workers=1, model=model)
    k = res.gamma_by_batch()[BATCH]
    if k:
        return k, ""
    cell = res.cells.iloc[0]
    return int(cell["gamma"]), f"tune recommends K = 0 for {method}: {cell['k_reason']}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cv", type=float, default=0.4,
                    help="coefficient of variation of the output lengths (assumed)")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--replications", type=int, default=2)
    ap.add_argument("--model", choices=list(SETTINGS), default="qwen3-8b",
                    help="another of the paper's models (module docstring)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    setting: Setting = SETTINGS[args.model]
    latency, acceptance, notes = setting.load(None)
    dist = OutputLengths.lognormal(MEAN_OUT, args.cv)
    extra: dict[str, object] = {"temperature": setting.temperature, "workload": WORKLOAD,
                                "output_dist": dist, "requests": args.requests}
    tuned = {m: tuned_gamma(m, extra, latency, acceptance, setting.model) for m in METHODS}
    gammas = {m: g for m, (g, _) in tuned.items()}
    scenarios = [Scenario("vanilla", 1, 1.0, BATCH, CONTEXT, MEAN_OUT, **extra)]  # type: ignore[arg-type]
    scenarios += [Scenario(m, gammas[m], SPARSITY, BATCH, CONTEXT, MEAN_OUT, **extra)  # type: ignore[arg-type]
                  for m in METHODS]
    table = predict(scenarios, latency, acceptance, replications=args.replications)
    print_table(table, gammas, args.cv, time.perf_counter() - t0, setting)
    for note in [why for _, why in tuned.values() if why] + list(notes):
        print(f"note: {note}")


def print_table(table: pd.DataFrame, gammas: dict[str, int], cv: float, wall_s: float,
                setting: Setting) -> None:
    base = float(table.loc[table["method"] == "vanilla", "throughput_tok_s"].iloc[0])
    print(f"AIME25 setting: {setting.model}, --gpu h100-nvl, batch {BATCH}, context {CONTEXT}, "
          f"output lognormal mean {MEAN_OUT} CV {cv:g}, s {SPARSITY}, T {setting.temperature}, "
          f"weights {setting.weight_format}, workload {WORKLOAD} ({wall_s:.0f} s)")
    paper_tok_s = PAPER_TOK_S if setting.model == "qwen3-8b" else {}
    head = (f"{'method':16} {'γ':>2} {'tok/s':>7} {'paper':>6} {'ratio':>6} {'speedup':>7} "
            f"{'paper':>6} {'ratio':>6} {'select%':>7} {'paper':>6} {'run.batch':>9} "
            f"{'preempt':>7} {'acc len':>7} {'iter ms':>8}")
    print(head)
    for _, r in table.iterrows():
        m = str(r["method"])
        thr, sp = float(r["throughput_tok_s"]), float(r["throughput_tok_s"]) / base
        p_thr = paper_tok_s.get(m, float("nan"))
        p_sp = p_thr / paper_tok_s["vanilla"] if paper_tok_s else float("nan")
        p_sel = PAPER_SELECT_SHARE.get(m) if paper_tok_s else None
        print(f"{m:16} {gammas.get(m, 1):>2} {thr:7.0f} {p_thr:6.0f} {thr / p_thr:6.2f} "
              f"{sp:7.2f} {p_sp:6.2f} {sp / p_sp:6.2f} {float(r['kv_selection_pct']):7.1f} "
              f"{'' if p_sel is None else f'{100 * p_sel:.1f}':>6} "
              f"{r['mean_running_batch']:9.1f} {r['preemptions']:7.1f} "
              f"{r['acceptance_length']:7.2f} {r['iter_ms']:8.1f}")
    ours = list(table.sort_values("throughput_tok_s", ascending=False)["method"])
    print(f"ranking ours : {' > '.join(ours)}")
    if paper_tok_s:
        paper = sorted(paper_tok_s, key=lambda k: -paper_tok_s[k])
        print(f"ranking paper: {' > '.join(paper)}  -> "
              f"{'matches' if ours == paper else 'differs'}")
    spec = table.set_index("method")["throughput_tok_s"]
    print(f"Vegas over vLLM {spec['vegas'] / base:.2f} (paper, over its models and benchmarks: "
          f"1.25-2.70); over Stream {spec['vegas'] / spec['magicdec-stream']:.2f} (paper: "
          "1.15-1.23)")
    phases = [c for c in table.columns if c.startswith("ms_") and c != "ms_verify_collect"]
    print("iteration time by phase, ms (verify's score write-out in brackets): " + "; ".join(
        f"{r['method']}: " + ", ".join(
            f"{c[3:]} {r[c]:.1f}" + (f" [{r['ms_verify_collect']:.1f}]"
                                     if c == "ms_verify" and r["ms_verify_collect"] > 0 else "")
            for c in phases if r[c] > 0)
        for _, r in table.iterrows()))


if __name__ == "__main__":
    main()
