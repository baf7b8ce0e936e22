"""The Vegas paper's long-context results beside `predict` (§2.2, §2.3 Figure 3, §5.3).

Paper settings (docs: /work/shared/papers, the Vegas paper):
- §5.3: LongBench-v2 prompts of 96K-120K tokens; Qwen3-8B with RoPE (YaRN) scaling factor 4;
  the decode GPU of a prefill/decode-disaggregated pair of H100 NVL (94 GB); max batch 4
  (Qwen3-8B); T 0.6 / top-p 0.95 / top-k 20; sparsity 7 %; each method at its tuned γ.
  Claim: Vegas 18-29 % above the most competitive baseline; StreamingLLM "inherently
  struggles" (low drafting accuracy), Quest suffers from its KV selection overhead.
- §2.3, Figure 3: at γ 5, Quest's KV selection inflates the iteration by 23 % over
  StreamingLLM; Quest decodes 22 % more tokens per iteration (Figure 2, γ 5); throughput
  204.5 vs 208.0 tok/s (Quest / Stream 0.983). No batch or context is given: the long-context
  setting above is used.
- §2.2: Qwen3-8B on an H100, batch 4, 128K context: 36.9 ms per (vanilla) decoding step.

Here: `qwen3-8b`, `--gpu h100-nvl` (datasheet what-if of the measured latency set), batch 4,
context 108K (the middle of 96-120K; `--context`), disaggregated prefill (predict's
default), output 1024 (predict's default: LongBench-v2's output lengths are not given),
s 0.07, T 0.6, the workloads a user would pick for long-document QA: longdoc (long documents)
and recall (a passage cued from far back). γ per method: the best of 1..12 by the analytic
engine at this setting (tune's step 2), then the SimPy engine at that γ (5 replications).
Acceptance: the packaged defaults; `--acceptance-traces NAME` for another set.

    PYTHONPATH=. python benchmarks/paper_long_context.py [--context 110592]
        [--acceptance-traces smollm2-135m-real-yarn4] [--model qwen3-8b|qwen3-4b|qwen3-30b|
        gpt-oss-20b|all]

`--model`: §5.3 for another of the paper's four models at its batch and sampling (`SETTINGS`);
Qwen3-4B and Qwen3-30B (the Thinking-2507 checkpoint) priced on their siblings' latency sets.

Prints the §5.3 table (per workload: each method's tok/s, its 95 % PI, acceptance length,
the axis it extrapolates on; Vegas over the best baseline beside the paper's range, with the
interval the PIs allow), the Figure 3 table by phase (draft, Quest's page scoring, verify,
sample, other) with Quest over Stream's throughput from the PIs, and the §2.2 vanilla step.
CPU only.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from vegas_sim import api
from vegas_sim.reports.terminal import _extrapolated
from vegas_sim.sim.predict import Scenario, predict

BATCH, SPARSITY, TEMPERATURE, OUTPUT = 4, 0.07, 0.6, 1024


@dataclass(frozen=True)
class Setting:
    """One model of §5.3 as the paper ran it (Appendix E.1's sampling, its max batch) and as
    vegas-sim prices it: the packaged latency set of `latency_model`, `what_if` the preset
    whose shape is priced on it when the model has no set of its own."""

    model: str
    batch: int
    temperature: float
    weight_format: str = "bf16"
    latency_model: str | None = None
    what_if: str | None = None

    def load(self, acceptance_traces: str | None) -> tuple[object, object, tuple[str, ...]]:
        return api.load_models(self.latency_model or self.model, None, "h100-nvl",
                               weight_format=self.weight_format,
                               acceptance_traces=acceptance_traces,
                               model_what_if=self.what_if)


# §5.3: max batch 4, 4, 5 and 20; Qwen3 at T 0.6, gpt-oss-20b at T 1.0 (its model card);
# Qwen3-30B is the FP8 Thinking-2507 checkpoint (262K native positions), gpt-oss-20b's MoE
# weights MXFP4. Qwen3-4B and Qwen3-30B-2507 have no latency set: their shapes are priced on
# their siblings' (what-ifs, and the rows say so).
SETTINGS = {
    "qwen3-8b": Setting("qwen3-8b", 4, 0.6),
    "qwen3-4b": Setting("qwen3-4b", 4, 0.6, latency_model="qwen3-8b", what_if="qwen3-4b"),
    "qwen3-30b": Setting("qwen3-30b-a3b-thinking-2507", 5, 0.6, "fp8",
                         latency_model="qwen3-30b-a3b", what_if="qwen3-30b-a3b-thinking-2507"),
    "gpt-oss-20b": Setting("gpt-oss-20b", 20, 1.0, "mxfp4"),
}
METHODS = ("magicdec-stream", "magicdec-quest", "specextend", "vegas")
BASELINES = METHODS[:3]
WORKLOADS = ("longdoc", "recall")
GAMMAS = range(1, 13)
PAPER_VEGAS_OVER_BEST = (1.18, 1.29)  # §5.3, over the four models
FIG3_GAMMA = 5
PAPER_FIG3 = {"iteration": 1.23, "tokens per iteration": 1.22, "throughput": 204.5 / 208.0}
PAPER_STEP_MS, STEP_CONTEXT = 36.9, 131072  # §2.2: B 4, 128K
PHASES = ("draft_step", "quest_meta", "verify", "select", "sample", "other")


def best_gammas(latency: object, acceptance: object, context: int, workload: str,
                setting: Setting) -> dict[str, int]:
    """Each method's γ of highest analytic throughput at the setting (tune's step 2)."""
    scen = [Scenario(m, g, SPARSITY, setting.batch, context, OUTPUT, workload=workload,
                     temperature=setting.temperature) for m in METHODS for g in GAMMAS]
    df = predict(scen, latency, acceptance, engine="analytic")  # type: ignore[arg-type]
    df = df[df["method"] != "vanilla"]
    best = df.loc[df.groupby("method")["throughput_tok_s"].idxmax()]
    return {str(r["method"]): int(r["gamma"]) for _, r in best.iterrows()}


def pi_ratio(a: pd.Series, b: pd.Series) -> tuple[float, float]:
    """The interval of a's throughput over b's that the two rows' 95 % PIs allow."""
    return a["pi_low"] / b["pi_high"], a["pi_high"] / b["pi_low"]


