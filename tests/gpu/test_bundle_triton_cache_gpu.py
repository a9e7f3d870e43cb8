"""A bundle built on a GPU host carries the Triton op's compiled kernels: a host with an empty
Triton cache that installs it launches the op at a training shape without compiling a kernel
(bundles/triton_cache.py; docs/bundles.md, Triton ops). Triton's host-side launch stubs (C,
built with the host's compiler: `cuda_utils` and one per kernel signature) are not shipped; the
test counts them apart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]

# A fresh process: the op from the bundle at the 1.7B shape's heads (16 query / 8 KV, head dim
# 128), q/k/v as the model's (B, S, H, D) views, forward and backward at a stream length that is a
# multiple of 16 and one that is not; then the cache entries.
PROBE = """
import json, os, torch
from pathlib import Path
from turbo_dllm.kernels.block_diffusion import block_diffusion_attention, plan_block_diffusion_attention
from turbo_dllm.kernels.loader import seed_compiled_kernels
from turbo_dllm.kernels.selftest import block_diffusion_tokens
cache = Path(os.environ["TRITON_CACHE_DIR"])
seeded = seed_compiled_kernels("block_diffusion_attention")  # what the first plan does
def entries():  # key -> a kernel (it has a group file) or a launch stub (a lone .so)
    return {p.name: any(p.glob("__grp__*")) for p in cache.iterdir()}
before = entries()
def view(seq, heads):
    x = torch.randn(1, seq, heads, 128, device="cuda", dtype=torch.bfloat16)
    return x.transpose(1, 2).requires_grad_(True)
for seq_len in (1024, 1004):  # 2L a multiple of 16 and not: the kernels' two specialisations
    meta = [t.cuda() for t in block_diffusion_tokens(seq_len, 32, 1, None)]
    plan = plan_block_diffusion_attention(*meta, *meta, backend="native")
    q, k, v = view(2 * seq_len, 16), view(2 * seq_len, 8), view(2 * seq_len, 8)
    out, lse = block_diffusion_attention(q, k, v, plan)
    out.float().sum().backward()
torch.cuda.synchronize()
after = entries()
new = {key: kernel for key, kernel in after.items() if key not in before}
print(json.dumps({"seeded": seeded, "new_kernels": sorted(k for k, is_kernel in new.items() if is_kernel),
                  "new_stubs": sorted(k for k, is_kernel in new.items() if not is_kernel)}))
"""


def test_installed_bundle_launches_its_kernels_without_compiling(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    home = os.environ.get("DLLM_GPU_TEST_HOME")
    if home is None:  # build this host's bundle (self-test, compiled kernels) and install it
        home = str(tmp_path / "home")
        built = subprocess.run(
            [sys.executable, "-m", "turbo_dllm", "bundle", "install", "--auto",
             "--build", "missing", "--offline", "--json"],
            env={**env, "DLLM_HOME": home}, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert built.returncode == 0, built.stderr[-3000:]
    cache = tmp_path / "empty-triton-cache"
    cache.mkdir()
    probe = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**env, "DLLM_HOME": home, "TRITON_CACHE_DIR": str(cache)},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-3000:]
    report = json.loads(probe.stdout.strip().splitlines()[-1])
    assert report["seeded"] > 0, "the bundle carries no compiled kernels"
    assert not report["new_kernels"], f"kernels compiled despite the bundle: {report}"
    # The stubs: cuda_utils and one launcher per kernel (forward, prepare, dK/dV, dQ).
    assert len(report["new_stubs"]) <= 5, report
