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
4. **Serving table.** A server runs one sparsity: the one chosen in most cells (ties to the
   smaller), s_g. At s_g, sweep γ in every cell ("4-serving"); the per-batch γ table is
   chosen from these rows, so the JSON's top-level sparsity is the one its γ table holds at.

The choice in a cell is the best configuration of the tuned method evaluated in *any* step
(argmax of the search engine's throughput), so tune never returns a point worse than one it
evaluated; `chosen_step` names the step it came from.

Baselines: each of `baselines` (magicdec-stream, magicdec-quest, specextend by default) gets
its own best (γ, s) by a full sweep of `baseline_gamma` × the coarse sparsity grid; the best
baseline is the one with the highest throughput. Ties anywhere go to the smaller γ / sparsity.

**Ranking** (`rank_by`, `vegas_sim.sim.ranking`): "throughput" (default), "goodput" (tokens/s
of requests meeting the SLOs in `extra`: slo_tpot_ms / slo_ttft_ms; refused without one) or
"tpot" (lowest TPOT p50). Every "best" above — γ*, s*, the choice, the best baseline, the
serving γ table — is by that metric; step 1 stays on acceptance.

The search uses `search_engine` (default "analytic": fast and deterministic). The reported
numbers of the chosen configuration, vanilla and the best baseline come from `final_engine`
(default the same; "sim" gives replication CIs); the choice itself is always made on the
search engine's numbers (like with like), kept in `search_throughput_tok_s`. The speedup over the best baseline has a 95 %
CI obtained by adding the two log-scale half-widths in quadrature (independent runs):
ratio · exp(±√(h₁² + h₂²)), hᵢ = ½·ln(highᵢ / lowᵢ).

Output: `TuneResult.cells` (one row per cell), `TuneResult.steps` (every evaluated
configuration, with `step`), and `TuneResult.serving_table()` — the JSON a serving engine can
consume (format documented on that method and in `vegas_sim.sim.serving`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
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
from vegas_sim.sim.ranking import check_rank_by, score
from vegas_sim.sim.roofline import ROOFLINE_COLUMNS
from vegas_sim.sim.serving import by_context_range, per_batch_size
from vegas_sim.sim.sweep import Estimate, SweepRunner

TuneProgress = Callable[[str, int, int], None]  # (step description, done, total)
Say = Callable[[str], None]
ESTIMATE_OVER_S = 60.0  # say how long tune will take when it is longer than this
MAX_WIDEN = 20  # widenings of the refine window per cell, at most
JSON_FORMAT = "vegas-sim.speculative-table"
JSON_VERSION = 2  # 2: vLLM's per-batch-size list; sparsity = the γ table's
SERVING_STEP = "4-serving"
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


def refine_window(coarse: Sequence[float], center: float, step: float) -> tuple[float, float]:
    """The coarse neighbours of `center` (past the ends: half the smallest, 1.5× the largest)."""
    pts = sorted(coarse)
    i = pts.index(center) if center in pts else int(np.searchsorted(pts, center))
    lo = pts[i - 1] if i > 0 else max(pts[0] / 2.0, step)
    hi = pts[i + 1] if i + 1 < len(pts) else min(pts[-1] * 1.5, 1.0)
    return lo, hi


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


def widen(lo: float, hi: float, best: float, step: float) -> tuple[float, float] | None:
    """The next window to search when `best` sits on an edge of [lo, hi]: as wide as [lo, hi],
    just past that edge, clipped to [step, 1]. None when `best` is inside, or on an edge that
    is already the bound."""
    width, eps = hi - lo, 1e-9
    if best <= lo + eps and lo > step + eps:
        return max(step, round(lo - width, _ROUND)), lo
    if best >= hi - eps and hi < 1.0 - eps:
        return hi, min(1.0, round(hi + width, _ROUND))
    return None


def argbest(df: pd.DataFrame, rank_by: str = "throughput") -> pd.Series:
    """Row with the best `rank_by` metric (`ranking.score`); ties to the smaller γ, then the
    smaller sparsity."""
    if df.empty:
        raise UserInputError("tune evaluated no configuration in a cell",
                             fix="check the grids (--gamma, --sparsity)")
    sc = score(df, rank_by)
    tied = df[sc >= sc.max() * (1 - 1e-12)]
    return tied.sort_values(["gamma", "sparsity"], kind="stable").iloc[0]


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
    `sparsity`: the one sparsity of the serving γ table (step 4)."""

    cells: pd.DataFrame
    steps: pd.DataFrame
    config: TuneConfig
    model: str = ""
    gpu: str = ""
    notes: list[str] = field(default_factory=list)
    sparsity: float = float("nan")

    def gamma_by_batch(self) -> dict[int, int]:
        """One γ per batch size across contexts, at the serving sparsity (step 4): the γ whose
        score (`rank_by`) relative to each context's best is highest on average (it loses
        least over the tuned contexts). Ties go to the smaller γ."""
        s4 = self.steps[self.steps["step"] == SERVING_STEP]
        s4 = s4.assign(_score=score(s4, self.config.rank_by))
        best = s4.groupby(["batch", "context"])["_score"].transform("max")
        rel = s4.assign(rel=(s4["_score"] / best.where(best > 0)).fillna(1.0))
        mean = rel.groupby(["batch", "gamma"])["rel"].mean().reset_index()
        out = {}
        for batch, g in mean.groupby("batch"):
            top = g["rel"].max()
            out[int(batch)] = int(  # type: ignore[arg-type]
                g[g["rel"] >= top * (1 - 1e-12)]["gamma"].min())
        return out

    def serving_table(self) -> dict[str, Any]:
        """The JSON export for a serving engine.

        {
          "format": "vegas-sim.speculative-table", "version": 2,
          "model": ..., "gpu": ..., "method": "vegas",
          "sparsity": s_g,                     # the sparsity the γ tables below are chosen at
          "num_speculative_tokens_per_batch_size": [[1, 3, 7], [4, 15, 6], [16, 16, 4]],
          "num_speculative_tokens_by_batch": {"1": 7, "4": 6, "16": 4},
          "by_context_range": [[1, 32767, [[1, 3, 7], ...]], [32768, 122880, [...]]],
          "sparsity_by_context_range": [[1, 32767, [[1, 3, 0.05], ...]], ...],
          "by_context": {"32768": {"num_speculative_tokens_by_batch": {"1": 7, ...},
                                   "sparsity_by_batch": {"1": 0.05, ...}}, ...},
          "cells": [{batch, context, gamma, sparsity, throughput_tok_s, ..._ci_low/high,
                     speedup_vs_vanilla (+CI), baseline_method, baseline_gamma,
                     baseline_sparsity, speedup_vs_baseline (+CI), chosen_step,
                     extrapolated, ...}],
          "strategy": {the TuneConfig}, "notes": [...]
        }

        `num_speculative_tokens_per_batch_size` is vLLM's option of that name: inclusive
        batch ranges [lo, hi] and K = num_speculative_tokens (conventions in
        `vegas_sim.sim.serving`); with `sparsity` it is one server configuration, γ per batch
        chosen at that sparsity to hold up across the tuned contexts (`gamma_by_batch`).
        `num_speculative_tokens_by_batch` is the same table keyed by tuned batch size.
        Where the context is known, `by_context_range` holds each cell's own optimum γ
        (at that cell's sparsity, `sparsity_by_context_range` / `cells`); `by_context` is
        that table keyed by tuned context (take the largest key <= c, then the largest batch
        key <= b, the smallest key when below all). Keys are strings (JSON).
        """
        cells = self.cells
        gammas: dict[int, dict[int, int]] = {}
        sparsities: dict[int, dict[int, float]] = {}
        for rec in cells.sort_values(["context", "batch"]).to_dict("records"):
            gammas.setdefault(int(rec["context"]), {})[int(rec["batch"])] = int(rec["gamma"])
            sparsities.setdefault(int(rec["context"]), {})[int(rec["batch"])] = float(
                rec["sparsity"])
        by_context = {str(ctx): {
            "num_speculative_tokens_by_batch": {str(b): v for b, v in gammas[ctx].items()},
            "sparsity_by_batch": {str(b): v for b, v in sparsities[ctx].items()},
        } for ctx in gammas}
        table = self.gamma_by_batch()
        return {
            "format": JSON_FORMAT, "version": JSON_VERSION, "model": self.model,
            "gpu": self.gpu, "method": self.config.method, "sparsity": self.sparsity,
            "num_speculative_tokens_per_batch_size": per_batch_size(table),
            "num_speculative_tokens_by_batch": {str(b): g for b, g in sorted(table.items())},
            "by_context_range": by_context_range(gammas),
            "sparsity_by_context_range": by_context_range(sparsities),
            "by_context": by_context,
            "cells": json.loads(cells.to_json(orient="records")),
            "strategy": {k: (list(v) if isinstance(v, tuple) else v)
                         for k, v in asdict(self.config).items()},
            "notes": list(self.notes),
        }


class _Steps:
    """Runs one step for all cells as one sweep and keeps every evaluated row."""

    def __init__(self, runner: SweepRunner, cfg: TuneConfig, seed: int,
                 progress: TuneProgress | None) -> None:
        self.runner, self.cfg, self.seed, self.progress = runner, cfg, seed, progress
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
        df = _tagged(df, label)
        self.rows.append(df)
        return df


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
    cfg = config or TuneConfig()
    cells = sorted({(int(b), int(c)) for b, c in cells})
    if not cells:
        raise UserInputError("no (batch, context) cell to tune", where="--batch/--context",
                             fix="give at least one batch size and one context length")
    cells, notes = _fitting_cells(cfg, cells, latency)
    with SweepRunner(latency, acceptance, workers=workers, scheduler=scheduler) as runner:
        steps = _Steps(runner, cfg, seed, progress)
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
        serving = _mode(refined.values())
        steps.run(SERVING_STEP, [_scenario(cfg, cfg.method, g, serving, c)
                                 for c in cells for g in cfg.gamma])
        evaluated = pd.concat(steps.rows, ignore_index=True)
        evaluated = evaluated[evaluated["method"] == cfg.method]
        chosen = {c: argbest(_cell_rows(evaluated, c), cfg.rank_by) for c in cells}
        notes += _edge_notes(cfg, chosen)
        best_base = {c: argbest(_cell_rows(base[base["method"] != "vanilla"], c), cfg.rank_by)
                     if cfg.baselines else None for c in cells}
        final = _final_rows(steps, cells, chosen, best_base, base)
    table = pd.DataFrame([_cell_row(c, stable[c], final[c], chosen[c], cfg.rank_by)
                          for c in cells])
    steps_df = pd.concat(steps.rows, ignore_index=True)
    gpu = str(steps_df["gpu"].iloc[0]) if "gpu" in steps_df.columns else ""
    return TuneResult(cells=table, steps=steps_df, config=cfg, model=model, gpu=gpu,
                      notes=notes, sparsity=serving)


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
    """Step 3 and its widenings; the best sparsity per cell at its γ*."""
    cfg = steps.cfg
    window = {c: refine_window(cfg.sparsity_coarse, stable[c], cfg.refine_step) for c in cells}
    rows = steps.run("3-refine", [
        _scenario(cfg, cfg.method, gamma[c], s, c) for c in cells
        for s in window_points(*window[c], cfg.refine_step, stable[c])])
    found = [rows]
    for _ in range(MAX_WIDEN):
        best = {c: float(argbest(_cell_rows(pd.concat(found), c), cfg.rank_by)["sparsity"])
                for c in cells}
        nxt = {c: w for c in cells if (w := widen(*window[c], best[c], cfg.refine_step))}
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
                     "still sat on its edge in some cell: a wider --sparsity range may help")
    best = {c: float(argbest(_cell_rows(pd.concat(found), c), cfg.rank_by)["sparsity"])
            for c in cells}
    for c in cells:
        bound = {cfg.refine_step: "smallest", 1.0: "largest"}.get(round(best[c], _ROUND))
        if bound is not None:
            notes.append(f"batch {c[0]}, context {c[1]}: the best sparsity {best[c]:g} is the "
                         f"{bound} searched (the bound): the optimum may lie beyond it")
    return best


def _mode(values: Iterable[float]) -> float:
    """The most frequent value (ties to the smaller), rounded as the grids are."""
    counts = pd.Series([round(v, _ROUND) for v in values]).value_counts()
    return float(min(counts[counts == counts.max()].index))


def _edge_notes(cfg: TuneConfig, chosen: dict[Cell, pd.Series]) -> list[str]:
    top = max(cfg.gamma)
    return [f"batch {c[0]}, context {c[1]}: the best γ is {top}, the largest searched: a "
            "larger γ may be faster" for c, row in chosen.items()
            if len(cfg.gamma) > 1 and int(row["gamma"]) == top]


def _fitting_cells(cfg: TuneConfig, cells: list[Cell], latency: LatencyModel,
                   ) -> tuple[list[Cell], list[str]]:
    """The cells whose every searched configuration fits the model and the GPU (the largest γ
    reserves the most KV slots), and a note for each cell left out."""
    top = max(cfg.probe_gamma, *cfg.gamma, *cfg.baseline_gamma)
    probes = [_scenario(cfg, m, g, 1.0, c) for c in cells
              for m, g in (("vanilla", 1), (cfg.method, top))]
    _, skipped = split_fitting(probes, latency)
    first: dict[Cell, tuple[Scenario, DoesNotFitError]] = {}
    for sc, err in skipped:
        first.setdefault((sc.batch, sc.context), (sc, err))
    return [c for c in cells if c not in first], skipped_notes(list(first.values()))


def _final_rows(steps: _Steps, cells: list[Cell], chosen: dict[Cell, pd.Series],
                best_base: dict[Cell, pd.Series | None],
                base: pd.DataFrame) -> dict[Cell, dict[str, pd.Series | None]]:
    """Chosen, vanilla and best-baseline rows per cell, re-run with the final engine if needed."""
    cfg = steps.cfg
    picks: dict[Cell, dict[str, pd.Series | None]] = {
        c: {"chosen": chosen[c], "vanilla": _cell_rows(base, c, "vanilla").iloc[0],
            "baseline": best_base[c]} for c in cells}
    if cfg.final_engine == cfg.search_engine:
        return picks
    scen, keys = [], []
    for c in cells:
        for role, row in picks[c].items():
            if row is not None:
                scen.append(_scenario(cfg, str(row["method"]), int(row["gamma"]),
                                      float(row["sparsity"]), c))
                keys.append((c, role))
    df = steps.run("final", scen, engine=cfg.final_engine)
    for (c, role), (_, row) in zip(keys, df.iterrows()):
        picks[c][role] = row
    return picks


def _cell_row(cell: Cell, stable: float, rows: dict[str, pd.Series | None],
              searched: pd.Series, rank_by: str) -> dict[str, Any]:
    ch, van, bl = rows["chosen"], rows["vanilla"], rows["baseline"]
    assert ch is not None and van is not None
    out: dict[str, Any] = {
        "batch": cell[0], "context": cell[1], "method": ch["method"], "gamma": int(ch["gamma"]),
        "sparsity": float(ch["sparsity"]), "stable_sparsity": stable,
        "chosen_step": str(searched["step"]),
        "search_throughput_tok_s": float(searched["throughput_tok_s"]),
        "throughput_tok_s": float(ch["throughput_tok_s"]),
        "throughput_ci_low": float(ch["throughput_ci_low"]),
        "throughput_ci_high": float(ch["throughput_ci_high"]),
        "acceptance_length": float(ch["acceptance_length"]),
        "vanilla_tok_s": float(van["throughput_tok_s"]),
    }
    sp = ratio_ci(out["throughput_tok_s"], out["throughput_ci_low"], out["throughput_ci_high"],
                  float(van["throughput_tok_s"]), float(van["throughput_ci_low"]),
                  float(van["throughput_ci_high"]))
    # predict's own speedup columns (same replications, paired) when present; else the ratio.
    if "speedup_vs_vanilla" in ch.index and not pd.isna(ch["speedup_vs_vanilla"]):
        sp = (float(ch["speedup_vs_vanilla"]), float(ch["speedup_ci_low"]),
              float(ch["speedup_ci_high"]))
    out.update(speedup_vs_vanilla=sp[0], speedup_ci_low=sp[1], speedup_ci_high=sp[2])
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
    out["rank_by"] = rank_by
    for name in ("tpot_ms_p50", "goodput_tok_s"):  # the other ranking metrics (COLUMN)
        out[name] = float(ch[name]) if name in ch.index else float("nan")
    return out
