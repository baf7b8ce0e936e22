"""CPU smoke run of benchmarks/kernels.py: the control flow the H200 run depends on.

The kernels are replaced by the torch reference (tiny shapes, device "cpu", timings stubbed;
the radix top-k by torch.topk), so what is tested is the benchmark itself: every step runs, the
Collect-2-Query candidate and B=1 lines are produced, a failing candidate is recorded and the
run goes on, an illegal address at the big cache (the crash once seen on the H200) is
recorded, stops the GPU work, and the CSV and the PASS/FAIL table are still written.
"""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from vegas_sim.kernels import reference
from vegas_sim.kernels import sparse_attention as sa
from vegas_sim.kernels import topk
from vegas_sim.kernels import verify_attention as va

ROOT = Path(__file__).resolve().parents[2]


def load_benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_kernels", ROOT / "benchmarks/kernels.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_kernels"] = mod
    spec.loader.exec_module(mod)
    return mod


def fake_verify(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor,
                scale: float, collect: str = "none", **kw: Any) -> Any:
    B, S = k.shape[0], k.shape[1]
    if (B, S) == (2, 128 + 128) and kw.get("offs64") is not True:  # the failure mode seen on the H200
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    if kw.get("num_stages") == 6 and kw.get("min_m") == 64:
        raise ValueError("out of resources: shared memory")  # a candidate that fails to build
    return reference.verify_attention(q, k, v, lens, scale, collect,
                                      score_format=kw.get("score_format", "bf16"))


def fake_radix_topk(weights: torch.Tensor, k: int, **kw: Any) -> torch.Tensor:
    """torch.topk in radix_topk's contract (int32 indices [..., k]); the kernel itself is
    tested in test_topk.py, and under the interpreter it would be most of this file's time."""
    return torch.topk(weights, k, dim=-1, sorted=False).indices.to(torch.int32)


def fake_sparse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor,
                n: torch.Tensor, tail: torch.Tensor, lens: torch.Tensor, scale: float,
                **kw: Any) -> torch.Tensor:
    return reference.sparse_draft_attention(q, k, v, idx, n, tail, lens, scale)


@pytest.fixture
def bk(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    mod = load_benchmark()
    for name, value in [("DEV", "cpu"), ("BATCHES", [1, 2]), ("CONTEXTS_QUICK", [64, 128]),
                        ("LONG_C", 64), ("SELECT_SHAPE", (2, 64, 8)), ("B1_CONTEXT", 64),
                        ("C2Q_SHAPES", [(2, 64, 8), (1, 64, 8)]),
                        ("OSS_SHAPES", [(1, 64, 12)]), ("QUEST_SHAPES", [(2, 320)])]:
        monkeypatch.setattr(mod, name, value)
    monkeypatch.setattr(mod, "big_cache", lambda B, C: (B, C) == (2, 128))
    monkeypatch.setattr(mod, "copy_bandwidth", lambda: 1000.0)
    monkeypatch.setattr(mod, "bench", lambda fn, graph=True: (fn(), 0.01)[1])
    monkeypatch.setattr(mod, "qwen3_8b_gemm_ms", lambda tokens: 1.0)
    monkeypatch.setattr(va, "verify_attention", fake_verify)
    monkeypatch.setattr(sa, "sparse_draft_attention", fake_sparse)
    monkeypatch.setattr(topk, "radix_topk", fake_radix_topk)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "cpu stub")
    monkeypatch.delenv("VEGAS_SIM_KERNELS", raising=False)
    return mod


