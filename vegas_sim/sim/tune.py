"""Tune (γ, sparsity) per (batch, context) cell with the paper's three-step strategy.

Per cell (all cells advance together, each step one parallel sweep):

1. **Where acceptance stabilises.** At a large γ (`probe_gamma`, default 12: long drafts
   magnify differences in per-position acceptance), sweep sparsity over a coarse grid. The
   stable sparsity s₁ is the *smallest* s whose mean acceptance length is within
   `stable_pct` % (default 5 %) of the largest acceptance length seen in the sweep. Beyond it
   the draft gets more expensive but barely more accurate.
2. **γ for throughput.** At s₁, sweep γ (`gamma`, default 1..12); γ* = argmax throughput.
3. **Refine sparsity.** With γ* fixed, sweep sparsity on a finer grid (`refine_step`, default
   0.005) between the coarse neighbours of s₁; s* = argmax throughput. Step 3 may move s
   below s₁ when a cheaper draft wins. While s* lands on an edge of the window, the window
   is widened by its own width past that edge ("3-widen") and searched again, down to
   `refine_step` and up to 1 (a note says when s* stops at such a bound).
4. **Serving table.** A server runs one sparsity: the one step 3 found best in most cells (ties to the
   smaller), s_g. At s_g, sweep γ in every cell ("4-serving"); the per-batch γ table is
   chosen from these rows, so the JSON's top-level sparsity is the one its γ table holds at.

**The box and the evidence.** The search stays in a box of γ (`gamma_range`, `--gamma`) and
sparsity (`sparsity_range`, `--sparsity`); by default the span the acceptance traces support
for the method (`Evidence`: γ up to the largest traced, sparsity between the smallest and the
largest traced). A point of a wider box outside that span is ranked by the low end of its
prediction interval (`outside_evidence="pi_low"`: its score × pi_low / throughput, the
interval widening with the distance from the evidence) or not searched at all
("exclude": the box is clipped to the span); the row's `ranked_by` says which figure ranked
it, `on_evidence` whether it lies in the span. Where the chosen point lies on the box's edge
(γ at its top, sparsity at either end), the model is asked what lies past it (γ + 1 …
γ + `BEYOND_GAMMA`, sparsity × 2^(±½, ±1)): the cell's `edge_*` columns and a note say how
much a wider box could gain, by the value and by pi_low.

**Selection** (`select`: best by the objective, a tie band to the smaller K, made conservative):
among the configurations of the tuned method evaluated in any step whose prediction
interval's low end beats vanilla (pi_low-scaled score above vanilla's score), the best by
`rank_by`, with a tie band: every configuration within `tie_pct` % (default 1 %) of the best
goes to the smallest γ, then the smallest sparsity. **K = 0**: where no speculative
configuration beats vanilla by its interval, or vanilla lies in the tie band, the
recommendation is no speculation (`k` 0, `k_reason` says which) and the exports say K = 0
where the format can; the cell still shows the best speculative configuration found.
`chosen_step` names the step that evaluated the choice.

Baselines: each of `baselines` (magicdec-stream, magicdec-quest, specextend by default) gets
its own best (γ, s) by a full sweep of `baseline_gamma` × the coarse sparsity grid; the best
baseline is the one with the highest throughput. Ties anywhere go to the smaller γ / sparsity.

**Ranking** (`rank_by`, `vegas_sim.sim.ranking`): "throughput" (default), "goodput" (tokens/s
of requests meeting the SLOs in `extra`: slo_tpot_ms / slo_ttft_ms; refused without one) or
"tpot" (lowest TPOT p50). Every "best" above — γ*, s*, the choice, the best baseline, the
serving γ table — is by that metric; step 1 stays on acceptance.

The search uses `search_engine` (default "analytic": fast and deterministic). **The final
ranking is made with the engine whose numbers are reported** (`rank engine`): `final_engine`
when it differs from the search engine; else, in a cell where the KV cache binds (the
analytic engine's mean running batch below the batch: there its closed form, without
preemption, reads high), `kv_bound_engine` (default "sim"). In such a cell the
configurations within `RERANK_PCT` % of the search's best (at most `RERANK_MAX`), vanilla and
the best baseline are run again with the rank engine ("final" step), the selection rule is
applied to those rows, and step 4 runs there with it too; `engine` and `ranked_with` say so.
The search engine's value of the choice stays in `search_throughput_tok_s`. The speedup over the best baseline has a 95 %
CI obtained by adding the two log-scale half-widths in quadrature (independent runs):
ratio · exp(±√(h₁² + h₂²)), hᵢ = ½·ln(highᵢ / lowᵢ).

Output: `TuneResult.cells` (one row per cell), `TuneResult.steps` (every evaluated
configuration, with `step`), and `TuneResult.serving_table()` — the JSON a serving engine can
consume (vLLM, SGLang, TensorRT-LLM and our sparsity; format in `vegas_sim.sim.serving`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from vegas_sim.errors import DoesNotFitError, UserInputError
from vegas_sim.methods import SPEC_METHODS, check_gamma, check_method, check_sparsity
from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.latency import LatencyModel
from vegas_sim.sim.predict import (
    PROVENANCE_COLUMNS,
    Scenario,
    is_extrapolated,
    skipped_notes,
    split_fitting,
)
from vegas_sim.sim.options import OUTSIDE_EVIDENCE
from vegas_sim.sim.ranking import check_rank_by, score
from vegas_sim.sim.roofline import ROOFLINE_COLUMNS
from vegas_sim.sim.serving import sglang_config, trtllm_config, vegas_config, vllm_config
from vegas_sim.sim.sweep import Estimate, SweepRunner

TuneProgress = Callable[[str, int, int], None]  # (step description, done, total)
Say = Callable[[str], None]
ESTIMATE_OVER_S = 60.0  # say how long tune will take when it is longer than this
MAX_WIDEN = 20  # widenings of the refine window per cell, at most
JSON_FORMAT = "vegas-sim.speculative-table"
JSON_VERSION = 3  # 3: per-engine sections (vLLM, SGLang, TensorRT-LLM, ours), K = 0
SERVING_STEP = "4-serving"
BEYOND_STEP = "beyond-box"  # the model asked past the box's edge: reported, never chosen
FINAL_STEP = "final"
BEYOND_GAMMA = 4  # γ past the box's top asked of the model at an edge
RERANK_PCT = 3.0  # configurations this close to the search's best are ranked again
RERANK_MAX = 8
_ROUND = 6  # sparsity grid values are rounded so that 0.035 is 0.035 in every output


@dataclass(frozen=True)
class TuneConfig:
    """The search: grids, the stabilisation threshold, baselines and engines."""

    method: str = "vegas"
    probe_gamma: int = 12
    sparsity_coarse: tuple[float, ...] = (0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2)
    stable_pct: float = 5.0
    gamma: tuple[int, ...] = tuple(range(1, 13))
    refine_step: float = 0.005
    baselines: tuple[str, ...] = ("magicdec-stream", "magicdec-quest", "specextend")
    baseline_gamma: tuple[int, ...] = tuple(range(1, 13))  # the same range as `gamma`
    output_len: int = 1024
    extra: dict[str, Any] = field(default_factory=dict)  # further Scenario fields
    search_engine: str = "analytic"
    final_engine: str = "analytic"
    replications: int = 5
    rank_by: str = "throughput"  # throughput | goodput | tpot (`ranking`)
    # the search box; None: the span the acceptance traces support (`Evidence`)
    gamma_range: tuple[int, int] | None = None
    sparsity_range: tuple[float, float] | None = None
    outside_evidence: str = "pi_low"  # pi_low | exclude (module docstring)
    tie_pct: float = 1.0  # the selection's tie band, % of the best score
    kv_bound_engine: str = "sim"  # ranks and reports the cells where the KV cache binds

    def __post_init__(self) -> None:
        slo = any(self.extra.get(k) is not None for k in ("slo_tpot_ms", "slo_ttft_ms"))
        check_rank_by(self.rank_by, slo)
        open_loop = str(self.extra.get("arrival", "closed")).startswith(("poisson", "trace"))
        if open_loop and "analytic" in (self.search_engine, self.final_engine):
            raise UserInputError("open-loop arrivals are simulated only: the analytic engine "
                                 "has no queue", where="--search-engine/--final-engine",
                                 fix="pass --search-engine sim --final-engine sim")
        if check_method(self.method) not in SPEC_METHODS:
            raise UserInputError(f"cannot tune {self.method!r}: it does not speculate",
                                 where="--method", fix="tune a speculative method, e.g. vegas")
        for m in self.baselines:
            check_method(m)
        for g in (self.probe_gamma, *self.gamma, *self.baseline_gamma):
            check_gamma(g)
        for s in self.sparsity_coarse:
            check_sparsity(s)
        if not self.sparsity_coarse or not self.gamma:
            raise UserInputError("tune needs a sparsity grid and a γ grid",
                                 fix="give at least one value of each")
        if not (0.0 <= self.stable_pct < 100.0):
            raise UserInputError(f"stable_pct must be in [0, 100), got {self.stable_pct}",
                                 where="--stable-pct", fix="e.g. 2 (percent)")
        if self.refine_step <= 0:
            raise UserInputError(f"refine_step must be > 0, got {self.refine_step}",
                                 where="--refine-step", fix="e.g. 0.005")
        if self.outside_evidence not in OUTSIDE_EVIDENCE:
            raise UserInputError(f"unknown outside-evidence rule {self.outside_evidence!r}",
                                 where="--outside-evidence",
                                 fix=f"use one of: {', '.join(OUTSIDE_EVIDENCE)}")
        if not 0.0 <= self.tie_pct < 100.0:
            raise UserInputError(f"the tie band must be in [0, 100) %, got {self.tie_pct}",
                                 where="--tie-pct", fix="e.g. 1 (percent)")
        if self.gamma_range is not None:
            lo, hi = self.gamma_range
            check_gamma(lo)
            if hi < lo:
                raise UserInputError(f"γ range {lo}..{hi} is empty", where="--gamma",
                                     fix="write LO..HI with LO <= HI, e.g. 1..12")
        if self.sparsity_range is not None:
            lo_s, hi_s = (check_sparsity(v) for v in self.sparsity_range)
            if hi_s < lo_s:
                raise UserInputError(f"sparsity range {lo_s:g}..{hi_s:g} is empty",
                                     where="--sparsity",
                                     fix="write LO..HI with LO <= HI, e.g. 0.01..0.2")


# ---- pure step logic (unit-tested without a model) ---------------------------------------------
def stable_sparsity(sparsity: Sequence[float] | pd.Series,
                    acceptance_length: Sequence[float] | pd.Series,
                    stable_pct: float) -> float:
    """Smallest s whose acceptance length is within stable_pct % of the maximum over the sweep."""
    s = np.asarray(sparsity, dtype=float)
    acc = np.asarray(acceptance_length, dtype=float)
    order = np.argsort(s, kind="stable")
    s, acc = s[order], acc[order]
    ok = acc >= np.nanmax(acc) * (1.0 - stable_pct / 100.0)
    return float(s[np.argmax(ok)])  # argmax of a bool array: the first True


def refine_window(coarse: Sequence[float], center: float, step: float,
                  bounds: tuple[float, float] = (0.0, 1.0)) -> tuple[float, float]:
    """The coarse neighbours of `center` (past the ends: half the smallest, 1.5× the largest),
    within `bounds` (the search box)."""
    pts = sorted(coarse)
    i = pts.index(center) if center in pts else int(np.searchsorted(pts, center))
    lo = pts[i - 1] if i > 0 else max(pts[0] / 2.0, step)
    hi = pts[i + 1] if i + 1 < len(pts) else min(pts[-1] * 1.5, 1.0)
    return max(lo, bounds[0]), min(hi, bounds[1])


def window_points(lo: float, hi: float, step: float, *extra: float) -> list[float]:
    """Points `step` apart from `lo` to `hi`, both ends (and `extra`) included, within (0, 1]."""
    n = math.floor((hi - lo) / step + 1e-9)
    grid = {round(lo + k * step, _ROUND) for k in range(n + 1)}
    grid |= {round(v, _ROUND) for v in (lo, hi, *extra)}
    return sorted(v for v in grid if 0.0 < v <= 1.0)


def refine_grid(coarse: Sequence[float], center: float, step: float) -> list[float]:
    """Fine grid (spacing `step`) between the coarse neighbours of `center`, both included."""
    lo, hi = refine_window(coarse, center, step)
    return window_points(lo, hi, step, center)


def widen(lo: float, hi: float, best: float, step: float,
          bounds: tuple[float, float] = (0.0, 1.0)) -> tuple[float, float] | None:
    """The next window to search when `best` sits on an edge of [lo, hi]: as wide as [lo, hi],
    just past that edge, clipped to the box `bounds` (and to `step` from below). None when
    `best` is inside, or on an edge that is already the bound."""
    width, eps = hi - lo, 1e-9
    floor, top = max(step, bounds[0]), min(1.0, bounds[1])
    if best <= lo + eps and lo > floor + eps:
        return max(floor, round(lo - width, _ROUND)), lo
    if best >= hi - eps and hi < top - eps:
        return hi, min(top, round(hi + width, _ROUND))
    return None


def argbest(df: pd.DataFrame, rank_by: str = "throughput") -> pd.Series:
    """Row with the best rank score (`rank_score` where tune set it — `ranked_score` — else
    `ranking.score`); ties to the smaller γ, then the smaller sparsity."""
    if df.empty:
        raise UserInputError("tune evaluated no configuration in a cell",
                             fix="check the grids (--gamma, --sparsity)")
    sc = df["rank_score"] if "rank_score" in df.columns else score(df, rank_by)
    tied = df[sc >= sc.max() * (1 - 1e-12)]
    return tied.sort_values(["gamma", "sparsity"], kind="stable").iloc[0]


@dataclass(frozen=True)
class Evidence:
    """Per method, the span its acceptance traces support: (largest traced γ, smallest and
    largest traced sparsity). Below the largest traced γ a lookup truncates a traced γ
    exactly; between traced sparsities it interpolates; past either it extrapolates."""

    spans: dict[str, tuple[int, float, float]]

    @classmethod
    def of(cls, acceptance: AcceptanceModel) -> Evidence:
        per = acceptance.coverage()["per_method"]
        return cls({str(m): (int(max(v["gamma"])), float(min(v["sparsity"])),
                             float(max(v["sparsity"])))
                    for m, v in per.items()})  # type: ignore[attr-defined]

    def reason(self, method: str, gamma: int, sparsity: float) -> str:
        """'' when (γ, s) lies in `method`'s span, else why not."""
        if method == "vanilla" or method not in self.spans:
            return ""
        g_max, s_lo, s_hi = self.spans[method]
        why = []
        if gamma > g_max:
            why.append(f"γ {gamma} > traced {g_max}")
        if sparsity < s_lo - 1e-9:
            why.append(f"sparsity {sparsity:g} < traced {s_lo:g}")
        if sparsity > s_hi + 1e-9:
            why.append(f"sparsity {sparsity:g} > traced {s_hi:g}")
        return ", ".join(why)

    def mask(self, df: pd.DataFrame) -> np.ndarray:
        """[rows] bool: the row's (γ, s) lies in its method's span."""
        return np.array([not self.reason(str(m), int(g), float(s)) for m, g, s in
                         zip(df["method"], df["gamma"], df["sparsity"])], dtype=bool)