def extrapolating(row: pd.Series) -> str:
    """What predict's table prints in its extrap. column ('no' where it prints nothing)."""
    return _extrapolated(row) or "no"


def section_53(latency: object, acceptance: object, context: int, setting: Setting) -> None:
    print(f"§5.3 long context: {setting.model}, h100-nvl, batch {setting.batch}, context "
          f"{context}, output {OUTPUT}, s {SPARSITY}, T {setting.temperature}, weights "
          f"{setting.weight_format}, disaggregated prefill")
    for workload in WORKLOADS:
        gammas = best_gammas(latency, acceptance, context, workload, setting)
        scen = [Scenario(m, gammas[m], SPARSITY, setting.batch, context, OUTPUT,
                         workload=workload, temperature=setting.temperature)
                for m in METHODS]
        df = predict(scen, latency, acceptance)  # type: ignore[arg-type]
        print(f"\nworkload {workload}")
        print(f"{'method':16} {'γ':>2} {'tok/s':>6} {'95% PI':>11} {'speedup':>7} "
              f"{'acc len':>7} {'iter ms':>7}  extrapolating")
        for _, r in df.iterrows():
            print(f"{r['method']:16} {int(r['gamma']):>2} {r['throughput_tok_s']:6.0f} "
                  f"{r['pi_low']:5.0f}-{r['pi_high']:<5.0f} {r['speedup_vs_vanilla']:7.2f} "
                  f"{r['acceptance_length']:7.2f} {r['iter_ms']:7.1f}  "
                  f"{extrapolating(r)}")
        spec = df[df["method"] != "vanilla"].set_index("method")
        best = spec.loc[list(BASELINES), "throughput_tok_s"].idxmax()
        v, b = spec.loc["vegas"], spec.loc[best]
        ratio = v["throughput_tok_s"] / b["throughput_tok_s"]
        lo, hi = pi_ratio(v, b)
        inside = lo <= PAPER_VEGAS_OVER_BEST[1] and hi >= PAPER_VEGAS_OVER_BEST[0]
        ranking = " > ".join(spec.sort_values("throughput_tok_s", ascending=False).index)
        print(f"Vegas / best baseline ({best}): {ratio:.2f} (from the PIs {lo:.2f}-{hi:.2f}); "
              f"paper {PAPER_VEGAS_OVER_BEST[0]:.2f}-{PAPER_VEGAS_OVER_BEST[1]:.2f}: "
              f"{'overlaps' if inside else 'outside'}; ranking {ranking}")


