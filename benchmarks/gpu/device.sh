#!/usr/bin/env bash
# The GPU workflow on a lent H200 machine, one stage per device call. Run from the repo root
# on the device (the tree is copied there; outputs are written under $OUT, which comes back):
#
#   bash benchmarks/gpu/device.sh STAGE [ARGS]
#
#   part                   copy the carried GGUF part(s) to /root/model (calls before `gguf`)
#   gguf                   join the parts into /root/model/smollm2.gguf and check its sha256
#   tests [PATH...]        pytest -m gpu (default: tests/kernels tests/calibrate); the SmolLM2
#                          real-weight tests run when the joined GGUF is there, else skip
#   quick [MODEL]          vegas-sim calibrate --quick (default qwen3-8b, random weights),
#                          then traces check and a predict on the set it made
#   full qwen3-8b|qwen3-4b|smollm2|gpt-oss-20b|qwen3-30b-a3b
#                          the latency grid of the packaged set of that name (8 / 8 / 3 / 7 / 6
#                          GPU-min); smollm2 also times draft_step and sample greedy
#                          (--greedy-latency: 4 of its 7 batches, about half the grid again);
#                          the set is named MODEL-GPU (e.g. qwen3-8b-h200, from nvidia-smi);
#                          METHODS=magicdec-quest TAG=-quest measures one method's rows
#                          (`traces merge` them over a `traces subset` of the rest)
#   remeasure METHOD MODEL...
#                          METHOD's rows of the packaged sets of MODEL (as `full` names them)
#                          measured again on this runtime (`full` with METHODS=METHOD), cut to
#                          the temperatures the set timed, merged over the set's other methods
#                          (`traces subset` + `traces merge`), then the held-out rows of that
#                          method validated on the merged set, regime (b), where a list exists
#                          (benchmarks/validation/heldout_REGIME_SHORT.csv, SHORT = METHOD less
#                          "magicdec-"; BUDGET s each); packs remeasured.tgz: the merged sets
#                          to replace vegas_sim/traces/default/SET and the validation tables.
#                          MEASURE=0 merges sets an earlier call measured (still in /root/tr)
#   allreduce              python benchmarks/allreduce.py at TP 2/4/8 (as many as the machine's
#                          GPUs allow): measured all-reduce / all-gather beside the datasheet
#                          link and per-call latency sim/parallel.py assumes
#   full-tp MODEL N        MODEL's latency grid measured at tensor parallel N (calibrate --tp N:
#                          collectives timed apart); a run cut by its timeout resumes when the
#                          stage runs again on the same (warm) machine; packs MODEL-tpN.tgz
#   validate REGIME [HELDOUT] [TRACES]
#                          vegas-sim validate; REGIME qwen3_8b, gpt_oss_20b, qwen3_30b_a3b
#                          (random weights, acceptance replayed), qwen3_8b_tp (the same at
#                          TP=N, env, on the set `full-tp qwen3-8b N` made) or smollm2 (real
#                          weights, needs `gguf`); HELDOUT defaults to
#                          benchmarks/validation/heldout_REGIME.csv, TRACES to the packaged
#                          set (or the one `full` just measured in /root/tr); PASSES=N
#                          measures the list N times in turn, RESUME=TABLE continues a table
#                          an earlier call brought back
#   yarn                   SmolLM2 acceptance past its 8K window (needs `gguf`): RoPE extended
#                          by YaRN factor 4, the long windows (12K-31K) of WORKLOADS (default
#                          longdoc,recall; also code-long, chat-long), every method, one
#                          process each; packs yarn-METHOD sets for `traces merge`
#   recall                 SmolLM2 recall acceptance (needs `gguf`): every recall prompt (1K-7K),
#                          the packaged grid (γ 12, 8 sparsities, T 0 and 0.6, 32 iterations),
#                          one process per method; beside them the copy rate of every prompt
#                          (benchmarks/recall_copy_rate.py); packs recall-METHOD sets for
#                          `traces merge`
#   longdoc                SmolLM2 longdoc acceptance on the windows appended to the workload
#                          (needs `gguf`; --first-prompt 128: the 32 3K windows), as the
#                          packaged longdoc was measured: γ 12 (32 iterations) at T 0 and 0.6,
#                          γ 4 (64 iterations) at T 0.6, 8 sparsities, one process per method;
#                          packs longdoc-METHOD sets for `traces merge`
#   longgen                SmolLM2 acceptance over ~4K-token generations (needs `gguf`): γ 6,
#                          s 0.07, T 0.6, reasoning / code / longdoc, 900 iterations a run;
#                          packs longgen-METHOD sets for `traces merge`
#   gemma-part             copy the carried Gemma GGUF parts (.gemma/gemma.gguf.part.a?) to
#                          /root/model (calls before `gemma`)
#   gemma                  join every Gemma part into /root/model/gemma.gguf, check its sha256,
#                          then Gemma-3-270M (base) acceptance as smollm2-135m-real's was
#                          measured: every workload (WORKLOADS), 32 prompts each, γ 12 (32
#                          iterations), the 8 sparsities, T 0 and 0.6, one process per method;
#                          packs gemma-METHOD sets for `traces merge` (TAG=-b names a second
#                          call's sets gemma-b-METHOD, e.g. WORKLOADS=longdoc,recall TAG=-b);
#                          LONG=1: the long windows (12K-31K, inside Gemma's native 32K)
#   added                  SmolLM2 acceptance of the added workloads (needs `gguf`): code-long and
#                          chat-long (1K-7K prompts; LONG_PROMPTS of each, one per length per
#                          round; γ 12, 32 iterations), then competitive (COMP_PROMPTS problem
#                          statements, COMP_ITERS iterations: acceptance along generations of
#                          1-3K tokens); 8 sparsities, T 0 and 0.6, one process per method, all
#                          inside TIMEOUT s; packs added-METHOD / comp-METHOD sets for `traces
#                          merge`. LONG_BATCH / COMP_BATCH: requests per call (the defaults fit
#                          five processes in an H100's 80 GB); LONG_WORKLOADS, LONG_FIRST (the
#                          first prompt, e.g. 20 for the next 20), LONG_PROMPTS=0 (none),
#                          COMP_FIRST (the first problem), COMP_PROMPTS=0 (none)
#   cli ARGS...            any vegas-sim command with the carried wheels, e.g. `cli calibrate
#                          --model qwen3-8b ... --out $OUT/points` for points a cut run missed
#   sampling               python benchmarks/sampling.py: the top-k-slot sampler against the
#                          same distribution on the dense layout (under a minute)
#   kernels [ARGS...]      python benchmarks/kernels.py (default: the command of
#                          benchmarks/results/kernels_h200.csv)
#   c2q [ARGS...]          python benchmarks/kernels.py --only c2q --rounds 3: the Collect-2-Query
#                          candidates, and per shape the plain verify beside bf16 and fp8
#                          scores (kind c2q_format) against the 6 % target; ARGS replace the
#                          defaults; writes kernels_c2q.csv
#   score-format [ARGS...] SmolLM2 acceptance A/B of the bf16 and fp8 score formats (needs
#                          `gguf`): benchmarks/score_format_acceptance.py (vegas, vegas-all;
#                          longdoc, code-long, reasoning; γ 12 then 4; s 0.03, 0.1; T 0, 0.6;
#                          same prompts and seeds; cells until --budget-s); ARGS replace the
#                          defaults; writes score_format.csv
#
# Carry .whl (wheels the image lacks, e.g. simpy and gguf: `pip download --no-deps -d .whl`)
# on every call. A call carries at most 64 MiB with the tracked tree (about 43 MiB), so the
# 98 MB GGUF goes in sixths (`split -n 6 .model/smollm2.gguf .model/smollm2.gguf.part.`):
# part.aa to part.ae each with `part`, part.af with `gguf`. An idle machine is given back,
# /root with it: make the calls back to back. `timeout` keeps each stage under the 10-minute
# call limit. Gemma-3-270M's 253 MB GGUF goes the same way in 19 MiB parts (`split -b 19M
# .model/gemma.gguf .gemma/gemma.gguf.part.`, git-ignored as .gemma/ must be): the first ones
# with `gemma-part`, the last with `gemma`. Size the parts to what the tree leaves.
set -u
stage=${1:?stage: part, gguf, tests, quick, full, validate or kernels (see the header)}
shift
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
: "${OUT:?OUT must name the folder whose files come back}"

