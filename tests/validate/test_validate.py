"""validate: held-out configurations outside the grid, and the replayed measurement run."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.calibrate.conftest import tiny_model
from vegas_sim.errors import UserInputError
from vegas_sim.methods import MIN_TOKENS
from vegas_sim.validate.heldout import (
    HeldOut,
    check_outside_grid,
    is_grid_point,
    random_heldout,
    read_heldout,
    write_heldout,
)
from vegas_sim.validate.measure import measure_replayed

GRID = {"batch": [1, 4, 16], "context": [1024, 4096], "gamma": [4, 8], "sparsity": [0.05, 0.1]}


def test_random_heldout_is_outside_the_grid_and_seeded() -> None:
    a = random_heldout(30, GRID, np.random.default_rng(3), batches=(1, 16),
                       contexts=(1024, 4096))
    b = random_heldout(30, GRID, np.random.default_rng(3), batches=(1, 16),
                       contexts=(1024, 4096))
    assert a == b
    assert not any(is_grid_point(h, GRID) for h in a)
    assert {h.method for h in a} >= {"vanilla", "vegas", "magicdec-quest"}


def test_grid_point_is_refused() -> None:
    on_grid = HeldOut("vegas", 4, 0.05, 4, 1024)
    with pytest.raises(UserInputError, match="grid points"):
        check_outside_grid([on_grid], GRID)
    check_outside_grid([HeldOut("vegas", 4, 0.05, 3, 1024)], GRID)  # batch 3 is off-grid


def test_heldout_file_round_trip_and_bad_column(tmp_path: Path) -> None:
    hs = [HeldOut("vegas", 6, 0.07, 3, 3000), HeldOut("vanilla", 1, 1.0, 2, 5000)]
    write_heldout(hs, tmp_path / "h.csv")
    assert read_heldout(tmp_path / "h.csv") == hs
    (tmp_path / "bad.csv").write_text("method,gamma,sparsity,batch,context,colour\n"
                                      "vegas,6,0.07,3,3000,red\n")
    with pytest.raises(UserInputError, match="colour"):
        read_heldout(tmp_path / "bad.csv")


def test_replayed_run_follows_the_replayed_acceptance() -> None:
    torch.manual_seed(0)
    model = tiny_model("qwen3")
    h = HeldOut("vegas", gamma=3, sparsity=0.5, batch=2, context=40, output_len=24)
    seqs = np.array([[3, 0, 1, 2] * 10, [1, 1, 1, 1] * 10])
    m = measure_replayed(model, h, seqs, seed=0)
    # Request 0 emits 4, 1, 2, 3 tokens per cycle of 4 iterations and reaches 24 first, in
    # the 9th iteration (4+1+2+3+4+1+2+3+4); request 1 emits 2 per iteration: 18 by then.
    assert m.iterations == 9
    assert m.tokens == 24 + 18
    assert m.throughput > 0


def test_run_validation_end_to_end_on_cpu(tmp_path: Path) -> None:
    """validate's whole path on CPU: held-out file → predict from the trace set → a real
    (random-weight, replayed-acceptance) run → a result table with errors."""
    from vegas_sim.traces.synthetic import make_synthetic_trace_set
    from vegas_sim.validate.results import summarize
    from vegas_sim.validate.run import run_validation

    traces = tmp_path / "traces"
    make_synthetic_trace_set(traces, model="smollm2-135m", gammas=(2, 4),
                             contexts=(64, 256), batches=(1, 2))
    hs = [HeldOut("vegas", 2, 0.5, 2, 80, output_len=8), HeldOut("vanilla", 1, 1.0, 1, 100, 8)]
    write_heldout(hs, tmp_path / "h.csv")
    out = tmp_path / "val.csv"
    table = run_validation(traces=traces, acceptance_traces=None, heldout_file=tmp_path / "h.csv",
                           n_random=None, model="smollm2-135m", weights="random", max_batch=2,
                           contexts=(64, 256), output_len=8, device="cpu", seed=0, out=out,
                           replications=2)
    assert out.exists() and len(table) == 2
    assert (table["measured"] > 0).all() and (table["predicted"] > 0).all()
    assert set(table["regime"]) == {"random-weights+replay"}
    assert "configurations" in summarize(table)
    # the phase wave: every phase the latency model predicts was timed, and vice versa
    from vegas_sim.validate.results import parse_phases

    for _, row in table.iterrows():
        meas, pred = parse_phases(row["measured_phase_ms"]), parse_phases(
            row["predicted_phase_ms"])
        assert set(meas) == set(pred) and all(v > 0 for v in meas.values())
    assert set(parse_phases(table.iloc[0]["measured_phase_ms"])) == {
        "draft_step", "verify", "sample", "select"}


def test_run_validation_refuses_a_device_it_cannot_use(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The same --device checks as calibrate, before any model is loaded."""
    from vegas_sim.calibrate import loading
    from vegas_sim.traces.synthetic import make_synthetic_trace_set
    from vegas_sim.validate.run import run_validation

    make_synthetic_trace_set(tmp_path / "t", model="smollm2-135m", gammas=(2,),
                             contexts=(64, 256), batches=(1,))
    write_heldout([HeldOut("vegas", 2, 0.5, 1, 80, output_len=8)], tmp_path / "h.csv")
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    with pytest.raises(UserInputError, match="unknown device 'gpu0'"):
        run_validation(traces=tmp_path / "t", acceptance_traces=None,
                       heldout_file=tmp_path / "h.csv", n_random=None, model="smollm2-135m",
                       weights="random", max_batch=1, contexts=(64, 256), output_len=8,
                       device="gpu0", seed=0, out=tmp_path / "v.csv", replications=1)


