"""`run_calibration(plan, out_dir)`: the whole calibration, resumable and OOM-tolerant.

Each grid point is appended atomically by `TraceSetWriter` under its key and marked done, so a
run interrupted at any moment resumes where it stopped (done keys are skipped). A point that
cannot fit (estimate from `hardware.fits_in_memory`) is marked ``skip``; a point that runs out
of memory anyway is marked ``oom`` after freeing the allocator's cache, and the run continues.
`run_log.json` (beside the data) keeps per-session wall/GPU seconds, the points skipped or OOM,
the per-step CPU overhead (eager vs CUDA-graph decode step) and the mean acceptance lengths
per workload.

Each packaged set's GPU time is in docs/RESULTS.md (Calibration), with the command that
measured it; the acceptance grid runs as parallel processes, each method's sparsities
batched. The radix top-k compiles once for all contexts.
Every draft, verify and decode step is a CUDA graph replay (specdec.SpecDecoder); Quest's page
scoring, which runs inside the graphed draft step, is timed alone (`quest_scoring_ms`) and moved
from draft_step to quest_meta. Each timed repetition is also timed on the wall clock: the
device's idle time (host work after a sync) is charged to `sample` (`with_host_gap`); draft
steps are timed `DRAFT_GAMMA` to a repetition, so the host's launch work overlaps the GPU's as
in the decode loop and a host-bound step's event time is the host's.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vegas_sim.calibrate import hardware, tp_run
from vegas_sim.calibrate.loading import load_model
from vegas_sim.calibrate.measure_acceptance import (
    acceptance_groups,
    acceptance_prompts,
    measure_acceptance_group,
)
from vegas_sim.calibrate.measure_latency import (
    free_device_memory,
    latency_frame,
    measure_latency_point,
    measure_step_overhead,
    model_dtype_bytes,
    oom_types,
    plan_dtype,
)
from vegas_sim.calibrate.plan import (
    DRAFT_GAMMA,
    DRAFT_PATHS,
    AcceptancePoint,
    CalibrationPlan,
    LatencyPoint,
    acceptance_points,
    effective_context,
    latency_points,
    latency_temperature,
    log,
)
from vegas_sim.calibrate.specdec import graphs_default, state_headroom
from vegas_sim.calibrate.tp_run import RankGroup
from vegas_sim.errors import UserInputError
from vegas_sim.files import nearest_existing, write_json
from vegas_sim.models import ModelSpec
from vegas_sim.progress import LabelledProgress, Say
from vegas_sim.traces.io import TraceSetWriter, acceptance_summary
from vegas_sim.traces.schema import (
    RUN_LOG_FILE,
    SCHEMA_VERSION,
)


# ============================================================================ meta / run log
def build_meta(plan: CalibrationPlan, spec: ModelSpec, weights_meta: dict[str, Any],
               gpu: dict[str, Any]) -> dict[str, Any]:
    """meta.json of the trace set (content_hash is added by finalize)."""
    real = plan.weights == "real"
    group = {"tensor_parallel": tp_run.tensor_parallel_meta(plan)} if plan.tensor_parallel > 1 \
        else {}
    return {
        **group,
        "schema_version": SCHEMA_VERSION,
        "model": {**spec.to_dict(), "weights": dict(weights_meta)},
        "gpu": gpu,
        "software": hardware.software_versions(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "grid": grid_meta(plan),
        "workload": list(plan.workloads) if real else [],
        "seeds": {"calibration": plan.seed, "weights": plan.seed},
        "source": plan.model,
    }


def grid_meta(plan: CalibrationPlan) -> dict[str, Any]:
    """meta.json's `grid`: what was asked for and how it was measured (the plan alone)."""
    real = plan.weights == "real"
    return {
        **{k: v for k, v in plan.to_dict().items()
           if k not in ("model", "device", "tensor_parallel")},  # meta's tensor_parallel
        "verify_n_query": plan.verify_n_query(),
        "reference_sparsity": plan.ref_sparsity,
        "latency_temperature": latency_temperature(plan),
        "draft_gamma": DRAFT_GAMMA,
        "draft_paths": {k: list(v) for k, v in DRAFT_PATHS.items()},
        # Draft, verify and decode steps replayed as CUDA graphs (specdec.SpecDecoder).
        "cuda_graphs": graphs_default(torch.device(plan.device)),
        # Host gaps from the walls of the timed chains (older sets may say "untimed").
        "host_gap_walls": "timed",
        "acceptance": (
            f"real weights: gamma {max(plan.gamma)}, {plan.iterations} iterations per request"
            if real and plan.acceptance else
            "none: a random-weight model's acceptance is meaningless (latency only)"
            if not real else "not requested"),
    }


