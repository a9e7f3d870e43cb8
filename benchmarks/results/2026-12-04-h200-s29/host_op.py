"""Session 29: the host's time per call of the op at the 8K step's shape (2L 16K, one row, H 16 /
Hkv 8, D 128, block 32): forward alone, backward alone, fwd+bwd, each call timed on the host
while the GPU queue has room (so the host never waits), then cProfile of 10 fwd+bwd calls."""

import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
from attention import turbo_attend  # noqa: E402

from turbo_dllm.train.attention import BlockDiffusionLayout  # noqa: E402

layout = BlockDiffusionLayout(8192, 32)
dev = torch.device("cuda")
q, k, v = (torch.randn(1, h, 16384, 128, device=dev).bfloat16().requires_grad_(True) for h in (16, 8, 8))
grad = torch.randn_like(q)
attend = turbo_attend(layout, dev)
leaves = (q, k, v)
out = attend(*leaves)


def fwd():
    with torch.no_grad():
        attend(*leaves)


def bwd():
    torch.autograd.grad(out, leaves, grad, retain_graph=True)


def both():
    torch.autograd.grad(attend(*leaves), leaves, grad)


for name, fn in (("fwd", fwd), ("bwd", bwd), ("fwd+bwd", both)):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(8):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    print(f"host ms a call, {name}: median {statistics.median(times):.3f}  all {[round(t, 3) for t in times]}")
torch.cuda.synchronize()
prof = cProfile.Profile()
prof.enable()
for _ in range(6):
    both()
prof.disable()
torch.cuda.synchronize()
s = io.StringIO()
pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
print(s.getvalue()[:9000])
s = io.StringIO()
pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(40)
print(s.getvalue()[:9000])