def test_phase_means_charge_the_host_gap_to_sample_and_quest_updates_to_other() -> None:
    from vegas_sim.validate.measure import phase_means
    from vegas_sim.validate.results import format_phases, parse_phases

    summary = {"draft_step": [1.0, 1.0, 1.0, 1.0], "other": [0.2, 0.2], "verify": [3.0, 3.0],
               "sample": [0.5, 0.5], "quest_meta": [0.1, 0.1]}
    per = phase_means(summary, 2, 2 * 6.0, "magicdec-quest")  # 5.8 ms of phases per iteration
    assert per == pytest.approx({"draft_step": 2.0, "other": 0.3, "verify": 3.0, "sample": 0.7})
    assert parse_phases(format_phases(per)) == pytest.approx(per)
    vegas = phase_means(summary, 2, 2 * 6.0, "vegas")  # no index prep: the timer's own cost
    assert vegas == pytest.approx({"draft_step": 2.3, "verify": 3.0, "sample": 0.7})
    assert phase_means({"decode": [3.0]}, 1, 2.0) == {"decode": 3.0, "sample": 0.0}


def test_prompts_are_natural_text_and_waves_rotate() -> None:
    from vegas_sim.validate.measure import prompts_for

    h = HeldOut("vegas", 3, 0.1, batch=2, context=5, output_len=8)
    long_prompts = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12], [13, 14, 15, 16, 17, 18]]
    p0, note = prompts_for(h, [[99, 98]] + long_prompts, wave=0)
    assert note == "" and [p.tolist() for p in p0] == [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11]]
    p1, _ = prompts_for(h, long_prompts, wave=1)  # requests 2, 3 → prompts 2, 0
    assert [p.tolist() for p in p1] == [[13, 14, 15, 16, 17], [1, 2, 3, 4, 5]]
    p, note = prompts_for(h, [[4, 5]], wave=0)  # nothing long enough: repeated, and said so
    assert p[0].tolist() == [4, 5, 4, 5, 4] and "repeated" in note
    chat = HeldOut("vegas", 3, 0.1, batch=2, context=5, output_len=8, workload="chat")
    p, _ = prompts_for(chat, long_prompts, wave=0)  # a request keeps its end: the question
    assert [x.tolist() for x in p] == [[2, 3, 4, 5, 6], [8, 9, 10, 11, 12]]
    recall = HeldOut("vegas", 3, 0.1, batch=2, context=5, output_len=8, workload="recall")
    p, note = prompts_for(recall, [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11]], wave=0)
    assert note == "" and [x.tolist() for x in p] == [[7, 8, 9, 10, 11]] * 2  # whole, uncut
    p, note = prompts_for(recall, [[1, 2, 3, 4, 5, 6]], wave=0)
    assert "without their question" in note


