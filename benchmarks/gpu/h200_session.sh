#!/usr/bin/env bash
# The H200 session that measures the packaged trace sets, the validation run and the kernel
# benchmark (docs/RESULTS.md), as four device calls made back to back (a machine left idle for
# 30 s is given back, and with it /root). Run from the repo root:
#
#   stage 0  carry .whl and .model/smollm2.gguf.part.aa: GPU tests (kernels, graphed
#            decoding), a smoke run of every calibration path at tiny grids, the kernel
#            benchmark. A crash here costs minutes, not the budget.
#   stage 1  carry .whl and .model/smollm2.gguf.part.ab: join + check the GGUF; SmolLM2
#            acceptance (real weights), one process per workload x temperature in parallel
#            (acceptance is host-bound and not timed; the processes only share the GPU), merged
#   stage 2  carry .whl: SmolLM2 latency (real weights), Qwen3-8B latency at B.C = 512K
#            merged into the packaged set
#   stage 3  carry .whl: validation in both regimes, 24 held-out configurations each
#   stage 5  the fourth session's run (run 6): every packaged set re-measured, then stage 3.
#            `5 q8b` (carry .whl and part.aa, copied to /root/model first): the Qwen3-8B
#            latency set with DRAFT_GAMMA = 4. `5 smol` (carry .whl and part.ab): join the
#            GGUF, the whole SmolLM2 acceptance set (sparsities batched), the SmolLM2 latency
#            set. Then stage 3 validates against them.
#   stage 7  the fifth session's run (run 7): `7 a` (carry .whl and part.aa, copied to
#            /root/model): GPU tests of calibrate, a CUDA smoke run of `validate` (phase wave);
#            `7 smol` (carry .whl and part.ab): join the GGUF, re-measure the SmolLM2 latency set
#            (host gaps over HOST_GAP_CHAIN iterations; SMOL_FLAGS=--verify-after-draft on the
#            second machine); `7 va`: validation regime (a), >= 32
#            requests per configuration, with the phase wave; `7 vb`: regime (b) likewise.
#   stage 8  the sixth session's first calls: `8 vb` (carry .whl, part.aa) regime (b) again with the
#            replay that pays for the acceptance decision, the 24 rows and the span file;
#            `8 va` (carry .whl, part.ab) the SmolLM2 span rows; `8 q8b` (not run yet) the
#            Qwen3-8B latency set with this code (HOST_GAP_CHAIN, 'other' rows; Q8B_FLAGS may
#            add --verify-after-draft, which costs γ draft steps per timed verify iteration).
#   stage 9  the sixth session's second pair of calls: `9 a` (carry .whl and part.aa) GPU tests
#            of calibrate; `9 smol` (carry .whl and part.ab) the SmolLM2 latency set with the
#            once-per-iteration draft work recorded as 'other'; `9 acc4` at once after it:
#            SmolLM2 longdoc T 0.6 acceptance traced at γ 4 (64 iterations), one process per
#            method, to be merged into the packaged acceptance set.
#   stage 11 the seventh session's first machine (run 9): longdoc T 0.6 acceptance of the old
#            32 windows cut to every shorter window length (--acceptance-cuts only) — an
#            experiment, not packaged (benchmarks/results/cuts_run9/).
#   stage 12 the seventh session's second machine: `12 a` kernel GPU tests + the b1 step
#            (the single-launch combine, measured and dropped), `12 acc` the 128-window
#            longdoc T 0.6 acceptance (packaged), `12 va` regime (a) on the 128 windows.
#   stage 13 next session's kernel call: GPU kernel tests (run 9's 4-stage Collect-2-Query
#            default has not passed them yet), then `benchmarks/kernels.py --quick`.
#   stage 14 the eighth session's first call (run 10): benchmarks/gpu/tune_kernels.py (launch
#            sweeps: Collect-2-Query per shape, PDL combine, score_weights), kernel GPU tests.
#   stage 15 run 11: kernel GPU tests, the TMA score-store candidates, score_weights blocks,
#            the radix top-k probe.
#   stage 16 run 12: kernel GPU tests, kernels.py --quick (verify, select, sparse).
#   stage 17 run 13: kernels.py --quick --only verify,select --rounds 3.
#   stage 18 the radix top-k's tie rule and index sort on the GPU (run 16 ran a short form).
#   stage 19 the ninth session's first call (run 17): kernel and calibrate GPU tests (the
#            launch_config refactor, the sorted radix top-k, the "tdot" store), the
#            Collect-2-Query candidates (benchmarks/gpu/c2q_probe.py), the selection step.
#   stage 20 run 18: calibrate GPU tests (Vegas's batched fold), kernels.py --quick (verify,
#            select, sparse: results/kernels_h200.csv), the cache-hint candidates again at
#            C 128K with 5 rounds, benchmarks/gpu/topk_probe.py.
#   stage 21 run 19: kernel GPU tests, calibrate GPU tests (the atomic-free radix top-k),
#            benchmarks/gpu/topk_probe.py, kernels.py --quick (results/kernels_h200.csv).
#   stage 22 run 20: the inline-PTX score store (verify_attention score_store="asm"/"asm2"):
#            its GPU tests, then c2q_probe.py (its knobs are now a patch: see c2q_probe.py).
#            Runs 20b/20c: c2q_probe.py --candidates "rows (default),rows sink", the sink's
#            first (one window) and second (windows per program/split/row) forms.
#   short calls of the ninth session, commands inline (logs under results/h200/): run 19b
#            `kernels.py --quick --only select --rounds 3` three times (select_reps_run19b.log);
#            run 19c and run 21 small launch probes written inline against kernels.py's
#            verify_inputs / verify_call / min_of_rounds (b1_probe_run19c.log,
#            b16_probe_run21.log), run 21 also `pytest -m gpu tests/kernels/test_topk.py`.
#   stage 23 the tenth session's first call (run 22): verify attention's GPU tests (TMA K/V
#            loads among them), then benchmarks/gpu/tma_probe.py (TMA, combine, partials).
#            Run 22b (inline): ncu --set full of benchmarks/gpu/ncu_verify.py at B 16, C 32K,
#            NQ 16, and its SASS source page (results/h200/ncu_*_run22b*).
#   stage 24 run 23: tma_probe.py's launches with two or three programs per SM, and ncu's
#            source page of the four variants at B 4, C 128K, NQ 1.
#   stage 25 run 24: tma_probe.py, the 32-key TMA launch's neighbours at all 18 quick shapes.
#   stage 26 run 25: kernel and calibrate GPU tests with wide_config and TMA as defaults,
#            kernels.py --quick (results/kernels_h200.csv).
#   stage 27 run 26: tma_probe.py --set run26 (Collect-2-Query stores and grids on the wide
#            launch) at five long shapes.
#   stage 28 run 27: the blocked-store diagnostic (results/h200/blocked_diag_run27.patch).
#   stage 29 run 28: kernel GPU tests of the final code (the score stores as one helper) and
#            a smoke run of both probes on their shared loop (probe_common.py).
#   Run 28b (inline): ncu --set full of ncu_verify.py at B 4, C 128K, NQ 16 (results/h200/
#            ncu_*_run28b*): the same wide launch with and without the score store.
#   stage 30 run 29: the TMA score store (c2q="tma"): its GPU tests, then tma_probe.py --set run29.
#   stage 31 run 30: the no-store diagnostic (results/h200/no_store_diag_run30.patch).
#   The eleventh session: stage 32 (run 31, 82 s), 34 (run 32, 56 s), 35 (run 33, 217 s) and
#   at once on the same machine `Q8B_TIMEOUT=545 ... 33` (run 34, cut at 545 s: 23 of 49
#   points), 36 (run 35, 190 s), 37 (run 36, 151 s), 38 (run 37, 17 s). About 26 of the
#   30 device-minutes.
#   stage 32 the eleventh session's kernel call (run 31, carry .whl): kernels.py --quick with
#            the selection share priced against DESIGN.md's iteration (γ draft steps + verify).
#   stage 34 run 32 (carry .whl): benchmarks/gpu/sparse_probe.py, sparse draft launches at the
#            mid-size selections that miss the target read as DESIGN writes it.
#   stage 35 run 33 (carry .whl): kernel and calibrate GPU tests with the sparse launch rule
#            (sparse_attention.launch_shape), then kernels.py --quick (results/kernels_h200.csv).
#   stage 36 run 35 (carry .whl): the Qwen3-8B calibration at B 1, 2 and C 1K-8K on an empty
#            Triton cache with radix_topk's PARTS fixed (topk.MAX_PARTS), and which kernels it
#            compiled when (benchmarks/gpu/compile_timeline.py).
#   stage 37 run 36 (carry .whl): radix_topk's GPU tests and the selection step of kernels.py
#            with its budget integers unspecialised, then stage 36's calibration again.
#   stage 38 run 37 (carry .whl): benchmarks/gpu/step_profile.py, where a Qwen3-8B decode
#            step's time goes in the runtime (graphed replay vs the kernels of an eager step).
#   stage 39 the twelfth session's first call (run 38, carry .whl): the fused runtime glue
#            (kernels/layer_ops.py): kernel and calibrate GPU tests, then stage 38, which now
#            times the graphed step with the torch glue and the fused glue in one run.
#   stage 40 run 41 (carry .whl): vegas γ 3 verify/select/sample rows at B 24, 32 × C 3K, 4K
#            (validation row 10's corner) timed without and with --verify-after-draft.
#   run 40 / run 42: `8 vb` with the new Qwen3-8B set, before / after the replay fix.
#   stage 41 run 43 (carry .whl): calibrate GPU tests after the replay fix; `calibrate --quick`
#            timed with the fused glue.
#   stage 42 run 44 (after `p` with part.aa, then `p` with part.ab; carry .whl and part.ac):
#            join the GGUF; greedy losslessness on the real SmolLM2 in fp32 on the GPU.
#   stage 43 the thirteenth session's first call (run 46, carry .whl and part.aa, copied to
#            /root/model): the sparse kernel's GPU tests with the partials of the G real rows
#            only, then benchmarks/gpu/sparse_probe.py --set store. Then `p` with part.ab, then
#            `9 smol` with part.ac (the SmolLM2 latency set on runtime revision 2), then at once
#            `10` (regime (a) against it).
#   stage 44 run 49 (carry .whl): the kernel GPU tests, then the committed kernel table
#            (kernels.py --quick --only verify,select,sparse --rounds 3) with the sparse kernel
#            that stores the G real rows of its partials.
#   stage 45 run 50 (carry .whl and part.aa): the calibrate GPU tests with that sparse kernel;
#            then `p` (part.ab) and `42` (part.ac, run 51): greedy losslessness on SmolLM2 again.
#   stage 46 run 52 (after `p` with part.aa and `p` with part.ab; carry .whl and part.ac):
#            regime (a) on a second, fresh draw of 24 held-out rows (make_heldout.py --seed
#            20261130 --regime smollm2), against the packaged sets.
#   run 53 (after `p` with part.aa and `p` with part.ab; carry .whl and part.ac):
#            `SMOL_TIMEOUT=420 9 smol` with grid.UNTIMED_WALLS = True (the walls of the host
#            gaps from untimed chains; off in the committed code): the set in
#            benchmarks/results/untimed_walls_run53/, not packaged.
#   stage 47 run 54, the fourteenth session's first call (carry .whl): sparse_probe.py --set
#            heads (several KV heads per program) at six shapes: slower everywhere; removed.
#   stage 48 run 55 (carry .whl): the sparse GPU tests without it, sparse_probe.py --set
#            pattern (random / sorted / contiguous slots) and benchmarks/gpu/read_roof.py.
#   stage 49 run 56 (carry .whl): sparse_probe.py --set deep (16-key tiles, 4-6 stages).
#   stage 50 run 57 (carry .whl): sparse_probe.py --set warps (1-2 warps, 6-16 per SM).
#   stage 51 run 58 (carry .whl): sparse_probe.py --set w1 (1 warp: stages, programs per SM).
#   stage 52 run 59 (carry .whl and part.aa): kernel and calibrate GPU tests and the kernel table
#            with the one-warp sparse launch; then `p` (part.ab) and `42` (part.ac) at once.
#   stage 53 run 61 (carry .whl): benchmarks/gpu/warps_probe.py, verify attention at 1-2 warps.
#   stage 54 run 62 (carry .whl): benchmarks/gpu/sparse_launch_ab.py, grid draft steps with the
#            one-warp sparse launch against run 33's rule.
#   stage 55 run 63 (carry .whl): kernels.py --quick --only sparse, twice (the margin's spread).
#   stage 56 run 64 (carry .whl): sparse_launch_ab.py --model smollm2-135m.
#   stage 57 run 65 (carry .whl): the same with TILE_ELEMENTS (32-key tiles at D 64), 3 rules.
#   stage 58 run 66 (carry .whl and part.aa): the sparse GPU tests at both head shapes; then
#            `p` (part.ab) and `42` (part.ac, run 67): greedy lossless on the real SmolLM2.
#   stage 59 the fifteenth session's first call (run 68; carry .whl and part.aa, copied to
#            /root/model): the whole kernel and calibrate GPU suites on the final sparse launch.
#   stage 60 run 69 (carry .whl and part.ab, copied): the Qwen3-8B latency set re-measured
#            with the one-warp sparse launch (as `5 q8b`).
#   stage 61 run 70 (carry .whl and part.ac): join the GGUF, greedy lossless on the GPU (`42`),
#            then `8 vb` against the set stage 60 left in $TR (Q8B_SET). Then, at once on the
#            same machine: `9 smol` (run 71, SMOL_TIMEOUT=330: the SmolLM2 latency set), `10`
#            (run 72: regime (a) against it) and run 73, stage 46's validate command with
#            --traces $TR/smollm2-135m-h200 and --time-budget 280 (the fresh draw against it).
#   stage 62 the sixteenth session's first call (run 74; carry .whl): where the B 1 verify
#            call's time goes, by benchmarks/gpu/b1_breakdown.py (split kernel and combine
#            timed apart) and ncu (both kernels' durations; the split kernel in full at NQ 1, 8).
#   stage 63 run 75 (carry .whl): the same probe with its launch variants (b1_breakdown.VARIANTS).
#   stage 64 run 76 (carry .whl): the kernel GPU tests, then the kernel and calibrate GPU
#            suites with Triton's shared-memory limit at an L40S's 99 KB (tests/conftest.py).
#   stage 65 run 77 (carry .whl): benchmarks/gpu/sample_probe.py (the sample phase's GPU and
#            host time; top-p over the top-k survivors as a candidate).
#   stages 66-68, then 10: the seventeenth session's re-measure of both latency sets on runtime
#            revision 3 (the sampler): `66` (run 78, part.aa) the Qwen3-8B set; `67` (run 79,
#            part.ab) the sample probe, calibrate GPU suite, regime (b); `68` (run 80, part.ac)
#            greedy lossless and the SmolLM2 set; `10` (run 81) regime (a) against it. Run 82 (a
#            fresh machine): `p` (part.aa), `p` (part.ab), `46` (part.ac; VALIDATE_TIMEOUT=330
#            VALIDATE_BUDGET=250, as run) the fresh draw against the packaged (run 80) set.
#            As it happened: `66` 503 s, `67` 172 s, `68` 270 s, `10` 211 s, back to back on one
#            machine; `p`, `p`, `46` (236 s) on a second. 25 of the 30 device-minutes.
#   stage 69 run 83 (carry .whl): benchmarks/gpu/tie_rank_probe.py (the sampler's tie ranking).
#   stage 70 run 84 (carry .whl), eighteenth session: the CLI and library changes on the GPU
#            image (no kernel or runtime change): both GPU suites, then a user's first run:
#            `calibrate --quick`, `traces check` and `predict --traces` on the set it made.
#   stage 71 run 85 (carry .whl), nineteenth session: benchmarks/gpu/write_mix_probe.py (what
#            Collect-2-Query's score bytes cost a plain read stream).
#   stage 72 run 86 (carry .whl): the same probe's --readers at B 1 (L2 traffic of programs
#            that split a KV head's query rows).
#   stage 73 run 87 (carry .whl): benchmarks/gpu/ws_probe.py (Triton's warp specialisation on
#            verify's TMA loop at B 1).
#   stage 33 run 34 (carry .whl): the Qwen3-8B latency set again with this session's kernels,
#            as `5 q8b` (same grid), keeping its parts so that a run cut by the timeout resumes
#            in a next call (carry .resume: the returned tgz unpacked to
#            .resume/qwen3-8b-h200). Then `8 vb` against it, once it is packaged.
#   stage 10 regime (a) validated on the machine that just measured the SmolLM2 latency set
#            (run 48 of the thirteenth session: `43`, `p`, `9 smol`, then `10` at once).
#   stage 4  (a fresh machine: first a call that carries part.aa and runs
#            `mkdir -p /root/model && cp .model/smollm2.gguf.part.aa /root/model/`), carry .whl
#            and part.ab: what stage 1's 300 s left out —
#            longdoc at T = 0.6 with 32 prompts (contexts to 7K, as the packaged greedy
#            longdoc), one process per method; sparsities 2, 5, 10, 15 % of the short workloads
#
# The GGUF (98 MB) is over the 64 MiB a call may carry, hence the parts, made with
# `split -n 2 .model/smollm2.gguf .model/smollm2.gguf.part.` (49 MB each since run 7; the
# tracked tree travels with each). Since run 9 the tracked tree is ~20 MB (the 128-window
# acceptance set), so a half no longer fits beside it: split in three (`rm
# .model/smollm2.gguf.part.*; split -n 3 ...`, 33 MB each), carry part.aa with a stage that
# copies it, part.ab with `p` (copies it, at once), and part.ac with the stage that joins
# (join_gguf takes whatever parts /root/model and .model hold).
#
# Run 5 (third session of 2026-11-29), as it happened: stages 0-3 back to back (165 + 310 +
# 230 + 220 s), stage 1's processes cut at 300 s with 20-23 of 40 points each; a fresh machine
# for stage 4 (389 s); benchmarks/gpu/draft_step_probe.py (23 s); a last call measured the
# three points stage 1 had cut (vegas-all s 0.03 T 0.6 of chat/code/reasoning, 38 s). The
# sets were assembled with `vegas-sim traces merge` on the CPU (docs/RESULTS.md, Calibration).
# Run 4 (second session) used stages 1-3 of an earlier version of this script: acceptance ran
# longdoc only, SmolLM2 latency B.C <= 8K, validation 5 + 5 configurations.
# Run 6 (fourth session): `5 q8b` with Q8B_TIMEOUT=540 (466 s, carrying part.aa), `5 smol`
# with ACC_TIMEOUT=200 SMOL_TIMEOUT=300 (336 s: acceptance 167 s, latency 147 s), stage 3 with
# VALIDATE_TIMEOUT=265 VALIDATE_BUDGET=225 (214 s), then `pytest -m gpu tests/kernels
# tests/calibrate` and `calibrate --quick` (90 s). 19.5 of the 30 device-minutes. Later, on a
# fresh machine (part.aa, then part.ab joined as above), `vegas-sim validate` of
# benchmarks/validation/heldout_smollm2_small_batch_x4.csv (--time-budget 280, 300 s).
# Run 7 (fifth session), two machines. First: `7 a` (53 s), `7 smol` (193 s), `7 va` (363 s),
# `7 vb` (110 s). The validation's phase wave showed acceptance (sample) and selection taking
# 0.1-1.1 ms more per iteration in the decoding loop than the grid measured, so a second
# machine re-ran `7 smol` with SMOL_FLAGS=--verify-after-draft (377 s) and `7 va` (312 s).
# About 29 of the 30 device-minutes.
# Run 8 (sixth session), two machines. First: `8 vb` (carry .whl and part.aa; 141 s), `8 va`
# (carry .whl and part.ab; 35 s), then `9 a` (34 s), `9 smol` (333 s: its Quest quest_meta rows
# were lost — fixed since), `9 acc4` (60 s; Quest's point ran out of memory beside the four
# other processes and was redone alone with --retry-failed, 25 s). Second: `pytest -m gpu
# tests/calibrate/test_grid.py` (part.aa copied; 20 s), `9 smol` again (345 s). 20 of the 30
# device-minutes.
# Run 9 (seventh session), two machines (the kernel files of the first were the committed
# ones, copied over the working tree's). First: `11 a` (45 s), `11 acc` (245 s: γ 12 seeds 1
# and 2, 158 s; γ 4, 70 s). Second (a start was refused in between): `12 a` (57 s),
# `12 acc` (394 s: γ 12 167 s, γ 4 169 s; vegas-all γ 12 ran out of memory beside the four
# others and was redone, 47 s), `12 va` (355 s). About 26 of the 30 device-minutes.
# Runs 10-15 (eighth session), kernels only, one machine most of the time (carry .whl):
# `14` (run 10, 167 s), `15` (run 11: the TMA store crashed the process, 69 s), `16` (run 12,
# 68 s), benchmarks/gpu/select_probe.py (run 12b, 7 s), `17` (run 13, 29 s); then, on the warm
# machine, `kernels.py --quick --only verify,select,sparse --rounds 3` (run 14, 29 s),
# tune_kernels.py with SHAPES = B 16 C 128K (run 14b, 13 s) and the same kernels.py call with
# its TUNED_COLLECT entry (run 15, 30 s: results/kernels_h200.csv). A helper's radix top-k
# runs (tests, benchmarks/gpu/topk_probe.py) took about 15 of the 30 device-minutes.
set -u
stage=${1:?stage p, 0-5, 7-70 (see above)}
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
cli=(python3 -c "from vegas_sim.cli import main; main()")
TR=/root/tr
GGUF=/root/model/smollm2.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
D=vegas_sim/traces/default
mkdir -p $TR /root/model
[ -e /root/nographs ] && export VEGAS_SIM_CUDA_GRAPHS=0

