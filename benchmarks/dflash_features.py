"""`dllm dflash prepare-features`: rows a second as it runs now, the target run a micro-batch of
rows a forward (`--batch-rows`, default `training.micro_batch_size`) and each shard written on a
thread while the next is computed, against the baseline, how it ran before 2026-12-05 (one row
a forward, each shard written before the next was computed), and the batch alone; in the same
run, on the same data and target.

The data: the Python standard library's sources (every machine has them), byte-level tokens,
--rows rows of --seq-len. The target: a Qwen3-shaped decoder with random weights saved as a
Hugging Face folder (its numbers do not matter here, only its shape). The drafter reads the
default feature layers (the KL objective's teacher rows too, so the target runs every layer).
Every configuration must write the same features: equal shards on CPU, and on CUDA the largest
difference is reported (bf16 kernels may round a row by the batch it comes in).

    python benchmarks/dflash_features.py --out dflash_features.json     # GPU: ~0.6B target, 1K rows
    python benchmarks/dflash_features.py --tiny                         # CPU plumbing check
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.speculative import prepare, stdlib_files  # noqa: E402

# (hidden, layers, heads, kv heads, head dim, intermediate): a Qwen3-0.6B-shaped target on a
# GPU, a tiny one on the CPU
SHAPES = {"gpu": (1024, 28, 16, 8, 128, 3072), "tiny": (64, 4, 4, 2, 16, 128)}
MASK = 259  # the byte-level tokenizer's <|mask|>


def random_target(folder: Path, shape, device: str) -> Path:
    """A Qwen3 of `shape` with random weights, saved by transformers as an HF folder."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hidden, layers, heads, kv, head_dim, inter = shape
    config = Qwen3Config(
        vocab_size=260,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        intermediate_size=inter,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    model.to(torch.bfloat16 if device == "cuda" else torch.float32).save_pretrained(folder)
    return folder


def drafter_spec(target: Path, artifact: Path, seq_len: int, micro: int):
    from turbo_dllm.config.load import load_runspec

    document = {
        "model": {
            "family": "dflash",
            "from_config": "target",
            "dflash": {
                "target": str(target),
                "num_layers": 1,
                "block_size": 16,
                "mask_token_id": MASK,
            },
        },
        "objective": {"name": "dflash_distillation", "block_size": 16},
        "data": {"artifact": str(artifact), "seq_len": seq_len},
        "training": {"micro_batch_size": micro, "steps": 1},
        "scheduler": {"warmup_steps": 0},
    }
    path = artifact.parent / "drafter.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_runspec(path)


class InlineWriter:
    """A stand-in for the writer thread: each shard written where it is submitted, before the
    target computes the next (how prepare-features wrote them before 2026-12-05)."""

    def __init__(self, max_workers: int = 1) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def submit(self, fn, *args):
        from concurrent.futures import Future

        future: Future = Future()
        future.set_result(fn(*args))
        return future


# (name, one row a forward?, writer thread?): the baseline first
CONFIGS = (
    ("one row, inline writes", True, False),
    ("batch, inline writes", False, False),
    ("batch, writer thread", False, True),
)


def timed_prepare(spec, out: Path, batch_rows: int, device: str, thread: bool) -> float:
    import torch

    from turbo_dllm.families.dflash import features

    real = features.ThreadPoolExecutor
    features.ThreadPoolExecutor = real if thread else InlineWriter
    try:
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        features.prepare_features(spec, out, batch_rows=batch_rows, progress=False, device=device)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started
    finally:
        features.ThreadPoolExecutor = real


def largest_difference(a: Path, b: Path) -> float:
    """The largest absolute difference between two feature artifacts' tensors."""
    from safetensors.torch import load_file

    from turbo_dllm.families.dflash.features import read_features_manifest

    worst = 0.0
    for shard in read_features_manifest(a).shards:
        left, right = load_file(str(a / shard.file)), load_file(str(b / shard.file))
        for name, tensor in left.items():
            if tensor.is_floating_point():
                worst = max(worst, (tensor.float() - right[name].float()).abs().max().item())
            elif not bool((tensor == right[name]).all()):
                return float("inf")
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny target on the CPU")
    parser.add_argument("--rows", type=int, default=None, help="data rows, about (1024; tiny 64)")
    parser.add_argument("--seq-len", type=int, default=None, help="(2048; tiny 128)")
    parser.add_argument("--batch-rows", type=int, default=8, help="the micro-batch (8)")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (a temp one)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    import tempfile

    import torch

    device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    rows = args.rows or (64 if args.tiny else 1024)
    seq_len = args.seq_len or (128 if args.tiny else 2048)
    shape = SHAPES["tiny" if args.tiny else "gpu"]
    work = Path(args.work or tempfile.mkdtemp(prefix="dflash-features-"))
    work.mkdir(parents=True, exist_ok=True)
    # standard-library files, in name order, until about `rows` rows of text (a byte a token)
    files, size = [], 0
    for file in stdlib_files(None):
        if size >= rows * seq_len:
            break
        files.append(file)
        size += file.stat().st_size
    artifact = prepare(files, work / "artifact", seq_len)
    from turbo_dllm.data.artifact import DataArtifact

    total = len(DataArtifact(artifact))
    target = random_target(work / "target", shape, device)
    spec = drafter_spec(target, artifact, seq_len, args.batch_rows)
    print(f"{device}: target {shape}, {total} rows of {seq_len}", file=sys.stderr)
    # two rounds, alternated; the second's times count (the first pays imports, the compiles
    # of each batch shape, the target's first hash)
    results: dict[str, float] = {}
    for round_ in (1, 2):
        for index, (name, one_row, thread) in enumerate(CONFIGS):
            folder = work / f"config{index}"
            if folder.exists():
                shutil.rmtree(folder)
            batch = 1 if one_row else args.batch_rows
            seconds = timed_prepare(spec, folder, batch, device, thread)
            results[name] = seconds
            print(
                f"round {round_}, {name} (batch_rows {batch}): {seconds:7.2f} s, "
                f"{total / seconds:8.1f} rows/s",
                file=sys.stderr,
            )
    # every configuration wrote the same features (on CUDA to bf16 rounding by batch)
    difference = max(
        largest_difference(work / "config0", work / f"config{i}") for i in range(1, len(CONFIGS))
    )
    baseline = results[CONFIGS[0][0]]
    speedups = {name: baseline / seconds for name, seconds in results.items()}
    record = {
        "benchmark": "dflash_features",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "target_shape": dict(
            zip(
                ("hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate"),
                shape,
                strict=True,
            )
        ),
        "rows": total,
        "seq_len": seq_len,
        "batch_rows": args.batch_rows,
        "seconds": results,
        "rows_per_s": {name: total / seconds for name, seconds in results.items()},
        "speedup_over_baseline": speedups,
        "largest_difference": difference,
    }
    for name, speedup in speedups.items():
        print(f"{name}: {total / results[name]:.1f} rows/s, {speedup:.2f}x the baseline")
    print(f"largest difference between the artifacts {difference:.3g}")
    if args.out:
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