# Every stage: the carried wheels into /tmp/site (torch and triton are the image's).
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
fi
# no plotly wheel carried (it costs 10 MB of the 64 MiB a call carries): the CLI imports
# reports/ at start, but nothing on the device draws
if ! PYTHONPATH=/tmp/site python3 -c "import plotly" 2> /dev/null; then
  mkdir -p /tmp/stub/plotly
  for f in __init__ io graph_objects offline express subplots colors; do
    echo 'def __getattr__(name): return None' > /tmp/stub/plotly/$f.py
  done
  export PYTHONPATH=$PYTHONPATH:/tmp/stub
fi
cli=(python3 -c "from vegas_sim.cli import main; main()")
D=vegas_sim/traces/default
TR=/root/tr
GGUF=/root/model/smollm2.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  # SmolLM2-135M-Instruct Q4_1
mkdir -p $TR /root/model
[ -f $GGUF ] && export VEGAS_SIM_SMOLLM2_GGUF=$GGUF
[ -f /root/model/gemma.gguf ] && export VEGAS_SIM_GEMMA3_GGUF=/root/model/gemma.gguf  # `gemma`

gpu_tag() {  # h200 / h100 / ...: the card this stage runs on, as the packaged sets name it
  nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z' 'a-z' \
    | grep -o 'h[0-9]\{3\}' | head -1
}

