"""The experiment that drives both halves, `vegas-sim validate`: real decoding at held-out configurations vs the simulator's prediction.

Both regimes of DESIGN.md run through `run_validation`:
- real weights (SmolLM2): prompts from a workload, real acceptance, end to end;
- random weights (Qwen3-8B shape): the KV cache starts at the held-out context with random
  entries (no 128K prefill), and the accept/reject decisions are replayed from block-bootstrapped
  *real* traces (the same sampler the simulator uses), so the real kernels, batching and
  rollback run at scale with realistic acceptance.

Each configuration runs `waves` closed batches one after the other (other prompts, or other
replayed draws) and pools them. Every result row carries three predictions:
- `predicted_sim`: `predict` from the trace sets alone (acceptance from the acceptance model);
- `predicted_replay`: the simulator fed the run's own accept counts (`measured_accepted`,
  hex-encoded): acceptance identical, so its error is the latency model's and the batching's;
- `predicted`: the one the targets are judged on — `predicted_sim` for real weights,
  `predicted_replay` for the replay regime, whose acceptance is itself a draw from the
  acceptance model (an input, like an arrival trace).
`acceptance_error_pct` and `iter_time_error_pct` split the error into its two factors, and
one extra timed wave per configuration (`phase_wave`) splits the iteration time by phase
(`measured_phase_ms` vs the latency model's `predicted_phase_ms`). Predictions simulate at
least MIN_SIMULATED_REQUESTS requests, so that they estimate the expected throughput rather
than another draw of a run as small as the measured one.
`repredict` recomputes every prediction of an old table with the current simulator.

Throughput is measured the way the simulator defines it for a closed batch of B requests that
start together (sim/metrics.py: steady-state window = from the first iteration to the end of
the iteration in which the first request finishes; tokens emitted in that window / its time).

Modules: `heldout` (the configurations), `measure` (real decoding on the GPU; imports torch),
`predict` (the simulator's predictions for a row), `results` (result rows and their
summaries), `run` (the whole experiment) and `repredict` (new predictions for an old table,
CPU only).
"""
