"""What `tune` takes and gives: `TuneConfig` (the search) and `TuneResult` (the chosen
configuration per cell, every evaluated row, and the serving engines' export)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from vegas_sim.errors import UserInputError
from vegas_sim.methods import SPEC_METHODS, VANILLA, check_gamma, check_method, check_sparsity
from vegas_sim.sim.options import OUTSIDE_EVIDENCE, option_texts
from vegas_sim.sim.ranking import check_rank_by
from vegas_sim.sim.serving import sglang_config, trtllm_config, vegas_config, vllm_config
from vegas_sim.sim.workload import Arrivals

JSON_FORMAT = "vegas-sim.speculative-table"
JSON_VERSION = 3  # 3: per-engine sections (vLLM, SGLang, TensorRT-LLM, ours), K = 0
SERVING_STEP = "4-serving"
Cell = tuple[int, int]  # (batch, context)


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

    def written(self) -> dict[str, Any]:
        """The configuration as the serving table writes it (its "strategy"): tuples as
        lists, `extra` in the options' texts."""
        fields = {**asdict(self), "extra": option_texts(self.extra)}
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in fields.items()}

    def __post_init__(self) -> None:
        slo = any(self.extra.get(k) is not None for k in ("slo_tpot_ms", "slo_ttft_ms"))
        check_rank_by(self.rank_by, slo)
        open_loop = self.extra.get("arrival", Arrivals()).is_open
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


def cell_rows(df: pd.DataFrame, cell: Cell, method: str | None = None) -> pd.DataFrame:
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
        van = self.steps[self.steps["method"] == VANILLA]
        out = []
        for b, c, eng in zip(self.cells["batch"], self.cells["context"], self.cells["engine"]):
            rows = cell_rows(van, (int(b), int(c)))
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
            "strategy": self.config.written(),
            "notes": list(self.notes),
        }