def lower_score(df: pd.DataFrame, rank_by: str) -> pd.Series:
    """The score at the low end of the prediction interval: score × pi_low / throughput
    (the score itself where a row has no interval)."""
    sc = score(df, rank_by)
    if "pi_low" not in df.columns:
        return sc
    thr = df["throughput_tok_s"].astype(float)
    ratio = (df["pi_low"].astype(float) / thr.where(thr > 0)).clip(lower=0.0)
    return (sc * ratio.fillna(1.0)).astype(float)


def ranked_score(df: pd.DataFrame, rank_by: str, on_evidence: np.ndarray) -> pd.Series:
    """What ranks a row: its score on the evidence, its pi_low-scaled score off it."""
    return score(df, rank_by).where(on_evidence, lower_score(df, rank_by))


@dataclass(frozen=True)
class Selection:
    """A cell's choice: the best speculative row by the rule, and whether to speculate."""

    row: pd.Series
    speculate: bool
    why: str


def selection_rule(rank_by: str, tie_pct: float, outside_evidence: str) -> str:
    """The rule `select` applies, in one sentence (printed and exported)."""
    outside = ("ranked by its pi_low" if outside_evidence == "pi_low" else "not searched")
    return (f"among the speculative configurations whose pi_low beats vanilla, the best by "
            f"{rank_by} (a point outside the traced γ/sparsity span {outside}); those within "
            f"{tie_pct:g} % of the best go to the smaller K, then the smaller sparsity; K = 0 "
            f"where none beats vanilla by its interval, or vanilla is within {tie_pct:g} % "
            f"of the best")


