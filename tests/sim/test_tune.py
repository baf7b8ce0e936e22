"""Tune: step logic, and that the three-step search finds the brute-force optimum."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.sim.test_sweep import Models, synthetic_models
from vegas_sim import api
from vegas_sim.errors import DoesNotFitError, UserInputError
from vegas_sim.reports.csv import write_json_doc
from vegas_sim.sim.predict import Scenario
from vegas_sim.sim.serving import (
    CTX_OPEN,
    check_sglang,
    check_trtllm,
    check_vllm,
    check_vllm_per_context,
    per_batch_and_context,
    per_batch_size,
    sglang_config,
    trtllm_config,
)
from vegas_sim.sim.sweep import sweep
from vegas_sim.sim.tune import (
    TuneConfig,
    Evidence,
    TuneResult,
    argbest,
    boxed,
    ratio_ci,
    select,
    refine_grid,
    stable_sparsity,
    tune,
    widen,
)

CONFIG = TuneConfig(
    probe_gamma=12, sparsity_coarse=(0.01, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2), gamma=tuple(range(1, 11)),
    refine_step=0.01, baseline_gamma=(1, 2, 3, 4, 5, 6), output_len=128, tie_pct=0.0,
)
CELLS = [(1, 4096), (4, 32768), (16, 4096)]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    return synthetic_models(tmp_path_factory.mktemp("tune") / "ts")


@pytest.fixture(scope="module")
def result(models: Models) -> TuneResult:
    return tune(CELLS, *models, config=CONFIG, workers=2, model="qwen3-8b")


def test_stable_sparsity_is_smallest_within_pct() -> None:
    s = [0.2, 0.01, 0.05, 0.1]  # unsorted on purpose
    acc = [3.00, 2.0, 2.90, 2.97]
    assert stable_sparsity(s, acc, 2.0) == 0.1  # 2.97 >= 0.98 · 3.0 = 2.94; 2.90 is not
    assert stable_sparsity(s, acc, 5.0) == 0.05
    assert stable_sparsity(s, acc, 0.0) == 0.2


def test_refine_grid_spans_coarse_neighbours() -> None:
    assert refine_grid((0.01, 0.03, 0.05, 0.1), 0.05, 0.01) == [0.03, 0.04, 0.05, 0.06, 0.07,
                                                                 0.08, 0.09, 0.1]
    assert refine_grid((0.01, 0.03), 0.01, 0.005) == [0.005, 0.01, 0.015, 0.02, 0.025, 0.03]
    top = refine_grid((0.5, 0.9), 0.9, 0.1)
    assert top[0] == 0.5 and top[-1] == 1.0  # capped at 1


def test_ratio_ci_quadrature() -> None:
    r, lo, hi = ratio_ci(2.0, 2.0 / math.e, 2.0 * math.e, 1.0, 1.0, 1.0)
    assert (r, lo, hi) == pytest.approx((2.0, 2.0 / math.e, 2.0 * math.e))
    r, lo, hi = ratio_ci(1.0, math.exp(-0.3), math.exp(0.3), 1.0, math.exp(-0.4), math.exp(0.4))
    assert (lo, hi) == pytest.approx((math.exp(-0.5), math.exp(0.5)))


def test_argbest_ties_go_to_smaller_gamma_then_sparsity() -> None:
    df = pd.DataFrame({"gamma": [6, 4, 4], "sparsity": [0.05, 0.07, 0.05],
                       "throughput_tok_s": [10.0, 10.0, 10.0]})
    best = argbest(df)
    assert (best["gamma"], best["sparsity"]) == (4, 0.05)


def test_config_rejects_bad_input() -> None:
    with pytest.raises(UserInputError, match="does not speculate"):
        TuneConfig(method="vanilla")
    with pytest.raises(UserInputError, match="--stable-pct"):
        TuneConfig(stable_pct=150)


def _brute_force(models: Models, cell: tuple[int, int]) -> tuple[pd.Series, float]:
    """Every (γ, s) the strategy could ever reach: γ grid × all fine sparsities in range.

    Returns the optimum and its margin over the best configuration at any other γ.
    """
    lo, hi, step = CONFIG.sparsity_coarse[0], CONFIG.sparsity_coarse[-1], CONFIG.refine_step  # the box
    fine = sorted({round(v, 6) for v in np.arange(step, hi + 1e-9, step) if v >= lo - 1e-9}
                  | set(CONFIG.sparsity_coarse))
    scen = [Scenario("vegas", g, s, batch=cell[0], context=cell[1], output_len=CONFIG.output_len)
            for g, s in itertools.product(CONFIG.gamma, fine)]
    df = sweep(scen, *models, engine="analytic", workers=2)
    best = argbest(df)
    runner_up = df[df["gamma"] != best["gamma"]]["throughput_tok_s"].max()
    return best, float(best["throughput_tok_s"] / runner_up - 1.0)


# Tune's three steps (a heuristic, like the paper's) must land within CLEAR of the brute-force
# optimum's throughput, and where that optimum's γ is clear (more than CLEAR ahead of the best
# at any other γ) on that γ. Near-ties may go either way: inside one γ the landscape is flat in
# s near its peak, and at B=4, C=32K two optima at different γ are 0.05 % apart.
CLEAR = 0.005
@pytest.mark.parametrize("cell", [(1, 4096), (4, 32768), (16, 4096)])
def test_tune_finds_brute_force_optimum(models: Models, result: TuneResult,
                                        cell: tuple[int, int]) -> None:
    truth, margin = _brute_force(models, cell)
    row = result.cells.set_index(["batch", "context"]).loc[cell]
    assert row["throughput_tok_s"] >= truth["throughput_tok_s"] * (1 - CLEAR)
    if margin > CLEAR:
        assert row["gamma"] == truth["gamma"], (margin, truth["gamma"], row["gamma"])


def test_tune_landscape_has_a_clear_gamma_somewhere(models: Models) -> None:
    """The γ branch above is exercised: some cell's optimum γ is clear."""
    assert max(_brute_force(models, c)[1] for c in [(1, 4096), (16, 4096)]) > CLEAR


