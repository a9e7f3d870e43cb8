#!/usr/bin/env bash
# Session 35, call 1: the stream trim on the GPU. `train-trim` (the 8K turbo step with and
# without the trim, alternated twice, and the autoregressive objective both ways), then its GPU
# tests (turbo's and flex's windows against the reference, a compiled trainer step trimmed vs
# whole), then one profile of the trimmed step (with the longest idle gaps). Clocks and power
# sampled every 100 ms (smi.csv).
set -u
export SMI_MS=100
bash ci/gpu_session.sh deps 2>&1 | tail -4
bash ci/gpu_session.sh train-trim 2>&1 | tail -12
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_stream_trim_gpu.py 2>&1 \
  | tee "$OUT/trim-tests.log" | tail -6
timeout 110 python3 benchmarks/train_step.py --attention turbo --no-baseline --steps 4 --warmup 2 \
  --profile "$OUT/profile_trim.txt" --out "$OUT/profile_trim.json" 2>&1 | tail -3
cp gpu-out/*.json gpu-out/*.log gpu-out/smi.csv "$OUT/" 2>/dev/null
ls "$OUT"