def check_resumable(out: Path, plan: CalibrationPlan) -> None:
    """Before any model is loaded: `out` must be a directory that can be made, and a trace set
    already there must have been started with this model and this grid, since resuming
    measures only the points it lacks and keeps its first meta.json (a changed grid would
    silently measure nothing new, or mix two grids under the old description)."""
    if out.exists() and not out.is_dir():
        raise UserInputError(f"{str(out)!r} exists and is not a directory", where="--out",
                             fix="name a new directory for the trace set")
    base = nearest_existing(out)
    if not base.is_dir() or not os.access(base, os.W_OK):
        raise UserInputError(f"cannot create the directory {str(out)!r} in {str(base)!r}",
                             where="--out", fix="name a directory in a writable place")
    meta_file = out / "meta.json"
    if not meta_file.is_file():
        return
    try:
        old = json.loads(meta_file.read_text())
    except (OSError, ValueError):
        return  # the writer reports a broken meta.json with its own message
    if old.get("source") not in (None, plan.model):
        raise UserInputError(
            f"{out} holds a calibration of {old.get('source')!r}, this run is of {plan.model!r}",
            where="--out", fix="write to a new --out, or resume with the same --model")
    old_tp = (old.get("tensor_parallel") or {}).get("size", 1)
    if old_tp != plan.tensor_parallel:
        raise UserInputError(
            f"{out} was measured at tensor-parallel size {old_tp}, this run is at "
            f"{plan.tensor_parallel}", where="--out",
            fix=f"resume with --tp {old_tp}, or write to a new --out")
    before, now = old.get("grid", {}), json.loads(json.dumps(grid_meta(plan)))
    changed = [k for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)]
    if changed:
        shown = "; ".join(f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in changed[:4])
        raise UserInputError(
            f"{out} was started with another grid, and resuming measures only the points it "
            f"lacks ({shown}{'; ...' if len(changed) > 4 else ''})", where="--out",
            fix="re-run the command that started it to resume, or write the new grid to a new "
                "--out and combine the two with `vegas-sim traces merge`")


def _read_run_log(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, json.JSONDecodeError):
        return {}


@dataclass
class Session:
    """One invocation of run_calibration (a resumed calibration has several)."""

    started: float = field(default_factory=time.time)
    points: list[dict[str, Any]] = field(default_factory=list)
    step_overhead: dict[str, Any] | None = None
    outcome: str = "running"

    def to_dict(self, device: str) -> dict[str, Any]:
        wall = time.time() - self.started
        return {
            "started": dt.datetime.fromtimestamp(self.started, dt.timezone.utc).isoformat(),
            "wall_s": wall, "device": device, "outcome": self.outcome,
            "measured_s": sum(p["seconds"] for p in self.points),
            "points": self.points, "step_overhead": self.step_overhead,
        }


def write_run_log(out: Path, session: Session, device: str,
                  summary: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Append/replace this session in run_log.json; totals over all sessions."""
    path = out / RUN_LOG_FILE
    data = _read_run_log(path)
    sessions = [s for s in data.get("sessions", []) if s.get("started") != session.to_dict(
        device)["started"]]
    sessions.append(session.to_dict(device))
    data["sessions"] = sessions
    data["total_gpu_seconds"] = sum(float(s.get("wall_s", 0.0)) for s in sessions)
    data["total_gpu_minutes"] = data["total_gpu_seconds"] / 60.0
    overheads = [s["step_overhead"] for s in sessions if s.get("step_overhead")]
    if overheads:
        data["step_overhead"] = overheads[-1]
    if summary is not None:
        data["acceptance_summary"] = summary
    write_json(path, data)
    return data


# ============================================================================ the runner
MIN_CAPABILITY = (8, 0)  # bf16 tensor cores (Ampere): the kernels' tl.dot on bf16 tiles


def check_device(device: str) -> torch.device:
    """The --device a GPU command runs on, or a UserInputError saying why it cannot."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UserInputError(f"unknown device {device!r}", where="--device",
                             fix="use cuda, cuda:N or cpu") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserInputError("CUDA is not available here", where="--device",
                             fix="run on a GPU machine, or use --device cpu (slow)")
    if dev.type not in ("cuda", "cpu"):
        raise UserInputError(f"unsupported device {device!r}", where="--device",
                             fix="use cuda or cpu")
    capability = torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None
    if capability is not None and capability < MIN_CAPABILITY:
        raise UserInputError(
            f"{torch.cuda.get_device_name(dev)} (compute capability "
            f"{capability[0]}.{capability[1]}) has no bf16 "
            "tensor cores, which the Triton kernels need", where="--device",
            fix="run on an Ampere or later GPU (A100, L4, L40S, H100, H200, ...)")
    return dev


