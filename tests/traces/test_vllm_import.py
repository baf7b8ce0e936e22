"""`vegas-sim traces import-vllm`: each vLLM format round-trips to the numbers computed by hand
from the fixture's counts, and every malformed input exits non-zero naming file and line."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.cli.test_examples import help_examples
from vegas_sim import api
from vegas_sim.cli import cli
from vegas_sim.errors import UserInputError
from vegas_sim.traces.anchors import load_anchors
from vegas_sim.traces.io import load_trace_set
from vegas_sim.traces.vllm_import import ImportOptions, detect_format, import_vllm
from vegas_sim.traces.vllm_prometheus import parse_sample

FIX = Path(__file__).parent / "fixtures" / "vllm"
CONFIG = ["--method", "vegas", "--sparsity", "0.07", "--workload", "reasoning",
          "--temperature", "0.6", "--model", "qwen3-8b"]

# The fixtures' counts (tests/traces/fixtures/vllm/), summed by hand.
# metrics_after.txt: engine 0 (1000 drafts, per position 820 680 560 450 360 280) +
# engine 1 (500 drafts, 400 330 270 220 170 130).
AFTER_DRAFTS, AFTER_POS = 1500, (1220, 1010, 830, 670, 530, 410)
# metrics_before.txt: engine 0 (200; 170 140 115 95 75 55), engine 1 (100; 80 66 54 44 34 26).
DIFF_DRAFTS, DIFF_POS = 1200, (970, 804, 661, 531, 421, 329)
ENGINE1_DRAFTS, ENGINE1_POS = 500, (400, 330, 270, 220, 170, 130)
# bench_serve.json: 2000 drafts, γ 4, per position 1500 1100 800 560.
BENCH_DRAFTS, BENCH_POS = 2000, (1500, 1100, 800, 560)
# responses.jsonl, γ 3: per_step_accepted [3,2,0,3,1,3,2,3], [1,0,2,3,3,0], [2,2,3,1]:
# 18 steps; steps accepting position 0: 7+4+4, position 1: 6+3+3, position 2: 4+2+1.
RESP_DRAFTS, RESP_POS = 18, (15, 12, 7)


def run(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["traces", "import-vllm", *map(str, args)])
    return result.exit_code, result.output


def expected(drafts: int, per_pos: tuple[int, ...]) -> tuple[float, list[float]]:
    return 1 + sum(per_pos) / drafts, [n / drafts for n in per_pos]


@pytest.mark.parametrize(("files", "gamma", "drafts", "per_pos"), [
    (["metrics_after.txt"], 6, AFTER_DRAFTS, AFTER_POS),
    (["metrics_before.txt", "metrics_after.txt"], 6, DIFF_DRAFTS, DIFF_POS),
    (["bench_serve.json"], 4, BENCH_DRAFTS, BENCH_POS),
    (["responses.jsonl"], 3, RESP_DRAFTS, RESP_POS),
], ids=["prometheus", "prometheus-difference", "bench", "responses"])
@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_round_trip(files: list[str], gamma: int, drafts: int, per_pos: tuple[int, ...],
                    suffix: str, tmp_path: Path) -> None:
    out = tmp_path / f"anchors{suffix}"
    code, output = run(*(FIX / f for f in files), "--gamma", gamma, *CONFIG,
                       "--context", "1K..32K", "--out", out)
    assert code == 0, output
    anchor_set = load_anchors(out)
    assert anchor_set.model == "qwen3-8b"
    (anchor,) = anchor_set.anchors
    length, rates = expected(drafts, per_pos)
    assert anchor.mean_acceptance_length == pytest.approx(length, rel=1e-12)
    assert list(anchor.per_position_rates or ()) == pytest.approx(rates, rel=1e-12)
    assert anchor.num_drafts == drafts
    assert (anchor.method, anchor.gamma, anchor.sparsity) == ("vegas", gamma, 0.07)
    assert (anchor.context, anchor.workload, anchor.temperature) == ((1024, 32768), "reasoning",
                                                                     0.6)
    assert f"{length:.4f}" in output


def test_formats_are_detected() -> None:
    assert [detect_format(FIX / f) for f in ("metrics_after.txt", "bench_serve.json",
                                             "responses.jsonl")] == [
        "prometheus", "bench", "responses"]


def test_one_engine_is_selected() -> None:
    opts = ImportOptions(method="vegas", gamma=6, engine="1")
    (anchor,) = import_vllm(FIX / "metrics_after.txt", None, opts).anchor_set.anchors
    length, rates = expected(ENGINE1_DRAFTS, ENGINE1_POS)
    assert anchor.mean_acceptance_length == pytest.approx(length)
    assert list(anchor.per_position_rates or ()) == pytest.approx(rates)


def test_counters_without_total_suffix_and_engine_labels(tmp_path: Path) -> None:
    """Exporters that drop `_total` and the engine label: read the same."""
    text = (FIX / "metrics_after.txt").read_text().replace("_total{", "{")
    lines = [line for line in text.splitlines() if 'engine="1"' not in line]
    plain = tmp_path / "plain.txt"
    plain.write_text("\n".join(lines).replace('engine="0",', "") + "\n")
    (anchor,) = import_vllm(plain, None, ImportOptions("vegas", 6)).anchor_set.anchors
    assert anchor.num_drafts == 1000
    assert anchor.mean_acceptance_length == pytest.approx(1 + 3150 / 1000)


def test_label_values_unescape() -> None:
    name, labels, value = parse_sample(r'm{a="x \"q\" \\ \n",b="2"} 3.5 1700000000', "f:1")
    assert (name, labels, value) == ("m", {"a": 'x "q" \\ \n', "b": "2"}, 3.5)


def test_responses_context_comes_from_usage() -> None:
    imported = import_vllm(FIX / "responses.jsonl", None, ImportOptions("vegas", 3))
    # prompts 120, 300, 64 (completions 26, 16, 13): shortest prompt .. longest prompt
    assert imported.anchor_set.anchors[0].context == (64, 300)
    assert len(imported.requests) == 3  # the streaming chunk without metrics is skipped


def test_summary_responses_with_vegas_fork_names(tmp_path: Path) -> None:
    """The fork's num_drafts / num_accepted_tokens, no histogram: a mean length only."""
    path = tmp_path / "fork.jsonl"
    path.write_text('{"metrics": {"speculative_decoding": {"num_drafts": 10, '
                    '"num_draft_tokens": 60, "num_accepted_tokens": 33}}}\n'
                    '{"metrics": {"speculative_decoding": {"num_drafts": 5, '
                    '"num_draft_tokens": 30, "num_accepted_tokens": 12}}}\n')
    imported = import_vllm(path, None, ImportOptions("vegas", 6))
    (anchor,) = imported.anchor_set.anchors
    assert anchor.mean_acceptance_length == pytest.approx(1 + 45 / 15)
    assert anchor.per_position_rates is None
    assert any("per-position" in note for note in imported.notes)