def test_quick_run_records_failures_and_reports(bk: ModuleType, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "k.csv"
    # a step budget no slow machine reaches: which steps run must not depend on the wall clock
    assert bk.main(["--quick", "--out", str(out), "--step-budget-s", "1e9"]) == 0
    rows = list(csv.DictReader(out.open()))
    kinds = [r["kind"] for r in rows]
    text = capsys.readouterr().out
    # every step before the big cache ran
    for kind in ("copy", "quest", "c2q", "b1", "verify", "sparse", "select", "oss"):
        assert kind in kinds, kind
    oss = [r for r in rows if r["kind"] == "oss"]  # gpt-oss-20b's shape, beside the paper
    assert [r["collect"] for r in oss] == ["first_last", "all"]
    assert all(r["config"] == "Hq64 Hkv8 D64" and "paper" in r["note"] for r in oss)
    assert bk.HQ == 32 and bk.D == 128  # the Qwen3-8B shape is restored after the step
    # one line per Collect-2-Query candidate and shape, the failing one recorded instead
    c2q = [r for r in rows if r["kind"] == "c2q"]
    assert len(c2q) == 2 * (len(bk.C2Q_NONE_CANDIDATES) + len(bk.C2Q_CANDIDATES) - 1)
    assert any(r["config"] == "rows m64 (default)" for r in c2q)
    # every score format beside the plain call at every c2q shape, each against the target
    fmt = [r for r in rows if r["kind"] == "c2q_format"]
    assert sorted((r["batch"], r["context"], r["config"]) for r in fmt) == sorted(
        (str(b), str(c), f) for b, c, _n in bk.C2Q_SHAPES for f in bk.C2Q_FORMATS)
    assert "Collect-2-Query by score format" in text
    assert "| Collect-2-Query, fp8 scores, c2q shapes (max) |" in text
    assert any(r["kind"] == "select" and r["note"] == "score_weights_36_layers_one_launch_fp8"
               for r in rows)
    # the score bytes' floor beside every verify shape measured (a plain fill)
    floor = [r for r in rows if r["kind"] == "c2q_floor"]
    verify_shapes = {(r["batch"], r["context"], r["n_query"]) for r in rows
                     if r["kind"] == "verify" and r["ms"]}
    assert {(r["batch"], r["context"], r["n_query"]) for r in floor} == verify_shapes
    assert all(bk.C2Q_FLOOR in r["note"] for r in floor)
    assert "| Collect-2-Query floor:" in text
    errors = [r for r in rows if r["kind"] == "error"]
    assert sum("rows m64 st6" in r["note"] for r in errors) == 2
    # Quest against Stream: both draft steps and the target's ratio, in the table
    quest = [r for r in rows if r["kind"] == "quest"]
    assert {"quest draft step (gemm + 36 layers)", "stream draft step (gemm + 36 layers)"} <= {
        r["note"] for r in quest}
    assert any(r["note"].startswith(bk.QUEST_RATIO) for r in quest)
    assert "| Quest draft step:" in text and "Quest vs Stream draft step" in text
    # the old one-program search pick beside the default (radix), with its own ratio
    old = [r for r in rows if r["kind"] == "quest_variant" and r["config"] == "pick search"]
    assert any(r["note"].startswith(bk.QUEST_RATIO) for r in old)
    assert any(r["context"] == "64" and r["note"].startswith("launch") for r in old)
    assert f"{bk.QUEST_RATIO} (target <= 1.3): default " in text and ", search " in text
    variants = {r["config"] for r in rows if r["kind"] == "quest_variant"}
    assert {"radix pick alone (+ zeroing its levels)", "radix chunk 128",
            "attention alone over quest's list"} <= variants
    # the big cache: recorded, context declared lost, nothing measured there, report written
    assert any(r["batch"] == "2" and r["context"] == "128" and "illegal" in r["note"]
               for r in errors)
    assert any("CUDA context lost" in r["note"] for r in errors)
    assert not [r for r in rows if r["kind"] in ("verify", "sparse") and r["context"] == "128"
                and r["batch"] == "2" and r["ms"]]
    assert "Collect-2-Query candidates" in text and "B=1 C=64 verify (none)" in text
    assert "| no failed shape (kind=error rows) |" in text
    assert "shape(s) failed) |" in text  # the verify target names the failure ...
    verify_line = next(line for line in text.splitlines()
                       if line.startswith("| verify attention / copy BW"))
    assert verify_line.rstrip().endswith("FAIL |")  # ... and cannot PASS with it


def test_step_budget_skips_and_records(bk: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "k.csv"
    assert bk.main(["--quick", "--out", str(out), "--step-budget-s", "-1"]) == 0
    rows = list(csv.DictReader(out.open()))
    assert rows[0]["kind"] == "copy"
    skipped = [r["note"] for r in rows if r["kind"] == "error"]
    assert len(skipped) == 10 and all("not started" in n for n in skipped)


def test_probe_runs_last_and_records_the_int32_crash(bk: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "k.csv"
    assert bk.main(["--quick", "--out", str(out), "--only", "probe"]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["kind"] for r in rows] == ["copy", "probe", "error", "error"]
    assert "int64 tile offsets" in rows[1]["note"]
    assert "probe int32 tile offsets FAILED" in rows[2]["note"] and "illegal" in rows[2]["note"]
    assert "CUDA context lost in step probe" in rows[3]["note"]


def test_selection_share_is_of_the_whole_iteration(bk: ModuleType, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """DESIGN.md's iteration is γ draft steps + the verify pass: the target's share divides by
    that, and the verify-pass share is reported beside it."""
    out = tmp_path / "k.csv"
    assert bk.main(["--quick", "--out", str(out), "--only", "select"]) == 0
    rows = [r for r in csv.DictReader(out.open()) if r["kind"] == "select"]

    def ms(prefix: str) -> float:
        return float(next(r["ms"] for r in rows if r["note"].startswith(prefix)))

    verify_pass = ms("verify_attention_c2q_x36") + ms("gemm_measured")
    draft_step = ms("draft_step")
    assert draft_step == pytest.approx(ms("draft_gemm_measured")
                                       + ms("sparse_draft_attention_x36"))
    gamma = bk.SELECT_SHAPE[2] - 1
    share = next(r for r in rows if r["note"].startswith(bk.SHARE_OF_ITERATION))
    share_verify = next(r for r in rows if r["note"].startswith(bk.SHARE_OF_VERIFY))
    sel = float(share["ms"])
    assert float(share["overhead_pct"]) == pytest.approx(
        100 * sel / (verify_pass + gamma * draft_step), rel=1e-4)
    assert float(share_verify["overhead_pct"]) == pytest.approx(100 * sel / verify_pass,
                                                                rel=1e-4)
    table = next(line for line in capsys.readouterr().out.splitlines()
                 if line.startswith("| Vegas selection share of an iteration"))
    assert f"{float(share['overhead_pct']):.1f} %" in table
    assert f"verify pass alone: {float(share_verify['overhead_pct']):.1f} %" in table


def test_fixed_cost_fit_recovers_the_line_it_was_given(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """Rows made as t = 9 µs + bytes / 4.5 TB/s give back BW 4500 GB/s and F 9.0 µs, and the
    F that 0.85 of a 4000 GB/s copy allows at B=1, C=32K."""
    bk = load_benchmark()
    rows = [bk.row("verify", batch=1, context=c, n_query=8, collect="none",
                   ms=(9.0 + bk.kv_bytes(1, c) / 4500.0 / 1e3) / 1e3) for c in (32768, 131072)]
    bk.fixed_cost_fit(rows, 4000.0)
    out = capsys.readouterr().out
    allowed = bk.kv_bytes(1, 32768) / 1e3 * (1 / (0.85 * 4000.0) - 1 / 4500.0)
    assert "NQ= 8: BW   4500 GB/s (1.12 of copy), F   9.0 us" in out, out
    assert f"allowed {allowed:4.1f} us" in out, out


def test_summary_of_the_committed_table_needs_no_gpu(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    """--summary reprints a saved run's summary on the CPU: the committed H200 table's targets
    and the B=1 fit, read back with its numbers as numbers."""
    bk = load_benchmark()
    csv_path = ROOT / "benchmarks/results/kernels_h200.csv"
    rows = bk.read_csv(csv_path)
    assert isinstance(rows[1]["ms"], float) and isinstance(rows[1]["batch"], int)
    assert bk.main(["--summary", str(csv_path)]) == 0
    out = capsys.readouterr().out
    assert "| target | measured | goal | verdict |" in out
    assert "verify, B=1: t = F + bytes / BW" in out
    assert out.count(" GB/s (") == 3  # NQ 1, 8, 16


def test_sampling_benchmark_times_both_layouts(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/sampling.py on the CPU with a stand-in timer: both layouts of both phases run
    and their ratio is printed; without a GPU its main refuses with a clear message."""
    spec = importlib.util.spec_from_file_location("bench_sampling",
                                                  ROOT / "benchmarks/sampling.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    calls: list[Any] = []

    def timer(fn: Any) -> float:  # each layout from the same uniforms
        torch.manual_seed(0)
        calls.append(fn())
        return 1.0 + len(calls)

    monkeypatch.setattr(mod, "median_ms", timer)
    rows = mod.measure(300, 3, 2, device="cpu")
    assert [r["phase"] for r in rows] == ["draft step", "acceptance"] and len(calls) == 4
    assert rows[0]["dense_over_slots"] == round(3.0 / 2.0, 2)
    assert torch.equal(calls[0], calls[1])  # same tokens from either layout
    assert "dense/slots 1.50" in capsys.readouterr().out
    if not torch.cuda.is_available():
        assert mod.main(["--out", "/nonexistent/x.csv"]) == 2
