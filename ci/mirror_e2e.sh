#!/usr/bin/env bash
# Air-gapped install rehearsal for the real CPU target (manifests/cpu-x86_64.toml):
#   1. download every pinned wheel with pip (hashes required), build the project's wheel and the
#      CPU bundle, publish the bundle;
#   2. dllm mirror create / verify, then dllm mirror serve on 127.0.0.1;
#   3. in a fresh venv (no system site packages): dllm env sync --offline from the served mirror,
#      dllm bundle install --auto from it, dllm doctor, dllm env check;
#   4. pip and uv (real clients) install turbo-dllm with all its dependencies from the mirror alone.
# Needs the registry once (step 1); steps 2-4 use nothing but the mirror.
# Usage: bash ci/mirror_e2e.sh [WORKDIR]      (PYTHON=... picks the interpreter with turbo-dllm)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=$REPO/.venv/bin/python; else PYTHON=$(command -v python3); fi
fi
TARGET=${TARGET:-cpu-x86_64}
RELEASE=${RELEASE:-v0.0.0-e2e}
WORK=${1:-$(mktemp -d "${TMPDIR:-/tmp}/dllm-mirror-e2e.XXXXXX")}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
export DLLM_HOME=$WORK/home UV_CACHE_DIR=$WORK/uv-cache PIP_NO_CACHE_DIR=1
BASE_PYTHON=$("$PYTHON" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')
dllm() { "$PYTHON" -m turbo_dllm "$@"; }
step() { printf '\n== %s\n' "$*"; }
SECONDS=0

step "1/4 wheels pinned by manifests/$TARGET.toml (pip download, hashes required)"
dllm env requirements --target "$TARGET" > "$WORK/requirements.txt"
# pip matches --platform tags literally: list every manylinux tag the target's glibc accepts.
read -r PYVER PLATFORMS < <("$PYTHON" - "manifests/$TARGET.toml" <<'PY'
import sys, tomlkit
m = tomlkit.parse(open(sys.argv[1]).read())
arch, _, glibc = m["python_platform"].partition("-manylinux_")
major, minor = map(int, glibc.split("_"))
tags = [f"manylinux_{major}_{y}_{arch}" for y in range(minor, 4, -1)]
tags += [f"manylinux{alias}_{arch}" for alias, y in (("2014", 17), ("2010", 12), ("1", 5)) if y <= minor]
print(m["python"], " ".join(f"--platform {t}" for t in tags))
PY
)
# shellcheck disable=SC2086
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --require-hashes \
  --python-version "$PYVER" $PLATFORMS \
  -r "$WORK/requirements.txt" -d "$WORK/wheels"
echo "downloaded $(ls "$WORK/wheels" | wc -l) wheels, $(du -sh "$WORK/wheels" | cut -f1)"
"$PYTHON" -m pip wheel --quiet --no-deps --no-build-isolation -w "$WORK/wheels" "$REPO"
ls "$WORK/wheels"/turbo_dllm-*.whl

step "1/4 CPU bundle: build and publish as release $RELEASE"
dllm bundle build --target "$TARGET" --out "$WORK/bundle"
CATALOG_SHA=$(dllm bundle publish "$WORK"/bundle/*.tar.zst --release "$RELEASE" \
  --mirror "$WORK/published" --json | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["catalog_sha256"])')
echo "catalog sha256 $CATALOG_SHA"

step "2/4 dllm mirror create + verify"
dllm mirror create "$WORK/mirror" --release "$RELEASE" --targets "$TARGET" \
  --wheels-from "$WORK/wheels" --from "$WORK/published" --catalog-sha256 "$CATALOG_SHA"
dllm mirror verify "$WORK/mirror"
du -sh "$WORK/mirror"

step "2/4 dllm mirror serve on 127.0.0.1"
# Not through the dllm() function: $! must be the server itself, so the trap can stop it.
"$PYTHON" -m turbo_dllm mirror serve "$WORK/mirror" --port 0 --quiet > "$WORK/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q ' at http' "$WORK/serve.log" && break; sleep 0.1; done
URL=$(sed -n 's/.* at \(http:[^ ]*\)\/ .*/\1/p' "$WORK/serve.log" | head -1)
[ -n "$URL" ] || { cat "$WORK/serve.log"; exit 1; }
echo "mirror at $URL"
dllm mirror verify "$URL"

step "3/4 fresh venv: dllm env sync --offline from $URL"
dllm env sync --mirror "$URL" --offline --venv "$WORK/venv" --python "$BASE_PYTHON"
VENV_DLLM=$WORK/venv/bin/dllm
"$VENV_DLLM" bundle install --auto --release "$RELEASE" --index "$URL" --catalog-sha256 "$CATALOG_SHA"
"$VENV_DLLM" env check
(cd "$WORK" && "$VENV_DLLM" doctor)

step "4/4 real clients install turbo-dllm (with dependencies) from $URL/simple alone"
"$BASE_PYTHON" -m venv "$WORK/pip-venv"
PIP_CONFIG_FILE=/dev/null "$WORK/pip-venv/bin/python" -m pip --isolated install --quiet \
  --index-url "$URL/simple" "turbo-dllm[data,env]"
"$WORK/pip-venv/bin/python" -c 'import torch, turbo_dllm; print("pip venv: turbo_dllm", turbo_dllm.__version__, "torch", torch.__version__)'
"$WORK/venv/bin/python" -m uv venv --quiet --no-config --python "$BASE_PYTHON" "$WORK/uv-venv"
"$WORK/venv/bin/python" -m uv pip install --quiet --no-config --python "$WORK/uv-venv/bin/python" \
  --index-url "$URL/simple" "turbo-dllm[data,env]"
"$WORK/uv-venv/bin/python" -c 'import torch, turbo_dllm; print("uv venv: turbo_dllm", turbo_dllm.__version__, "torch", torch.__version__)'

step "done in ${SECONDS}s; work dir $WORK"