def figure_3(latency: object, acceptance: object, context: int) -> None:
    """Quest's iteration against Stream's by phase (the packaged set's Quest rows are of the
    current runtime: `traces show` prints its revision)."""
    print(f"\n§2.3 Figure 3: γ {FIG3_GAMMA}, s {SPARSITY}, batch {BATCH}, context {context}, "
          "workload longdoc, T 0.6")
    scen = [Scenario(m, FIG3_GAMMA, SPARSITY, BATCH, context, OUTPUT, workload="longdoc",
                     temperature=TEMPERATURE) for m in ("magicdec-stream", "magicdec-quest")]
    df = predict(scen, latency, acceptance).set_index("method")  # type: ignore[arg-type]
    s, q = df.loc["magicdec-stream"], df.loc["magicdec-quest"]
    print(f"{'phase, ms':24} {'Stream':>8} {'Quest':>8} {'Q/S':>6}")
    for p in PHASES:
        a, b = float(s[f"ms_{p}"]), float(q[f"ms_{p}"])
        if a or b:
            print(f"{p:24} {a:8.2f} {b:8.2f} {b / a if a else float('nan'):6.2f}")
    rows = {"iteration": (s["iter_ms"], q["iter_ms"]),
            "tokens per iteration": (s["acceptance_length"], q["acceptance_length"]),
            "throughput": (s["throughput_tok_s"], q["throughput_tok_s"])}
    print(f"{'':24} {'Stream':>8} {'Quest':>8} {'Q/S':>6} {'paper':>6}")
    for name, (a, b) in rows.items():
        print(f"{name:24} {a:8.2f} {b:8.2f} {b / a:6.2f} {PAPER_FIG3[name]:6.2f}")
    lo, hi = pi_ratio(q, s)
    print(f"Quest / Stream throughput from the PIs: {lo:.2f}-{hi:.2f}")


def section_22(latency: object) -> None:
    """One vanilla step of four requests at 128K (the KV cache of an H100 NVL holds three such
    requests in vLLM's 0.9 share, so a served batch would run fewer: the step is priced as
    asked, without admission)."""
    cost = latency.iteration_cost("vanilla", 1, 1.0)  # type: ignore[attr-defined]
    ms = float(cost(np.full(BATCH, STEP_CONTEXT, np.int64)))
    print(f"\n§2.2 vanilla decode step, batch {BATCH}, context {STEP_CONTEXT}: {ms:.1f} ms "
          f"(paper {PAPER_STEP_MS} ms: ratio {ms / PAPER_STEP_MS:.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=110592)
    ap.add_argument("--acceptance-traces", default=None)
    ap.add_argument("--model", choices=[*SETTINGS, "all"], default="qwen3-8b",
                    help="§5.3 for this model of the paper (all: the four); Figure 3 and §2.2 "
                         "are Qwen3-8B's")
    args = ap.parse_args()
    t0 = time.perf_counter()
    print(f"acceptance: {args.acceptance_traces or 'packaged defaults'}")
    for name in SETTINGS if args.model == "all" else [args.model]:
        latency, acceptance, notes = SETTINGS[name].load(args.acceptance_traces)
        section_53(latency, acceptance, args.context, SETTINGS[name])
        if name == "qwen3-8b":
            figure_3(latency, acceptance, args.context)
            section_22(latency)
        for note in notes:
            print(f"note: {note}")
        print()
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
