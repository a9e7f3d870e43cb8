"""Session 29: where the GPU's time goes in one fwd+bwd call of the op at the 8K step's shape
(2L 16K, one row, H 16 / Hkv 8, D 128, block 32), per config: kernels' total and mean time, the
GPU's busy time and the span of the calls (idle = span - busy), from torch.profiler."""

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
from attention import config_variant, turbo_attend  # noqa: E402

from turbo_dllm.train.attention import BlockDiffusionLayout  # noqa: E402

layout = BlockDiffusionLayout(8192, 32)
dev = torch.device("cuda")
gen = torch.Generator(device=dev).manual_seed(0)
q, k, v = (torch.randn(int(sys.argv[1]) if len(sys.argv) > 1 else 1, h, 16384, 128, device=dev,
                       generator=gen).bfloat16().requires_grad_(True) for h in (16, 8, 8))
grad = torch.randn_like(q)
variants = [("turbo", None)] + [config_variant(s, 128) for s in sys.argv[2:]]
for name, config in variants:
    attend = turbo_attend(layout, dev, config)

    def both():
        torch.autograd.grad(attend(q, k, v), (q, k, v), grad)

    for _ in range(5):
        both()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            both()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    spans = sorted((e.time_range.start, e.time_range.end) for e in kernels)
    busy, end = 0.0, None
    start0 = spans[0][0]
    for s, e in spans:
        if end is None or s > end:
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    span = end - start0
    print(f"=== {name}: 20 calls, span {span / 20e3:.3f} ms a call, GPU busy {busy / 20e3:.3f}, "
          f"idle {(span - busy) / 20e3:.3f}")
    totals: dict[str, list[float]] = {}
    for e in kernels:
        totals.setdefault(e.name[:60], []).append(e.time_range.end - e.time_range.start)
    for kname, ts in sorted(totals.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {kname:<60} {len(ts):>4} x {sum(ts) / len(ts) / 1e3:8.3f} ms = {sum(ts) / 20e3:7.3f} ms a call")
    # the order and gaps of one call's kernels (the 10th)
    per = len(spans) // 20
    one = spans[9 * per: 10 * per + 1]
    names = [e.name[:28] for e in sorted(kernels, key=lambda e: e.time_range.start)][9 * per: 10 * per + 1]
    line = []
    for (s, e), n in zip(one, names):
        line.append(f"{n}@{(s - one[0][0]) / 1e3:.3f}+{(e - s) / 1e3:.3f}")
    print("  one call:", "  ".join(line))
