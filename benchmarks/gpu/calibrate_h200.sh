#!/usr/bin/env bash
# The H200 call that measured the packaged latency trace sets (docs/RESULTS.md).
# Run on the device machine from the repo root with .whl/ (simpy, gguf wheels) carried.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
cli=(python3 -c "from vegas_sim.cli import main; main()")
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv | tee "$OUT/gpu.txt"
mkdir -p /tmp/tr

[ "${SKIP_KERNELS:-0}" = 1 ] || {
# 1. Kernels against their references at real shapes.
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels -x 2>&1 \
  | tail -15 | tee "$OUT/gpu_tests.log"
}

# 2. Qwen3-8B shape, random weights: latency of every method's phases.
timeout 170 "${cli[@]}" calibrate --model qwen3-8b --weights random --methods all \
  --batch 1,4,16,64 --context 1K,4K,16K,64K,128K --n-query 1,4,8,16 --gamma 3,7,15 \
  --sparsity 0.02,0.07,0.2 --out /tmp/tr/qwen3-8b-h200 2>&1 | tail -20 | tee "$OUT/q8b.log"

# 3. SmolLM2-135M shape (random weights have the real model's latency).
timeout 70 "${cli[@]}" calibrate --model smollm2-135m --weights random --methods all \
  --batch 1,4,16,64 --context 256,1K,2K,4K,7K --n-query 1,4,8,13 --gamma 3,7,12 \
  --sparsity 0.03,0.07,0.15 --min-tokens 32 --out /tmp/tr/smollm2-135m-h200 2>&1 \
  | tail -20 | tee "$OUT/smol.log"
tar czf "$OUT/traces.tgz" -C /tmp/tr .

# 4. Kernel benchmark with whatever time is left.
[ "${SKIP_KERNELS:-0}" = 1 ] ||
timeout 100 python3 benchmarks/kernels.py --quick --out "$OUT/kernels_h200.csv" 2>&1 \
  | tail -40 | tee "$OUT/kernels.log"
