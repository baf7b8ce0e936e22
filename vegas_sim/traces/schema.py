"""Trace-set contract, schema v1 (DESIGN.md, "Trace set").

A trace set is a directory with `meta.json`, `latency.parquet` and `acceptance.parquet`.
This module only *describes* the contract; `traces/io.py` reads, writes and validates it.
"""

from __future__ import annotations

from typing import NamedTuple

import pyarrow as pa

from vegas_sim.methods import METHODS
from vegas_sim.models import DTYPE_BYTES

SCHEMA_VERSION = 1

META_FILE = "meta.json"
LATENCY_FILE = "latency.parquet"
ACCEPTANCE_FILE = "acceptance.parquet"
RUN_LOG_FILE = "run_log.json"  # how the set was measured: sessions, GPU time, overhead
DATA_FILES = (LATENCY_FILE, ACCEPTANCE_FILE)
# The columns that name one acceptance grid point (its rows are that point's requests).
LATENCY_METHODS: tuple[str, ...] = (*METHODS, "any")  # "any": a method-independent phase
ACCEPTANCE_POINT_KEYS = ("method", "gamma", "sparsity", "temperature", "workload")
# A workload of at most this many distinct prompt lengths is windows of long texts: calibrate
# cuts them into context buckets, and the acceptance model keeps that many buckets exact.
MAX_EXACT_BUCKETS = 12

# One row per measured point.
LATENCY_SCHEMA = pa.schema([
    ("phase", pa.string()),  # one of methods.PHASES
    ("method", pa.string()),  # one of methods.METHODS ("any" for method-independent phases)
    ("batch", pa.int64()),
    ("context", pa.int64()),  # tokens in each request's KV cache at the start of the phase
    ("n_query", pa.int64()),  # query rows per request
    ("kv_read", pa.int64()),  # KV entries attended per request (pages scored for quest_meta)
    ("collect_rows", pa.int64()),  # score rows written out by the verify kernel
    ("ms_median", pa.float64()),
    ("ms_p10", pa.float64()),
    ("ms_p90", pa.float64()),
    ("n", pa.int64()),  # timed repetitions behind the three statistics
    # Tensor-parallel collectives of one call of the phase (0 on one GPU): calls and payload
    # bytes one rank issued, and their time = ms_median - ms_median of the same phase timed
    # with the collectives made no-ops (calibrate/tp_run.py), 0 where there are none.
    ("collective_calls", pa.int64()),
    ("collective_bytes", pa.int64()),
    ("collective_ms", pa.float64()),
    # The sampling temperature the row's phase ran at (0 = greedy: argmax, no top-k / top-p
    # filter, no draw); UNRECORDED_TEMPERATURE in sets from before the column: the grid's
    # latency_temperature (meta.json), the one temperature such a set measured at.
    ("temperature", pa.float64()),
])
UNRECORDED_TEMPERATURE = -1.0
# The phases whose work depends on greedy vs sampled decoding (calibrate times them in both
# modes when asked; the rest run the same kernels either way).
SAMPLING_PHASES = ("draft_step", "sample")
GREEDY, SAMPLED = "greedy", "sampled"


def sampling_mode(temperature: float | None) -> str:
    """'greedy' at temperature 0 (argmax: no filter, no draw), else 'sampled'."""
    return GREEDY if not temperature else SAMPLED
# Columns a table may lack (sets measured on one GPU, or at one temperature, before they
# existed): read as these.
LATENCY_DEFAULTS: dict[str, int | float] = {
    "collective_calls": 0, "collective_bytes": 0, "collective_ms": 0.0,
    "temperature": UNRECORDED_TEMPERATURE}

# One row per (request, iteration).
ACCEPTANCE_SCHEMA = pa.schema([
    ("method", pa.string()),
    ("gamma", pa.int64()),
    ("sparsity", pa.float64()),
    ("budget", pa.int64()),
    ("context", pa.int64()),  # the request's context at the start of the iteration
    ("temperature", pa.float64()),  # 0 = greedy
    ("workload", pa.string()),
    ("request", pa.int64()),
    ("iteration", pa.int64()),
    ("accepted", pa.int64()),  # accepted drafts, 0..gamma (acceptance length = accepted + 1)
    ("accept_prob", pa.list_(pa.float32())),  # min(1, p/q) per drafted position, length gamma
    ("model_weights", pa.string()),  # "real" | "random"
])

