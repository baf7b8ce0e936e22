"""One configuration to predict (`Scenario`): its fields and defaults (the rules are in the
`predict` module docstring), and the checks that refuse a
scenario the model, GPU or trace set cannot hold (`validate_scenario`, `split_fitting`),
KV capacity among them (`kv_capacity`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from vegas_sim.bounds import check_options
from vegas_sim.errors import DoesNotFitError, UserInputError
from vegas_sim.methods import (
    VANILLA,
    check_method,
    check_sparsity,
    query_rows,
)
from vegas_sim.models import ModelSpec
from vegas_sim.sim.engine import Arrivals, OutputLengths
from vegas_sim.sim.engine_config import check_run_fields
from vegas_sim.sim.latency import LatencyModel
from vegas_sim.sim.metrics import Slo

KV_LINK_GBS = 50.0  # one 400 Gb/s RDMA NIC between the prefill and the decode GPU
REQUESTS_PER_SLOT = 4  # default requests = 4 × batch (closed loop)
OPEN_LOOP_MIN_REQUESTS = 200  # default requests in open loop: max(200, 20 × batch)
OPEN_LOOP_PER_SLOT = 20


@dataclass(frozen=True)
class Scenario:
    """One configuration to predict. ``batch`` is the max batch (continuous batching)."""

    method: str
    gamma: int
    sparsity: float
    batch: int
    context: int
    output_len: int
    requests: int | None = None  # default: REQUESTS_PER_SLOT × batch
    # closed loop, Poisson or a trace, parsed from --arrival where the options come in
    # (`options.scenario_extra`); its text is what the rows print
    arrival: Arrivals = Arrivals()
    workload: str | None = None
    temperature: float = 0.0
    prefill: str = "disaggregated"  # "disaggregated" | "co-located"
    prefill_gpus: int = 1  # disaggregated: GPUs of the prefill stage
    kv_link_gbs: float = KV_LINK_GBS  # disaggregated: the prefill → decode link, GB/s
    kv_capacity_tokens: int | None = None  # None: GPU memory − weights
    # budget floor of the draft selection (methods.budget); None: the floor the acceptance
    # traces were run with (AcceptanceModel.min_tokens), so drafts and acceptance agree
    min_tokens: int | None = None
    output_dist: OutputLengths | None = None  # None: every request generates output_len
    kv_block_size: int = 16  # tokens per KV block (vLLM's default)
    # share of GPU memory for weights + KV cache (vLLM gpu_memory_utilization, its default)
    gpu_memory_utilization: float = 0.9
    slo_tpot_ms: float | None = None  # goodput's SLOs (None: not asked for)
    slo_ttft_ms: float | None = None

    @property
    def max_output(self) -> int:
        """The longest output a request can have (-1: an unclipped lognormal)."""
        return self.output_len if self.output_dist is None else self.output_dist.max_output()

    @property
    def output_label(self) -> str:
        return str(self.output_len) if self.output_dist is None else self.output_dist.label

    @property
    def n_requests(self) -> int:
        if self.requests is not None:
            return self.requests
        if self.arrival.kind == "trace":  # one request per arrival of the trace
            return len(self.arrival.times_s)
        if self.is_open_loop:
            return max(OPEN_LOOP_MIN_REQUESTS, OPEN_LOOP_PER_SLOT * self.batch)
        return REQUESTS_PER_SLOT * self.batch

    @property
    def is_open_loop(self) -> bool:
        return self.arrival.is_open

    @property
    def slo(self) -> Slo:
        return Slo(self.slo_tpot_ms, self.slo_ttft_ms)

    def vanilla(self) -> Scenario:
        """The baseline at the same batch/context/output/arrivals."""
        return replace(self, method=VANILLA)


# ---------------------------------------------------------------------------- validation
# Scenario fields with a bound in `vegas_sim.bounds` (finite, within what physics allows)
SCENARIO_BOUNDED = ("batch", "requests", "temperature", "kv_block_size", "prefill_gpus",
                    "kv_link_gbs", "gpu_memory_utilization", "slo_tpot_ms", "slo_ttft_ms")


def validate_scenario(sc: Scenario, model: ModelSpec, gpu_memory_gb: float | None,
                      weight_format: str = "bf16") -> None:
    """Raise UserInputError naming the option and the fix for an impossible scenario."""
    sc = resolve_output(sc, model)
    check_method(sc.method)
    check_sparsity(sc.sparsity)
    check_run_fields(gamma=sc.gamma, batch=sc.batch, requests=sc.requests, prefill=sc.prefill,
                     kv_block_size=sc.kv_block_size, prefill_gpus=sc.prefill_gpus)
    if sc.context < 1:
        raise UserInputError(f"context must be >= 1, got {sc.context}", where="--context",
                             fix="pass --context 1 or more")
    if sc.output_len < 1:
        raise UserInputError(f"output length must be >= 1, got {sc.output_len}",
                             where="--output-len", fix="pass --output-len 1 or more")
    if not sc.temperature >= 0:  # also NaN
        raise UserInputError(f"temperature must be >= 0, got {sc.temperature}",
                             where="--temperature", fix="use 0 (greedy) or e.g. 0.6")
    if not 0.0 < sc.gpu_memory_utilization <= 1.0:
        raise UserInputError(f"GPU memory utilization must be in (0, 1], got "
                             f"{sc.gpu_memory_utilization}", where="--gpu-memory-utilization",
                             fix="use vLLM's 0.9, or e.g. 0.95")
    if not sc.kv_link_gbs > 0:  # also NaN
        raise UserInputError(f"the KV link bandwidth must be > 0 GB/s, got {sc.kv_link_gbs}",
                             where="--kv-link-gbs", fix=f"e.g. {KV_LINK_GBS:g} (GB/s)")
    if sc.output_dist is not None:
        sc.output_dist.validate()
    for name, value in (("--slo-tpot-ms", sc.slo_tpot_ms), ("--slo-ttft-ms", sc.slo_ttft_ms)):
        if value is not None and not value > 0:  # also NaN
            raise UserInputError(f"an SLO must be > 0 ms, got {value}", where=name,
                                 fix="pass a positive number of milliseconds, e.g. 50")
    check_options({name: getattr(sc, name) for name in SCENARIO_BOUNDED})
    sc.arrival.validate(sc.n_requests)
    if sc.context + max(sc.max_output, sc.output_len) > model.max_positions:
        raise _too_long(sc, model)
    if sc.kv_capacity_tokens is None and gpu_memory_gb is not None:
        _check_memory(sc, model, gpu_memory_gb, weight_format)


def split_fitting(scenarios: Sequence[Scenario], latency: LatencyModel,
                  ) -> tuple[list[Scenario], list[tuple[Scenario, DoesNotFitError]]]:
    """The scenarios that fit the model and the GPU, and those that do not with the reason.
    Every other bad input still raises; so does a grid in which nothing fits."""
    mem = gpu_memory(latency)
    fit: list[Scenario] = []
    skipped: list[tuple[Scenario, DoesNotFitError]] = []
    for sc in scenarios:
        try:
            validate_scenario(sc, latency.gpu_model, mem, weight_format_of(latency))
        except DoesNotFitError as e:
            skipped.append((sc, e))
        else:
            fit.append(sc)
    if skipped and not fit:
        raise skipped[0][1]
    return fit, skipped


def skipped_notes(skipped: Sequence[tuple[Scenario, DoesNotFitError]]) -> list[str]:
    """One line per (batch, context, output length) cell that was skipped, with the reason."""
    log = SkipLog()
    for sc, err in skipped:
        log.add(sc, err)
    return log.notes()


class SkipLog:
    """Configurations left out because they do not fit, counted per (batch, context, output
    length) cell with the first reason: what `skipped_notes` says, in memory that does not grow
    with the number of configurations (a streamed grid of millions)."""

    def __init__(self) -> None:
        self.cells: dict[tuple[int, int, int], tuple[int, DoesNotFitError]] = {}
        self.count = 0

    def add(self, sc: Scenario, err: DoesNotFitError) -> None:
        key = (sc.batch, sc.context, sc.output_len)
        n, first = self.cells.get(key, (0, err))
        self.cells[key] = (n + 1, first)
        self.count += 1

    def first_error(self) -> DoesNotFitError | None:
        return next((err for _, err in self.cells.values()), None)

    def notes(self) -> list[str]:
        return [f"skipped batch {b}, context {c}, output {o}"
                + (f" ({n} configurations)" if n > 1 else "") + f": {err.problem}"
                for (b, c, o), (n, err) in self.cells.items()]


def _too_long(sc: Scenario, model: ModelSpec) -> DoesNotFitError:
    # A "128K" model holds 131072 positions for prompt and output together, so a 128K prompt
    # leaves no room to generate: name the largest prompt that does fit.
    room = model.max_positions - sc.output_len
    if room < 1:
        fix = f"use an --output-len below {model.max_positions}"
    else:
        fix = f"use --context {room}" + (f" ({room // 1024}K)" if room % 1024 == 0 else "")
        fix += f" or less at --output-len {sc.output_len}, or a shorter --output-len"
    return DoesNotFitError(
        f"context {sc.context} + output {sc.output_len} = {sc.context + sc.output_len} tokens "
        f"exceeds {model.name}'s {model.max_positions} positions",
        where="--context/--output-len", fix=fix)


def kv_slack(sc: Scenario) -> int:
    """KV slots one step reserves past a request's tokens (`methods.Method.query_rows`)."""
    return query_rows(sc.method, sc.gamma)


