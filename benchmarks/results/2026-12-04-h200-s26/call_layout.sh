# session 26, call 5: the op on the trainer's layout (q, k, v as (B, S, H, D) views) against
# contiguous per-head inputs, 16K tokens a call (micro-batch 1 at 2L 16K) and 64K.
set -u
[ -n "${SKIP_DEPS:-}" ] || bash ci/gpu_session.sh deps >/dev/null 2>&1
for tokens in 16384 65536; do
  for layout in bhsd bshd bhsd bshd; do
    echo "=== $layout, $tokens tokens a call"
    python3 benchmarks/attention.py --stream-lens 16384 --block-sizes 32 --tokens $tokens \
      --kernels turbo --layout $layout --out "$OUT/layout_${layout}_${tokens}_$RANDOM.json" 2>&1 \
      | grep -E "^turbo|rror"
  done
done
