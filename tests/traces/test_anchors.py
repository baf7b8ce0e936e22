"""The acceptance-anchors format: round trips, packaged sets, and every malformed input refused
with a message naming the file, the anchor (index or line), the field and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vegas_sim.errors import UserInputError
from vegas_sim.traces.anchors import (
    ANCHOR_FORMAT,
    Anchor,
    AnchorSet,
    load_anchors,
    packaged_anchor_sets,
    write_anchors,
)


def _set() -> AnchorSet:
    return AnchorSet(model="m", source="a run, with, commas", anchors=(
        Anchor("vegas", 3, 0.07, (128, 4096), "reasoning", 0.6, 2.7,
               per_position_rates=(0.8, 0.55, 0.35), num_drafts=1000, source="x",
               output_len=19680),
        Anchor("magicdec-stream", 6, None, None, None, None, 4.92),
    ))


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_round_trip(tmp_path: Path, suffix: str) -> None:
    path = write_anchors(_set(), tmp_path / f"a{suffix}")
    back = load_anchors(path)
    assert back.anchors == _set().anchors
    assert (back.model, back.source, back.name()) == ("m", "a run, with, commas", "a")


def test_packaged_qwen3_published() -> None:
    assert "qwen3-8b-published" in packaged_anchor_sets()
    s = load_anchors("qwen3-8b-published")
    assert s.name() == "qwen3-8b-published" and s.model == "qwen3-8b"
    got = {a.method: a.mean_acceptance_length for a in s.anchors}
    assert got == {"magicdec-stream": 4.92, "magicdec-quest": 5.43, "specextend": 5.24,
                   "vegas": 6.24}
    assert all(a.gamma == 6 and a.sparsity == 0.07 and a.workload == "reasoning"
               and a.temperature == 0.6 for a in s.anchors)
    assert "Figure 10a" in s.source
    assert all(a.output_len == 19680 for a in s.anchors)  # whole AIME25 generations


def _json(tmp_path: Path, anchor: dict[str, object], **doc: object) -> Path:
    base: dict[str, object] = {"format": ANCHOR_FORMAT, "version": 1, "model": "m",
                               "source": "s", "anchors": [anchor]}
    base.update(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(base))
    return path


GOOD = {"method": "vegas", "gamma": 4, "sparsity": 0.07, "context": [1, 9],
        "workload": "chat", "temperature": 0.0, "mean_acceptance_length": 3.0}


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"method": "eagle"}, "method", "unknown method"),
    ({"gamma": 0}, "gamma", "integer >= 1"),
    ({"gamma": 2.5}, "gamma", "integer >= 1"),
    ({"sparsity": 1.5}, "sparsity", "(0, 1]"),
    ({"context": [9, 1]}, "context", "lo <= hi"),
    ({"context": 5}, "context", "[lo, hi]"),
    ({"temperature": -1}, "temperature", ">= 0"),
    ({"mean_acceptance_length": 5.5}, "mean_acceptance_length", "[1, gamma + 1]"),
    ({"mean_acceptance_length": 0.5}, "mean_acceptance_length", "bonus token"),
    ({"mean_acceptance_length": None}, "mean_acceptance_length", "missing"),
    ({"per_position_rates": [0.9, 0.5]}, "per_position_rates", "gamma = 4"),
    ({"per_position_rates": [0.5, 0.6, 0.5, 0.4]}, "per_position_rates", "non-increasing"),
    ({"per_position_rates": [0.9, 0.5, 0.3, 0.1]}, "per_position_rates", "must agree"),
    ({"num_drafts": 0}, "num_drafts", ">= 1"),
    ({"output_len": 0}, "output_len", ">= 1"),
    ({"gamme": 4}, "gamme", "unknown field"),
])
def test_bad_json_field(tmp_path: Path, change: dict[str, object], field: str,
                        words: str) -> None:
    path = _json(tmp_path, {**GOOD, **change})
    with pytest.raises(UserInputError) as e:
        load_anchors(path)
    msg = e.value.message()
    assert str(path) in msg and "anchor 0" in msg and repr(field) in msg and words in msg
    assert "fix:" in msg


@pytest.mark.parametrize(("doc", "words"), [
    ({"format": "other"}, "not an acceptance-anchors document"),
    ({"version": 2}, "version 2"),
    ({"anchors": []}, "non-empty list"),
    ({"model": 3}, '"model" must be text'),
])
def test_bad_json_document(tmp_path: Path, doc: dict[str, object], words: str) -> None:
    with pytest.raises(UserInputError, match="fix:") as e:
        load_anchors(_json(tmp_path, GOOD, **doc))
    assert words in e.value.message()


def test_not_json(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text("{oops")
    with pytest.raises(UserInputError, match="not valid JSON"):
        load_anchors(path)


HEADER = ("method,gamma,sparsity,context_lo,context_hi,workload,temperature,"
          "mean_acceptance_length,num_drafts,source,rate_1,rate_2\n")


@pytest.mark.parametrize(("row", "column", "words"), [
    ("vegas,2,0.07,,,chat,0,x,,,,", "mean_acceptance_length", "a number"),
    ("vegas,2,0.07,5,,chat,0,2.0,,,,", "context_hi", "both context_lo and context_hi"),
    ("vegas,,0.07,,,chat,0,2.0,,,,", "gamma", "empty"),
    ("vegas,2,0.07,,,chat,0,2.0,,,0.9,", "rate_1", "rate_1..rate_2"),
    ("vegas,2,0.07,,,chat,0,4.0,,,,", "mean_acceptance_length", "[1, gamma + 1]"),
    ("vegas,2.5,0.07,,,chat,0,2.0,,,,", "gamma", "integer"),
])
def test_bad_csv_row(tmp_path: Path, row: str, column: str, words: str) -> None:
    path = tmp_path / "a.csv"
    path.write_text("# model: m\n" + HEADER + "vegas,2,0.07,,,chat,0,1.5,,,0.3,0.2\n" + row + "\n")
    with pytest.raises(UserInputError) as e:
        load_anchors(path)
    msg = e.value.message()
    assert "line 4" in msg and repr(column) in msg and words in msg, msg


def test_csv_header_and_models(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("method,gamma,mean_acceptance_length,model,source\nvegas,2,2.5,q,s\n")
    s = load_anchors(path)
    assert (s.model, s.source, s.anchors[0].sparsity) == ("q", "s", None)
    path.write_text("method,gamma,mean_acceptance_length,model\nvegas,2,2.5,q\nvegas,3,2.5,r\n")
    with pytest.raises(UserInputError, match="several models"):
        load_anchors(path)
    path.write_text("method,gamma,mean_acceptance_lenght\nvegas,2,2.5\n")
    with pytest.raises(UserInputError, match="no column 'mean_acceptance_length'"):
        load_anchors(path)


def test_names_and_suffixes(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="no packaged acceptance anchors named 'nope'"):
        load_anchors("nope")
    with pytest.raises(UserInputError, match="from its suffix"):
        load_anchors(tmp_path / "a.txt")
    with pytest.raises(UserInputError, match="no anchors file"):
        load_anchors(tmp_path / "missing.json")
    with pytest.raises(UserInputError, match="from its suffix"):
        write_anchors(_set(), tmp_path / "a.txt")


def test_constructor_checks() -> None:
    with pytest.raises(UserInputError, match="anchor field 'gamma'"):
        Anchor("vegas", 0, None, None, None, None, 1.0)


def test_packaged_magicdec_long_context_acceptance() -> None:
    """MagicDec's published Llama-3.1-8B self-speculation acceptance rates (StreamingLLM budget
    512, 4K-100K) as anchors: position i accepted with α^i, mean length 1 + Σ α^i, sparsity the
    512-token budget over the sequence length."""
    s = load_anchors("llama-3.1-8b-magicdec")
    assert s.model == "llama-3.1-8b" and "MagicDec" in s.source
    alpha = {4000: 0.84, 8000: 0.83, 16000: 0.82, 32000: 0.81, 64000: 0.79, 100000: 0.79}
    assert {a.context[0]: a.context[1] for a in s.anchors if a.context} == {c: c for c in alpha}
    for a in s.anchors:
        assert a.context is not None and a.per_position_rates is not None
        c = a.context[0]
        assert a.sparsity == pytest.approx(512 / c)
        assert a.per_position_rates == pytest.approx([alpha[c] ** i for i in range(1, 5)])
        assert a.mean_acceptance_length == pytest.approx((1 - alpha[c] ** 5) / (1 - alpha[c]))