def test_fixed_sequences_start_every_call_at_the_first_iteration() -> None:
    from vegas_sim.sim.acceptance_dist import FixedSequences

    fs = FixedSequences(3, [[0, 1, 2, 3, 5], [1]])
    a = fs.sample(np.random.default_rng(0), 3, 3)
    b = fs.sample(np.random.default_rng(0), 3, 7)  # the engine's wider redraw
    assert a.tolist() == [[0, 1, 2], [1, 1, 1], [0, 1, 2]]
    assert b.tolist() == [[0, 1, 2, 3, 3, 0, 1], [1] * 7, [0, 1, 2, 3, 3, 0, 1]]  # 5 → γ, cyclic
    assert fs.mean_length == pytest.approx(1 + (0 + 1 + 2 + 3 + 3 + 1) / 6)


def test_replayed_prediction_matches_hand_count(tmp_path: Path) -> None:
    """With given accept counts the simulator's window is known exactly: request 0 needs
    4 + 1 + 2 + ... tokens; the window's tokens and iterations follow."""
    from vegas_sim.sim.predict import Scenario
    from vegas_sim.traces.synthetic import make_synthetic_trace_set
    from vegas_sim.validate.predict import load_models, predict_replayed

    traces = tmp_path / "traces"
    make_synthetic_trace_set(traces, model="smollm2-135m", gammas=(2, 4),
                             contexts=(64, 256), batches=(1, 2))
    models = load_models(traces, None)
    sc = Scenario("vegas", 3, 0.5, batch=2, context=80, output_len=24, requests=2)
    seqs = [[[3, 0, 1, 2] * 10, [1, 1, 1, 1] * 10]]
    thr, iter_ms = predict_replayed(sc, models.latency, seqs, waves=1, seed=0)
    cost = models.latency.iteration_cost("vegas", 3, 0.5, MIN_TOKENS)  # sc's: unresolved
    # 9 iterations (as in the measured replay test), 24 + 18 tokens; contexts grow per
    # request by its emitted tokens.
    ctx = np.array([80, 80])
    total = 0.0
    for k in range(9):
        total += cost(ctx)
        ctx = ctx + np.array([[4, 1, 2, 3][k % 4], 2])
    assert iter_ms == pytest.approx(total / 9)
    assert thr == pytest.approx(42 / (total / 1000.0))


def test_repredict_keeps_measurements_and_recomputes(tmp_path: Path) -> None:
    import pandas as pd

    from vegas_sim.traces.synthetic import make_synthetic_trace_set
    from vegas_sim.validate.repredict import repredict
    from vegas_sim.validate.results import compare, encode_accepted

    traces = tmp_path / "traces"
    make_synthetic_trace_set(traces, model="smollm2-135m", gammas=(2, 4),
                             contexts=(64, 256), batches=(1, 2))
    old = pd.DataFrame([{
        "method": "vegas", "gamma": 3, "sparsity": 0.5, "batch": 2, "context": 80,
        "output_len": 24, "workload": None, "temperature": 0.0, "waves": 1,
        "regime": "random-weights+replay", "predicted": 1.0, "measured": 500.0,
        "error_pct": -99.8, "measured_iterations": 9, "measured_seconds": 0.084,
        "measured_tokens": 42,
        "measured_accepted": encode_accepted([[[3, 0, 1, 2] * 3, [1] * 12]]),
    }])
    old.to_csv(tmp_path / "old.csv", index=False)
    before, after = repredict(tmp_path / "old.csv", traces=traces, acceptance_traces=None,
                              out=tmp_path / "new.csv", seed=0, replications=2)
    row = after.iloc[0]
    assert row["measured_phase_ms"] == row["predicted_phase_ms"] == ""  # an untimed old run
    assert row["measured"] == 500.0 and row["predicted"] == row["predicted_replay"] > 1.0
    assert row["error_pct"] == pytest.approx(100 * (row["predicted"] - 500) / 500)
    assert (tmp_path / "new.csv").exists()
    assert "before median 99.8 %" in compare(before, after)