def select(rows: pd.DataFrame, vanilla: pd.Series, rank_by: str, tie_pct: float) -> Selection:
    """The selection rule (`selection_rule`) on one cell's speculative rows (with
    `rank_score`) and its vanilla row. Where it says K = 0 the row is the best speculative
    configuration by the same rule over all rows (what speculation would have been)."""
    if rows.empty:
        raise UserInputError("tune evaluated no configuration in a cell",
                             fix="check the grids (--gamma, --sparsity)")
    van = float(score(pd.DataFrame([vanilla]), rank_by).iloc[0])
    beats = rows[lower_score(rows, rank_by).to_numpy() > van]
    pick, best = _best_in_band(beats if not beats.empty else rows, rank_by, tie_pct)
    if beats.empty:
        low = float(lower_score(rows, rank_by).max())
        return Selection(pick, False, f"no speculative configuration's pi_low beats vanilla "
                                      f"(best {low:.4g} <= vanilla {van:.4g}, {rank_by})")
    if van >= best * (1.0 - tie_pct / 100.0):
        return Selection(pick, False, f"vanilla is within {tie_pct:g} % of the best "
                                      f"({van:.4g} vs {best:.4g}, {rank_by})")
    return Selection(pick, True, "")


def _best_in_band(rows: pd.DataFrame, rank_by: str, tie_pct: float) -> tuple[pd.Series, float]:
    """(the smallest-γ, then smallest-sparsity row within tie_pct % of the best, the best)."""
    sc = rows["rank_score"] if "rank_score" in rows.columns else score(rows, rank_by)
    best = float(sc.max())
    band = rows[sc >= best * (1.0 - tie_pct / 100.0) - 1e-12]
    return band.sort_values(["gamma", "sparsity"], kind="stable").iloc[0], best


