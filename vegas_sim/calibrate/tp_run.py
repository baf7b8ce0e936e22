"""`calibrate --tp N`: one process per rank, what the ranks must agree on to run one loop, and
latency rows whose collectives are timed apart.

Processes. The command's process checks the group first (the model splits N ways:
`models.check_tensor_parallel`; N GPUs visible on CUDA), then starts N ranks
(torch.multiprocessing, spawn): NCCL with rank r on cuda:r, gloo on the CPU. Every rank loads
the whole model with the same seed, shards it (`ShardedTransformer`) and runs the same
measurement loop on the same inputs and seeds (`runner.calibrate_rank`); rank 0 alone writes
the trace set and sends progress and log lines to the command over a queue. The first rank to
fail sends its error and exits; the command stops the others and raises that error once.
Ctrl-C or SIGTERM stops every rank (rank 0 keeps the points done, as an interrupted
calibration on one GPU does); a rank still alive after a grace period is killed, and a rank
whose parent dies gets SIGINT (torch's spawn sets PR_SET_PDEATHSIG), so none outlives the
command.

Collectives timed apart. Every latency point is measured twice by the same code: as it runs,
and with every collective made a no-op of the same shapes (`ShardedTransformer.collectives_on`,
numerically wrong, used only for timing). A row's `collective_ms` is the difference of the two
medians, what the collectives add to the phase as it runs, waiting for the slowest rank
included; rows whose phase issues none record 0, and a difference below 0 (the collectives
cheaper than the run-to-run spread) is recorded as 0. Why not CUDA events around each
collective: a phase replayed from a CUDA graph (draft step, verify, decode) cannot record
events inside it, and timing the phases eagerly instead would measure another runtime than
the one the set describes; the difference also keeps what a collective costs beyond its own
kernel (the launch it blocks, the overlap it prevents). The price is a second pass per point.
"""

from __future__ import annotations

import contextlib
import queue as queue_mod
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from vegas_sim.calibrate import hardware
from vegas_sim.calibrate import weights as wmod
from vegas_sim.calibrate.loading import load_model
from vegas_sim.calibrate.measure_latency import free_device_memory, measure_latency_point
from vegas_sim.calibrate.tensor_parallel import ShardedTransformer
from vegas_sim.calibrate.plan import CalibrationPlan, LatencyPoint
from vegas_sim.errors import UserInputError
from vegas_sim.models import PRESETS, ModelSpec, check_tensor_parallel, get_preset

CPU_INTERCONNECT = "gloo/loopback"
GRACE_S = 10.0  # how long a stopped rank may take to write its run log before it is killed
COLLECTIVE_TIMEOUT = timedelta(minutes=30)  # a rank blocked this long in a collective fails
ROW_KEY = ("phase", "method", "batch", "context", "n_query", "kv_read", "collect_rows")


# ============================================================================ checks
def model_spec(model: str) -> ModelSpec:
    """The spec of `model` without loading its weights (a preset, or a file's header)."""
    if model in PRESETS and not Path(model).exists():
        return get_preset(model)
    return wmod.load_checkpoint(Path(model), load_weights=False).spec


def check_group(model: str, device: str, size: int) -> None:
    """Before anything heavy: `model` splits `size` ways and, on CUDA, as many GPUs are
    visible."""
    check_tensor_parallel(model_spec(model), size)
    if torch.device(device).type != "cuda":
        return
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible < size:
        raise UserInputError(
            f"--tp {size} needs {size} GPUs, {visible} visible", where="--tp",
            fix=f"use --tp {visible} or less, or run where {size} GPUs are visible "
                "(CUDA_VISIBLE_DEVICES)" if visible else "run on a machine with GPUs, or "
                "use --device cpu (gloo)")


def backend_of(device: str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def interconnect(device: str, size: int) -> str:
    """How the group's GPUs are joined, as far as this process can tell: GPU0-GPU1's entry
    of `nvidia-smi topo -m` (e.g. NV18: 18 NVLinks), else NVLink links per GPU (pynvml, when
    installed), else peer-to-peer access (torch), else 'unknown'; gloo/loopback on the CPU."""
    if torch.device(device).type != "cuda":
        return CPU_INTERCONNECT
    if size > 1:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                                 timeout=20).stdout
            link = topo_link(out, 0, 1)
            if link:
                return f"{link} between GPU0 and GPU1 (nvidia-smi topo -m)"
    links = _nvlink_links(0)
    if links:
        return f"NVLink ({links} active links on GPU 0)"
    try:
        if size > 1 and torch.cuda.can_device_access_peer(0, 1):
            return "peer-to-peer (NVLink or PCIe: link type unknown)"
    except (RuntimeError, AssertionError):
        pass
    return "unknown"


