"""Real decoding of a held-out configuration on the GPU: prompts or replayed acceptance,
waves, the steady-state window, and per-phase timers."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from vegas_sim.calibrate.replay import AcceptanceReplay
from vegas_sim.calibrate.sampling import sampling_args
from vegas_sim.calibrate.specdec import SpecConfig, SpecDecoder
from vegas_sim.calibrate.timers import PhaseTimer
from vegas_sim.calibrate.workloads import load_workload
from vegas_sim.methods import INDEX_PREP_METHODS, MIN_TOKENS, QUEST_PAGE, drafts
from vegas_sim.validate.heldout import HeldOut
from vegas_sim.validate.predict import Models
from vegas_sim.validate.results import (
    PROMPT_CUT,
    Measurement,
    acceptance_length,
    book_window,
    cut_prompt,
    long_prompts,
    pool,
    prompt_index,
    template_head,
)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def phase_means(summary: dict[str, list[float]], iterations: int, wall_ms: float,
                method: str = "") -> dict[str, float]:
    """ms per iteration of each phase of a timed window (CUDA events: device time). The
    device's idle time (wall − Σ phases: host work, syncs) is charged to 'sample', as the
    calibration grid charges it (measure_latency.with_host_gap), so both sides compare phase by phase.
    Quest's per-step page scoring runs inside the graphed draft step here, while the grid
    times it apart (quest_meta): compare Quest's draft_step + quest_meta. The quest_meta timed
    here is its metadata update after acceptance, once-per-iteration work that the grid
    records under 'other' (with the draft's index preparation), so it is moved there."""
    n = max(iterations, 1)
    per = {name: float(sum(ms)) / n for name, ms in summary.items()}
    if "quest_meta" in per:
        per["other"] = per.get("other", 0.0) + per.pop("quest_meta")
    if "other" in per and method not in INDEX_PREP_METHODS:  # no index to prepare: the
        per["draft_step"] = per.get("draft_step", 0.0) + per.pop("other")  # timer's own cost
    gap = max(wall_ms / n - sum(per.values()), 0.0)
    per["sample"] = per.get("sample", 0.0) + gap
    return per


def _window_run(decoder: Any, state: Any, device: torch.device) -> Measurement:
    """Run iterations until the first request finishes; tokens and time of that window (and,
    when the decoder's timer is enabled, its phases per iteration)."""
    emitted = lambda: sum(len(e) for e in state.emitted)
    start_tokens, iterations, first_record = emitted(), 0, len(state.records)
    decoder.timer.reset()
    _sync(device)
    t0 = time.perf_counter()
    while not state.done.any():
        decoder.step(state)
        iterations += 1
    _sync(device)
    seconds = time.perf_counter() - t0
    tokens = emitted() - start_tokens
    seqs: list[list[int]] = [[] for _ in range(state.batch)]
    for r in state.records[first_record:]:
        seqs[r.request].append(int(r.accepted))
    waves = [seqs] if any(seqs) else []  # vanilla records nothing
    phases = (phase_means(decoder.timer.summary(), iterations, 1e3 * seconds,
                          decoder.config.method)
              if decoder.timer.enabled else {})
    return Measurement(tokens, seconds, iterations, acceptance_length(waves), waves, phases)


def measure_real(model: Any, h: HeldOut, prompts: list[torch.Tensor], seed: int,
                 min_tokens: int = MIN_TOKENS, warm: bool = True,
                 sampling: tuple[float, int] = (1.0, 0), timed: bool = False) -> Measurement:
    """Prefill real prompts (cut to h.context tokens), then decode with real acceptance;
    sampling = (top_p, top_k) of sampled runs; `timed`: also time the window's phases."""
    device = next(model.parameters()).device
    decoder = _decoder(model, h, min_tokens, sampling, timed)
    gen = torch.Generator(device).manual_seed(seed)
    state = decoder.prefill_state(prompts, h.output_len, generator=gen)
    if warm:
        _warm(decoder, h, device)
    decoder.prepare_graphs(state)  # graph capture stays out of the measured window
    return _window_run(decoder, state, device)


def measure_replayed(model: Any, h: HeldOut, sequences: np.ndarray, seed: int,
                     min_tokens: int = MIN_TOKENS, warm: bool = True,
                     sampling: tuple[float, int] = (1.0, 0), timed: bool = False
                     ) -> Measurement:
    """Random KV at h.context, acceptance replayed from `sequences` [B, iterations]."""
    device = next(model.parameters()).device
    decoder = _decoder(model, h, min_tokens, sampling, timed)
    if warm:
        _warm(decoder, h, device)
    replay = AcceptanceReplay([list(map(int, row)) for row in sequences])
    max_seq = h.context + h.output_len + 2 * h.gamma + QUEST_PAGE + 2
    state = decoder.init_state(h.batch, h.context, max_seq, seed=seed, replay=replay,
                               max_new_tokens=h.output_len)
    decoder.prepare_graphs(state)
    return _window_run(decoder, state, device)


def _decoder(model: Any, h: HeldOut, min_tokens: int, sampling: tuple[float, int],
             timed: bool) -> Any:
    """h's SpecDecoder; `timed`: with an enabled PhaseTimer (CUDA events per phase, a few µs
    of host time each — kept out of the waves whose throughput is measured)."""
    device = next(model.parameters()).device
    return SpecDecoder(model, _spec_config(h, min_tokens, *sampling),
                       PhaseTimer(device) if timed else None)


def _spec_config(h: HeldOut, min_tokens: int, top_p: float = 1.0, top_k: int = 0) -> Any:
    """Sampled runs filter like the calibration did (its top-p / top-k, e.g. Qwen3's 0.95 / 20):
    the filter costs a vocabulary sort per sampled row, and it changes acceptance."""
    temperature, top_p, top_k = sampling_args(h.temperature or 0.0, top_p, top_k)
    return SpecConfig(method=h.method, gamma=h.gamma, sparsity=h.sparsity,
                      temperature=temperature, top_p=top_p, top_k=top_k, min_tokens=min_tokens)


def _warm(decoder: Any, h: HeldOut, device: torch.device) -> None:
    """One short synthetic run so that Triton compilation stays out of the measurement."""
    ctx = min(h.context, 1024)
    state = decoder.init_state(h.batch, ctx, ctx + 4 * h.gamma + QUEST_PAGE + 8, seed=1)
    for _ in range(2):
        decoder.step(state)
    _sync(device)
    del state


def prompts_for(h: HeldOut, workload_prompts: Sequence[Sequence[int]], wave: int = 0
                ) -> tuple[list[torch.Tensor], str]:
    """B prompts of exactly h.context tokens for wave `wave`, and a note ('' if natural).

    Natural text only: prompts at least h.context long (the nearest ones, `results.PROMPT_CUT`),
    cut to h.context tokens, taken in turn (wave w, request b → long prompt (w·B + b) mod n),
    so that waves see other prompts. A book window (longdoc, recall) keeps its first tokens; a
    request that ends on its instruction and the assistant's turn (every other workload) keeps
    its template head and its last tokens, so that it stays a chat turn the model answers.
    Repeating a short prompt to reach the context (the old
    behaviour) makes degenerate, copyable text whose acceptance is not the traced workload's;
    it is done only when no prompt is long enough, and the note says so.
    """
    long, note = long_prompts(h, workload_prompts, PROMPT_CUT)
    keep_end = not book_window(h)
    head = template_head(workload_prompts) if PROMPT_CUT == "nearest" else 0
    out = [torch.tensor(cut_prompt(long[k], h.context, keep_end, head), dtype=torch.long)
           for k in prompt_index(h, len(long), wave + 1)[wave]]
    return out, note


def measure_config(runtime_model: Any, h: HeldOut, acceptance: Any, weights: str, seed: int,
             i: int, models: Models, phase_wave: bool = False) -> tuple[Measurement, str]:
    """All waves of one configuration, pooled; the first wave pays the warm-up. `phase_wave`:
    one more wave (other prompts / draws) with per-phase timers, not pooled: its phases per
    iteration go to the pooled measurement's `phase_ms`."""
    waves = [_wave(runtime_model, h, acceptance, weights, seed, i, w, models)
             for w in range(h.waves)]
    note = waves[0][1]
    m = pool([w for w, _ in waves])
    if phase_wave:
        timed, _ = _wave(runtime_model, h, acceptance, weights, seed, i, h.waves, models,
                         timed=True)
        m.phase_ms = timed.phase_ms
    return m, note


def _wave(runtime_model: Any, h: HeldOut, acceptance: Any, weights: str, seed: int, i: int,
          w: int, models: Models, timed: bool = False) -> tuple[Measurement, str]:
    """Wave w of configuration i: its own prompts (real) or accept draws (replay)."""
    run_seed = seed + 1000 * i + w
    if weights == "random":
        rng = np.random.default_rng([seed, i, w])
        dist = acceptance.lookup(h.method, h.gamma, h.sparsity, h.context, h.workload,
                                 h.temperature or 0.0, output_len=h.output_len
                                 ) if drafts(h.method) else None
        n_iter = h.output_len + 1
        seqs = (dist.sample(rng, h.batch, n_iter) if dist is not None
                else np.zeros((h.batch, n_iter), dtype=np.int64))
        return measure_replayed(runtime_model, h, seqs, run_seed, models.min_tokens,
                                warm=w == 0, sampling=models.sampling, timed=timed), ""
    prompts, note = prompts_for(h, load_workload(h.workload or "longdoc"), w)
    return measure_real(runtime_model, h, prompts, run_seed, models.min_tokens, warm=w == 0,
                        sampling=models.sampling, timed=timed), note
