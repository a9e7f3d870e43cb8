"""turbo's tile-config sweep (`benchmarks/attention.py --sweep`): every variant of every kernel,
timed kernel by kernel, the winners combined into the defaults file the op ships.

The forward, dK/dV and dQ kernels are independent, so each variant changes one kernel's fields
(`sweep_variants` in the op's source: tiles, warps, stages, tl.range pipelining, warp
specialisation, full tiles as runs, launch order, TMA descriptors) and only that kernel is timed
(CUDA events, median). Each variant's output is checked against the default config's (which
the GPU tests check against the reference) on the same inputs: a variant that compiles but
computes something else is marked wrong and never wins. Compiling ~36 kernels dominates, so
`--sweep-jobs` worker processes first compile disjoint shares of them into Triton's on-disk
cache (each launch at the real shapes, so the main process hits that cache).

Winner per kernel: the lowest mean over the timed shapes of (variant ms / default ms). The
defaults file (`sm90_configs.json`, the format of native/block_diffusion_attention/) gets the
winners for this head dim; the lead copies it into the op's folder to make them the defaults.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch
from gpu_timing import median_ms

from turbo_dllm.kernels.selftest import block_diffusion_tokens
from turbo_dllm.kernels.triton_ops import triton_module
from turbo_dllm.train.attention import BlockDiffusionLayout, allowed_pairs

OP = "block_diffusion_attention"
FLOP_FACTOR = {"fwd": 4.0, "dkdv": 6.0, "dq": 4.0}  # x pairs x heads x D: matmuls per kernel
WRONG = 3e-2  # max |variant - default| / max |default| (bf16)


def _inputs(module, stream_len: int, block_size: int, tokens: int, heads, kv_heads, dim, device):
    batch = max(1, tokens // stream_len)
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (
        torch.randn(batch, h, stream_len, dim, device=device, generator=gen).bfloat16()
        for h in (heads, kv_heads, kv_heads)
    )
    grad = torch.randn(batch, heads, stream_len, dim, device=device, generator=gen).bfloat16()
    meta = [t.to(device) for t in block_diffusion_tokens(stream_len // 2, block_size, 1, None)]
    schedule = module.make_schedule(*meta, *meta)
    pairs = allowed_pairs(BlockDiffusionLayout(stream_len // 2, block_size)) * batch
    return {"q": q, "k": k, "v": v, "grad": grad, "schedule": schedule, "pairs": pairs,
            "batch": batch}  # fmt: skip


def _runner(module, kernel: str, x: dict, config, base):
    """A no-argument call of `kernel` under `config`, and what it returns (for the check)."""
    q, k, v, schedule = x["q"], x["k"], x["v"], x["schedule"]
    scale = 1.0 / math.sqrt(q.shape[-1])
    schedule.prepare(config)
    if kernel == "fwd":
        return lambda: module.forward(q, k, v, schedule, scale, config)
    if "prep" not in x:  # the backward's inputs, once, from the default forward
        schedule.prepare(base)
        out, lse = module.forward(q, k, v, schedule, scale, base)
        x["prep"] = module.backward_prepare(x["grad"], None, q, out, lse)
    grad_out, delta, lse2 = x["prep"]
    call = module.backward_dkdv if kernel == "dkdv" else module.backward_dq
    return lambda: call(grad_out, delta, lse2, q, k, v, schedule, scale, config)


def _error(got, want) -> float:
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        g, w = g.float(), w.float()
        finite = torch.isfinite(w)
        scale = w[finite].abs().max().clamp(min=1e-6)
        worst = max(worst, float((g - w)[finite].abs().max() / scale))
    return worst


def _jobs(module, dim: int) -> list[tuple[str, str, object]]:
    return [
        (kernel, name, config)
        for kernel, entries in module.sweep_variants(dim).items()
        for name, config in entries
    ]


def warm(args, share: int, shares: int) -> int:
    """Worker: compile (by launching once) every `shares`-th variant from `share` on."""
    module = triton_module(OP, args.backend)
    device = torch.device("cuda")
    stream_len, block = args.sweep_lens[0], args.sweep_blocks[0]
    x = _inputs(module, stream_len, block, args.tokens, args.heads, args.kv_heads,
                args.head_dim, device)  # fmt: skip
    base = module.default_config(args.head_dim)
    for i, (kernel, name, config) in enumerate(_jobs(module, args.head_dim)):
        if i % shares != share:
            continue
        try:
            _runner(module, kernel, x, config, base)()
        except Exception as error:  # the timing pass reports it
            print(f"warm {kernel} {name}: {type(error).__name__}", file=sys.stderr)
    torch.cuda.synchronize()
    return 0


def _compile_in_parallel(args) -> None:
    if args.sweep_jobs <= 1:
        return
    script = Path(__file__).with_name("attention.py")
    common = [sys.executable, str(script), "--sweep", "--backend", args.backend,
              "--stream-lens", ",".join(map(str, args.sweep_lens)),
              "--block-sizes", ",".join(map(str, args.sweep_blocks)),
              "--tokens", str(args.tokens), "--heads", str(args.heads),
              "--kv-heads", str(args.kv_heads), "--head-dim", str(args.head_dim)]  # fmt: skip
    tick = time.perf_counter()
    workers = [
        subprocess.Popen(common + ["--sweep-warm", f"{i}/{args.sweep_jobs}"])
        for i in range(args.sweep_jobs)
    ]
    for worker in workers:
        try:
            worker.wait(timeout=args.sweep_compile_timeout)
        except subprocess.TimeoutExpired:
            worker.kill()
    print(f"compiled the variants in {args.sweep_jobs} processes: "
          f"{time.perf_counter() - tick:.0f} s", flush=True)  # fmt: skip


def _time_jobs(module, args, jobs, base, device) -> list[dict]:
    """Rows of every (kernel, variant, config) job at every sweep shape."""
    dim = args.head_dim
    rows: list[dict] = []
    for stream_len in args.sweep_lens:
        for block in args.sweep_blocks:
            x = _inputs(module, stream_len, block, args.tokens, args.heads, args.kv_heads, dim,
                        device)  # fmt: skip
            reference: dict[str, object] = {}
            default_ms: dict[str, float] = {}
            for kernel, name, config in jobs:
                row = {"kernel": kernel, "variant": name, "stream_len": stream_len,
                       "block_size": block, "config": config.part(kernel)}  # fmt: skip
                try:
                    run = _runner(module, kernel, x, config, base)
                    got = run()
                    if kernel not in reference:  # the default's output, for the check
                        default = _runner(module, kernel, x, base, base)
                        reference[kernel] = default()
                        default_ms[kernel] = median_ms(default, args.repeats, warmup=2)
                    row["error"] = _error(got, reference[kernel])
                    row["ms"] = median_ms(run, args.repeats, warmup=2)
                except Exception as error:  # one failing variant must not hide the others
                    row["failed"] = f"{type(error).__name__}: {str(error)[:200]}"
                    print(f"{kernel:<6}{name:<28}{stream_len:>7}{block:>5}  failed: "
                          f"{row['failed'][:80]}", flush=True)  # fmt: skip
                    rows.append(row)
                    continue
                flops = FLOP_FACTOR[kernel] * x["pairs"] * args.heads * dim
                row["tflops"] = flops / (row["ms"] * 1e-3) / 1e12
                row["vs_default"] = row["ms"] / default_ms[kernel]
                row["wrong"] = row["error"] > WRONG
                rows.append(row)
                flag = "  WRONG" if row["wrong"] else ""
                print(f"{kernel:<6}{name:<28}{stream_len:>7}{block:>5}{row['ms']:>9.3f}"
                      f"{row['tflops']:>7.0f}{row['vs_default']:>9.3f}{flag}", flush=True)  # fmt: skip
            del x
            torch.cuda.empty_cache()
    return rows


def _combinations(module, rows, base) -> list[tuple[str, str, object]]:
    """Per kernel, the best tile variant with the best loop/load variant (each must beat the
    default on its own), as one more job: the single-change sweep cannot see that pair."""
    loop_names = {name for name, _ in module.LOOP_VARIANTS}
    jobs = []
    for kernel in module.KERNELS:
        mine = [r for r in rows if r["kernel"] == kernel]
        tiles = pick_winners([r for r in mine if r["variant"] not in loop_names], base)
        loops = pick_winners([r for r in mine if r["variant"] in loop_names], base)
        if kernel not in tiles or kernel not in loops:
            continue
        tile, loop = tiles[kernel], loops[kernel]
        if tile["mean_vs_default"] >= 1.0 or loop["mean_vs_default"] >= 1.0:
            continue
        values = dict(module.LOOP_VARIANTS)[loop["variant"]]
        config = base.with_part(kernel, **tile["config"]).with_part(kernel, **values)
        jobs.append((kernel, f"{tile['variant']} + {loop['variant']}", config))
    return jobs


def sweep(args) -> dict:
    """Time every variant at every (2L, block) of the sweep; the winners; the defaults file."""
    module = triton_module(OP, args.backend)
    device = torch.device("cuda")
    base = module.default_config(args.head_dim)
    _compile_in_parallel(args)
    print(f"{'kernel':<6}{'variant':<28}{'2L':>7}{'blk':>5}{'ms':>9}{'TF/s':>7}{'vs dflt':>9}")
    rows = _time_jobs(module, args, _jobs(module, args.head_dim), base, device)
    combined = _combinations(module, rows, base)
    if combined:
        print("combinations of each kernel's best tiles and best loop variant:", flush=True)
        rows += _time_jobs(module, args, combined, base, device)
    winners = pick_winners(rows, base)
    best = base
    for kernel, entry in winners.items():
        best = best.with_part(kernel, **entry["config"])
    lines = [f"winner {k}: {e['variant']} ({e['mean_vs_default']:.3f}x the default's time)"
             for k, e in winners.items()]  # fmt: skip
    for line in lines:
        print(line)
    return {"rows": rows, "winners": winners, "best": best, "lines": lines}


def pick_winners(rows: list[dict], base) -> dict[str, dict]:
    """Per kernel, the variant with the lowest mean time ratio to the default over every shape
    it ran at; a variant wrong or failed at any shape is out."""
    by: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        by.setdefault((row["kernel"], row["variant"]), []).append(row)
    shapes = {(r["stream_len"], r["block_size"]) for r in rows}
    winners: dict[str, dict] = {}
    for (kernel, variant), entries in by.items():
        if len(entries) != len(shapes) or any("ms" not in r or r["wrong"] for r in entries):
            continue
        mean = sum(r["vs_default"] for r in entries) / len(entries)
        if kernel not in winners or mean < winners[kernel]["mean_vs_default"]:
            winners[kernel] = {"variant": variant, "mean_vs_default": mean,
                               "config": entries[0]["config"]}  # fmt: skip
    return winners


def defaults_file(module, best, head_dim: int, source: str) -> dict:
    """The op's defaults file with `best` for `head_dim` (other head dims kept), naming only the
    fields that differ from KernelConfig's own defaults."""
    current = json.loads(module._DEFAULTS_FILE.read_text())
    plain = module.KernelConfig()
    changed = {
        name: value
        for name, value in zip(
            (f.name for f in dataclasses.fields(best)), best.to_ints(), strict=True
        )
        if getattr(plain, name) != value
    }
    current["configs"][str(head_dim)] = changed
    current["source"] = source
    return current