def topo_link(matrix: str, a: int, b: int) -> str | None:
    """The entry for GPU a, GPU b of `nvidia-smi topo -m`'s matrix (NV#, PIX, PXB, PHB, NODE,
    SYS), or None when the text holds no such row and column."""
    lines = [line.split() for line in matrix.splitlines() if line.strip()]
    # the header: column names only (GPU0 GPU1 ...); a row starts with its name, then "X"
    at = next((i for i, cols in enumerate(lines) if len(cols) > 1
               and cols[0].startswith("GPU") and cols[1].startswith("GPU")), None)
    if at is None or f"GPU{b}" not in lines[at]:
        return None
    col = lines[at].index(f"GPU{b}")
    row = next((cols for cols in lines[at + 1:] if cols[0] == f"GPU{a}"), None)
    if row is None or len(row) <= col + 1:
        return None
    return row[col + 1]


def _nvlink_links(index: int) -> int:
    """Active NVLink links of GPU `index` (0 when pynvml is missing or says none)."""
    try:
        import pynvml  # optional: not a dependency
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        active = 0
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                active += int(pynvml.nvmlDeviceGetNvLinkState(handle, link) == 1)
            except pynvml.NVMLError:
                break
        return active
    except Exception:  # noqa: BLE001 - a description, never a reason to fail the run
        return 0


def tensor_parallel_meta(plan: CalibrationPlan) -> dict[str, Any]:
    """meta.json's `tensor_parallel` (traces/schema.py TP_FIELDS)."""
    out: dict[str, Any] = {"size": plan.tensor_parallel, "backend": backend_of(plan.device),
                           "interconnect": interconnect(plan.device, plan.tensor_parallel)}
    if out["backend"] == "nccl":
        with contextlib.suppress(Exception):
            out["nccl_version"] = ".".join(str(v) for v in torch.cuda.nccl.version())
    return out


def load_shard(group: RankGroup, model: str, *, weights: str, dtype: torch.dtype | None,
               seed: int, device: str, rope_extension: float | None = None
               ) -> tuple[ShardedTransformer, ModelSpec, dict[str, Any]]:
    """This rank's shard of `model` on its device: the whole model loaded with `seed` (on the
    rank's GPU when the whole model and its shard fit there with room to spare, else on the
    CPU), RoPE extended if asked, then split; (shard, the whole model's spec, weights meta)."""
    dev = group.device(device)
    dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    where = "cpu"
    if dev.type == "cuda":
        need = hardware.memory_needed(model_spec(model), 1, 1,
                                      dtype_bytes=torch.tensor([], dtype=dtype).element_size())
        where = str(dev) if 2 * need < 0.8 * hardware.free_memory(dev) else "cpu"
    whole, _tok, weights_meta = load_model(model, weights=weights, device=where, dtype=dtype,
                                           seed=seed)
    if rope_extension is not None:
        whole.extend_positions(rope_extension)
    spec = whole.spec
    net = ShardedTransformer(spec, {n: p.detach() for n, p in whole.named_parameters()},
                             device=dev, dtype=dtype)
    del whole
    free_device_memory(dev)
    return net, spec, weights_meta


# ============================================================================ the rank group
@dataclass
class RankGroup:
    """One rank's view of the group: its rank, and the queue to the command's process."""

    rank: int
    size: int
    messages: Any  # multiprocessing queue

    @property
    def lead(self) -> bool:
        return self.rank == 0

    def device(self, device: str) -> torch.device:
        return torch.device("cuda", self.rank) if torch.device(device).type == "cuda" else \
            torch.device("cpu")

    def first_reason(self, reason: str | None) -> str | None:
        """The first rank's non-None `reason` (e.g. why a point must be skipped), on every
        rank: the ranks decide together, so that none skips a point the others measure."""
        reasons: list[str | None] = [None] * self.size
        dist.all_gather_object(reasons, reason)
        return next((r for r in reasons if r is not None), None)

    def from_lead(self, value: Any) -> Any:
        """Rank 0's `value` on every rank."""
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def progress(self, done: int, total: int, label: str) -> None:
        self.messages.put(("progress", done, total, label))

    def say(self, line: str) -> None:
        self.messages.put(("log", line))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(size: int, device: str, body: Callable[..., Any], args: tuple[Any, ...], *,
              progress: Callable[[int, int, str], None] | None = None,
              say: Callable[[str], None] = print) -> Any:
    """Run body(group, *args) on `size` ranks; returns what rank 0's body returned. Progress
    and log lines of rank 0 are passed on as they come; the first rank's failure is raised
    here once (a UserInputError as itself), after every rank has stopped."""
    ctx = mp.get_context("spawn")
    messages = ctx.Queue()
    procs = mp.start_processes(_rank_main, args=(size, backend_of(device), free_port(),
                                                 messages, body, args),
                               nprocs=size, join=False, start_method="spawn")
    state = _Outcome()
    try:
        with _terminate_as_interrupt():
            while not state.failed:
                state.drain(messages, progress, say)
                if state.failed or procs.join(timeout=0.2, grace_period=GRACE_S):
                    break
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
        state.exited(e)
    finally:
        _stop(procs)
        state.drain(messages, progress, say)
    return state.result()


