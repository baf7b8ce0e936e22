"""Does Triton's automatic warp specialisation help verify attention at B 1, C 32K?

    python benchmarks/gpu/ws_probe.py [--rounds 5] [--out CSV]

At B 1, C 32K, NQ 8 and 16, the split kernel's softmax on the 32- or 64-row tile does not
overlap the loads well enough (KERNELS_NOTES.md, nineteenth session). Warp specialisation
(`tl.range(..., warp_specialize=True)`: a producer partition for the K/V loads, consumers for
the math) is the usual fix. This probe builds a copy of `verify_attention.py` whose TMA loop
asks for it (the library is untouched), launches it at 4 and 8 warps, reports whether it
compiled and whether its PTX was partitioned (`setmaxnreg`), checks it against the
default's output, and times it against the default (CUDA-graph replays, caches rotated past
the L2, fastest of interleaved rounds).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from kernels import (
    DEV,
    SCALE,
    copy_bandwidth,
    kv_bytes,
    min_of_rounds,
    rotating,
    verify_call,
    verify_inputs,
)
from probe_common import write_rows

from vegas_sim.kernels import verify_attention as va

LOOP = "for start in range(lo, hi_tma, BLOCK_N):"
WS_LOOP = "for start in tl.range(lo, hi_tma, BLOCK_N, warp_specialize=True):"
SHAPES = [(1, 32768, 8), (1, 32768, 16), (1, 131072, 16)]
VARIANTS = {"ws w4": {"num_warps": 4}, "ws w8": {"num_warps": 8}}


def ws_module() -> ModuleType:
    """verify_attention.py with its TMA loop asking for warp specialisation."""
    src = Path(va.__file__).read_text()
    assert src.count(LOOP) == 1, "the TMA loop moved: update ws_probe.LOOP"
    path = Path(tempfile.mkdtemp()) / "verify_attention_ws.py"
    path.write_text(src.replace(LOOP, WS_LOOP))
    spec = importlib.util.spec_from_file_location("verify_attention_ws", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def partitions(mod: ModuleType) -> str:
    """setmaxnreg count in each compiled variant of the copy's kernel (0: not specialised)."""
    try:
        counts = [str(kernel.asm["ptx"].count("setmaxnreg"))
                  for entry in mod._verify_attention_kernel.device_caches.values()
                  for kernel in entry[0].values()]
    except Exception:  # noqa: BLE001 - the JIT cache's layout differs between triton versions
        return "?"
    return "/".join(counts) or "?"


def copy_call(mod: ModuleType, caches: Any, q: torch.Tensor, lens: torch.Tensor, C: int,
              **knobs: Any) -> Callable[[], Any]:
    """The copy's verify_attention over the cache copies in turn (as `kernels.verify_call`)."""
    return rotating([partial(mod.verify_attention, q, k, v, lens, SCALE, "none", max_len=C,
                             **knobs) for k, v in caches])


def shape_rows(gen: torch.Generator, mod: ModuleType, shape: tuple[int, int, int], rounds: int,
               copy_bw: float) -> list[dict[str, Any]]:
    B, C, NQ = shape
    caches, lens, q = verify_inputs(gen, B, C, NQ)
    ref, _, _ = va.verify_attention(q, *caches[0], lens, SCALE, "none", max_len=C)
    calls = {"default": verify_call(caches, q, lens, "none", C),
             "default tma": verify_call(caches, q, lens, "none", C, tma=True)}
    notes: dict[str, str] = {}
    for label, knobs in VARIANTS.items():
        try:
            out, _, _ = mod.verify_attention(q, *caches[0], lens, SCALE, "none", max_len=C,
                                             tma=True, **knobs)
            torch.cuda.synchronize()
            err = (out.float() - ref.float()).abs().max().item()
            notes[label] = f"max |diff| {err:.2e}; setmaxnreg {partitions(mod)}"
            calls[label] = copy_call(mod, caches, q, lens, C, tma=True, **knobs)
        except Exception as e:  # noqa: BLE001 - a variant may not compile
            notes[label] = f"FAILED {type(e).__name__}: {e}".replace("\n", " ")[:240]
        print(f"B {B} C {C} NQ {NQ} {label}: {notes[label]}", flush=True)
    ms = min_of_rounds(calls, rounds)
    kv = kv_bytes(B, C)
    rows = [{"batch": B, "context": C, "n_query": NQ, "variant": label, "ms": round(t, 5),
             "ratio_copy": round(kv / t / 1e6 / copy_bw, 4), "note": notes.get(label, "")}
            for label, t in ms.items()]
    for r in rows:
        print(f"B {B} C {C} NQ {NQ} {r['variant']:>12}: {r['ms'] * 1e3:6.1f} us "
              f"{r['ratio_copy']:.3f} of copy", flush=True)
    del caches
    torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/ws_probe_h200.csv"))
    args = p.parse_args(argv)
    gen = torch.Generator(device=DEV).manual_seed(0)
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth {copy_bw:.0f} GB/s", flush=True)
    mod = ws_module()
    rows: list[dict[str, Any]] = []
    for shape in SHAPES:
        rows += shape_rows(gen, mod, shape, args.rounds, copy_bw)
    write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
