"""Block-diffusion attention kernels on one GPU: `turbo` (our Triton op), FlexAttention with the
same mask, and causal flash SDPA over the same 2L stream as the dense-kernel ceiling.

Useful TFLOP/s count only the (query, key) pairs the mask allows (`allowed_pairs`; causal SDPA:
its causal pairs), 4 * D flops per pair and head forward, 2.5x that backward (dQ, dK, dV and the
recomputed scores: 5 matmuls against 2). Forward, backward and forward+backward, at stream
lengths 2L = 8K, 16K, 32K and block sizes 16, 32, 64, with a batch that keeps tokens per call
constant. Prints a table and writes JSON. Each figure is the median of CUDA-event-timed calls
queued back to back (`gpu_timing.median_ms`, as `triton.testing.do_bench` times): the GPU's time,
the host's dispatch overlapped as in a training step; `--synced` waits for each call instead, so
the host's work before a call's first kernel counts too (results before 2026-12-03 were timed so).

    python benchmarks/attention.py --out attention.json
    python benchmarks/attention.py --sweep --out sweep.json --write-configs sm90_configs.json

`--sweep` (benchmarks/attention_sweep.py) times every variant of each of turbo's kernels at
2L = 16K and 8K, block 32 (or --stream-lens / --block-sizes), combines the winners, writes the
defaults file the op ships (copy it to native/block_diffusion_attention/sm90_configs.json), then
runs the table above for turbo (default), turbo-best (the winners) and flex at those shapes.

Targets (issue 16): turbo fwd+bwd >= 1.3x FlexAttention and >= 450 useful TFLOP/s at 16K;
forward >= 500.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):  # turbo_dllm, and attention_sweep next to this file
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from gpu_timing import median_ms  # noqa: E402

from turbo_dllm.kernels.block_diffusion import (  # noqa: E402
    block_diffusion_attention,
    plan_block_diffusion_attention,
)
from turbo_dllm.kernels.selftest import block_diffusion_tokens  # noqa: E402
from turbo_dllm.train.attention import BlockDiffusionLayout, allowed_pairs  # noqa: E402
from turbo_dllm.train.attention.backends import FlexAttention  # noqa: E402

BWD_FLOP_RATIO = 2.5


def measure(attend, q, k, v, repeats: int, pipelined: bool = True) -> dict[str, float]:
    """fwd, bwd and fwd+bwd milliseconds of `attend(q, k, v) -> out` (gpu_timing.median_ms)."""
    grad = torch.randn_like(q)
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    with torch.no_grad():
        fwd = median_ms(lambda: attend(*leaves), repeats, pipelined=pipelined)
    out = attend(*leaves)
    bwd = median_ms(
        lambda: torch.autograd.grad(out, leaves, grad, retain_graph=True), repeats,
        pipelined=pipelined,
    )  # fmt: skip

    def both():
        torch.autograd.grad(attend(*leaves), leaves, grad)

    return {
        "fwd_ms": fwd,
        "bwd_ms": bwd,
        "fwdbwd_ms": median_ms(both, repeats, pipelined=pipelined),
    }


def measure_rounds(candidates, q, k, v, args) -> dict[str, dict]:
    """`measure` of every candidate, in turn, `args.rounds` times: each figure is the median
    over the rounds (each round's in `rounds`). Taking the candidates in turn spreads over all
    of them what drifts during a run (the GPU's clock, its temperature), which measuring one
    after the other puts on whichever comes last."""
    times: dict[str, list[dict]] = {name: [] for name, _ in candidates}
    for _ in range(args.rounds):
        for name, attend in candidates:
            if times[name] and "error" in times[name][-1]:
                continue
            try:
                times[name].append(measure(attend, q, k, v, args.repeats, not args.synced))
            except Exception as error:
                times[name].append({"error": f"{type(error).__name__}: {str(error)[:300]}"})
    result = {}
    for name, runs in times.items():
        if "error" in runs[-1]:
            result[name] = runs[-1]
            continue
        result[name] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        if len(runs) > 1:
            result[name]["rounds"] = runs
    return result


def turbo_attend(layout: BlockDiffusionLayout, device, config=None, backend="jit"):
    # One doc row: the schedule serves every batch row (what the trainer does for one document).
    tokens = block_diffusion_tokens(layout.seq_len, layout.block_size, 1, None)
    meta = [t.to(device) for t in tokens]
    plan = plan_block_diffusion_attention(*meta, *meta, backend=backend, config=config)
    return lambda q, k, v: block_diffusion_attention(q, k, v, plan)[0]


def config_changes(fields: str, flag: str) -> dict[str, int]:
    """'FIELD=INT,FIELD=INT' -> {field: value} for the op's KernelConfig (the fields' names are
    checked where they are applied); a malformed item stops `flag` with the item."""
    changes = {}
    for item in fields.split(","):
        field, sep, value = item.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise SystemExit(f"{flag} wants FIELD=INT[,...], got {item!r}")
        changes[field.strip()] = int(value)
    return changes


def config_variant(spec: str, head_dim: int, backend: str = "jit"):
    """'NAME:field=value,field=value' -> (NAME, the default KernelConfig with those fields)."""
    from dataclasses import replace

    from turbo_dllm.kernels.triton_ops import triton_module

    name, _, fields = spec.partition(":")
    if not name or not fields:
        raise SystemExit(f"--variant wants NAME:FIELD=VALUE[,...], got {spec!r}")
    module = triton_module("block_diffusion_attention", backend)
    changes = config_changes(fields, "--variant")
    try:
        return name, replace(module.default_config(head_dim), **changes)
    except TypeError as error:
        raise SystemExit(f"--variant {spec!r}: {error}") from None


def flex_attend(layout: BlockDiffusionLayout, device):
    backend = FlexAttention(compile=True)
    mask = backend.prepare(layout, None, device)
    return lambda q, k, v: backend(q, k, v, mask)


def sdpa_causal(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def rates(row: dict, pairs: int, heads: int, dim: int) -> dict:
    fwd_flops = 4.0 * pairs * heads * dim
    for part, flops in (
        ("fwd", fwd_flops),
        ("bwd", BWD_FLOP_RATIO * fwd_flops),
        ("fwdbwd", (1 + BWD_FLOP_RATIO) * fwd_flops),
    ):
        row[f"{part}_tflops"] = flops / (row[f"{part}_ms"] * 1e-3) / 1e12
    return row


def main(argv: list[str] | None = None) -> int:
    # Every (shape, block, grad mode) is its own compiled flex graph: past dynamo's default of 8
    # recompiles flex silently falls back to its unfused, scores-materialising eager path (that
    # ran out of memory on the H200 at the third block size).
    torch._dynamo.config.recompile_limit = 256
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stream-lens", default=None, help="2L values (default 8K,16K,32K)")
    parser.add_argument("--block-sizes", default=None, help="default 16,32,64")
    parser.add_argument("--tokens", type=int, default=65536, help="batch * 2L per call")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--rounds", type=int, default=1,
        help="measure the kernels of a shape in turn this many times; medians over the rounds",
    )  # fmt: skip
    parser.add_argument("--kernels", default="turbo,flex,sdpa")
    parser.add_argument(
        "--synced", action="store_true",
        help="wait for each timed call before queueing the next (the host's dispatch and launch "
        "then count; default: calls queued back to back, the GPU's time)",
    )  # fmt: skip
    parser.add_argument("--backend", default="jit", help="turbo's kernel backend: jit or native")
    parser.add_argument("--sweep", action="store_true", help="time turbo's kernel variants first")
    parser.add_argument("--sweep-jobs", type=int, default=8, help="processes compiling variants")
    parser.add_argument("--sweep-compile-timeout", type=float, default=150.0)
    parser.add_argument("--sweep-warm", default=None, help=argparse.SUPPRESS)  # worker i/N
    parser.add_argument("--write-configs", type=Path, help="--sweep: the defaults file to write")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:FIELD=V[,FIELD=V]",
        help="also time turbo with these KernelConfig fields changed on the defaults, as NAME "
        "(e.g. 'turbo-dq-fused:dkdv_dq=1'); repeatable",
    )
    parser.add_argument(
        "--layout",
        choices=("bhsd", "bshd"),
        default="bhsd",
        help="q, k, v contiguous per head (bhsd), or (B, S, H, D) views as the trainer hands them",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.sweep:  # its own default shapes
        args.stream_lens = args.stream_lens or "16384,8192"
        args.block_sizes = args.block_sizes or "32"
        args.sweep_lens = [int(x) for x in args.stream_lens.split(",")]
        args.sweep_blocks = [int(x) for x in args.block_sizes.split(",")]
    args.stream_lens = args.stream_lens or "8192,16384,32768"
    args.block_sizes = args.block_sizes or "16,32,64"
    if not torch.cuda.is_available():
        print("benchmarks/attention.py needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.sweep_warm:
        import attention_sweep

        share, shares = (int(x) for x in args.sweep_warm.split("/"))
        return attention_sweep.warm(args, share, shares)
    device = torch.device("cuda")
    kernels = args.kernels.split(",")
    extra_configs, swept = [], None
    if args.sweep:
        import attention_sweep

        swept = attention_sweep.sweep(args)
        extra_configs.append(("turbo-best", swept["best"]))
        if args.write_configs:
            from turbo_dllm.kernels.triton_ops import triton_module

            module = triton_module("block_diffusion_attention", args.backend)
            source = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
                      f"sweep at 2L {args.stream_lens} block {args.block_sizes}: "
                      + "; ".join(swept["lines"]))  # fmt: skip
            table = attention_sweep.defaults_file(module, swept["best"], args.head_dim, source)
            args.write_configs.parent.mkdir(parents=True, exist_ok=True)
            args.write_configs.write_text(json.dumps(table, indent=2) + "\n")
            print(f"wrote {args.write_configs} (copy it to native/block_diffusion_attention/)")
    for spec in args.variant:
        extra_configs.append(config_variant(spec, args.head_dim, args.backend))
    heads, kv_heads, dim = args.heads, args.kv_heads, args.head_dim
    rows: list[dict] = []
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, H={heads} Hkv={kv_heads} D={dim}"
    )
    header = f"{'kernel':<18}{'2L':>7}{'blk':>5}{'B':>4}{'fwd ms':>9}{'bwd ms':>9}{'f+b ms':>9}"
    header += f"{'fwd TF':>9}{'bwd TF':>9}{'f+b TF':>9}"
    print(header)
    for stream_len in (int(x) for x in args.stream_lens.split(",")):
        batch = max(1, args.tokens // stream_len)
        gen = torch.Generator(device=device).manual_seed(0)

        if args.layout == "bhsd":
            q, k, v = (
                torch.randn(batch, h, stream_len, dim, device=device, generator=gen).bfloat16()
                for h in (heads, kv_heads, kv_heads)
            )
        else:  # the trainer's: projections' outputs (B, S, H, D) viewed per head
            q, k, v = (
                torch.randn(batch, stream_len, h, dim, device=device, generator=gen)
                .bfloat16()
                .transpose(1, 2)
                for h in (heads, kv_heads, kv_heads)
            )
        for block_size in (int(x) for x in args.block_sizes.split(",")):
            layout = BlockDiffusionLayout(stream_len // 2, block_size)
            pairs = allowed_pairs(layout) * batch
            candidates: list[tuple[str, object]] = []
            if "turbo" in kernels:
                candidates.append(("turbo", turbo_attend(layout, device, backend=args.backend)))
                for name, config in extra_configs:
                    candidates.append((name, turbo_attend(layout, device, config, args.backend)))
            if "flex" in kernels:
                candidates.append(("flex", flex_attend(layout, device)))
            if "turbo" in kernels and "flex" in kernels:
                with torch.no_grad():
                    diff = candidates[0][1](q, k, v).float() - candidates[-1][1](q, k, v).float()
                print(
                    f"  turbo vs flex max |diff| {diff.abs().max().item():.3g} (2L={stream_len}, B={block_size})"
                )
            measured = measure_rounds(candidates, q, k, v, args)
            for name, _ in candidates:
                row = {"kernel": name, "stream_len": stream_len, "block_size": block_size,
                       "batch": batch, "heads": heads, "kv_heads": kv_heads, "head_dim": dim,
                       "useful_pairs": pairs, "layout": args.layout}  # fmt: skip
                row.update(measured[name])
                if "error" in row:  # one failing kernel must not hide the others
                    print(
                        f"{name:<18}{stream_len:>7}{block_size:>5}{batch:>4}  failed: {row['error']}"
                    )
                    rows.append(row)
                    continue
                rows.append(rates(row, pairs, heads, dim))
                print(
                    f"{name:<18}{stream_len:>7}{block_size:>5}{batch:>4}{row['fwd_ms']:>9.2f}"
                    f"{row['bwd_ms']:>9.2f}{row['fwdbwd_ms']:>9.2f}{row['fwd_tflops']:>9.0f}"
                    f"{row['bwd_tflops']:>9.0f}{row['fwdbwd_tflops']:>9.0f}"
                )
        if "sdpa" in kernels:
            causal_pairs = batch * stream_len * (stream_len + 1) // 2
            row = {"kernel": "sdpa-causal", "stream_len": stream_len, "block_size": None,
                   "batch": batch, "heads": heads, "kv_heads": kv_heads, "head_dim": dim,
                   "useful_pairs": causal_pairs}  # fmt: skip
            try:
                group = heads // kv_heads  # flash SDPA gets K/V expanded to every query head
                k_all, v_all = (t.repeat_interleave(group, dim=1) for t in (k, v))
                row.update(measure(sdpa_causal, q, k_all, v_all, args.repeats, not args.synced))
                del k_all, v_all
                rows.append(rates(row, causal_pairs, heads, dim))
                print(
                    f"{'sdpa-causal':<18}{stream_len:>7}{'-':>5}{batch:>4}{row['fwd_ms']:>9.2f}"
                    f"{row['bwd_ms']:>9.2f}{row['fwdbwd_ms']:>9.2f}{row['fwd_tflops']:>9.0f}"
                    f"{row['bwd_tflops']:>9.0f}{row['fwdbwd_tflops']:>9.0f}"
                )
            except Exception as error:
                row["error"] = f"{type(error).__name__}: {str(error)[:300]}"
                rows.append(row)
                print(f"sdpa-causal failed: {row['error']}")
        del q, k, v
        torch.cuda.empty_cache()
    summary = _summary(rows)
    for line in summary["lines"]:
        print(line)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = {"rows": rows, "summary": summary,
                  "timing": "synced" if args.synced else "pipelined"}  # fmt: skip
        if swept is not None:
            report["sweep"] = {"rows": swept["rows"], "winners": swept["winners"],
                               "best": dataclasses.asdict(swept["best"])}  # fmt: skip
        args.out.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.out}")
    return 0


def _summary(rows: list[dict]) -> dict:
    """turbo / flex speed-ups per shape, and the issue's targets at 2L = 16K."""
    by_key = {(r["kernel"], r["stream_len"], r["block_size"]): r for r in rows if "error" not in r}
    lines, speedups = [], []
    for (kernel, stream_len, block_size), turbo in sorted(by_key.items(), key=str):
        flex = by_key.get(("flex", stream_len, block_size))
        if kernel != "turbo" or flex is None:
            continue
        ratio = flex["fwdbwd_ms"] / turbo["fwdbwd_ms"]
        speedups.append({"stream_len": stream_len, "block_size": block_size,
                         "fwdbwd_speedup": ratio, "fwd_speedup": flex["fwd_ms"] / turbo["fwd_ms"]})  # fmt: skip
        ok = ratio >= 1.3 and (
            stream_len != 16384 or (turbo["fwdbwd_tflops"] >= 450 and turbo["fwd_tflops"] >= 500)
        )
        lines.append(
            f"2L={stream_len} B={block_size}: turbo fwd+bwd {ratio:.2f}x flex, "
            f"{turbo['fwdbwd_tflops']:.0f} TF/s (fwd {turbo['fwd_tflops']:.0f}) "
            f"{'meets' if ok else 'misses'} the targets"
        )
    return {"speedups": speedups, "lines": lines}


if __name__ == "__main__":
    raise SystemExit(main())
