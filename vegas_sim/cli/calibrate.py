"""`vegas-sim calibrate` and `vegas-sim validate`: the commands that need a GPU (or are slow on CPU).

torch is imported only when a command measures something (calibrate, validate without
--repredict), so a CPU-only install still has their --help and `validate --repredict`; their
options and files are checked first, and a missing torch then says how to install it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click

from vegas_sim import grids
from vegas_sim.calibrate import plan as plans
from vegas_sim.cli.common import acceptance_anchor_option, gpu_import, progress_task, user_errors
from vegas_sim.errors import UserInputError
from vegas_sim.files import check_out, check_writable, output_lock
from vegas_sim.models import PRESETS
from vegas_sim.traces import io
from vegas_sim.validate.heldout import read_heldout
from vegas_sim.validate.repredict import repredict as repredict_table
from vegas_sim.validate.results import compare, summarize
from vegas_sim.workload_info import workload_help


def check_model(model: str, option: str = "--model") -> None:
    """A --model is a preset name or an existing file or directory."""
    if model not in PRESETS and not Path(model).exists():
        raise UserInputError(f"{model!r} is neither a preset nor an existing file or directory",
                             where=option,
                             fix=f"pass a .gguf file, a Hugging Face checkpoint directory or "
                                 f"one of: {', '.join(sorted(PRESETS))}")


def _check_out_dir(out: Path) -> None:
    """A trace-set --out is a directory that exists or can be made beside writable others."""
    if out.exists() and not out.is_dir():
        raise UserInputError(f"{str(out)!r} is a file", where="--out",
                             fix="name a directory for the trace set (new, or one to resume)")
    check_writable(out)


@click.command()
@click.option("--model", required=True,
              help="Preset name (qwen3-8b, qwen3-4b, llama-3.1-8b, smollm2-135m, "
                   "qwen3-30b-a3b, gpt-oss-20b), a .gguf file, or a Hugging Face checkpoint "
                   "directory (bf16/fp32; gpt-oss's MXFP4 experts are dequantised on load).")
@click.option("--weights", type=click.Choice(["real", "random"]), default=None,
              help="real: load the checkpoint (latency + acceptance); random: latency only. "
                   "Default: random for presets, real for files.")
@click.option("--methods", default=None, help="Comma list of methods, or 'all'.")
@click.option("--gamma", default=None, help=f"γ grid, {grids.INT_GRID_HELP}.")
@click.option("--sparsity", default=None, help=f"Sparsity grid, {grids.FLOAT_GRID_HELP}.")
@click.option("--batch", default=None, help="Batch-size grid, e.g. '1,4,16' or '1..128:x2'.")
@click.option("--context", default=None, help="Context grid, e.g. '1K..128K:x2'.")
@click.option("--n-query", default=None, help="Verify query rows grid, e.g. '1,4,8,16'.")
@click.option("--workload", default=None,
              help="Acceptance workloads, comma list (real weights): " + workload_help() + ".")
@click.option("--iterations", type=int, default=None,
              help="Spec-decode iterations per acceptance run.")
@click.option("--temperature", default=None,
              help="Temperatures for acceptance runs, e.g. '0,0.6' (0 = greedy).")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True)
@click.option("--tp", "tensor_parallel", type=int, default=1, show_default=True,
              help="Shard the model over this many processes (tensor parallel, as vLLM "
                   "splits it): NCCL with one GPU each on cuda, gloo on cpu. The set's meta "
                   "records the group and interconnect, its latency rows each phase's "
                   "collectives (calls, bytes, time); predict uses it at the same --tp.")
@click.option("--quick", is_flag=True, help="A small grid that finishes in < 2 min on an H200.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--min-tokens", type=int, default=None,
              help="Budget floor (default 256). A small-context model needs a lower floor "
                   "for sparsity to matter (e.g. 32 for SmolLM2's 8K).")
@click.option("--prompts", type=int, default=None,
              help="Prompts per workload in acceptance runs (default 16; 4 with --quick). On "
                   "CUDA, up to 128 (prompt, sparsity) requests decode as one batch.")
@click.option("--first-prompt", type=click.IntRange(min=0), default=0, show_default=True,
              help="Skip each workload's first N prompts in acceptance runs; requests keep "
                   "the workload's numbering, so `vegas-sim traces merge` adds the rows to a "
                   "set that ran the first N (e.g. 128 for longdoc's 3K windows).")
@click.option("--acceptance-cuts", type=click.Choice(grids.ACCEPTANCE_CUTS), default="none",
              show_default=True,
              help="For workloads of text windows (longdoc): also trace every window cut to "
                   "each shorter window length, so a context bucket holds every prompt that "
                   "reaches it; 'only': the cuts alone, to extend an older set with `vegas-sim "
                   "traces merge`. Off by default: on SmolLM2 longdoc it made predictions "
                   "worse (docs/RESULTS.md); more windows helped instead (--prompts).")
@click.option("--latency/--no-latency", default=True, show_default=True,
              help="Measure the latency grid.")
@click.option("--acceptance/--no-acceptance", default=True, show_default=True,
              help="Run the acceptance grid (real weights only).")
@click.option("--verify-after-draft", is_flag=True,
              help="Time verify, acceptance and selection in whole iterations (γ draft steps "
                   "first, as decoding runs them): for host-bound (small) models, at the cost "
                   "of the draft steps.")
@click.option("--greedy-latency", is_flag=True,
              help="Also time the sampling phases (draft_step, sample) greedy (T 0), besides "
                   "at the largest --temperature, at every other batch and the extreme "
                   "sparsities: predictions then price greedy runs in their own mode.")
@click.option("--rope-scaling", default=None, metavar="yarn:FACTOR",
              help="Extend the model past its trained positions with YaRN (e.g. yarn:4: 4x "
                   "them, the trained window as YaRN's original); the set's model records it.")
@click.option("--acceptance-batch", type=click.IntRange(min=1), default=None,
              help="Requests per acceptance generate() call (default 128 on CUDA, halved "
                   "until the state fits): lower it when several calibrations share a GPU.")
@click.option("--long-prompts", is_flag=True,
              help="Acceptance on the long longdoc / recall windows (12K-32K tokens, "
                   "workloads/<model>.long.npz), e.g. with --rope-scaling.")
@click.option("--retry-failed", is_flag=True, help="Redo points an earlier run skipped (OOM).")
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Trace-set directory; an existing one is resumed where it stopped.")
def calibrate(model: str, weights: str | None, device: str, quick: bool, seed: int,
              min_tokens: int | None, prompts: int | None, first_prompt: int,
              acceptance_cuts: str,
              latency: bool, acceptance: bool, verify_after_draft: bool, greedy_latency: bool,
              rope_scaling: str | None, acceptance_batch: int | None, long_prompts: bool,
              retry_failed: bool,
              out: Path, **grid: Any) -> None:
    """Measure a trace set on the GPU: per-phase latencies of every method and, with real
    weights, per-iteration acceptance.

    Writes incrementally: an interrupted run (Ctrl-C, or SIGTERM from `timeout`) resumes where
    it stopped, and a grid point that runs out of GPU memory is recorded and skipped. Copy
    bandwidth and bf16 matmul rate are measured in the same run. On CUDA the draft, verify and
    decode steps are replayed as CUDA graphs (VEGAS_SIM_CUDA_GRAPHS=0 runs them eagerly).
    --rope-scaling yarn:4 with --long-prompts traces acceptance past a model's trained window
    (the last example: SmolLM2's 8K to 32K; the set records the extension).

    Examples:

    \b
        vegas-sim calibrate --model qwen3-8b --quick --out traces/qwen3-8b-quick

    \b
        vegas-sim calibrate --model qwen3-8b --batch 1..128:x2 --context 1K..128K:x2 --out traces/q8b

    \b
        vegas-sim calibrate --model SmolLM2-135M-Instruct.Q4_1.gguf --weights real \\
            --methods all --gamma 12 --sparsity 0.01,0.03,0.07,0.2 --workload chat,code --out traces/smol

    \b
        vegas-sim calibrate --model qwen3-8b --tp 2 --quick --out traces/qwen3-8b-tp2-quick

    \b
        vegas-sim calibrate --model SmolLM2-135M-Instruct.Q4_1.gguf --weights real \\
            --rope-scaling yarn:4 --long-prompts --no-latency --methods all --gamma 12 \\
            --workload longdoc,recall --out traces/smol-yarn
    """
    with user_errors():
        check_model(model)
        if weights is None:
            weights = "real" if Path(model).exists() else "random"
        plan = plans.plan_from_options(model, weights=weights, device=device, seed=seed,
                                             quick=quick, **grid)
        extra: dict[str, Any] = {"latency": latency, "acceptance": acceptance,
                                 "acceptance_cuts": acceptance_cuts,
                                 "acceptance_first_prompt": first_prompt,
                                 "verify_after_draft": verify_after_draft,
                                 "greedy_latency": greedy_latency,
                                 "long_prompts": long_prompts,
                                 "acceptance_batch": acceptance_batch}
        if rope_scaling is not None:
            extra["rope_extension"] = plans.parse_rope_extension(rope_scaling)
        if min_tokens is not None:
            extra["min_tokens"] = min_tokens
        if prompts is not None:
            extra["acceptance_prompts"] = prompts
        plan = dataclasses.replace(plan, **extra)
        plans.validate_plan(plan)
        _check_out_dir(out)
    with user_errors(), output_lock(out):
        runner = gpu_import("calibrate", "vegas_sim.calibrate.runner")
        seen = [0, 0]  # points done, of total: what an interrupt keeps

        with progress_task("calibrating") as bar:
            def progress(done: int, total: int, label: str) -> None:
                seen[:] = [done, total]
                bar(done, total, label)

            try:
                path = runner.run_calibration(
                    plan, out, progress, retry_failed=retry_failed,
                    log_fn=lambda line: click.echo(line, err=True))
            except KeyboardInterrupt:
                click.echo(f"\ncalibrate: {seen[0]} of {seen[1]} points kept in {out}; run the "
                           "same command again to resume", err=True)
                raise
    click.echo(f"wrote trace set {path}")


@click.command()
@click.option("--traces", type=click.Path(path_type=Path), required=True,
              help="The calibration trace set G (latency of the model validated).")
@click.option("--acceptance-traces", type=click.Path(path_type=Path), default=None,
              help="Real-weights trace set for acceptance (default: --traces, or packaged).")
@click.option("--heldout", type=click.Path(path_type=Path), default=None,
              help="CSV/JSON of held-out configurations (columns: method, gamma, sparsity, "
                   "batch, context, output_len, workload, temperature, waves; an empty "
                   "temperature means the latency grid's).")
@click.option("--random", "n_random", type=click.IntRange(min=1), default=None,
              help="Draw this many held-out configurations outside the grid instead.")
@click.option("--repredict", type=click.Path(path_type=Path), default=None,
              help="Re-predict every row of this earlier result CSV with the current "
                   "simulator (no GPU run; measured columns kept) and print before/after.")
@click.option("--model", default=None, help="Model to run: preset, .gguf file or HF dir.")
@click.option("--weights", type=click.Choice(["real", "random"]), default=None,
              help="random: acceptance decisions are replayed from a recorded real trace.")
@click.option("--max-batch", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--context-range", default="2K,128K", show_default=True,
              help="Context range for --random, 'LO,HI'.")
@click.option("--output-len", type=click.IntRange(min=2), default=128, show_default=True,
              help="Tokens generated per request (the first comes from the prefill).")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed for choosing held-out configurations and for the runs (recorded).")
@click.option("--replications", type=int, default=5, show_default=True,
              help="Simulator replications per prediction, at least (small batches get "
                   "enough for 256 simulated requests).")
@click.option("--time-budget", type=float, default=None,
              help="Seconds after which no new configuration starts (the table so far is "
                   "kept), for a bounded GPU call.")
@click.option("--passes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Measure the held-out list this many times in turn (same prompts and "
                   "seeds); a row pools its passes and records their spread.")
@click.option("--resume", is_flag=True,
              help="Keep what an interrupted run with the same held-out configurations "
                   "wrote to --out, and measure only the rest.")
@click.option("--tp", "tensor_parallel", type=click.IntRange(min=1), default=1, show_default=True,
              help="Decode on the model sharded over this many processes (as calibrate --tp "
                   "shards it); --traces measured at this size is used as measured, one "
                   "measured on one GPU is priced at it as a what-if.")
@click.option("--phase-wave/--no-phase-wave", default=True, show_default=True,
              help="One more wave per configuration with per-phase timers (not measured "
                   "throughput): measured vs predicted ms per phase in the table.")
@click.option("--gpu", default=None,
              help="With --repredict: price the rows on this GPU (a --gpu datasheet name of "
                   "predict) from --traces measured on another, a what-if: how far it lands "
                   "from runs made on that GPU.")
@acceptance_anchor_option
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Result CSV (predicted, measured, error %, CI, extrapolated); the "
                   "configurations it runs are written first beside it, as *.heldout.csv.")
def validate(traces: Path, acceptance_traces: Path | None, heldout: Path | None,
             n_random: int | None, repredict: Path | None, model: str | None,
             weights: str | None, max_batch: int, context_range: str, output_len: int,
             device: str, seed: int, replications: int, time_budget: float | None,
             passes: int, resume: bool, tensor_parallel: int, phase_wave: bool,
             gpu: str | None, acceptance_anchors: tuple[str, ...], out: Path) -> None:
    """Compare predictions with real GPU decoding at configurations outside the grid.

    Runs real end-to-end decoding for every held-out configuration, predicts each one from
    the trace set only, and writes predicted vs measured throughput with the error. Refuses
    configurations that are calibration grid points. `vegas-sim report` turns the CSV into a
    parity plot. With --repredict, no decoding runs: the predictions of an earlier result
    table are recomputed with the current simulator and the before/after errors printed.

    A small model's decoding loop is bound by the host, whose speed can drift for stretches
    of seconds: --passes 3 measures the whole list three times in turn, so that a row pools
    three stretches, and reports the pass-to-pass spread beside the error. An interrupted
    run (Ctrl-C, --time-budget) continues with the same command and --resume.

    Examples:

    \b
        vegas-sim validate --traces traces/smol --model smollm2.gguf --random 20 --out val.csv

    \b
        vegas-sim validate --traces traces/q8b --model qwen3-8b --weights random \\
            --acceptance-traces traces/smol --random 20 --out val-q8b.csv

    \b
        vegas-sim validate --traces traces/smol --model smollm2.gguf \\
            --heldout heldout.csv --passes 3 --time-budget 480 --resume --out val.csv

    \b
        vegas-sim validate --repredict val-q8b.csv --traces traces/q8b \\
            --acceptance-traces traces/smol --out val-q8b-new.csv

    \b
        vegas-sim validate --repredict val-h100.csv --traces qwen3-8b-h200 \\
            --gpu h100-sxm --out val-h100-from-h200.csv
    """
    with user_errors():
        check_out(out, (".csv",))
        _check_validate_inputs(traces, acceptance_traces, heldout, model, replications,
                               time_budget)
        if repredict is not None and out.resolve() == repredict.resolve():
            raise click.UsageError("--out would overwrite the --repredict table: name a new "
                                   "file (the before/after comparison needs both)")
        if repredict is not None:
            if heldout is not None or n_random is not None or model is not None or resume:
                raise click.UsageError(
                    "--repredict runs nothing: drop --heldout/--random/--model/--resume")
            with output_lock(out):
                before, after = repredict_table(
                    repredict, traces=traces, acceptance_traces=acceptance_traces, out=out,
                    seed=seed, replications=replications,
                    log=lambda line: click.echo(line, err=True),
                    acceptance_anchors=acceptance_anchors, gpu=gpu)
            click.echo(compare(before, after))
            click.echo(summarize(after))
            click.echo(f"wrote {out}")
            return
        if gpu is not None:
            raise click.UsageError("--gpu prices a --repredict table on another GPU; a run is "
                                   "priced on the GPU it runs on: drop --gpu")
        if (heldout is None) == (n_random is None):
            raise click.UsageError("pass exactly one of --heldout FILE or --random N "
                                   "(or --repredict RESULTS.csv)")
        if model is None:
            raise click.UsageError("--model is required to run held-out configurations")
        lo, hi = grids.parse_int_grid(context_range, "--context-range")
        if weights is None:
            weights = "real" if Path(model).exists() else "random"
    with user_errors(), output_lock(out):
        run_validation = gpu_import("validate", "vegas_sim.validate.run").run_validation
        with progress_task("validating") as progress:
            try:
                table = run_validation(
                    traces=traces, acceptance_traces=acceptance_traces, heldout_file=heldout,
                    n_random=n_random, model=model, weights=weights, max_batch=max_batch,
                    contexts=(lo, hi), output_len=output_len, device=device, seed=seed,
                    out=out, progress=progress, replications=replications,
                    time_budget_s=time_budget, log=lambda line: click.echo(line, err=True),
                    phase_wave=phase_wave, acceptance_anchors=acceptance_anchors,
                    passes=passes, resume=resume, tensor_parallel=tensor_parallel)
            except KeyboardInterrupt:
                click.echo(f"\nvalidate: what was measured is in {out}; the same command with "
                           "--resume continues it", err=True)
                raise
    click.echo(summarize(table))
    click.echo(f"wrote {out}")


def _check_validate_inputs(traces: Path, acceptance_traces: Path | None, heldout: Path | None,
                           model: str | None, replications: int,
                           time_budget: float | None) -> None:
    """validate's files and numbers, checked before torch is imported (and any GPU work)."""
    for path, option in ((traces, "--traces"), (acceptance_traces, "--acceptance-traces")):
        if path is not None:
            try:
                io.read_meta(io.trace_set_dir(path))
            except UserInputError as e:
                raise UserInputError(e.problem, where=f"{option} {e.where or path}",
                                     fix=e.fix) from None
    if heldout is not None:
        read_heldout(heldout)
    if model is not None:
        check_model(model)
    if replications < 1:
        raise UserInputError(f"must be >= 1, got {replications}", where="--replications",
                             fix="pass a positive integer (e.g. 5)")
    if time_budget is not None and not 0 < time_budget < float("inf"):
        raise UserInputError(f"must be a positive number of seconds, got {time_budget:g}",
                             where="--time-budget", fix="e.g. --time-budget 480")