gpu_tests() {  # gpu_tests PATH LOG [pytest args...]: the -m gpu tests of PATH, tail into $OUT/LOG
  local path=$1 log=$2
  shift 2
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu "$path" "$@" 2>&1 | tail -8 \
    | tee "$OUT/$log"
}

kernel_table() {  # kernel_table LIMIT_S: the committed kernel table's command (runs 19-33)
  timeout $1 python3 benchmarks/kernels.py --quick --only verify,select,sparse --rounds 3 \
    --step-budget-s 200 --out "$OUT/kernels_h200.csv" 2>&1 | tail -60 | tee "$OUT/kernels.log"
}

finalize() {  # a set cut by its timeout is still usable: merge the points it measured
  python3 -c "from vegas_sim.traces.io import finalize_trace_set as f; f('$1')" 2>&1 | tail -2
}

join_gguf() {  # the parts (all but the last copied to /root/model by earlier calls) -> $GGUF
  cp .model/smollm2.gguf.part.?? /root/model/ 2>/dev/null
  cat /root/model/smollm2.gguf.part.?? > $GGUF
  # sha256sum's status, not tee's (a piped `| tee` hid a mismatch before)
  echo "$SHA  $GGUF" | sha256sum -c - > "$OUT/gguf.txt"
  local rc=$?
  cat "$OUT/gguf.txt"
  return $rc
}

