#!/usr/bin/env bash
# Issue #6: the H200 validation run, both regimes, in one device call (< 9 minutes).
# Run from the repo root on the device machine, after the lead's prelude has installed the
# simpy/gguf wheels to /tmp/site. Inputs (override by environment):
#   SMOL_TRACES  SmolLM2 latency set        (default: packaged smollm2-135m-h200)
#   Q8B_TRACES   Qwen3-8B latency set       (default: packaged qwen3-8b-h200)
#   ACC_TRACES   real-weights acceptance    (default: packaged smollm2-135m-real)
#   VEGAS_SIM_SMOLLM2_GGUF  the SmolLM2 GGUF for regime (a) (e.g. /root/model/smollm2.gguf)
# Outputs, flat in $OUT: validate_h200_{smollm2,qwen3_8b}.csv (+ .heldout.csv), .html, .log.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
cli=(python3 -c "from vegas_sim.cli import main; main()")
D=vegas_sim/traces/default
SMOL_TRACES=${SMOL_TRACES:-$D/smollm2-135m-h200}
Q8B_TRACES=${Q8B_TRACES:-$D/qwen3-8b-h200}
ACC_TRACES=${ACC_TRACES:-$D/smollm2-135m-real}
GGUF=${VEGAS_SIM_SMOLLM2_GGUF:-/root/model/smollm2.gguf}
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv | tee "$OUT/validate_gpu.txt"

# (a) SmolLM2-135M real weights end to end. --time-budget stops starting configurations
# early enough that the table and report are still written inside the timeout.
timeout ${VALIDATE_TIMEOUT:-235} "${cli[@]}" validate --traces "$SMOL_TRACES" --acceptance-traces "$ACC_TRACES" \
  --model "$GGUF" --weights real --heldout benchmarks/validation/heldout_smollm2.csv \
  --time-budget ${VALIDATE_BUDGET:-185} --seed 0 --out "$OUT/validate_h200_smollm2.csv" \
  > "$OUT/validate_h200_smollm2.log" 2>&1
echo "smollm2 rc=$?" | tee -a "$OUT/validate_h200_smollm2.log"; tail -8 "$OUT/validate_h200_smollm2.log"

# (b) Qwen3-8B shape, random weights, acceptance replayed from the real SmolLM2 traces.
timeout ${VALIDATE_TIMEOUT:-235} "${cli[@]}" validate --traces "$Q8B_TRACES" --acceptance-traces "$ACC_TRACES" \
  --model qwen3-8b --weights random --heldout benchmarks/validation/heldout_qwen3_8b.csv \
  --time-budget ${VALIDATE_BUDGET:-185} --seed 0 --out "$OUT/validate_h200_qwen3_8b.csv" \
  > "$OUT/validate_h200_qwen3_8b.log" 2>&1
echo "qwen3-8b rc=$?" | tee -a "$OUT/validate_h200_qwen3_8b.log"; tail -8 "$OUT/validate_h200_qwen3_8b.log"

# Parity reports (CPU work; whatever rows were measured).
for r in smollm2 qwen3_8b; do
  [ -s "$OUT/validate_h200_$r.csv" ] && timeout 20 "${cli[@]}" report "$OUT/validate_h200_$r.csv" \
    --out "$OUT/validate_h200_$r.html" >> "$OUT/validate_h200_$r.log" 2>&1
done
ls -la "$OUT"
