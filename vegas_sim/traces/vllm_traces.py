"""An acceptance trace set from vLLM's per-step acceptance (`import-vllm --trace-set DIR`).

A vLLM server started with `--per-request-spec-decode-metrics detailed` reports, per request,
the accepted draft count of every verification step (`per_step_accepted`, with
`per_step_drafted`): exactly the `accepted` column of an acceptance trace
(schema.ACCEPTANCE_SCHEMA), one row per (request, step). What vLLM does not report is filled
so (docs/VLLM_IMPORT.md):

- context: the request's prompt (`usage.prompt_tokens`) plus the tokens of the steps before
  (accepted + 1 each), the same bookkeeping as calibrate's (methods.py: t0 not yet in the KV).
- accept_prob: the 1/0 outcome per position (1 for the accepted prefix, 0 after), what
  calibrate records under greedy; vLLM does not report min(1, p/q), so at temperature > 0 the
  acceptance model's rates are the empirical ones, not Rao-Blackwellised.
- budget: methods.budget of the sparsity given, over the model preset's positions.
- A step that drafted fewer than γ tokens (per_step_drafted < γ: near the length limit, or
  structured output) cannot be a γ-row and is left out; its tokens still advance the context.

The set has real weights and no latency rows; meta.json's `imported` says where the rows came
from, and its `gpu` holds placeholder numbers (the schema requires them; no GPU was measured
by vegas-sim), so it serves as an acceptance set only.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import vegas_sim
from vegas_sim.errors import UserInputError
from vegas_sim.files import sha256_file
from vegas_sim.methods import budget
from vegas_sim.models import get_preset
from vegas_sim.traces.io import TraceSet, TraceSetWriter
from vegas_sim.traces.schema import SCHEMA_VERSION
from vegas_sim.traces.vllm_import import ImportOptions, RequestRecord

# meta.json requires positive GPU numbers; an imported set measured none (see module doc).
PLACEHOLDER_GPU: dict[str, Any] = {
    "name": "not measured (acceptance imported from vLLM)", "sm_count": 1, "memory_gb": 1.0,
    "copy_bandwidth_gbs": 1.0, "bf16_tflops": 1.0, "placeholder": True,
}
DEFAULT_WORKLOAD = "vllm"
_DETAILED = "start the vLLM server with --per-request-spec-decode-metrics detailed"


def _require(opts: ImportOptions) -> tuple[float, float, str]:
    """(sparsity, temperature, model) — a trace row needs each."""
    missing = [o for o, v in (("--sparsity", opts.sparsity), ("--temperature", opts.temperature),
                              ("--model", opts.model)) if v is None]
    if missing:
        raise UserInputError(f"a trace set needs {', '.join(missing)}", where="--trace-set",
                             fix="pass the sparsity the server drafted at, the sampling "
                                 "temperature and the model preset (every trace row holds them)")
    assert opts.sparsity is not None and opts.temperature is not None and opts.model is not None
    return opts.sparsity, opts.temperature, opts.model


def _check_detailed(requests: Sequence[RequestRecord]) -> None:
    for r in requests:
        if r.per_step_accepted is None:
            raise UserInputError("a trace set needs per_step_accepted in every response; this "
                                 "one has none (a 'summary' response)", where=r.where,
                                 fix=f"{_DETAILED}, or import anchors only (no --trace-set)")
        if r.prompt_tokens is None:
            raise UserInputError("a trace set needs usage.prompt_tokens (the context of the "
                                 "first step)", where=r.where,
                                 fix="keep the responses' usage object (streaming: set "
                                     "stream_options.include_usage)")


def acceptance_rows(requests: Sequence[RequestRecord], opts: ImportOptions, max_positions: int
                    ) -> tuple[pd.DataFrame, int]:
    """(rows of schema.ACCEPTANCE_SCHEMA, steps left out for drafting fewer than γ)."""
    sparsity, temperature, _ = _require(opts)
    gamma = opts.gamma
    cols: dict[str, list[Any]] = {k: [] for k in ("context", "request", "iteration", "accepted",
                                                   "accept_prob")}
    skipped = 0
    for index, r in enumerate(requests):
        accepted = np.asarray(r.per_step_accepted, dtype=np.int64)  # [steps]
        drafted = (np.full(len(accepted), gamma) if r.per_step_drafted is None
                   else np.asarray(r.per_step_drafted, dtype=np.int64))
        if (accepted > gamma).any():
            raise UserInputError(f"a step accepted {int(accepted.max())} drafts, --gamma is "
                                 f"{gamma}", where=r.where,
                                 fix="pass the server's num_speculative_tokens as --gamma")
        context = (r.prompt_tokens or 0) + np.cumsum(accepted + 1) - (accepted + 1)  # [steps]
        full = drafted == gamma
        skipped += int((~full).sum())
        for step in np.flatnonzero(full):
            a = int(accepted[step])
            cols["context"].append(int(context[step]))
            cols["request"].append(index)
            cols["iteration"].append(int(step))
            cols["accepted"].append(a)
            cols["accept_prob"].append(np.array([1.0] * a + [0.0] * (gamma - a), np.float32))
    n = len(cols["accepted"])
    if n == 0:
        raise UserInputError(f"no step drafted all {gamma} tokens", where="--trace-set",
                             fix="pass the server's num_speculative_tokens as --gamma")
    ctx = np.asarray(cols["context"], dtype=np.int64)
    frame = pd.DataFrame({
        "method": [opts.method] * n, "gamma": np.full(n, gamma), "sparsity": np.full(n, sparsity),
        "budget": budget(sparsity, ctx + 1, max_positions), "context": np.maximum(ctx, 1),
        "temperature": np.full(n, temperature),
        "workload": [opts.workload or DEFAULT_WORKLOAD] * n,
        "request": np.asarray(cols["request"], dtype=np.int64),
        "iteration": np.asarray(cols["iteration"], dtype=np.int64),
        "accepted": np.asarray(cols["accepted"], dtype=np.int64),
        "accept_prob": cols["accept_prob"], "model_weights": ["real"] * n,
    })
    return frame, skipped


def _meta(opts: ImportOptions, source: Path, skipped: int, n_requests: int) -> dict[str, Any]:
    spec = get_preset(opts.model or "")
    return {
        "schema_version": SCHEMA_VERSION,
        "model": {**spec.to_dict(),
                  "weights": {"kind": "real", "id": f"served by vLLM ({source.name})",
                              "sha256": ""}},
        "gpu": dict(PLACEHOLDER_GPU),
        "software": {"vegas_sim": getattr(vegas_sim, "__version__", "dev"),
                     "generator": "vegas_sim.traces.vllm_traces"},
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "grid": {"methods": [opts.method], "gamma": [opts.gamma], "sparsity": [opts.sparsity],
                 "temperature": [opts.temperature]},
        "workload": [opts.workload or DEFAULT_WORKLOAD],
        "seeds": {},
        "imported": {"from": "vllm responses (metrics.speculative_decoding, detailed)",
                     "file": str(source), "sha256": sha256_file(source),
                     "requests": n_requests, "steps_left_out_drafted_fewer_than_gamma": skipped,
                     "accept_prob": "1/0 outcomes (vLLM does not report min(1, p/q))"},
    }


def write_trace_set(out: Path, source: Path, requests: Sequence[RequestRecord],
                    opts: ImportOptions) -> tuple[TraceSet, int]:
    """Write the acceptance trace set of `requests` to the new directory `out`; returns it
    and the number of steps left out (drafted fewer than γ)."""
    _require(opts)
    _check_detailed(requests)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserInputError(f"{str(out)!r} exists and is not an empty directory",
                             where="--trace-set", fix="name a new directory")
    spec = get_preset(opts.model or "")
    rows, skipped = acceptance_rows(requests, opts, spec.max_positions)
    writer = TraceSetWriter(out, _meta(opts, source, skipped, len(requests)))
    key = f"acceptance/{opts.method}"
    writer.append_acceptance(rows, key=key)
    writer.mark_done(key)
    return writer.finalize(), skipped