merge_acceptance() {  # the acceptance sets of parallel processes -> $TR/smollm2-135m-real
  local ok=() s
  for s in "$@"; do
    [ -f $s/meta.json ] && finalize $s && ok+=("$s"); tail -2 $s.log
  done
  rm -rf $TR/smollm2-135m-real
  "${cli[@]}" traces merge $TR/smollm2-135m-real "${ok[@]}" 2>&1 | tee "$OUT/acceptance_merge.log"
  rm -rf $TR/smollm2-135m-real/parts
  tar czf "$OUT/smollm2-135m-real.tgz" -C $TR smollm2-135m-real
  tar czf "$OUT/acc_logs.tgz" -C $TR $(cd $TR && ls acc-*.log)
}

case $stage in
59)  # run 68 (carry .whl and part.aa): both GPU suites on the final sparse launch
  cp .model/smollm2.gguf.part.aa /root/model/
  gpu_tests tests/kernels kernel_gpu_tests.log
  gpu_tests tests/calibrate calibrate_gpu_tests.log
  ;;
60)  # run 69 (carry .whl and part.ab): the Qwen3-8B latency set on this runtime
  cp .model/smollm2.gguf.part.ab /root/model/
  Q8B_TIMEOUT=${Q8B_TIMEOUT:-530} bash "$0" 5 q8b
  ;;
61)  # run 70 (carry .whl and part.ac): greedy lossless, then regime (b) against stage 60's set
  bash "$0" 42 || exit 2
  [ -f $TR/qwen3-8b-h200/meta.json ] || { echo "no Qwen3-8B set in $TR"; exit 2; }
  Q8B_SET=$TR/qwen3-8b-h200 bash "$0" 8 vb
  ;;
62)  # run 74 (carry .whl): where the B 1 verify call's time goes (split kernel, combine)
  timeout 240 python3 benchmarks/gpu/b1_breakdown.py --rounds 5 \
    --out "$OUT/b1_breakdown_h200_run74.csv" 2>&1 | tee "$OUT/b1_breakdown_run74.log"
  for nq in 1 8 16; do  # both kernels' durations, caches flushed, clocks left alone
    timeout 90 ncu --profile-from-start off --clock-control none --metrics \
      gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__cycles_active.avg \
      python3 benchmarks/gpu/ncu_verify.py --shape 1:32768:$nq > "$OUT/ncu_b1_nq${nq}_run74.txt" 2>&1
  done
  for nq in 1 8; do  # the split kernel (collect none, pointer loads) in full
    timeout 150 ncu --profile-from-start off --clock-control none --set full \
      -k regex:_verify_attention_kernel -c 1 python3 benchmarks/gpu/ncu_verify.py \
      --shape 1:32768:$nq > "$OUT/ncu_full_b1_nq${nq}_run74.txt" 2>&1
  done
  ;;
63)  # run 75 (carry .whl): the B 1 breakdown with launch variants (TMA at C 32K, stages, M 64)
  timeout 400 python3 benchmarks/gpu/b1_breakdown.py --rounds 5 \
    --out "$OUT/b1_breakdown_h200_run75.csv" 2>&1 | tee "$OUT/b1_breakdown_run75.log"
  ;;
64)  # run 76 (carry .whl): kernel GPU tests (the shared-memory fallback's among them), then
    # the kernel and calibrate GPU suites as on a GPU with 99 KB of shared memory per block
  gpu_tests tests/kernels kernel_gpu_tests_run76.log
  VEGAS_SIM_TEST_SHARED_MEM=101376 timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu \
    -rf tests/kernels tests/calibrate 2>&1 | tail -40 | tee "$OUT/gpu_tests_99kb_run76.log"
  ;;
65)  # run 77 (carry .whl): what the `sample` phase is made of (benchmarks/gpu/sample_probe.py)
  timeout 300 python3 benchmarks/gpu/sample_probe.py --out "$OUT/sample_probe_h200_run77.csv" \
    2>&1 | tee "$OUT/sample_probe_run77.log"
  ;;
66)  # run 78 (carry .whl and part.aa): runtime revision 3 (top-p over the top-k survivors):
    # its sampling GPU test, then the Qwen3-8B latency set
  cp .model/smollm2.gguf.part.aa /root/model/
  gpu_tests tests/calibrate/test_sampling.py sampling_gpu_tests_run78.log
  Q8B_TIMEOUT=${Q8B_TIMEOUT:-530} bash "$0" 5 q8b
  ;;
67)  # run 79 (carry .whl and part.ab): the sample phase on revision 3, the calibrate GPU suite,
    # regime (b) against stage 66's set
  cp .model/smollm2.gguf.part.ab /root/model/
  timeout 120 python3 benchmarks/gpu/sample_probe.py --out "$OUT/sample_probe_h200_run79.csv" \
    2>&1 | tee "$OUT/sample_probe_run79.log"
  gpu_tests tests/calibrate calibrate_gpu_tests_run79.log
  [ -f $TR/qwen3-8b-h200/meta.json ] || { echo "no Qwen3-8B set in $TR"; exit 2; }
  Q8B_SET=$TR/qwen3-8b-h200 bash "$0" 8 vb
  ;;
68)  # run 80 (carry .whl and part.ac): greedy lossless on the real model, the SmolLM2 latency
    # set; then at once stage 10 (regime (a) against it)
  bash "$0" 42 || exit 2
  bash "$0" 9 smol
  ;;
73)  # run 87 (carry .whl): warp specialisation of verify's TMA loop at B 1
  timeout 300 python3 benchmarks/gpu/ws_probe.py --rounds 5 \
    --out "$OUT/ws_probe_h200_run87.csv" 2>&1 | grep -v "^ " | tail -40 | tee "$OUT/ws_probe_run87.log"
  ;;
