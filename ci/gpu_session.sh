#!/usr/bin/env bash
# Everything we run on a lent H200 host, in one script: bash ci/gpu_session.sh STAGE...
# Stages: deps, qualify (sm90 bundle build/install + op tests), tests (tests/gpu; now longer than
# one 600 s call: run tests-rest and tests-train in two), tests-rest (tests/gpu but the
# tests-train files; tests-rest-a and tests-rest-b are its two halves), tests-train (the loss, trainer and TP GPU tests), tests-tp, train
# (train_step benchmark), train-best (ours at micro-batch 2 against the baseline at 1), train-mb2,
# train-exp (profile + variants), train-turbo (ours with model.attention turbo vs HF dense and
# HF flex_attention + torch.compile at 8K), train-pipelined (turbo at 8K, steps waited for vs
# queued as the trainer runs them, alternated), train-trim (turbo at 8K with and without the
# stream trim, alternated; the autoregressive objective too), train-inductor (turbo at 8K on inductor's
# defaults vs INDUCTOR_FLAGS, e.g. GEMM autotuning, alternated), dflash-features (prepare-features, 8 rows
# a forward vs one; FEATURES_FLAGS), train-turbo-32k (32K with AC, turbo vs flex),
# context-1doc (longest one-document context, turbo and flex), tests-gemma (DiffusionGemma GPU tests: grouped GEMM vs loop,
# flex training), train-gemma (train_step --family diffusion_gemma against HF's
# DiffusionGemmaForBlockDiffusion; GEMMA_SEQ_LEN, default 8192; GEMMA_MODEL h200-bench or
# h200-bench-hd256), flex-tune, attention (= attention-tests: the block-diffusion kernel's GPU
# tests, then attention-bench: turbo vs flex vs causal SDPA; ATTN_FLAGS adds
# benchmarks/attention.py flags, e.g. "--stream-lens 16384 --block-sizes 32"), attention-sweep
# (turbo's kernel variants timed, the winners written as $OUT/sm90_configs.json), tests2
# (2-GPU tests), cp (CSBP vs CP throughput),
# search1/search2 (longest context on 1/2 GPUs; needs 2 GPUs), snap (one probe trial with an
# allocator snapshot), packs (first-step compile overhead of the 1.7B / 8K shape in a fresh home,
# cold and then with a compile-cache pack made from the cold run), repro (the sm90 bundle built
# twice in fresh homes and folders: the two archives must be byte-identical), precompiled (a
# bundle built here, installed in a fresh home: the op launches from an empty Triton cache
# without compiling), install-bench (benchmarks/bundle_install.py with the bundle built here, on all
# cores and pinned to two; INSTALL_SIZES, INSTALL_REPEATS), families (~4-5 min:
# fla's chunk kernel against the torch reference and qwen3_8 training with fla, which skip where
# fla refuses the host, and the torch chunked form on CUDA; FAMILY_TESTS=0 skips them); then the
# train_step benchmark, 2+4 steps each, uncompiled layers unless
# FAMILY_COMPILE=1, under QWEN_TIMEOUT_S / NEMOTRON_TIMEOUT_S (150 / 300 s), for FAMILIES (default
# "qwen3_8 nemotron_diffusion", in that order; NAME:SECONDS sets one's limit): qwen3_8 against
# HF Qwen3_5ForCausalLM and for nemotron_diffusion against our decoder; fla travels in .whl/ as
# flash_linear_attention and fla_core), speculative (DFlash vs
# AR drafter: train a target, distill both, dllm dflash eval on held-out stdlib files;
# SPEC_FLAGS adds benchmarks/speculative.py flags, e.g. "--dflash-variants
# dflash2,greedy-ce --drafter-seconds 90 --num-prompts 32": a DFlash2 and a DFlash drafter
# against one AR drafter within 10 minutes, each architecture's compile warmed first; or
# "--tokenizer bpe:8192 --drafter-seconds 90 --num-prompts 24 --ar-variants
# constant-quarter,constant-tenth": BPE tokens, AR drafters stopped early, ~8 minutes),
# gluon-dkdv (~1 min: the op's Gluon dK/dV, alone and with dQ fused, checked and timed against
# its tl kernels; GLUON_FLAGS adds flags, e.g. "--head-dim 64 --stages 2"), gluon-fwd (the same for the Gluon forward prototype;
# GLUON_FWD_FLAGS, e.g. "--head-dim 64 --stages 3"). Logs and JSON go to $OUT (or ./gpu-out). Start every fresh
# machine with deps.
# CP_FLAGS adds context_parallel.py flags to the cp/search/snap stages (e.g. "--mlp-chunks 4").
# CSBP's merge op: the jit backend builds the bundle's CUDA sources in place (CP_KERNELS=reference
# for the pure-torch merge, which keeps float32 copies of both partial outputs for its backward).
# The host has torch/CUDA but no registry: missing pure-Python deps travel as wheels in .whl/.
# SMI_MS=50 samples the GPU's SM clock, power and throttle reasons every 50 ms into
# $OUT/smi.csv for the whole session (the 8K step runs at the 700 W power cap: clocks explain
# kernels that run slower in a step than alone; docs/benchmarks.md, session 28).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
# NVLink multicast stays off on shared hosts (see the device notes).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
status=0
if [ -n "${SMI_MS:-}" ]; then
  reasons=clocks_event_reasons.active  # older drivers call it clocks_throttle_reasons
  nvidia-smi --query-gpu=$reasons --format=csv >/dev/null 2>&1 || reasons=clocks_throttle_reasons.active
  echo "timestamp, sm MHz, mem MHz, power W, temperature C, $reasons" > "$OUT/smi.csv"
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,$reasons \
    --format=csv,noheader,nounits -lms "$SMI_MS" >> "$OUT/smi.csv" 2>&1 &
  smi_pid=$!; trap 'kill $smi_pid 2>/dev/null' EXIT
