"""TraceSetWriter: atomic parts, resume after interruption, progress file, finalize."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vegas_sim.errors import TraceSetError
from vegas_sim.methods import PHASES
from vegas_sim.models import get_preset
from vegas_sim.traces import io
from vegas_sim.traces.schema import LATENCY_DEFAULTS
from vegas_sim.traces.synthetic import synthetic_meta


def _meta(**kw: Any) -> dict[str, Any]:
    return synthetic_meta(get_preset("smollm2-135m"), **kw)


def _latency(batch: int, ms: float = 1.0) -> pd.DataFrame:
    return pd.DataFrame({
        "phase": ["decode"], "method": ["vanilla"], "batch": [batch], "context": [1024],
        "n_query": [1], "kv_read": [1025], "collect_rows": [0], "ms_median": [ms],
        "ms_p10": [ms * 0.9], "ms_p90": [ms * 1.1], "n": [10],
    })


def _acceptance(n: int, gamma: int = 3, kind: str = "real") -> pd.DataFrame:
    return pd.DataFrame({
        "method": ["vegas"] * n, "gamma": [gamma] * n, "sparsity": [0.07] * n,
        "budget": [256] * n, "context": [2048] * n, "temperature": [0.0] * n,
        "workload": ["w"] * n, "request": range(n), "iteration": [0] * n,
        "accepted": [1] * n, "accept_prob": [[1.0, 0.0, 1.0]] * n, "model_weights": [kind] * n,
    })


def test_write_finalize_load(tmp_path: Path) -> None:
    w = io.TraceSetWriter(tmp_path / "s", _meta())
    w.append_latency(_latency(1))
    w.append_latency(_latency(2))
    w.append_acceptance(_acceptance(4))
    ts = w.finalize()
    assert ts.latency["batch"].tolist() == [1, 2]
    assert len(ts.acceptance) == 4
    assert ts.meta["content_hash"] == io.content_hash(tmp_path / "s")
    assert io.load_trace_set(tmp_path / "s").latency["batch"].tolist() == [1, 2]


def test_latency_only_set_finalizes_with_empty_acceptance(tmp_path: Path) -> None:
    w = io.TraceSetWriter(tmp_path / "s", _meta(weights_kind="random"))
    w.append_latency(_latency(1))
    ts = w.finalize()
    assert ts.acceptance.empty and ts.weights_kind == "random"


def test_invalid_rows_are_rejected_before_writing(tmp_path: Path) -> None:
    w = io.TraceSetWriter(tmp_path / "s", _meta())
    with pytest.raises(TraceSetError, match="column 'ms_median'.*negative|column 'ms_p10'"):
        w.append_latency(_latency(1, ms=-1.0))
    with pytest.raises(TraceSetError, match="column 'model_weights'"):
        w.append_acceptance(_acceptance(2, kind="random"))  # meta says real
    bad = _acceptance(2).assign(accepted=4)
    with pytest.raises(TraceSetError, match="column 'accepted'"):
        w.append_acceptance(bad)
    assert list((tmp_path / "s" / "parts").iterdir()) == []


def test_bad_meta_is_rejected(tmp_path: Path) -> None:
    meta = _meta()
    del meta["gpu"]
    with pytest.raises(TraceSetError, match="'gpu'"):
        io.TraceSetWriter(tmp_path / "s", meta)


def test_keyed_append_replaces_instead_of_duplicating(tmp_path: Path) -> None:
    w = io.TraceSetWriter(tmp_path / "s", _meta())
    w.append_latency(_latency(1, ms=1.0), key="b=1")
    w.append_latency(_latency(1, ms=2.0), key="b=1")  # the point redone after a crash
    ts = w.finalize()
    assert ts.latency["ms_median"].tolist() == [2.0]


def test_unfinalized_parts_are_refused_with_the_fix(tmp_path: Path) -> None:
    w = io.TraceSetWriter(tmp_path / "s", _meta())
    w.append_latency(_latency(1))
    w.finalize()
    w.append_latency(_latency(2))  # written after the last finalize
    with pytest.raises(TraceSetError) as info:
        io.load_trace_set(tmp_path / "s")
    msg = str(info.value)
    assert "unfinished trace set" in msg and "vegas-sim calibrate" in msg and "vegas-sim traces finalize" in msg
    ts = io.finalize_trace_set(tmp_path / "s")
    assert sorted(ts.latency["batch"].tolist()) == [1, 2]


def test_finalize_is_idempotent(tmp_path: Path) -> None:
    w = io.TraceSetWriter(tmp_path / "s", _meta())
    w.append_latency(_latency(1))
    w.append_acceptance(_acceptance(3))
    first = w.finalize().meta["content_hash"]
    second = io.finalize_trace_set(tmp_path / "s").meta["content_hash"]
    assert first == second


def test_progress_records_status_and_survives_torn_line(tmp_path: Path) -> None:
    w = io.TraceSetWriter(tmp_path / "s", _meta())
    w.mark_done("b=1")
    w.mark_done("b=64", status="oom", detail="CUDA out of memory")
    with open(tmp_path / "s" / io.PROGRESS_FILE, "a") as f:
        f.write('{"key": "b=2", "sta')  # killed mid-write
    w2 = io.TraceSetWriter(tmp_path / "s", _meta())
    assert w2.done_points() == {"b=1", "b=64"}
    assert w2.progress()["b=64"]["status"] == "oom"
    w2.mark_done("b=2")  # must start on a fresh line despite the torn one
    assert io.TraceSetWriter(tmp_path / "s", _meta()).done_points() == {"b=1", "b=2", "b=64"}


def test_resume_with_other_model_or_gpu_is_refused(tmp_path: Path) -> None:
    io.TraceSetWriter(tmp_path / "s", _meta())
    other_model = synthetic_meta(get_preset("qwen3-8b"))
    with pytest.raises(TraceSetError) as info:
        io.TraceSetWriter(tmp_path / "s", other_model)
    assert "meta.json" in str(info.value) and "'model'" in str(info.value)
    other_weights = _meta(weights_kind="random")
    with pytest.raises(TraceSetError, match="'model'"):
        io.TraceSetWriter(tmp_path / "s", other_weights)
    other_gpu = _meta(gpu={"name": "NVIDIA H100", "sm_count": 132, "memory_gb": 80,
                           "copy_bandwidth_gbs": 3000, "bf16_tflops": 700})
    with pytest.raises(TraceSetError, match="'gpu.name'"):
        io.TraceSetWriter(tmp_path / "s", other_gpu)


def test_resume_after_writer_process_is_killed(tmp_path: Path) -> None:
    """A real SIGKILL between parts: completed points survive, the torn one is redone once."""
    out = tmp_path / "s"
    script = textwrap.dedent(f"""
        import os, signal, pandas as pd
        from tests.traces.test_writer import _meta, _latency
        from vegas_sim.traces.io import TraceSetWriter
        w = TraceSetWriter({str(out)!r}, _meta())
        for b in (1, 2, 3):
            w.append_latency(_latency(b), key=f"b={{b}}")
            w.mark_done(f"b={{b}}")
        w.append_latency(_latency(4), key="b=4")  # appended, never marked done
        open(os.path.join({str(out)!r}, "parts", ".latency-x.parquet.tmp-1"), "wb").write(b"xx")
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True,
                          check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()

    w = io.TraceSetWriter(out, _meta())
    assert w.done_points() == {"b=1", "b=2", "b=3"}
    for b in (4, 5):  # the calibrator redoes what is not done
        if f"b={b}" not in w.done_points():
            w.append_latency(_latency(b), key=f"b={b}")
            w.mark_done(f"b={b}")
    ts = w.finalize()
    assert sorted(ts.latency["batch"].tolist()) == [1, 2, 3, 4, 5]  # b=4 exactly once