72)  # run 86 (carry .whl): 1, 2 or 4 programs reading each K/V tile at B 1
  timeout 200 python3 benchmarks/gpu/write_mix_probe.py --readers 1:32768,1:131072,4:32768 \
    --rounds 5 --out "$OUT/readers_h200_run86.csv" 2>&1 | tee "$OUT/readers_run86.log"
  ;;
71)  # run 85 (carry .whl): Collect-2-Query's score bytes in a plain read stream
  timeout 300 python3 benchmarks/gpu/write_mix_probe.py --rounds 5 \
    --out "$OUT/write_mix_h200_run85.csv" 2>&1 | tee "$OUT/write_mix_run85.log"
  ;;
70)  # run 84 (carry .whl): both GPU suites, then calibrate --quick -> traces check -> predict
  gpu_tests tests/kernels kernel_gpu_tests_run84.log
  gpu_tests tests/calibrate calibrate_gpu_tests_run84.log
  s0=$(date +%s)
  timeout 150 "${cli[@]}" calibrate --quick --model qwen3-8b --weights random \
    --out $TR/quick 2>&1 | tail -3 | tee "$OUT/quick_run84.log"
  echo "calibrate --quick wall: $(( $(date +%s) - s0 )) s" | tee -a "$OUT/quick_run84.log"
  "${cli[@]}" traces check $TR/quick 2>&1 | tail -2 | tee -a "$OUT/quick_run84.log"
  "${cli[@]}" predict --traces $TR/quick --gamma 4 --batch 2 --context 4K 2>&1 \
    | tee -a "$OUT/quick_run84.log"
  ;;
69)  # run 83 (carry .whl): where revision 3's sampler spends its time beyond torch.topk
  timeout 120 python3 benchmarks/gpu/tie_rank_probe.py --out "$OUT/tie_rank_probe_h200_run83.csv" \
    2>&1 | tee "$OUT/tie_rank_probe_run83.log"
  ;;
p)  # copy the carried GGUF part(s) for a later join_gguf
  cp .model/smollm2.gguf.part.?? /root/model/ && ls -la /root/model
  ;;
0)
  cp .model/smollm2.gguf.part.aa /root/model/
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv \
    | tee "$OUT/gpu.txt"
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels 2>&1 \
    | tail -15 | tee "$OUT/kernel_gpu_tests.log"
  # Graphed decoding must give eager decoding's tokens; if it does not, the session measures
  # eagerly (and says so in graphs.txt) rather than not at all.
  timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/calibrate/test_specdec.py \
    -k graphed 2>&1 | tail -8 | tee "$OUT/graph_tests.log"
  grep -q " passed" "$OUT/graph_tests.log" && ! grep -q "failed\|error" "$OUT/graph_tests.log" \
    || { touch /root/nographs; echo "CUDA graphs OFF" | tee "$OUT/graphs.txt"; }
  [ -e /root/nographs ] && export VEGAS_SIM_CUDA_GRAPHS=0
  # The --quick preset (issue 4: < 2 minutes on the H200), timed; doubles as the smoke run of
  # every latency path.
  s0=$(date +%s)
  timeout 150 "${cli[@]}" calibrate --quick --model qwen3-8b --weights random \
    --out /tmp/quick-q8b 2>&1 | tail -3 | tee "$OUT/quick.log"
  echo "calibrate --quick wall: $(( $(date +%s) - s0 )) s" | tee -a "$OUT/quick.log"
  timeout 170 python3 benchmarks/kernels.py --quick --out "$OUT/kernels_h200_run5.csv" 2>&1 \
    | tee "$OUT/kernels_run5.log" | tail -40
  ;;
1)
  join_gguf || exit 2
  export VEGAS_SIM_SMOLLM2_GGUF=$GGUF
  sets=()
  for w in longdoc reasoning chat code; do
    for t in 0 0.6; do
      out=$TR/acc-$w-t$t; sets+=("$out")
      timeout ${ACC_TIMEOUT:-300} "${cli[@]}" calibrate --model $GGUF --weights real \
        --methods all --no-latency --gamma 12 --sparsity 0.01,0.02,0.03,0.05,0.07,0.1,0.15,0.2 \
        --workload $w --temperature $t --iterations 32 --prompts 16 --min-tokens 32 \
        --out $out > $TR/acc-$w-t$t.log 2>&1 &
    done
  done
  wait
  merge_acceptance "${sets[@]}"
  ;;
2)
  export VEGAS_SIM_SMOLLM2_GGUF=$GGUF
  timeout ${SMOL_TIMEOUT:-270} "${cli[@]}" calibrate --model $GGUF --weights real --methods all \
    --no-acceptance --batch 1..64:x2 --context 1K,2K,4K,7K --n-query 1 \
    --gamma 1,3,7,12 --sparsity 0.01,0.05,0.2 --min-tokens 32 --temperature 0,0.6 \
    --out $TR/smollm2-135m-h200 2>&1 | tail -6 | tee "$OUT/smol_latency.log"
  finalize $TR/smollm2-135m-h200
  tar czf "$OUT/smollm2-135m-h200.tgz" -C $TR smollm2-135m-h200
  # Qwen3-8B at B.C = 512K (the packaged set stops at 256K but for B 64 x 8K, B 128 x 4K):
  # one (B, C) point per run, merged into a copy of the packaged set.
  parts=("$D/qwen3-8b-h200")
  for bc in 32:16K 16:32K 8:64K 4:128K; do
    out=$TR/q8b-${bc/:/x}; parts+=("$out")
    timeout ${Q8B_TIMEOUT:-60} "${cli[@]}" calibrate --model qwen3-8b --weights random \
      --methods all --batch ${bc%%:*} --context ${bc##*:} --n-query 1 --gamma 1,3,7,15 \
      --sparsity 0.01,0.05,0.2 --out $out 2>&1 | tail -3 | tee -a "$OUT/q8b_latency.log"
    [ -f $out/meta.json ] && finalize $out || unset 'parts[-1]'
  done
  rm -rf $TR/qwen3-8b-h200
  "${cli[@]}" traces merge $TR/qwen3-8b-h200 "${parts[@]}" 2>&1 | tee -a "$OUT/q8b_latency.log"
  tar czf "$OUT/qwen3-8b-h200.tgz" -C $TR qwen3-8b-h200
  ;;
3)
  export VEGAS_SIM_SMOLLM2_GGUF=$GGUF SMOL_TRACES=$TR/smollm2-135m-h200 \
    Q8B_TRACES=$TR/qwen3-8b-h200 ACC_TRACES=$TR/smollm2-135m-real
  VALIDATE_TIMEOUT=${VALIDATE_TIMEOUT:-270} VALIDATE_BUDGET=${VALIDATE_BUDGET:-235} \
    bash benchmarks/gpu/validate_h200.sh
  ;;
5)
  export VEGAS_SIM_SMOLLM2_GGUF=$GGUF
  if [ "${2:-q8b}" = q8b ]; then
    timeout ${Q8B_TIMEOUT:-560} "${cli[@]}" calibrate --model qwen3-8b --weights random \
      --methods all --batch 1..128:x2 --context 1K..128K:x2 --n-query 1 --gamma 1,3,7,15 \
      --sparsity 0.01,0.05,0.2 --out $TR/qwen3-8b-h200 2>&1 | tail -6 | tee "$OUT/q8b.log"
    finalize $TR/qwen3-8b-h200; rm -rf $TR/qwen3-8b-h200/parts
    tar czf "$OUT/qwen3-8b-h200.tgz" -C $TR qwen3-8b-h200
  else  # smol: the GGUF's second half, the acceptance set, then the latency set
    join_gguf || exit 2
    # Acceptance: one process per workload x temperature (host-bound; they share the GPU),
    # each method's 8 sparsities decoded as one batch (grid.measure_acceptance_group).
    s0=$(date +%s); sets=()
    for w in longdoc reasoning chat code; do
      for t in 0 0.6; do
        out=$TR/acc-$w-t$t; sets+=("$out")
        OMP_NUM_THREADS=2 timeout ${ACC_TIMEOUT:-200} "${cli[@]}" calibrate --model $GGUF \
          --weights real --methods all --no-latency --gamma 12 \
          --sparsity 0.01,0.02,0.03,0.05,0.07,0.1,0.15,0.2 --workload $w --temperature $t \
          --iterations 32 --prompts $([ $w = longdoc ] && echo 32 || echo 16) \
          --min-tokens 32 --out $out > $out.log 2>&1 &
      done
    done
    wait
    echo "acceptance wall: $(( $(date +%s) - s0 )) s" | tee "$OUT/acceptance_wall.txt"
    merge_acceptance "${sets[@]}"
    timeout ${SMOL_TIMEOUT:-300} "${cli[@]}" calibrate --model $GGUF --weights real \
      --methods all --no-acceptance --batch 1..64:x2 --context 1K,2K,4K,7K --n-query 1 \
      --gamma 1,3,7,12 --sparsity 0.01,0.05,0.2 --min-tokens 32 --temperature 0,0.6 \
      --out $TR/smollm2-135m-h200 2>&1 | tail -6 | tee "$OUT/smol_latency.log"
    finalize $TR/smollm2-135m-h200; rm -rf $TR/smollm2-135m-h200/parts
    tar czf "$OUT/smollm2-135m-h200.tgz" -C $TR smollm2-135m-h200
    # stage 3 reads the acceptance set from $TR: the packaged one if this one failed
    [ -f $TR/smollm2-135m-real/meta.json ] || cp -r $D/smollm2-135m-real $TR/
  fi
  ;;
