"""What the calibration machine can do, measured in the same run as the latency grid.

`measure_hardware` records the device and two *measured* rates that the latency model is
expressed in (DESIGN.md, Trace set → meta.json 'gpu'):

- copy bandwidth: a large device-to-device copy, bytes read + written per second, median over
  repetitions (what a memory-bound kernel can hope for on this device, today);
- matmul rate: bf16 8192³ on random data on the GPU; on CPU an fp32 matmul (bf16 GEMMs on CPU
  are emulated and say nothing), and the dict says which dtype was measured.

`fits_in_memory` estimates weights + KV cache + workspace for a grid point against free memory,
so the grid runner can skip points that cannot fit before trying them (it still catches real
OOMs: the estimate is a guard, not a proof).
"""

from __future__ import annotations

import functools
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from vegas_sim.kernels.ops import default_score_format
from vegas_sim.methods import MAX_VERIFY_ROWS
from vegas_sim.models import ModelSpec
from vegas_sim.traces.schema import RUNTIME_REVISION

GIB = 1024**3
_CUDA_COPY_BYTES = 1 * GIB  # per buffer: far beyond L2 (H200: 50 MB), ~0.5 ms per copy
_CPU_COPY_BYTES = 128 * 1024**2  # beyond any L3 this runs on
_CUDA_MATMUL_N = 8192
_CPU_MATMUL_N = 1024


def software_versions() -> dict[str, str]:
    """Versions that change measured numbers: python, torch, triton, CUDA, vegas_sim and its
    runtime revision."""
    import numpy as np

    import vegas_sim

    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "vegas_sim": vegas_sim.__version__,
        "runtime": RUNTIME_REVISION,
        "score_format": default_score_format(),  # Collect-2-Query's scores (kernels/ops.py)
        "platform": platform.platform(),
    }
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:  # CPU installs may lack triton: the reference kernels run instead
        out["triton"] = "not installed"
    if torch.version.cuda:
        out["cuda"] = str(torch.version.cuda)
    return out


def _time_cuda(fn: Callable[[], object], device: torch.device, reps: int) -> list[float]:
    """Per-call ms from CUDA events, one pair per repetition (synchronised once at the end)."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    stream = torch.cuda.current_stream(device)
    for s, e in zip(starts, ends):
        s.record(stream)
        fn()
        e.record(stream)
    torch.cuda.synchronize(device)
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def _time_cpu(fn: Callable[[], object], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def time_ms(fn: Callable[[], object], device: torch.device, *, warmup: int = 2,
            reps: int = 5) -> list[float]:
    """Milliseconds per call of `fn` on `device` after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return _time_cuda(fn, device, reps)
    return _time_cpu(fn, reps)


def measure_copy_bandwidth(device: torch.device, nbytes: int | None = None,
                           reps: int = 10) -> float:
    """GB/s (1e9 bytes/s) of a device-to-device copy of `nbytes`, counting read + write."""
    if nbytes is None:
        nbytes = _CUDA_COPY_BYTES if device.type == "cuda" else _CPU_COPY_BYTES
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    ms = statistics.median(time_ms(functools.partial(dst.copy_, src), device, warmup=3,
                                   reps=reps))
    return 2 * nbytes / (ms * 1e-3) / 1e9


def measure_matmul_tflops(device: torch.device, n: int | None = None,
                          dtype: torch.dtype | None = None, reps: int = 10,
                          seed: int = 0) -> float:
    """TFLOP/s of an n³ matmul on random data (bf16 on CUDA, fp32 on CPU by default)."""
    if n is None:
        n = _CUDA_MATMUL_N if device.type == "cuda" else _CPU_MATMUL_N
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(seed)
    # Random data, not zeros: tensor cores draw more power (and clock lower) on real bits.
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    out = torch.empty(n, n, device=device, dtype=dtype)
    ms = statistics.median(time_ms(lambda: torch.matmul(a, b, out=out), device, warmup=3,
                                   reps=reps))
    return 2.0 * n**3 / (ms * 1e-3) / 1e12


