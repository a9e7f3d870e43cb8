#!/usr/bin/env bash
# GPU qualification of the native kernels on an H200 host (Python 3.12, torch 2.11+cu130,
# nvcc 13.0, no internet; the package need not be installed: PYTHONPATH points at the checkout).
#
#   bash ci/gpu_qualify.sh [OUT_DIR]
#
# 1. fingerprint the host          4. serve the mirror on 127.0.0.1 and `dllm bundle install --auto`
# 2. build the sm90 bundle         5. status + verify the installed bundle
# 3. publish it to a temp mirror   6. run tests/gpu/test_merge_attention_gpu.py (and the
#                                      Triton op's bundle test) against it
# Everything goes to OUT_DIR (default: $OUT, else a temp dir): build/publish/install JSON, the
# bundle archive, pytest's log and junit XML, and summary.txt.
# TARGET=cpu-x86_64 runs the same steps on a CPU host (the GPU tests then skip): a dry run of
# this script itself.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT_DIR=${1:-${OUT:-$(mktemp -d -t dllm-qualify-XXXXXX)}}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
PY=${PYTHON:-python3}
TARGET=${TARGET:-sm90}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export DLLM_HOME="$OUT_DIR/dllm-home" TARGET
unset DLLM_BUNDLE_INDEX
log() { printf '\n== %s\n' "$*" | tee -a "$OUT_DIR/summary.txt"; }
dllm() { "$PY" -m turbo_dllm "$@"; }

log "dependencies"
"$PY" - <<'EOF' | tee -a "$OUT_DIR/summary.txt"
import importlib.util, sys
missing = [m for m in ("pydantic", "requests", "tomlkit", "zstandard", "filelock", "platformdirs",
                       "packaging", "yaml", "rich", "pytest", "torch") if importlib.util.find_spec(m) is None]
import os
from torch.utils.cpp_extension import CUDA_HOME, is_ninja_available
import torch
gpu_target = os.environ.get("TARGET", "sm90") != "cpu-x86_64"
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda {torch.version.cuda}, "
      f"CUDA_HOME {CUDA_HOME}, ninja {is_ninja_available()}, gpus {torch.cuda.device_count()}")
if missing or not is_ninja_available() or (gpu_target and CUDA_HOME is None):
    sys.exit(f"missing: {missing or ''} {'' if is_ninja_available() else 'ninja'} "
             f"{'' if CUDA_HOME or not gpu_target else 'nvcc/CUDA_HOME'}")
EOF

log "fingerprint"
dllm bundle fingerprint | tee -a "$OUT_DIR/summary.txt"
dllm bundle fingerprint --json > "$OUT_DIR/fingerprint.json"

log "build the $TARGET bundle"
start=$SECONDS
dllm bundle build --target "$TARGET" --out "$OUT_DIR/dist" --json > "$OUT_DIR/build.json"
echo "built in $((SECONDS - start)) s: $(cat "$OUT_DIR/build.json")" | tee -a "$OUT_DIR/summary.txt"

log "publish to a temp mirror"
dllm bundle publish "$OUT_DIR"/dist/*.tar.zst --release qualify --mirror "$OUT_DIR/mirror" --json \
  > "$OUT_DIR/publish.json"
CATALOG_SHA=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["catalog_sha256"])' "$OUT_DIR/publish.json")
echo "catalog sha256 $CATALOG_SHA" | tee -a "$OUT_DIR/summary.txt"

log "serve on 127.0.0.1 and install --auto"
PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$PY" -m http.server "$PORT" --bind 127.0.0.1 --directory "$OUT_DIR/mirror" > "$OUT_DIR/http.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 50); do
  "$PY" -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1])" "http://127.0.0.1:$PORT/" 2>/dev/null && break
  sleep 0.1
done
start=$SECONDS
dllm bundle install --release qualify --auto --index "http://127.0.0.1:$PORT" \
  --catalog-sha256 "$CATALOG_SHA" --json > "$OUT_DIR/install.json"
echo "installed in $((SECONDS - start)) s" | tee -a "$OUT_DIR/summary.txt"
dllm bundle status | tee -a "$OUT_DIR/summary.txt"
dllm bundle verify | tee -a "$OUT_DIR/summary.txt"
kill $SERVER 2>/dev/null || true

log "GPU op tests"
set +e
DLLM_GPU_TEST_HOME="$DLLM_HOME" "$PY" -m pytest -q -rA -s -p no:cacheprovider \
  tests/gpu/test_merge_attention_gpu.py \
  "tests/gpu/test_block_diffusion_attention_gpu.py::test_native_backend_imports_the_bundle_copy" \
  --junitxml="$OUT_DIR/pytest-gpu.xml" 2>&1 | tee "$OUT_DIR/pytest-gpu.log"
status=${PIPESTATUS[0]}
set -e
tail -n 3 "$OUT_DIR/pytest-gpu.log" >> "$OUT_DIR/summary.txt"
log "result: $([ "$status" -eq 0 ] && echo PASS || echo FAIL) (outputs in $OUT_DIR)"
exit "$status"
