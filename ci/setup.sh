#!/usr/bin/env bash
# Create .venv with everything turbo-dllm needs for the CPU quick start and the test suite.
# torch is installed first (the CPU build), so the package's `torch>=` range installs nothing more.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
.venv/bin/python -m pip install -q -e ".[data,test,env,plot,tensorboard]"