def test_resume_of_a_set_copied_without_parts_keeps_its_rows(tmp_path: Path) -> None:
    w = io.TraceSetWriter(tmp_path / "s", _meta())
    w.append_latency(_latency(1))
    w.append_acceptance(_acceptance(2))
    w.finalize()
    shutil.rmtree(tmp_path / "s" / "parts")  # as a packaged copy would be
    w2 = io.TraceSetWriter(tmp_path / "s", _meta())
    w2.append_latency(_latency(2))
    ts = w2.finalize()
    assert sorted(ts.latency["batch"].tolist()) == [1, 2]
    assert len(ts.acceptance) == 2


def test_interrupted_finalize_is_detected_and_repaired(tmp_path: Path) -> None:
    w = io.TraceSetWriter(tmp_path / "s", _meta())
    w.append_latency(_latency(1))
    w.finalize()
    meta_before = (tmp_path / "s" / "meta.json").read_text()
    w.append_latency(_latency(2))
    w.finalize()
    # Simulate a crash after the data file was replaced but before meta.json was.
    (tmp_path / "s" / "meta.json").write_text(meta_before)
    with pytest.raises(TraceSetError):
        io.load_trace_set(tmp_path / "s")
    assert sorted(io.finalize_trace_set(tmp_path / "s").latency["batch"].tolist()) == [1, 2]


