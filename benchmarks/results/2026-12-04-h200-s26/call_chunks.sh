# session 26, call 2: the Gluon dK/dV launch in chunks (dkdv_order 0 = chosen by the grid's
# depth: chunks of 1 below 16 waves, of 16 from there; 1 = head-major; N = chunks of N).
set -u
began=$(date +%s); left() { echo $(( ${BUDGET:-580} - ($(date +%s) - began) )); }
[ -n "${SKIP_DEPS:-}" ] || bash ci/gpu_session.sh deps
python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_block_diffusion_attention_gpu.py \
  -k "gluon" 2>&1 | tee "$OUT/gpu-tests-gluon.log" | tail -3
V="--variant turbo-hm:dkdv_order=1 --variant turbo-c2:dkdv_order=2 --variant turbo-c4:dkdv_order=4"
for tokens in ${TOKENS:-65536 16384}; do
  echo "=== op, $tokens tokens a call $(date -u +%T)"
  python3 benchmarks/attention.py --stream-lens 16384,8192 --block-sizes 32 --tokens $tokens \
    --kernels turbo,flex $V --out "$OUT/ab_${tokens}.json" 2>&1 \
    | grep -E "^ *(2L|[0-9])|turbo|flex|rror" | tail -14
done
if [ "$(left)" -gt 200 ]; then
  echo "=== table $(date -u +%T)"
  timeout $(( $(left) - 5 )) python3 benchmarks/attention.py --out "$OUT/attention.json" 2>&1 \
    | tee "$OUT/attention.log" | tail -34
fi