def _cpu_total_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure_hardware(device: str | torch.device, *, quick: bool = False) -> dict[str, Any]:
    """Device description and measured rates for meta.json 'gpu'.

    Keys: name, sm_count, memory_gb, copy_bandwidth_gbs, bf16_tflops, matmul_dtype,
    matmul_tflops, measured (True), plus device-specific extras. On CPU, name is "cpu",
    sm_count is the number of usable cores, and bf16_tflops holds the *fp32* matmul rate
    (matmul_dtype says so) because the latency model needs one GEMM rate for the device.
    `quick` uses fewer repetitions (for tests and --quick).
    """
    dev = torch.device(device)
    reps = 3 if quick else 10
    if dev.type == "cuda":
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        dev = torch.device("cuda", idx)
        props = torch.cuda.get_device_properties(dev)
        info: dict[str, Any] = {
            "name": torch.cuda.get_device_name(dev),
            "sm_count": int(props.multi_processor_count),
            "memory_gb": props.total_memory / 1e9,
            "capability": f"{props.major}.{props.minor}",
        }
        copy_bytes = _CUDA_COPY_BYTES // 4 if quick else _CUDA_COPY_BYTES
        info["copy_bandwidth_gbs"] = measure_copy_bandwidth(dev, copy_bytes, reps=reps)
        info["matmul_dtype"] = "bfloat16"
        info["matmul_tflops"] = measure_matmul_tflops(dev, reps=reps)
        info["bf16_tflops"] = info["matmul_tflops"]
        torch.cuda.empty_cache()
    else:
        info = {
            "name": "cpu",
            "cpu_model": _cpu_name(),
            "sm_count": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else (os.cpu_count() or 1),
            "torch_threads": torch.get_num_threads(),
            "memory_gb": _cpu_total_memory() / 1e9,
        }
        copy_bytes = _CPU_COPY_BYTES // 4 if quick else _CPU_COPY_BYTES
        info["copy_bandwidth_gbs"] = measure_copy_bandwidth(dev, copy_bytes, reps=reps)
        info["matmul_dtype"] = "float32"
        info["matmul_tflops"] = measure_matmul_tflops(dev, n=512 if quick else None, reps=reps)
        info["bf16_tflops"] = info["matmul_tflops"]
        info["note"] = "CPU run: bf16_tflops is the measured fp32 matmul rate"
    info["measured"] = True
    return info


# ---- memory guard ---------------------------------------------------------------------------
def _cpu_available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return _cpu_total_memory()


def free_memory(device: str | torch.device) -> int:
    """Bytes this process can still allocate on `device`.

    On CUDA: the driver's free memory plus what torch's caching allocator holds but does not
    use (it would be reused before asking the driver).
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        cached = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
        return int(free + cached)
    return _cpu_available_memory()


def memory_needed(spec: ModelSpec, batch: int, max_seq: int, *, include_weights: bool = True,
                  dtype_bytes: int | None = None, quest: bool = True,
                  per_row_weights: bool = True) -> int:
    """Estimated peak bytes of a spec-decode state of `batch` requests × `max_seq` slots.

    weights (if `include_weights`) + KV cache [L, B, S, Hkv, D] × 2 (K and V)
    + Quest page min/max (2 × KV / 16 when `quest`) + workspace: fp32 logits of 16 query rows,
    one layer's collected scores of 16 rows [B, 16, Hq, S] bf16, selection weights
    [L, B, S] fp32, the selected index lists [L, B, S] int32 in the worst case, and MLP
    activations of 16 rows. SpecExtend keeps one weight vector per collected row
    ([L, B, 16, S] fp32) until acceptance picks one: `per_row_weights` counts that. Vegas
    keeps every layer's Collect-2-Query scores ([L, B, 2, Hq, S] bf16) for one fold after the
    last layer (policies.CollectingVerifyAttention), and its radix top-k a scratch of 12
    bytes per (layer, request, slot) (kernels.topk): counted too.
    The runtime frees per-layer transients, so one layer of those is counted.
    """
    db = spec.dtype_bytes if dtype_bytes is None else dtype_bytes
    weights = spec.param_count() * db if include_weights else 0
    kv = 2 * spec.n_layers * batch * max_seq * spec.n_kv_heads * spec.head_dim * db
    quest_meta = kv // 8 if quest else 0  # min and max per 16-token page: 2/16 of K, not V
    rows = batch * MAX_VERIFY_ROWS
    logits = rows * spec.vocab * 4 * 2  # fp32 logits + one softmax/probability copy
    scores = rows * spec.n_heads * max_seq * 2
    rows_kept = MAX_VERIFY_ROWS if per_row_weights else 1
    select = spec.n_layers * batch * max_seq * (4 * rows_kept + 4)
    c2q_all_layers = spec.n_layers * batch * 2 * spec.n_heads * max_seq * 2
    topk_scratch = spec.n_layers * batch * max_seq * (8 + 4)  # int64 list + int32 winners
    activ = rows * (3 * spec.ffn + 4 * spec.hidden) * max(db, 4)
    return int(weights + kv + quest_meta + logits + scores + select + c2q_all_layers
               + topk_scratch + activ)


def fits_in_memory(spec: ModelSpec, batch: int, max_seq: int, device: str | torch.device, *,
                   include_weights: bool = True, dtype_bytes: int | None = None,
                   headroom: float = 0.9, available: int | None = None) -> bool:
    """True when `memory_needed(...)` fits in `headroom` × free memory on `device`.

    Pass `include_weights=False` once the model is resident (free memory already excludes it).
    `available` overrides the measured free bytes (tests, planning for another device).
    """
    free = free_memory(device) if available is None else available
    need = memory_needed(spec, batch, max_seq, include_weights=include_weights,
                         dtype_bytes=dtype_bytes)
    return need <= headroom * free
