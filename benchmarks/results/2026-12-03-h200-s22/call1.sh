# session 22, calls 1 and 2 (the profile from call 2 on): dS kept by the dK/dV kernel (config.dkdv_ds) on the GPU: the op's GPU
# tests, the op timed with and without it (flex beside), the 8K step with and without it
# (sm90_configs.json swapped between runs, alternating)
set -u
J=native/block_diffusion_attention/sm90_configs.json
began=$(date +%s); left() { echo $(( ${BUDGET:-570} - ($(date +%s) - began) )); }
bash ci/gpu_session.sh deps
cp $J "$OUT/sm90_configs_ds.json"
python3 - <<'PY'
import json, os
d = json.load(open("native/block_diffusion_attention/sm90_configs.json"))
d["configs"]["128"]["dkdv_ds"] = 0
json.dump(d, open(os.environ["OUT"] + "/sm90_configs_plain.json", "w"), indent=2)
PY
if [ -z "${SKIP_TESTS:-}" ]; then
  echo "=== tests $(date -u +%T)"
  timeout 240 python3 -m pytest -q -m gpu tests/gpu/test_block_diffusion_attention_gpu.py -p no:cacheprovider \
    2>&1 | tee "$OUT/gpu-tests-attention.log" | tail -8
fi
echo "=== profile $(date -u +%T)"
timeout 120 python3 benchmarks/results/2026-12-03-h200-s22/ds_profile.py 2>&1 | grep -vE "^\s*$" | tail -6
echo "=== bench $(date -u +%T)"
timeout 200 python3 benchmarks/attention.py --stream-lens 16384,8192 --block-sizes 32 --kernels ${KERNELS:-turbo,flex} \
  --variant turbo-recompute:dkdv_ds=0 --out "$OUT/attention.json" 2>&1 | tee "$OUT/attention.log" | grep -vE "^\s*$" | tail -14
step() {
  v=$1
  [ "$(left)" -gt 110 ] || { echo "=== skip step $v (time)"; return; }
  cp "$OUT/sm90_configs_$v.json" $J
  echo "=== step $v $(date -u +%T)"
  timeout $(( $(left) - 5 )) python3 benchmarks/train_step.py --seq-len 8192 --attention turbo --no-baseline \
    --steps 4 --warmup 2 --out "$OUT/step8192_$v-$2.json" 2>&1 | grep -E "ours step|^turbo-dllm|rror" | tail -6
}
step ds 1; step plain 1; step ds 2; step plain 2
cp "$OUT/sm90_configs_ds.json" $J
