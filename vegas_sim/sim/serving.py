"""Tune's choices in the shapes serving engines read, and checks of each engine's own rules.

A K table is the number of draft tokens K (0: no speculation) per tuned (batch, context)
cell, or per tuned batch size for a server that does not know the context. From tuned batch
sizes b₁ < … < bₙ, range i is [bᵢ, bᵢ₊₁ − 1], the first starts at 1 (a batch below b₁ uses
b₁'s K) and the last ends at ``max_num_seqs`` (the largest tuned batch: the server's
maximum); contexts likewise, the last context range open-ended (``CTX_OPEN``).

- **vLLM** (`vllm_config`): a ``speculative_config`` fragment: ``method``,
  ``num_speculative_tokens`` (= the largest K: vLLM sizes its buffers by it and clamps every
  scheduled K to it) and ``num_speculative_tokens_per_batch_size`` = ``[[lo, hi, K], …]``,
  inclusive batch ranges tiling 1 … max_num_seqs, equal neighbours merged (vLLM's dynamic
  speculative decoding). The per-context table uses the 5-item form ``[[bs_lo, bs_hi,
  ctx_lo, ctx_hi, K], …]`` of a vLLM pull request that is not merged (marked a proposal):
  a rectangular grid, every batch range with the same context ranges, contexts contiguous
  from 1, the last open-ended. Where every K is 0, there is no speculative_config.
- **SGLang** (`sglang_config`): the batch-size-aware adaptive speculation config, a JSON
  object keyed by batch-size lower bounds as strings, ``{"1": {"steps": [K]}, …}`` (one
  candidate step per range: the adaptive controller stays on it), beside
  ``speculative_num_steps`` = the largest K (SGLang refuses a candidate wider than it).
  SGLang's steps must be positive, so a table with K = 0 in some range is not expressible.
- **TensorRT-LLM** (`trtllm_config`): ``draft_len_schedule`` {batch-size threshold: draft
  length}, a threshold applying up to the next one (the largest threshold ≤ the batch),
  with ``max_draft_len``. TensorRT-LLM requires threshold 1 and schedule[1] = max_draft_len
  (batch 1 drafts the most), every length in [0, max_draft_len]; a table whose batch-1 K is
  not its largest is not expressible.
- **vegas-sim's own** (`vegas_config`): the Vegas sparsity per range beside the K tables,
  in the same [lo, hi, value] and 5-item shapes; no engine reads it today.

`check_vllm`, `check_vllm_per_context`, `check_sglang` and `check_trtllm` apply the engine's
rules as read in its source (written here, not copied) and raise ValueError naming the rule
broken; every export is checked before it is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

V = TypeVar("V", int, float)
CTX_OPEN = 2**31 - 1  # the open end of the last context range (vLLM's proposal's infinity)
VLLM_PROPOSAL = ("proposal: the 5-item (batch x context) form of an unmerged vLLM pull "
                 "request; merged vLLM reads only the 3-item num_speculative_tokens_per_batch_size")
SGLANG_NO_ZERO = ("SGLang's adaptive steps must be positive (step 0, no speculation, is not "
                  "supported in its source): serve the K = 0 ranges without speculation")
Cell = tuple[int, int]  # (batch, context)


# ---- ranges -----------------------------------------------------------------------------------
def ranges(values: Mapping[int, V], last: int | None = None,
           merge: bool = True) -> list[tuple[int, int, V]]:
    """{key: value} → inclusive [lo, hi] ranges tiling 1 .. `last` (default the max key);
    equal neighbours merged unless `merge` is False."""
    keys = sorted(values)
    end = keys[-1] if last is None else max(last, keys[-1])
    out: list[tuple[int, int, V]] = []
    for i, key in enumerate(keys):
        lo = 1 if i == 0 else key
        hi = keys[i + 1] - 1 if i + 1 < len(keys) else end
        if merge and out and out[-1][2] == values[key]:
            out[-1] = (out[-1][0], hi, values[key])
        else:
            out.append((lo, hi, values[key]))
    return out


def per_batch_size(k_by_batch: Mapping[int, int], max_num_seqs: int | None = None
                   ) -> list[list[int]]:
    """vLLM's `num_speculative_tokens_per_batch_size`: [[lo, hi, K], ...] over 1..max_num_seqs."""
    return [[lo, hi, int(k)] for lo, hi, k in ranges(k_by_batch, max_num_seqs)]


def per_batch_and_context(by_cell: Mapping[Cell, V]) -> list[list[Any]]:
    """The 5-item rectangular grid [[bs_lo, bs_hi, ctx_lo, ctx_hi, value], ...]: batch ranges
    from the tuned batches (not merged, so that every context shares them), context ranges
    from the tuned contexts, the last open-ended. A cell that was not tuned takes the value of
    the same context at the nearest smaller tuned batch, else the nearest larger."""
    batches = sorted({b for b, _ in by_cell})
    contexts = sorted({c for _, c in by_cell})
    b_ranges = ranges({b: 0 for b in batches}, merge=False)
    c_ranges = ranges({c: 0 for c in contexts}, CTX_OPEN, merge=False)
    out: list[list[Any]] = []
    for (b_lo, b_hi, _), b in zip(b_ranges, batches):
        for (c_lo, c_hi, _), c in zip(c_ranges, contexts):
            out.append([b_lo, b_hi, c_lo, c_hi, _filled(by_cell, b, c, batches)])
    return out


