# session 28, call 2: the 8K step with main 3b431c4's trainer/loss files (clip_lm_head.patch
# reverted) against f15f211 (applied), alternated twice; the GPU's SM clock and power sampled
# every 50 ms during one step run of each and during the op alone at the step's shape.
set -u
P=benchmarks/results/2026-12-04-h200-s28/clip_lm_head.patch
[ -n "${SKIP_DEPS:-}" ] || bash ci/gpu_session.sh deps >/dev/null 2>&1
reasons=clocks_event_reasons.active
nvidia-smi --query-gpu=$reasons --format=csv >/dev/null 2>&1 || reasons=clocks_throttle_reasons.active
smi() { nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,$reasons \
  --format=csv,noheader -lms 50 > "$OUT/smi_$1.csv" 2>&1 & echo $!; }
apply() { if command -v patch >/dev/null; then patch -s -p1 "$@" < $P; else git apply "$@" $P; fi; }
for round in 1 2; do
  for side in before after; do
    [ $side = before ] && apply -R
    pid=""; [ $round = 1 ] && pid=$(smi step_$side)
    python3 benchmarks/train_step.py --attention turbo --no-baseline --steps 8 --warmup 2 \
      --out "$OUT/step_${side}_$round.json" 2>&1 | grep -E "^turbo-dllm|rror"
    [ -n "$pid" ] && kill $pid
    [ $side = before ] && apply
    echo "  ^ $side, round $round"
  done
done
pid=$(smi op_alone)
python3 benchmarks/attention.py --stream-lens 16384 --block-sizes 32 --tokens 16384 --kernels turbo \
  --repeats 50 --out "$OUT/op_alone.json" 2>&1 | grep -E "^turbo|rror"
kill $pid
python3 benchmarks/train_step.py --attention turbo --no-baseline --steps 4 --warmup 2 \
  --profile "$OUT/profile_8k.txt" --out "$OUT/step_profile.json" 2>&1 | grep -E "^turbo-dllm|rror"