pack() {  # the set, as a .tgz under $OUT
  tar czf "$OUT/$(basename "$1").tgz" -C "$(dirname "$1")" "$(basename "$1")"
}

finalize() {  # a set cut by its timeout keeps the points it measured: merge them, pack it
  python3 -c "from vegas_sim.traces.io import finalize_trace_set as f; f('$1')" 2>&1 | tail -2
  rm -rf "$1/parts"; pack "$1"
}

case $stage in
part)
  cp .model/smollm2.gguf.part.?? /root/model/ && ls -la /root/model
  ;;
gguf)
  cp .model/smollm2.gguf.part.?? /root/model/ 2>/dev/null
  cat /root/model/smollm2.gguf.part.?? > $GGUF
  # sha256sum's own status decides (a `| tee` after it would hide a mismatch)
  echo "$SHA  $GGUF" | sha256sum -c - > "$OUT/gguf.txt"; rc=$?
  cat "$OUT/gguf.txt"; rm -f /root/model/smollm2.gguf.part.??
  exit $rc
  ;;
tests)
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv \
    | tee "$OUT/gpu.txt"
  paths=("$@"); [ $# -eq 0 ] && paths=(tests/kernels tests/calibrate)
  timeout 540 python3 -m pytest -q -p no:cacheprovider -m gpu -rfs "${paths[@]}" 2>&1 \
    | tail -40 | tee "$OUT/gpu_tests.log"
  ;;
quick)  # the --quick preset (< 2 min on the H200), then what a user does with the set
  model=${1:-qwen3-8b}
  s0=$(date +%s)
  timeout 300 "${cli[@]}" calibrate --quick --model "$model" --weights random \
    --out $TR/quick 2>&1 | tail -3 | tee "$OUT/quick.log"
  echo "calibrate --quick wall: $(( $(date +%s) - s0 )) s" | tee -a "$OUT/quick.log"
  "${cli[@]}" traces check $TR/quick 2>&1 | tail -2 | tee -a "$OUT/quick.log"
  "${cli[@]}" predict --traces $TR/quick --gamma 4 --batch 2 --context 4K 2>&1 \
    | tee -a "$OUT/quick.log"
  pack $TR/quick
  ;;