fi
for stage in "$@"; do
  echo "=== $stage ($(date -u +%H:%M:%S))"
  case $stage in
    deps)
      [ -d .whl ] && python3 -m pip install -q --no-index --find-links .whl \
        pydantic tomlkit zstandard platformdirs rich pyyaml requests filelock pytest packaging \
        ninja hypothesis 2>&1 | tail -3
      # fla (qwen3_8's Gated DeltaNet kernels) for the GPU tests that need it, where carried
      ls .whl/flash_linear_attention-*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index \
        --find-links .whl --no-deps flash-linear-attention fla-core 2>&1 | tail -3
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
      python3 -c 'import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__, torch.cuda.device_count())' ;;
    qualify) # outputs go to a scratch dir (many files); the logs that matter are copied to $OUT
      rm -rf /tmp/qualify; bash ci/gpu_qualify.sh /tmp/qualify > "$OUT/qualify.log" 2>&1 || status=1
      cp /tmp/qualify/summary.txt "$OUT/qualify-summary.txt" 2>/dev/null
      cp /tmp/qualify/pytest-gpu.log "$OUT/qualify-pytest.log" 2>/dev/null
      grep -E "passed|failed|Error|error:" "$OUT/qualify.log" | tail -15 ;;
    tests) python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider 2>&1 | tee "$OUT/gpu-tests.log" | tail -25 || status=1 ;;
    tests-rest) # tests/gpu but the tests-train files: with tests-train, the whole GPU suite in
      # two calls (one call ran past 590 s in session 29)
      python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu --ignore=tests/gpu/test_losses_gpu.py \
          --ignore=tests/gpu/test_train_gpu.py --ignore=tests/gpu/test_tp_gpu.py 2>&1 \
          | tee "$OUT/gpu-tests-rest.log" | tail -25 || status=1 ;;
    tests-rest-a|tests-rest-b) # tests-rest in two halves by file, for hosts (H100s with deps in the
      # same call) where tests-rest alone ran past one 600 s call (session 40); -b is every
      # tests-rest file not in -a, so new files land there
      half_a=(test_block_diffusion_attention_gpu.py test_block_mask_gpu.py test_bundle_triton_cache_gpu.py
              test_merge_attention_gpu.py test_merge_warning_gpu.py test_stream_trim_gpu.py)
      targets=("${half_a[@]/#/tests/gpu/}")
      if [ "$stage" = tests-rest-b ]; then
        targets=(tests/gpu --ignore=tests/gpu/test_losses_gpu.py --ignore=tests/gpu/test_train_gpu.py
                 --ignore=tests/gpu/test_tp_gpu.py "${half_a[@]/#/--ignore=tests/gpu/}")
      fi
      python3 -m pytest -q -m gpu -p no:cacheprovider -rs --durations=15 "${targets[@]}" 2>&1 \
          | tee "$OUT/gpu-$stage.log" | tail -40 || status=1 ;;
    tests-train) python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_losses_gpu.py \
          tests/gpu/test_train_gpu.py tests/gpu/test_tp_gpu.py 2>&1 | tee "$OUT/gpu-tests-train.log" | tail -25 || status=1 ;;
    tests-tp) python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_tp_gpu.py 2>&1 \
          | tee "$OUT/gpu-tests-tp.log" | tail -5 || status=1 ;;
    train) python3 benchmarks/train_step.py --out "$OUT/train_step.json" 2>&1 | tee "$OUT/train_step.log" | tail -8 || status=1 ;;
    train-best) # each side at its best micro-batch on one H200 (the baseline's 2 needs ~170 GB)
      python3 benchmarks/train_step.py --micro-batch 2 --baseline-micro-batch 1 --out "$OUT/train_step_best.json" \
          2>&1 | tee "$OUT/train_step_best.log" | tail -6 || status=1 ;;
    train-turbo) # ~3.5 min: ours with turbo (kernels: jit, the bundle's source) against both HF
      # baselines at 8K, micro-batch 1 (HF flex compiles the whole model: ~1.5 min of it)
      python3 benchmarks/train_step.py --attention turbo --baselines dense,hf-flex --steps 5 --warmup 2 ${TRAIN_FLAGS:-} \
          --out "$OUT/train_step_turbo.json" 2>&1 | tee "$OUT/train_step_turbo.log" \
          | grep --line-buffered -E "step [0-9]+:|^turbo-dllm|^hf-|speedup|out of memory|rror" || status=1 ;;
    train-pipelined) # ~4 min: ours with turbo at 8K, steps waited for one at a time against steps
      # queued as `dllm train` runs them (--pipelined), alternated twice (no baselines)
      for round in 1 2; do for mode in waited pipelined; do
        flags=""; [ "$mode" = pipelined ] && flags="--pipelined"
        python3 benchmarks/train_step.py --attention turbo --no-baseline --steps 8 --warmup 2 $flags \
            --out "$OUT/train_step_${mode}_$round.json" 2>&1 | tee "$OUT/train_step_${mode}_$round.log" \
            | grep --line-buffered -E "^turbo-dllm|rror" || status=1
      done; done ;;
    train-inductor) # ~5-8 min: ours with turbo at 8K on inductor's defaults against INDUCTOR_FLAGS
      # (default "--inductor max_autotune_gemm=True": GEMMs autotuned against inductor's Triton
      # templates, which can fuse the norms and SwiGLU around them), alternated (no baselines)
      for mode in default tuned; do
        flags=""; [ "$mode" = tuned ] && flags="${INDUCTOR_FLAGS:---inductor max_autotune_gemm=True}"
        python3 benchmarks/train_step.py --attention turbo --no-baseline --steps 6 --warmup 2 $flags \
            --out "$OUT/train_step_inductor_${mode}.json" 2>&1 | tee "$OUT/train_step_inductor_${mode}.log" \
            | grep --line-buffered -E "^turbo-dllm|rror" || status=1
      done ;;
    dflash-features) # ~3 min: dllm dflash prepare-features with the target run 8 rows a forward
      # against one row a forward (a random 0.6B-shaped target, ~1K standard-library rows of 2K)
      python3 benchmarks/dflash_features.py ${FEATURES_FLAGS:-} --out "$OUT/dflash_features.json" 2>&1 \
          | tee "$OUT/dflash_features.log" | grep --line-buffered -E "round|speedup|rror" || status=1 ;;
    train-trim) # ~4 min: ours with turbo at 8K with and without the stream trim (the last layer's
      # clean rows skipped: train/attention/trim.py), alternated twice (no baselines); then the
      # autoregressive objective, whose trim runs the clean half alone, with and without it
      for round in 1 2; do for mode in trim whole; do
        flags=""; [ "$mode" = whole ] && flags="--no-stream-trim"
        python3 benchmarks/train_step.py --attention turbo --no-baseline --steps 6 --warmup 2 $flags \
            --out "$OUT/train_step_${mode}_$round.json" 2>&1 | tee "$OUT/train_step_${mode}_$round.log" \
            | grep --line-buffered -E "^turbo-dllm|rror" || status=1
      done; done
      for mode in trim whole; do
        flags=""; [ "$mode" = whole ] && flags="--no-stream-trim"
        python3 benchmarks/train_step.py --attention turbo --no-baseline --steps 4 --warmup 2 $flags \
            --objective autoregressive --out "$OUT/train_step_ar_${mode}.json" 2>&1 \
            | tee "$OUT/train_step_ar_${mode}.log" | grep --line-buffered -E "^turbo-dllm|rror" || status=1
      done ;;
    train-turbo-32k) # ~2.5 min: 32K with activation checkpointing, ours turbo vs flex (HF OOMs there);
      # AC_MODE=keep_attention keeps the attention outputs, keep_matmuls the GEMMs too (selective checkpointing);
      # TRAIN_FLAGS adds train_step flags to both train-turbo stages (e.g. --profile "$OUT/p.txt")
      python3 benchmarks/train_step.py --seq-len 32768 --activation-checkpointing ${AC_MODE:-} --attention turbo,flex ${TRAIN_FLAGS:-} \
          --no-baseline --steps 3 --warmup 1 --out "$OUT/train_step_turbo_32k.json" 2>&1 \
          | tee "$OUT/train_step_turbo_32k.log" | grep --line-buffered -E "step [0-9]+:|^turbo-dllm|MFU|rror" || status=1 ;;
    context-1doc) # ~4 min (SEARCH_BUDGET_S, split between turbo and flex): the longest L that
      # trains two steps with one document per sequence, AC on, MLP chunks 4
      python3 benchmarks/train_step.py --context-search "${CONTEXT_LENS:-65536,98304,131072,196608}" \
          --attention turbo,flex --activation-checkpointing --mlp-chunks 4 --no-compile \
          --search-budget-s "${SEARCH_BUDGET_S:-240}" --out "$OUT/context_1doc.json" 2>&1 \
          | tee "$OUT/context_1doc.log" | grep --line-buffered -E "L=|longest|^  (turbo|flex)" || status=1 ;;
    train-mb2) python3 benchmarks/train_step.py --micro-batch 2 --no-baseline --out "$OUT/train_step_mb2.json" 2>&1 | tee "$OUT/train_step_mb2.log" | tail -6 || status=1 ;;
    train-exp) # where the step's time goes, and the variants worth trying (ours only)
      python3 benchmarks/train_step.py --no-baseline --profile "$OUT/train_profile.txt" \
        --out "$OUT/ts_default.json" 2>&1 | tail -3 || status=1
      # (--inductor max_autotune=True over the whole model did not finish compiling in 300 s)
      python3 benchmarks/train_step.py --no-baseline --micro-batch 2 --out "$OUT/ts_mb2.json" 2>&1 | tail -2 || status=1 ;;
    tests-gemma) python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_grouped_gemm_gpu.py tests/gpu/test_block_mask_gpu.py \
          tests/gpu/test_diffusion_gemma_gpu.py 2>&1 | tee "$OUT/gpu-tests-gemma.log" | tail -8 || status=1 ;;
    # (progress lines every 10-20 s and Python stacks after 2 min in one phase; bounded by
    # GEMMA_TIMEOUT seconds, default 420, so a slow cold compile cannot eat the whole call;
    # GEMMA_FLAGS adds train_step flags, e.g. "--no-compile" or "--steps 3")
    train-gemma) timeout "${GEMMA_TIMEOUT:-420}" python3 benchmarks/train_step.py --family diffusion_gemma \
          --seq-len "${GEMMA_SEQ_LEN:-8192}" --model "${GEMMA_MODEL:-h200-bench}" ${GEMMA_FLAGS:-} \
          --out "$OUT/train_step_gemma.json" 2>&1 | tee "$OUT/train_step_gemma.log" | tail -8 || status=1 ;;
    flex-tune) python3 benchmarks/flex_tune.py --autotune --out "$OUT/flex_tune.json" 2>&1 \
          | grep -v "^\s*$" | tee "$OUT/flex_tune.log" | grep -E "ms|AUTOTUNE|BLOCK|failed" | tail -60 || status=1 ;;
    attention|attention-tests|attention-bench) # block-diffusion attention: turbo (Triton) vs reference, flex, SDPA
      if [ "$stage" != attention-bench ]; then
        python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_block_diffusion_attention_gpu.py \
          2>&1 | tee "$OUT/gpu-tests-attention.log" | tail -8 || status=1
      fi
      if [ "$stage" != attention-tests ]; then
        python3 benchmarks/attention.py ${ATTN_FLAGS:-} --out "$OUT/attention.json" 2>&1 \
          | tee "$OUT/attention.log" | tail -45 || status=1
      fi ;;
    attention-sweep) # ~3 min: every variant of turbo's three kernels at 2L 16K and 8K block 32
      # (compiled in 8 processes first), the winners combined, then turbo / turbo-best / flex;
      # sm90_configs.json in $OUT is the new defaults file (copy it to native/block_diffusion_attention/)
      python3 benchmarks/attention.py --sweep --kernels turbo,flex ${ATTN_FLAGS:-} \
          --out "$OUT/attention_sweep.json" --write-configs "$OUT/sm90_configs.json" 2>&1 \
          | tee "$OUT/attention_sweep.log" | grep --line-buffered -vE "^\s*$|^warm " || status=1 ;;
    gluon-dkdv) # the op's Gluon dK/dV paths against its tl kernels: numbers and time (GLUON_FLAGS)
      python3 benchmarks/attention_gluon_dkdv.py ${GLUON_FLAGS:-} 2>&1 | tee -a "$OUT/gluon_dkdv.log" | tail -14
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    gluon-fwd) # the Gluon forward prototype against the tl forward: numbers and time (GLUON_FWD_FLAGS)
      python3 benchmarks/attention_gluon_fwd.py ${GLUON_FWD_FLAGS:-} 2>&1 | tee -a "$OUT/gluon_fwd.log" | tail -8
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    speculative) python3 benchmarks/speculative.py --out "$OUT/speculative.json" ${SPEC_FLAGS:-} \
          2>&1 | grep -v "Loading weights" | tee "$OUT/speculative.log" | tail -12 || status=1 ;;
    tests2) python3 -m pytest -q -p no:cacheprovider tests/distributed/test_csbp_gpu.py \
          "tests/gpu/test_train_gpu.py::test_two_gpus_nccl_match_one" 2>&1 | tee "$OUT/gpu-tests2.log" | tail -8 || status=1 ;;
    cp) python3 benchmarks/context_parallel.py --parts throughput --seq-lens "${CP_SEQ_LENS:-32768,65536}" \
          --kernels "${CP_KERNELS:-jit}" ${CP_FLAGS:-} \
          --out "$OUT/context_parallel.json" \
          2>&1 | tee "$OUT/cp-throughput.log" | tail -20 || status=1 ;;
    search1|search2) python3 benchmarks/context_parallel.py --parts search --search-gpus "${stage#search}" \
          --budget-s "${SEARCH_BUDGET_S:-200}" --search-start "${SEARCH_START:-65536}" \
          --search-granularity "${SEARCH_GRAIN:-32768}" --kernels "${CP_KERNELS:-jit}" ${CP_FLAGS:-} \
          --out "$OUT/context_parallel.json" 2>&1 \
          | tee "$OUT/cp-$stage.log" | tail -12 || status=1 ;;
    snap) # exactly one probe trial (--budget-s 1) at SNAP_LEN on SNAP_GPUS GPUs, with rank 0's allocator snapshot
      python3 benchmarks/context_parallel.py --parts search --search-gpus "${SNAP_GPUS:-2}" \
          --search-start "${SNAP_LEN:-524288}" --search-max "${SNAP_LEN:-524288}" --budget-s 1 \
          --kernels "${CP_KERNELS:-jit}" ${CP_FLAGS:-} --memory-snapshot /tmp/snapshots --out "$OUT/snap.json" 2>&1 \
          | tee "$OUT/snap.log" | tail -4
      for f in /tmp/snapshots/*/memory_rank0.txt; do  # the summaries the benchmark wrote
        cp "$f" "$OUT/$(basename "$(dirname "$f")").txt" && head -12 "$f"
      done ;;
    packs) # the CUDA pack test, then the target: with the pack, first step - median step <= 5 s
      python3 -m pytest -q -m gpu -p no:cacheprovider tests/cache 2>&1 | tee "$OUT/packs-tests.log" | tail -5
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      python3 benchmarks/first_step.py --out "$OUT/packs" 2>&1 | tee "$OUT/packs.log" | tail -40
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1 ;;
    repro) # nvcc too must keep this host's paths and times out of the bundle
      rm -rf /tmp/repro && for i in 1 2; do
        DLLM_HOME=/tmp/repro/home$i python3 -m turbo_dllm bundle build --target sm90 \
          --out /tmp/repro/out$i/dist --json > "$OUT/repro-$i.json" 2> "$OUT/repro-$i.log" || status=1
      done
      sha256sum /tmp/repro/out*/dist/*.tar.zst | tee "$OUT/repro-sha256.txt"
      [ "$(cut -d' ' -f1 "$OUT/repro-sha256.txt" | sort -u | wc -l)" -eq 1 ] || { echo "NOT reproducible"; status=1; } ;;
    install-bench) # #20's install ratio on this host: the bundle built here (--target auto), padded to
      # INSTALL_SIZES MiB, dllm bundle install --auto vs pip of a same-size wheel, one loopback server;
      # once on all cores, once pinned to two (taskset -c 0,1), like the 2-core development machine
      rm -rf /tmp/ib && python3 -m turbo_dllm bundle build --target auto --out /tmp/ib/dist \
          > "$OUT/install-bench-build.log" 2>&1 || status=1
      archive=$(ls /tmp/ib/dist/*.tar.zst | head -1); nproc; lscpu | grep -m1 "Model name"
      python3 benchmarks/bundle_install.py --archive "$archive" --sizes "${INSTALL_SIZES:-0,64}" \
          --repeats "${INSTALL_REPEATS:-9}" --out "$OUT/bundle_install.json" 2>&1 | tail -6 || status=1
      taskset -c 0,1 python3 benchmarks/bundle_install.py --archive "$archive" --sizes "${INSTALL_SIZES:-0,64}" \
          --repeats "${INSTALL_REPEATS:-9}" --out "$OUT/bundle_install_2cpu.json" 2>&1 | tail -6 || status=1 ;;
    precompiled) # the sm90 bundle built here carries the compiled Triton kernels: an empty cache compiles nothing
      python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_bundle_triton_cache_gpu.py 2>&1 \
          | tee "$OUT/gpu-tests-precompiled.log" | tail -5 || status=1 ;;
    families) # ~5-9 min: the gated-delta GPU tests (fla's skip where fla refuses the host; the
      # torch chunked form's, bf16 and compiled, run), then each
      # family's train_step benchmark under its own time limit, step lines printed as they come.
      # Layers run uncompiled by default (FlexAttention compiles anyway): a cold layer compile
      # alone took 180-230 s for the 1.7B decoder; FAMILY_COMPILE=1 compiles them.
      [ -d .whl ] && python3 -m pip install -q --no-index --find-links .whl --no-deps \
        flash-linear-attention fla-core einops 2>&1 | tail -3
      # (and qwen3_8's saved-for-backward bytes under real CUDA autocast against transformers')
      if [ "${FAMILY_TESTS:-1}" = 1 ]; then
        timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/gpu/test_gated_delta_gpu.py \
            tests/gpu/test_gated_delta_torch_gpu.py tests/gpu/test_qwen3_8_memory_gpu.py 2>&1 \
            | tee "$OUT/gpu-tests-families.log" | tail -8
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      fi
      compile=--no-compile; [ "${FAMILY_COMPILE:-0}" = 1 ] && compile=
      for family in ${FAMILIES:-qwen3_8 nemotron_diffusion}; do
        case $family in *:*) ;; qwen3_8) family=qwen3_8:${QWEN_TIMEOUT_S:-150} ;;
          *) family=$family:${NEMOTRON_TIMEOUT_S:-300} ;; esac
        name=${family%%:*}; limit=${family##*:}
        echo "--- train_step --family $name, at most $limit s ($(date -u +%H:%M:%S))"
        timeout "$limit" python3 benchmarks/train_step.py --family "$name" --steps 4 --warmup 2 $compile \
            ${FAMILY_FLAGS:-} --out "$OUT/train_step_$name.json" 2>&1 | tee "$OUT/train_step_$name.log" \
          | grep --line-buffered -E "model |step [0-9]+:|refuses|rror|^(turbo|hf)|  mb |speedup|wrote"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done ;;
    *) echo "unknown stage $stage"; status=2 ;;
  esac
done
exit $status
