"""Does the model copy on the recall workload? Greedy dense decoding of each recall prompt,
compared with the passage it asks for (the RECALL_ANSWER window tokens after the cue).

    python benchmarks/recall_copy_rate.py [--prompts N] [--new 48] [--device cuda] [--out CSV]

Per prompt: `exact_prefix` (generated tokens equal to the answer from its start), `overlap4`
(share of generated 4-grams found in the answer) and `copied` (overlap4 >= 0.5). Prints one
row per prompt and the copy rate per prompt length and per cue depth. Uses the shipped
workload file (vegas_sim/calibrate/workloads/smollm2-135m.npz) and the SmolLM2 GGUF.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import torch

from vegas_sim.calibrate.loading import load_model
from vegas_sim.calibrate.workloads import RECALL_ANSWER, Prompt, workload_prompts


def ngram_overlap(generated: list[int], reference: list[int], n: int = 4) -> float:
    """Share of the generated n-grams that occur in the reference (0 when too short)."""
    ref = {tuple(reference[i:i + n]) for i in range(len(reference) - n + 1)}
    grams = [tuple(generated[i:i + n]) for i in range(len(generated) - n + 1)]
    return sum(g in ref for g in grams) / len(grams) if grams else 0.0


def exact_prefix(generated: list[int], reference: list[int]) -> int:
    k = 0
    while k < min(len(generated), len(reference)) and generated[k] == reference[k]:
        k += 1
    return k


@torch.no_grad()
def greedy(model: torch.nn.Module, prompt: list[int], new: int) -> list[int]:
    cache = model.new_cache(1, len(prompt) + new + 1)  # type: ignore[operator]
    logits = model.prefill([torch.tensor(prompt)], cache)  # type: ignore[operator]
    out: list[int] = []
    for _ in range(new):
        nxt = logits.argmax(-1, keepdim=True)  # [1, 1]
        out.append(int(nxt))
        logits = model(nxt, cache, last_only=True)[:, 0]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=0, help="first N prompts (0 = all)")
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--max-len", type=int, default=0, help="skip prompts longer than this")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    model, tok, _ = load_model("smollm2-135m", weights="real", device=a.device)
    prompts: list[Prompt] = workload_prompts("recall")
    if a.max_len:
        prompts = [p for p in prompts if len(p.tokens) <= a.max_len]
    if a.prompts:
        prompts = prompts[:a.prompts]
    rows = []
    t0 = time.time()
    for i, p in enumerate(prompts):
        assert p.answer_start is not None and tok is not None
        doc_answer = _answer_tokens(p)
        gen = greedy(model, p.tokens, a.new)
        ov = ngram_overlap(gen, doc_answer)
        rows.append({"request": i, "source": p.source, "length": len(p.tokens),
                     "distance": p.distance, "exact_prefix": exact_prefix(gen, doc_answer),
                     "overlap4": round(ov, 3), "copied": int(ov >= 0.5)})
        print(f"{i:3d} {p.source:32s} len {len(p.tokens):5d} d {p.distance:5d} "
              f"prefix {rows[-1]['exact_prefix']:3d} overlap4 {ov:.2f} | "
              f"{tok.decode(gen)[:60]!r}", flush=True)
    print(f"{len(rows)} prompts in {time.time() - t0:.0f} s on {a.device}")
    _summary(rows)
    if a.out:
        with open(a.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


def _answer_tokens(p: Prompt) -> list[int]:
    """The RECALL_ANSWER window tokens after the cue (answer_start indexes the window)."""
    assert p.answer_start is not None
    return p.tokens[p.answer_start:p.answer_start + RECALL_ANSWER]


def _summary(rows: list[dict[str, object]]) -> None:
    for key in ("length", "distance_bin"):
        groups: dict[object, list[dict[str, object]]] = {}
        for r in rows:
            k = r["length"] if key == "length" else _bin(int(r["distance"]))  # type: ignore[call-overload]
            groups.setdefault(k, []).append(r)
        for k in sorted(groups, key=str):
            g = groups[k]
            rate = sum(int(r["copied"]) for r in g) / len(g)  # type: ignore[call-overload]
            ov = sum(float(r["overlap4"]) for r in g) / len(g)  # type: ignore[arg-type]
            print(f"{key} {k}: copy rate {rate:.2f} ({len(g)} prompts), mean overlap4 {ov:.2f}")
    rate = sum(int(r["copied"]) for r in rows) / len(rows)  # type: ignore[call-overload]
    print(f"ALL: copy rate {rate:.2f} of {len(rows)} prompts")


def _bin(d: int) -> str:
    for hi in (256, 1024, 2048, 4096, 8192):
        if d <= hi:
            return f"<= {hi}"
    return "> 8192"


if __name__ == "__main__":
    sys.exit(main())
