"""The bounds of every numeric input, in one place: what physics or the evidence allows.

The parsers (the CLI's options, `grids`, `gpus.load_gpu_spec`) and the API's functions check
their values here, before any fitting, so that an impossible or unaffordable value is refused
with the option's name, the reason for its bound and what to do, instead of a traceback or a
run that eats the machine's memory.

The bounds and why:

- γ ≤ MAX_GAMMA (32): the packaged trace sets trace γ up to 15 (latency: one verify pass of
  γ + 1 ≤ 16 query rows, the verify kernel's tile) and 12 (acceptance); every position past
  them is extrapolated by a fitted decay, and 32 keeps that within about twice the evidence.
- batch ≤ MAX_BATCH: what the largest plausible GPU (MAX_GPU_MEMORY_GB) holds at one KV token
  per request of the smallest preset; a scenario's own GPU and model bound it further
  (`sim.scenario.validate_scenario`).
- simulated requests ≤ MAX_REQUESTS, and their pre-drawn token plans within
  MAX_SIM_PLAN_BYTES (REQUEST_BYTES_PER_TOKEN per request and output token).
- seeds in [0, 2**63): numpy's SeedSequence takes no negative seed, and the tables store the
  seed as int64.
- GPU-spec fields (`--gpu-spec`) inside GPU_SPEC_RANGES: beyond any GPU built, the ratios of a
  what-if overflow or vanish (1e300 GB gives a NaN KV capacity, 1e-300 GB/s infinite times).
- rates, times and bandwidths finite; open-loop arrivals (`--arrival`) at most
  MAX_ARRIVAL_RATE requests per second (poisson:inf would put every request at time 0, which
  no saturation rule can read), trace arrival times within [0, MAX_ARRIVAL_S] (past it the
  simulator's float milliseconds lose the sub-millisecond steps it adds).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from vegas_sim.errors import UserInputError

MAX_GAMMA = 32
TRACED_GAMMA = 15  # the largest γ of the packaged latency sets (MAX_VERIFY_ROWS - 1)
MAX_GPU_MEMORY_GB = 1024.0  # 4× the largest GPU memory shipping (B300 288 GB, MI355X 288 GB)
SMALLEST_KV_BYTES_PER_TOKEN = 23040  # smollm2-135m, bf16: 30 layers × 3 KV heads × 64 × 2 × 2
MAX_BATCH = int(MAX_GPU_MEMORY_GB * 1e9 // SMALLEST_KV_BYTES_PER_TOKEN)  # 44,444,444
MAX_REQUESTS = 100_000
# Memory of the sim engine's pre-drawn token plans per request and output token (int64
# increments and their cumulative sums): ~48 KB per request at 1024 output tokens.
REQUEST_BYTES_PER_TOKEN = 48
MAX_SIM_PLAN_BYTES = 8e9
MAX_SEED = 2**63 - 1
MAX_REPLICATIONS = 1000
MAX_WORKERS = 4096
MAX_ARRIVAL_RATE = 1e9  # requests per second: a million times any single instance's
MAX_ARRIVAL_S = 1e7  # seconds (116 days); a float millisecond there still resolves 1e-6 ms


@dataclass(frozen=True)
class Bound:
    """The allowed range of one option: [lo, hi] (lo excluded when `open_lo`)."""

    option: str  # as the CLI spells it: --gamma
    lo: float
    hi: float
    why: str  # why the upper bound is where it is
    fix: str
    integer: bool = False
    open_lo: bool = False

    def check(self, value: Any) -> Any:
        """`value` itself when it is in range; else a UserInputError saying why not."""
        kind = "an integer" if self.integer else "a number"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                self.integer and not float(value).is_integer()):
            raise UserInputError(f"{value!r} is not {kind}", where=self.option, fix=self.fix)
        if not math.isfinite(value):
            raise UserInputError(f"{value} is not finite", where=self.option,
                                 fix=f"pass {kind} in {self.span()}; {self.fix}")
        if value <= self.lo if self.open_lo else value < self.lo:
            least = f"> {_num(self.lo)}" if self.open_lo else f">= {_num(self.lo)}"
            raise UserInputError(f"{self.option.lstrip('-')} must be {least}, got "
                                 f"{_num(value)}", where=self.option, fix=self.fix)
        if value > self.hi:
            raise UserInputError(f"{_num(value)} is outside {self.span()}: {self.why}",
                                 where=self.option, fix=self.fix)
        return value

    def span(self) -> str:
        return f"{'(' if self.open_lo else '['}{_num(self.lo)}, {_num(self.hi)}]"


def _num(value: float) -> str:
    """1e8 as 100,000,000 (an integer bound reads as one), 0.5 as 0.5."""
    return f"{int(value):,}" if float(value).is_integer() and abs(value) < 1e19 else f"{value:g}"


def _b(option: str, lo: float, hi: float, why: str, fix: str, integer: bool = False,
       open_lo: bool = False) -> Bound:
    return Bound(option, lo, hi, why, fix, integer, open_lo)


# Keyed by the keyword the API takes (= the CLI option with dashes as underscores).
BOUNDS: dict[str, Bound] = {b.option[2:].replace("-", "_"): b for b in (
    _b("--gamma", 1, MAX_GAMMA,
       f"the trace sets trace γ up to {TRACED_GAMMA}; past {MAX_GAMMA} every drafted "
       "position is extrapolated", f"draft 1 to {MAX_GAMMA} tokens", integer=True),
    _b("--batch", 1, MAX_BATCH,
       f"no GPU holds more requests: {MAX_GPU_MEMORY_GB:g} GB at one KV token each of the "
       "smallest model", "pass a batch a GPU can run (vLLM's max_num_seqs, e.g. 256)",
       integer=True),
    _b("--requests", 1, MAX_REQUESTS,
       f"each simulated request costs ~{REQUEST_BYTES_PER_TOKEN} B of memory per output token "
       f"(~{REQUEST_BYTES_PER_TOKEN * 1024 // 1000} KB at 1024 tokens)",
       "a steady state needs far fewer: leave --requests out (4 × batch closed loop)",
       integer=True),
    _b("--seed", 0, MAX_SEED, "seeds are non-negative 64-bit integers (numpy SeedSequence)",
       "pass a seed such as 0 or 12345", integer=True),
    _b("--replications", 1, MAX_REPLICATIONS,
       "each replication is a whole simulation, and the 95 % CI narrows only as 1/√n",
       "use 5 to 30", integer=True),
    _b("--kv-block-size", 1, 65536, "a KV block is a few to a few hundred tokens",
       "use vLLM's 16, or e.g. 32", integer=True),
    _b("--prefill-gpus", 1, 65536, "more GPUs than any cluster", "pass e.g. 1 to 64",
       integer=True),
    _b("--workers", 1, MAX_WORKERS, "more worker processes than any host has cores",
       "leave --workers out (all cores)", integer=True),
    _b("--kv-link-gbs", 0, 1e5, "faster than any GPU link (NVLink 5: 900 GB/s)",
       "e.g. 50 (one 400 Gb/s RDMA NIC)", open_lo=True),
    _b("--graph-launch-ms", 0, 1000, "a launch cost of a second is no CUDA graph",
       "e.g. 0.5 (ms per step)"),
    _b("--gpu-memory-utilization", 0, 1, "a share of the GPU's memory",
       "use vLLM's 0.9, or e.g. 0.95", open_lo=True),
    _b("--temperature", 0, 100, "sampling temperatures are 0 (greedy) to a few",
       "use 0 (greedy) or e.g. 0.6"),
    _b("--slo-tpot-ms", 0, 8.64e7, "an SLO longer than a day bounds nothing",
       "pass a positive number of milliseconds, e.g. 50", open_lo=True),
    _b("--slo-ttft-ms", 0, 8.64e7, "an SLO longer than a day bounds nothing",
       "pass a positive number of milliseconds, e.g. 2000", open_lo=True),
    _b("--tie-pct", 0, 100, "a percentage of the best throughput", "e.g. 1"),
    _b("--stable-pct", 0, 100, "a percentage of the best throughput", "e.g. 5"),
    _b("--output-len", 1, 16 * 1024 * 1024, "longer than any model's positions",
       "pass e.g. 1024", integer=True),
)}


ARRIVAL_RATE = _b("--arrival", 0, MAX_ARRIVAL_RATE,
                  "more requests per second than any deployment serves",
                  "give a finite rate, e.g. poisson:2; for every request at once, a rate far "
                  "above the instance's (poisson:1000) or closed:<users>", open_lo=True)


def check_options(values: Mapping[str, Any]) -> None:
    """Check every value of `values` (API keywords: gamma, batch, seed, ...) that has a bound,
    and each number of a list or tuple (a grid or a box given as values); None (not given),
    strings (parsed, then checked, elsewhere) and names without a bound pass."""
    for name, value in values.items():
        bound = BOUNDS.get(name)
        if bound is None or value is None or isinstance(value, str):
            continue
        for v in value if isinstance(value, (list, tuple)) else (value,):
            if not isinstance(v, str):
                bound.check(v)


def check_grid(name: str, values: Iterable[Any]) -> None:
    """Every value of a parsed grid within `name`'s bound."""
    bound = BOUNDS[name]
    for v in values:
        bound.check(v)


