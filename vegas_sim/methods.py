"""The methods, their phases, and the budget rule: the vocabulary shared by calibrate/ and sim/.

Conventions (DESIGN.md, Vocabulary):
- `context` C: tokens in a request's KV cache at the start of an iteration (the verified
  context; t0, the token sampled at the end of the previous iteration, is *not* yet in it).
- An iteration drafts `gamma` tokens with sparse attention, then verifies t0, d1..dγ in one pass
  of γ+1 query rows over C + γ + 1 keys.
- Acceptance length = 1 + accepted drafts (includes the bonus token, vLLM convention).

`iteration_plan` lists, for one iteration of a batch, every timed phase with the exact
quantities the latency model is a function of. Calibration records latency rows with the same
quantities, so the two halves agree by construction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vegas_sim.bounds import BOUNDS
from vegas_sim.errors import UserInputError

@dataclass(frozen=True)
class Method:
    """What a method is, for every module that must tell methods apart.

    ``draft``: how the draft picks the keys it attends to — ``none`` (vanilla: no draft),
    ``selected-keys`` (top-k of the verify pass's collected scores: the Vegas family and
    SpecExtend), ``streaming`` (StreamingLLM sinks + recent window), ``quest-pages`` (Quest's
    top pages by page-metadata score). ``selection_phases``: the phases that build that choice
    once per iteration. ``collects``: the verify rows whose scores it writes out — ``none``,
    ``first_last`` (Collect-2-Query: t0 and dγ) or ``all`` (every verify row), the verify
    kernel's collection modes. ``selects_from``: the collected rows a selection ranks by —
    ``mean`` (their weights averaged) or ``last_accepted`` (the last accepted token's row
    alone, known only after acceptance); '' when it does not select.
    """

    name: str
    draft: str
    selection_phases: tuple[str, ...]
    collects: str
    selects_from: str = ""

    @property
    def drafts(self) -> bool:
        return self.draft != "none"

    @property
    def selects_keys(self) -> bool:
        """The draft attends to keys ranked by the verify pass's scores (budget over C + 1)."""
        return self.draft == "selected-keys"

    @property
    def quest_pages(self) -> bool:
        return self.draft == "quest-pages"

    @property
    def streaming(self) -> bool:
        return self.draft == "streaming"

    def query_rows(self, gamma: int) -> int:
        """Tokens one iteration writes into the KV cache and verifies: t0 and the γ drafts
        (vanilla: the one new token). Also the KV slots a step reserves."""
        return gamma + 1 if self.drafts else 1

    def collect_rows(self, gamma: int) -> int:
        """Query rows whose scores the verify kernel writes out (0 = plain verify)."""
        if self.collects == "first_last":
            return min(2, gamma + 1)
        return gamma + 1 if self.collects == "all" else 0


VANILLA = "vanilla"
METHOD_TABLE: dict[str, Method] = {m.name: m for m in (
    Method(VANILLA, "none", (), "none"),
    Method("magicdec-stream", "streaming", ("other",), "none"),
    Method("magicdec-quest", "quest-pages", ("other", "quest_meta"), "none"),
    Method("specextend", "selected-keys", ("select",), "all", "last_accepted"),
    Method("vegas", "selected-keys", ("select",), "first_last", "mean"),
    Method("vegas-all", "selected-keys", ("select",), "all", "mean"),
)}
METHODS: tuple[str, ...] = tuple(METHOD_TABLE)
SPEC_METHODS: tuple[str, ...] = tuple(m for m in METHODS if METHOD_TABLE[m].drafts)
PHASES: tuple[str, ...] = (
    "decode", "draft_step", "verify", "collect", "select", "quest_meta", "sample", "prefill",
    "other",
)

MIN_TOKENS = 256  # Vegas budget floor (reference code default)
SINK_TOKENS = 16  # StreamingLLM attention sinks for magicdec-stream
QUEST_PAGE = 16  # Quest page size in tokens
DEFAULT_SPARSITY = 0.07
MAX_VERIFY_ROWS = 16  # query rows one verify pass takes (γ + 1): the verify kernel's M tile


def check_method(method: str) -> str:
    if method not in METHODS:
        raise UserInputError(f"unknown method {method!r}", fix=f"use one of: {', '.join(METHODS)}")
    return method


def method_of(method: str) -> Method:
    """The method's record (`UserInputError` for an unknown name)."""
    return METHOD_TABLE[check_method(method)]


def drafts(method: str) -> bool:
    """Whether the method drafts (every method but vanilla)."""
    return method_of(method).drafts


def query_rows(method: str, gamma: int) -> int:
    """`Method.query_rows`: γ + 1, or 1 for vanilla."""
    return method_of(method).query_rows(gamma)


def check_gamma(gamma: int) -> int:
    if gamma < 1:
        raise UserInputError(f"gamma must be >= 1, got {gamma}", where="--gamma",
                             fix="draft at least one token")
    return int(BOUNDS["gamma"].check(gamma))


def check_sparsity(sparsity: float) -> float:
    if not (0.0 < sparsity <= 1.0):
        raise UserInputError(
            f"sparsity must be in (0, 1], got {sparsity}", where="--sparsity",
            fix="pass the fraction of the context the draft attends to, e.g. 0.07",
        )
    return sparsity


def point_of(method: str, gamma: int, sparsity: float) -> tuple[int, float]:
    """The (γ, sparsity) a method's configuration has: vanilla drafts nothing, so it is γ 1,
    sparsity 1 (one token per step, full attention) whatever was asked."""
    return (gamma, sparsity) if drafts(method) else (1, 1.0)


