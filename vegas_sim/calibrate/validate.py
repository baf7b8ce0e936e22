"""`vegas-sim validate`: real decoding at held-out configurations vs the simulator's prediction.

Both regimes of DESIGN.md run through `run_validation`:
- real weights (SmolLM2): prompts from a workload, real acceptance, end to end;
- random weights (Qwen3-8B shape): the KV cache starts at the held-out context with random
  entries (no 128K prefill), and the accept/reject decisions are replayed from block-bootstrapped
  *real* traces (the same sampler the simulator uses), so the real kernels, batching and
  rollback run at scale with realistic acceptance.

Throughput is measured the way the simulator defines it for a closed batch of B requests that
start together (sim/metrics.py: steady-state window = from the first iteration to the end of
the iteration in which the first request finishes; tokens emitted in that window / its time).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from vegas_sim.errors import UserInputError
from vegas_sim.methods import MIN_TOKENS, QUEST_PAGE
from vegas_sim.sim.heldout import (
    HeldOut,
    check_outside_grid,
    grid_of,
    random_heldout,
    read_heldout,
    write_heldout,
)

ProgressFn = Callable[[int, int, str], None]


@dataclasses.dataclass
class Measurement:
    tokens: int
    seconds: float
    iterations: int
    acceptance_length: float

    @property
    def throughput(self) -> float:
        return self.tokens / self.seconds


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _window_run(decoder: Any, state: Any, device: torch.device) -> Measurement:
    """Run iterations until the first request finishes; tokens and time of that window."""
    emitted = lambda: sum(len(e) for e in state.emitted)  # noqa: E731
    start_tokens, iterations = emitted(), 0
    _sync(device)
    t0 = time.perf_counter()
    while not state.done.any():
        decoder.step(state)
        iterations += 1
    _sync(device)
    seconds = time.perf_counter() - t0
    tokens = emitted() - start_tokens
    per_iter = tokens / max(iterations * state.batch, 1)
    return Measurement(tokens, seconds, iterations, per_iter)


def measure_real(model: Any, h: HeldOut, prompts: list[torch.Tensor], seed: int,
                 min_tokens: int = MIN_TOKENS) -> Measurement:
    """Prefill real prompts (cut to h.context tokens), then decode with real acceptance."""
    from vegas_sim.calibrate.specdec import SpecDecoder

    device = next(model.parameters()).device
    decoder = SpecDecoder(model, _spec_config(h, min_tokens))
    gen = torch.Generator(device).manual_seed(seed)
    state = decoder.prefill_state(prompts, h.output_len, generator=gen)
    _warm(decoder, h, device)
    return _window_run(decoder, state, device)


def measure_replayed(model: Any, h: HeldOut, sequences: np.ndarray, seed: int,
                     min_tokens: int = MIN_TOKENS) -> Measurement:
    """Random KV at h.context, acceptance replayed from `sequences` [B, iterations]."""
    from vegas_sim.calibrate.replay import AcceptanceReplay
    from vegas_sim.calibrate.specdec import SpecDecoder

    device = next(model.parameters()).device
    decoder = SpecDecoder(model, _spec_config(h, min_tokens))
    _warm(decoder, h, device)
    replay = AcceptanceReplay([list(map(int, row)) for row in sequences])
    max_seq = h.context + h.output_len + 2 * h.gamma + QUEST_PAGE + 2
    state = decoder.init_state(h.batch, h.context, max_seq, seed=seed, replay=replay,
                               max_new_tokens=h.output_len)
    return _window_run(decoder, state, device)


def _spec_config(h: HeldOut, min_tokens: int) -> Any:
    from vegas_sim.calibrate.specdec import SpecConfig

    return SpecConfig(method=h.method, gamma=h.gamma, sparsity=h.sparsity,
                      temperature=h.temperature, min_tokens=min_tokens)


def _warm(decoder: Any, h: HeldOut, device: torch.device) -> None:
    """One short synthetic run so that Triton compilation stays out of the measurement."""
    ctx = min(h.context, 1024)
    state = decoder.init_state(h.batch, ctx, ctx + 4 * h.gamma + QUEST_PAGE + 8, seed=1)
    for _ in range(2):
        decoder.step(state)
    _sync(device)
    del state


def _prompts_for(h: HeldOut, tokenizer_prompts: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """B prompts of exactly h.context tokens, from long workload prompts (repeated if short)."""
    out = []
    for b in range(h.batch):
        ids = list(tokenizer_prompts[b % len(tokenizer_prompts)])
        while len(ids) < h.context:
            ids = ids + ids
        out.append(torch.tensor(ids[: h.context], dtype=torch.long))
    return out


def choose_heldout(
    heldout_file: Path | None, n_random: int | None, grid: dict[str, list[Any]], *,
    seed: int, max_batch: int, contexts: tuple[int, int], output_len: int,
    max_tokens: int | None, workloads: Sequence[str | None],
) -> list[HeldOut]:
    if heldout_file is not None:
        chosen = read_heldout(heldout_file)
    else:
        assert n_random is not None
        rng = np.random.default_rng(seed)
        chosen = random_heldout(n_random, grid, rng, batches=(1, max_batch), contexts=contexts,
                                output_len=output_len, max_tokens=max_tokens,
                                workloads=workloads)
    check_outside_grid(chosen, grid)
    return chosen


def run_validation(
    *, traces: Path, acceptance_traces: Path | None, heldout_file: Path | None,
    n_random: int | None, model: str, weights: str, max_batch: int,
    contexts: tuple[int, int], output_len: int, device: str, seed: int, out: Path,
    progress: ProgressFn | None = None, replications: int = 5,
) -> pd.DataFrame:
    """Measure and predict every held-out configuration; write and return the result table."""
    from vegas_sim import api
    from vegas_sim.calibrate.runtime import load_model
    from vegas_sim.sim.acceptance import AcceptanceModel
    from vegas_sim.sim.predict import Scenario, predict
    from vegas_sim.traces.io import load_trace_set

    latency_set = load_trace_set(traces)
    acc_set = load_trace_set(acceptance_traces) if acceptance_traces else latency_set
    if acc_set.weights_kind != "real":
        raise UserInputError("the acceptance trace set has random weights",
                             where=str(acc_set.path),
                             fix="pass --acceptance-traces with a real-weights trace set")
    latency = api.fit_latency(latency_set)
    acceptance = AcceptanceModel.from_traces(acc_set.acceptance, acc_set.weights_kind)
    spec_max = int(latency_set.meta["model"]["max_positions"])
    # The budget floor the acceptance was traced with: real runs and predictions use it too.
    min_tokens = int(acc_set.meta.get("grid", {}).get("min_tokens", MIN_TOKENS))
    lo, hi = contexts[0], min(contexts[1], spec_max - output_len - 64)
    # Real runs decode real prompts: the acceptance predicted is that workload's. Random
    # weights replay acceptance pooled over the traced workloads.
    traced = sorted(str(w) for w in acc_set.acceptance["workload"].unique())
    workloads: list[str | None] = (
        [None] if weights == "random" else list(traced) or ["longdoc"])
    torch_device = torch.device(device)
    mem = (torch.cuda.get_device_properties(torch_device).total_memory
           if torch_device.type == "cuda" else 16 << 30)
    spec = latency.model
    max_tokens = int(0.8 * (mem - spec.weight_bytes()) / spec.kv_bytes_per_token())
    heldout = choose_heldout(heldout_file, n_random, grid_of(latency_set.meta), seed=seed,
                             max_batch=max_batch, contexts=(lo, hi), output_len=output_len,
                             max_tokens=max_tokens, workloads=workloads)
    write_heldout(heldout, out.with_suffix(".heldout.csv"))

    runtime_model, tokenizer, _ = load_model(model, weights=weights, device=device, seed=seed)
    rows = []
    for i, h in enumerate(heldout):
        if progress:
            progress(i, len(heldout), h.label)
        # A real run's first token comes from the prefill; the simulator's decode instance
        # (disaggregated prefill) generates all output_len tokens in iterations.
        out_len = h.output_len if weights == "random" else h.output_len - 1
        sc = Scenario(method=h.method, gamma=h.gamma, sparsity=h.sparsity, batch=h.batch,
                      context=h.context, output_len=out_len, requests=h.batch,
                      workload=h.workload, temperature=h.temperature, min_tokens=min_tokens)
        pred = predict([sc], latency, acceptance, seed=seed, replications=replications).iloc[0]
        rng = np.random.default_rng([seed, i])
        if weights == "random":
            dist = acceptance.lookup(h.method, h.gamma, h.sparsity, h.context, h.workload,
                                     h.temperature) if h.method != "vanilla" else None
            n_iter = h.output_len + 1
            seqs = (dist.sample(rng, h.batch, n_iter) if dist is not None
                    else np.zeros((h.batch, n_iter), dtype=np.int64))
            m = measure_replayed(runtime_model, h, seqs, seed + i, min_tokens)
        else:
            from vegas_sim.calibrate.workloads import load_workload

            prompts = _prompts_for(h, load_workload(h.workload or "longdoc"))
            m = measure_real(runtime_model, h, prompts, seed + i, min_tokens)
        rows.append(_result_row(h, pred, m, weights))
        pd.DataFrame(rows).to_csv(out, index=False)  # nothing lost if interrupted
    if progress:
        progress(len(heldout), len(heldout), "done")
    table = pd.DataFrame(rows)
    table.to_csv(out, index=False)
    return table


def _result_row(h: HeldOut, pred: pd.Series, m: Measurement, weights: str) -> dict[str, Any]:
    predicted = float(pred["throughput_tok_s"])
    return {
        **dataclasses.asdict(h),
        "regime": "real-weights" if weights == "real" else "random-weights+replay",
        "predicted": predicted,
        "measured": m.throughput,
        "error_pct": 100.0 * (predicted - m.throughput) / m.throughput,
        "ci_low": float(pred["throughput_ci_low"]),
        "ci_high": float(pred["throughput_ci_high"]),
        "predicted_acceptance_length": float(pred["acceptance_length"]),
        "measured_acceptance_length": m.acceptance_length,
        "measured_iterations": m.iterations,
        "measured_seconds": m.seconds,
        "predicted_iter_ms": float(pred["iter_ms"]),
        "measured_iter_ms": 1000.0 * m.seconds / max(m.iterations, 1),
        "extrapolated": str(pred.get("extrapolated") or ""),
    }


def summarize(table: pd.DataFrame) -> str:
    lines = []
    for regime, g in table.groupby("regime"):
        err = g["error_pct"].abs()
        lines.append(f"{regime}: {len(g)} configurations, |error| median {err.median():.1f} %, "
                     f"max {err.max():.1f} %")
    return "\n".join(lines)
