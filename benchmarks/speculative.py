"""Speculative decoding end to end: a DFlash drafter against an equally sized autoregressive
drafter, both distilled/trained for the same time from one target, on held-out real text.

In one run (one H200, ~8 minutes with the defaults):
1. data: the Python standard library's own sources (every machine has them), byte-level
   tokens; every 10th file (sorted by name) is held out for evaluation;
2. target: a Qwen3-shaped decoder (~200M parameters) trained with `objective: autoregressive`
   for --target-seconds, exported as a Hugging Face folder;
3. drafters, --drafter-seconds each: a DFlash drafter (`dflash_distillation`, online target
   features, forward KL) and an autoregressive drafter of the same layers and width
   (`autoregressive` on the same text);
4. `dllm dflash eval` of both on prompts from the held-out files: lossless greedy decoding,
   tau (tokens per target forward), tokens/s of the target alone and with each drafter.

Targets (issue 17): DFlash tau >= 1.5 x the AR drafter's; DFlash wall-clock speedup >= 2x over
the target alone.

    python benchmarks/speculative.py --out speculative.json            # H200
    python benchmarks/speculative.py --tiny --out /tmp/spec.json       # CPU plumbing check
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {
    # hidden, layers, heads, kv heads, head_dim, intermediate
    "target": (1024, 16, 16, 8, 64, 3072),
    "tiny": (64, 2, 4, 2, 16, 128),
}


def stdlib_files(limit: int | None) -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p
        for p in root.rglob("*.py")
        # the library itself: no installed packages, no test suites (a third of the text)
        if not {"site-packages", "test", "tests", "idle_test"} & set(p.parts)
        and p.is_file()
        and p.stat().st_size > 2000
    )
    return files[:limit] if limit else files


def prepare(files: list[Path], out: Path, seq_len: int) -> Path:
    from turbo_dllm.data.prepare import prepare as run_prepare
    from turbo_dllm.data.spec import load_prepare_spec

    readable = []
    for file in files:
        try:
            file.read_text(encoding="utf-8")
            readable.append(str(file))
        except (UnicodeDecodeError, OSError):
            pass
    config = out.parent / f"{out.name}.prepare.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "source": {"kind": "text", "paths": readable},
                "tokenizer": {"kind": "byte_level"},
                "packing": {"seq_len": seq_len, "block_size": 8},
                "output": {"path": str(out)},
                "workers": 4,
            }
        )
    )
    run_prepare(load_prepare_spec(config, []), progress=False)
    return out


def decoder_spec(artifact, run, shape, *, seconds, seq_len, micro, lr, gpu):
    h, layers, heads, kv, hd, inter = shape
    return {
        "launch": {"seed": 0, "run_dir": str(run)},
        "model": {
            "family": "qwen3",
            "from_config": "tiny",
            "config_overrides": {
                "vocab_size": 260,
                "hidden_size": h,
                "num_hidden_layers": layers,
                "num_attention_heads": heads,
                "num_key_value_heads": kv,
                "head_dim": hd,
                "intermediate_size": inter,
            },
            "attention": "flex" if gpu else "reference",
        },
        "objective": {"name": "autoregressive"},
        "data": {"artifact": str(artifact), "seq_len": seq_len},
        "training": {
            "micro_batch_size": micro,
            "steps": 1_000_000,
            "max_duration_s": seconds,
            "compile": gpu,
        },
        "optimizer": {"lr": lr, "weight_decay": 0.0},
        "scheduler": {"name": "constant", "warmup_steps": 20},
        "checkpoint": {"interval": None},
        "logging": {"console": False},
    }


def train_and_export(document, run: Path, out: Path, kind: str = "decoder") -> Path:
    from turbo_dllm.config.runspec import RunSpec
    from turbo_dllm.config.validate import check
    from turbo_dllm.train.entry import train

    spec = check(RunSpec.model_validate(document))
    started = time.perf_counter()
    train(spec, run)
    steps = len((run / "metrics.jsonl").read_text().splitlines())
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    print(
        f"{kind}: {steps} steps in {time.perf_counter() - started:.0f} s, loss {last['loss']:.3f}",
        file=sys.stderr,
    )
    if kind == "dflash":
        from turbo_dllm.families.dflash.export import export_drafter

        return export_drafter(run / "checkpoints", out)
    from turbo_dllm.train.export import export_checkpoint

    return export_checkpoint(run / "checkpoints", out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--work", type=Path, default=Path("/tmp/dllm-speculative"))
    parser.add_argument("--tiny", action="store_true", help="CPU plumbing check (seconds)")
    parser.add_argument("--target-seconds", type=float, default=170.0)
    parser.add_argument("--drafter-seconds", type=float, default=80.0)
    parser.add_argument("--drafter-layers", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=64)
    args = parser.parse_args()
    import shutil

    import torch

    from turbo_dllm.families.dflash.speculative import evaluate

    gpu = torch.cuda.is_available() and not args.tiny
    shape = SHAPES["tiny" if args.tiny else "target"]
    if args.tiny:
        args.target_seconds, args.drafter_seconds = (
            min(args.target_seconds, 20),
            min(args.drafter_seconds, 10),
        )
        args.seq_len, args.micro_batch, args.max_new_tokens = 128, 4, 16
        args.num_prompts, args.prompt_len = 2, 16
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    files = stdlib_files(60 if args.tiny else None)
    held_out = files[::10]
    training = [f for f in files if f not in set(held_out)]
    t0 = time.perf_counter()
    train_data = prepare(training, work / "train-data", args.seq_len)
    eval_data = prepare(held_out, work / "heldout-data", args.seq_len)
    print(f"data: {len(training)} train / {len(held_out)} held-out files", file=sys.stderr)

    target = train_and_export(
        decoder_spec(
            train_data,
            work / "target-run",
            shape,
            seconds=args.target_seconds,
            seq_len=args.seq_len,
            micro=args.micro_batch,
            lr=1e-3,
            gpu=gpu,
        ),
        work / "target-run",
        work / "target",
        "target",
    )
    h, _, heads, kv, hd, inter = shape
    ar_shape = (h, args.drafter_layers, heads, kv, hd, inter)
    ar = train_and_export(
        decoder_spec(
            train_data,
            work / "ar-run",
            ar_shape,
            seconds=args.drafter_seconds,
            seq_len=args.seq_len,
            micro=args.micro_batch,
            lr=1e-3,
            gpu=gpu,
        ),
        work / "ar-run",
        work / "ar-drafter",
        "ar-drafter",
    )
    dflash_doc = decoder_spec(
        train_data,
        work / "dflash-run",
        shape,
        seconds=args.drafter_seconds,
        seq_len=args.seq_len,
        micro=args.micro_batch,
        lr=1e-3,
        gpu=False,
    )
    dflash_doc["model"] = {
        "family": "dflash",
        "from_config": "target",
        "dflash": {
            "target": str(target),
            "num_layers": args.drafter_layers,
            "block_size": args.block_size,
            "mask_token_id": 259,
        },
    }
    dflash_doc["objective"] = {
        "name": "dflash_distillation",
        "block_size": args.block_size,
        "max_anchors": max(8, args.seq_len // 4),
        "anchor_sampling": "locality",
        "decay_gamma": 7.0,
        "dflash_loss": "speculators_kl",
    }
    drafter = train_and_export(dflash_doc, work / "dflash-run", work / "dflash-drafter", "dflash")
    train_s = time.perf_counter() - t0

    common = dict(
        block_size=args.block_size,
        max_new_tokens=args.max_new_tokens,
        num_prompts=args.num_prompts,
        prompt_len=args.prompt_len,
        strict=False,  # a mismatch is recorded in the report, not a lost run
    )
    reports = {
        "dflash": evaluate(str(target), str(drafter), str(eval_data), **common).to_dict(),
        "autoregressive": evaluate(str(target), str(ar), str(eval_data), **common).to_dict(),
    }
    d, a = reports["dflash"], reports["autoregressive"]
    result = {
        "benchmark": "speculative",
        "device": torch.cuda.get_device_name() if gpu else "cpu",
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "train_s": train_s,
        "reports": reports,
        "tau_ratio_dflash_over_ar": d["tau"] / a["tau"],
        "targets": {
            "tau_ratio>=1.5": d["tau"] / a["tau"] >= 1.5,
            "dflash_speedup>=2": d["speedup"] >= 2.0,
        },
    }
    print(
        f"{'drafter':<15}{'tau':>8}{'target tok/s':>15}{'spec tok/s':>13}{'speedup':>9}"
        f"{'lossless':>10}"
    )
    for name, r in reports.items():
        print(
            f"{name:<15}{r['tau']:>8.3f}{r['target_tokens_per_s']:>15.1f}"
            f"{r['speculative_tokens_per_s']:>13.1f}{r['speedup']:>8.2f}x{str(r['lossless']):>10}"
        )
    print(
        f"tau ratio dflash/ar: {result['tau_ratio_dflash_over_ar']:.2f}  targets: {result['targets']}"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