def ratio_ci(num: float, num_lo: float, num_hi: float, den: float, den_lo: float,
             den_hi: float) -> tuple[float, float, float]:
    """num/den with a 95 % CI from the two CIs, log half-widths added in quadrature."""
    ratio = num / den

    def half(lo: float, hi: float) -> float:
        if not (lo > 0 and hi > 0) or any(map(math.isnan, (lo, hi))):
            return 0.0
        return 0.5 * math.log(hi / lo)

    h = math.hypot(half(num_lo, num_hi), half(den_lo, den_hi))
    return ratio, ratio * math.exp(-h), ratio * math.exp(h)


# ---- the search ---------------------------------------------------------------------------------
Cell = tuple[int, int]  # (batch, context)


def _scenario(cfg: TuneConfig, method: str, gamma: int, sparsity: float, cell: Cell) -> Scenario:
    return Scenario(method=method, gamma=gamma, sparsity=sparsity, batch=cell[0],
                    context=cell[1], output_len=cfg.output_len, **cfg.extra)


def _tagged(df: pd.DataFrame, step: str) -> pd.DataFrame:
    return df.assign(step=step)


def _cell_rows(df: pd.DataFrame, cell: Cell, method: str | None = None) -> pd.DataFrame:
    mask = (df["batch"] == cell[0]) & (df["context"] == cell[1])
    if method is not None:
        mask &= df["method"] == method
    return df[mask]


@dataclass
class TuneResult:
    """`cells`: one row per (batch, context); `steps`: every evaluated configuration;
    `sparsity`: the one sparsity of the serving K table (step 4); `box`: the search box and
    the evidence span; `selection`: the rule the choices follow, in words."""

    cells: pd.DataFrame
    steps: pd.DataFrame
    config: TuneConfig
    model: str = ""
    gpu: str = ""
    notes: list[str] = field(default_factory=list)
    sparsity: float = float("nan")
    box: dict[str, Any] = field(default_factory=dict)
    selection: str = ""

    def k_by_cell(self) -> dict[Cell, int]:
        """Each cell's recommended K (0: no speculation)."""
        return {(int(b), int(c)): int(k) for b, c, k in
                zip(self.cells["batch"], self.cells["context"], self.cells["k"])}

    def _vanilla_rows(self) -> pd.DataFrame:
        """Each cell's vanilla row from the engine its cell is ranked with."""
        van = self.steps[self.steps["method"] == "vanilla"]
        out = []
        for b, c, eng in zip(self.cells["batch"], self.cells["context"], self.cells["engine"]):
            rows = _cell_rows(van, (int(b), int(c)))
            rows = rows[rows["engine"] == eng]
            if not rows.empty:
                out.append(rows.iloc[-1])
        return pd.DataFrame(out)

    def gamma_by_batch(self) -> dict[int, int]:
        """One K per batch size across contexts, at the serving sparsity (step 4), vanilla
        being K = 0: the K whose score (`rank_score`) relative to each context's best is
        highest on average (it loses least over the tuned contexts), every K within the tie
        band of it going to the smallest. A batch none of whose cells speculates gets 0."""
        s4 = self.steps[self.steps["step"] == SERVING_STEP]
        engine = {(int(b), int(c)): e for b, c, e in
                  zip(self.cells["batch"], self.cells["context"], self.cells["engine"])}
        s4 = s4[[engine.get((int(b), int(c))) == e for b, c, e in
                 zip(s4["batch"], s4["context"], s4["engine"])]]
        rows = pd.concat([s4, self._vanilla_rows().assign(gamma=0)], ignore_index=True)
        rows = rows.assign(_score=rows["rank_score"].astype(float))
        best = rows.groupby(["batch", "context"])["_score"].transform("max")
        rel = rows.assign(rel=(rows["_score"] / best.where(best > 0)).fillna(1.0))
        mean = rel.groupby(["batch", "gamma"])["rel"].mean().reset_index()
        speculates = self.cells.groupby("batch")["speculate"].any()
        band = 1.0 - self.config.tie_pct / 100.0
        out = {}
        for batch, g in mean.groupby("batch"):
            top = g["rel"].max()
            k = int(g[g["rel"] >= top * band - 1e-12]["gamma"].min())
            out[int(batch)] = k if bool(speculates.get(batch, False)) else 0  # type: ignore[arg-type]
        return out

    def serving_table(self) -> dict[str, Any]:
        """The JSON export for serving engines (`vegas_sim.sim.serving` for every section).

        {
          "format": "vegas-sim.speculative-table", "version": 3,
          "model", "gpu", "method", "selection": the rule, "search_box": box and evidence,
          "sparsity": s_g,                       # the sparsity the K tables are chosen at
          "num_speculative_tokens_by_batch": {"1": 7, "4": 6, "16": 0},
          "vllm": {"speculative_config": {"method", "num_speculative_tokens",
                                          "num_speculative_tokens_per_batch_size"},
                   "max_num_seqs", "speculative_config_per_context_proposal": {...}},
          "sglang": {"speculative_num_steps", "speculative_adaptive_config"},
          "tensorrt_llm": {"max_draft_len", "draft_len_schedule"},
          "vegas_sim": {"sparsity_per_batch_size", "sparsity_per_batch_size_and_context"},
          "cells": [one row per cell: the `cells` columns], "strategy", "notes"
        }

        The per-batch K table (one server configuration, at `sparsity`) is `gamma_by_batch`;
        the per-context table holds each cell's own K (`k`) and sparsity. A section an engine
        cannot express (K = 0 for SGLang; a batch-1 K below the largest for TensorRT-LLM)
        is null with a `note` saying why. Every section is checked against its engine's rules
        before it is returned.
        """
        k_batch = self.gamma_by_batch()
        k_cell = self.k_by_cell()
        s_cell = {(int(b), int(c)): float(s) if int(k) > 0 else self.sparsity
                  for b, c, s, k in zip(self.cells["batch"], self.cells["context"],
                                        self.cells["sparsity"], self.cells["k"])}
        max_seqs = max(k_batch)
        method = self.config.method
        return {
            "format": JSON_FORMAT, "version": JSON_VERSION, "model": self.model,
            "gpu": self.gpu, "method": method, "selection": self.selection,
            "search_box": self.box, "sparsity": self.sparsity,
            "num_speculative_tokens_by_batch": {str(b): k for b, k in sorted(k_batch.items())},
            "vllm": vllm_config(method, k_batch, k_cell, max_seqs),
            "sglang": sglang_config(k_batch),
            "tensorrt_llm": trtllm_config(k_batch),
            "vegas_sim": vegas_config(self.sparsity, {b: self.sparsity for b in k_batch},
                                      s_cell, max_seqs),
            "cells": json.loads(self.cells.to_json(orient="records")),
            "strategy": {k: (list(v) if isinstance(v, tuple) else v)
                         for k, v in asdict(self.config).items()},
            "notes": list(self.notes),
        }


