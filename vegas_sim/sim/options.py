"""A scenario's options, written once: the table `vegas-sim predict/sweep/tune` build their
command-line options from and `vegas_sim.api`'s functions take as parameters.

Each `Option` names its Python parameter, its flags, its kind, its default and its help, and
the commands that have it; an option whose meaning differs between commands (γ is one value
for predict, a grid for sweep and a search box for tune) has one entry per meaning. The
CLI (`cli.common.scenario_options`) turns the entries into click options; the API functions
spell the same parameters out (so they stay typed and visible to help()), and
tests/test_api_cli_parity.py fails when a command's options and its function's parameters
disagree in name or default. Options that are `Scenario` fields (`scenario=True`) reach
sweep and tune as the grid's shared fields (`scenario_extra`), parsed there once: --arrival's
text becomes an `Arrivals`, and goes back to its text only where it is written out
(`option_texts`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vegas_sim.methods import DEFAULT_SPARSITY, METHODS
from vegas_sim.models import WEIGHT_FORMATS
from vegas_sim.sim.ranking import RANK_BY
from vegas_sim.sim.workload import Arrivals
from vegas_sim.workload_info import workload_help

COMMANDS = ("predict", "sweep", "tune")
ALL = COMMANDS
GRIDS = ("sweep",)
OUTSIDE_EVIDENCE = ("pi_low", "exclude")  # tune: a point outside the traced span


@dataclass(frozen=True)
class Option:
    """One option of one or more commands.

    kind: "int", "float", "str", "path" (a file or a packaged name), "choice" (`choices`) or
    "arrival" (a text the command takes as is and `value` parses into an `Arrivals`).
    multiple: repeatable on the command line, a sequence in the API. scenario: a field of
    `sim.predict.Scenario` of the same name and default (sweep and tune pass it to every
    configuration)."""

    name: str
    flags: tuple[str, ...]
    kind: str
    default: Any
    help: str
    commands: tuple[str, ...] = ALL
    choices: tuple[str, ...] = ()
    multiple: bool = False
    metavar: str | None = None
    scenario: bool = False

    def value(self, given: Any) -> Any:
        """`given` (the option's text or an API caller's value) as the Scenario field holds it."""
        return Arrivals.of(given) if self.kind == "arrival" else given


_TRACES_HELP = ("Trace set: a directory, or a packaged set's name (`vegas-sim traces list`) "
                "[default: the packaged measured sets].")
ACCEPTANCE_ANCHOR_HELP = (
    "Measured acceptance that sets the acceptance level (docs/ACCEPTANCE_ANCHORS.md): a "
    ".json/.csv anchors file or a packaged name (qwen3-8b-published); repeatable. "
    "'none': the acceptance trace set's own level [default: the packaged anchors of the "
    "model predicted when its acceptance comes from another model's traces].")
GPU_HELP = ("The GPU to predict for (a100, h100-sxm, h100-nvl, h200, b200): the model's "
            "packaged set measured on it where there is one (h200; h100-sxm for qwen3-8b, "
            "gpt-oss-20b, qwen3-30b-a3b), else a what-if rescaled from the H200 set by "
            "datasheet ratios, not measured, its interval widened by the distance.")
GPU_SPEC_HELP = ("Hardware what-if for a GPU not in --gpu's list: a JSON or TOML file with "
                 "name, memory_gb, hbm_bandwidth_gbs (datasheet; or copy_bandwidth_gbs, "
                 "measured), bf16_tflops (dense, datasheet). Not measured.")

# The grid- or box-shaped options, one entry per meaning.
_SHAPE = (
    Option("gamma", ("--gamma", "-g"), "int", 7, "Draft tokens per iteration (γ).",
           ("predict",)),
    Option("gamma", ("--gamma", "-g"), "str", "2..12", "γ grid: '2..12', '2,4,8', '2..12:2'.",
           GRIDS),
    Option("gamma", ("--gamma", "-g"), "str", None,
           "γ box LO..HI [default: 1 to the largest traced γ].", ("tune",)),
    Option("sparsity", ("--sparsity", "-s"), "str", str(DEFAULT_SPARSITY),
           "Fraction of the context the draft attends to, in (0, 1]: 0.07 or 7%.",
           ("predict",)),
    Option("sparsity", ("--sparsity", "-s"), "str", "0.01,0.03,0.05,0.07,0.1",
           "Sparsity grid: '0.01,0.03', '1%..10%:1%', '0.01..0.2:0.01'.", GRIDS),
    Option("sparsity", ("--sparsity", "-s"), "str", None,
           "Sparsity box LO..HI, e.g. 0.01..0.2 [default: the traced sparsities' span].",
           ("tune",)),
    Option("batch", ("--batch", "-b"), "int", 4,
           "Maximum running sequences (vLLM's max_num_seqs); the KV cache may hold fewer: "
           "requests are admitted while their blocks fit, and the latest admitted are "
           "preempted (recomputed) when it fills.", ("predict",)),
    Option("batch", ("--batch", "-b"), "str", "4", "Max batch grid: '1,4,16'.", GRIDS),
    Option("batch", ("--batch", "-b"), "str", "1,4,16", "Batch sizes: '1,4,16'.", ("tune",)),
    Option("context", ("--context", "-c"), "str", "32K",
           "Prompt tokens per request (e.g. 4096, 32K, 128K).", ("predict",)),
    Option("context", ("--context", "-c"), "str", "32K",
           "Context grid: '4K,32K,128K', '1K..128K:x2'.", GRIDS),
    Option("context", ("--context", "-c"), "str", "32K", "Context lengths: '4K,32K,128K'.",
           ("tune",)),
    Option("output_len", ("--output-len",), "str", "1024",
           "Generated tokens per request: N, lognormal:MEAN,CV (clipped to the model's "
           "positions), or file:PATH (one length per line, or a CSV column: "
           "file:PATH#COLUMN), drawn per request with --seed.", ("predict",)),
    Option("output_len", ("--output-len",), "str", "1024", "Output length grid.", GRIDS),
    Option("output_len", ("--output-len",), "str", "1024",
           "Generated tokens per request: one length (e.g. 1024, 8K).", ("tune",)),
    Option("methods", ("--method", "-m"), "choice", ("vegas",),
           "Method(s) to predict side by side; vanilla is always the baseline.", ("predict",),
           choices=METHODS, multiple=True),
    Option("methods", ("--method", "-m"), "choice", ("vegas",),
           "Method(s) to sweep (repeat the option); vanilla is always added.", GRIDS,
           choices=METHODS, multiple=True),
    Option("method", ("--method",), "choice", "vegas", "Method to tune.", ("tune",),
           choices=METHODS[1:]),
)

# What is predicted: the trace sets, the model and the hardware (api.load_models).
_MODELS = (
    Option("model", ("--model",), "str", None,
           "Model whose latency to use (a preset calibrated in the trace set) [default: "
           "qwen3-8b, or the model of --traces]."),
    Option("traces", ("--traces",), "path", None, _TRACES_HELP),
    Option("acceptance_traces", ("--acceptance-traces",), "path", None,
           "Real-weights trace set whose acceptance to use (a directory or a packaged name, "
           "e.g. smollm2-135m-real-yarn4 for contexts past 8K) [default: the model's own, "
           "else the packaged real set].", metavar="PATH|NAME"),
    Option("acceptance_anchors", ("--acceptance-anchor",), "str", (), ACCEPTANCE_ANCHOR_HELP,
           multiple=True, metavar="FILE|NAME"),
    Option("model_what_if", ("--model-what-if",), "str", None,
           "What-if: price this preset's shape (e.g. llama-3.1-8b) at the efficiencies "
           "fitted on the latency set's model. Not measured.", metavar="PRESET"),
    Option("gpu", ("--gpu",), "str", None, GPU_HELP),
    Option("gpu_spec", ("--gpu-spec",), "path", None, GPU_SPEC_HELP, metavar="FILE"),
    Option("tensor_parallel", ("--tp", "--tensor-parallel-size"), "int", 1,
           "GPUs in one tensor-parallel group (vLLM's tensor_parallel_size): weights, KV "
           "heads and FLOPs divided as vLLM divides them, KV capacity from the per-GPU "
           "memory, two all-reduces per layer per forward. A set from `calibrate --tp N` is "
           "used at N as measured (other sizes refused); from a one-GPU set, a what-if "
           "whose collectives are modelled from the GPU's link datasheet, not measured."),
    Option("graph_launch_ms", ("--graph-launch-ms",), "float", None,
           "What-if: replace the measured per-step host overhead (large in sets measured "
           "with an eager runtime) by this launch cost, as a CUDA-graph engine would see. "
           "Not measured."),
    Option("weight_format", ("--weight-format",), "choice", "bf16",
           "What-if: weights in fp8 (1 byte per layer-projection parameter) or mxfp4 (4.25 "
           "bits per expert parameter, as gpt-oss ships), weight bytes rescaled along the "
           "fitted roofline. Not measured.", choices=WEIGHT_FORMATS),
)

# The serving scenario: Scenario fields shared by every configuration of a command.
_SCENARIO = (
    Option("requests", ("--requests",), "int", None,
           "Requests to simulate (default: 4 × batch closed loop; max(200, 20 × batch) for "
           "Poisson arrivals, enough for a steady state).", scenario=True),
    Option("arrival", ("--arrival",), "arrival", "closed",
           "'closed' (batch-many users), 'closed:USERS', 'poisson:RATE' (requests/s) or "
           "'trace:FILE' (arrival times in seconds, one per line, or a CSV with arrival_s[, "
           "input_len, output_len]); open loop (sim engine only): rows add TTFT with "
           "queueing, E2E, queue length, served rate and whether it is saturated.",
           scenario=True),
    Option("slo_tpot_ms", ("--slo-tpot-ms",), "float", None,
           "TPOT SLO for goodput (tokens/s of requests meeting every SLO), ms.", scenario=True),
    Option("slo_ttft_ms", ("--slo-ttft-ms",), "float", None,
           "TTFT SLO (queueing included) for goodput, ms.", scenario=True),
    Option("workload", ("--workload",), "str", None,
           "Acceptance workload, one of: " + workload_help() + ". Default: all traced "
           "ones, pooled; `vegas-sim traces show` gives the contexts each was traced over.",
           scenario=True),
    Option("temperature", ("--temperature",), "float", 0.0,
           "Sampling temperature whose acceptance to replay (0 = greedy).", scenario=True),
    Option("prefill", ("--prefill",), "choice", "disaggregated",
           "Where admitted requests are prefilled: on a prefill stage of its own GPUs, the KV "
           "then sent over --kv-link-gbs, or on this instance between decode iterations "
           "(co-located). TTFT includes the prefill either way (the ttft_includes column "
           "says how).", ("predict",), choices=("disaggregated", "co-located"),
           scenario=True),
    Option("prefill_gpus", ("--prefill-gpus",), "int", 1,
           "Disaggregated: GPUs of the prefill stage (FCFS, a prompt each).", ("predict",),
           scenario=True),
    Option("kv_link_gbs", ("--kv-link-gbs",), "float", 50.0,
           "Disaggregated: prefill → decode KV link, GB/s (50: one 400 Gb/s RDMA NIC).",
           ("predict",), scenario=True),
    Option("kv_block_size", ("--kv-block-size",), "int", 16,
           "Tokens per KV-cache block (vLLM's block_size): admission and preemption count "
           "whole blocks.", ("predict",), scenario=True),
    Option("gpu_memory_utilization", ("--gpu-memory-utilization",), "float", 0.9,
           "Share of GPU memory for the weights and the KV cache (vLLM's "
           "gpu_memory_utilization); the KV cache gets what the weights leave.",
           ("predict",), scenario=True),
)

# How it is run: engines, randomness, parallelism, and tune's search.
_RUN = (
    Option("engine", ("--engine",), "choice", "sim", "SimPy engine or closed form.",
           ("predict",), choices=("sim", "analytic")),
    Option("engine", ("--engine",), "choice", "analytic",
           "Closed form (fast), SimPy engine, or both rows.", GRIDS,
           choices=("analytic", "sim", "both")),
    Option("final_engine", ("--final-engine",), "choice", "analytic",
           "Engine for the reported numbers (sim: replication CIs).", ("tune",),
           choices=("analytic", "sim")),
    Option("search_engine", ("--search-engine",), "choice", "analytic",
           "Engine the search ranks on (sim: needed for open-loop --arrival; slower).",
           ("tune",), choices=("analytic", "sim")),
    Option("outside_evidence", ("--outside-evidence",), "choice", "pi_low",
           "Points of the box outside the traced γ/sparsity span: ranked by their prediction "
           "interval's low end (pi_low), or not searched (exclude).", ("tune",),
           choices=OUTSIDE_EVIDENCE),
    Option("tie_pct", ("--tie-pct",), "float", 1.0,
           "Tie band: configurations within this % of the best go to the smaller K.",
           ("tune",)),
    Option("stable_pct", ("--stable-pct",), "float", 5.0,
           "Step 1: smallest sparsity whose acceptance is within this % of the max.",
           ("tune",)),
    Option("rank_by", ("--rank-by",), "choice", "throughput",
           "What 'best' means: throughput, goodput (needs --slo-*) or tpot (lowest TPOT "
           "p50).", ("tune",), choices=RANK_BY),
    Option("workers", ("--workers",), "int", None,
           "Local worker processes [default: all cores].", ("sweep", "tune")),
    Option("scheduler", ("--scheduler",), "str", None,
           "Dask scheduler address (tcp://host:8786): run on that cluster instead.",
           ("sweep", "tune")),
    Option("seed", ("--seed",), "int", 0, "Seed of every random draw (same seed, same rows)."),
    Option("replications", ("--replications",), "int", 5,
           "Independent replications for the sim engine's 95% confidence intervals.",
           ("predict", "sweep")),
)

OPTIONS: tuple[Option, ...] = (*_SHAPE, *_MODELS, *_SCENARIO, *_RUN)


def options_for(command: str) -> tuple[Option, ...]:
    """The options of `command` (predict, sweep or tune), in --help order."""
    if command not in COMMANDS:
        raise ValueError(f"no options for command {command!r}")
    return tuple(o for o in OPTIONS if command in o.commands)


def defaults(command: str) -> dict[str, Any]:
    """{parameter: default} of `command`'s options."""
    return {o.name: o.default for o in options_for(command)}


def scenario_extra(command: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The `Scenario` fields among `values` that differ from their defaults, parsed
    (`Option.value`), for a prediction's scenarios or a sweep grid's or tune config's `extra`
    (a grid without them keeps its identity, and its checkpoint)."""
    out: dict[str, Any] = {}
    for o in options_for(command):
        if o.scenario and o.name in values:
            value = o.value(values[o.name])
            if value != o.value(o.default):
                out[o.name] = value
    return out


def option_texts(extra: Mapping[str, Any]) -> dict[str, Any]:
    """`extra` with each parsed value back in the text of its option: what a written-out
    configuration (tune's strategy, a sweep's checkpoint key) holds."""
    return {k: v.text if isinstance(v, Arrivals) else v for k, v in extra.items()}
