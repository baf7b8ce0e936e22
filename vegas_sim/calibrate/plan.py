"""What a calibration measures (`CalibrationPlan`, built from the CLI's options) and its grid
points: (batch, context) latency points and (method, γ, sparsity, temperature, workload)
acceptance points."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vegas_sim import grids
from vegas_sim.calibrate.workloads import WORKLOADS
from vegas_sim.errors import UserInputError
from vegas_sim.grids import ACCEPTANCE_CUTS
from vegas_sim.methods import (
    MAX_VERIFY_ROWS,
    METHODS,
    MIN_TOKENS,
    SPEC_METHODS,
    check_gamma,
    check_method,
    check_sparsity,
)
from vegas_sim.models import PRESETS, ModelSpec, check_tensor_parallel

log = logging.getLogger("vegas_sim.calibrate")


# Draft steps per timed repetition in the sparsity sweep. A drafting iteration also does work
# once for all its steps (StreamingLLM index lists, Quest page counts, Quest's metadata update
# after acceptance): `draft_samples` records it as an 'other' row, charged once per
# iteration. Spread over the timed steps instead, it would be charged γ / DRAFT_GAMMA times
# per iteration: with one step a repetition over-states a draft step, with four Quest's
# drafting at large γ and batch was still over-predicted against whole iterations.
DRAFT_GAMMA = 4




QWEN3_TOP_P = 0.95  # DESIGN.md defaults for sampled runs


QWEN3_TOP_K = 20


# Drafting kernel paths: methods that run the same draft kernel on the same budget share one
# measurement (draft_kv_read gives them identical kv_read).
DRAFT_PATHS: dict[str, tuple[str, ...]] = {
    "magicdec-stream": ("magicdec-stream",),
    "magicdec-quest": ("magicdec-quest",),
    "vegas": ("vegas", "vegas-all", "specextend"),
}


# ============================================================================ plan
@dataclass(frozen=True)
class CalibrationPlan:
    """What to measure. Build it from CLI options (`vegas_sim.grids` parses the grids).

    model: preset name (random weights), .gguf file or Hugging Face checkpoint dir.
    weights: "real" | "random" (random: latency only, no acceptance rows).
    gamma: draft lengths; n_query of verify = γ+1 (`n_query` adds more); acceptance runs at
    max(gamma). sparsity: draft sparsities; `reference_sparsity` (default: the value closest to
    0.07) is used where sparsity does not enter the timed quantity (verify, select, sample).
    """

    model: str
    weights: str = "random"
    methods: tuple[str, ...] = METHODS
    gamma: tuple[int, ...] = (6,)
    sparsity: tuple[float, ...] = (0.07,)
    batch: tuple[int, ...] = (1,)
    context: tuple[int, ...] = (1024,)
    n_query: tuple[int, ...] = (1, 2, 4, 8, 12, 16)
    workloads: tuple[str, ...] = ()
    iterations: int = 32
    temperatures: tuple[float, ...] = (0.0,)
    device: str = "cuda"
    seed: int = 0
    quick: bool = False
    warmup: int = 1
    reps: int = 5
    min_tokens: int = MIN_TOKENS
    acceptance_prompts: int = 16  # prompts per workload for acceptance runs
    acceptance_first_prompt: int = 0  # skip the workload's first prompts (acceptance_prompts)
    acceptance_cuts: str = "none"  # one of ACCEPTANCE_CUTS (acceptance_prompts)
    acceptance_batch: int | None = None  # requests per generate() call (requests_per_call)
    top_p: float = QWEN3_TOP_P  # for temperature > 0 (greedy ignores them)
    top_k: int = QWEN3_TOP_K
    dtype: str | None = None  # "bfloat16" | "float32"; None = bf16 on GPU, fp32 on CPU
    latency: bool = True
    acceptance: bool = True
    verify_after_draft: bool = False  # see _verify_samples
    greedy_latency: bool = False  # the sampling phases timed greedy too (greedy_batches)
    rope_extension: float | None = None  # YaRN factor past the model's window (rope_extension)
    long_prompts: bool = False  # acceptance on the long windows (workloads.LONG_LENGTHS)
    tensor_parallel: int = 1  # ranks sharding the model (calibrate/tp_run.py); meta's own key

    def __post_init__(self) -> None:
        validate_plan(self)

    def verify_n_query(self) -> list[int]:
        """n_query values measured for verify/select/sample (≥ 2; 1 is the vanilla decode)."""
        values = {g + 1 for g in self.gamma} | {q for q in self.n_query if q >= 2}
        return sorted(values)

    @property
    def spec_methods(self) -> list[str]:
        return [m for m in self.methods if m in SPEC_METHODS]

    @property
    def ref_sparsity(self) -> float:
        return min(self.sparsity, key=lambda s: (abs(s - 0.07), s))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def validate_plan(plan: CalibrationPlan) -> None:
    """UserInputErrors naming the CLI option for anything the runner cannot measure."""
    if plan.weights not in ("real", "random"):
        raise UserInputError(f"unknown weights {plan.weights!r}", where="--weights",
                             fix="use real or random")
    if not plan.methods:
        raise UserInputError("no methods", where="--methods", fix="name at least one method")
    for m in plan.methods:
        check_method(m)
    for g in plan.gamma:
        check_gamma(g)
        if g + 1 > MAX_VERIFY_ROWS:
            raise UserInputError(f"gamma {g} needs {g + 1} verify rows > {MAX_VERIFY_ROWS}",
                                 where="--gamma", fix=f"use gamma <= {MAX_VERIFY_ROWS - 1}")
    for s in plan.sparsity:
        check_sparsity(s)
    for name, values in (("--batch", plan.batch), ("--context", plan.context),
                         ("--n-query", plan.n_query)):
        if not values or min(values) < 1:
            raise UserInputError(f"values must be >= 1, got {list(values)}", where=name,
                                 fix="pass positive integers")
    if max(plan.n_query) > MAX_VERIFY_ROWS:
        raise UserInputError(f"n_query {max(plan.n_query)} > {MAX_VERIFY_ROWS}", where="--n-query",
                             fix=f"the verify kernel takes at most {MAX_VERIFY_ROWS} rows")
    for t in plan.temperatures:
        if t < 0:
            raise UserInputError(f"temperature {t} < 0", where="--temperature",
                                 fix="0 is greedy; sampled runs use e.g. 0.6")
    for name, v in (("--iterations", plan.iterations), ("reps", plan.reps),
                    ("--prompts", plan.acceptance_prompts),
                    ("acceptance_batch", plan.acceptance_batch or 1),
                    ("--min-tokens", plan.min_tokens)):
        if v < 1:
            raise UserInputError(f"must be >= 1, got {v}", where=name,
                                 fix="pass a positive integer")
    if plan.warmup < 0:
        raise UserInputError("warmup must be >= 0", where="warmup", fix="pass 0 or more")
    if plan.rope_extension is not None and plan.rope_extension <= 1:
        raise UserInputError(f"YaRN factor {plan.rope_extension:g} <= 1", where="--rope-scaling",
                             fix="use e.g. yarn:4 (4x the model's trained positions)")
    if plan.acceptance_cuts not in ACCEPTANCE_CUTS:
        raise UserInputError(f"unknown acceptance cuts {plan.acceptance_cuts!r}",
                             where="--acceptance-cuts", fix=f"use one of {ACCEPTANCE_CUTS}")
    if plan.acceptance_first_prompt < 0:
        raise UserInputError(f"must be >= 0, got {plan.acceptance_first_prompt}",
                             where="--first-prompt", fix="pass 0 or more")
    _validate_tensor_parallel(plan)
    if plan.greedy_latency and latency_temperature(plan) == 0:
        raise UserInputError("--greedy-latency with every temperature 0: the grid is already "
                             "timed greedy", where="--greedy-latency",
                             fix="add a sampled temperature (--temperature 0,0.6), or drop it")
    if plan.acceptance_first_prompt and plan.acceptance_cuts != "none":
        raise UserInputError("--first-prompt with cuts: a cut's request id would name "
                             "another prompt of the workload", where="--first-prompt",
                             fix="use --acceptance-cuts none with --first-prompt")


def _validate_tensor_parallel(plan: CalibrationPlan) -> None:
    """A size >= 1 that a preset's heads and widths divide (a file's header is read later,
    before its weights: tp_run.check_group)."""
    if isinstance(plan.tensor_parallel, bool) or not isinstance(plan.tensor_parallel, int) \
            or plan.tensor_parallel < 1:
        raise UserInputError(f"must be a whole number >= 1, got {plan.tensor_parallel!r}",
                             where="--tp", fix="give e.g. --tp 2")
    if plan.model in PRESETS:
        check_tensor_parallel(PRESETS[plan.model], plan.tensor_parallel)


def parse_rope_extension(text: str) -> float:
    """'yarn:4' -> 4.0: the YaRN factor calibrate applies past the model's trained window."""
    kind, _, factor = text.partition(":")
    try:
        value = float(factor)
    except ValueError:
        value = math.nan
    if kind != "yarn" or not value > 1:
        raise UserInputError(f"cannot read {text!r}", where="--rope-scaling",
                             fix="use yarn:FACTOR with FACTOR > 1, e.g. yarn:4")
    return value