def test_empty_temperature_resolves_to_the_latency_grids(tmp_path: Path) -> None:
    from vegas_sim.traces.synthetic import make_synthetic_trace_set
    from vegas_sim.validate.predict import load_models, resolve_temperature

    traces = tmp_path / "traces"
    make_synthetic_trace_set(traces, model="smollm2-135m", gammas=(2, 4),
                             contexts=(64, 256), batches=(1, 2), latency_temperature=0.6)
    models = dataclasses.replace(load_models(traces, None), traced_temperatures=(0.0, 0.6))
    assert models.latency_temperature == 0.6
    h, note = resolve_temperature(HeldOut("vegas", 3, 0.1, 2, 80, temperature=None), models)
    assert h.temperature == 0.6 and note == ""
    h, note = resolve_temperature(HeldOut("vegas", 3, 0.1, 2, 80, temperature=0.0), models)
    assert "sampling cost differs" in note
    assert "priced sampled at T 0.6 (run greedy: not measured)" in note
    greedy_only = dataclasses.replace(models, traced_temperatures=(0.0,))
    h, note = resolve_temperature(HeldOut("vegas", 3, 0.1, 2, 80, temperature=None),
                                  greedy_only)
    assert h.temperature == 0.0 and "differs" in note


def test_a_set_of_both_modes_notes_the_greedy_pricing(tmp_path: Path) -> None:
    """A run at T 0 against a set that timed the sampling phases greedy too is priced greedy:
    the note says so and no longer that the sampling cost differs."""
    from vegas_sim.traces.synthetic import make_synthetic_trace_set
    from vegas_sim.validate.predict import load_models, resolve_temperature

    traces = tmp_path / "traces"
    make_synthetic_trace_set(traces, model="smollm2-135m", gammas=(2, 4), contexts=(64, 256),
                             batches=(1, 2), latency_temperature=0.6,
                             greedy_over_sampled={"draft_step": 0.5, "sample": 0.5})
    models = load_models(traces, None)
    h, note = resolve_temperature(HeldOut("vegas", 3, 0.1, 2, 80, temperature=0.0), models)
    assert note == "sampling phases priced greedy"