def test_tune_baselines_and_speedups(models: Models, result: TuneResult) -> None:
    steps = result.steps
    for (batch, context), row in result.cells.set_index(["batch", "context"]).iterrows():
        base = steps[(steps["step"] == "baselines") & (steps["batch"] == batch)
                     & (steps["context"] == context)]
        spec = base[base["method"] != "vanilla"]
        assert row["baseline_tok_s"] == spec["throughput_tok_s"].max()
        assert row["baseline_method"] in CONFIG.baselines
        assert row["speedup_vs_baseline"] == pytest.approx(
            row["throughput_tok_s"] / row["baseline_tok_s"])
        van = base[base["method"] == "vanilla"]["throughput_tok_s"].iloc[0]
        assert row["speedup_vs_vanilla"] == pytest.approx(row["throughput_tok_s"] / van)
        assert (row["speedup_vs_baseline_ci_low"] <= row["speedup_vs_baseline"]
                <= row["speedup_vs_baseline_ci_high"])
    assert {"baselines", "1-sparsity", "2-gamma", "3-refine", "4-serving"} <= set(steps["step"])


def test_serving_json(result: TuneResult, tmp_path: Path) -> None:
    doc = json.loads(write_json_doc(result.serving_table(), tmp_path / "t.json").read_text())
    assert doc["format"] == "vegas-sim.speculative-table" and doc["version"] == 3
    assert doc["method"] == "vegas" and "pi_low" in doc["selection"]
    cells = result.cells.set_index(["batch", "context"])
    # One context per batch in CELLS: the per-batch table is the cell's best K at the serving
    # sparsity (0 where the cell does not speculate), the top-level sparsity that one.
    serving = result.steps[result.steps["step"] == "4-serving"]
    assert set(serving["sparsity"].round(6)) == {doc["sparsity"]}
    table = {int(b): k for b, k in doc["num_speculative_tokens_by_batch"].items()}
    for b, k in table.items():
        cell = cells.loc[b].iloc[0]
        assert k == (argbest(serving[serving["batch"] == b])["gamma"] if cell["speculate"]
                     else 0)
    vllm = doc["vllm"]
    if max(table.values()) > 0:
        spec = vllm["speculative_config"]
        assert spec["num_speculative_tokens"] == max(table.values())
        assert spec["num_speculative_tokens_per_batch_size"] == _ranges(table)
        check_vllm(spec, vllm["max_num_seqs"])
    # contexts differ (4K and 32K): the proposal's rectangular grid, open-ended
    proposal = vllm["speculative_config_per_context_proposal"]
    grid = proposal["num_speculative_tokens_per_batch_size"]
    assert {tuple(e[2:4]) for e in grid} == {(1, 32767), (32768, CTX_OPEN)}
    assert [e[4] for e in grid if e[:3] == [1, 3, 1]] == [cells.loc[(1, 4096), "k"]]
    check_vllm_per_context(proposal)
    assert doc["vegas_sim"]["sparsity"] == doc["sparsity"]
    assert len(doc["cells"]) == len(CELLS)
    with pytest.raises(UserInputError, match="--out"):
        write_json_doc(result.serving_table(), tmp_path / "t.csv")


