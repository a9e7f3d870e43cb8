# session 21: the A/B script (STEPS/BENCH/SKIP_TESTS/TRAIN_TESTS env)
set -u
R=benchmarks/results/2026-12-03-h200-s21/ab  # op_head.py, trainer_head.py, base_head.py: main at afd5e83; *_new.py: main + next/dkdv_delta_late.patch + next/pinned_inputs_ahead.patch (session 20)
OP=native/block_diffusion_attention/block_diffusion_attention.py
T=turbo_dllm/train/trainer.py; B=turbo_dllm/train/objectives/base.py
began=$(date +%s); left() { echo $(( ${BUDGET:-570} - ($(date +%s) - began) )); }
[ -n "${SKIP_TESTS:-}" ] || bash ci/gpu_session.sh deps attention-tests ${TRAIN_TESTS:+tests-train}
for v in ${BENCH:-head new}; do
  cp $R/op_$v.py $OP
  echo "=== bench $v $(date -u +%T)"
  python3 benchmarks/attention.py --stream-lens 16384,8192 --block-sizes 32 --kernels turbo --out "$OUT/ab_$v.json" 2>&1 | grep -E "^turbo|rror" | tail -6
done
step() {  # op trainer seq_len extra-flags...
  op=$1 tr=$2 L=$3; shift 3
  [ "$(left)" -gt "${NEED:-100}" ] || { echo "=== skip step op=$op trainer=$tr L=$L (time)"; return; }
  cp $R/op_$op.py $OP; cp $R/trainer_$tr.py $T; cp $R/base_$tr.py $B
  echo "=== step op=$op trainer=$tr L=$L $(date -u +%T)"
  timeout $(( $(left) - 5 )) python3 benchmarks/train_step.py --seq-len $L --attention turbo --no-baseline "$@" \
    --out "$OUT/step${L}_op-${op}_trainer-${tr}.json" 2>&1 | grep -E "ours step|^turbo-dllm|rror" | tail -7
}
for s in ${STEPS:-head:head:8192 new:new:8192 new:head:8192}; do
  IFS=: read op tr L <<< "$s"
  if [ "$L" = 32768 ]; then NEED=170 step $op $tr $L --activation-checkpointing keep_matmuls --steps 3 --warmup 1
  else step $op $tr $L --steps 4 --warmup 2; fi
done
cp $R/op_new.py $OP; cp $R/trainer_new.py $T; cp $R/base_new.py $B