class _Steps:
    """Runs one step for all cells as one sweep and keeps every evaluated row, each with
    `on_evidence`, `ranked_by` and `rank_score` (`ranked_score`)."""

    def __init__(self, runner: SweepRunner, cfg: TuneConfig, seed: int,
                 progress: TuneProgress | None, evidence: Evidence) -> None:
        self.runner, self.cfg, self.seed, self.progress = runner, cfg, seed, progress
        self.evidence = evidence
        self.rows: list[pd.DataFrame] = []

    def run(self, label: str, scenarios: list[Scenario], engine: str | None = None) -> pd.DataFrame:
        report = None
        if self.progress is not None:
            cb = self.progress

            def report(done: int, total: int) -> None:
                cb(label, done, total)

        eng = engine or self.cfg.search_engine
        df = self.runner.run(scenarios, engine=eng, seed=self.seed,
                             replications=self.cfg.replications, progress=report)
        on = self.evidence.mask(df)
        df = _tagged(df, label).assign(
            on_evidence=on, ranked_by=np.where(on, "value", "pi_low"),
            rank_score=ranked_score(df, self.cfg.rank_by, on).to_numpy())
        self.rows.append(df)
        return df

    def run_by_engine(self, label: str, scenarios: list[Scenario],
                      engines: dict[Cell, str]) -> pd.DataFrame:
        """One run per engine, each scenario with its cell's engine."""
        frames = []
        for eng in sorted(set(engines.values())):
            mine = [sc for sc in scenarios if engines[(sc.batch, sc.context)] == eng]
            if mine:
                frames.append(self.run(label, mine, eng))
        return pd.concat(frames, ignore_index=True)


def _vanilla_and_baselines(steps: _Steps, cells: list[Cell]) -> pd.DataFrame:
    cfg = steps.cfg
    scen = [_scenario(cfg, "vanilla", 1, 1.0, c) for c in cells]
    scen += [_scenario(cfg, m, g, s, c) for c in cells for m in cfg.baselines
             for g in cfg.baseline_gamma for s in cfg.sparsity_coarse]
    return steps.run("baselines", scen)


def tune(
    cells: Sequence[Cell],
    latency: LatencyModel,
    acceptance: AcceptanceModel,
    *,
    config: TuneConfig | None = None,
    seed: int = 0,
    workers: int | None = None,
    scheduler: Any = None,
    progress: TuneProgress | None = None,
    model: str = "",
    say: Say | None = None,
) -> TuneResult:
    """Run the strategy for every (batch, context) cell; see the module docstring.

    say(text) gets the estimate (configurations, seconds) when tune will take over a minute.
    """
    evidence = Evidence.of(acceptance)
    cfg, box, notes = boxed(config or TuneConfig(), evidence)
    cells = sorted({(int(b), int(c)) for b, c in cells})
    if not cells:
        raise UserInputError("no (batch, context) cell to tune", where="--batch/--context",
                             fix="give at least one batch size and one context length")
    cells, skipped = _fitting_cells(cfg, cells, latency)
    notes += skipped
    with SweepRunner(latency, acceptance, workers=workers, scheduler=scheduler) as runner:
        steps = _Steps(runner, cfg, seed, progress, evidence)
        if progress is not None:
            progress("baselines", 0, len(cells) * _baseline_count(cfg))
        estimate = _estimate(runner, cfg, cells, seed)
        if say is not None and estimate.seconds > ESTIMATE_OVER_S:
            say(f"{estimate}; Ctrl-C stops it (tune keeps nothing)")
        base = _vanilla_and_baselines(steps, cells)
        s1 = steps.run("1-sparsity", [_scenario(cfg, cfg.method, cfg.probe_gamma, s, c)
                                      for c in cells for s in cfg.sparsity_coarse])
        stable = {c: stable_sparsity(_cell_rows(s1, c)["sparsity"],
                                     _cell_rows(s1, c)["acceptance_length"], cfg.stable_pct)
                  for c in cells}
        s2 = steps.run("2-gamma", [_scenario(cfg, cfg.method, g, stable[c], c)
                                   for c in cells for g in cfg.gamma])
        gamma = {c: int(argbest(_cell_rows(s2, c), cfg.rank_by)["gamma"]) for c in cells}
        refined = _refine(steps, cells, gamma, stable, notes)
        searched = pd.concat(steps.rows, ignore_index=True)
        engines = {c: _rank_engine(cfg, _cell_rows(searched, c)) for c in cells}
        serving = _mode(refined.values())
        steps.run_by_engine(SERVING_STEP, [_scenario(cfg, cfg.method, g, serving, c)
                                           for c in cells for g in cfg.gamma], engines)
        evaluated = pd.concat(steps.rows, ignore_index=True)
        evaluated = evaluated[(evaluated["method"] == cfg.method)
                              & (evaluated["engine"] == cfg.search_engine)]
        best_base = {c: argbest(_cell_rows(base[base["method"] != "vanilla"], c), cfg.rank_by)
                     if cfg.baselines else None for c in cells}
        final = _final(steps, cells, evaluated, base, best_base, engines)
        edges = _edges(steps, cells, final, engines)
    table = pd.DataFrame([_cell_row(c, stable[c], final[c], engines[c], evaluated, edges[c],
                                    cfg) for c in cells])
    notes += [e.note for c in cells for e in edges[c] if e.note]
    notes += [f"batch {c[0]}, context {c[1]}: ranked and reported with the {engines[c]} "
              f"engine: {_rank_reason(cfg, engines[c])}" for c in cells
              if engines[c] != cfg.search_engine]
    steps_df = pd.concat(steps.rows, ignore_index=True)
    gpu = str(steps_df["gpu"].iloc[0]) if "gpu" in steps_df.columns else ""
    return TuneResult(cells=table, steps=steps_df, config=cfg, model=model, gpu=gpu,
                      notes=notes, sparsity=serving, box=box,
                      selection=selection_rule(cfg.rank_by, cfg.tie_pct, cfg.outside_evidence))