full)  # the packaged latency sets' grids; a set cut by the timeout resumes if carried back
  # METHODS (default all; e.g. magicdec-quest to re-measure one method of a packaged set),
  # TAG (appended to the set's name, e.g. -quest); the set is named after the GPU it ran on
  methods=${METHODS:-all}; tag=${TAG:-}; gpu=$(gpu_tag)
  case ${1:?full qwen3-8b or full smollm2} in
  qwen3-8b|qwen3-4b)  # dense Qwen3: the same attention shape, the same grid
    timeout ${TIMEOUT:-560} "${cli[@]}" calibrate --model $1 --weights random \
      --methods $methods --batch 1..128:x2 --context 1K..128K:x2 --n-query 1 --gamma 1,3,7,15 \
      --sparsity 0.01,0.05,0.2 --out $TR/$1-$gpu$tag 2>&1 | tail -6 \
      | tee "$OUT/calibrate$tag.log"
    finalize $TR/$1-$gpu$tag
    ;;
  smollm2)  # real weights: run `gguf` first; the grid at T 0.6 and its sampling phases at T 0
    [ -f $GGUF ] || { echo "no $GGUF: run the gguf stage first"; exit 2; }
    s0=$(date +%s)
    timeout ${TIMEOUT:-480} "${cli[@]}" calibrate --model $GGUF --weights real \
      --methods $methods --no-acceptance --batch 1..64:x2 --context 1K,2K,4K,7K --n-query 1 \
      --gamma 1,3,7,12 --sparsity 0.01,0.05,0.2 --min-tokens 32 --temperature 0,0.6 \
      --verify-after-draft --greedy-latency --out $TR/smollm2-135m-$gpu$tag 2>&1 | tail -6 \
      | tee "$OUT/calibrate$tag.log"
    echo "calibrate wall: $(( $(date +%s) - s0 )) s" | tee -a "$OUT/calibrate$tag.log"
    finalize $TR/smollm2-135m-$gpu$tag
    python3 benchmarks/sampling_mode.py --traces $TR/smollm2-135m-$gpu$tag 2>&1 \
      | tee -a "$OUT/calibrate$tag.log"
    ;;
  gpt-oss-20b|qwen3-30b-a3b)  # MoE: contexts x4 (their latency is linear in C), B x2
    model=$1; ctx=1K,4K,16K,64K,128K
    [ "$model" = qwen3-30b-a3b ] && ctx=1K,4K,16K,40K  # 40960 positions
    timeout ${TIMEOUT:-480} "${cli[@]}" calibrate --model "$model" --weights random \
      --methods $methods --batch 1..128:x2 --context $ctx --n-query 1 --gamma 1,3,7,15 \
      --sparsity 0.01,0.05,0.2 --out $TR/$model-$gpu$tag 2>&1 | tail -6 \
      | tee "$OUT/calibrate$tag.log"
    finalize $TR/$model-$gpu$tag
    ;;
  *) echo "full: qwen3-8b, qwen3-4b, smollm2, gpt-oss-20b or qwen3-30b-a3b"; exit 2 ;;
  esac
  ;;