def quick_plan(model: str, *, device: str = "cuda", weights: str = "random",
               **overrides: Any) -> CalibrationPlan:
    """The `--quick` grid: few enough points for a first look in a couple of minutes."""
    base: dict[str, Any] = {
        "model": model, "weights": weights, "device": device, "quick": True,
        "gamma": (3, 7), "sparsity": (0.03, 0.07), "batch": (1, 4, 16),
        "context": (1024, 8192, 32768), "n_query": (1, 4, 8), "iterations": 8,
        "temperatures": (0.0,), "warmup": 1, "reps": 3, "acceptance_prompts": 4,
        "workloads": ("chat",) if weights == "real" else (),
    }
    base.update(overrides)
    return CalibrationPlan(**base)


def default_plan(model: str, *, device: str = "cuda", weights: str = "random",
                 **overrides: Any) -> CalibrationPlan:
    """The full grid of issue 4 (e.g. the packaged Qwen3-8B latency set, ≈ 6 H200-minutes)."""
    base: dict[str, Any] = {
        "model": model, "weights": weights, "device": device,
        "gamma": (1, 3, 7, 11, 15), "sparsity": (0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2),
        "batch": (1, 2, 4, 8, 16, 32, 64, 128),
        "context": tuple(1024 * 2**i for i in range(8)),  # 1K .. 128K
        "n_query": (1, 2, 4, 8, 12, 16), "iterations": 64, "temperatures": (0.0, 0.6),
        "warmup": 1, "reps": 3,
        "workloads": ("reasoning", "code", "chat", "longdoc") if weights == "real" else (),
    }
    base.update(overrides)
    return CalibrationPlan(**base)