def _stop(procs: Any) -> None:
    """SIGTERM to every rank still alive (each exits as an interrupted calibration), then
    SIGKILL to any still alive after the grace period."""
    alive = [p for p in procs.processes if p.is_alive()]
    for p in alive:
        p.terminate()
    for p in alive:
        p.join(GRACE_S)
        if p.is_alive():
            p.kill()
            p.join()


@dataclass
class _Outcome:
    """What the command's process has heard from the ranks."""

    errors: list[tuple[int, tuple[Any, ...]]] | None = None
    crashed: str | None = None
    done: tuple[bool, Any] = (False, None)

    @property
    def failed(self) -> bool:
        return bool(self.errors) or self.crashed is not None

    def drain(self, messages: Any, progress: Callable[[int, int, str], None] | None,
              say: Callable[[str], None]) -> None:
        while True:
            try:
                msg = messages.get_nowait()
            except (queue_mod.Empty, OSError, ValueError, EOFError):
                return
            if msg[0] == "progress" and progress is not None:
                progress(*msg[1:])
            elif msg[0] == "log":
                say(msg[1])
            elif msg[0] == "error":
                self.errors = (self.errors or []) + [(msg[1], msg[2:])]
            elif msg[0] == "done":
                self.done = (True, msg[1])

    def exited(self, e: Exception) -> None:
        self.crashed = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__

    def result(self) -> Any:
        if self.errors:  # a user error first: a peer's failure is often its consequence
            user = [e for e in self.errors if e[1][0] == "user"]
            rank, (kind, problem, where, fix, text) = (user or self.errors)[0]
            if kind == "user":
                raise UserInputError(f"rank {rank}: {problem}", where=where, fix=fix)
            raise RuntimeError(f"tensor-parallel rank {rank} failed: {problem}\n{text}")
        if self.crashed is not None:
            raise RuntimeError(f"a tensor-parallel rank stopped without a message "
                               f"({self.crashed})")
        if not self.done[0]:
            raise KeyboardInterrupt("the ranks stopped before rank 0 finished")
        return self.done[1]


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt in this (main) thread while the ranks run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _rank_main(rank: int, size: int, backend: str, port: int, messages: Any,
               body: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """One rank: join the group, run body, send its result or its error."""
    signal.signal(signal.SIGTERM, _interrupt)
    torch.set_num_threads(max(1, torch.get_num_threads() // size))
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size, timeout=COLLECTIVE_TIMEOUT)
    group = RankGroup(rank, size, messages)
    try:
        result = body(group, *args)
    except KeyboardInterrupt:
        sys.exit(130)
    except UserInputError as e:
        messages.put(("error", rank, "user", e.problem, e.where, e.fix, ""))
        sys.exit(1)
    except Exception as e:  # noqa: BLE001 - reported to the command, which raises it once
        messages.put(("error", rank, "crash", f"{type(e).__name__}: {e}", None, None,
                      traceback.format_exc()))
        sys.exit(1)
    if group.lead:
        messages.put(("done", result))
    dist.destroy_process_group()


# ============================================================================ latency rows
def measure_sharded_point(model: Any, plan: CalibrationPlan, point: LatencyPoint
                          ) -> list[dict[str, Any]]:
    """The rows of one latency point on a shard, each with its collectives' time: measured
    with them and with them made no-ops (module docstring)."""
    model.collectives_on = True
    rows = measure_latency_point(model, plan, point)
    model.collectives_on = False
    try:
        bare = measure_latency_point(model, plan, point)
    finally:
        model.collectives_on = True
    return with_collective_time(rows, bare)


def with_collective_time(rows: list[dict[str, Any]], bare: list[dict[str, Any]]
                         ) -> list[dict[str, Any]]:
    """`rows` with collective_ms = their median − the same row's median in `bare` (the pass
    with no-op collectives, row for row), ≥ 0, and 0 where the phase issued none."""
    if [tuple(r[k] for k in ROW_KEY) for r in rows] != [tuple(r[k] for k in ROW_KEY)
                                                        for r in bare]:
        raise RuntimeError("the pass with no-op collectives measured other rows")
    out = []
    for row, alone in zip(rows, bare):
        gap = row["ms_median"] - alone["ms_median"] if row["collective_calls"] else 0.0
        out.append({**row, "collective_ms": max(gap, 0.0)})
    return out