def _label(point: LatencyPoint | AcceptancePoint) -> str:
    if isinstance(point, LatencyPoint):
        return f"latency B={point.batch} C={point.context}"
    return (f"acceptance {point.method} γ={point.gamma} s={point.sparsity:g} "
            f"T={point.temperature:g} {point.workload}")


def run_calibration(plan: CalibrationPlan, out_dir: str | Path,
                    progress: LabelledProgress | None = None, *, log_fn: Say | None = None,
                    retry_failed: bool = False,
                    model: tuple[Any, dict[str, Any]] | None = None) -> Path:
    """Measure `plan` into the trace set `out_dir` (created, or resumed if it exists).

    progress(done, total, label) is called once at the start (points already done) and after
    every point; an exception it raises interrupts the run, which a later call resumes.
    log_fn gets one line per skipped / OOM point (default: the 'vegas_sim.calibrate' logger).
    retry_failed: redo points recorded as 'skip' or 'oom' by an earlier session.
    model: an already loaded (runtime.Transformer, weights meta) to use instead of loading
    `plan.model` (notebooks, tests); it must live on `plan.device`.
    Returns the finalized trace-set directory (loadable with traces.io.load_trace_set).
    """
    say = log_fn if log_fn is not None else log.info
    out = Path(out_dir)
    if plan.tensor_parallel > 1:
        if model is not None:
            raise UserInputError("a loaded model cannot be sharded over processes",
                                 where="model", fix="pass the model by name in the plan")
        # before the device: "N GPUs needed, M visible" first
        tp_run.check_group(plan.model, plan.device, plan.tensor_parallel)
        check_device(plan.device)
        check_resumable(out, plan)
        return tp_run.run_ranks(plan.tensor_parallel, plan.device, calibrate_rank,
                                (plan, out, retry_failed), progress=progress, say=say)
    device = check_device(plan.device)
    check_resumable(out, plan)
    if plan.weights == "real" and plan.acceptance and not plan.workloads:
        say("note: no --workload given, so no acceptance rows will be measured")
    if model is None:
        net, _tok, weights_meta = load_model(plan.model, weights=plan.weights,
                                             device=plan.device, dtype=plan_dtype(plan),
                                             seed=plan.seed)
    else:
        net, weights_meta = model
    if plan.rope_extension is not None:
        trained = net.spec.max_positions
        net.extend_positions(plan.rope_extension)
        say(f"RoPE: YaRN factor {plan.rope_extension:g} over {net.spec.name}'s trained {trained} "
            f"positions (now {net.spec.max_positions}): what lies past them is YaRN-extended")
    return _calibrate(net, net.spec, weights_meta, plan, out, device, progress, say,
                      retry_failed)


def calibrate_rank(group: RankGroup, plan: CalibrationPlan, out: Path, retry_failed: bool
                   ) -> Path:
    """One rank of `calibrate --tp N` (tp_run.run_ranks): its shard of the model
    (`tp_run.load_shard`), the same loop as every other rank, rank 0 writing."""
    say = group.say if group.lead else (lambda _line: None)
    net, spec, weights_meta = tp_run.load_shard(
        group, plan.model, weights=plan.weights, dtype=plan_dtype(plan), seed=plan.seed,
        device=plan.device, rope_extension=plan.rope_extension)
    if plan.rope_extension is not None:
        say(f"RoPE: YaRN factor {plan.rope_extension:g}: {spec.max_positions} positions")
    return _calibrate(net, spec, weights_meta, plan, out, group.device(plan.device),
                      group.progress if group.lead else None, say, retry_failed, group)