def plan_from_options(
    model: str, *, weights: str = "random", methods: str | None = None,
    gamma: str | None = None, sparsity: str | None = None, batch: str | None = None,
    context: str | None = None, n_query: str | None = None, workload: str | None = None,
    iterations: int | None = None, temperature: str | None = None, device: str = "cuda",
    seed: int = 0, quick: bool = False, tensor_parallel: int = 1,
) -> CalibrationPlan:
    """A plan from CLI option strings (grid syntax of `vegas_sim.grids`); unset options keep the
    preset's value: `quick_plan` with quick=True, else `default_plan`."""
    over: dict[str, Any] = {"seed": seed, "tensor_parallel": tensor_parallel}
    if methods is not None:
        over["methods"] = tuple(grids.parse_name_list(methods, "--methods", METHODS))
    if gamma is not None:
        over["gamma"] = tuple(grids.parse_int_grid(gamma, "--gamma", maximum=MAX_VERIFY_ROWS - 1))
    if sparsity is not None:
        over["sparsity"] = tuple(grids.parse_sparsity_grid(sparsity))
    if batch is not None:
        over["batch"] = tuple(grids.parse_int_grid(batch, "--batch"))
    if context is not None:
        over["context"] = tuple(grids.parse_int_grid(context, "--context"))
    if n_query is not None:
        over["n_query"] = tuple(grids.parse_int_grid(n_query, "--n-query", maximum=MAX_VERIFY_ROWS))
    if workload is not None:
        over["workloads"] = tuple(grids.parse_name_list(workload, "--workload", WORKLOADS))
    if iterations is not None:
        over["iterations"] = iterations
    if temperature is not None:
        over["temperatures"] = tuple(grids.parse_temperature_grid(temperature))
    make = quick_plan if quick else default_plan
    return make(model, device=device, weights=weights, **over)


