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
interval's low end beats vanilla (pi_low-scaled score above vanilla's score; the low end
without an anchored acceptance's shape-transfer term, `pi_low_shape`: that term is a level
shared by every speculative configuration of the method), the best by
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

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from vegas_sim.errors import DoesNotFitError, UserInputError
from vegas_sim.methods import VANILLA
from vegas_sim.progress import Say, StepProgress
from vegas_sim.sim.acceptance import AcceptanceModel
from vegas_sim.sim.kv_selection import KV_SELECTION_COLUMNS
from vegas_sim.sim.latency import LatencyModel
from vegas_sim.sim.predict import PROVENANCE_COLUMNS, Scenario, is_extrapolated
from vegas_sim.sim.ranking import score
from vegas_sim.sim.roofline import ROOFLINE_COLUMNS
from vegas_sim.sim.scenario import skipped_notes, split_fitting
from vegas_sim.sim.sweep import Estimate, SweepRunner, engines_of
from vegas_sim.sim.tune_result import SERVING_STEP, Cell, TuneConfig, TuneResult, cell_rows
from vegas_sim.sim.tune_rules import (
    SPARSITY_DIGITS,
    Evidence,
    Selection,
    argbest,
    lower_score,
    ranked_score,
    ratio_ci,
    refine_grid,
    refine_window,
    select,
    selection_rule,
    stable_sparsity,
    widen,
    window_points,
)

ESTIMATE_OVER_S = 60.0  # say how long tune will take when it is longer than this
MAX_WIDEN = 20  # widenings of the refine window per cell, at most
BEYOND_STEP = "beyond-box"  # the model asked past the box's edge: reported, never chosen
FINAL_STEP = "final"
BEYOND_GAMMA = 4  # γ past the box's top asked of the model at an edge
RERANK_PCT = 3.0  # configurations this close to the search's best are ranked again
RERANK_MAX = 8


# ---- the search ---------------------------------------------------------------------------------
def _scenario(cfg: TuneConfig, method: str, gamma: int, sparsity: float, cell: Cell) -> Scenario:
    return Scenario(method=method, gamma=gamma, sparsity=sparsity, batch=cell[0],
                    context=cell[1], output_len=cfg.output_len, **cfg.extra)


def _tagged(df: pd.DataFrame, step: str) -> pd.DataFrame:
    return df.assign(step=step)