def boxed(cfg: TuneConfig, evidence: Evidence) -> tuple[TuneConfig, dict[str, Any], list[str]]:
    """The config with its grids inside the search box, the box (and the evidence span) as
    exported, and a note where the box was clipped to the evidence ("exclude")."""
    g_max, s_lo, s_hi = evidence.spans.get(
        cfg.method, (max(cfg.gamma), min(cfg.sparsity_coarse), max(cfg.sparsity_coarse)))
    notes: list[str] = []
    if cfg.gamma_range is None:
        gammas = [g for g in cfg.gamma if g <= g_max] or [min(cfg.gamma)]
    else:
        gammas = list(range(cfg.gamma_range[0], cfg.gamma_range[1] + 1))
    s_box = cfg.sparsity_range or (s_lo, s_hi)
    if cfg.outside_evidence == "exclude":
        kept = [g for g in gammas if g <= g_max] or [min(gammas)]
        clipped = (max(s_box[0], s_lo), min(s_box[1], s_hi))
        if kept != gammas or clipped != tuple(s_box):
            notes.append(f"the search box was clipped to the evidence (--outside-evidence "
                         f"exclude): γ up to {g_max}, sparsity {s_lo:g}..{s_hi:g}")
        gammas, s_box = kept, (clipped[0], max(clipped))
    lo, hi = round(float(s_box[0]), _ROUND), round(float(s_box[1]), _ROUND)
    coarse = sorted({round(v, _ROUND) for v in cfg.sparsity_coarse if lo <= v <= hi} | {lo, hi})
    out = replace(cfg, gamma=tuple(gammas), sparsity_coarse=tuple(coarse),
                  probe_gamma=min(cfg.probe_gamma, max(gammas)),
                  baseline_gamma=tuple(g for g in (cfg.baseline_gamma if cfg.gamma_range is None
                                                   else gammas) if g <= max(gammas))
                  or (min(gammas),),
                  gamma_range=(min(gammas), max(gammas)), sparsity_range=(lo, hi))
    source = ("--gamma/--sparsity" if cfg.gamma_range or cfg.sparsity_range
              else "the acceptance traces' span")
    box = {"gamma": [min(gammas), max(gammas)], "sparsity": [lo, hi], "source": source,
           "evidence": {"gamma_max": g_max, "sparsity": [s_lo, s_hi]},
           "outside_evidence": cfg.outside_evidence}
    return out, box, notes


def _baseline_count(cfg: TuneConfig) -> int:
    return 1 + len(cfg.baselines) * len(cfg.baseline_gamma) * len(cfg.sparsity_coarse)


def _estimate(runner: SweepRunner, cfg: TuneConfig, cells: list[Cell], seed: int) -> Estimate:
    """Configurations tune will evaluate (step 3 at a typical window; widening not counted)
    and their time, timed on a few of them."""
    refine = float(np.median([len(refine_grid(cfg.sparsity_coarse, s, cfg.refine_step))
                              for s in cfg.sparsity_coarse]))
    per_cell = (_baseline_count(cfg) + len(cfg.sparsity_coarse) + 2 * len(cfg.gamma)
                + math.ceil(refine))
    sample = [_scenario(cfg, cfg.method, g, s, c) for c in (cells[0], cells[-1])
              for g, s in ((min(cfg.gamma), cfg.sparsity_coarse[0]),
                           (max(cfg.gamma), cfg.sparsity_coarse[-1]))]
    per, _ = runner.timed_sample(sample, engine=cfg.search_engine, seed=seed,
                                 replications=cfg.replications)
    return Estimate(per_cell * len(cells), per, runner.parallelism)


def _refine(steps: _Steps, cells: list[Cell], gamma: dict[Cell, int],
            stable: dict[Cell, float], notes: list[str]) -> dict[Cell, float]:
    """Step 3 and its widenings inside the box; the best sparsity per cell at its γ*."""
    cfg = steps.cfg
    bounds = cfg.sparsity_range or (0.0, 1.0)
    window = {c: refine_window(cfg.sparsity_coarse, stable[c], cfg.refine_step, bounds)
              for c in cells}
    rows = steps.run("3-refine", [
        _scenario(cfg, cfg.method, gamma[c], s, c) for c in cells
        for s in window_points(*window[c], cfg.refine_step, stable[c])])
    found = [rows]
    for _ in range(MAX_WIDEN):
        best = {c: float(argbest(_cell_rows(pd.concat(found), c), cfg.rank_by)["sparsity"])
                for c in cells}
        nxt = {c: w for c in cells
               if (w := widen(*window[c], best[c], cfg.refine_step, bounds))}
        if not nxt:
            break
        scen = []
        for c, (lo, hi) in nxt.items():
            seen = set(_cell_rows(pd.concat(found), c)["sparsity"].round(_ROUND))
            scen += [_scenario(cfg, cfg.method, gamma[c], s, c)
                     for s in window_points(lo, hi, cfg.refine_step) if s not in seen]
            window[c] = (min(lo, window[c][0]), max(hi, window[c][1]))
        if scen:
            found.append(steps.run("3-widen", scen))
    else:
        notes.append(f"the refine window was widened {MAX_WIDEN} times and the best sparsity "
                     "still sat on its edge in some cell")
    return {c: float(argbest(_cell_rows(pd.concat(found), c), cfg.rank_by)["sparsity"])
            for c in cells}


def _mode(values: Iterable[float]) -> float:
    """The most frequent value (ties to the smaller), rounded as the grids are."""
    counts = pd.Series([round(v, _ROUND) for v in values]).value_counts()
    return float(min(counts[counts == counts.max()].index))


def _fitting_cells(cfg: TuneConfig, cells: list[Cell], latency: LatencyModel,
                   ) -> tuple[list[Cell], list[str]]:
    """The cells whose every searched configuration fits the model and the GPU (the largest γ
    reserves the most KV slots), and a note for each cell left out."""
    top = max(cfg.probe_gamma, *cfg.gamma, *cfg.baseline_gamma) + BEYOND_GAMMA
    probes = [_scenario(cfg, m, g, 1.0, c) for c in cells
              for m, g in (("vanilla", 1), (cfg.method, top))]
    _, skipped = split_fitting(probes, latency)
    first: dict[Cell, tuple[Scenario, DoesNotFitError]] = {}
    for sc, err in skipped:
        first.setdefault((sc.batch, sc.context), (sc, err))
    return [c for c in cells if c not in first], skipped_notes(list(first.values()))