# ============================================================================ grid points
@dataclass(frozen=True)
class LatencyPoint:
    batch: int
    context: int

    @property
    def key(self) -> str:
        return f"latency/b{self.batch}/c{self.context}"


@dataclass(frozen=True)
class AcceptancePoint:
    method: str
    gamma: int
    sparsity: float
    temperature: float
    workload: str

    @property
    def key(self) -> str:
        return (f"acceptance/{self.method}/g{self.gamma}/s{self.sparsity:g}/"
                f"t{self.temperature:g}/{self.workload}")


def latency_points(plan: CalibrationPlan) -> list[LatencyPoint]:
    """Small points first: a quick look at the data arrives early, big ones OOM last."""
    if not plan.latency:
        return []
    pts = [LatencyPoint(b, c) for c in plan.context for b in plan.batch]
    return sorted(pts, key=lambda p: (p.batch * p.context, p.context))


def coarse_to_fine(values: Sequence[float], first: float) -> list[float]:
    """`first`, then each next value the farthest (in log scale) from those already taken:
    a run cut anywhere has covered the range as evenly as it could."""
    rest = sorted(set(values) - {first})
    order = [first]
    while rest:
        far = max(rest, key=lambda v: (min(abs(math.log(v / o)) for o in order), -v))
        order.append(far)
        rest.remove(far)
    return order


def acceptance_points(plan: CalibrationPlan) -> list[AcceptancePoint]:
    """Sparsity outermost, coarse to fine; every method × workload × temperature at each.

    They are measured in `acceptance_groups` (a method × temperature × workload's sparsities
    in one batch), in the order of each group's first point here; a resumed run measures the
    sparsities its group still lacks."""
    if not plan.acceptance or plan.weights != "real":
        return []
    gamma = max(plan.gamma)
    return [AcceptancePoint(m, gamma, s, t, w)
            for s in coarse_to_fine(plan.sparsity, plan.ref_sparsity)
            for t in plan.temperatures for w in plan.workloads for m in plan.spec_methods]


def greedy_batches(plan: CalibrationPlan) -> tuple[int, ...]:
    """The batches whose points `greedy_latency` also times greedy: every other planned batch,
    the largest always (the fits span the grid's range at about half the points)."""
    batches = sorted(plan.batch)
    return tuple(sorted({*batches[::2], batches[-1]}))


def greedy_sparsities(plan: CalibrationPlan) -> tuple[float, ...]:
    """The sparsities the greedy draft steps are timed at: the smallest and the largest (the
    draft budget's range; the sampling work does not depend on it)."""
    return tuple(sorted({min(plan.sparsity), max(plan.sparsity)}))


def latency_temperature(plan: CalibrationPlan) -> float:
    """Temperature the latency grid samples at: the largest planned one (sampling with top-p
    sorts the vocabulary, the costlier path; greedy argmax is cheaper and rarely matters)."""
    return max(plan.temperatures)


def effective_context(plan: CalibrationPlan, spec: ModelSpec, context: int) -> int:
    """The context actually measured: capped so that context + 2γ_max + 2 fits the model."""
    gamma = max([DRAFT_GAMMA, *(q - 1 for q in plan.verify_n_query())])
    from vegas_sim.calibrate.specdec import state_headroom  # torch: plan.py itself has none

    return min(context, spec.max_positions - state_headroom(gamma))
