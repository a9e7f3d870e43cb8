#!/usr/bin/env bash
# Session 33, call 1: session 26's per-kernel winners at the step's shape (forward 64 x 64 on 4
# warps; the split Gluon dQ in 2 or 3 stages), through the op in interleaved rounds (2L 16K, one
# and four rows, q/k/v as the trainer hands them), then the 8K step alternated with them.
set -u
began=$(date +%s); left() { echo $(( ${BUDGET:-585} - ($(date +%s) - began) )); }
bash ci/gpu_session.sh deps 2>&1 | tail -2
FWD=fwd_m=64,fwd_n=64,fwd_warps=4,fwd_stages=3
GDQ=dq_gluon=1,dq_split=1,dq_stages=2
V="--variant fwd64:$FWD --variant gdq2:$GDQ --variant gdq3:dq_gluon=1,dq_split=1,dq_stages=3 --variant both:$FWD,$GDQ"
echo "=== op, 16K tokens a call $(date -u +%T)"
timeout 170 python3 benchmarks/attention.py --stream-lens 16384 --block-sizes 32 --tokens 16384 --kernels turbo,flex \
  --layout bshd $V --rounds 7 --repeats 20 --out "$OUT/ab_b1.json" 2>&1 | grep -E "^(turbo|flex|fwd64|gdq|both)|2L=|rror"
echo "=== op, 64K tokens a call $(date -u +%T)"
timeout 120 python3 benchmarks/attention.py --stream-lens 16384 --block-sizes 32 --tokens 65536 --kernels turbo,flex \
  --layout bshd $V --rounds 3 --repeats 10 --out "$OUT/ab_b4.json" 2>&1 | grep -E "^(turbo|flex|fwd64|gdq|both)|2L=|rror"
n=0
for s in both def both def; do
  [ "$(left)" -gt 70 ] || { echo "=== skip step $s (time)"; continue; }
  flags=""; [ $s = both ] && flags="--turbo-config $FWD,$GDQ"
  echo "=== step $s $(date -u +%T)"
  timeout $(( $(left) - 5 )) python3 benchmarks/train_step.py --attention turbo --no-baseline --steps 6 --warmup 2 \
    $flags --out "$OUT/step_${s}_$((++n)).json" 2>&1 | grep -E "^turbo-dllm|rror"
done
