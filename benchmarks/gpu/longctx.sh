#!/usr/bin/env bash
# Long-context acceptance on the H200 (issue #31), one device call after the two `part`
# calls of device.sh have put smollm2.gguf.part.aa/.ab in /root/model. Run from a copy of
# the repository root with the third part in $GGUF_PART_DIR:
#
#   GGUF_PART_DIR=../gguf bash benchmarks/gpu/longctx.sh
#
# 1. recall copy rate: greedy dense decoding of every recall prompt against its passage
# 2. recall acceptance: vegas-sim calibrate, one process per method (host-bound: five share
#    the GPU), the packaged smollm2-135m-real grid (gamma 12, 8 sparsities, T 0 and 0.6,
#    32 iterations, --min-tokens 32), the first 48 prompts (3 per length x depth)
# 3. beside them: the YaRN GPU test (Qwen3-4B shape, 40K prefill + decode) and SmolLM2's
#    perplexity by position with YaRN factor 2 / 4 (benchmarks/yarn_perplexity.py)
set -u
export PYTHONUNBUFFERED=1
: "${OUT:?}" "${GGUF_PART_DIR:?}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site ../whl/*.whl || exit 1
# the image has no plotly; the CLI imports reports/ (HTML) at start, calibrate never draws
mkdir -p /tmp/stub/plotly
for f in __init__ io graph_objects offline express subplots colors; do touch /tmp/stub/plotly/$f.py; done
export PYTHONPATH=/tmp/site:$PWD:/tmp/stub
GGUF=/root/model/smollm2.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
mkdir -p /root/model /root/tr "$OUT/logs"
cp "$GGUF_PART_DIR"/smollm2.gguf.part.?? /root/model/
cat /root/model/smollm2.gguf.part.?? > $GGUF
echo "$SHA  $GGUF" | sha256sum -c - || exit 3
export VEGAS_SIM_SMOLLM2_GGUF=$GGUF
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
cli() { python3 -c "from vegas_sim.cli import main; main()" "$@"; }
t0=$(date +%s)
(timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu -rfs tests/calibrate/test_yarn.py \
  > "$OUT/yarn_gpu_test_h200.log" 2>&1; echo "rc=$?" >> "$OUT/yarn_gpu_test_h200.log") &
timeout 120 python3 benchmarks/recall_copy_rate.py --new 48 --out "$OUT/recall_copy_rate_h200.csv" \
  > "$OUT/recall_copy_rate_h200.log" 2>&1
tail -14 "$OUT/recall_copy_rate_h200.log"
echo "copy rate done at $(( $(date +%s) - t0 )) s"
for m in vegas vegas-all specextend magicdec-quest magicdec-stream; do
  timeout ${CAL_TIMEOUT:-300} python3 -c "from vegas_sim.cli import main; main()" calibrate \
    --model $GGUF --weights real --methods $m --workload recall --gamma 12 \
    --sparsity 0.01,0.02,0.03,0.05,0.07,0.1,0.15,0.2 --temperature 0,0.6 --iterations 32 \
    --min-tokens 32 --prompts ${PROMPTS:-48} --no-latency --out /root/tr/recall-$m \
    > "$OUT/logs/calibrate-$m.log" 2>&1 &
done
timeout 300 python3 benchmarks/yarn_perplexity.py --books ../books.npz --window 32768 \
  --out "$OUT/yarn_perplexity_h200.csv" > "$OUT/yarn_perplexity_h200.log" 2>&1
tail -8 "$OUT/yarn_perplexity_h200.log"
wait
echo "all done at $(( $(date +%s) - t0 )) s"
for m in vegas vegas-all specextend magicdec-quest magicdec-stream; do
  tail -3 "$OUT/logs/calibrate-$m.log"
  python3 -c "from vegas_sim.traces.io import finalize_trace_set as f; f('/root/tr/recall-$m')" 2>&1 | tail -2
  rm -rf /root/tr/recall-$m/parts
done
tar czf "$OUT/recall_sets.tgz" -C /root/tr .
tar czf "$OUT/calibrate_logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
tail -5 "$OUT/yarn_gpu_test_h200.log"
ls -la "$OUT"