def check_simulated_requests(requests: int, tokens_each: int, explicit: bool) -> None:
    """Refuse a simulation whose requests exceed MAX_REQUESTS or whose token plans would need
    more than MAX_SIM_PLAN_BYTES, with the memory estimate; `explicit`: --requests was given
    (else it came from the batch)."""
    need = requests * max(tokens_each, 1) * REQUEST_BYTES_PER_TOKEN
    if requests <= MAX_REQUESTS and need <= MAX_SIM_PLAN_BYTES:
        return
    where = "--requests" if explicit else "--batch"
    raise UserInputError(
        f"{requests:,} simulated requests of {tokens_each:,} output tokens would need about "
        f"{need / 1e9:.1f} GB of memory ({REQUEST_BYTES_PER_TOKEN} B per request and output "
        f"token); the limits are {MAX_REQUESTS:,} requests and {MAX_SIM_PLAN_BYTES / 1e9:g} GB",
        where=where,
        fix="pass fewer --requests (a steady state needs a few per batch slot), a smaller "
            "--batch or --output-len, or --engine analytic (no requests simulated)")


# --gpu-spec fields: (lowest, highest) plausible, with room beyond every GPU built.
GPU_SPEC_RANGES: dict[str, tuple[float, float]] = {
    "memory_gb": (1.0, MAX_GPU_MEMORY_GB),
    "hbm_bandwidth_gbs": (10.0, 1e5),  # B200: 8000 GB/s
    "copy_bandwidth_gbs": (10.0, 1e5),
    "bf16_tflops": (1.0, 1e5),  # B200: 2250 dense
    "link_bandwidth_gbs": (0.1, 1e4),  # NVLink 5: 900 per direction
    "allreduce_latency_us": (0.1, 1e5),
}