def kv_capacity(model: ModelSpec, gpu_memory_gb: float, utilization: float = 1.0, *,
                weight_format: str = "bf16", running: int = 0, new_tokens: int = 1,
                block_size: int = 16) -> int:
    """KV-cache tokens that fit next to the weights in `utilization` of the GPU's memory
    (vLLM's gpu_memory_utilization): (utilization · memory − weights − window blocks) / bytes
    per token. A token costs its full-attention layers' K and V; sliding-window layers hold
    only their window per request (vLLM's hybrid KV cache manager), reserved here for
    `running` requests (max_num_seqs) stepping `new_tokens` at a time."""
    window = running * model.window_cache_bytes(new_tokens, block_size)
    free = (utilization * gpu_memory_gb * 1e9 - model.resident_weight_bytes(weight_format)
            - window)
    return max(int(free // model.full_kv_bytes_per_token()), 0)


def _scenario_cache_tokens(sc: Scenario, model: ModelSpec, gpu_memory_gb: float,
                      weight_format: str) -> int:
    """`kv_capacity` for the scenario's memory share, batch, step and block size."""
    return kv_capacity(model, gpu_memory_gb, sc.gpu_memory_utilization,
                       weight_format=weight_format, running=sc.batch, new_tokens=kv_slack(sc),
                       block_size=sc.kv_block_size)


def resolve_output(sc: Scenario, model: ModelSpec) -> Scenario:
    """The scenario with its output distribution clipped to the positions left after the
    prompt (a generation stops at the model's context length)."""
    if sc.output_dist is None:
        return sc
    return replace(sc, output_dist=sc.output_dist.clipped(model.max_positions - sc.context))


def _check_memory(sc: Scenario, model: ModelSpec, gpu_memory_gb: float,
                  weight_format: str) -> None:
    """Refuse only a request that cannot fit the KV cache alone: prompt + longest output +
    one step's slack, in whole blocks. A batch that outgrows the cache is admitted and
    preempted as vLLM does."""
    longest = sc.max_output if sc.max_output > 0 else model.max_positions - sc.context
    bs = sc.kv_block_size
    per_request = -(-(sc.context + longest + kv_slack(sc)) // bs) * bs  # KV slots in blocks
    cap = _scenario_cache_tokens(sc, model, gpu_memory_gb, weight_format) // bs * bs
    if per_request > cap:
        per_token = model.full_kv_bytes_per_token()
        raise DoesNotFitError(
            f"one request of {sc.context} + {longest} tokens needs "
            f"{per_request * per_token / 1e9:.1f} GB of KV cache, but only "
            f"{max(cap, 0) * per_token / 1e9:.1f} GB is left next to the "
            f"weights in {sc.gpu_memory_utilization:g} of a {gpu_memory_gb:g} GB GPU",
            where="--context", fix="shorten --context/--output-len or use a larger GPU (--gpu)")


def gpu_memory(latency: LatencyModel) -> float | None:
    gpu = getattr(latency, "gpu", None)
    mem = getattr(gpu, "memory_gb", None)
    return float(mem) if mem else None


def scenario_kv_capacity(sc: Scenario, latency: LatencyModel) -> int | None:
    if sc.kv_capacity_tokens is not None:
        return sc.kv_capacity_tokens
    mem = gpu_memory(latency)
    if mem is None:
        return None
    return _scenario_cache_tokens(sc, latency.gpu_model, mem, weight_format_of(latency))


def weight_format_of(latency: LatencyModel) -> str:
    """The weight format the latency model prices (bf16 for one that has none)."""
    return str(getattr(latency, "weight_format", "bf16"))