def _calibrate(net: Any, spec: ModelSpec, weights_meta: dict[str, Any], plan: CalibrationPlan,
               out: Path, device: torch.device, progress: LabelledProgress | None, say: Say,
               retry_failed: bool, group: RankGroup | None = None) -> Path:
    """Measure `plan` on a loaded model (`spec`: the whole model's, which meta.json records;
    a shard's ranks all run this, rank 0 writing)."""
    lead = group is None or group.lead
    lat_points = latency_points(plan)
    usable = [p for p in lat_points if p.context <= spec.max_positions]
    too_long = sorted({p.context for p in lat_points} - {p.context for p in usable})
    if too_long:
        say(f"contexts {too_long} exceed {spec.name}'s {spec.max_positions} positions: "
            "not measured")
    points: list[LatencyPoint | AcceptancePoint] = [*usable, *acceptance_points(plan)]
    if not points:
        raise _nothing_to_measure(plan, spec, bool(too_long))
    gpu = hardware.measure_hardware(device, quick=plan.quick) if lead else {}  # rank 0's
    writer: Any = TraceSetWriter(out, build_meta(plan, spec, weights_meta, gpu)) if lead \
        else _NoWriter()
    recorded = writer.progress()
    done = {k for k, r in recorded.items()
            if not (retry_failed and r.get("status") in ("skip", "oom"))}
    if group is not None:
        done = group.from_lead(done)
    total = len(points)
    n_done = sum(p.key in done for p in points)
    session = Session()
    if progress is not None:
        progress(n_done, total, "resumed" if n_done else "start")
    device_name = gpu.get("name", str(device))
    with terminate_as_interrupt(), _recorded(out if lead else None, session, device_name):
        _measure_points(net, plan, points, done, writer, device, session, say, progress,
                        n_done, total, group)
    if not lead:
        return out
    _require_some_point_measured(writer, out)
    ts = writer.finalize()
    write_run_log(out, session, device_name, acceptance_summary(ts.acceptance))
    return out


class _NoWriter:
    """What a rank other than 0 writes: nothing."""

    def progress(self) -> dict[str, dict[str, Any]]:
        return {}

    def append_latency(self, *_args: Any, **_kw: Any) -> None:
        pass

    def append_acceptance(self, *_args: Any, **_kw: Any) -> None:
        pass

    def mark_done(self, *_args: Any, **_kw: Any) -> None:
        pass


def _require_some_point_measured(writer: TraceSetWriter, out: Path) -> None:
    """Refuse to finalize a run whose every point was skipped (too little memory, OOM): no
    set with no rows is written; the progress stays, so `--retry-failed` can try again."""
    records = writer.progress().values()
    if records and all(r.get("status") != "ok" for r in records):
        first = next(iter(records))
        raise UserInputError(
            f"every point was skipped ({first.get('status')}: {first.get('detail')}); no trace "
            "set is written", where=str(out),
            fix="free GPU memory or use smaller --batch/--context, then rerun with "
                "--retry-failed")