7)
  export VEGAS_SIM_SMOLLM2_GGUF=$GGUF
  val=(validate --acceptance-traces $D/smollm2-135m-real --seed 0)
  case ${2:?7 a, smol, va or vb} in
  a)
    cp .model/smollm2.gguf.part.aa /root/model/
    nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv \
      | tee "$OUT/gpu.txt"
    printf 'method,gamma,sparsity,batch,context,output_len,waves\nvegas,3,0.06,3,3000,16,2\nvanilla,1,1.0,3,3000,16,1\n' \
      > /tmp/smoke.csv
    timeout 120 "${cli[@]}" "${val[@]}" --traces $D/qwen3-8b-h200 --model qwen3-8b \
      --weights random --heldout /tmp/smoke.csv --out "$OUT/validate_smoke.csv" 2>&1 \
      | tail -6 | tee "$OUT/validate_smoke.log"
    timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/calibrate 2>&1 \
      | tail -6 | tee "$OUT/calibrate_gpu_tests.log"
    ;;
  smol)
    join_gguf || exit 2
    timeout ${SMOL_TIMEOUT:-400} "${cli[@]}" calibrate --model $GGUF --weights real \
      --methods all --no-acceptance --batch 1..64:x2 --context 1K,2K,4K,7K --n-query 1 \
      --gamma 1,3,7,12 --sparsity 0.01,0.05,0.2 --min-tokens 32 --temperature 0,0.6 \
      ${SMOL_FLAGS:-} --out $TR/smollm2-135m-h200 2>&1 | tail -6 | tee "$OUT/smol_latency.log"
    finalize $TR/smollm2-135m-h200; rm -rf $TR/smollm2-135m-h200/parts
    tar czf "$OUT/smollm2-135m-h200.tgz" -C $TR smollm2-135m-h200
    ;;
  va)
    timeout ${VALIDATE_TIMEOUT:-570} "${cli[@]}" "${val[@]}" --traces $TR/smollm2-135m-h200 \
      --model $GGUF --weights real --heldout benchmarks/validation/heldout_smollm2.csv \
      --time-budget ${VALIDATE_BUDGET:-500} --out "$OUT/validate_h200_smollm2.csv" \
      > "$OUT/validate_h200_smollm2.log" 2>&1
    echo "smollm2 rc=$?" | tee -a "$OUT/validate_h200_smollm2.log"
    tail -8 "$OUT/validate_h200_smollm2.log"
    ;;
  vb)
    timeout ${VALIDATE_TIMEOUT:-300} "${cli[@]}" "${val[@]}" --traces $D/qwen3-8b-h200 \
      --model qwen3-8b --weights random --heldout benchmarks/validation/heldout_qwen3_8b.csv \
      --time-budget ${VALIDATE_BUDGET:-250} --out "$OUT/validate_h200_qwen3_8b.csv" \
      > "$OUT/validate_h200_qwen3_8b.log" 2>&1
    echo "qwen3-8b rc=$?" | tee -a "$OUT/validate_h200_qwen3_8b.log"
    tail -8 "$OUT/validate_h200_qwen3_8b.log"
    ;;
  esac
  ;;
8)
  case ${2:?8 vb, va or q8b} in
  vb)
    [ -f .model/smollm2.gguf.part.aa ] && cp .model/smollm2.gguf.part.aa /root/model/
    for f in heldout_qwen3_8b heldout_qwen3_8b_span; do
      timeout ${VALIDATE_TIMEOUT:-300} "${cli[@]}" validate --traces ${Q8B_SET:-$D/qwen3-8b-h200} \
        --acceptance-traces $D/smollm2-135m-real --seed 0 --model qwen3-8b --weights random \
        --heldout benchmarks/validation/$f.csv --time-budget ${VALIDATE_BUDGET:-250} \
        --out "$OUT/validate_h200_${f#heldout_}.csv" > "$OUT/validate_h200_${f#heldout_}.log" 2>&1
      echo "$f rc=$?"; tail -7 "$OUT/validate_h200_${f#heldout_}.log"
    done
    ;;
  va)  # carry .whl and part.ab (part.aa copied to /root/model by `8 vb`)
    join_gguf || exit 2
    export VEGAS_SIM_SMOLLM2_GGUF=$GGUF
    timeout ${VALIDATE_TIMEOUT:-300} "${cli[@]}" validate --traces $D/smollm2-135m-h200 \
      --acceptance-traces $D/smollm2-135m-real --seed 0 --model $GGUF --weights real \
      --heldout benchmarks/validation/heldout_smollm2_span.csv --time-budget ${VALIDATE_BUDGET:-250} \
      --out "$OUT/validate_h200_smollm2_span.csv" > "$OUT/validate_h200_smollm2_span.log" 2>&1
    echo "smollm2 span rc=$?"; tail -7 "$OUT/validate_h200_smollm2_span.log"
    ;;
  q8b)
    timeout ${Q8B_TIMEOUT:-560} "${cli[@]}" calibrate --model qwen3-8b --weights random \
      --methods all --batch 1..128:x2 --context 1K..128K:x2 --n-query 1 --gamma 1,3,7,15 \
      --sparsity 0.01,0.05,0.2 ${Q8B_FLAGS:-} --out $TR/qwen3-8b-h200 2>&1 | tail -6 \
      | tee "$OUT/q8b.log"
    finalize $TR/qwen3-8b-h200; rm -rf $TR/qwen3-8b-h200/parts
    tar czf "$OUT/qwen3-8b-h200.tgz" -C $TR qwen3-8b-h200
    ;;
  esac
  ;;
9)
  export VEGAS_SIM_SMOLLM2_GGUF=$GGUF
  case ${2:?9 a, smol or acc4} in
  a)  # carry .whl and part.aa
    cp .model/smollm2.gguf.part.aa /root/model/
    timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/calibrate 2>&1 \
      | tail -6 | tee "$OUT/calibrate_gpu_tests.log"
    ;;
  smol)  # carry .whl and part.ab: the SmolLM2 latency set with 'other' recorded apart
    join_gguf || exit 2
    timeout ${SMOL_TIMEOUT:-480} "${cli[@]}" calibrate --model $GGUF --weights real \
      --methods all --no-acceptance --batch 1..64:x2 --context 1K,2K,4K,7K --n-query 1 \
      --gamma 1,3,7,12 --sparsity 0.01,0.05,0.2 --min-tokens 32 --temperature 0,0.6 \
      --verify-after-draft --out $TR/smollm2-135m-h200 2>&1 | tail -6 \
      | tee "$OUT/smol_latency.log"
    finalize $TR/smollm2-135m-h200; rm -rf $TR/smollm2-135m-h200/parts
    tar czf "$OUT/smollm2-135m-h200.tgz" -C $TR smollm2-135m-h200
    ;;
  acc4)  # right after `9 smol` (the joined GGUF): longdoc T 0.6 acceptance traced at γ 4
    for m in magicdec-stream magicdec-quest specextend vegas vegas-all; do
      timeout ${ACC_TIMEOUT:-240} "${cli[@]}" calibrate --model $GGUF --weights real \
        --no-latency --gamma 4 --iterations 64 --min-tokens 32 --methods $m \
        --sparsity 0.01,0.02,0.03,0.05,0.07,0.1,0.15,0.2 --workload longdoc --temperature 0.6 \
        --prompts 32 --out $TR/acc-g4-$m > $TR/acc-g4-$m.log 2>&1 &
    done
    wait
    for s in $TR/acc-g4-*/; do [ -f $s/meta.json ] && finalize $s; rm -rf $s/parts; done
    tail -n 3 $TR/acc-g4-*.log
    tar czf "$OUT/acc_g4.tgz" -C $TR $(cd $TR && ls -d acc-g4-*)
    ;;
  esac
  ;;
10)
  # regime (a) on the machine that measures its latency set, as run 7 did — SmolLM2 at B <= 3
  # is host-bound and machines differ by up to ~4 %. Run 48: `43` (part.aa), `p` (part.ab),
  # `9 smol` (part.ac, 248 s), then at once `10` (234 s): the 24 seeded rows and the 3 span
  # rows against the set `9 smol` left in $TR.
  # (file, timeout, time budget) as `12 va`: the 24 seeded rows took 312-363 s in run 7.
  export VEGAS_SIM_SMOLLM2_GGUF=$GGUF
  [ -f $TR/smollm2-135m-h200/meta.json ] || { echo "no latency set in $TR"; exit 2; }
  for spec in heldout_smollm2:400:340 heldout_smollm2_span:140:90; do
    IFS=: read -r f tmo budget <<< "$spec"
    timeout $tmo "${cli[@]}" validate --traces $TR/smollm2-135m-h200 \
      --acceptance-traces $D/smollm2-135m-real --seed 0 --model $GGUF --weights real \
      --heldout benchmarks/validation/$f.csv --time-budget $budget \
      --out "$OUT/validate_h200_${f#heldout_}.csv" > "$OUT/validate_h200_${f#heldout_}.log" 2>&1
    echo "$f rc=$?"; tail -7 "$OUT/validate_h200_${f#heldout_}.log"
  done
  ;;