remeasure)  # one method's rows of packaged sets measured again and merged (see the header)
  method=${1:?remeasure METHOD MODEL...}; shift
  short=${method#magicdec-}; gpu=${GPU:-$(gpu_tag)}; new=$TR/remeasured
  mkdir -p $new
  for model in "$@"; do
    set=$model-$gpu; [ "$model" = smollm2 ] && set=smollm2-135m-$gpu
    [ -d $D/$set ] || { echo "remeasure: no packaged set $set"; continue; }
    if [ "${MEASURE:-1}" = 1 ]; then
      METHODS=$method TAG=-$short bash "$0" full "$model"
      mv "$OUT/calibrate-$short.log" "$OUT/calibrate-$short-$model.log" 2> /dev/null
      rm -f "$OUT/$set-$short.tgz"  # the merged set below is what comes back
    fi
    [ -d $TR/$set-$short ] || { echo "remeasure: no $TR/$set-$short"; continue; }
    # the set's other methods, and the temperature(s) its latency rows were timed at
    read -r others temps <<< "$(python3 -c "import pandas as p, sys
d = p.read_parquet('$D/$set/latency.parquet')
print('|'.join(sorted(set(d.method) - {'$method'})), '|'.join(f'{t:g}' for t in sorted(set(d.temperature))))")"
    rm -rf $TR/rest-$set $TR/only-$set $new/$set
    "${cli[@]}" traces subset $D/$set --where "method in $others" --out $TR/rest-$set \
      && "${cli[@]}" traces subset $TR/$set-$short \
           --where "method==$method,temperature in $temps" --out $TR/only-$set \
      && "${cli[@]}" traces merge $new/$set $TR/rest-$set $TR/only-$set \
      && rm -rf $new/$set/parts \
      && "${cli[@]}" traces check $new/$set 2>&1 | tail -1 | tee -a "$OUT/remeasure.log"
    regime=$(echo "$model" | tr - _)
    heldout=benchmarks/validation/heldout_${regime}_$short.csv
    if [ -f "$heldout" ] && [ -d $new/$set ] && [ "${VALIDATE:-1}" = 1 ]; then
      TIMEOUT=$(( ${BUDGET:-120} + 60 )) BUDGET=${BUDGET:-120} bash "$0" validate "$regime" \
        "$heldout" $new/$set
    fi
  done
  tar czf "$OUT/remeasured.tgz" -C $new $(cd $new && ls)
  logs=$(cd "$OUT" && ls validate_* calibrate-* remeasure.log 2> /dev/null)
  [ -n "$logs" ] && tar czf "$OUT/remeasure_logs.tgz" -C "$OUT" $logs \
    && (cd "$OUT" && rm -f $logs)
  ;;
allreduce)  # all-reduce / all-gather at every TP the machine's GPUs allow
  n=$(nvidia-smi -L | wc -l); tps=()
  for t in 2 4 8; do [ "$t" -le "$n" ] && tps+=(--tp $t); done
  [ ${#tps[@]} -gt 0 ] || { echo "allreduce: needs 2 GPUs or more, $n here"; exit 2; }
  nvidia-smi topo -m > "$OUT/topo.txt" 2>&1; cat "$OUT/topo.txt"
  timeout 540 python3 benchmarks/allreduce.py "${tps[@]}" --out "$OUT/allreduce.csv" 2>&1 \
    | tee "$OUT/allreduce.log"
  ;;
full-tp)  # a latency grid at TP N: both passes (with / without collectives) per point
  model=${1:?full-tp MODEL N}; n=${2:?full-tp MODEL N}
  nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
  timeout ${TIMEOUT:-560} "${cli[@]}" calibrate --model "$model" --weights random --tp "$n" \
    --methods all --batch 1..128:x2 --context 1K,4K,16K,64K,128K --n-query 1 --gamma 1,3,7,15 \
    --sparsity 0.01,0.05,0.2 --out $TR/$model-tp$n 2>&1 | tail -6 | tee "$OUT/calibrate-tp$n.log"
  "${cli[@]}" traces check $TR/$model-tp$n 2>&1 | tail -3 | tee -a "$OUT/calibrate-tp$n.log"
  "${cli[@]}" traces show $TR/$model-tp$n 2>&1 | head -12 | tee -a "$OUT/calibrate-tp$n.log"
  finalize $TR/$model-tp$n
  ;;
validate)  # --time-budget stops starting rows early enough that the table is still written
  regime=${1:?validate qwen3_8b or smollm2}
  heldout=${2:-benchmarks/validation/heldout_$regime.csv}
  tp=(); [ -n "${TP:-}" ] && tp=(--tp "$TP")
  case $regime in
  qwen3_8b) model=(--model qwen3-8b --weights random); traces=${3:-$D/qwen3-8b-h200} ;;
  qwen3_8b_tp)
            [ -n "${TP:-}" ] || { echo "validate qwen3_8b_tp: set TP=N"; exit 2; }
            model=(--model qwen3-8b --weights random); traces=${3:-$TR/qwen3-8b-tp$TP} ;;
  gpt_oss_20b|qwen3_30b_a3b)
            [ "$regime" = gpt_oss_20b ] && name=gpt-oss-20b
            [ "$regime" = qwen3_30b_a3b ] && name=qwen3-30b-a3b
            model=(--model $name --weights random)
            traces=${3:-$D/$name-h200}; [ -d "$traces" ] || traces=$TR/$name-h200 ;;
  smollm2)  [ -f $GGUF ] || { echo "no $GGUF: run the gguf stage first"; exit 2; }
            model=(--model $GGUF --weights real); traces=${3:-$D/smollm2-135m-h200} ;;
  *) echo "validate: qwen3_8b, qwen3_8b_tp, gpt_oss_20b, qwen3_30b_a3b or smollm2"; exit 2 ;;
  esac
  name=validate_$(gpu_tag)_$(basename "$heldout" .csv | sed 's/^heldout_//')${TP:+_tp$TP}
  # PASSES=N measures the list N times in turn; RESUME=TABLE continues a table an earlier
  # call brought back (carried in the tree), adding the passes it did not reach; every row is
  # predicted again from TRACES, so resume on the grid the table's rows were measured beside
  resume=(); [ -n "${RESUME:-}" ] && { cp "$RESUME" "$OUT/$name.csv"; resume=(--resume); }
  timeout ${TIMEOUT:-560} "${cli[@]}" validate --traces "$traces" \
    --acceptance-traces $D/smollm2-135m-real --seed 0 "${model[@]}" --heldout "$heldout" \
    --passes ${PASSES:-1} "${resume[@]}" "${tp[@]}" --time-budget ${BUDGET:-480} \
    --out "$OUT/$name.csv" > "$OUT/$name.log" 2>&1
  echo "$name rc=$?" | tee -a "$OUT/$name.log"; tail -8 "$OUT/$name.log"
  ;;
