# session 26, call 6: the sweep at the 8K step's shape (2L 16K, one row: 16K tokens a call),
# then the 8K step with its winners against the shipped defaults, alternated.
set -u
began=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - began) )); }
bash ci/gpu_session.sh deps >/dev/null 2>&1
D=native/block_diffusion_attention/sm90_configs.json
cp $D "$OUT/configs_head.json"
python3 benchmarks/attention.py --sweep --kernels turbo --stream-lens 16384 --block-sizes 32 \
  --tokens 16384 --out "$OUT/sweep_b1.json" --write-configs "$OUT/sm90_configs.json" 2>&1 \
  | tee "$OUT/sweep_b1.log" | grep -E "winner|^turbo|rror"
[ -f "$OUT/sm90_configs.json" ] || exit 1
n=0
for v in best head best head; do
  [ "$(left)" -gt 60 ] || { echo "=== skip step $v (time)"; continue; }
  if [ $v = best ]; then cp "$OUT/sm90_configs.json" $D; else cp "$OUT/configs_head.json" $D; fi
  echo "=== step $v $(date -u +%T)"
  timeout $(( $(left) - 5 )) python3 benchmarks/train_step.py --seq-len 8192 --attention turbo \
    --no-baseline --steps 3 --warmup 1 --out "$OUT/step8192_${v}$((++n)).json" 2>&1 \
    | grep -E "^turbo-dllm|rror" | tail -3
done
cp "$OUT/configs_head.json" $D