# ---- the final ranking ------------------------------------------------------------------------
def kv_binds(rows: pd.DataFrame) -> bool:
    """Some row of the cell runs below its batch because the KV cache cannot hold it."""
    if rows.empty or "mean_running_batch" not in rows.columns:
        return False
    return bool((rows["mean_running_batch"].astype(float)
                 < rows["batch"].astype(float) - 1e-6).any())


def _rank_engine(cfg: TuneConfig, rows: pd.DataFrame) -> str:
    """The engine a cell is ranked and reported with (module docstring)."""
    if cfg.final_engine != cfg.search_engine:
        return cfg.final_engine
    if cfg.search_engine == "analytic" and kv_binds(rows):
        return cfg.kv_bound_engine
    return cfg.search_engine


def _rank_reason(cfg: TuneConfig, engine: str) -> str:
    if cfg.final_engine != cfg.search_engine:
        return "--final-engine"
    return ("the KV cache binds there (the analytic engine's running batch is below the "
            "batch; its closed form leaves preemption out), so the configurations within "
            f"{RERANK_PCT:g} % of the search's best were run again with it")


@dataclass(frozen=True)
class _Final:
    """A cell's final rows: the selection, vanilla and the best baseline (rank engine)."""

    selection: Selection
    vanilla: pd.Series
    baseline: pd.Series | None


def _final(steps: _Steps, cells: list[Cell], evaluated: pd.DataFrame, base: pd.DataFrame,
           best_base: dict[Cell, pd.Series | None], engines: dict[Cell, str]
           ) -> dict[Cell, _Final]:
    """The selection per cell, on the rank engine's rows: the search's where it is the
    search engine, else the near-best configurations, vanilla and the baseline run again."""
    cfg = steps.cfg
    scen: list[Scenario] = []
    keys: list[tuple[Cell, str]] = []
    for c in cells:
        if engines[c] == cfg.search_engine:
            continue
        rows = _cell_rows(evaluated, c)
        rows = rows[rows["step"] != BEYOND_STEP]
        rows = rows.drop_duplicates(["gamma", "sparsity"])
        near = rows[rows["rank_score"] >= rows["rank_score"].max() * (1 - RERANK_PCT / 100)]
        for _, r in near.nlargest(RERANK_MAX, "rank_score").iterrows():
            scen.append(_scenario(cfg, cfg.method, int(r["gamma"]), float(r["sparsity"]), c))
            keys.append((c, "spec"))
        scen.append(_scenario(cfg, "vanilla", 1, 1.0, c))
        keys.append((c, "vanilla"))
        bl = best_base[c]
        if bl is not None:
            scen.append(_scenario(cfg, str(bl["method"]), int(bl["gamma"]),
                                  float(bl["sparsity"]), c))
            keys.append((c, "baseline"))
    rerun: dict[tuple[Cell, str], list[pd.Series]] = {}
    if scen:
        df = steps.run_by_engine(FINAL_STEP, scen, engines)
        for _, row in df.iterrows():
            c = (int(row["batch"]), int(row["context"]))
            role = ("vanilla" if row["method"] == "vanilla" else
                    "spec" if row["method"] == cfg.method and (c, "spec") in keys
                    else "baseline")
            rerun.setdefault((c, role), []).append(row)
    out = {}
    for c in cells:
        if engines[c] == cfg.search_engine:
            spec = _cell_rows(evaluated, c)
            spec = spec[spec["step"] != BEYOND_STEP]
            van = _cell_rows(base, c, "vanilla").iloc[0]
            bl = best_base[c]
        else:
            spec = pd.DataFrame(rerun[(c, "spec")])
            van = rerun[(c, "vanilla")][0]
            bl = rerun[(c, "baseline")][0] if (c, "baseline") in rerun else None
        out[c] = _Final(select(spec, van, cfg.rank_by, cfg.tie_pct), van, bl)
    return out


# ---- past the box's edge ----------------------------------------------------------------------
@dataclass(frozen=True)
class _Edge:
    """What the model says past one edge of the box the choice lies on."""

    edge: str  # "γ top", "sparsity bottom", "sparsity top"
    gain_pct: float  # best score past the edge over the choice's, −1, in %
    gain_pi_low_pct: float  # the same at pi_low
    note: str


def _beyond_points(cfg: TuneConfig, g: int, s: float) -> list[tuple[str, int, float]]:
    """(edge, γ, s) past each edge of the box that (γ, s) lies on."""
    assert cfg.gamma_range is not None and cfg.sparsity_range is not None
    g_hi = cfg.gamma_range[1]
    s_lo, s_hi = cfg.sparsity_range
    eps = 1e-9
    out = []
    if len(cfg.gamma) > 1 and g >= g_hi:
        out += [("γ top", gg, s) for gg in range(g_hi + 1, g_hi + BEYOND_GAMMA + 1)]
    if s <= s_lo + eps:
        out += [("sparsity bottom", g, round(s_lo * f, _ROUND)) for f in (2 ** -0.5, 0.5)]
    if s >= s_hi - eps and s_hi < 1.0 - eps:
        out += [("sparsity top", g, round(min(1.0, s_hi * f), _ROUND)) for f in (2 ** 0.5, 2.0)]
    return out


def _edges(steps: _Steps, cells: list[Cell], final: dict[Cell, _Final],
           engines: dict[Cell, str]) -> dict[Cell, list[_Edge]]:
    """For every cell whose choice lies on the box's edge, the model asked past it."""
    cfg = steps.cfg
    asks = {c: _beyond_points(cfg, int(final[c].selection.row["gamma"]),
                              float(final[c].selection.row["sparsity"])) for c in cells}
    scen = [_scenario(cfg, cfg.method, g, s, c) for c in cells for _, g, s in asks[c]]
    out: dict[Cell, list[_Edge]] = {c: [] for c in cells}
    if not scen:
        return out
    df = steps.run_by_engine(BEYOND_STEP, scen, engines)
    for c in cells:
        pick = final[c].selection.row
        here = float(score(pd.DataFrame([pick]), cfg.rank_by).iloc[0])
        rows = _cell_rows(df, c)
        for edge in dict.fromkeys(e for e, _, _ in asks[c]):
            pts = {(g, s) for e, g, s in asks[c] if e == edge}
            r = rows[[(int(g), round(float(s), _ROUND)) in pts
                      for g, s in zip(rows["gamma"], rows["sparsity"])]]
            if r.empty or not here > 0:
                continue
            gain = float(score(r, cfg.rank_by).max()) / here - 1.0
            low = float(lower_score(r, cfg.rank_by).max()) / here - 1.0
            off = any(steps.evidence.reason(cfg.method, int(g), float(s))
                      for g, s in zip(r["gamma"], r["sparsity"]))
            where = _outside_words(steps.evidence, cfg.method, edge) if off else ""
            what = (f"γ {min(g for g, _ in pts)}..{max(g for g, _ in pts)}"
                    if edge == "γ top" else
                    "sparsity " + ", ".join(f"{s:.3g}" for _, s in sorted(pts, key=lambda p: p[1])))
            note = (f"batch {c[0]}, context {c[1]}: the choice (γ {int(pick['gamma'])}, s "
                    f"{float(pick['sparsity']):g}) is on the box's {edge}; by the model, "
                    f"{what} would change its {cfg.rank_by} by {gain:+.1%} (by pi_low "
                    f"{low:+.1%})" + (f"; outside the evidence: {where}" if where else ""))
            out[c].append(_Edge(edge, 100.0 * gain, 100.0 * low, note))
    return out