def _ranges(by_batch: dict[int, int]) -> list[list[int]]:
    """vLLM's [[lo, hi, K], ...] written out by hand: 1 .. max batch, equal K merged."""
    keys = sorted(by_batch)
    out: list[list[int]] = []
    for i, b in enumerate(keys):
        lo, hi = (1 if i == 0 else b), (keys[i + 1] - 1 if i + 1 < len(keys) else b)
        if out and out[-1][2] == by_batch[b]:
            out[-1][1] = hi
        else:
            out.append([lo, hi, by_batch[b]])
    return out


def test_vllm_batch_ranges() -> None:
    assert per_batch_size({1: 7, 4: 6, 16: 6, 64: 2}) == [[1, 3, 7], [4, 63, 6], [64, 64, 2]]
    assert per_batch_size({8: 3}) == [[1, 8, 3]]
    assert per_batch_size({1: 0, 64: 3}, 128) == [[1, 63, 0], [64, 128, 3]]
    grid = per_batch_and_context({(1, 4096): 5, (1, 32768): 4, (8, 32768): 2})
    # (8, 4096) was not tuned: it takes batch 1's K at that context
    assert grid == [[1, 7, 1, 32767, 5], [1, 7, 32768, CTX_OPEN, 4],
                    [8, 8, 1, 32767, 5], [8, 8, 32768, CTX_OPEN, 2]]


def _spec(table: list[list[int]], top: int | None = None) -> dict[str, object]:
    return {"method": "vegas", "num_speculative_tokens": top or max(e[-1] for e in table),
            "num_speculative_tokens_per_batch_size": table}


def test_vllm_rules_accept_a_tiling_and_refuse_the_rest() -> None:
    check_vllm(_spec([[1, 3, 7], [4, 16, 0]]), 16)
    for bad, why in (([[1, 3, 7], [3, 16, 2]], "overlaps"), ([[1, 3, 7], [5, 16, 2]], "gap"),
                     ([[2, 16, 7]], "gap"), ([[1, 8, 7]], "end at 8"),
                     ([[1, 16, 7, 1]], r"\[lo, hi, K\]"), ([[4, 1, 7]], "lo <= hi")):
        with pytest.raises(ValueError, match=why):
            check_vllm(_spec(bad), 16)
    with pytest.raises(ValueError, match="outside"):
        check_vllm(_spec([[1, 16, 7]], top=5), 16)  # vLLM would clamp 7 to 5
    with pytest.raises(ValueError, match="method"):
        check_vllm({**_spec([[1, 16, 7]]), "method": ""}, 16)
    with pytest.raises(ValueError, match="> 0"):
        check_vllm(_spec([[1, 16, 0]], top=0), 16)


