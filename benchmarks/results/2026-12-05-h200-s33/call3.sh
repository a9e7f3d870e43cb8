#!/usr/bin/env bash
# Session 33, call 3: which of the op's kernels varies from round to round (kernel_spread.py),
# one row and four rows, with the GPU's clocks and power sampled every 50 ms (smi.csv).
set -u
R=benchmarks/results/2026-12-05-h200-s33
bash ci/gpu_session.sh deps 2>&1 | tail -2
echo "timestamp, sm MHz, mem MHz, power W, temperature C, reasons" > "$OUT/smi.csv"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader,nounits -lms 50 >> "$OUT/smi.csv" 2>&1 &
smi=$!; trap 'kill $smi 2>/dev/null' EXIT
export PYTHONPATH=$PWD
python3 $R/kernel_spread.py 1 8 40 2>&1 | grep -v Warn | tee "$OUT/spread_b1.txt"
python3 $R/kernel_spread.py 4 6 12 2>&1 | grep -v Warn | tee "$OUT/spread_b4.txt"