yarn)
  [ -f $GGUF ] || { echo "no $GGUF: run the gguf stage first"; exit 2; }
  for m in vegas vegas-all specextend magicdec-quest magicdec-stream; do
    timeout ${TIMEOUT:-420} "${cli[@]}" calibrate --model $GGUF --weights real --methods $m \
      --rope-scaling yarn:4 --long-prompts --workload ${WORKLOADS:-longdoc,recall} --gamma 12 \
      --sparsity ${SPARSITY:-0.02,0.05,0.1,0.2} --temperature 0,0.6 --iterations 32 \
      --min-tokens 32 --prompts 16 --acceptance-batch 16 --no-latency --out $TR/yarn-$m \
      > "$OUT/calibrate-yarn-$m.log" 2>&1 &
  done
  wait
  for m in vegas vegas-all specextend magicdec-quest magicdec-stream; do
    tail -2 "$OUT/calibrate-yarn-$m.log"
    python3 -c "from vegas_sim.traces.io import finalize_trace_set as f; f('$TR/yarn-$m')" 2>&1 | tail -1
    rm -rf $TR/yarn-$m/parts
  done
  tar czf "$OUT/yarn_sets.tgz" -C $TR $(cd $TR && ls -d yarn-*)
  ;;
recall)  # replaces the recall rows of smollm2-135m-real (docs/RESULTS.md, Long context)
  [ -f $GGUF ] || { echo "no $GGUF: run the gguf stage first"; exit 2; }
  # METHODS / TEMPERATURES / COPY_RATE=0: measure again what a run left out (a point that
  # ran out of memory beside the others is marked oom and skipped)
  methods=${METHODS:-vegas vegas-all specextend magicdec-quest magicdec-stream}
  for m in $methods; do
    timeout ${TIMEOUT:-480} "${cli[@]}" calibrate --model $GGUF --weights real --methods $m \
      --workload recall --gamma 12 --sparsity 0.01,0.02,0.03,0.05,0.07,0.1,0.15,0.2 \
      --temperature ${TEMPERATURES:-0,0.6} --iterations 32 --min-tokens 32 \
      --prompts ${PROMPTS:-160} --no-latency --out $TR/recall-$m \
      > "$OUT/calibrate-recall-$m.log" 2>&1 &
  done
  if [ "${COPY_RATE:-1}" = 1 ]; then
    timeout ${TIMEOUT:-480} python3 benchmarks/recall_copy_rate.py --new 48 \
      --out "$OUT/recall_copy_rate_h200.csv" > "$OUT/recall_copy_rate_h200.log" 2>&1
    tail -16 "$OUT/recall_copy_rate_h200.log"
  fi
  wait
  for m in $methods; do
    tail -2 "$OUT/calibrate-recall-$m.log"
    python3 -c "from vegas_sim.traces.io import finalize_trace_set as f; f('$TR/recall-$m')" 2>&1 | tail -1
    rm -rf $TR/recall-$m/parts
  done
  tar czf "$OUT/recall_sets.tgz" -C $TR $(cd $TR && ls -d recall-*)
  tar czf "$OUT/recall_logs.tgz" -C "$OUT" $(cd "$OUT" && ls calibrate-recall-*.log) \
    && rm -f "$OUT"/calibrate-recall-*.log
  ;;
