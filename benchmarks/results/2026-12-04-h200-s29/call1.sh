# session 29, call 1: dQ on its own stream (dq_stream) checked and timed; where a fwd+bwd call's
# time goes; the 8K step with and without it, alternated.
set -u
began=$(date +%s); left() { echo $(( ${BUDGET:-585} - ($(date +%s) - began) )); }
R=benchmarks/results/2026-12-04-h200-s29
bash ci/gpu_session.sh deps 2>&1 | tail -2
python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_block_diffusion_attention_gpu.py \
  -k "own_stream or every_loop or whole_stream" 2>&1 | tail -4
echo "=== op, 16K tokens a call $(date -u +%T)"
python3 benchmarks/attention.py --stream-lens 16384 --block-sizes 32 --tokens 16384 --kernels turbo,flex \
  --variant turbo-dqs:dq_stream=1 --rounds 5 --repeats 20 --out "$OUT/ab_b1.json" 2>&1 | grep -E "^(turbo|flex)|2L=|rror"
echo "=== op, 64K tokens a call $(date -u +%T)"
python3 benchmarks/attention.py --stream-lens 16384 --block-sizes 32 --tokens 65536 --kernels turbo,flex \
  --variant turbo-dqs:dq_stream=1 --rounds 3 --repeats 10 --out "$OUT/ab_b4.json" 2>&1 | grep -E "^(turbo|flex)|2L=|rror"
echo "=== profile $(date -u +%T)"
python3 $R/profile_op.py 1 turbo-dqs:dq_stream=1 > "$OUT/profile_op.txt" 2>&1; grep -E "^===|one call" "$OUT/profile_op.txt" | cut -c1-600
n=0
for s in ${STEPS:-dqs def dqs def}; do
  [ "$(left)" -gt 75 ] || { echo "=== skip step $s (time)"; continue; }
  flags=""; [ $s = dqs ] && flags="--turbo-config dq_stream=1"
  echo "=== step $s $(date -u +%T)"
  timeout $(( $(left) - 5 )) python3 benchmarks/train_step.py --attention turbo --no-baseline --steps 6 --warmup 2 \
    $flags --out "$OUT/step_${s}_$((++n)).json" 2>&1 | grep -E "^turbo-dllm|rror"
done