def _filled(by_cell: Mapping[Cell, V], batch: int, context: int, batches: Sequence[int]) -> V:
    if (batch, context) in by_cell:
        return by_cell[(batch, context)]
    tuned = [b for b in batches if (b, context) in by_cell]
    below = [b for b in tuned if b < batch]
    return by_cell[(max(below) if below else min(tuned), context)]


# ---- the engines' configs ---------------------------------------------------------------------
def vllm_config(method: str, k_by_batch: Mapping[int, int], k_by_cell: Mapping[Cell, int],
                max_num_seqs: int) -> dict[str, Any]:
    """vLLM: `speculative_config` (None where K is 0 everywhere) and the per-context proposal."""
    top = max(k_by_batch.values())
    spec = None if top == 0 else {
        "method": method, "num_speculative_tokens": int(top),
        "num_speculative_tokens_per_batch_size": per_batch_size(k_by_batch, max_num_seqs)}
    grid = per_batch_and_context(k_by_cell)
    top_cell = max(int(e[4]) for e in grid)
    proposal = None if top_cell == 0 else {
        "status": VLLM_PROPOSAL, "num_speculative_tokens": top_cell,
        "num_speculative_tokens_per_batch_size": grid}
    if spec is not None:
        check_vllm(spec, max_num_seqs)
    if proposal is not None:
        check_vllm_per_context(proposal)
    return {"speculative_config": spec, "max_num_seqs": max_num_seqs,
            "speculative_config_per_context_proposal": proposal,
            "note": "" if spec is not None else "K = 0 at every batch size: serve without "
                                                "speculative_config"}


def sglang_config(k_by_batch: Mapping[int, int]) -> dict[str, Any]:
    """SGLang: `speculative_num_steps` and the adaptive config, or None with the reason."""
    if min(k_by_batch.values()) == 0:
        return {"speculative_adaptive_config": None, "speculative_num_steps": None,
                "note": SGLANG_NO_ZERO}
    cfg = {str(lo): {"steps": [int(k)]} for lo, _, k in ranges(k_by_batch)}
    out = {"speculative_num_steps": int(max(k_by_batch.values())),
           "speculative_adaptive_config": cfg, "note": ""}
    check_sglang(cfg, out["speculative_num_steps"])  # type: ignore[arg-type]
    return out


def trtllm_config(k_by_batch: Mapping[int, int]) -> dict[str, Any]:
    """TensorRT-LLM: `max_draft_len` and `draft_len_schedule`, or None with the reason."""
    rng = ranges(k_by_batch)
    top = int(max(k_by_batch.values()))
    first = int(rng[0][2])
    if top == 0:
        return {"max_draft_len": None, "draft_len_schedule": None,
                "note": "K = 0 at every batch size: serve without speculation"}
    if first != top:
        return {"max_draft_len": None, "draft_len_schedule": None,
                "note": f"not expressible: TensorRT-LLM requires draft_len_schedule[1] = "
                        f"max_draft_len (batch 1 drafts the most), and this table's batch-1 "
                        f"K is {first}, below its largest, {top}"}
    schedule = {str(lo): int(k) for lo, _, k in rng}
    check_trtllm(schedule, top)
    return {"max_draft_len": top, "draft_len_schedule": schedule, "note": ""}


def vegas_config(sparsity: float, s_by_batch: Mapping[int, float],
                 s_by_cell: Mapping[Cell, float], max_num_seqs: int) -> dict[str, Any]:
    """vegas-sim's own: the Vegas draft sparsity per range, beside the K tables."""
    return {
        "status": "vegas-sim's own (no engine reads it): the Vegas draft sparsity",
        "sparsity": sparsity,
        "sparsity_per_batch_size": [[lo, hi, float(s)] for lo, hi, s in
                                    ranges(s_by_batch, max_num_seqs)],
        "sparsity_per_batch_size_and_context": per_batch_and_context(s_by_cell),
    }


# ---- the engines' rules -----------------------------------------------------------------------
def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    return value


def _tiles(spans: Sequence[tuple[int, int]], end: int | None, what: str) -> None:
    """Inclusive spans, positive, lo <= hi, sorted, from 1, no gap or overlap, to `end`."""
    if not spans:
        raise ValueError(f"{what}: no ranges")
    expect = 1
    for lo, hi in sorted(spans):
        if lo <= 0 or hi <= 0 or lo > hi:
            raise ValueError(f"{what}: range [{lo}, {hi}] must be positive with lo <= hi")
        if lo < expect:
            raise ValueError(f"{what}: range [{lo}, {hi}] overlaps the one before")
        if lo > expect:
            raise ValueError(f"{what}: gap before [{lo}, {hi}] (from {expect})")
        expect = hi + 1
    if end is not None and expect - 1 != end:
        raise ValueError(f"{what}: ranges end at {expect - 1}, not at {end}")