def test_vllm_proposal_rules() -> None:
    ok = [[1, 3, 1, 4095, 7], [1, 3, 4096, CTX_OPEN, 5], [4, 8, 1, 4095, 3],
          [4, 8, 4096, CTX_OPEN, 0]]
    check_vllm_per_context(_spec(ok, 7))
    with pytest.raises(ValueError, match="rectangular"):
        check_vllm_per_context(_spec(ok[:3], 7))
    with pytest.raises(ValueError, match="end at 4095"):  # not open-ended
        check_vllm_per_context(_spec([[1, 8, 1, 4095, 7]], 7))
    with pytest.raises(ValueError, match="gap"):
        check_vllm_per_context(_spec([[1, 8, 1, 4095, 7], [1, 8, 5000, CTX_OPEN, 7]], 7))
    with pytest.raises(ValueError, match="duplicate"):
        check_vllm_per_context(_spec([ok[0], ok[0]], 7))


def test_sglang_and_trtllm_exports_follow_their_rules() -> None:
    cfg = sglang_config({1: 7, 4: 5, 16: 5})
    assert cfg["speculative_adaptive_config"] == {"1": {"steps": [7]}, "4": {"steps": [5]}}
    assert cfg["speculative_num_steps"] == 7
    assert sglang_config({1: 0, 64: 3})["speculative_adaptive_config"] is None  # no step 0
    with pytest.raises(ValueError, match="positive"):
        check_sglang({"1": {"steps": [0]}}, 3)
    with pytest.raises(ValueError, match="above"):
        check_sglang({"1": {"steps": [4]}}, 3)
    with pytest.raises(ValueError, match="'1'"):
        check_sglang({"2": {"steps": [3]}}, 3)
    trt = trtllm_config({1: 7, 4: 5, 64: 0})
    assert trt == {"max_draft_len": 7, "draft_len_schedule": {"1": 7, "4": 5, "64": 0},
                   "note": ""}
    low_first = trtllm_config({1: 0, 64: 3})  # batch 1 must draft the most
    assert low_first["draft_len_schedule"] is None and "schedule[1]" in low_first["note"]
    with pytest.raises(ValueError, match="must equal"):
        check_trtllm({"1": 3, "4": 5}, 5)
    with pytest.raises(ValueError, match="outside"):
        check_trtllm({"1": 5, "4": 6}, 5)


def test_select_ties_to_smaller_k_and_says_k0_when_vanilla_wins() -> None:
    rows = pd.DataFrame({"gamma": [8, 4, 2], "sparsity": [0.05, 0.05, 0.05],
                         "throughput_tok_s": [100.0, 99.5, 90.0],
                         "pi_low": [95.0, 96.0, 85.0]})
    vanilla = pd.Series({"throughput_tok_s": 80.0, "pi_low": 78.0})
    sel = select(rows, vanilla, "throughput", 1.0)
    assert sel.speculate and sel.row["gamma"] == 4  # 99.5 is within 1 % of 100
    assert select(rows, vanilla, "throughput", 0.0).row["gamma"] == 8
    # none of the intervals clears vanilla: K = 0, the best speculative row still reported
    sel = select(rows, pd.Series({"throughput_tok_s": 97.0}), "throughput", 0.0)
    assert not sel.speculate and "pi_low" in sel.why and sel.row["gamma"] == 8
    # only γ 2's interval is narrow enough: it is the one recommended
    narrow = rows.assign(pi_low=[70.0, 70.0, 89.0])
    assert select(narrow, pd.Series({"throughput_tok_s": 88.0}), "throughput", 0.0
                  ).row["gamma"] == 2


def test_box_defaults_to_the_evidence_and_exclude_clips_to_it() -> None:
    ev = Evidence({"vegas": (12, 0.01, 0.2)})
    cfg, box, notes = boxed(TuneConfig(), ev)
    assert (cfg.gamma_range, cfg.sparsity_range) == ((1, 12), (0.01, 0.2))
    assert min(cfg.sparsity_coarse) == 0.01 and not notes
    wide = TuneConfig(gamma_range=(2, 16), sparsity_range=(0.005, 0.5))
    cfg, box, _ = boxed(wide, ev)
    assert cfg.gamma == tuple(range(2, 17)) and cfg.sparsity_range == (0.005, 0.5)
    assert ev.reason("vegas", 14, 0.005) == "γ 14 > traced 12, sparsity 0.005 < traced 0.01"
    cfg, _, notes = boxed(replace(wide, outside_evidence="exclude"), ev)
    assert cfg.gamma_range == (2, 12) and cfg.sparsity_range == (0.01, 0.2)
    assert notes and "clipped" in notes[0]