11)
  # seventh session: longdoc T 0.6 acceptance of the cut windows (grid.cut_prompts: every
  # 2K/4K/7K window cut to each shorter window length, 48 prompts), to be merged into the
  # packaged acceptance set. `11 a` (carry .whl and part.aa) copies the first half and runs
  # the calibrate GPU tests; `11 acc` (carry .whl and part.ab) at once after it: γ 12, 32
  # iterations, seeds 1 and 2 (the natural windows have two replicates), then γ 4, 64
  # iterations, seed 1 (one replicate); one process per method, OOM points redone alone.
  export VEGAS_SIM_SMOLLM2_GGUF=$GGUF
  case ${2:?11 a or acc} in
  a)
    cp .model/smollm2.gguf.part.aa /root/model/
    timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/calibrate 2>&1 \
      | tail -6 | tee "$OUT/calibrate_gpu_tests.log"
    ;;
  acc)
    join_gguf || exit 2
    cut() {  # method gamma iterations seed
      local out=$TR/cut-g$2-s$4-$1 args
      args=(calibrate --model $GGUF --weights real --no-latency --gamma $2 --iterations $3
            --min-tokens 32 --methods $1 --sparsity 0.01,0.02,0.03,0.05,0.07,0.1,0.15,0.2
            --workload longdoc --temperature 0.6 --prompts 32 --acceptance-cuts only
            --seed $4 --out $out)
      OMP_NUM_THREADS=2 timeout ${ACC_TIMEOUT:-200} "${cli[@]}" "${args[@]}" > $out.log 2>&1
      OMP_NUM_THREADS=2 timeout 100 "${cli[@]}" "${args[@]}" --retry-failed >> $out.log 2>&1
    }
    s0=$(date +%s)
    for m in magicdec-stream magicdec-quest specextend vegas vegas-all; do
      (cut $m 12 32 1; cut $m 12 32 2) &
    done
    wait
    echo "γ 12 wall: $(( $(date +%s) - s0 )) s" | tee "$OUT/cut_wall.txt"
    for m in magicdec-stream magicdec-quest specextend vegas vegas-all; do
      cut $m 4 64 1 &
    done
    wait
    echo "all wall: $(( $(date +%s) - s0 )) s" | tee -a "$OUT/cut_wall.txt"
    for s in $TR/cut-*/; do [ -f $s/meta.json ] && finalize $s; rm -rf $s/parts; done
    tail -n 3 $TR/cut-*.log > "$OUT/cut_logs.txt"
    tar czf "$OUT/acc_cut.tgz" -C $TR $(cd $TR && ls -d cut-*)
    ;;
  esac
  ;;
12)
  # seventh session, second machine: the longdoc workload now has 32 windows per length
  # (128; the first 32 are the old set). `12 a` (carry .whl and part.aa): the kernel GPU
  # tests and the fused-combine benchmark (the b1 step), part.aa copied; `12 acc` (carry .whl
  # and part.ab) at once: join, longdoc T 0.6 acceptance of all 128 windows at γ 12 (32
  # iterations) and γ 4 (64 iterations), one process per method; `12 va` at once: regime (a)
  # (24 seeded + 3 span rows) against the packaged sets (re-predicted on the CPU after).
  export VEGAS_SIM_SMOLLM2_GGUF=$GGUF
  case ${2:?12 a, acc or va} in
  a)
    cp .model/smollm2.gguf.part.aa /root/model/
    timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels 2>&1 \
      | tail -8 | tee "$OUT/kernel_gpu_tests.log"
    timeout 200 python3 benchmarks/kernels.py --only b1 --out "$OUT/kernels_h200_fused.csv" \
      2>&1 | tail -45 | tee "$OUT/kernels_fused.log"
    ;;
  acc)
    join_gguf || exit 2
    acc128() {  # method gamma iterations timeout [--retry-failed]
      OMP_NUM_THREADS=2 timeout $4 "${cli[@]}" calibrate --model $GGUF --weights real \
        --no-latency --gamma $2 --iterations $3 --min-tokens 32 --methods $1 \
        --sparsity 0.01,0.02,0.03,0.05,0.07,0.1,0.15,0.2 --workload longdoc --temperature 0.6 \
        --prompts 128 --acceptance-cuts none --out $TR/w128-g$2-$1 ${5:-} >> $TR/w128-g$2-$1.log 2>&1
    }
    s0=$(date +%s)
    for m in magicdec-stream magicdec-quest specextend vegas vegas-all; do
      acc128 $m 12 32 ${T12:-240} & sleep 2
    done
    wait; echo "γ 12 wall: $(( $(date +%s) - s0 )) s" | tee "$OUT/w128_wall.txt"
    for m in magicdec-stream magicdec-quest specextend vegas vegas-all; do
      acc128 $m 4 64 ${T4:-200} & sleep 2
    done
    wait; echo "γ 4 wall: $(( $(date +%s) - s0 )) s" | tee -a "$OUT/w128_wall.txt"
    for s in $TR/w128-*/; do
      grep -qs '"oom"' $s/progress.jsonl || continue
      g=$(basename $s | cut -d- -f2); m=$(basename $s | cut -d- -f3-)
      acc128 $m ${g#g} $([ ${g#g} = 12 ] && echo 32 || echo 64) 60 --retry-failed
    done
    echo "all wall: $(( $(date +%s) - s0 )) s" | tee -a "$OUT/w128_wall.txt"
    for s in $TR/w128-*/; do [ -f $s/meta.json ] && finalize $s; rm -rf $s/parts; done
    tail -n 3 $TR/w128-*.log > "$OUT/w128_logs.txt"
    tar czf "$OUT/acc_w128.tgz" -C $TR $(cd $TR && ls -d w128-*)
    ;;
  va)  # (file, timeout, time budget): the 24 seeded rows took 312-363 s in run 7
    for spec in heldout_smollm2:400:340 heldout_smollm2_span:140:90; do
      IFS=: read -r f tmo budget <<< "$spec"
      timeout $tmo "${cli[@]}" validate --traces $D/smollm2-135m-h200 \
        --acceptance-traces $D/smollm2-135m-real --seed 0 --model $GGUF --weights real \
        --heldout benchmarks/validation/$f.csv --time-budget $budget \
        --out "$OUT/validate_h200_${f#heldout_}.csv" > "$OUT/validate_h200_${f#heldout_}.log" 2>&1
      echo "$f rc=$?"; tail -7 "$OUT/validate_h200_${f#heldout_}.log"
    done
    ;;
  esac
  ;;
13)
  # next session's first call (no GGUF needed): the kernel GPU tests with run 9's new
  # Collect-2-Query default (STAGES_COLLECT = 4: timed in run 9, not yet checked there for
  # correctness), then the whole --quick benchmark for the PASS/FAIL table of issue #3.
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels 2>&1 \
    | tail -8 | tee "$OUT/kernel_gpu_tests.log"
  timeout ${KERNELS_TIMEOUT:-360} python3 benchmarks/kernels.py --quick \
    --out "$OUT/kernels_h200.csv" 2>&1 | tail -80 | tee "$OUT/kernels.log"
  ;;
14)
  # the eighth session's first call (run 10): the launch-config sweeps behind the kernel
  # defaults (Collect-2-Query per shape, the PDL combine at B = 1, score_weights blocks), then
  # the kernel GPU tests (run 9's 4-stage Collect-2-Query default, the PDL combine).
  timeout ${TUNE_TIMEOUT:-330} python3 benchmarks/gpu/tune_kernels.py --out "$OUT/tune_run10.csv" \
    > "$OUT/tune_run10.log" 2>&1
  echo "tune rc=$?"; grep -v "^    failed" "$OUT/tune_run10.log" | tail -60
  timeout 220 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels 2>&1 \
    | tail -8 | tee "$OUT/kernel_gpu_tests.log"
  ;;
15)
  # run 11: GPU kernel tests first (the TMA score store is new), then the TMA Collect-2-Query
  # candidates per shape and the score_weights blocks around run 10's winner, then the radix
  # top-k probe when it exists. A record: the TMA store and tune_kernels.py's "tma" tile set
  # were removed after this run (results/h200/tma_store_run11.patch).
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels 2>&1 \
    | tail -12 | tee "$OUT/kernel_gpu_tests.log"
  timeout ${TUNE_TIMEOUT:-300} python3 benchmarks/gpu/tune_kernels.py --parts weights,collect \
    --tiles tma --out "$OUT/tune_run11.csv" > "$OUT/tune_run11.log" 2>&1
  echo "tune rc=$?"; grep -v "^    failed" "$OUT/tune_run11.log" | tail -40
  grep -c "^    failed" "$OUT/tune_run11.log"; grep -m3 "^    failed" "$OUT/tune_run11.log"
  if [ -f benchmarks/gpu/topk_probe.py ]; then
    timeout 90 python3 benchmarks/gpu/topk_probe.py 2>&1 | tail -20 | tee "$OUT/topk_probe.log"
  fi
  ;;
16)
  # run 12, the eighth session's last call: kernel GPU tests (radix top-k now in
  # topk_select), then the --quick benchmark's verify grid, selection and sparse draft with the
  # new defaults (score_weights blocks, B=16 Collect-2-Query splits, radix top-k).
  timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels 2>&1 \
    | tail -8 | tee "$OUT/kernel_gpu_tests.log"
  timeout ${KERNELS_TIMEOUT:-300} python3 benchmarks/kernels.py --quick --only verify,select,sparse \
    --step-budget-s 240 --out "$OUT/kernels_h200.csv" 2>&1 | tail -70 | tee "$OUT/kernels.log"
  ;;
17)
  # run 13: the --quick verify grid and selection step again, each verify call timed in 3
  # interleaved rounds (fastest kept): run 12's single timings of one C2Q call varied by 13 %.
  timeout ${KERNELS_TIMEOUT:-300} python3 benchmarks/kernels.py --quick --only verify,select \
    --rounds 3 --step-budget-s 240 --out "$OUT/kernels_h200.csv" 2>&1 | tail -45 \
    | tee "$OUT/kernels.log"
  ;;