longdoc)  # adds longdoc's appended windows to smollm2-135m-real (docs/RESULTS.md, Context extrapolation)
  [ -f $GGUF ] || { echo "no $GGUF: run the gguf stage first"; exit 2; }
  methods=${METHODS:-vegas vegas-all specextend magicdec-quest magicdec-stream}
  sparsity=0.01,0.02,0.03,0.05,0.07,0.1,0.15,0.2
  for m in $methods; do
    ( timeout ${TIMEOUT:-480} "${cli[@]}" calibrate --model $GGUF --weights real --methods $m \
        --workload longdoc --gamma 12 --iterations 32 --temperature 0,0.6 --sparsity $sparsity \
        --min-tokens 32 --first-prompt ${FIRST:-128} --prompts ${PROMPTS:-32} --no-latency \
        --out $TR/longdoc-$m
      timeout ${TIMEOUT:-480} "${cli[@]}" calibrate --model $GGUF --weights real --methods $m \
        --workload longdoc --gamma 4 --iterations 64 --temperature 0.6 --sparsity $sparsity \
        --min-tokens 32 --first-prompt ${FIRST:-128} --prompts ${PROMPTS:-32} --no-latency \
        --out $TR/longdoc4-$m ) > "$OUT/calibrate-longdoc-$m.log" 2>&1 &
  done
  wait
  for m in $methods; do
    tail -2 "$OUT/calibrate-longdoc-$m.log"
    for d in longdoc-$m longdoc4-$m; do
      python3 -c "from vegas_sim.traces.io import finalize_trace_set as f; f('$TR/$d')" 2>&1 | tail -1
      rm -rf $TR/$d/parts
    done
  done
  tar czf "$OUT/longdoc_sets.tgz" -C $TR $(cd $TR && ls -d longdoc-* longdoc4-*)
  ;;
longgen)  # SmolLM2 acceptance over ~4K-token generations (900 iterations), one process a method
  [ -f $GGUF ] || { echo "no $GGUF: run the gguf stage first"; exit 2; }
  for m in magicdec-stream magicdec-quest specextend vegas; do
    timeout ${TIMEOUT:-420} "${cli[@]}" calibrate --model $GGUF --weights real --methods $m \
      --workload reasoning,code,longdoc --gamma 6 --sparsity 0.07 --temperature 0.6 \
      --iterations 900 --min-tokens 32 --prompts 8 --acceptance-batch 8 --acceptance-cuts none \
      --no-latency --out $TR/longgen-$m > "$OUT/calibrate-longgen-$m.log" 2>&1 &
  done
  wait
  for m in magicdec-stream magicdec-quest specextend vegas; do
    tail -2 "$OUT/calibrate-longgen-$m.log"
    python3 -c "from vegas_sim.traces.io import finalize_trace_set as f; f('$TR/longgen-$m')" 2>&1 | tail -1
    rm -rf $TR/longgen-$m/parts
  done
  tar czf "$OUT/longgen_sets.tgz" -C $TR $(cd $TR && ls -d longgen-*)
  ;;
gemma-part)
  cp .gemma/gemma.gguf.part.a? /root/model/ && ls -la /root/model
  ;;
gemma)  # Gemma-3-270M acceptance, every workload, one process per method (docs/RESULTS.md)
  G=/root/model/gemma.gguf
  if [ ! -f $G ]; then
    cp .gemma/gemma.gguf.part.a? /root/model/ 2>/dev/null
    cat /root/model/gemma.gguf.part.a? > $G
    echo "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  $G" \
      | sha256sum -c - > "$OUT/gemma_gguf.txt" || { cat "$OUT/gemma_gguf.txt"; rm -f $G; exit 1; }
    cat "$OUT/gemma_gguf.txt"; rm -f /root/model/gemma.gguf.part.a?
  fi
  export VEGAS_SIM_GEMMA3_GGUF=$G
  methods=${METHODS:-vegas vegas-all specextend magicdec-quest magicdec-stream}
  for m in $methods; do
    timeout ${TIMEOUT:-480} "${cli[@]}" calibrate --model $G --weights real --methods $m \
      --workload ${WORKLOADS:-reasoning,code,chat,longdoc,recall} --gamma 12 \
      --sparsity ${SPARSITY:-0.01,0.02,0.03,0.05,0.07,0.1,0.15,0.2} --temperature 0,0.6 \
      --iterations 32 --min-tokens 32 --prompts ${PROMPTS:-32} \
      ${ACCEPTANCE_BATCH:+--acceptance-batch $ACCEPTANCE_BATCH} ${LONG:+--long-prompts} \
      --no-latency --out $TR/gemma${TAG:-}-$m > "$OUT/calibrate-gemma${TAG:-}-$m.log" 2>&1 &
  done
  wait
  for m in $methods; do
    tail -2 "$OUT/calibrate-gemma${TAG:-}-$m.log"
    python3 -c "from vegas_sim.traces.io import finalize_trace_set as f; f('$TR/gemma${TAG:-}-$m')" 2>&1 | tail -1
    rm -rf $TR/gemma${TAG:-}-$m/parts
  done
  tar czf "$OUT/gemma${TAG:-}_sets.tgz" -C $TR $(cd $TR && ls -d gemma${TAG:-}-*)
  ;;
