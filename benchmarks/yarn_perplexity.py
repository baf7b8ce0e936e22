"""SmolLM2 past its 8K window: perplexity of book text by position, without RoPE scaling and
with YaRN factor 2 and 4 (original window 8192).

    python benchmarks/yarn_perplexity.py --books BOOKS.npz [--window 32768] [--out CSV]

BOOKS.npz holds one token array per book (`python benchmarks/yarn_perplexity.py --tokenize
OUT.npz` writes it from ../shared/datasets/gutenberg with SmolLM2's tokenizer, on the CPU).
Each book gives one window of --window tokens from its start; the window is fed causally in
chunks and each token's negative log-likelihood is binned by position (0-2K, 2-4K, 4-8K,
8-16K, 16-32K). Prints perplexity per configuration and bin; the CSV has one row per
(configuration, book, bin).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

BINS = ((0, 2048), (2048, 4096), (4096, 8192), (8192, 16384), (16384, 32768))


def tokenize(out: Path) -> None:
    from vegas_sim.calibrate.loading import smollm2_gguf_path
    from vegas_sim.calibrate.tokenizer import Tokenizer
    from vegas_sim.calibrate.workloads import BOOKS, book_body, default_datasets_dir

    tok = Tokenizer.from_gguf(smollm2_gguf_path())
    data = default_datasets_dir() / "gutenberg"
    arrays = {b.split("_")[0]: np.asarray(tok.encode(book_body(data / b)), dtype=np.uint16)
              for b in BOOKS}
    np.savez_compressed(out, **arrays)  # type: ignore[arg-type]
    print({k: len(v) for k, v in arrays.items()})


@torch.no_grad()
def position_nll(model: torch.nn.Module, tokens: list[int], chunk: int = 1024) -> np.ndarray:
    """NLL of tokens[1:] given their prefixes (index i = position i + 1)."""
    cache = model.new_cache(1, len(tokens))  # type: ignore[operator]
    out = []
    for s in range(0, len(tokens) - 1, chunk):
        piece = torch.tensor([tokens[s:s + chunk]])
        logits = model(piece, cache)[0]  # [n, V] fp32
        target = torch.tensor(tokens[s + 1:s + 1 + chunk], device=logits.device)
        lp = torch.log_softmax(logits[:len(target)].float(), -1)
        out.append((-lp.gather(1, target[:, None])[:, 0]).cpu().numpy())
    return np.concatenate(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenize", type=Path, default=None)
    ap.add_argument("--books", type=Path, default=None)
    ap.add_argument("--window", type=int, default=32768)
    ap.add_argument("--factors", default="1,2,4", help="1 = no scaling")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    if a.tokenize:
        tokenize(a.tokenize)
        return 0
    from vegas_sim.calibrate.loading import load_model
    from vegas_sim.models import yarn_scaling

    model, _, _ = load_model("smollm2-135m", weights="real", device="cuda",
                             dtype=torch.bfloat16)
    base = model.spec
    orig = base.max_positions
    books = dict(np.load(a.books))
    rows = []
    for factor in [float(f) for f in a.factors.split(",")]:
        scaling = None if factor == 1 else yarn_scaling(factor, orig)
        model.spec = dataclasses.replace(base, rope_scaling=scaling,
                                         max_positions=max(a.window, orig))
        model._rope_cos = torch.empty(0, device=model.device)  # rebuilt for the new spec
        name = "none" if scaling is None else f"yarn{factor:g}"
        for book, toks in books.items():
            t0 = time.time()
            nll = position_nll(model, toks[:a.window].astype(np.int64).tolist())
            for lo, hi in BINS:
                seg = nll[max(lo - 1, 0):hi - 1]
                if len(seg):
                    rows.append({"config": name, "book": book, "from": lo, "to": hi,
                                 "tokens": len(seg), "nll": float(seg.mean()),
                                 "ppl": math.exp(float(seg.mean()))})
            print(f"{name} {book}: {time.time() - t0:.1f} s", flush=True)
    _table(rows)
    if a.out:
        with open(a.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


def _table(rows: list[dict[str, object]]) -> None:
    configs = sorted({str(r["config"]) for r in rows})
    print("perplexity by position (token-weighted over books)")
    print("config  " + "  ".join(f"{lo // 1024}-{hi // 1024}K".rjust(8) for lo, hi in BINS))
    for c in configs:
        cells = []
        for lo, _hi in BINS:
            sel = [r for r in rows if r["config"] == c and r["from"] == lo]
            n = sum(int(r["tokens"]) for r in sel)  # type: ignore[call-overload]
            nll = sum(float(r["nll"]) * int(r["tokens"]) for r in sel) / n if n else float("nan")  # type: ignore[arg-type, call-overload]
            cells.append(f"{math.exp(nll):8.2f}")
        print(f"{c:7s} " + "  ".join(cells))


if __name__ == "__main__":
    sys.exit(main())
