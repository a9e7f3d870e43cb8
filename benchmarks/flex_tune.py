"""Tune FlexAttention's Triton tiles for the block-diffusion mask, forward and backward.

The trainer's attention is one FlexAttention call over the 2L stream with the BD3-LM BlockMask
(turbo_dllm.train.attention). Its kernel tiles come from inductor's per-GPU defaults; this script
times fwd and fwd+bwd for the trainer's exact shapes under candidate `kernel_options` and under
inductor's flex autotuning (`max_autotune`, which also prints the winning configs). Results and
what they meant for the trainer: docs/benchmarks.md, "Training step".

    python benchmarks/flex_tune.py                        # Qwen3-1.7B heads, L=8192, B=32
    python benchmarks/flex_tune.py --autotune --out flex_tune.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpu_timing import median_ms  # noqa: E402

from turbo_dllm.train.attention import BlockDiffusionLayout, allowed_pairs  # noqa: E402
from turbo_dllm.train.attention.backends import FlexAttention  # noqa: E402

CANDIDATES: dict[str, dict] = {
    "default": {},
    "fwd_tma": {"fwd_USE_TMA": True},
    "bwd_s2": {"bwd_num_stages": 2},
    "bwd_s4": {"bwd_num_stages": 4},
    "bwd_64x64_w4": {
        "bwd_BLOCK_M1": 64,
        "bwd_BLOCK_N1": 64,
        "bwd_BLOCK_M2": 64,
        "bwd_BLOCK_N2": 64,
        "bwd_num_warps": 4,
        "bwd_num_stages": 3,
    },  # fmt: skip
    "bwd_32x128": {
        "bwd_BLOCK_M1": 32,
        "bwd_BLOCK_N1": 128,
        "bwd_BLOCK_M2": 128,
        "bwd_BLOCK_N2": 32,
        "bwd_num_warps": 4,
        "bwd_num_stages": 3,
    },  # fmt: skip
    "fwd_128x128_s2": {"fwd_BLOCK_M": 128, "fwd_BLOCK_N": 128, "fwd_num_stages": 2},
}


def measure(name: str, options: dict, args, mask, flops_fwd: float) -> dict:
    from torch.nn.attention.flex_attention import flex_attention

    torch._dynamo.reset()
    flex = torch.compile(flex_attention, dynamic=False)
    shape_q = (args.batch, args.heads, 2 * args.seq_len, args.head_dim)
    shape_kv = (args.batch, args.kv_heads, 2 * args.seq_len, args.head_dim)
    q = torch.randn(shape_q, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(shape_kv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(shape_kv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn_like(q)
    kwargs = {"block_mask": mask, "enable_gqa": True, "kernel_options": options or None}
    try:
        fwd = median_ms(lambda: flex(q, k, v, **kwargs), args.repeats)

        def fwd_bwd():
            out = flex(q, k, v, **kwargs)
            out.backward(grad)

        total = median_ms(fwd_bwd, args.repeats)
    except Exception as error:  # a config the GPU cannot run (shared memory, ...)
        print(f"{name:16} failed: {type(error).__name__}: {str(error)[:160]}", file=sys.stderr)
        return {"name": name, "options": options, "error": f"{type(error).__name__}"}
    bwd = total - fwd
    row = {
        "name": name,
        "options": options,
        "fwd_ms": fwd,
        "bwd_ms": bwd,
        "fwd_bwd_ms": total,
        "fwd_tflops": flops_fwd / fwd / 1e9,
        "bwd_tflops": 2.5 * flops_fwd / bwd / 1e9,
    }
    print(
        f"{name:16} fwd {fwd:7.3f} ms ({row['fwd_tflops']:5.0f} TF/s)  bwd {bwd:7.3f} ms "
        f"({row['bwd_tflops']:5.0f} TF/s)  total {total:7.3f} ms",
        file=sys.stderr,
    )
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seq-len", type=int, default=8192)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--candidates", default=",".join(CANDIDATES), help="names from CANDIDATES")
    p.add_argument("--autotune", action="store_true", help="also inductor's flex autotuning")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("flex_tune needs a CUDA GPU", file=sys.stderr)
        return 2
    layout = BlockDiffusionLayout(args.seq_len, args.block_size)
    mask = FlexAttention().prepare(layout, None, torch.device("cuda"))
    # 4 * D FLOPs per allowed (query, key) pair and head: QK^T and PV, 2 FLOPs per MAC.
    flops_fwd = 4.0 * args.head_dim * args.heads * allowed_pairs(layout) * args.batch
    rows = [measure(n, CANDIDATES[n], args, mask, flops_fwd) for n in args.candidates.split(",")]
    if args.autotune:
        import torch._inductor.config as inductor_config

        inductor_config.max_autotune = True
        rows.append(measure("autotune", {}, args, mask, flops_fwd))
        inductor_config.max_autotune = False
    if args.out:
        report = {
            "benchmark": "flex_tune",
            "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "shape": vars(args) | {"out": None},
            "rows": rows,
        }
        args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