SCHEMAS = {LATENCY_FILE: LATENCY_SCHEMA, ACCEPTANCE_FILE: ACCEPTANCE_SCHEMA}

# meta.json: required top-level keys and what they hold.
META_KEYS = {
    "schema_version": "int, == SCHEMA_VERSION",
    "model": "ModelSpec.to_dict() plus 'weights': {'kind': 'real'|'random', 'id': str, 'sha256': str}",
    "gpu": "{'name', 'sm_count', 'memory_gb', 'copy_bandwidth_gbs', 'bf16_tflops'} measured in the run",
    "software": "{'python', 'torch', 'triton', 'vegas_sim', 'runtime', 'score_format', ...}",
    "date": "ISO 8601",
    "grid": "the calibration grid: {'methods', 'gamma', 'sparsity', 'batch', 'context', ...}",
    "workload": "list of workload names",
    "seeds": "{'calibration': int, ...}",
    "content_hash": "{file name: sha256 hex of the file's bytes} for the data files",
}

WEIGHT_KINDS = ("real", "random")

# software.runtime: what a calibrated step ran besides the kernels. "1" (sets without the
# key): the glue between the GEMMs as dozens of torch ops per layer; "2": three fused Triton
# ops (kernels/layer_ops.py), a faster decode step; "3": top-k then top-p sampling over the k
# survivors instead of a sort of the whole vocabulary (calibrate/sampling.py; the same
# distribution in less GPU time); "4": that distribution held on top-k + slack slots through
# drawing, p(d) / q(d) and the rejection residual (faster draft-step sampling and acceptance:
# benchmarks/sampling.py); "5": MagicDec-Quest's page selection in two Triton launches
# (kernels/quest.py) instead of page scoring then torch.topk, a faster quest_meta phase; "6":
# Quest's pick as a radix select over (request, chunk) programs instead of one program per
# request (kernels/quest.py), faster again at long contexts; "7": Quest's page scoring loads
# every KV head of a block of pages at once (kernels/quest.py, the wide kernel), faster at
# every context; "8": the radix pick's write finds its slots from per-chunk summaries instead of
# re-counting the pages before its chunk, and the scoring reads the metadata evict-first
# (kernels/quest.py), faster again.
RUNTIME_REVISION = "8"
# Revisions that changed only some methods' phases: method -> the phases that changed. A set
# of an older revision keeps the other methods' rows current; a revision not listed here
# changed every method.
CHANGED_PHASES: dict[str, dict[str, tuple[str, ...]]] = {
    "5": {"magicdec-quest": ("quest_meta",)},
    "6": {"magicdec-quest": ("quest_meta",)},
    "7": {"magicdec-quest": ("quest_meta",)},
    "8": {"magicdec-quest": ("quest_meta",)},
}

# meta.json: optional keys that the writer / generator add.
OPTIONAL_META_KEYS = {
    "parts": "{'latency': [part names], 'acceptance': [...]} included by the last finalize",
    "synthetic": "true for sets from traces/synthetic.py (never measured, never packaged)",
    "imported": "{'from', 'file', 'sha256', ...}: acceptance rows imported from another engine's "
                "records (traces/vllm_traces.py), not measured by calibrate",
    "subset_of": "{'path', 'date', 'content_hash'} of the set `traces subset` cut this one from",
    "where": "the conditions `traces subset` kept the rows by, e.g. 'batch<=16,context<=32K'",
    "expected_rows": "{'latency': int, 'acceptance': int}: the rows `traces merge` / `traces "
                     "subset` wrote; finalize and check refuse parts that hold other counts",
    "tensor_parallel": "{'size', 'backend', 'interconnect'}: the latency was measured on one "
                       "rank of a tensor-parallel group of `size` GPUs (absent: one GPU)",
    "acceptance_calibration": "{'context_trend_sd_scale', 'from'}: the factor on the context "
                              "trend's model sd that this set's own context hold-out needs "
                              "(sim.context_trend), and the command that measured it; `traces "
                              "merge` and `traces subset` drop it (other rows, another fit)",
}