added)  # adds code-long, chat-long and competitive to smollm2-135m-real (docs/RESULTS.md)
  [ -f $GGUF ] || { echo "no $GGUF: run the gguf stage first"; exit 2; }
  methods=${METHODS:-vegas vegas-all specextend magicdec-quest magicdec-stream}
  sparsity=0.01,0.02,0.03,0.05,0.07,0.1,0.15,0.2
  end=$(( $(date +%s) + ${TIMEOUT:-240} ))
  for m in $methods; do
    common=(--model $GGUF --weights real --methods $m --gamma 12 --temperature 0,0.6
            --sparsity $sparsity --min-tokens 32 --no-latency)
    ( [ "${LONG_PROMPTS:-20}" = 0 ] ||
      timeout $(( end - $(date +%s) )) "${cli[@]}" calibrate "${common[@]}" \
        --workload ${LONG_WORKLOADS:-code-long,chat-long} --iterations 32 \
        --first-prompt ${LONG_FIRST:-0} --prompts ${LONG_PROMPTS:-20} \
        --acceptance-batch ${LONG_BATCH:-54} --out $TR/added-$m
      [ "${COMP_PROMPTS:-8}" = 0 ] ||
      timeout $(( end - $(date +%s) )) "${cli[@]}" calibrate "${common[@]}" \
        --workload competitive --iterations ${COMP_ITERS:-192} \
        --first-prompt ${COMP_FIRST:-0} --prompts ${COMP_PROMPTS:-8} \
        --acceptance-batch ${COMP_BATCH:-64} --out $TR/comp-$m ) \
      > "$OUT/calibrate-added-$m.log" 2>&1 &
    sleep 3  # staggered: each process sizes its batches by the memory the others left
  done
  wait
  for m in $methods; do
    tail -3 "$OUT/calibrate-added-$m.log"
    for d in added-$m comp-$m; do
      [ -d $TR/$d ] || continue
      python3 -c "from vegas_sim.traces.io import finalize_trace_set as f; f('$TR/$d')" 2>&1 | tail -1
      rm -rf $TR/$d/parts
    done
  done
  nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/added_device.txt"
  tar czf "$OUT/added_sets.tgz" -C $TR $(cd $TR && ls -d added-* comp-* 2>/dev/null)
  tar czf "$OUT/added_logs.tgz" -C "$OUT" $(cd "$OUT" && ls calibrate-added-*.log) \
    && rm -f "$OUT"/calibrate-added-*.log
  ;;
cli)  # one vegas-sim command, as the stages run it
  timeout ${TIMEOUT:-540} "${cli[@]}" "$@" 2>&1 | tail -20 | tee "$OUT/cli.log"
  ;;
sampling)
  timeout 300 python3 benchmarks/sampling.py --out "$OUT/sampling_h200.csv" 2>&1 \
    | tee "$OUT/sampling.log"
  ;;
kernels)  # each kernel against the copy bandwidth measured in the same run
  args=("$@")
  [ $# -eq 0 ] && args=(--quick --only verify,select,sparse --rounds 3 --step-budget-s 200)
  timeout 540 python3 benchmarks/kernels.py "${args[@]}" --out "$OUT/kernels_h200.csv" 2>&1 \
    | tail -60 | tee "$OUT/kernels.log"
  ;;
c2q)  # Collect-2-Query by candidate and by score format (bf16 / fp8) against collect=none
  args=("$@")
  [ $# -eq 0 ] && args=(--only c2q --rounds 3)
  timeout 540 python3 benchmarks/kernels.py "${args[@]}" --out "$OUT/kernels_c2q.csv" 2>&1 \
    | tail -80 | tee "$OUT/kernels_c2q.log"
  ;;
score-format)  # acceptance A/B of the score formats on real SmolLM2 (after `gguf`)
  [ -f $GGUF ] || { echo "no $GGUF: run the part and gguf stages first"; exit 2; }
  args=("$@")
  [ $# -eq 0 ] && args=(--budget-s 100)
  timeout 200 python3 benchmarks/score_format_acceptance.py "${args[@]}" \
    --out "$OUT/score_format.csv" 2>&1 | tail -80 | tee "$OUT/score_format.log"
  ;;
*)
  echo "unknown stage $stage: part, gguf, tests, quick, full, validate, kernels, c2q or score-format"; exit 2
  ;;
esac
ls -la "$OUT"