class _Steps:
    """Runs one step for all cells as one sweep and keeps every evaluated row, each with
    `on_evidence`, `ranked_by` and `rank_score` (`ranked_score`)."""

    def __init__(self, runner: SweepRunner, cfg: TuneConfig, seed: int,
                 progress: StepProgress | None, evidence: Evidence) -> None:
        self.runner, self.cfg, self.seed, self.progress = runner, cfg, seed, progress
        self.evidence = evidence
        self.rows: list[pd.DataFrame] = []
        # (scenario, engine) -> its row: a configuration a later step evaluates again with the
        # same engine (the final ranking of a KV-bound cell re-runs step 4's points) is the same
        # deterministic run (one seed, one replication count), so it is run once
        self._done: dict[tuple[str, str], pd.DataFrame] = {}

    def run(self, label: str, scenarios: list[Scenario], engine: str | None = None) -> pd.DataFrame:
        eng = engine or self.cfg.search_engine
        if len(engines_of(eng)) != 1:  # "both": two rows a scenario, nothing reused
            return self._keep(label, self._sweep(label, scenarios, eng, 0))
        keys = [(repr(sc), eng) for sc in scenarios]
        fresh = list({k: sc for k, sc in zip(keys, scenarios) if k not in self._done}.items())
        if fresh:
            df = self._sweep(label, [sc for _, sc in fresh], eng, len(scenarios) - len(fresh))
            self._done.update((k, df.iloc[[i]]) for i, (k, _) in enumerate(fresh))
        return self._keep(label, pd.concat([self._done[k] for k in keys], ignore_index=True))

    def _sweep(self, label: str, scenarios: list[Scenario], engine: str,
               known: int) -> pd.DataFrame:
        """One sweep of `scenarios`; progress counts the `known` ones (reused) as done."""
        report = None
        if self.progress is not None:
            cb = self.progress

            def report(done: int, total: int) -> None:
                cb(label, known + done, known + total)

        return self.runner.run(scenarios, engine=engine, seed=self.seed,
                               replications=self.cfg.replications, progress=report)

    def _keep(self, label: str, df: pd.DataFrame) -> pd.DataFrame:
        """The step's rows tagged and scored, kept among every evaluated row."""
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
    scen = [_scenario(cfg, VANILLA, 1, 1.0, c) for c in cells]
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
    progress: StepProgress | None = None,
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
        stable = {c: stable_sparsity(cell_rows(s1, c)["sparsity"],
                                     cell_rows(s1, c)["acceptance_length"], cfg.stable_pct)
                  for c in cells}
        s2 = steps.run("2-gamma", [_scenario(cfg, cfg.method, g, stable[c], c)
                                   for c in cells for g in cfg.gamma])
        gamma = {c: int(argbest(cell_rows(s2, c), cfg.rank_by)["gamma"]) for c in cells}
        refined = _refine(steps, cells, gamma, stable, notes)
        searched = pd.concat(steps.rows, ignore_index=True)
        engines = {c: _rank_engine(cfg, cell_rows(searched, c)) for c in cells}
        serving = _mode(refined.values())
        steps.run_by_engine(SERVING_STEP, [_scenario(cfg, cfg.method, g, serving, c)
                                           for c in cells for g in cfg.gamma], engines)
        evaluated = pd.concat(steps.rows, ignore_index=True)
        evaluated = evaluated[(evaluated["method"] == cfg.method)
                              & (evaluated["engine"] == cfg.search_engine)]
        best_base = {c: argbest(cell_rows(base[base["method"] != VANILLA], c), cfg.rank_by)
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
    lo, hi = round(float(s_box[0]), SPARSITY_DIGITS), round(float(s_box[1]), SPARSITY_DIGITS)
    coarse = sorted({round(v, SPARSITY_DIGITS) for v in cfg.sparsity_coarse if lo <= v <= hi} | {lo, hi})
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
        best = {c: float(argbest(cell_rows(pd.concat(found), c), cfg.rank_by)["sparsity"])
                for c in cells}
        nxt = {c: w for c in cells
               if (w := widen(*window[c], best[c], cfg.refine_step, bounds))}
        if not nxt:
            break
        scen = []
        for c, (lo, hi) in nxt.items():
            seen = set(cell_rows(pd.concat(found), c)["sparsity"].round(SPARSITY_DIGITS))
            scen += [_scenario(cfg, cfg.method, gamma[c], s, c)
                     for s in window_points(lo, hi, cfg.refine_step) if s not in seen]
            window[c] = (min(lo, window[c][0]), max(hi, window[c][1]))
        if scen:
            found.append(steps.run("3-widen", scen))
    else:
        notes.append(f"the refine window was widened {MAX_WIDEN} times and the best sparsity "
                     "still sat on its edge in some cell")
    return {c: float(argbest(cell_rows(pd.concat(found), c), cfg.rank_by)["sparsity"])
            for c in cells}


def _mode(values: Iterable[float]) -> float:
    """The most frequent value (ties to the smaller), rounded as the grids are."""
    counts = pd.Series([round(v, SPARSITY_DIGITS) for v in values]).value_counts()
    return float(min(counts[counts == counts.max()].index))


def _fitting_cells(cfg: TuneConfig, cells: list[Cell], latency: LatencyModel,
                   ) -> tuple[list[Cell], list[str]]:
    """The cells whose every searched configuration fits the model and the GPU (the largest γ
    reserves the most KV slots), and a note for each cell left out."""
    top = max(cfg.probe_gamma, *cfg.gamma, *cfg.baseline_gamma) + BEYOND_GAMMA
    probes = [_scenario(cfg, m, g, 1.0, c) for c in cells
              for m, g in ((VANILLA, 1), (cfg.method, top))]
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
        rows = cell_rows(evaluated, c)
        rows = rows[rows["step"] != BEYOND_STEP]
        rows = rows.drop_duplicates(["gamma", "sparsity"])
        near = rows[rows["rank_score"] >= rows["rank_score"].max() * (1 - RERANK_PCT / 100)]
        for _, r in near.nlargest(RERANK_MAX, "rank_score").iterrows():
            scen.append(_scenario(cfg, cfg.method, int(r["gamma"]), float(r["sparsity"]), c))
            keys.append((c, "spec"))
        scen.append(_scenario(cfg, VANILLA, 1, 1.0, c))
        keys.append((c, VANILLA))
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
            role = (VANILLA if row["method"] == VANILLA else
                    "spec" if row["method"] == cfg.method and (c, "spec") in keys
                    else "baseline")
            rerun.setdefault((c, role), []).append(row)
    out = {}
    for c in cells:
        if engines[c] == cfg.search_engine:
            spec = cell_rows(evaluated, c)
            spec = spec[spec["step"] != BEYOND_STEP]
            van = cell_rows(base, c, VANILLA).iloc[0]
            bl = best_base[c]
        else:
            spec = pd.DataFrame(rerun[(c, "spec")])
            van = rerun[(c, VANILLA)][0]
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
        out += [("sparsity bottom", g, round(s_lo * f, SPARSITY_DIGITS)) for f in (2 ** -0.5, 0.5)]
    if s >= s_hi - eps and s_hi < 1.0 - eps:
        out += [("sparsity top", g, round(min(1.0, s_hi * f), SPARSITY_DIGITS)) for f in (2 ** 0.5, 2.0)]
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
        rows = cell_rows(df, c)
        for edge in dict.fromkeys(e for e, _, _ in asks[c]):
            pts = {(g, s) for e, g, s in asks[c] if e == edge}
            r = rows[[(int(g), round(float(s), SPARSITY_DIGITS)) in pts
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
    rows = cell_rows(evaluated, cell)
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
        "pi_low_shape": float(ch.get("pi_low_shape", ch.get("pi_low", math.nan))),
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
    out["speedup_pi_low_shape"] = out["pi_low_shape"] / out["vanilla_tok_s"]
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
    # the chosen configuration's roofline and KV-selection overhead (sim.roofline,
    # sim.kv_selection)
    for col in (*ROOFLINE_COLUMNS, *KV_SELECTION_COLUMNS):
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