# meta.json's typed fields, the one table `traces check` and every loader validate them by
# (validation.validate_meta). A Field is its JSON kind and its bounds: "int", "number",
# "bool", "str", "int_list" / "number_list" / "str_list" (each item so), "object" (a JSON
# object or null); `low` inclusive, `above` exclusive. A number must be finite; a JSON bool
# is never an int. "model": every ModelSpec field (MODEL_REQUIRED must be there); "grid": the
# keys the loaders read (optional: older sets lack some).
class Field(NamedTuple):
    kind: str
    low: float | None = None
    above: float | None = None


MODEL_REQUIRED = ("name", "architecture", "n_layers", "hidden", "n_heads", "n_kv_heads",
                  "head_dim", "ffn", "vocab", "max_positions")
MODEL_FIELDS: dict[str, Field] = {
    "name": Field("str"), "architecture": Field("str"),
    "n_layers": Field("int", 1), "hidden": Field("int", 1), "n_heads": Field("int", 1),
    "n_kv_heads": Field("int", 1), "head_dim": Field("int", 1), "ffn": Field("int", 1),
    "vocab": Field("int", 1), "max_positions": Field("int", 1),
    "rope_theta": Field("number", above=0), "rms_eps": Field("number", above=0),
    "tie_embeddings": Field("bool"), "qk_norm": Field("bool"), "qkv_bias": Field("bool"),
    "rope_scaling": Field("object"), "dtype": Field("str"),
    "n_experts": Field("int", 0), "experts_per_token": Field("int", 0),
    "expert_ffn": Field("int", 0), "sliding_window": Field("int", 0),
    "window_layers": Field("int_list", 0), "attention_sinks": Field("bool"),
    "o_bias": Field("bool"), "moe_bias": Field("bool"), "moe_activation": Field("str"),
    "rope_theta_window": Field("number", 0), "mlp_activation": Field("str"),
    "sandwich_norms": Field("bool"), "embed_scale": Field("bool"),
}
# String fields of the model that only take these values.
MODEL_CHOICES: dict[str, tuple[str, ...]] = {
    "architecture": ("llama", "qwen2", "qwen3", "qwen3_moe", "gpt_oss", "gemma3"),
    "dtype": tuple(DTYPE_BYTES),
    "moe_activation": ("silu", "gpt_oss"),
    "mlp_activation": ("silu", "gelu_tanh"),
}
GRID_FIELDS: dict[str, Field] = {
    "batch": Field("int_list", 1), "context": Field("int_list", 1),
    "gamma": Field("int_list", 1), "n_query": Field("int_list", 1),
    "sparsity": Field("number_list", above=0), "min_tokens": Field("int", 1),
    "methods": Field("str_list"), "workloads": Field("str_list"),
    "temperatures": Field("number_list", 0), "verify_after_draft": Field("bool"),
    "cuda_graphs": Field("bool"), "latency_temperature": Field("number", 0),
    "greedy_latency": Field("bool"),
}
# meta.json's `tensor_parallel` (TP_FIELDS all required when the key is there).
TP_FIELDS: dict[str, Field] = {
    "size": Field("int", 1), "backend": Field("str"), "interconnect": Field("str"),
}
TP_BACKENDS = ("nccl", "gloo")
# meta.json's `acceptance_calibration` (both required when the key is there): a scale below 1
# would narrow the model's own sd, which no hold-out has asked for.
CALIBRATION_KEY = "acceptance_calibration"
CALIBRATION_FIELDS: dict[str, Field] = {
    "context_trend_sd_scale": Field("number", 1.0), "from": Field("str"),
}
# Rows a writer that knows them up front (`traces merge`, `traces subset`) records before its
# first append; a finalize whose parts hold other counts (the writer stopped early) is refused.
EXPECTED_ROWS_KEY = "expected_rows"