def collect_rows(method: str, gamma: int) -> int:
    """`Method.collect_rows`: query rows whose scores the verify kernel writes out."""
    return method_of(method).collect_rows(gamma)


def budget(
    sparsity: float | np.ndarray,
    length: int | np.ndarray,
    max_len: int,
    min_tokens: int = MIN_TOKENS,
) -> np.ndarray:
    """Selected KV entries: clamp(ceil(s·len), min_tokens, ceil(s·max_len)), capped at `length`.

    DESIGN.md writes clamp(x, lo, hi); when s·max_len < min_tokens the floor wins (a short
    model context must not get a budget below the floor), so the upper bound is
    max(ceil(s·max_len), min_tokens). `length` is the rankable length (C + 1 for Vegas).
    `sparsity` may be one value or one per element of `length` (a batch whose requests
    draft at different sparsities).
    """
    length_arr = np.asarray(length, dtype=np.int64)
    s = np.asarray(sparsity, dtype=np.float64)
    raw = np.ceil(s * length_arr - 1e-9).astype(np.int64)
    hi = np.maximum(np.ceil(s * max_len - 1e-9).astype(np.int64), min_tokens)
    return np.minimum(np.clip(raw, min_tokens, hi), length_arr)


@dataclass(frozen=True)
class PhaseCall:
    """One timed phase inside an iteration.

    `kv_read` is per request (entries attended, or pages scored for quest_meta); `repeats` is
    how many times the phase runs per iteration (γ for draft steps).
    """

    phase: str
    repeats: int
    n_query: int
    kv_read: np.ndarray  # [batch] int64
    collect_rows: int = 0

    @property
    def batch(self) -> int:
        return int(self.kv_read.shape[0])


def draft_kv_read(
    method: str, sparsity: float, contexts: np.ndarray, max_len: int, step: int,
    min_tokens: int = MIN_TOKENS,
) -> np.ndarray:
    """KV entries the draft attends to at draft step `step` (1..γ) for each request.

    The forced tail is every position after C: t0 plus the `step - 1` drafts written so far
    plus the token being drafted from, i.e. `step` entries.
    """
    contexts = np.asarray(contexts, dtype=np.int64)
    m = method_of(method)
    if m.selects_keys:
        selected = budget(sparsity, contexts + 1, max_len, min_tokens)  # ranks [0, C]
        selected = np.minimum(selected, contexts)  # t0 is in the tail, not double-counted
    elif m.streaming:
        selected = np.minimum(budget(sparsity, contexts, max_len, min_tokens), contexts)
    elif m.quest_pages:
        b = budget(sparsity, contexts, max_len, min_tokens)
        pages = np.maximum(b // QUEST_PAGE, 1) + 1  # top pages + the current page
        selected = np.minimum(pages * QUEST_PAGE, contexts)
    else:
        raise UserInputError(f"{method!r} does not draft", fix="pass a drafting method")
    return selected + step


def window_kv_read(window: int, contexts: np.ndarray, n_query: int | np.ndarray) -> np.ndarray:
    """KV entries one sliding-window layer reads per request in a pass of `n_query` rows over
    a context of C tokens: the union of the rows' windows, min(W + n_query − 1, C + n_query).

    The same in draft and verify (a window layer runs its window in both). A draft step k
    reads min(W, C + k); it is counted as min(W, C + 1) here (they differ only when C < W − 1,
    contexts far below any draft budget), so a latency row needs no draft-step index.
    """
    contexts = np.asarray(contexts, dtype=np.int64)
    return np.minimum(window + n_query - 1, contexts + n_query)


# Methods whose draft builds its index once per iteration ('other': StreamingLLM index lists,
# Quest page counts and Quest's page-metadata update after acceptance); the selected-keys
# methods build theirs in 'select'.
INDEX_PREP_METHODS = tuple(
    m.name for m in METHOD_TABLE.values() if "other" in m.selection_phases)


def iteration_plan(
    method: str,
    gamma: int,
    contexts: np.ndarray,
    sparsity: float,
    max_len: int,
    min_tokens: int = MIN_TOKENS,
) -> list[PhaseCall]:
    """The phases of one iteration for a batch whose requests hold `contexts` tokens."""
    contexts = np.asarray(contexts, dtype=np.int64)
    m = method_of(method)
    if not m.drafts:
        return [
            PhaseCall("decode", 1, 1, contexts + 1),
            PhaseCall("sample", 1, 1, contexts + 1),
        ]
    plan: list[PhaseCall] = []
    if "other" in m.selection_phases:
        plan.append(PhaseCall("other", 1, 1, contexts))
    for step in range(1, gamma + 1):
        plan.append(PhaseCall(
            "draft_step", 1, 1, draft_kv_read(method, sparsity, contexts, max_len, step, min_tokens)
        ))
        if "quest_meta" in m.selection_phases:
            plan.append(PhaseCall("quest_meta", 1, 1, (contexts + step) // QUEST_PAGE + 1))
    rows = m.collect_rows(gamma)
    plan.append(PhaseCall("verify", 1, gamma + 1, contexts + gamma + 1, rows))
    if rows:
        plan.append(PhaseCall("select", 1, 1, contexts + 1, rows))
    plan.append(PhaseCall("sample", 1, gamma + 1, contexts + gamma + 1))
    return plan