def _nothing_to_measure(plan: CalibrationPlan, spec: ModelSpec, too_long: bool) -> UserInputError:
    """Why a plan has no point to measure, before anything is written."""
    if too_long:
        return UserInputError(
            f"every context exceeds {spec.name}'s {spec.max_positions} positions",
            where="--context", fix=f"use contexts up to {spec.max_positions // 1024}K")
    if plan.weights != "real":
        return UserInputError(
            "nothing to measure: latency is off, and random weights have no acceptance",
            where="--no-latency", fix="drop --no-latency, or measure acceptance with --weights "
                                      "real and a --workload")
    return UserInputError("nothing to measure: latency and acceptance are both off or empty",
                          where="--no-latency/--no-acceptance/--workload",
                          fix="ask for latency, or acceptance with a --workload")


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (e.g. `timeout`, a scheduler's kill) raises KeyboardInterrupt in the main
    thread, so an interrupted calibration still writes its run log on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _recorded(out: Path | None, session: Session, device: str) -> Iterator[None]:
    """Mark the session complete or interrupted, and write the run log either way (not
    without `out`: a rank other than 0)."""
    try:
        yield
        session.outcome = "complete"
    except BaseException as e:
        session.outcome = f"interrupted: {type(e).__name__}: {e}"[:300]
        raise
    finally:
        if out is not None:
            write_run_log(out, session, device)


def _measure_points(net: Any, plan: CalibrationPlan, points: Sequence[Any], done: set[str],
                    writer: Any, device: torch.device, session: Session,
                    say: Say, progress: LabelledProgress | None, n_done: int,
                    total: int, group: RankGroup | None = None) -> None:
    """Measure every point not yet done: latency points in order, then the acceptance points
    in groups (`acceptance_groups`); `n_done` of `total` are done already."""
    todo = [p for p in points if p.key not in done]
    latency = [p for p in todo if isinstance(p, LatencyPoint)]
    if latency:
        session.step_overhead = measure_step_overhead(
            net, min(effective_context(plan, net.spec, min(plan.context)), 1024),
            steps=20 if device.type == "cuda" else 3)
    units: list[list[Any]] = [[p] for p in latency]
    units += acceptance_groups([p for p in todo if isinstance(p, AcceptancePoint)])
    prompt_cache: dict[str, list[list[int]]] = {}
    for unit in units:
        status, detail, secs = _run_unit(net, plan, unit, writer, device, prompt_cache, group)
        for point in unit:
            session.points.append({"key": point.key, "status": status, "detail": detail,
                                   "seconds": secs / len(unit)})
        label = _label(unit[0]) + (f" (+{len(unit) - 1} sparsities)" if len(unit) > 1 else "")
        if status != "ok":
            say(f"{label}: {status} ({detail})")
        n_done += len(unit)
        if progress is not None:
            progress(n_done, total, label)


def _skip_if_too_big(model: Any, plan: CalibrationPlan, point: LatencyPoint,
                     device: torch.device) -> str | None:
    """Why `point` cannot fit in free memory (the detail its 'skip' records), or None."""
    spec: ModelSpec = model.spec
    ctx = effective_context(plan, spec, point.context)
    # the largest state the point builds: verify at n_query q holds γ = q - 1 drafts
    max_seq = ctx + state_headroom(max(max(plan.verify_n_query()) - 1, DRAFT_GAMMA))
    db = model_dtype_bytes(model)
    if hardware.fits_in_memory(spec, point.batch, max_seq, device, include_weights=False,
                               dtype_bytes=db):
        return None
    need = hardware.memory_needed(spec, point.batch, max_seq, include_weights=False,
                                  dtype_bytes=db)
    return f"needs ~{need / 1e9:.1f} GB, {hardware.free_memory(device) / 1e9:.1f} GB free"


def _run_unit(model: Any, plan: CalibrationPlan, unit: list[Any], writer: Any,
              device: torch.device, prompt_cache: dict[str, list[list[int]]],
              group: RankGroup | None = None) -> tuple[str, str, float]:
    """Measure one latency point or one acceptance group, append its rows and mark its
    points done; (status, detail, seconds). In a rank group the ranks skip a point together,
    and an OOM on a rank stops the run (the others would wait for it in a collective)."""
    t0 = time.perf_counter()
    head = unit[0]
    if isinstance(head, LatencyPoint):
        detail = _skip_if_too_big(model, plan, head, device)
        if group is not None:
            detail = group.first_reason(detail)
        if detail is not None:
            writer.mark_done(head.key, "skip", detail)
            return "skip", detail, time.perf_counter() - t0
    oom: str | None = None
    measure = measure_latency_point if group is None else tp_run.measure_sharded_point
    try:
        if isinstance(head, LatencyPoint):
            writer.append_latency(latency_frame(measure(model, plan, head)), key=head.key)
        else:
            if head.workload not in prompt_cache:
                prompt_cache[head.workload] = acceptance_prompts(plan, model.spec,
                                                                 head.workload, head.gamma)
            frames = measure_acceptance_group(model, plan, unit, prompt_cache[head.workload])
            for key, frame in frames.items():
                writer.append_acceptance(frame, key=key)
    except oom_types() as e:
        oom = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        if group is not None:
            raise UserInputError(f"out of GPU memory at {_label(head)} ({oom}); the points "
                                 "before it are kept", where="--tp",
                                 fix="leave that point out of the grid (smaller --batch or "
                                     "--context) and run the same --out again") from None
    if oom is not None:  # outside the except block: the traceback's frames are released
        free_device_memory(device)
        for point in unit:
            writer.mark_done(point.key, "oom", oom)
        return "oom", oom, time.perf_counter() - t0
    for point in unit:
        writer.mark_done(point.key, "ok")
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the next unit's KV has another size: do not fragment
    return "ok", "", time.perf_counter() - t0