def _outside_words(evidence: Evidence, method: str, edge: str) -> str:
    g_max, s_lo, s_hi = evidence.spans[method]
    return {"γ top": f"γ > traced {g_max}", "sparsity bottom": f"sparsity < traced {s_lo:g}",
            "sparsity top": f"sparsity > traced {s_hi:g}"}[edge]


def _search_value(evaluated: pd.DataFrame, cell: Cell, pick: pd.Series, engine: str) -> float:
    """The search engine's throughput of the chosen (γ, s)."""
    rows = _cell_rows(evaluated, cell)
    rows = rows[(rows["gamma"] == pick["gamma"])
                & ((rows["sparsity"] - float(pick["sparsity"])).abs() < 1e-9)
                & (rows["engine"] == engine)]
    return float(rows["throughput_tok_s"].iloc[0]) if not rows.empty else math.nan


def _cell_row(cell: Cell, stable: float, fin: _Final, engine: str, evaluated: pd.DataFrame,
              edges: list[_Edge], cfg: TuneConfig) -> dict[str, Any]:
    ch, van, bl = fin.selection.row, fin.vanilla, fin.baseline
    speculate = fin.selection.speculate
    out: dict[str, Any] = {
        "batch": cell[0], "context": cell[1], "method": ch["method"],
        "k": int(ch["gamma"]) if speculate else 0, "speculate": speculate,
        "k_reason": fin.selection.why,
        "gamma": int(ch["gamma"]), "sparsity": float(ch["sparsity"]), "stable_sparsity": stable,
        "chosen_step": str(ch["step"]),
        "search_throughput_tok_s": _search_value(evaluated, cell, ch, cfg.search_engine),
        "throughput_tok_s": float(ch["throughput_tok_s"]),
        "throughput_ci_low": float(ch["throughput_ci_low"]),
        "throughput_ci_high": float(ch["throughput_ci_high"]),
        "pi_low": float(ch.get("pi_low", math.nan)), "pi_high": float(ch.get("pi_high", math.nan)),
        "on_evidence": bool(ch["on_evidence"]), "ranked_by": str(ch["ranked_by"]),
        "acceptance_length": float(ch["acceptance_length"]),
        "vanilla_tok_s": float(van["throughput_tok_s"]),
        "vanilla_pi_low": float(van.get("pi_low", math.nan)),
        "vanilla_pi_high": float(van.get("pi_high", math.nan)),
    }
    out["recommended_tok_s"] = out["throughput_tok_s"] if speculate else out["vanilla_tok_s"]
    sp = ratio_ci(out["throughput_tok_s"], out["throughput_ci_low"], out["throughput_ci_high"],
                  float(van["throughput_tok_s"]), float(van["throughput_ci_low"]),
                  float(van["throughput_ci_high"]))
    # predict's own speedup columns (same replications, paired) when present; else the ratio.
    if "speedup_vs_vanilla" in ch.index and not pd.isna(ch["speedup_vs_vanilla"]):
        sp = (float(ch["speedup_vs_vanilla"]), float(ch["speedup_ci_low"]),
              float(ch["speedup_ci_high"]))
    out.update(speedup_vs_vanilla=sp[0], speedup_ci_low=sp[1], speedup_ci_high=sp[2])
    out["speedup_pi_low"] = out["pi_low"] / out["vanilla_tok_s"]
    if bl is not None:
        r = ratio_ci(out["throughput_tok_s"], out["throughput_ci_low"],
                     out["throughput_ci_high"], float(bl["throughput_tok_s"]),
                     float(bl["throughput_ci_low"]), float(bl["throughput_ci_high"]))
        out.update(baseline_method=bl["method"], baseline_gamma=int(bl["gamma"]),
                   baseline_sparsity=float(bl["sparsity"]),
                   baseline_tok_s=float(bl["throughput_tok_s"]),
                   speedup_vs_baseline=r[0], speedup_vs_baseline_ci_low=r[1],
                   speedup_vs_baseline_ci_high=r[2])
    out["acceptance_source"] = str(ch.get("acceptance_source", ""))
    if bl is not None:
        out["baseline_acceptance_source"] = str(bl.get("acceptance_source", ""))
    reasons = [str(x["extrapolated"]) for x in (ch, bl)
               if x is not None and is_extrapolated(x.get("extrapolated"))]
    out["extrapolated"] = bool(reasons)
    out["extrapolated_reasons"] = "; ".join(reasons)
    for col in ("engine", "gpu", *PROVENANCE_COLUMNS):  # where the numbers came from
        if col in ch.index:
            out[col] = ch[col]
    for col in ROOFLINE_COLUMNS:  # the chosen configuration's roofline (sim.roofline)
        if col in ch.index:
            out[col] = ch[col]
    out["engine"] = engine
    out["ranked_with"] = ("search engine" if engine == cfg.search_engine else
                          "final engine" if cfg.final_engine != cfg.search_engine
                          else "KV cache binds")
    out["rank_by"] = cfg.rank_by
    for name in ("tpot_ms_p50", "goodput_tok_s"):  # the other ranking metrics (COLUMN)
        out[name] = float(ch[name]) if name in ch.index else float("nan")
    out["edge"] = "; ".join(e.edge for e in edges)
    out["edge_gain_pct"] = max((e.gain_pct for e in edges), default=math.nan)
    out["edge_gain_pi_low_pct"] = max((e.gain_pi_low_pct for e in edges), default=math.nan)
    return out
