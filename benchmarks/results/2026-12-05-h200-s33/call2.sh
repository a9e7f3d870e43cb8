#!/usr/bin/env bash
# Session 33, call 2: the bundle qualification (build the sm90 bundle, install it from a
# loopback mirror, the installed-bundle GPU tests), which did not finish in session 32.
set -u
bash ci/gpu_session.sh deps 2>&1 | tail -2
timeout 560 bash ci/gpu_session.sh qualify
