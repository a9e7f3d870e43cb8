"""Training-step throughput of the turbo-dllm trainer against HF transformers + a dense 2L mask.

Both sides train the same Qwen3-shaped random model on the same block-diffusion batches
(BD3-LM noise from our objective, sequence length L, block size B), in bf16 on a GPU:

- turbo-dllm: the real trainer step (`Trainer.train_step`): FlexAttention over the block-diffusion
  BlockMask, compiled decoder layers, chunked LM-head cross-entropy on the masked tokens only,
  fused AdamW.
- baseline (what most dLLM repos do): transformers' Qwen3ForCausalLM with attn_implementation
  "sdpa" and the dense 2L x 2L boolean mask as a 4-D attention_mask, full logits over all 2L
  positions, cross-entropy on the masked noisy tokens, fused AdamW. If it runs out of memory it
  is retried with transformers' gradient checkpointing (reported).

Tokens/s counts data tokens (L per sequence). MFU counts model FLOPs (turbo_dllm.train.metrics:
6 * matmul weights * 2L tokens + 6 * head * scored tokens + 12 * head_dim * heads * layers *
allowed mask pairs) against 989 TFLOP/s (H100/H200 dense bf16). The same FLOP count is used for
both sides, so the MFU ratio equals the speed ratio.

    python benchmarks/train_step.py                       # Qwen3-1.7B shape, L=8192, B=32 (GPU)
    python benchmarks/train_step.py --tiny                # CPU smoke check, seconds
    python benchmarks/train_step.py --out result.json --steps 10 --warmup 3
"""

from __future__ import annotations

import argparse
import ast
import datetime
import gc
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch._inductor.config
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from turbo_dllm.config.runspec import RunSpec  # noqa: E402
from turbo_dllm.config.validate import check  # noqa: E402
from turbo_dllm.train.attention import allowed_pairs, dense_mask  # noqa: E402
from turbo_dllm.train.distributed import init_distributed  # noqa: E402
from turbo_dllm.train.metrics import peak_flops  # noqa: E402
from turbo_dllm.train.trainer import Trainer  # noqa: E402


