"""The op's Gluon dK/dV kernel against its `tl` kernels on one GPU: the same inputs, dK, dV and dQ
compared, each path timed.

    python benchmarks/attention_gluon_dkdv.py [--seq-len 8192] [--block-size 32] [--head-dim 128]
    python benchmarks/attention_gluon_dkdv.py --compile-only [--triton-path DIR]   # any host

Three backward paths of `block_diffusion_attention` (`native/block_diffusion_attention/`), at the
shape of docs/benchmarks.md's kernel runs (H 16 / Hkv 8, one document per row):

- `tl`: the shipped default, the `tl` dK/dV kernel then the `tl` dQ kernel (seven matmuls per
  tile pair: the dQ kernel computes S and dP again);
- `gluon`: `KernelConfig.dkdv_gluon` (a TMA producer warp, two consumer warpgroups with P^T and
  dS^T handed to their wgmmas in registers), then the `tl` dQ kernel;
- `gluon both`: the Gluon dK/dV kernel, then the Gluon dQ kernel (`KernelConfig.dq_gluon`);
- `gluon + dq`: the same kernel with `dkdv_dq` (dQ = dS K added into an fp32 buffer with atomics,
  five matmuls per tile pair; the buffer's zeroing and the final scale are timed with it).

History: written in session 13 as a standalone prototype of that structure; on the H200 in
session 14, with P^T and dS^T passed through shared memory, it ran at 0.95-0.97x the `tl`
kernel, and in session 16, with them in registers and dP^T issued behind S^T, at 1.12-1.13x, bit
for bit (`results/2026-12-02-h200-s14/`, `.../h200-s16/gluon_rs/`). The kernel now lives in the
op; this script checks and times the op's own paths. `--compile-only` compiles them for sm90
(`ci/triton_sm90_compile.py --only gluon`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile-only", action="store_true", help="compile for sm90, no GPU")
    parser.add_argument("--triton-path", type=Path, help="an unpacked Triton wheel to use")
    parser.add_argument("--seq-len", type=int, default=8192, help="L (the stream is 2L)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128, choices=(64, 128))
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--stages", type=int, default=3, help="the Gluon kernel's ring depth")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--split", action="store_true",
        help="also time the Gluon dK/dV with each warpgroup its own partition (dkdv_split)",
    )  # fmt: skip
    return parser.parse_args(argv)


def main(args) -> int:
    if args.compile_only:
        sys.path.insert(0, str(ROOT / "ci"))
        from triton_sm90_compile import main as compile_main

        extra = ["--triton-path", str(args.triton_path)] if args.triton_path else []
        return compile_main(["--head-dim", str(args.head_dim), "--only", "gluon", *extra])
    import torch

    sys.path.insert(0, str(ROOT))
    from turbo_dllm.kernels.selftest import block_diffusion_tokens
    from turbo_dllm.kernels.triton_ops import triton_module

    dim = args.head_dim
    module = triton_module("block_diffusion_attention", "jit")
    tl_config = module.tl_default(dim)
    gluon = module.flag_configs(dim)["gluon dkdv"].with_part("dkdv", stages=args.stages)
    fused = gluon.with_part("dkdv", dq=1)
    meta = [
        t.cuda() for t in block_diffusion_tokens(args.seq_len, args.block_size, args.batch, None)
    ]
    schedule = module.make_schedule(*meta, *meta)
    gen = torch.Generator().manual_seed(0)
    s = 2 * args.seq_len

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device="cuda", dtype=torch.bfloat16)

    q = randn(args.batch, args.heads, s, dim)
    k, v = randn(args.batch, args.kv_heads, s, dim), randn(args.batch, args.kv_heads, s, dim)
    scale = dim**-0.5
    out, lse = module.forward(q, k, v, schedule, scale, tl_config)
    grad_out, delta, lse2 = module.backward_prepare(randn(*q.shape), None, q, out, lse)
    inputs = (grad_out, delta, lse2, q, k, v, schedule, scale)

    def tl_path():
        dk, dv = module.backward_dkdv(*inputs, tl_config)
        return dk, dv, module.backward_dq(*inputs, tl_config)

    def gluon_path():
        dk, dv = module.backward_dkdv(*inputs, gluon)
        return dk, dv, module.backward_dq(*inputs, tl_config)

    backward = module.flag_configs(dim)["gluon backward"].with_part("dkdv", stages=args.stages)

    def gluon_both_path():
        dk, dv = module.backward_dkdv(*inputs, backward)
        return dk, dv, module.backward_dq(*inputs, backward)

    def fused_path():
        dq_acc = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
        dk, dv = module.backward_dkdv(*inputs, fused, dq_acc)
        return dk, dv, dq_acc.mul_(scale)

    def timed(fn) -> float:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(args.repeats):
            start.record()
            fn()
            stop.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(stop))
        return statistics.median(times)

    reference = tl_path()
    worst = 0.0
    paths = (("gluon", gluon_path), ("gluon both", gluon_both_path), ("gluon + dq", fused_path))
    for label, path in paths:
        for name, want, got in zip(("dk", "dv", "dq"), reference, path(), strict=True):
            error = float((got.float() - want.float()).abs().max() / want.float().abs().max())
            worst = max(worst, error)
            print(f"{label:10} {name}: max |{label} - tl| / max |tl| = {error:.3g}")
    if not worst < 3e-2:  # the GPU tests' tolerance against the reference (NaN fails too)
        print("MISMATCH: a Gluon path's gradients differ from the tl kernels'")
        return 1

    def split_dkdv():
        return module.backward_dkdv(*inputs, gluon.with_part("dkdv", split=1))

    if args.split:
        for name, want, got in zip(("dk", "dv"), reference, split_dkdv(), strict=False):
            error = float((got.float() - want.float()).abs().max() / want.float().abs().max())
            print(f"gluon split {name}: max |split - tl| / max |tl| = {error:.3g}")
            if not error < 3e-2:
                print("MISMATCH: the split Gluon dK/dV differs from the tl kernel")
                return 1
    times = {
        "tl dK/dV": timed(lambda: module.backward_dkdv(*inputs, tl_config)),
        "gluon dK/dV": timed(lambda: module.backward_dkdv(*inputs, gluon)),
        **({"gluon split dK/dV": timed(split_dkdv)} if args.split else {}),
        "tl dK/dV + dQ": timed(tl_path),
        "gluon dK/dV + tl dQ": timed(gluon_path),
        "gluon dK/dV + gluon dQ": timed(gluon_both_path),
        "gluon dK/dV/dQ fused": timed(fused_path),
    }
    print(f"2L={s} B={args.batch} H={args.heads}/{args.kv_heads} D={dim} block "
          f"{args.block_size}, Gluon ring {args.stages} stages:")  # fmt: skip
    for name, ms in times.items():
        base = times["tl dK/dV" if "+" not in name and "fused" not in name else "tl dK/dV + dQ"]
        print(f"  {name:22} {ms:8.3f} ms  {base / ms:5.2f}x")
    return 0


if __name__ == "__main__":
    ARGS = _parse(sys.argv[1:])
    if ARGS.triton_path:
        sys.path.insert(0, str(ARGS.triton_path))
    raise SystemExit(main(ARGS))
