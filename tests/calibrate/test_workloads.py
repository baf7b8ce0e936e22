"""Workloads: the shipped token files, their provenance, and synthetic prompts."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vegas_sim.calibrate import workloads as WL
from vegas_sim.errors import UserInputError
from vegas_sim.models import get_preset

DATASETS = WL.default_datasets_dir()
needs_datasets = pytest.mark.skipif(not (DATASETS / "gsm8k_test.jsonl").is_file(),
                                    reason="shared/datasets not present")


def test_shipped_smollm2_workloads() -> None:
    path = WL.WORKLOAD_DIR / "smollm2-135m.npz"
    assert path.stat().st_size < 2_000_000
    vocab = get_preset("smollm2-135m").vocab
    for name in WL.WORKLOADS:
        prompts = WL.workload_prompts(name)
        n = {"longdoc": len(WL.LONGDOC_LENGTHS + WL.LONGDOC_ADDED_LENGTHS) * WL.LONGDOC_PER_LENGTH,
             "recall": len(WL.RECALL_LENGTHS) * len(WL.RECALL_DEPTHS) * WL.RECALL_PER_CELL,
             "code-long": len(WL.ADDED_LENGTHS) * WL.ADDED_PER_LENGTH,
             "chat-long": len(WL.ADDED_LENGTHS) * WL.ADDED_PER_LENGTH,
             }.get(name, 32)
        assert len(prompts) == n
        assert len({p.source for p in prompts}) == n  # distinct sources
        for p in prompts:
            assert p.tokens and max(p.tokens) < vocab and min(p.tokens) >= 0
    longdoc = WL.load_workload("longdoc")
    lengths = sorted({len(p) for p in longdoc})
    assert lengths == sorted(WL.LONGDOC_LENGTHS + WL.LONGDOC_ADDED_LENGTHS)
    # the first 32 are the 8-per-length set the first trace sets index, by length
    assert [len(p) for p in longdoc[:32]] == [n for n in WL.LONGDOC_LENGTHS for _ in range(8)]
    assert all(sum(len(p) == n for p in longdoc) == WL.LONGDOC_PER_LENGTH
               for n in WL.LONGDOC_LENGTHS + WL.LONGDOC_ADDED_LENGTHS)
    # the added lengths come after every window of the first ones, whose ids they keep
    first = len(WL.LONGDOC_LENGTHS) * WL.LONGDOC_PER_LENGTH
    assert {len(p) for p in longdoc[first:]} == set(WL.LONGDOC_ADDED_LENGTHS)
    assert max(lengths) + 512 <= get_preset("smollm2-135m").max_positions  # room for output
    assert WL.load_workload("longdoc", max_len=2048) == [p for p in longdoc if len(p) <= 2048]
    sources = {p.source.split(":")[0] for p in WL.workload_prompts("reasoning")}
    assert sources == {"aime24", "aime25", "gsm8k"}


def test_chat_workloads_are_chat_templated(smollm2: Any) -> None:
    _, tok, _ = smollm2
    for name in ("reasoning", "code", "chat"):
        text = tok.decode(WL.load_workload(name)[0])
        assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    doc = tok.decode(WL.load_workload("longdoc")[0])
    assert "<|im_start|>" not in doc and "Project Gutenberg" not in doc


def test_recall_prompts_quote_a_cue_from_far_back() -> None:
    """Each recall prompt: exactly one of RECALL_LENGTHS tokens, ends with a cue copied from
    its window, whose answer (the window tokens after the cue) lies `distance` from the end;
    distances span the window (far at depth 0.1, recent at 0.95)."""
    prompts = WL.workload_prompts("recall")
    depths = len(WL.RECALL_DEPTHS)  # the first round: one prompt per (length, depth) cell
    assert ([len(p.tokens) for p in prompts[:len(WL.RECALL_LENGTHS) * depths]]
            == [n for n in WL.RECALL_LENGTHS for _ in range(depths)])
    for p in prompts:
        assert p.answer_start is not None and p.distance is not None
        cue = p.tokens[-WL.RECALL_CUE:]
        start = p.answer_start - WL.RECALL_CUE
        assert p.tokens[start:p.answer_start] == cue  # the cue is in the window
        assert p.answer_start + WL.RECALL_ANSWER <= len(p.tokens) - WL.RECALL_CUE
        assert f":d{p.distance}" in p.source
    for length in WL.RECALL_LENGTHS:
        d = [p.distance or 0 for p in prompts if len(p.tokens) == length]
        assert max(d) > 0.8 * length and min(d) < 0.15 * length + 150


@needs_datasets
@pytest.mark.skipif(platform.python_version() != WL.CODE_LONG_PYTHON,
                    reason=f"code-long is built from CPython {WL.CODE_LONG_PYTHON}'s library")
@pytest.mark.parametrize("build, name", [(WL.build_workloads, "smollm2-135m.npz"),
                                         (WL.build_long_workloads, "smollm2-135m.long.npz")])
def test_shipped_file_is_what_build_produces(tmp_path: Path, build: Any, name: str) -> None:
    """The committed files are up to date with their builders and the datasets
    (deterministic)."""
    out = build(out_dir=tmp_path)
    with np.load(out) as new, np.load(WL.WORKLOAD_DIR / name) as shipped:
        assert sorted(new.files) == sorted(shipped.files)
        for k in new.files:
            assert np.array_equal(new[k], shipped[k]), k


def test_long_code_and_chat_prompts_have_exact_lengths_in_rounds() -> None:
    """code-long and chat-long: one prompt of each ADDED_LENGTHS length per round, exactly
    that long, distinct sources; competitive mixes both problem sets, each prompt short
    enough to leave room for a long generation."""
    rounds = [n for _ in range(WL.ADDED_PER_LENGTH) for n in WL.ADDED_LENGTHS]
    for name in ("code-long", "chat-long"):
        prompts = WL.workload_prompts(name)
        assert [len(p.tokens) for p in prompts] == rounds
        assert all(f"+{len(p.tokens)}" in p.source for p in prompts)
    competitive = WL.workload_prompts("competitive")
    assert [p.source.split(":")[0] for p in competitive[:4]] == ["codeforces", "codecontests"] * 2
    assert max(len(p.tokens) for p in competitive) <= WL.COMPETITIVE_MAX_TOKENS


def test_long_chat_is_a_chatml_history_ending_on_a_user_turn(smollm2: Any) -> None:
    _, tok, _ = smollm2
    for p in WL.workload_prompts("chat-long")[:5]:
        text = tok.decode(p.tokens)
        assert text.startswith("<|im_start|>system\n")
        assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
        assert text.count("<|im_start|>assistant\n") >= 2  # earlier answers in the history
    code = tok.decode(WL.workload_prompts("code-long")[0].tokens)
    assert "```python\n" in code and "Continue it from exactly where it stops" in code
    assert code.endswith("<|im_start|>assistant\n")


@needs_datasets
def test_book_body_strips_gutenberg_header_and_license() -> None:
    body = WL.book_body(DATASETS / "gutenberg" / "pg11_alice_in_wonderland.txt")
    assert "Alice" in body[:2000]
    assert "*** START" not in body and "*** END" not in body and "\r" not in body
    assert "Project Gutenberg License" not in body


def test_missing_model_and_unknown_workload_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="unknown workload"):
        WL.load_workload("poetry")
    with pytest.raises(UserInputError, match="no workloads built") as e:
        WL.workload_prompts("chat", model="qwen3-8b", directory=tmp_path)
    assert "build_workloads" in str(e.value)


def test_synthetic_prompts_are_seeded_and_in_range() -> None:
    a = WL.synthetic_prompts(4, 100, 50, np.random.default_rng(1))
    b = WL.synthetic_prompts(4, 100, 50, np.random.default_rng(1))
    assert a == b and len(a) == 4 and all(len(p) == 100 for p in a)
    assert min(min(p) for p in a) >= 0 and max(max(p) for p in a) < 50
    assert a != WL.synthetic_prompts(4, 100, 50, np.random.default_rng(2))
    with pytest.raises(UserInputError):
        WL.synthetic_prompts(0, 10, 50, np.random.default_rng(0))


def test_long_windows_are_their_own_file_past_smollm2s_window() -> None:
    """longdoc, recall, code-long and chat-long at LONG_LENGTHS in <model>.long.npz (the
    shipped prompts' order, which trace sets' request ids index, is untouched); recall
    distances span each window; long code runs over whole packages."""
    shipped = WL.workload_prompts("recall")
    for name in ("longdoc", "recall", "code-long", "chat-long"):
        long = WL.workload_prompts(name, long=True)
        assert sorted({len(p.tokens) for p in long}) == list(WL.LONG_LENGTHS)
        assert min(len(p.tokens) for p in long) > 8192
    code = WL.workload_prompts("code-long", long=True)
    assert {p.source.split("/")[1] for p in code} <= set(WL.CODE_LONG_PACKAGES)
    assert all(len(p.tokens) == int(p.source.rsplit("+", 1)[1]) for p in code)
    recall = WL.workload_prompts("recall", long=True)
    assert all(p.distance is not None and 0 < p.distance < len(p.tokens) for p in recall)
    assert max(p.distance or 0 for p in recall) > 0.8 * max(WL.LONG_LENGTHS)
    from vegas_sim.traces.io import load_trace_set

    acc = load_trace_set("smollm2-135m-real").acceptance
    for name in ("recall", *WL.ADDED_WORKLOADS):  # request ids index the shipped prompts
        prompts = shipped if name == "recall" else WL.workload_prompts(name)
        first = acc[(acc["workload"] == name) & (acc["iteration"] == 0)]
        assert len(first) and all(first["context"] == [len(prompts[r].tokens)
                                                       for r in first["request"]])
    assert WL.load_workload("recall", long=True, max_len=16384) == [
        p.tokens for p in recall if len(p.tokens) <= 16384]