def build_spec(args, on_gpu: bool) -> RunSpec:
    vocab_model = "qwen3-1.7b" if not args.tiny else "tiny"
    document = {
        "launch": {"seed": 0, "kind": "profile"},
        "model": {
            "from_config": args.model or vocab_model,
            "dtype": "bfloat16" if on_gpu else "float32",
            "attention": "flex" if on_gpu else "reference",
        },
        "objective": {"name": "block_diffusion", "block_size": args.block_size},
        "data": {
            "synthetic": {"num_sequences": 64, "vocab_size": 512 if args.tiny else 151936},
            "seq_len": args.seq_len,
        },
        "training": {
            "micro_batch_size": args.micro_batch,
            "steps": args.warmup + args.steps,
            "activation_checkpointing": args.activation_checkpointing,
            "compile": on_gpu and not args.no_compile,
        },
        "scheduler": {"name": "constant", "warmup_steps": 0},
        "checkpoint": {"interval": None, "resume": "never"},
        "logging": {"console": False, "jsonl": False},
    }
    return check(RunSpec.model_validate(document))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gb(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None


def summarize(name, times, flops_per_step, tokens_per_step, peak, device, extra=None) -> dict:
    step_time = sorted(times)[len(times) // 2]  # median
    result = {
        "name": name,
        "step_time_s": step_time,
        "tokens_per_s": tokens_per_step / step_time,
        "tflops_per_s": flops_per_step / step_time / 1e12,
        "mfu": flops_per_step / step_time / peak if peak else None,
        "peak_memory_gb": peak_gb(device),
    }
    result.update(extra or {})
    return result


# ---------------------------------------------------------------------------------------------
def run_ours(spec: RunSpec, args, device) -> tuple[dict, Trainer]:
    env = init_distributed()
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(spec, run_dir, env).build()
        reset_memory(device)
        times, flops = [], []
        for step in range(args.warmup + args.steps):
            sync(device)
            tick = time.perf_counter()
            stats = trainer.train_step(step)
            sync(device)
            if step >= args.warmup:
                times.append(time.perf_counter() - tick)
                flops.append(stats["flops"])
            print(
                f"  ours step {step}: {time.perf_counter() - tick:.3f} s, loss {stats['loss']:.3f}",
                file=sys.stderr,
            )
        if args.profile:
            profile_steps(trainer, args.warmup + args.steps, args.profile, device)
    tokens = spec.training.micro_batch_size * spec.data.seq_len
    result = summarize(
        "turbo-dllm",
        times,
        sum(flops) / len(flops),
        tokens,
        peak_flops(device),
        device,
        {
            "compile": spec.training.compile,
            "attention": spec.model.attention,
            "micro_batch": spec.training.micro_batch_size,
        },
    )
    return result, trainer


def profile_steps(trainer: Trainer, first_step: int, path: Path, device) -> None:
    """Two more steps under torch.profiler: the kernels by GPU time, and how busy the GPU was."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    tick = time.perf_counter()
    with profile(activities=activities) as prof:
        for step in range(first_step, first_step + 2):
            trainer.train_step(step)
        sync(device)
    wall = time.perf_counter() - tick
    events = prof.key_averages()
    busy = sum(e.self_device_time_total for e in events) / 1e6
    sort_by = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = events.table(sort_by=sort_by, row_limit=40, max_name_column_width=90)
    path.write_text(f"2 steps: wall {wall:.3f} s, GPU kernel time {busy:.3f} s\n\n{table}\n")
    print(f"profile: wall {wall:.3f} s, GPU busy {busy:.3f} s -> {path}", file=sys.stderr)


def run_baseline(trainer: Trainer, spec: RunSpec, args, device) -> dict:
    import transformers

    config_dict = trainer.model_config.to_hf_dict()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    hf_config = transformers.Qwen3Config(
        **{k: v for k, v in config_dict.items() if k != "architectures"}
    )
    del trainer.model, trainer.optimizer, trainer.scheduler  # free ours before building theirs
    torch._dynamo.reset()
    reset_memory(device)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(
            hf_config, attn_implementation="sdpa", dtype=dtype
        )
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=3e-4, weight_decay=0.1, fused=device.type == "cuda" or None
    )
    objective, loader = trainer.objective, trainer.loader
    samples = args.baseline_micro_batch or spec.training.micro_batch_size

    def step(index: int) -> tuple[float, float]:
        from turbo_dllm.train.objectives import NoiseKey

        batch = {name: rows[:samples] for name, rows in next(loader).items()}
        diffusion = objective.corrupt(batch, NoiseKey(0, index, 0, samples))
        layout = diffusion.layout
        flops = trainer.model_config.step_flops(
            stream_tokens=diffusion.input_ids.numel(),
            scored_tokens=diffusion.num_scored,
            pairs=allowed_pairs(layout) * diffusion.input_ids.shape[0],
        )
        diffusion = diffusion.to(device)
        mask = dense_mask(layout, device=device).expand(diffusion.input_ids.shape[0], -1, -1, -1)
        positions = layout.positions(device).expand(diffusion.input_ids.shape[0], -1)
        logits = model(
            input_ids=diffusion.input_ids, attention_mask=mask, position_ids=positions
        ).logits
        hidden = logits.reshape(-1, logits.shape[-1]).index_select(0, diffusion.score_index).float()
        hidden[:, objective.mask_token_id] = float("-inf")
        loss = (
            F.cross_entropy(hidden, diffusion.targets, reduction="none") * diffusion.weights
        ).sum() / batch["loss_mask"].sum().to(device)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach()), flops

    checkpointing = False
    for attempt in range(2):
        try:
            reset_memory(device)
            times, flops = [], []
            for index in range(args.warmup + args.steps):
                sync(device)
                tick = time.perf_counter()
                loss, f = step(index)
                sync(device)
                if index >= args.warmup:
                    times.append(time.perf_counter() - tick)
                    flops.append(f)
                print(
                    f"  baseline step {index}: {time.perf_counter() - tick:.3f} s, loss {loss:.3f}",
                    file=sys.stderr,
                )
            break
        except torch.cuda.OutOfMemoryError:
            if attempt == 1:
                return {
                    "name": "hf-sdpa-dense-mask",
                    "error": "out of memory even with checkpointing",
                }
            print(
                "  baseline ran out of memory; retrying with gradient checkpointing",
                file=sys.stderr,
            )
            optimizer.zero_grad(set_to_none=True)
            model.gradient_checkpointing_enable()
            checkpointing = True
    tokens = samples * spec.data.seq_len
    return summarize(
        "hf-sdpa-dense-mask",
        times,
        sum(flops) / len(flops),
        tokens,
        peak_flops(device),
        device,
        {"gradient_checkpointing": checkpointing, "micro_batch": samples},
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tiny", action="store_true", help="tiny model, short sequence (CPU smoke)"
    )
    parser.add_argument(
        "--model", default=None, help="preset (default qwen3-1.7b, tiny with --tiny)"
    )
    parser.add_argument(
        "--seq-len", type=int, default=None, help="L (default 8192, 128 with --tiny)"
    )
    parser.add_argument(
        "--block-size", type=int, default=None, help="B (default 32, 16 with --tiny)"
    )
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument(
        "--baseline-micro-batch",
        type=int,
        default=None,
        help="the baseline's micro-batch when it differs from ours (at most --micro-batch): "
        "each side at the largest that fits one GPU",
    )
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 10, 3 tiny)")
    parser.add_argument(
        "--warmup", type=int, default=None, help="untimed steps (default 3, 1 tiny)"
    )
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument(
        "--profile", type=Path, default=None, help="profile two extra steps; kernel table here"
    )
    parser.add_argument(
        "--inductor",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set torch._inductor.config KEY (e.g. max_autotune=True) before compiling",
    )
    args = parser.parse_args(argv)
    for item in args.inductor:
        key, _, value = item.partition("=")
        setattr(torch._inductor.config, key, ast.literal_eval(value))
    args.seq_len = args.seq_len or (128 if args.tiny else 8192)
    args.block_size = args.block_size or (16 if args.tiny else 32)
    args.steps = args.steps or (3 if args.tiny else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 3)
    if (
        args.baseline_micro_batch is not None
        and not 1 <= args.baseline_micro_batch <= args.micro_batch
    ):
        parser.error("--baseline-micro-batch must be between 1 and --micro-batch")

    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    spec = build_spec(args, on_gpu)
    print(
        f"model {spec.model.from_config}, L={args.seq_len}, B={args.block_size}, "
        f"micro-batch {args.micro_batch}, {device}",
        file=sys.stderr,
    )
    ours, trainer = run_ours(spec, args, device)
    results = [ours]
    if not args.no_baseline:
        results.append(run_baseline(trainer, spec, args, device))

    print(
        f"\n{'':22} {'mb':>3} {'step s':>8} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} {'mem GB':>7}"
    )
    for r in results:
        if "error" in r:
            print(f"{r['name']:22} {r['error']}")
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
        mem = f"{r['peak_memory_gb']:.1f}" if r["peak_memory_gb"] is not None else "-"
        print(
            f"{r['name']:22} {r['micro_batch']:3} {r['step_time_s']:8.3f} {r['tokens_per_s']:10,.0f} "
            f"{r['tflops_per_s']:8.1f} {mfu:>6} {mem:>7}"
        )
    speedup = None
    if len(results) == 2 and "error" not in results[1]:
        speedup = results[0]["tokens_per_s"] / results[1]["tokens_per_s"]
        print(f"\nspeedup over the baseline: {speedup:.2f}x")
    if args.out:
        report = {
            "benchmark": "train_step",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(0) if on_gpu else platform.processor() or "cpu",
            "torch": torch.__version__,
            "model": spec.model.from_config,
            "seq_len": args.seq_len,
            "block_size": args.block_size,
            "micro_batch": args.micro_batch,
            "inductor": args.inductor,
            "results": results,
            "speedup": speedup,
        }
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