def test_meta_json_is_written_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = io.TraceSetWriter(tmp_path / "s", _meta())
    w.append_latency(_latency(1))
    w.finalize()
    before = (tmp_path / "s" / "meta.json").read_text()

    def boom(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)  # the os module every writer uses
    with pytest.raises(OSError):
        w.finalize()
    monkeypatch.undo()
    assert (tmp_path / "s" / "meta.json").read_text() == before  # old file intact
    assert not [p for p in os.listdir(tmp_path / "s") if ".tmp-" in p]  # no temp left
    json.loads(before)


def test_accept_prob_float64_lists_are_cast(tmp_path: Path) -> None:
    w = io.TraceSetWriter(tmp_path / "s", _meta())
    df = _acceptance(2)
    df["accept_prob"] = [np.array([0.25, 0.5, 1.0], dtype=np.float64)] * 2
    w.append_acceptance(df)
    ts = w.finalize()
    assert np.allclose(ts.acceptance["accept_prob"].iloc[0], [0.25, 0.5, 1.0])


@st.composite
def _latency_rows(draw: st.DrawFn) -> pd.DataFrame:
    n = draw(st.integers(1, 6))
    ints = st.integers(1, 1 << 20)
    p10 = draw(st.lists(st.floats(1e-3, 1e3), min_size=n, max_size=n))  # no call takes 0 ms
    extra = draw(st.lists(st.floats(0, 1e3), min_size=2 * n, max_size=2 * n))
    median = [a + b for a, b in zip(p10, extra[:n], strict=True)]
    context = draw(st.lists(ints, min_size=n, max_size=n))
    n_query = draw(st.lists(st.integers(1, 16), min_size=n, max_size=n))
    return pd.DataFrame({
        "phase": draw(st.lists(st.sampled_from(PHASES), min_size=n, max_size=n)),
        "method": draw(st.lists(st.sampled_from(io.LATENCY_METHODS), min_size=n, max_size=n)),
        "batch": draw(st.lists(ints, min_size=n, max_size=n)),
        "context": context, "n_query": n_query,
        # a call attends at most its cache plus its query rows
        "kv_read": [draw(st.integers(0, c + q)) for c, q in zip(context, n_query, strict=True)],
        "collect_rows": draw(st.lists(st.integers(0, 16), min_size=n, max_size=n)),
        "ms_median": median, "ms_p10": p10,
        "ms_p90": [m + b for m, b in zip(median, extra[n:], strict=True)],
        "n": draw(st.lists(st.integers(1, 1000), min_size=n, max_size=n)),
    })


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunks=st.lists(_latency_rows(), min_size=1, max_size=4))
def test_any_valid_rows_round_trip(tmp_path: Path, chunks: list[pd.DataFrame]) -> None:
    out = tmp_path / f"s{len(list(tmp_path.iterdir()))}"
    w = io.TraceSetWriter(out, _meta(), durable=False)
    for i, rows in enumerate(chunks):
        w.append_latency(rows, key=f"point-{i}")
    ts = io.load_trace_set(w.finalize().path)
    # rows written without the collective columns read back with them at 0 (one GPU)
    expected = pd.concat(chunks, ignore_index=True).assign(**LATENCY_DEFAULTS)
    pd.testing.assert_frame_equal(ts.latency, expected, check_dtype=False)
