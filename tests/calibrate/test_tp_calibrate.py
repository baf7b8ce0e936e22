"""`calibrate --tp N` (calibrate/tp_run.py) on the CPU over gloo: the set it writes says N and
the interconnect and its latency rows carry each phase's collectives; `traces check` accepts
it and predict uses it at N only; a size the model or the machine cannot take is refused
before anything starts; an error on a rank is raised once, and no rank outlives the command,
also when it is interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import torch.distributed as dist
from click.testing import CliRunner

from vegas_sim.calibrate import tp_run
from vegas_sim.calibrate.loading import save_hf_dir
from vegas_sim.calibrate.timers import PhaseTimer
from vegas_sim.cli import cli
from vegas_sim.errors import UserInputError

from .conftest import tiny_model

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-c", "from vegas_sim.cli import main; main()"]
GRID = ["--weights", "random", "--device", "cpu", "--quick", "--methods", "vanilla,vegas",
        "--gamma", "3", "--sparsity", "0.1", "--n-query", "4", "--min-tokens", "16"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama checkpoint (4 query heads over 2 KV heads) as a Hugging Face directory."""
    return save_hf_dir(tiny_model("llama", max_positions=4096),
                       tmp_path_factory.mktemp("tiny") / "model")


def _calibrate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "calibrate", *args],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_tp2_set_records_the_group_and_each_phases_collectives(tiny_dir: Path,
                                                              tmp_path: Path) -> None:
    out = tmp_path / "tp2"
    run = _calibrate("--model", str(tiny_dir), "--tp", "2", *GRID, "--batch", "1,2",
                     "--context", "128", "--out", str(out))
    assert run.returncode == 0, run.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["tensor_parallel"] == {"size": 2, "backend": "gloo",
                                       "interconnect": "gloo/loopback"}
    assert meta["model"]["n_heads"] == 4  # the whole model, not the shard
    lat = pd.read_parquet(out / "latency.parquet")
    forward = lat[lat["phase"].isin(["decode", "draft_step", "verify"])]
    # a forward: an all-reduce per layer's attention and MLP and one of the embedding (2L + 1
    # = 5), and the logits' gather; its bytes grow with the rows
    assert (forward["collective_calls"] == 6).all()
    decode = lat[lat["phase"] == "decode"].set_index("batch")["collective_bytes"]
    assert decode[2] == 2 * decode[1]
    assert (lat.loc[lat["phase"] == "select", "collective_calls"] == 1).all()
    none = lat[lat["phase"].isin(["sample", "other"])]
    assert (none["collective_calls"] == 0).all() and (none["collective_ms"] == 0).all()
    assert ((lat["collective_ms"] >= 0) & (lat["collective_ms"] < lat["ms_median"])).all()
    assert len(json.loads((out / "run_log.json").read_text())["sessions"]) == 1  # rank 0's

    check = CliRunner().invoke(cli, ["traces", "check", str(out)])
    assert check.exit_code == 0 and "tensor parallel 2" in check.output, check.output
    show = CliRunner().invoke(cli, ["traces", "show", str(out)])
    assert "tensor parallel 2 (gloo, gloo/loopback)" in show.output, show.output

    predict = ["predict", "--traces", str(out), "--acceptance-traces", "smollm2-135m-real",
               "--gamma", "3", "--batch", "2", "--context", "100", "--output-len", "16"]
    at_one = CliRunner().invoke(cli, predict)
    assert at_one.exit_code != 0 and "measured at tensor-parallel size 2" in at_one.output
    at_two = CliRunner().invoke(cli, [*predict, "--tp", "2"])
    assert at_two.exit_code == 0, at_two.output
    assert "tensor parallel 2: measured" in at_two.output and "NOT measured" not in " ".join(
        line for line in at_two.output.splitlines() if "tensor parallel" in line)

    # validate --tp 2 decodes on the sharded model and predicts from the set as measured
    heldout = tmp_path / "heldout.csv"
    heldout.write_text("method,gamma,sparsity,batch,context,output_len,workload,temperature,"
                       "waves\nvegas,3,0.1,3,100,6,,,1\n")
    table = tmp_path / "val.csv"
    run = subprocess.run([*CLI, "validate", "--traces", str(out), "--acceptance-traces",
                          "smollm2-135m-real", "--model", str(tiny_dir), "--weights", "random",
                          "--device", "cpu", "--tp", "2", "--heldout", str(heldout),
                          "--replications", "1", "--no-phase-wave", "--out", str(table)],
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "tensor parallel 2: measured" in run.stderr
    assert len(pd.read_csv(table)) == 1


def test_a_size_the_heads_do_not_divide_is_refused_before_anything_starts(
        tiny_dir: Path, tmp_path: Path) -> None:
    run = CliRunner().invoke(cli, ["calibrate", "--model", str(tiny_dir), "--tp", "3", *GRID,
                                   "--out", str(tmp_path / "x")])
    assert run.exit_code != 0
    assert "--tp" in run.output and "cannot be split 3 ways" in run.output
    assert not (tmp_path / "x").exists()
    preset = CliRunner().invoke(cli, ["calibrate", "--model", "qwen3-8b", "--tp", "3",
                                      "--quick", "--out", str(tmp_path / "y")])
    assert preset.exit_code != 0 and "cannot be split 3 ways" in preset.output


def test_more_gpus_than_visible_are_refused(tiny_dir: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    run = CliRunner().invoke(cli, ["calibrate", "--model", str(tiny_dir), "--tp", "2",
                                   "--device", "cuda", "--out", str(tmp_path / "x")])
    assert run.exit_code != 0 and "--tp 2 needs 2 GPUs, 0 visible" in run.output, run.output
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    with pytest.raises(UserInputError, match="needs 4 GPUs, 1 visible"):
        tp_run.check_group(str(tiny_dir), "cuda", 4)


def _ranks(parent: psutil.Process) -> list[psutil.Process]:
    """The rank processes under `parent` still running (multiprocessing's spawned children;
    its resource tracker, which lives as long as the parent, is not one)."""
    out = []
    for child in parent.children(recursive=True):
        try:
            if "spawn_main" in " ".join(child.cmdline()) and \
                    child.status() != psutil.STATUS_ZOMBIE:
                out.append(child)
        except psutil.NoSuchProcess:
            continue
    return out


def _fail_on_rank_one(group: tp_run.RankGroup) -> None:
    if group.rank == 1:
        raise UserInputError("rank one cannot go on", where="--somewhere", fix="do not")
    dist.barrier()  # rank 0 waits for a rank that never comes


@pytest.mark.slow
def test_an_error_on_one_rank_stops_every_rank_and_is_raised_once() -> None:
    with pytest.raises(UserInputError) as err:
        tp_run.run_ranks(2, "cpu", _fail_on_rank_one, ())
    assert str(err.value).count("cannot go on") == 1 and "rank 1" in str(err.value)
    assert not _ranks(psutil.Process())


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_an_interrupt_leaves_no_rank_running(tiny_dir: Path, tmp_path: Path, how: str) -> None:
    """Ctrl-C (SIGINT to the terminal's process group) or SIGTERM to the command alone."""
    cmd = [*CLI, "calibrate", "--model", str(tiny_dir),
           "--tp", "2", *GRID, "--batch", "1..64:x2", "--context", "128,256,512,1024",
           "--out", str(tmp_path / "cut")]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 120
    ranks: list[psutil.Process] = []
    while time.monotonic() < deadline and proc.poll() is None:
        ranks = _ranks(parent)
        if len(ranks) >= 2 and (tmp_path / "cut" / "meta.json").exists():
            break
        time.sleep(0.5)
    assert len(ranks) >= 2, "the ranks never started"
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "run the same command again to resume" in stderr, stderr
    gone, alive = psutil.wait_procs(ranks, timeout=5)
    assert not alive, f"ranks outlived the command: {[p.pid for p in alive]}"


def test_a_row_s_collective_time_is_the_difference_of_the_two_passes() -> None:
    def row(phase: str, ms: float, calls: int) -> dict[str, object]:
        return {"phase": phase, "method": "vanilla", "batch": 1, "context": 8, "n_query": 1,
                "kv_read": 9, "collect_rows": 0, "ms_median": ms, "collective_calls": calls,
                "collective_bytes": 4 * calls, "collective_ms": 0.0}

    rows = [row("decode", 5.0, 6), row("sample", 1.0, 0), row("decode", 2.0, 6)]
    bare = [row("decode", 3.5, 0), row("sample", 0.5, 0), row("decode", 2.5, 0)]
    got = tp_run.with_collective_time(rows, bare)
    # 1.5 ms more with the collectives; none issued: 0; cheaper than the noise: 0
    assert [r["collective_ms"] for r in got] == [1.5, 0.0, 0.0]
    with pytest.raises(RuntimeError, match="other rows"):
        tp_run.with_collective_time(rows, bare[1:] + bare[:1])


def test_the_phase_timer_counts_each_phase_s_own_collectives() -> None:
    issued = [0, 0]
    timer = PhaseTimer("cpu", counter=lambda: (issued[0], issued[1]))

    def collective(nbytes: int) -> None:
        issued[0] += 1
        issued[1] += nbytes

    with timer.phase("draft_step"):
        collective(100)
        with timer.phase("quest_meta"):
            collective(7)
        with timer.phase("quest_meta"):
            collective(3)
        collective(10)
    with timer.phase("sample"):
        pass
    assert timer.collective_samples() == [("draft_step", 2, 110), ("quest_meta", 2, 10),
                                          ("sample", 0, 0)]
    assert [n for n, _ in timer.samples()] == [n for n, _, _ in timer.collective_samples()]


TOPO = """\
\tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV18\tSYS\tPXB\t0-55\t0\t\tN/A
GPU1\tNV18\t X \tPIX\tSYS\t0-55\t0\t\tN/A
GPU2\tSYS\tPIX\t X \tSYS\t56-111\t1\t\tN/A

Legend:
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def test_the_interconnect_is_read_from_nvidia_smi_topo() -> None:
    assert tp_run.topo_link(TOPO, 0, 1) == "NV18"
    assert tp_run.topo_link(TOPO, 1, 2) == "PIX" and tp_run.topo_link(TOPO, 2, 0) == "SYS"
    assert tp_run.topo_link(TOPO, 0, 5) is None and tp_run.topo_link("no GPUs", 0, 1) is None
    assert tp_run.interconnect("cpu", 2) == "gloo/loopback"


def test_the_tp_heldout_set_is_its_seeds_draw_off_the_tp_grid() -> None:
    """benchmarks/validation/heldout_qwen3_8b_tp.csv: >= 12 rows for `validate --tp N`."""
    import importlib.util

    import numpy as np

    from vegas_sim.validate.heldout import check_outside_grid, read_heldout

    root = ROOT / "benchmarks" / "validation"
    spec = importlib.util.spec_from_file_location("make_heldout", root / "make_heldout.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = read_heldout(root / "heldout_qwen3_8b_tp.csv")
    assert len(rows) >= 12 and {h.method for h in rows} == set(mod.METHODS)
    assert rows == mod.draw("qwen3_8b_tp", np.random.default_rng([mod.SEED, 4]))
    check_outside_grid(rows, mod.GRIDS["qwen3_8b_tp"])
    assert all(mod.feasible("qwen3_8b_tp", h.batch, h.context) for h in rows)