def test_points_outside_the_evidence_are_ranked_by_pi_low(models: Models) -> None:
    cfg = TuneConfig(sparsity_coarse=(0.03, 0.07), gamma=(2, 4), probe_gamma=8,
                     refine_step=0.02, baselines=(), output_len=64,
                     gamma_range=(2, 14), sparsity_range=(0.03, 0.3))
    res = tune([(4, 4096)], *models, config=cfg, workers=1)
    steps = res.steps[res.steps["method"] == "vegas"]
    off = steps[~steps["on_evidence"]]
    assert len(off) and set(off["ranked_by"]) == {"pi_low"}
    assert (off["rank_score"] == off["pi_low"]).all()  # throughput ranked at its low end
    on = steps[steps["on_evidence"]]
    assert (on["rank_score"] == on["throughput_tok_s"]).all()
    row = res.cells.iloc[0]
    assert row["ranked_by"] == ("value" if row["on_evidence"] else "pi_low")


def test_widen_moves_past_the_edge_and_stops_at_the_bounds() -> None:
    assert widen(0.05, 0.1, 0.1, 0.005) == (0.1, 0.15)
    assert widen(0.05, 0.1, 0.05, 0.005) == (0.005, 0.05)
    assert widen(0.02, 0.05, 0.02, 0.005) == (0.005, 0.02)  # clipped to the smallest step
    assert widen(0.05, 0.1, 0.07, 0.005) is None  # inside
    assert widen(0.005, 0.02, 0.005, 0.005) is None  # at the bound
    assert widen(0.8, 1.0, 1.0, 0.005) is None


def test_tune_with_sim_final_engine_has_ci(models: Models) -> None:
    cfg = TuneConfig(sparsity_coarse=(0.03, 0.07), gamma=(2, 4), probe_gamma=8,
                     refine_step=0.02, baselines=("magicdec-stream",), baseline_gamma=(2,),
                     output_len=64, final_engine="sim", replications=3)
    res = tune([(4, 4096)], *models, config=cfg, workers=1)
    row = res.cells.iloc[0]
    assert row["throughput_ci_low"] < row["throughput_tok_s"] < row["throughput_ci_high"]
    assert row["speedup_vs_baseline_ci_low"] < row["speedup_vs_baseline"]
    assert "final" in set(res.steps["step"])


def test_cells_that_do_not_fit_are_skipped_and_named(models: Models) -> None:
    cfg = TuneConfig(sparsity_coarse=(0.03, 0.07), gamma=(2, 4), probe_gamma=8,
                     refine_step=0.02, baselines=(), output_len=64)
    res = tune([(1, 4096), (1, 131072)], *models, config=cfg, workers=1)
    assert list(zip(res.cells["batch"], res.cells["context"])) == [(1, 4096)]
    skips = [n for n in res.notes if n.startswith("skipped")]
    assert len(skips) == 1 and skips[0].startswith("skipped batch 1, context 131072")
    with pytest.raises(DoesNotFitError, match="positions"):
        tune([(1, 131072)], *models, config=cfg, workers=1)


def test_kv_bound_cell_is_ranked_and_reported_with_the_sim_engine(models: Models) -> None:
    """Where the KV cache binds, the analytic engine (no preemption) reads high: tune ranks
    and reports that cell with the SimPy engine, so its numbers are the sim's own."""
    extra = {"kv_capacity_tokens": 3 * (4096 + 64 + 16)}  # about 3 of the 8 requests fit
    cfg = TuneConfig(sparsity_coarse=(0.03, 0.07), gamma=(2, 4), probe_gamma=4,
                     refine_step=0.02, baselines=(), output_len=64, replications=2,
                     extra=extra)
    res = tune([(8, 4096), (1, 4096)], *models, config=cfg, workers=1)
    cells = res.cells.set_index(["batch", "context"])
    bound, free = cells.loc[(8, 4096)], cells.loc[(1, 4096)]
    assert bound["engine"] == "sim" and bound["ranked_with"] == "KV cache binds"
    assert free["engine"] == "analytic"
    sc = Scenario("vegas", int(bound["gamma"]), float(bound["sparsity"]), batch=8,
                  context=4096, output_len=64, **extra)
    sim = sweep([sc], *models, engine="sim", replications=2, workers=1).iloc[0]
    assert bound["throughput_tok_s"] == pytest.approx(sim["throughput_tok_s"], rel=1e-12)
    assert sim["mean_running_batch"] < 8
    s4 = res.steps[(res.steps["step"] == "4-serving") & (res.steps["batch"] == 8)]
    assert set(s4["engine"]) == {"sim"}
    assert any("KV cache binds" in n for n in res.notes)


