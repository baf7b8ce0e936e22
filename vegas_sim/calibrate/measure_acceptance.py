"""Measuring acceptance (real weights only): for each method × sparsity × temperature ×
workload, SpecDecoder's own loop (`prefill_state`, then `step` exactly `iterations` times)
at the largest γ of the plan (the simulator walks the runs again at a smaller γ) over the
workload's prompts; one row per (request, iteration). A method × temperature × workload's sparsities
decode as one batch, each request drafting at its own sparsity (`measure_acceptance_group`):
acceptance is host-bound, so 8 sparsities cost little more than one (the grid's GPU time:
docs/RESULTS.md, Calibration)."""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Sequence
from typing import Any

import pandas as pd
import torch

from vegas_sim.calibrate import hardware
from vegas_sim.calibrate.measure_latency import model_dtype_bytes
from vegas_sim.calibrate.plan import AcceptancePoint, CalibrationPlan
from vegas_sim.calibrate.sampling import sampling_args
from vegas_sim.calibrate.specdec import SpecConfig, SpecDecoder, state_headroom
from vegas_sim.calibrate.workloads import load_workload
from vegas_sim.errors import UserInputError
from vegas_sim.models import ModelSpec
from vegas_sim.traces.schema import (
    ACCEPTANCE_SCHEMA,
    MAX_EXACT_BUCKETS,
)

# Requests per acceptance generate() call (CalibrationPlan.acceptance_batch = None): on CUDA a
# group's 8 sparsities x 16 prompts decode as one batch.
ACCEPTANCE_BATCH_GPU = 128


ACCEPTANCE_BATCH_CPU = 8


# ============================================================================ acceptance point
def _stable_seed(base: int, key: str) -> int:
    return (base * 1_000_003 + zlib.crc32(key.encode())) % (2**63 - 1)


MAX_CUT_LEVELS = MAX_EXACT_BUCKETS  # a workload of at most this many prompt lengths is cut


def acceptance_max_new(plan: CalibrationPlan, gamma: int) -> int:
    """Tokens each request may emit: enough that no request stops before `iterations`."""
    return plan.iterations * (gamma + 1)


def acceptance_prompts(plan: CalibrationPlan, spec: ModelSpec, workload: str,
                       gamma: int) -> list[list[int]]:
    """The prompts of the workload's acceptance runs (a run's `request` is
    `acceptance_first_prompt` + its index here): `acceptance_prompts` of those that leave room
    for the output, from the `acceptance_first_prompt`-th on, then their cuts (`cut_prompts`),
    as `plan.acceptance_cuts` says: "add" both, "none" no cuts, "only" the cuts alone (to
    extend an older set with `traces merge`). A first prompt past 0 runs a workload's later
    prompts (windows appended to it) under their own request ids, so `traces merge` adds them
    to a set that ran the earlier ones."""
    room = spec.max_positions - acceptance_max_new(plan, gamma) - state_headroom(gamma)
    prompts = [p for p in load_workload(workload, model=spec.name, max_len=room,
                                        long=plan.long_prompts) if len(p) >= 2]
    if not prompts:
        raise UserInputError(
            f"workload {workload!r} has no prompt of 2..{room} tokens for {spec.name}",
            where="--workload", fix="lower --iterations or --gamma, or pick another workload")
    first = plan.acceptance_first_prompt
    if first >= len(prompts):
        raise UserInputError(
            f"workload {workload!r} has {len(prompts)} prompts of 2..{room} tokens; the first "
            f"one asked for is number {first}", where="--first-prompt",
            fix=f"pass a number below {len(prompts)}")
    natural = prompts[first:first + plan.acceptance_prompts]
    windows = len({len(p) for p in prompts}) <= MAX_CUT_LEVELS
    cuts = cut_prompts(natural) if windows and plan.acceptance_cuts != "none" else []
    if plan.acceptance_cuts == "only":
        if not cuts:
            raise UserInputError(
                f"workload {workload!r} has nothing to cut: its prompts are not windows of "
                f"at most {MAX_CUT_LEVELS} lengths, or the ones taken have one length",
                where="--acceptance-cuts", fix="use --acceptance-cuts add or none here")
        return cuts
    return natural + cuts