def check_vllm(spec: Mapping[str, Any], max_num_seqs: int) -> None:
    """vLLM's rules for a dynamic speculative_config: a method, K max >= 1, 3-item entries of
    integers, K in [0, num_speculative_tokens] (vLLM clamps above it: a table asking for more
    would not be served as written), ranges tiling 1..max_num_seqs."""
    if not isinstance(spec.get("method"), str) or not spec["method"]:
        raise ValueError("speculative_config needs a method")
    top = _int(spec.get("num_speculative_tokens"), "num_speculative_tokens")
    if top < 1:
        raise ValueError("num_speculative_tokens must be > 0 with a per-batch-size table")
    table = spec.get("num_speculative_tokens_per_batch_size")
    if not isinstance(table, list) or not table:
        raise ValueError("num_speculative_tokens_per_batch_size must be a non-empty list")
    spans = []
    for entry in table:
        if not isinstance(entry, list | tuple) or len(entry) != 3:
            raise ValueError(f"entry {entry!r} must be [lo, hi, K]")
        lo, hi, k = (_int(x, "a range entry") for x in entry)
        if not 0 <= k <= top:
            raise ValueError(f"K {k} of [{lo}, {hi}] outside [0, num_speculative_tokens={top}]")
        spans.append((lo, hi))
    if top not in {int(e[2]) for e in table}:
        raise ValueError(f"num_speculative_tokens {top} is not the table's largest K")
    _tiles(spans, max_num_seqs, "num_speculative_tokens_per_batch_size")


def check_vllm_per_context(spec: Mapping[str, Any]) -> None:
    """The proposal's rules: 5-item integer entries, batch ranges tiling from 1, context
    ranges contiguous from 1 and the last open-ended, one entry per (batch range, context
    range) — rectangular, no duplicate — and K in [0, num_speculative_tokens]."""
    top = _int(spec.get("num_speculative_tokens"), "num_speculative_tokens")
    table = spec.get("num_speculative_tokens_per_batch_size")
    if not isinstance(table, list) or not table:
        raise ValueError("the per-context table must be a non-empty list")
    cells: set[tuple[int, int, int, int]] = set()
    for entry in table:
        if not isinstance(entry, list | tuple) or len(entry) != 5:
            raise ValueError(f"entry {entry!r} must be [bs_lo, bs_hi, ctx_lo, ctx_hi, K]")
        b_lo, b_hi, c_lo, c_hi, k = (_int(x, "a range entry") for x in entry)
        if not 0 <= k <= top:
            raise ValueError(f"K {k} outside [0, num_speculative_tokens={top}]")
        if (b_lo, b_hi, c_lo, c_hi) in cells:
            raise ValueError(f"duplicate cell {entry!r}")
        cells.add((b_lo, b_hi, c_lo, c_hi))
    b_spans = sorted({(c[0], c[1]) for c in cells})
    c_spans = sorted({(c[2], c[3]) for c in cells})
    _tiles(b_spans, None, "batch ranges")
    _tiles(c_spans, CTX_OPEN, "context ranges")
    if len(cells) != len(b_spans) * len(c_spans):
        raise ValueError(f"not rectangular: {len(cells)} entries for {len(b_spans)} batch x "
                         f"{len(c_spans)} context ranges")


def check_sglang(cfg: Mapping[str, Any], num_steps: int) -> None:
    """SGLang's rules: integer-string batch keys (a key below every batch is 1, so each batch
    has a slot), each {"steps": non-empty list of positive ints}, none above
    speculative_num_steps."""
    keys = []
    for key, entry in cfg.items():
        try:
            keys.append(int(key))
        except ValueError:
            continue  # a global override (ema_alpha, ...)
        steps = entry.get("steps") if isinstance(entry, dict) else None
        if (not isinstance(steps, list) or not steps
                or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0
                           for s in steps)):
            raise ValueError(f"batch {key}: steps must be a non-empty list of positive ints, "
                             f"got {steps!r}")
        if max(steps) > num_steps:
            raise ValueError(f"batch {key}: step {max(steps)} above speculative_num_steps "
                             f"{num_steps}")
    if 1 not in keys:
        raise ValueError("the adaptive config needs batch key '1'")


def check_trtllm(schedule: Mapping[str, int], max_draft_len: int) -> None:
    """TensorRT-LLM's rules: thresholds >= 1 including 1, lengths >= 0 and <= max_draft_len,
    schedule[1] = max_draft_len, max_draft_len > 0."""
    if max_draft_len < 1:
        raise ValueError("max_draft_len must be > 0")
    table = {int(k): v for k, v in schedule.items()}
    for batch, length in table.items():
        if batch < 1:
            raise ValueError(f"threshold {batch} must be >= 1")
        if not 0 <= _int(length, "a draft length") <= max_draft_len:
            raise ValueError(f"draft length {length} at {batch} outside [0, {max_draft_len}]")
    if table.get(1) != max_draft_len:
        raise ValueError(f"draft_len_schedule[1] = {table.get(1)} must equal max_draft_len "
                         f"{max_draft_len}")