def test_committed_heldout_sets_are_valid_and_off_grid() -> None:
    import importlib.util

    root = Path(__file__).resolve().parents[2] / "benchmarks" / "validation"
    spec = importlib.util.spec_from_file_location("make_heldout", root / "make_heldout.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for regime in ("smollm2", "qwen3_8b"):
        hs = read_heldout(root / f"heldout_{regime}.csv")
        assert len(hs) >= 22
        check_outside_grid(hs, mod.GRIDS[regime])
        assert {h.method for h in hs} == set(mod.METHODS)
        # the committed file is what the recorded seed regenerates (the first replay draw ran
        # one wave a row, before MIN_REQUESTS_REPLAY: its waves are the protocol of then)
        drawn = mod.draw(regime, np.random.default_rng([mod.SEED, 0 if regime == "smollm2" else 1]))
        if regime == "qwen3_8b":
            drawn = [dataclasses.replace(h, waves=1) for h in drawn]
        assert hs == drawn
        if regime == "qwen3_8b":
            assert all(mod.kv_gb(h.batch, h.context, h.output_len) <= mod.MAX_KV_GB for h in hs)
            assert max(h.context for h in hs) > 100_000 and min(h.batch for h in hs) == 1
    # the second SmolLM2 draw is its seed's too, and as far off the grids
    fresh = read_heldout(root / "heldout_smollm2_seed20261130.csv")
    check_outside_grid(fresh, mod.GRIDS["smollm2"])
    assert fresh == mod.draw("smollm2", np.random.default_rng([20261130, 0]))
    assert fresh != read_heldout(root / "heldout_smollm2.csv")
    # the third draw, both regimes, waves included
    for regime, stream in (("smollm2", 0), ("qwen3_8b", 1)):
        third = read_heldout(root / f"heldout_{regime}_seed20261202.csv")
        check_outside_grid(third, mod.GRIDS[regime])
        assert third == mod.draw(regime, np.random.default_rng([20261202, stream]))
        assert all(h.batch * h.waves >= 16 for h in third)
    # the far-end draw: every batch past the seeded rows', each fitting the KV memory
    for regime, stream in (("smollm2", 0), ("qwen3_8b", 1)):
        far = read_heldout(root / f"heldout_{regime}_far_seed20261203.csv")
        assert far == mod.draw(regime, np.random.default_rng([20261203, stream]), far=True)
        check_outside_grid(far, mod.GRIDS[regime])
        assert len(far) == mod.N_FAR and min(h.batch for h in far) > 64
        assert {h.method for h in far} == set(mod.METHODS)
        assert all(mod.feasible(regime, h.batch, h.context) for h in far)


def test_acceptance_sampling_error_is_the_spread_of_requests() -> None:
    from vegas_sim.validate.results import acceptance_se_pct

    # two waves, two requests each: per-request acceptance lengths 2, 4, 3, 3 → mean 3,
    # std 0.8165, SE 0.408 = 13.6 % of 3
    waves = [[[1, 1], [3, 3]], [[2, 2, 2], [1, 3]]]
    assert acceptance_se_pct(waves) == pytest.approx(100 * 0.816497 / 2 / 3, rel=1e-4)
    assert math.isnan(acceptance_se_pct([[[2, 2]]]))  # one request: no spread to measure
    assert math.isnan(acceptance_se_pct([]))  # vanilla records nothing
    assert acceptance_se_pct([[[2, 2], [2, 2]]]) == 0.0  # identical requests
    # requests of one prompt are averaged first: prompts 0 (lengths 2, 3) and 1 (4, 3) → 2.5
    # and 3.5, std 0.7071, SE 0.5 = 16.7 % of 3
    assert acceptance_se_pct(waves, [[0, 1], [0, 1]]) == pytest.approx(100 * 0.5 / 3, rel=1e-4)
    assert math.isnan(acceptance_se_pct(waves, [[0, 0], [0, 0]]))  # one prompt: no spread


def test_a_runs_sampling_error_widens_by_students_t_for_its_prompts() -> None:
    """The run's acceptance error in the interval: its SE × t(0.975, n − 1) / 1.96 for n
    distinct prompts (3 prompts: 4.30 / 1.96), nearly the SE itself for many, 0 unmeasured."""
    from vegas_sim.validate.results import prompt_lengths, run_error_pct

    waves = [[[1, 1], [3, 3]], [[2, 2, 2], [1, 3]]]
    np.testing.assert_allclose(sorted(prompt_lengths(waves, [[0, 1], [0, 1]])), [2.5, 3.5])
    assert len(prompt_lengths(waves)) == 4  # no prompt ids: every request its own
    assert run_error_pct(10.0, 3) == pytest.approx(10.0 * 4.302653 / 1.96, rel=1e-5)
    assert 10.0 < run_error_pct(10.0, 200) < 10.1
    assert run_error_pct(10.0, 1) == 0.0 and run_error_pct(math.nan, 8) == 0.0


def test_prompt_index_cycles_through_the_long_prompts() -> None:
    from vegas_sim.validate.results import long_prompts, prompt_index

    h = HeldOut("vegas", 4, 0.1, 3, 5, 8, waves=2)
    long, note = long_prompts(h, [[1] * 4, [2] * 5, [3] * 9])
    assert long == [[2] * 5, [3] * 9] and note == ""
    assert prompt_index(h, len(long)) == [[0, 1, 0], [1, 0, 1]]
    assert "repeated" in long_prompts(h, [[1] * 4])[1]


def test_request_prompts_follow_the_workload_the_run_had() -> None:
    from vegas_sim.validate.results import request_prompts

    # longdoc at C 3.5K: the 4K and 7K windows. The first 32 (the workload's first version)
    # hold 16 of them, so 64 requests see each old window 4 times; the first 128 hold 64, and
    # today's 160 too (the 3K windows appended last are shorter than 3.5K)
    h = HeldOut("vegas", 4, 0.1, 64, 3584, 128, workload="longdoc", waves=1)
    old, n_old = request_prompts(h, "real", 32)
    new, n_new = request_prompts(h, "real", None)  # today's workload: all 160
    assert old is not None and new is not None and (n_old, n_new) == (32, 160)
    assert len(set(old[0])) == 16 and len(set(new[0])) == 64
    # at C 2.5K the 3K windows count: 96 long enough today, 64 of the first 128
    short = HeldOut("vegas", 4, 0.1, 128, 2560, 128, workload="longdoc", waves=1)
    first, _ = request_prompts(short, "real", 128)
    today, _ = request_prompts(short, "real", None)
    assert first is not None and today is not None
    assert len(set(first[0])) == 64 and len(set(today[0])) == 96
    assert request_prompts(h, "random", 32) == (None, None)  # replay: no prompts


def test_acceptance_falls_back_to_the_packaged_real_set(tmp_path: Path) -> None:
    """As --help says and predict does: a random-weights latency set with no
    --acceptance-traces gets the packaged real-weights acceptance, and a note says so."""
    from vegas_sim.traces.synthetic import make_synthetic_trace_set
    from vegas_sim.validate.predict import load_models

    traces = tmp_path / "traces"
    make_synthetic_trace_set(traces, model="smollm2-135m", gammas=(2, 4), contexts=(64, 256),
                             batches=(1, 2), weights_kind="random")
    models = load_models(traces, None)
    assert any("acceptance: smollm2-135m-real" in n for n in models.notes)
    assert models.acceptance.coverage()["workloads"]


def test_repredict_names_the_row_a_wrong_latency_set_cannot_hold(tmp_path: Path) -> None:
    import pandas as pd

    from vegas_sim.traces.synthetic import make_synthetic_trace_set
    from vegas_sim.validate.repredict import repredict

    traces = tmp_path / "traces"
    make_synthetic_trace_set(traces, model="smollm2-135m", gammas=(2, 4), contexts=(64, 256),
                             batches=(1, 2))
    pd.DataFrame([{"method": "vegas", "gamma": 3, "sparsity": 0.1, "batch": 2,
                   "context": 100_000, "output_len": 64, "workload": None,
                   "temperature": 0.0, "waves": 1, "regime": "real-weights",
                   "predicted": 1.0, "measured": 500.0}]).to_csv(tmp_path / "old.csv",
                                                                   index=False)
    with pytest.raises(UserInputError, match=r"row 1 \(vegas, batch 2, context 100000\)") as e:
        repredict(tmp_path / "old.csv", traces=traces, acceptance_traces=None,
                  out=tmp_path / "new.csv")
    assert e.value.fix is not None and "measured against" in e.value.fix


def test_passes_pool_and_resume_keeps_what_an_interrupted_run_measured(tmp_path: Path) -> None:
    """--passes measures the list again in turn and pools it; --resume adds only the passes a
    table lacks, keeping the ones it has, and refuses a table of other configurations."""
    import pandas as pd

    from vegas_sim.traces.synthetic import make_synthetic_trace_set
    from vegas_sim.validate.run import run_validation

    traces = tmp_path / "traces"
    make_synthetic_trace_set(traces, model="smollm2-135m", gammas=(2, 4),
                             contexts=(64, 256), batches=(1, 2))
    write_heldout([HeldOut("vegas", 2, 0.5, 2, 80, output_len=8),
                   HeldOut("vanilla", 1, 1.0, 1, 100, 8)], tmp_path / "h.csv")
    out = tmp_path / "val.csv"
    args = dict(traces=traces, acceptance_traces=None, heldout_file=tmp_path / "h.csv",
                n_random=None, model="smollm2-135m", weights="random", max_batch=2,
                contexts=(64, 256), output_len=8, device="cpu", seed=0, out=out,
                replications=2, phase_wave=False)
    one = run_validation(**args)  # type: ignore[arg-type]
    assert list(one["measured_passes"]) == [1, 1] and one["measured_pass_se_pct"].isna().all()
    two = run_validation(**args, passes=2, resume=True)  # type: ignore[arg-type]
    assert list(two["measured_passes"]) == [2, 2]
    for (_, a), (_, b) in zip(one.iterrows(), two.iterrows(), strict=True):
        first, second = map(int, str(b["measured_pass_tokens"]).split(";"))
        assert first == a["measured_tokens"]  # kept, not measured again
        assert b["measured_tokens"] == first + second
        seconds = sum(map(float, str(b["measured_pass_seconds"]).split(";")))
        assert b["measured"] == pytest.approx(b["measured_tokens"] / seconds)
        assert b["error_first_pass_pct"] == pytest.approx(
            100 * (b["predicted"] - a["measured"]) / a["measured"], rel=1e-6)
        assert b["measured_pass_se_pct"] >= 0
    assert pd.read_csv(out)["measured_passes"].tolist() == [2, 2]

    write_heldout([HeldOut("vegas", 2, 0.5, 2, 90, output_len=8)], tmp_path / "other.csv")
    with pytest.raises(UserInputError, match="not among the held-out configurations"):
        run_validation(**{**args, "heldout_file": tmp_path / "other.csv"},  # type: ignore[arg-type]
                       resume=True)


def test_repredict_keeps_the_passes_and_scores_the_first_alone(tmp_path: Path) -> None:
    import pandas as pd

    from vegas_sim.traces.synthetic import make_synthetic_trace_set
    from vegas_sim.validate.repredict import repredict
    from vegas_sim.validate.results import Measurement, pass_columns, passes_from_row

    traces = tmp_path / "traces"
    make_synthetic_trace_set(traces, model="smollm2-135m", gammas=(2, 4),
                             contexts=(64, 256), batches=(1, 2))
    passes = [Measurement(42, 0.08, 9, 2.0), Measurement(42, 0.12, 9, 2.0)]
    cols = pass_columns(passes, predicted=1.0)
    # 525 and 350 tok/s: sd 175/√2 around 437.5, its standard error /√2 more: 20 %
    assert cols["measured_pass_se_pct"] == pytest.approx(100 * 175 / 2 / 437.5)
    row = {"method": "vanilla", "gamma": 1, "sparsity": 1.0, "batch": 2, "context": 80,
           "output_len": 24, "workload": None, "temperature": 0.0, "waves": 1,
           "regime": "random-weights+replay", "predicted": 1.0, "measured": 84 / 0.2,
           "measured_iterations": 18, "measured_seconds": 0.2, "measured_tokens": 84, **cols}
    assert [m.throughput for m in passes_from_row(row)] == [m.throughput for m in passes]
    pd.DataFrame([row]).to_csv(tmp_path / "old.csv", index=False)
    _, after = repredict(tmp_path / "old.csv", traces=traces, acceptance_traces=None,
                         out=tmp_path / "new.csv", seed=0, replications=2)
    new = after.iloc[0]
    assert new["measured_passes"] == 2 and new["measured_pass_tokens"] == "42;42"
    assert new["error_first_pass_pct"] == pytest.approx(
        100 * (new["predicted"] - 525.0) / 525.0)


def test_a_row_that_runs_out_of_gpu_memory_is_skipped_and_said(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A held-out row too large for the GPU is left out of the table with a line saying why;
    the rows after it are still measured (a whole validate used to stop at the first one)."""
    import torch

    from vegas_sim.traces.synthetic import make_synthetic_trace_set
    from vegas_sim.validate import run as validate_run

    traces = tmp_path / "traces"
    make_synthetic_trace_set(traces, model="smollm2-135m", gammas=(2, 4),
                             contexts=(64, 256), batches=(1, 2))
    write_heldout([HeldOut("vegas", 2, 0.5, 2, 80, output_len=8),
                   HeldOut("vanilla", 1, 1.0, 1, 100, 8)], tmp_path / "h.csv")
    measure = validate_run.measure_config

    def too_big(model: object, h: HeldOut, *args: object) -> object:
        if h.method == "vegas":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return measure(model, h, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(validate_run, "measure_config", too_big)
    said: list[str] = []
    table = validate_run.run_validation(
        traces=traces, acceptance_traces=None, heldout_file=tmp_path / "h.csv", n_random=None,
        model="smollm2-135m", weights="random", max_batch=2, contexts=(64, 256), output_len=8,
        device="cpu", seed=0, out=tmp_path / "val.csv", replications=2, phase_wave=False,
        log=said.append)
    assert list(table["method"]) == ["vanilla"]
    assert any("skipped, out of GPU memory" in s and "vegas" in s for s in said)


def test_a_request_keeps_its_template_head_and_the_prompts_nearest_its_context() -> None:
    from vegas_sim.validate.results import (
        NEAREST_PROMPTS,
        cut_prompt,
        long_prompts,
        request_prompts,
        template_head,
    )

    head = [1, 2, 3]
    prompts = [head + [10 + n] * n for n in range(2, 80)]  # lengths 5..82, one of each
    assert template_head(prompts) == 3 and template_head(prompts[:1]) == 0
    short = HeldOut("vegas", 3, 0.1, batch=2, context=12, output_len=8, workload="competitive")
    long, note = long_prompts(short, prompts)  # 12..15 are within 25 %: fewer than 8
    assert note == "" and [len(p) for p in long] == list(range(12, 12 + NEAREST_PROMPTS))
    wide = HeldOut("vegas", 3, 0.1, batch=2, context=40, output_len=8, workload="chat")
    assert [len(p) for p in long_prompts(wide, prompts)[0]] == list(range(40, 51))  # <= 50
    end, _ = long_prompts(short, prompts, "end")  # the old protocol: every prompt >= C
    assert [len(p) for p in end] == list(range(12, 83))
    longdoc = HeldOut("vegas", 3, 0.1, batch=2, context=12, output_len=8, workload="longdoc")
    assert len(long_prompts(longdoc, prompts)[0]) == 71  # a book window is one at any cut
    ids = head + [7] * 10 + [8] * 12  # 25 tokens
    assert cut_prompt(ids, 12, keep_end=True, head=3) == head + [8] * 9  # the 7s cut
    assert cut_prompt(ids, 12, keep_end=True) == [8] * 12  # the old cut: no head
    assert cut_prompt(ids, 12, keep_end=False) == ids[:12]
    assert cut_prompt([5, 6], 5, keep_end=True, head=1) == [5, 5, 6, 5, 6]  # repeated first
    assert request_prompts(short, "random", None) == (None, None)


def test_resume_keeps_how_a_row_picked_its_prompts(tmp_path: Path) -> None:
    """A resumed row is scored with its own table's prompt count and cut, not today's."""
    import pandas as pd

    from vegas_sim.validate.heldout import heldout_from_record
    from vegas_sim.validate.run import resumed_passes

    results = Path(__file__).parents[2] / "benchmarks" / "results"
    table = results / "validate_h100_smollm2_workloads_seed20261209.csv"
    rows = pd.read_csv(table).head(2).assign(workload_prompts=[8, float("nan")])
    rows["prompt_cut"] = ["", "nearest"]
    rows.to_csv(tmp_path / "t.csv", index=False)
    configs = [heldout_from_record(r) for r in rows.to_dict(orient="records")]
    done = resumed_passes(tmp_path / "t.csv", configs)
    assert (done[0].workload_prompts, done[0].prompt_cut) == (8, "end")  # before the column
    assert (done[1].workload_prompts, done[1].prompt_cut) == (None, "nearest")
    rows.assign(prompt_cut="middle").to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(UserInputError, match="prompt_cut 'middle' is none of end, nearest"):
        resumed_passes(tmp_path / "bad.csv", configs)


def test_a_run_on_another_gpu_than_the_sets_is_noted() -> None:
    from vegas_sim.validate.predict import load_models, other_gpu_note

    models = load_models(Path("qwen3-8b-h200"), None)
    assert other_gpu_note(models, "NVIDIA H200") is None
    note = other_gpu_note(models, "NVIDIA H100 80GB HBM3")
    assert note is not None and "measured on NVIDIA H200" in note and "--traces" in note


def test_a_run_on_an_unknown_gpu_is_noted_unless_the_set_names_the_same(tmp_path: Path) -> None:
    """Two GPUs without a datasheet entry are told apart by name, not taken as one."""
    from vegas_sim.traces.synthetic import make_synthetic_trace_set
    from vegas_sim.validate.predict import load_models, other_gpu_note

    traces = tmp_path / "traces"
    make_synthetic_trace_set(traces, model="smollm2-135m", gammas=(2, 4), contexts=(64, 256),
                             batches=(1, 2))
    models = load_models(traces, None)
    assert other_gpu_note(models, models.latency.measured_gpu.name) is None
    assert other_gpu_note(models, "AMD Instinct MI300X") is not None