def cut_prompts(prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    """Every prompt cut to each shorter prompt length of the set, length by length. For
    workloads of windows cut from long texts (at most MAX_CUT_LEVELS lengths, like longdoc's
    1K/2K/4K/7K), not for free-form prompts.

    Why one would: a workload at context C means every prompt at least C long, cut to C
    (what `validate` runs), while the natural prompts give a context bucket only the windows
    made at that length. Not the default: on SmolLM2 longdoc the cuts made regime (a)'s
    validation error worse, not better — windows differ by more than contexts do, and cutting
    the same few windows adds little that is new. The longdoc
    workload has more windows per length instead (workloads.LONGDOC_PER_LENGTH).
    """
    levels = sorted({len(p) for p in prompts})
    return [list(p[:n]) for n in levels for p in prompts if len(p) > n]


def acceptance_groups(points: Sequence[AcceptancePoint]) -> list[list[AcceptancePoint]]:
    """Points that differ only in sparsity, grouped in the order each group's first point
    comes: one batch decodes a group, each request at its own sparsity."""
    groups: dict[tuple[str, int, float, str], list[AcceptancePoint]] = {}
    for p in points:
        groups.setdefault((p.method, p.gamma, p.temperature, p.workload), []).append(p)
    return list(groups.values())


def requests_per_call(plan: CalibrationPlan, model: Any, max_seq: int) -> int:
    """Requests one acceptance generate() call decodes: plan.acceptance_batch, or by default
    ACCEPTANCE_BATCH_GPU on CUDA (acceptance is host-bound: a bigger batch costs the GPU little
    and saves whole iterations of host work) and ACCEPTANCE_BATCH_CPU on the CPU; halved until
    the state fits in free memory (`model`: the loaded runtime model — spec, device, dtype)."""
    n = plan.acceptance_batch or (ACCEPTANCE_BATCH_GPU if model.device.type == "cuda"
                                  else ACCEPTANCE_BATCH_CPU)
    while n > 1 and not hardware.fits_in_memory(model.spec, n, max_seq, model.device,
                                                include_weights=False,
                                                dtype_bytes=model_dtype_bytes(model)):
        n //= 2
    return n


def measure_acceptance_group(model: Any, plan: CalibrationPlan, group: list[AcceptancePoint],
                             prompts: list[list[int]]) -> dict[str, pd.DataFrame]:
    """Acceptance rows of `iterations` iterations per prompt for every point of `group` (one
    method, γ, temperature and workload; sparsities differ), keyed by point key.

    Every (prompt, sparsity) is one request; requests go prompt-major (a prompt's copies are
    neighbours, so its prefill is one batched forward) in calls of `requests_per_call`.
    Drives SpecDecoder's own loop (prefill_state, then step) for exactly `iterations`
    iterations, so slow-accepting requests do not run longer than fast ones. Acceptance of a
    request does not depend on its batch-mates (a test checks it against one point alone).
    """
    head = group[0]
    temp, top_p, top_k = sampling_args(head.temperature, plan.top_p, plan.top_k)
    cfg = SpecConfig(method=head.method, gamma=head.gamma, sparsity=head.sparsity,
                     min_tokens=plan.min_tokens, temperature=temp, top_p=top_p, top_k=top_k)
    dec = SpecDecoder(model, cfg)
    group_key = f"acceptance/{head.method}/g{head.gamma}/t{head.temperature:g}/{head.workload}"
    gen = torch.Generator(device=model.device).manual_seed(_stable_seed(plan.seed, group_key))
    max_new = acceptance_max_new(plan, head.gamma)
    max_seq = max(len(p) for p in prompts) + max_new + state_headroom(head.gamma)
    requests = [(i, p) for i in range(len(prompts)) for p in group]  # prompt-major
    per_call = requests_per_call(plan, model, max_seq)
    rows: dict[str, list[dict[str, Any]]] = {p.key: [] for p in group}
    for start in range(0, len(requests), per_call):
        chunk = requests[start:start + per_call]
        with torch.no_grad():
            state = dec.prefill_state(
                [torch.tensor(prompts[i], dtype=torch.long) for i, _ in chunk], max_new,
                generator=gen, sparsity=[p.sparsity for _, p in chunk])
            for _ in range(plan.iterations):
                dec.step(state)
        if overflows := dec.tie_overflow_rows(state):
            warnings.warn(f"{group_key}: {overflows} sampled rows had more tokens tied at the "
                          f"top-{top_k} logit than the sampler's slots hold (calibrate/"
                          "sampling.py TIE_SLACK_MIN): those rows sampled from the tie group's "
                          "first members only", stacklevel=2)
        for r in state.records:
            if r.iteration >= plan.iterations:
                continue
            prompt, point = chunk[r.request]
            rows[point.key].append({
                "method": point.method, "gamma": point.gamma, "sparsity": point.sparsity,
                "budget": r.budget, "context": r.context, "temperature": point.temperature,
                "workload": point.workload, "request": plan.acceptance_first_prompt + prompt,
                "iteration": r.iteration, "accepted": r.accepted,
                "accept_prob": [float(x) for x in r.accept_prob], "model_weights": "real",
            })
        del state
    return {k: pd.DataFrame(v, columns=ACCEPTANCE_SCHEMA.names) for k, v in rows.items()}