def test_append_adds_and_refuses_a_duplicate(tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    assert run(FIX / "metrics_after.txt", "--gamma", 6, *CONFIG, "--out", out)[0] == 0
    code, output = run(FIX / "bench_serve.json", "--gamma", 4, *CONFIG, "--out", out, "--append")
    assert code == 0, output
    assert [a.gamma for a in load_anchors(out).anchors] == [6, 4]
    code, output = run(FIX / "bench_serve.json", "--gamma", 4, *CONFIG, "--out", out, "--append")
    assert code != 0 and "already this configuration" in output
    assert len(load_anchors(out).anchors) == 2  # the refused append changed nothing


def test_trace_set_from_per_step_accepted(tmp_path: Path) -> None:
    out = tmp_path / "ts"
    code, output = run(FIX / "responses.jsonl", "--gamma", 3, "--method", "vegas",
                       "--sparsity", "0.07", "--temperature", "0", "--model", "qwen3-8b",
                       "--trace-set", out)
    assert code == 0, output
    ts = load_trace_set(out)
    assert ts.has_real_acceptance and len(ts.latency) == 0
    assert ts.meta["imported"]["file"].endswith("responses.jsonl")
    acc = ts.acceptance
    # 18 steps, less request 2's last (drafted 2 < γ 3)
    assert len(acc) == 17 and "1 step(s) left out" in output
    first = acc[acc.request == 0].sort_values("iteration")
    assert first.accepted.tolist() == [3, 2, 0, 3, 1, 3, 2, 3]
    # context: prompt 120, then + accepted + 1 per step
    assert first.context.tolist() == [120, 124, 127, 128, 132, 134, 138, 141]
    assert first.accept_prob.iloc[1].tolist() == [1.0, 1.0, 0.0]
    # the acceptance model reads the set: its rates are the outcomes' (greedy, 1/0)
    assert api.fit_acceptance(ts) is not None


# ----------------------------------------------------------------------------- refusals
BAD = [
    (["metrics_before.txt", "bad_metrics_restart.txt"], 6, "bad_metrics_restart.txt:15",
     "restarted"),
    (["metrics_after.txt", "metrics_before.txt"], 6, "metrics_before.txt:10", "went down"),
    (["bad_metrics_zero_drafts.txt"], 6, "bad_metrics_zero_drafts.txt:9", "num_drafts is 0"),
    (["bad_metrics_increasing.txt"], 6, "bad_metrics_increasing.txt:27", "position 2"),
    (["bad_metrics_unclosed_quote.txt"], 6, "bad_metrics_unclosed_quote.txt:10", "quote"),
    (["metrics_after.txt"], 5, "metrics_after.txt:", "6 draft positions, --gamma is 5"),
    (["bad_bench_no_spec.json"], 4, "bad_bench_no_spec.json:1", "spec_decode_num_drafts"),
    (["bad_bench_accepted_over_gamma.json"], 4, "bad_bench_accepted_over_gamma.json:1",
     "more than --gamma 4"),
    (["bad_bench_truncated.json"], 4, "bad_bench_truncated.json:1", "malformed JSON"),
    (["bench_serve.json"], 6, "bench_serve.json:1", "4 draft positions"),
    (["bad_responses_histogram.jsonl"], 3, "bad_responses_histogram.jsonl:2", "histogram"),
    (["bad_responses_no_metrics.jsonl"], 3, "bad_responses_no_metrics.jsonl:2",
     "--per-request-spec-decode-metrics"),
    (["bad_responses_truncated.jsonl"], 3, "bad_responses_truncated.jsonl:2", "malformed JSON"),
    (["responses.jsonl"], 4, "responses.jsonl:1", "num_spec_tokens = 3"),
]


@pytest.mark.parametrize(("files", "gamma", "where", "why"), BAD,
                         ids=[f"{b[0][-1]}-g{b[1]}" for b in BAD])
def test_bad_input_is_refused_with_file_line_and_fix(files: list[str], gamma: int, where: str,
                                                     why: str, tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    code, output = run(*(FIX / f for f in files), "--gamma", gamma, *CONFIG, "--out", out)
    assert code != 0
    assert where in output and why in output and "fix:" in output, output
    assert not out.exists()


def test_trace_set_needs_detailed_responses(tmp_path: Path) -> None:
    code, output = run(FIX / "bench_serve.json", "--gamma", 4, *CONFIG, "--trace-set",
                       tmp_path / "ts")
    assert code != 0 and "per-request responses" in output and "fix:" in output


def test_several_engines_need_a_known_label() -> None:
    with pytest.raises(UserInputError, match="engine"):
        import_vllm(FIX / "metrics_after.txt", None, ImportOptions("vegas", 6, engine="7"))


def test_the_help_example_runs_on_the_fixtures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                               ) -> None:
    (example,) = [e for e in help_examples() if "import-vllm" in e]
    args = shlex.split(example)[1:]
    args[args.index("--out") + 1] = str(tmp_path / "anchors.json")
    monkeypatch.chdir(FIX)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    (anchor,) = load_anchors(tmp_path / "anchors.json").anchors
    assert anchor.mean_acceptance_length == pytest.approx(expected(DIFF_DRAFTS, DIFF_POS)[0])


# ------------------------------------------------------------------ the edge cases vLLM emits
_RESPONSE = ('{{"id": "resp-{i}", "object": "{obj}", "usage": {usage}, "metrics": '
             '{{"speculative_decoding": {{"num_spec_steps": 8, "num_accepted_draft_tokens": 17, '
             '"num_draft_tokens": 24, "num_spec_tokens": 3, '
             '"per_step_accepted": [3, 2, 0, 3, 1, 3, 2, 3]}}}}}}\n')


def test_responses_api_usage_gives_the_context(tmp_path: Path) -> None:
    """The Responses API reports usage.input_tokens / output_tokens, not prompt_tokens."""
    path = tmp_path / "responses_api.jsonl"
    path.write_text(_RESPONSE.format(i=0, obj="response",
                                     usage='{"input_tokens": 2048, "output_tokens": 26}')
                    + _RESPONSE.format(i=1, obj="response",
                                       usage='{"input_tokens": 512, "output_tokens": 26}'))
    imported = import_vllm(path, None, ImportOptions("vegas", 3))
    assert imported.anchor_set.anchors[0].context == (512, 2048)


def test_a_response_with_null_metrics_is_skipped_and_counted(tmp_path: Path) -> None:
    """vLLM sends "metrics": null for n > 1: that response is skipped with a note, the file
    is not refused."""
    path = tmp_path / "mixed.jsonl"
    path.write_text(_RESPONSE.format(i=0, obj="chat.completion",
                                     usage='{"prompt_tokens": 100, "completion_tokens": 26}')
                    + '{"id": "resp-1", "object": "chat.completion", "metrics": null}\n')
    imported = import_vllm(path, None, ImportOptions("vegas", 3))
    assert len(imported.requests) == 1
    assert any("1 responses skipped" in n and "n > 1" in n for n in imported.notes)
    only_nulls = tmp_path / "nulls.jsonl"
    only_nulls.write_text('{"id": "r", "object": "chat.completion", "metrics": null}\n')
    with pytest.raises(UserInputError, match="1 have"):
        import_vllm(only_nulls, None, ImportOptions("vegas", 3))


@pytest.mark.parametrize(("drafts", "why"), [(-5, "must be a count"), (1e30, "must be a count")])
def test_an_impossible_draft_count_is_refused_for_what_it_is(tmp_path: Path, drafts: float,
                                                             why: str) -> None:
    bench = (FIX / "bench_serve.json").read_text()
    path = tmp_path / "bench.json"
    path.write_text(bench.replace('"spec_decode_num_drafts": 2000',
                                  f'"spec_decode_num_drafts": {drafts}'))
    code, output = run(path, "--gamma", 4, *CONFIG)
    assert code != 0 and why in output and "num_drafts is 0" not in output, output


def test_an_unknown_model_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    config = [*CONFIG[:-1], "nosuchmodel"]
    code, output = run(FIX / "bench_serve.json", "--gamma", 4, *config,
                       "--out", tmp_path / "a.json")
    assert code != 0 and "--model" in output and "qwen3-8b" in output
    assert not (tmp_path / "a.json").exists()


SERIES = {"drafts": 'vllm:spec_decode_num_drafts_total{engine="0",model_name="Qwen/Qwen3-8B"}',
          "accepted": 'vllm:spec_decode_num_accepted_tokens_total{engine="0",'
                      'model_name="Qwen/Qwen3-8B"}',
          "per position": 'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",'
                          'model_name="Qwen/Qwen3-8B",position="0"}',
          "created": 'vllm:spec_decode_num_drafts_created{engine="0",model_name="Qwen/Qwen3-8B"}'}


@pytest.mark.parametrize("value", ["+Inf", "Inf", "-Inf"])
@pytest.mark.parametrize("series", sorted(SERIES))
@pytest.mark.parametrize("dumps", [1, 2])
def test_an_infinite_counter_is_refused_with_its_line(series: str, value: str, dumps: int,
                                                      tmp_path: Path) -> None:
    """Prometheus writes +Inf and -Inf as values; fba85c4 ended in an OverflowError traceback
    (int(inf)) for a counter, and read an infinite _created time as a server restart."""
    lines = (FIX / "metrics_after.txt").read_text().splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith(SERIES[series] + " ")]
    lines[at] = f"{SERIES[series]} {value}"
    path = tmp_path / "metrics.txt"
    path.write_text("\n".join(lines) + "\n")
    files = [FIX / "metrics_before.txt", path][-dumps:]
    code, output = run(*files, "--gamma", 6, *CONFIG, "--out", tmp_path / "a.json")
    assert code == 1 and "Traceback" not in output, output
    assert f"metrics.txt:{at + 1}" in output and "inf" in output and "fix:" in output, output
    assert not (tmp_path / "a.json").exists()
