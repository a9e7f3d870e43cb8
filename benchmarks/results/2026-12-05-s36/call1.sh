#!/usr/bin/env bash
# Session 36, call 1: does float8 (torchao Float8Linear on the decoder layers' linear layers,
# the LM head and attention in bf16) make the power-capped 8K turbo step faster? The bf16 step
# alternated with the tensorwise and rowwise recipes, each a fresh process, 6 timed steps after
# 2. torchao 0.17.0 carried as a wheel.
set -u
export SMI_MS=100
bash ci/gpu_session.sh deps 2>&1 | tail -4
python3 -m pip install -q --no-index --no-deps .whl/torchao-*.whl 2>&1 | tail -2
python3 -c "import torchao; print('torchao', torchao.__version__)" 2>&1 | tail -1
nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm,clocks_throttle_reasons.active --format=csv -lms 100 > "$OUT/smi.csv" &
smi=$!
run() { # name, flags
  timeout 150 python3 benchmarks/train_step.py --attention turbo --no-baseline --steps 6 --warmup 2 \
    --out "$OUT/$1.json" "${@:2}" > "$OUT/$1.log" 2>&1
  grep -E "step [0-9]+:|^turbo-dllm|rror" "$OUT/$1.log" | tail -9
}
for round in 1 2; do
  run bf16_r$round
  run fp8_tensorwise_r$round --float8 tensorwise
  run fp8_rowwise_r$round --float8 rowwise
done
kill $smi
ls "$OUT"
