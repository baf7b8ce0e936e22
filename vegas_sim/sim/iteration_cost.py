"""Fast evaluator of one iteration's time (`IterationCost`) for a fixed (method, gamma,
sparsity) of a fitted `latency.LatencyModel`: every GPU feature except gemm/logits is linear in
Σ kv_read, so a whole iteration is a few numpy reductions of the context array and a max per
phase call (closed form over the γ draft steps). A hybrid-attention model's window layers read
per request (methods.window_kv_read), so its iterations take the per-phase `breakdown` path."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from vegas_sim.methods import QUEST_PAGE, method_of, point_of, window_kv_read
from vegas_sim.models import ModelSpec
from vegas_sim.sim.latency_features import FEATURE_INDEX, Physics
from vegas_sim.sim.latency_fit import FittedGroup


class PhasePricing(Protocol):
    """What `IterationCost` needs of a latency model (`latency.LatencyModel` is one): the
    model's shape, the roofline constants, the fit of each (phase, method) and the
    tensor-parallel collectives and batch residual it adds to a call."""

    @property
    def model(self) -> ModelSpec: ...

    @property
    def physics(self) -> Physics: ...

    def fitted_group(self, phase: str, method: str) -> FittedGroup: ...

    def measures(self, phase: str, method: str) -> bool: ...

    def comm_ms(self, phase: str, rows: int) -> tuple[float, float]: ...

    def batch_factor(self, grp: FittedGroup, batch: int) -> float: ...


def _steps_max_sum(h: float, a: float, b: float, n: int) -> float:
    """Σ_{k=1..n} max(h, a + b·k) in closed form (b ≥ 0): the first k* steps sit on the floor."""
    if b <= 0.0:
        return n * max(h, a)
    k_star = min(max(math.floor((h - a) / b), 0), n)  # a + b·k ≤ h  ⇔  k ≤ (h − a) / b
    return k_star * h + (n - k_star) * a + b * (n * (n + 1) - k_star * (k_star + 1)) / 2


def _steps_max_sum_rows(h: float, a: np.ndarray, b: float, n: int) -> np.ndarray:
    """`_steps_max_sum` for an array of `a` [K], elementwise the same operations in the same
    order (so each entry equals the scalar call bit for bit)."""
    if b <= 0.0:
        return n * np.maximum(h, a)
    k_star = np.minimum(np.maximum(np.floor((h - a) / b), 0.0), float(n))
    return k_star * h + (n - k_star) * a + b * (n * (n + 1) - k_star * (k_star + 1)) / 2


@dataclass
class _Term:
    """One plan entry: `repeats` calls of a phase, each costing serial + max(host, gpu).

    gpu of one call = intercept(B) + slope · kv_sum where, per kind,
      "single": kv_sum = a·ΣC + d·B                      (decode, verify, select, sample)
      "steps":  kv_sum of step k = Σsel + B·k, k=1..γ    (draft_step)
      "quest":  kv_sum of step k = Σ_b (C_b + k)//16 + B (quest_meta)
    """

    phase: str
    group: FittedGroup
    kind: str
    repeats: int
    n_query: int
    rows: int
    slope: float  # ms per unit Σ kv_read
    a: float
    d: float
    window_slope: float = 0.0  # ms per unit Σ window read (hybrid models' window layers)
    per_request_slope: float = 0.0  # ms per unit Σ kv_read / B (the per_request feature)

    def slope_at(self, batch: int) -> float:
        """ms per unit Σ kv_read for a batch of `batch` requests."""
        return self.slope + self.per_request_slope / max(1, batch)


class IterationCost:
    """Fast evaluator of one iteration's time for a fixed (method, gamma, sparsity).

    Called once per simulated iteration: a few numpy reductions over the context array, a
    per-batch-size cache of the GEMM part, and one max(host, gpu) per phase call (closed form
    over the γ draft steps). Agrees with summing `phase_ms` over `methods.iteration_plan` to
    rounding.
    """

    def __init__(
        self, model: PhasePricing, method: str, gamma: int, sparsity: float, min_tokens: int,
    ) -> None:
        self.method = method
        self._spec = method_of(method)
        self.gamma = point_of(method, gamma, sparsity)[0]
        self.sparsity = sparsity
        self.min_tokens = min_tokens
        self._model = model
        max_len = model.model.max_positions
        self._hi = max(math.ceil(sparsity * max_len - 1e-9), min_tokens)
        assert QUEST_PAGE == 16  # _quest_steps uses >> 4 and & 15
        # [16, γ] (r + k) // 16 for r = C % 16 and draft step k
        self._quest_m = (
            (np.arange(QUEST_PAGE)[:, None] + np.arange(1, gamma + 1)[None, :]) // QUEST_PAGE
        ).astype(np.float64) if self._spec.quest_pages else None
        self._terms = self._build_terms()
        self._window = model.physics.window  # hybrid model: per-request window reads
        self._hybrid = any(t.window_slope for t in self._terms)
        # per batch size, per term: (GPU ms independent of kv_read, host floor ms)
        self._base: dict[int, list[tuple[float, float]]] = {}
        self._fast: dict[int, list[tuple[_Term | None, float, float, float, float, float]]] = {}
        self._selects = self._spec.drafts
        # every term priced by Σ contexts alone: `of_sums` evaluates many iterations at once
        self.sum_only = not (self._hybrid or self._selects) and all(
            t.kind == "single" for t in self._terms)
        self._sel_buf = np.empty(0, dtype=np.float64)  # _selected_sum's scratch [>= B]

    def _build_terms(self) -> list[_Term]:
        g, m = self.gamma, self.method
        terms: list[_Term] = []

        def add(phase: str, kind: str, repeats: int, nq: int, rows: int, a: float,
                d: float) -> None:
            grp = self._model.fitted_group(phase, m)
            phys = self._model.physics
            f = phys.slope_features(phase, nq, rows) * grp.gpu_coef  # [n_features], B = 1
            per_request = float(f[FEATURE_INDEX["per_request"]])
            wslope = float(phys.window_features(phase, nq) @ grp.gpu_coef)
            comm_per_key = self._model.comm_ms(phase, nq)[1]  # tensor parallel; 0 on one GPU
            terms.append(_Term(phase, grp, kind, repeats, nq, rows,
                               float(f.sum()) - per_request + comm_per_key, a, d, wslope,
                               per_request))

        spec = self._spec
        if not spec.drafts:
            add("decode", "single", 1, 1, 0, 1.0, 1.0)  # kv_read = C + 1
            add("sample", "single", 1, 1, 0, 1.0, 1.0)
            return terms
        if self._model.measures("other", m):
            add("other", "single", 1, 1, 0, 1.0, 0.0)  # once per iteration, kv_read = C
        add("draft_step", "steps", g, 1, 0, 0.0, 0.0)  # step k reads sel + k
        if "quest_meta" in spec.selection_phases:
            add("quest_meta", "quest", g, 1, 0, 0.0, 0.0)  # step k scores (C + k)//16 + 1 pages
        rows = spec.collect_rows(g)
        add("verify", "single", 1, g + 1, rows, 1.0, float(g + 1))
        if rows:
            add("select", "single", 1, 1, rows, 1.0, 1.0)
        add("sample", "single", 1, g + 1, 0, 1.0, float(g + 1))
        return terms

    def _intercepts(self, batch: int) -> list[tuple[float, float]]:
        """Per term, (ms of the GPU work that does not depend on kv_read (GEMMs, logits), the
        host floor of one call at this batch)."""
        base = self._base.get(batch)
        if base is None:
            phys = self._model.physics
            base = [(float(phys.intercept_features(batch, t.n_query, t.rows) @ t.group.gpu_coef)
                     + self._model.comm_ms(t.phase, batch * t.n_query)[0],
                     t.group.floor(batch * t.n_query)) for t in self._terms]
            self._base[batch] = base
        return base

    def _selected_sum(self, c: np.ndarray) -> float:
        """Σ over requests of the draft's selected entries (methods.draft_kv_read minus step).

        Same arithmetic as methods.budget (ceil(s·len − 1e-9), floor, cap, ≤ len) written with
        in-place ufuncs: this runs once per simulated iteration.
        """
        if self._sel_buf.shape[0] < c.shape[0]:
            self._sel_buf = np.empty(c.shape[0], dtype=np.float64)
        x = self._sel_buf[: c.shape[0]]  # [B] float64, reused: no allocation per iteration
        np.multiply(c, self.sparsity, out=x)
        # rankable length c + 1 for the Vegas family (s·(c + 1) = s·c + s), else c
        x += (self.sparsity if self._spec.selects_keys else 0.0) - 1e-9
        np.ceil(x, out=x)
        np.maximum(x, self.min_tokens, out=x)
        np.minimum(x, self._hi, out=x)
        np.minimum(x, c, out=x)  # ≤ len, and the t0 of Vegas/SpecExtend sits in the tail
        if self._spec.quest_pages:
            np.floor_divide(x, QUEST_PAGE, out=x)  # top pages + the current page
            np.maximum(x, 1, out=x)
            x += 1
            x *= QUEST_PAGE
            np.minimum(x, c, out=x)
        return float(np.add.reduce(x))

    def _selected_sums(self, c: np.ndarray) -> np.ndarray:
        """[K] `_selected_sum` of each row of `c` [K, B]: the same elementwise operations; each
        row's sum adds integers, so it is exact in any order."""
        x = c.astype(np.float64)
        np.multiply(x, self.sparsity, out=x)
        x += (self.sparsity if self._spec.selects_keys else 0.0) - 1e-9
        np.ceil(x, out=x)
        np.maximum(x, self.min_tokens, out=x)
        np.minimum(x, self._hi, out=x)
        np.minimum(x, c, out=x)
        if self._spec.quest_pages:
            np.floor_divide(x, QUEST_PAGE, out=x)
            np.maximum(x, 1, out=x)
            x += 1
            x *= QUEST_PAGE
            np.minimum(x, c, out=x)
        return np.add.reduce(x, axis=1)

    def _quest_steps(self, c: np.ndarray) -> np.ndarray:
        """[γ] pages scored by quest_meta at draft step k: Σ_b ((C_b + k) // 16 + 1)."""
        assert self._quest_m is not None
        hist = np.bincount(c & 15, minlength=QUEST_PAGE).astype(np.float64)  # [16]
        return np.asarray(float(np.add.reduce(c >> 4) + c.shape[0]) + hist @ self._quest_m)

    def _term_ms(self, t: _Term, base: float, h: float, batch: int, csum: float, c: np.ndarray,
                 sel: float) -> float:
        """GPU-or-host part of all `repeats` calls of one term (serial part excluded); h is the
        host floor of one call."""
        slope = t.slope_at(batch)
        if t.kind == "single":
            return max(h, base + slope * (t.a * csum + t.d * batch))
        if t.kind == "steps":
            return _steps_max_sum(h, base + slope * sel, slope * batch, t.repeats)
        # step k scores Σ_b ((C_b + k)//16 + 1) pages, between p16 + B and p16 + B·(1 + ⌈γ/16⌉)
        p16 = float(np.add.reduce(c >> 4)) + batch
        if base + slope * (p16 + batch * ((t.repeats + 15) // 16)) <= h:
            return t.repeats * h  # every step host-bound (the usual case: a tiny kernel)
        gpu = base + slope * self._quest_steps(c)  # [γ]
        return float(np.add.reduce(np.maximum(gpu, h)))

    def __call__(self, contexts: np.ndarray) -> float:
        """Total iteration time in ms for a batch whose requests hold `contexts` tokens.

        `contexts` must be an integer numpy array [B] (the engine's per-request contexts).
        """
        c = contexts  # [B] int64
        if self._hybrid:
            return sum(self.breakdown(c).values())
        batch = c.shape[0]
        fast = self._fast.get(batch)
        if fast is None:
            fast = self._fast_terms(batch)
        csum = float(np.add.reduce(c))
        sel = self._selected_sum(c) if self._selects else 0.0
        total = 0.0
        for t, g0, h, per_c, serial, f in fast:
            if t is None:  # a "single" term, inlined: this is the hot path
                total += f * (serial + max(g0 + per_c * csum, h))
            else:
                total += f * (serial + self._term_ms(t, g0, h, batch, csum, c, sel))
        return total

    def of_sums(self, csums: np.ndarray, batch: int) -> np.ndarray:
        """[K] the times of K iterations of `batch` requests whose contexts sum to `csums` [K]
        (float64 of integers), each what `__call__` returns for such a batch, bit for bit (the
        same operations in the same order, elementwise): the engine prices vanilla iterations
        many at once through it. Only for a cost of the sum alone (`sum_only`; not a drafting
        method's selection, nor window layers)."""
        if not self.sum_only:
            raise ValueError(f"{self.method}'s iteration time is not a function of Σ contexts")
        fast = self._fast.get(batch)
        if fast is None:
            fast = self._fast_terms(batch)
        total = np.zeros(csums.shape[0], dtype=np.float64)
        for _, g0, h, per_c, serial, f in fast:
            total += f * (serial + np.maximum(g0 + per_c * csums, h))
        return total

    def of_contexts(self, contexts: np.ndarray) -> np.ndarray:
        """[K] the times of K iterations whose requests hold `contexts` [K, B] (int64) tokens:
        row k's entry is what `__call__(contexts[k])` returns, bit for bit (the same operations
        in the same order, elementwise over the rows; sums of integers are exact). The engine
        evaluates a drafting method's iterations many at once through it."""
        c = contexts
        if self._hybrid:  # window layers: per-phase breakdown per row
            return np.array([self(row) for row in c], dtype=np.float64)
        batch = c.shape[1]
        fast = self._fast.get(batch)
        if fast is None:
            fast = self._fast_terms(batch)
        csum = np.add.reduce(c, axis=1).astype(np.float64)  # exact integer sums
        sel = self._selected_sums(c) if self._selects else np.zeros(c.shape[0])
        total = np.zeros(c.shape[0], dtype=np.float64)
        for t, g0, h, per_c, serial, f in fast:
            if t is None:
                total += f * (serial + np.maximum(g0 + per_c * csum, h))
            else:
                total += f * (serial + self._term_rows(t, g0, h, batch, csum, c, sel))
        return total

    def _term_rows(self, t: _Term, base: float, h: float, batch: int, csum: np.ndarray,
                   c: np.ndarray, sel: np.ndarray) -> np.ndarray:
        """`_term_ms` of each row (a draft-steps or a Quest-scoring term)."""
        slope = t.slope_at(batch)
        if t.kind == "steps":
            return _steps_max_sum_rows(h, base + slope * sel, slope * batch, t.repeats)
        p16 = np.add.reduce(c >> 4, axis=1).astype(np.float64) + batch
        out = np.full(c.shape[0], t.repeats * h)  # every step host-bound (the usual case)
        for k in np.flatnonzero(base + slope * (p16 + batch * ((t.repeats + 15) // 16)) > h):
            out[k] = self._term_ms(t, base, h, batch, float(csum[k]), c[k], float(sel[k]))
        return out

    def _fast_terms(self, batch: int
                    ) -> list[tuple[_Term | None, float, float, float, float, float]]:
        """Per term at this batch size: (None for a "single" term, else the term; its GPU ms
        without the Σ C part (single) or its intercept (others); host floor; ms per unit ΣC;
        serial ms of its repeats; batch residual factor)."""
        out: list[tuple[_Term | None, float, float, float, float, float]] = []
        for t, (b, h) in zip(self._terms, self._intercepts(batch)):
            serial = t.repeats * t.group.serial
            f = self._model.batch_factor(t.group, batch)
            if t.kind == "single":
                slope = t.slope_at(batch)
                out.append((None, b + slope * t.d * batch, h, slope * t.a, serial, f))
            else:
                out.append((t, b, h, 0.0, serial, f))
        self._fast[batch] = out
        return out

    def breakdown(self, contexts: np.ndarray) -> dict[str, float]:
        """ms per phase (draft_step summed over the γ steps, etc.)."""
        c = np.asarray(contexts, dtype=np.int64)
        batch = c.shape[0]
        base = self._intercepts(batch)
        csum = float(c.sum())
        sel = self._selected_sum(c) if self._selects else 0.0
        fast = self._fast.get(batch)
        if fast is None:
            fast = self._fast_terms(batch)  # each term's serial ms and batch factor, kept
        out: dict[str, float] = {}
        for t, (b, h), (_, _, _, _, serial, f) in zip(self._terms, base, fast):
            if t.window_slope:  # window layers: Σ_b min(W + n_query − 1, C_b + n_query)
                b += t.window_slope * float(window_kv_read(self._window, c, t.n_query).sum())
            ms = serial + self._term_ms(t, b, h, batch, csum, c, sel)
            out[t.phase] = out.get(t.phase, 0.0) + ms * f
        return out