18)
  # run 16 ran a shortened form on the session's last device-minutes (test_topk.py only, the
  # calibrate GPU tests and the selection step, all with VEGAS_SIM_RADIX_TOPK=1; 114 s): all
  # passed, RADIX_TOPK is on since. Kept as the full check: the radix top-k with its tie rule
  # and topk_select's index sort. GPU kernel tests (test_topk.py's repeatability test), the calibrate GPU tests with
  # VEGAS_SIM_RADIX_TOPK=1 (eager vs graphed drafts must still agree), then the selection
  # step with it on. If all pass, set selection.RADIX_TOPK's default to on.
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels 2>&1 \
    | tail -8 | tee "$OUT/kernel_gpu_tests.log"
  VEGAS_SIM_RADIX_TOPK=1 timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/calibrate 2>&1 | tail -8 | tee "$OUT/calibrate_gpu_tests_radix.log"
  VEGAS_SIM_RADIX_TOPK=1 timeout 150 python3 benchmarks/kernels.py --quick --only select \
    --rounds 3 --out "$OUT/kernels_select_radix.csv" 2>&1 | tail -12 | tee "$OUT/select.log"
  ;;
19)
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels 2>&1 \
    | tail -8 | tee "$OUT/kernel_gpu_tests.log"
  timeout 180 python3 benchmarks/gpu/c2q_probe.py --out "$OUT/c2q_probe.csv" 2>&1 \
    | tail -90 | tee "$OUT/c2q_probe.log"
  timeout 90 python3 benchmarks/kernels.py --quick --only select --rounds 3 \
    --out "$OUT/kernels_select.csv" 2>&1 | tail -12 | tee "$OUT/select.log"
  timeout 160 python3 -m pytest -q -p no:cacheprovider -m gpu tests/calibrate 2>&1 \
    | tail -8 | tee "$OUT/calibrate_gpu_tests.log"
  ;;
20)
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/calibrate 2>&1 \
    | tail -8 | tee "$OUT/calibrate_gpu_tests.log"
  timeout 240 python3 benchmarks/kernels.py --quick --only verify,select,sparse --rounds 3 \
    --step-budget-s 200 --out "$OUT/kernels_h200.csv" 2>&1 | tail -60 | tee "$OUT/kernels.log"
  timeout 100 python3 benchmarks/gpu/c2q_probe.py --rounds 5 --out "$OUT/c2q_probe_cs.csv" \
    --shapes 4:131072:8,4:131072:16,1:131072:8 \
    --candidates "rows (default),rows cs,rows evict,rows cs evict" 2>&1 | tail -20 \
    | tee "$OUT/c2q_probe_cs.log"
  timeout 60 python3 benchmarks/gpu/topk_probe.py 2>&1 | tail -25 | tee "$OUT/topk_probe.log"
  ;;
21)
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels 2>&1 \
    | tail -8 | tee "$OUT/kernel_gpu_tests.log"
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/calibrate 2>&1 \
    | tail -8 | tee "$OUT/calibrate_gpu_tests.log"
  timeout 60 python3 benchmarks/gpu/topk_probe.py 2>&1 | tail -25 | tee "$OUT/topk_probe.log"
  timeout 200 python3 benchmarks/kernels.py --quick --only verify,select,sparse --rounds 3 \
    --step-budget-s 180 --out "$OUT/kernels_h200.csv" 2>&1 | tail -60 | tee "$OUT/kernels.log"
  ;;
22)
  timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_attention.py \
    -k real_shapes 2>&1 | tail -8 | tee "$OUT/kernel_gpu_tests.log"
  timeout 200 python3 benchmarks/gpu/c2q_probe.py --out "$OUT/c2q_probe.csv" \
    --candidates "rows (default),rows asm,rows asm2,rows asm2 m16" 2>&1 | tail -45 \
    | tee "$OUT/c2q_probe.log"
  ;;
23)
  gpu_tests tests/kernels/test_attention.py kernel_gpu_tests.log
  timeout 400 python3 benchmarks/gpu/tma_probe.py --out "$OUT/tma_probe.csv" 2>&1 | tail -90 \
    | tee "$OUT/tma_probe.log"
  ;;
24)
  timeout 420 python3 benchmarks/gpu/tma_probe.py --out "$OUT/tma_probe.csv" 2>&1 | tail -140 \
    > "$OUT/tma_probe.log"
  timeout 120 ncu --profile-from-start off --section SourceCounters --section WarpStateStats \
    --section Occupancy -k regex:_verify_attention_kernel -o "$OUT/nq1" \
    python3 benchmarks/gpu/ncu_verify.py --shape 4:131072:1 > "$OUT/ncu_nq1.log" 2>&1
  ncu -i "$OUT/nq1.ncu-rep" --page source --csv --print-source sass | gzip > "$OUT/nq1_sass.csv.gz"
  ncu -i "$OUT/nq1.ncu-rep" > "$OUT/nq1_details.txt"
  ;;
25)
  timeout 540 python3 benchmarks/gpu/tma_probe.py --set run24 --out "$OUT/tma_probe.csv" \
    2>&1 | tail -160 > "$OUT/tma_probe.log"
  ;;
26|35)  # 35: the same with a 230 s limit for the table
  gpu_tests tests/kernels kernel_gpu_tests.log
  gpu_tests tests/calibrate calibrate_gpu_tests.log
  kernel_table $([ $stage = 26 ] && echo 220 || echo 230)
  ;;
27)
  timeout 300 python3 benchmarks/gpu/tma_probe.py --set run26 --out "$OUT/tma_probe.csv" \
    --shapes 4:131072:8,16:131072:8,16:32768:16,4:131072:16,16:32768:8 2>&1 | tail -60 \
    | tee "$OUT/tma_probe.log"
  ;;
28)
  timeout 200 python3 benchmarks/gpu/tma_probe.py --set run27 --out "$OUT/tma_probe.csv" \
    --shapes 4:131072:8,16:131072:8,4:131072:16,4:131072:1,1:32768:8 2>&1 | tail -30 \
    | tee "$OUT/tma_probe.log"
  ;;
29)
  gpu_tests tests/kernels kernel_gpu_tests.log
  timeout 100 python3 benchmarks/gpu/tma_probe.py --set run26 --rounds 1 --out "$OUT/smoke.csv" \
    --shapes 1:32768:8 --candidates c2q,"c2q slice" 2>&1 | tail -5 | tee "$OUT/probe_smoke.log"
  timeout 100 python3 benchmarks/gpu/c2q_probe.py --rounds 1 --out "$OUT/smoke2.csv" \
    --shapes 1:32768:8 2>&1 | tail -5 | tee -a "$OUT/probe_smoke.log"
  ;;
30)
  gpu_tests tests/kernels/test_attention.py kernel_gpu_tests.log -k tma
  timeout 200 python3 benchmarks/gpu/tma_probe.py --set run29 --out "$OUT/tma_probe.csv" \
    --shapes 4:131072:8,4:131072:16,16:131072:8,16:32768:16,4:131072:1,1:32768:8,4:32768:8,1:131072:8 \
    2>&1 | tail -30 | tee "$OUT/tma_probe.log"
  ;;
31)
  timeout 200 python3 benchmarks/gpu/tma_probe.py --set run30 --out "$OUT/tma_probe.csv" \
    --shapes 4:131072:16,16:32768:16,4:131072:8,4:131072:1 2>&1 | tail -30 \
    | tee "$OUT/tma_probe.log"
  ;;
32)
  kernel_table 230
  ;;
34)
  timeout 400 python3 benchmarks/gpu/sparse_probe.py --out "$OUT/sparse_probe.csv" 2>&1 \
    | tail -200 | tee "$OUT/sparse_probe.log"
  ;;
37)
  gpu_tests tests/kernels/test_topk.py topk_gpu_tests.log
  timeout 120 python3 benchmarks/kernels.py --quick --only select --rounds 3 \
    --out "$OUT/kernels_select.csv" 2>&1 | grep -A3 "radix_topk\|Vegas selection" \
    | tee "$OUT/kernels_select.log"
  bash "$0" 36
  ;;
44)
  gpu_tests tests/kernels kernel_gpu_tests.log
  kernel_table 330
  ;;
58)  # carry .whl and part.aa: the sparse GPU tests (SmolLM2's D 64 too); then `p` (part.ab), `42`
  cp .model/smollm2.gguf.part.aa /root/model/
  gpu_tests tests/kernels/test_attention.py sparse_gpu_tests.log -k sparse
  ;;
57)  # run 65 (carry .whl): sparse_launch_ab.py for SmolLM2 again, with the head-dim-scaled tiles
  timeout 240 python3 benchmarks/gpu/sparse_launch_ab.py --model smollm2-135m 2>&1 \
    | tee "$OUT/sparse_launch_ab_smollm2.log" | grep -v Warning | tail -40
  ;;
56)  # run 64 (carry .whl): sparse_launch_ab.py for the SmolLM2 set's shape (random weights)
  timeout 240 python3 benchmarks/gpu/sparse_launch_ab.py --model smollm2-135m 2>&1 \
    | tee "$OUT/sparse_launch_ab_smollm2.log" | grep -v Warning | tail -40
  ;;
55)  # run 63 (carry .whl): the sparse rows of the kernel table twice more (the thin 1.29 of run 59)
  for rep in 1 2; do
    timeout 150 python3 benchmarks/kernels.py --quick --only sparse --rounds 3 \
      --out "$OUT/kernels_sparse_rep$rep.csv" 2>&1 | tail -12 | tee "$OUT/kernels_sparse_rep$rep.log"
  done
  ;;
54)  # run 62 (carry .whl): the packaged Qwen3-8B draft steps' distance from the one-warp sparse launch
  timeout 300 python3 benchmarks/gpu/sparse_launch_ab.py 2>&1 | tee "$OUT/sparse_launch_ab.log" \
    | grep -v Warning | tail -30
  ;;
53)  # run 61 (carry .whl): benchmarks/gpu/warps_probe.py (verify at 1-2 warps and more splits)
  timeout 420 python3 benchmarks/gpu/warps_probe.py --rounds 3 --out "$OUT/warps_probe.csv" \
    > "$OUT/warps_probe.log" 2>&1
  grep -v "^$" "$OUT/warps_probe.log" | cut -c1-400 | tail -30
  ;;
