"""Session 33: why the op's fwd+bwd time varies 4-10 % from round to round where flex's varies
1-3 %. Per kernel of the op, the spread of its durations over many calls queued back to back
(2L 16K, H 16 / Hkv 8, D 128, block 32; rows from argv[1]), in rounds; per round the kernels'
medians, so a slow round shows which kernel it was. Timestamps let smi.csv's clocks be lined up.

    python3 kernel_spread.py ROWS [ROUNDS] [CALLS]
"""

import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
from attention import turbo_attend  # noqa: E402

from turbo_dllm.train.attention import BlockDiffusionLayout  # noqa: E402

rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
calls = int(sys.argv[3]) if len(sys.argv) > 3 else 30
layout = BlockDiffusionLayout(8192, 32)
dev = torch.device("cuda")
gen = torch.Generator(device=dev).manual_seed(0)
q, k, v = (torch.randn(rows, 16384, h, 128, device=dev, generator=gen).bfloat16().transpose(1, 2)
           .requires_grad_(True) for h in (16, 8, 8))  # fmt: skip
grad = torch.randn_like(q)
attend = turbo_attend(layout, dev, None)


def both():
    torch.autograd.grad(attend(q, k, v), (q, k, v), grad)


for _ in range(5):
    both()
torch.cuda.synchronize()
every: dict[str, list[float]] = {}
for r in range(rounds):
    stamp = time.strftime("%H:%M:%S", time.gmtime())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            both()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    spans = sorted((e.time_range.start, e.time_range.end) for e in kernels)
    span = (spans[-1][1] - spans[0][0]) / calls / 1e3
    per: dict[str, list[float]] = {}
    for e in kernels:
        name = e.name.split("(")[0][:28]
        if "elementwise" in name:
            continue
        per.setdefault(name, []).append((e.time_range.end - e.time_range.start) / 1e3)
    line = "  ".join(f"{n} {statistics.median(ts):.3f}" for n, ts in sorted(per.items()))
    print(f"round {r} {stamp} span {span:.3f} ms a call | {line}", flush=True)
    for n, ts in per.items():
        every.setdefault(n, []).extend(ts)
print("over every call (ms): name: p10 / p50 / p90 / max")
for n, ts in sorted(every.items()):
    ts = sorted(ts)
    pick = lambda f: ts[min(len(ts) - 1, int(f * len(ts)))]  # noqa: E731
    print(f"  {n:<28} {pick(0.1):.3f} / {pick(0.5):.3f} / {pick(0.9):.3f} / {ts[-1]:.3f}")
