#!/usr/bin/env bash
# The quick start's main job on the embedded defaults: offline, CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
PROJECT=${1:-$(mktemp -d -u "${TMPDIR:-/tmp}/dllm-starter-XXXXXX")}
if [ -e "$PROJECT" ]; then echo "$PROJECT exists; pass another folder: bash ci/main_job.sh DIR" >&2; exit 2; fi
dllm init "$PROJECT"
cd "$PROJECT"
dllm config validate --config train.yaml > /dev/null
dllm doctor --config train.yaml
dllm data prepare --config prepare.yaml
# Compile the RunSpec into a job, write runs/first/manifest.json, train on CPU (~15-20 s on 2 cores).
dllm launch --config train.yaml --run-dir runs/first
dllm run plot runs/first
echo
echo "run:      $PROJECT/runs/first (metrics.jsonl, checkpoints/)"
echo "manifest: $PROJECT/runs/first/manifest.json (replay: dllm launch --manifest runs/first/manifest.json)"
echo "plots:    $PROJECT/runs/first/plots/"
