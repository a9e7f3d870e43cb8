# session 26: the Gluon dK/dV kernel's launch order. Default now heads innermost (dkdv_order 0,
# every head's heaviest key tile first); `hm` = the previous head-major order (dkdv_order=1).
# One call: the op's GPU tests, the op A/B at 64K and 16K tokens a call, the 8K step A/B.
set -u
began=$(date +%s); left() { echo $(( ${BUDGET:-580} - ($(date +%s) - began) )); }
[ -n "${SKIP_TESTS:-}" ] || bash ci/gpu_session.sh deps attention-tests
for tokens in ${TOKENS:-65536 16384}; do
  echo "=== op, $tokens tokens a call $(date -u +%T)"
  python3 benchmarks/attention.py --stream-lens 16384,8192 --block-sizes 32 --tokens $tokens \
    --kernels turbo,flex --variant turbo-hm:dkdv_order=1 --out "$OUT/ab_${tokens}.json" 2>&1 \
    | grep -E "^ *(2L|[0-9])|turbo|flex|rror" | tail -12
done
step() {  # name extra-flags...
  name=$1; shift
  [ "$(left)" -gt "${NEED:-90}" ] || { echo "=== skip step $name (time)"; return; }
  echo "=== step $name $(date -u +%T)"
  timeout $(( $(left) - 5 )) python3 benchmarks/train_step.py --seq-len 8192 --attention turbo \
    --no-baseline --steps 4 --warmup 2 "$@" --out "$OUT/step8192_$name.json" 2>&1 \
    | grep -E "ours step|^turbo-dllm|rror" | tail -7
}
n=0
for s in ${STEPS:-new hm new hm}; do
  if [ "$s" = hm ]; then step "${s}$((++n))" --turbo-config dkdv_order=1; else step "${s}$((++n))"; fi
done