@pytest.fixture(scope="module")
def packaged() -> TuneResult:
    """Tune as `vegas-sim tune` runs it by default, on the packaged sets, in cells the
    search used to get wrong (B 4 at 120K and B 16 at 32K went below the traced sparsities)."""
    latency, acceptance, _ = api.load_models("qwen3-8b", None, None)
    return tune([(1, 32768), (4, 122880), (16, 32768)], latency, acceptance, workers=2)


def test_packaged_choice_stays_on_the_evidence_and_follows_the_rule(
        packaged: TuneResult) -> None:
    evaluated = packaged.steps[(packaged.steps["method"] == packaged.config.method)
                               & (packaged.steps["step"] != "beyond-box")]
    lo, hi = packaged.box["evidence"]["sparsity"]
    for row in packaged.cells.itertuples():
        cell = evaluated[(evaluated["batch"] == row.batch)
                         & (evaluated["context"] == row.context)]
        assert len(cell) > 20 and set(cell["step"]) >= {"1-sparsity", "2-gamma", "3-refine"}
        assert cell["on_evidence"].all() and lo <= row.sparsity <= hi
        assert row.gamma <= packaged.box["evidence"]["gamma_max"]
        van = packaged.steps[(packaged.steps["method"] == "vanilla")
                             & (packaged.steps["batch"] == row.batch)
                             & (packaged.steps["context"] == row.context)].iloc[0]
        sel = select(cell, van, "throughput", packaged.config.tie_pct)
        assert (row.gamma, row.sparsity, row.k) == (
            sel.row["gamma"], sel.row["sparsity"], sel.row["gamma"] if sel.speculate else 0)
        # the rule's low end leaves out the anchors' shape-transfer term; the printed keeps it
        assert row.pi_low <= row.pi_low_shape
        if row.speculate:  # beats vanilla by its interval, and nothing beats it by > 1 %
            assert row.pi_low_shape > row.vanilla_tok_s
            eligible = cell[cell["pi_low_shape"] > row.vanilla_tok_s]
            assert row.throughput_tok_s >= eligible["throughput_tok_s"].max() * 0.99
        if row.edge:
            assert not math.isnan(row.edge_gain_pct)


def test_packaged_exports_pass_the_engines_rules(packaged: TuneResult) -> None:
    doc = packaged.serving_table()
    serving = packaged.steps[packaged.steps["step"] == "4-serving"]
    assert set(serving["sparsity"].round(6)) == {doc["sparsity"]}
    vllm = doc["vllm"]
    assert vllm["max_num_seqs"] == 16
    if vllm["speculative_config"] is not None:
        check_vllm(vllm["speculative_config"], 16)
    proposal = vllm["speculative_config_per_context_proposal"]
    if proposal is not None:
        check_vllm_per_context(proposal)
        ctx = sorted({tuple(e[2:4]) for e in proposal["num_speculative_tokens_per_batch_size"]})
        assert ctx == [(1, 122879), (122880, CTX_OPEN)] and "proposal" in proposal["status"]
    if doc["sglang"]["speculative_adaptive_config"] is not None:
        check_sglang(doc["sglang"]["speculative_adaptive_config"],
                     doc["sglang"]["speculative_num_steps"])
    if doc["tensorrt_llm"]["draft_len_schedule"] is not None:
        check_trtllm(doc["tensorrt_llm"]["draft_len_schedule"],
                     doc["tensorrt_llm"]["max_draft_len"])