52)  # run 59, 60 (carry .whl and part.aa): kernel and calibrate GPU tests, the kernel table (new sparse launch)
  cp .model/smollm2.gguf.part.aa /root/model/
  gpu_tests tests/kernels kernel_gpu_tests.log
  gpu_tests tests/calibrate calibrate_gpu_tests.log
  kernel_table 330
  ;;
51)  # run 58 (carry .whl): sparse_probe.py --set w1 at nine shapes
  timeout 300 python3 benchmarks/gpu/sparse_probe.py --set w1 --rounds 3 \
    --shapes 1:32768:0.2,4:131072:0.01,1:131072:0.05,4:32768:0.05,1:32768:0.01,16:32768:0.01,4:32768:0.2,16:131072:0.05,16:131072:0.2 \
    --out "$OUT/sparse_probe_w1.csv" > "$OUT/sparse_probe_w1.log" 2>&1
  grep -E "copy|FAIL|WRONG" "$OUT/sparse_probe_w1.log"
  ;;
50)  # run 57 (carry .whl): sparse_probe.py --set warps at ten shapes (all of the small-selection path's)
  timeout 300 python3 benchmarks/gpu/sparse_probe.py --set warps --rounds 3 \
    --shapes 1:32768:0.2,4:131072:0.01,1:131072:0.05,4:32768:0.05,1:32768:0.01,1:131072:0.2,4:131072:0.05,16:32768:0.01,4:32768:0.2,16:131072:0.05 \
    --out "$OUT/sparse_probe_warps.csv" 2>&1 | tee "$OUT/sparse_probe_warps.log" | tail -20
  ;;
49)  # run 56 (carry .whl): sparse_probe.py --set deep (16-key tiles, 4-6 stages)
  timeout 200 python3 benchmarks/gpu/sparse_probe.py --set deep --rounds 3 \
    --shapes 1:32768:0.2,4:131072:0.01,1:131072:0.05,4:32768:0.05,1:32768:0.01,16:131072:0.05 \
    --out "$OUT/sparse_probe_deep.csv" 2>&1 | tee "$OUT/sparse_probe_deep.log" | tail -70
  ;;
48)  # run 55 (carry .whl): sparse GPU tests (heads kernel removed), slot patterns, the read roof
  gpu_tests tests/kernels/test_attention.py sparse_gpu_tests.log -k sparse
  timeout 120 python3 benchmarks/gpu/sparse_probe.py --set pattern --rounds 3 \
    --shapes 1:32768:0.2,4:131072:0.01,1:131072:0.05,4:32768:0.05,1:32768:0.01,16:131072:0.05 \
    --out "$OUT/sparse_probe_pattern.csv" 2>&1 | tee "$OUT/sparse_probe_pattern.log" | tail -25
  timeout 120 python3 benchmarks/gpu/read_roof.py --out "$OUT/read_roof.csv" 2>&1 \
    | tee "$OUT/read_roof.log" | tail -12
  ;;
47)  # run 54 (carry .whl): sparse_probe.py --set heads at the mid-size selections
  timeout ${PROBE_TIMEOUT:-110} python3 benchmarks/gpu/sparse_probe.py --set heads --rounds 3 \
    --shapes 1:32768:0.2,4:131072:0.01,1:131072:0.05,4:32768:0.05,1:32768:0.01,16:131072:0.05 \
    --out "$OUT/sparse_probe_heads.csv" 2>&1 | tee "$OUT/sparse_probe_heads.log" | tail -45
  ;;
46)  # after `p` (part.aa) and `p` (part.ab); carry .whl and part.ac: regime (a) on a fresh draw
  join_gguf || exit 2
  export VEGAS_SIM_SMOLLM2_GGUF=$GGUF
  f=heldout_smollm2_seed20261130
  timeout ${VALIDATE_TIMEOUT:-420} "${cli[@]}" validate --traces $D/smollm2-135m-h200 \
    --acceptance-traces $D/smollm2-135m-real --seed 0 --model $GGUF --weights real \
    --heldout benchmarks/validation/$f.csv --time-budget ${VALIDATE_BUDGET:-360} \
    --out "$OUT/validate_h200_${f#heldout_}.csv" > "$OUT/validate_h200_${f#heldout_}.log" 2>&1
  echo "$f rc=$?"; tail -8 "$OUT/validate_h200_${f#heldout_}.log"
  ;;
45)  # carry .whl and part.aa: the calibrate GPU tests; then `p` (part.ab), `42` (part.ac)
  cp .model/smollm2.gguf.part.aa /root/model/
  gpu_tests tests/calibrate calibrate_gpu_tests.log
  ;;
43)
  cp .model/smollm2.gguf.part.aa /root/model/
  gpu_tests tests/kernels/test_attention.py sparse_gpu_tests.log -k sparse
  timeout 240 python3 benchmarks/gpu/sparse_probe.py --set store \
    --out "$OUT/sparse_probe_store.csv" 2>&1 | tee "$OUT/sparse_probe_store.log" | tail -60
  ;;
42)
  join_gguf || exit 2
  export VEGAS_SIM_SMOLLM2_GGUF=$GGUF
  gpu_tests tests/calibrate/test_specdec.py lossless_gpu_tests.log -k lossless
  ;;
41)
  gpu_tests tests/calibrate calibrate_gpu_tests.log
  s0=$(date +%s)
  timeout 150 "${cli[@]}" calibrate --quick --model qwen3-8b --weights random \
    --out /tmp/quick-q8b 2>&1 | tail -3 | tee "$OUT/quick.log"
  echo "calibrate --quick wall: $(( $(date +%s) - s0 )) s" | tee -a "$OUT/quick.log"
  ;;
40)
  for f in "" --verify-after-draft; do
    name=vad${f:+1}
    timeout 200 "${cli[@]}" calibrate --model qwen3-8b --weights random --methods vegas \
      --batch 24,32 --context 3K,4K --gamma 3 --sparsity 0.05 $f --out $TR/$name \
      > "$OUT/$name.log" 2>&1
    echo "$name rc=$?"; tail -3 "$OUT/$name.log"
    tar czf "$OUT/$name.tgz" -C $TR $name
  done
  ;;
39)
  gpu_tests tests/kernels kernel_gpu_tests.log
  gpu_tests tests/calibrate calibrate_gpu_tests.log
  bash "$0" 38
  ;;
38)
  timeout 200 python3 benchmarks/gpu/step_profile.py 2>&1 | grep -v "^USDT\|Warning" \
    | tee "$OUT/step_profile.log"
  ;;
36)
  export TRITON_CACHE_DIR=/tmp/triton-cache-run35
  rm -rf $TRITON_CACHE_DIR $TR/q8b-small
  s0=$(date +%s)
  timeout 400 "${cli[@]}" calibrate --model qwen3-8b --weights random --methods all \
    --batch 1,2 --context 1K..8K:x2 --n-query 1 --gamma 1,3,7,15 --sparsity 0.01,0.05,0.2 \
    --out $TR/q8b-small > "$OUT/q8b_small.log" 2>&1
  echo "rc=$? wall $(( $(date +%s) - s0 )) s" | tee -a "$OUT/q8b_small.log"
  tail -4 "$OUT/q8b_small.log"
  python3 benchmarks/gpu/compile_timeline.py $TRITON_CACHE_DIR $TR/q8b-small \
    > "$OUT/compile_timeline.txt" 2>&1
  grep "POINT\|compiled kernels" "$OUT/compile_timeline.txt"
  python3 -c "import json; print(json.dumps(json.load(open('$TR/q8b-small/run_log.json'))['sessions'][-1]['points']))" \
    > "$OUT/points.json" 2>&1
  ;;
33)
  [ -d .resume/qwen3-8b-h200 ] && cp -r .resume/qwen3-8b-h200 $TR/
  timeout ${Q8B_TIMEOUT:-540} "${cli[@]}" calibrate --model qwen3-8b --weights random \
    --methods all --batch 1..128:x2 --context 1K..128K:x2 --n-query 1 --gamma 1,3,7,15 \
    --sparsity 0.01,0.05,0.2 --out $TR/qwen3-8b-h200 2>&1 | tail -6 | tee "$OUT/q8b.log"
  tar czf "$OUT/qwen3-8b-h200.tgz" -C $TR qwen3-8b-h200
  ;;
4)
  join_gguf || exit 2
  export VEGAS_SIM_SMOLLM2_GGUF=$GGUF
  acc=(calibrate --model $GGUF --weights real --no-latency --gamma 12 --iterations 32
       --min-tokens 32)
  for m in magicdec-stream magicdec-quest specextend vegas vegas-all; do
    timeout ${ACC_TIMEOUT:-470} "${cli[@]}" "${acc[@]}" --methods $m \
      --sparsity 0.01,0.02,0.03,0.05,0.07,0.1,0.15,0.2 --workload longdoc --temperature 0.6 \
      --prompts 32 --out $TR/acc4-longdoc-$m > $TR/acc4-longdoc-$m.log 2>&1 &
  done
  for w in reasoning chat code; do
    for t in 0 0.6; do
      timeout ${ACC_TIMEOUT:-470} "${cli[@]}" "${acc[@]}" --methods all \
        --sparsity 0.05,0.1,0.15,0.02 --workload $w --temperature $t --prompts 16 \
        --out $TR/acc4-$w-t$t > $TR/acc4-$w-t$t.log 2>&1 &
    done
  done
  wait
  for s in $TR/acc4-*/; do [ -f $s/meta.json ] && finalize $s; done
  for s in $TR/acc4-*/; do rm -rf $s/parts; done
  tar czf "$OUT/acc4.tgz" -C $TR $(cd $TR && ls -d acc4-*)
  ;;
esac
ls -la "$OUT"
