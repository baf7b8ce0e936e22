"""Tune's choices in the shape a serving engine reads: vLLM's
`num_speculative_tokens_per_batch_size`.

vLLM takes a list of inclusive batch-size ranges with the number of speculative tokens K to
use in each, ``[[lo, hi, K], ...]`` (e.g. ``[[1, 64, 3], [65, 128, 1]]``). From tuned batch
sizes b₁ < b₂ < … < bₙ with γ₁ … γₙ, range i is [bᵢ, bᵢ₊₁ − 1], the first starts at 1 (a batch
below b₁ uses b₁'s γ) and the last ends at bₙ (above it nothing was tuned; a server with a
larger max_num_seqs may extend the last range, at its own risk). Neighbouring ranges with
the same K are merged.

Where the tuned contexts differ, ``by_context_range`` gives one such list per context range,
``[[ctx_lo, ctx_hi, [[lo, hi, K], ...]], ...]``, the context ranges built the same way from
the tuned contexts; ``sparsity_by_context_range`` has the same shape with each cell's
sparsity in place of K.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

V = TypeVar("V", int, float)
Ranges = list[list[int]]


def ranges(values: Mapping[int, V]) -> list[tuple[int, int, V]]:
    """{key: value} → inclusive [lo, hi] ranges tiling 1 .. max key, equal neighbours merged."""
    keys = sorted(values)
    out: list[tuple[int, int, V]] = []
    for i, key in enumerate(keys):
        lo = 1 if i == 0 else key
        hi = keys[i + 1] - 1 if i + 1 < len(keys) else key
        if out and out[-1][2] == values[key]:
            out[-1] = (out[-1][0], hi, values[key])
        else:
            out.append((lo, hi, values[key]))
    return out


def per_batch_size(gamma_by_batch: Mapping[int, int]) -> list[list[int]]:
    """vLLM's `num_speculative_tokens_per_batch_size`: [[lo, hi, K], ...]."""
    return [[lo, hi, int(k)] for lo, hi, k in ranges(gamma_by_batch)]


def by_context_range(by_context: Mapping[int, Mapping[int, V]]) -> list[list[object]]:
    """{context: {batch: value}} → [[ctx_lo, ctx_hi, [[lo, hi, value], ...]], ...]."""
    contexts = sorted(by_context)
    out: list[list[object]] = []
    for i, ctx in enumerate(contexts):
        lo = 1 if i == 0 else ctx
        hi = contexts[i + 1] - 1 if i + 1 < len(contexts) else ctx
        out.append([lo, hi, [[b_lo, b_hi, v] for b_lo, b_hi, v in ranges(by_context[ctx])]])
    return out
