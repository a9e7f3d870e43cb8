"""Bytes saved for backward by one training forward, by component, ours against transformers.

Peak training memory without checkpointing is mostly what autograd keeps between the forward and
the backward. This counts it on CPU: every tensor a forward saves (`saved_tensors_hooks`), once
per storage (views and re-saves of one buffer count once), parameters left out, each storage
charged to where it was first saved: the innermost module running, and the innermost function
of the model's own source files (so the Gated DeltaNet's chunked form is split by step).

    python benchmarks/saved_activations.py                   # float32, the scaled shape, L = 512
    python benchmarks/saved_activations.py --dtype bfloat16  # the docs' table (CUDA autocast)

The shape: `qwen3.8-27b-8l`'s layer mix and head dims with 1/8 of its heads and widths (see
SCALED), Fast-dLLM v2 batches (micro-batch 1 = the complementary pair, 2 rows of 2L), block 64.
Everything saved grows linearly in heads and tokens here (FlexAttention-like attention), so the
full shape's bytes are about these times 8 (heads) times 4096 / L (tokens).
Attention: a stand-in with FlexAttention's (and fused SDPA's) memory, saving q, k, v, out, lse,
on both sides, as the GPU run's kernels do; the CPU's SDPA with a dense mask would add scores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections import Counter
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# qwen3.8-27b-8l with 1/8 of its heads and widths; head dims, chunk and conv as the preset.
SCALED = {
    "vocab_size": 31040,
    "hidden_size": 640,
    "intermediate_size": 2176,
    "num_attention_heads": 3,
    "num_key_value_heads": 1,  # (the preset's 6 query heads per key head become 3)
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 6,
}


class SavedBytes:
    """Counts the storages saved for backward under it, by (module path, source function)."""

    def __init__(self, model: torch.nn.Module, sources: tuple[str, ...]) -> None:
        self.names = {module: name for name, module in model.named_modules()}
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.sources = sources
        self.stack: list[str] = []
        self.seen: dict[int, tuple[str, str, int, tuple[int, ...], torch.dtype]] = {}

    def _pre(self, module, args) -> None:
        if module in self.names:
            self.stack.append(self.names[module])

    def _post(self, module, args, out) -> None:
        if module in self.names:
            self.stack.pop()

    def _function(self) -> str:
        frame = sys._getframe(2)
        while frame is not None:
            path = frame.f_code.co_filename
            if any(part in path for part in self.sources):
                return f"{Path(path).stem}.{frame.f_code.co_name}:{frame.f_lineno}"
            frame = frame.f_back
        return "-"

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in self.params and key not in self.seen and storage.nbytes():
            module = self.stack[-1] if self.stack else "-"
            self.seen[key] = (
                module,
                self._function(),
                storage.nbytes(),
                tuple(tensor.shape),
                tensor.dtype,
            )
        return tensor

    @contextmanager
    def counting(self):
        from torch.nn.modules import module as nn_module

        pre = nn_module.register_module_forward_pre_hook(self._pre)
        post = nn_module.register_module_forward_hook(self._post)
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
                yield self
        finally:
            pre.remove()
            post.remove()

    @property
    def total(self) -> int:
        return sum(entry[2] for entry in self.seen.values())

    def by(self, key) -> Counter:
        counts: Counter = Counter()
        for entry in self.seen.values():
            counts[key(entry)] += entry[2]
        return counts


def component(module: str) -> str:
    """model.layers.3.linear_attn.norm -> linear_attn.norm (layers summed); head/loss: '-'."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "layers":
        return ".".join(parts[3:]) or "layer"
    return module if module != "-" else "lm_head + loss"


def layer_kind(config, module: str) -> str:
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "layers":
        return config.layer_types[int(parts[2])]
    return "embed / final norm / lm_head + loss" if module != "-" else "lm_head + loss"


def install_flex_like_attention() -> None:
    """Both sides' attention saves what FlexAttention does (q, k, v, out, lse), no scores."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import memory_model
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    memory_model._install_stand_in()

    def hf_attention(module, query, key, value, attention_mask, **kwargs):
        out = memory_model.FlexLikeAttention.apply(query, key, value)[0]
        return out.transpose(1, 2).contiguous(), None

    hf.ALL_ATTENTION_FUNCTIONS["sdpa"] = hf_attention


def build(seq_len: int, dtype: str, block: int, run_dir: str):
    from turbo_dllm.config.runspec import RunSpec
    from turbo_dllm.config.validate import check
    from turbo_dllm.train.distributed import init_distributed
    from turbo_dllm.train.trainer import Trainer

    document = {
        "launch": {"seed": 0, "kind": "profile"},
        "model": {
            "family": "qwen3_8",
            "from_config": "qwen3.8-27b-8l",
            "config_overrides": SCALED,
            "dtype": dtype,
            "attention": "reference",
            "linear_attention": "torch",
        },
        "objective": {"name": "fast_dllm_v2", "block_size": block},
        "data": {
            "synthetic": {"num_sequences": 4, "vocab_size": SCALED["vocab_size"]},
            "seq_len": seq_len,
        },
        "training": {"micro_batch_size": 1, "steps": 1},
        "scheduler": {"name": "constant", "warmup_steps": 0},
        "checkpoint": {"interval": None, "resume": "never"},
        "logging": {"console": False, "jsonl": False},
    }
    spec = check(RunSpec.model_validate(document))
    return Trainer(spec, run_dir, init_distributed()).build()


def gpu_autocast(trainer):
    """The trainer's CUDA autocast (bf16) on the CPU, for a bf16 model: the GPU run's casts
    (matmul inputs to bf16, each cast copy saved), which the CPU trainer (no autocast) skips."""
    bf16 = next(trainer.model.parameters()).dtype == torch.bfloat16
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)


def measure_ours(trainer, peak: bool = False):
    """Our counter, the batch and its corruption; with `peak`, also the live-byte peak of the
    whole forward + backward (activations, transients, parameter gradients; memory_model)."""
    from turbo_dllm.train.objectives import NoiseKey
    from turbo_dllm.train.objectives.base import score

    batch = next(trainer.loader)
    diffusion = trainer.objective.corrupt(batch, NoiseKey(0, 0, 0, 1))
    inputs = trainer.plan.prepare(diffusion, trainer.device)
    counter = SavedBytes(trainer.model, ("families/qwen3_8", "objectives", "losses"))
    import memory_model

    live = memory_model.LiveBytes() if peak else contextlib.nullcontext()
    with live:
        with counter.counting(), gpu_autocast(trainer):
            loss = trainer.model(
                inputs.input_ids,
                inputs.positions,
                trainer.model_mask(inputs),
                output=partial(score, inputs.batch),
            )
        loss.backward()
        del loss
    if peak:
        print(f"ours: forward + backward live-byte peak {live.peak / 1e6:.1f} MB")
    return counter, batch, diffusion


def measure_hf(trainer, batch, diffusion) -> SavedBytes:
    import transformers

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from train_step import hf_block_diffusion_loss

    config_dict = trainer.model_config.to_hf_dict()
    hf_config = transformers.Qwen3_5TextConfig(
        **{k: v for k, v in config_dict.items() if k != "architectures"}
    )
    dtype = next(trainer.model.parameters()).dtype
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        hf_config, attn_implementation="sdpa", dtype=dtype
    ).train()
    counter = SavedBytes(model, ("qwen3_5",))
    mask = {"full_attention": None, "linear_attention": None}  # the stand-in ignores masks
    with counter.counting():
        loss = hf_block_diffusion_loss(model, trainer.objective, batch, diffusion, mask, "cpu")
    loss.backward()
    return counter


def report(name, counter, config, top) -> dict:
    mb = lambda n: round(n / 1e6, 2)  # noqa: E731
    kinds = counter.by(lambda e: layer_kind(config, e[0]))
    parts = counter.by(lambda e: (layer_kind(config, e[0]), component(e[0])))
    functions = counter.by(lambda e: e[1])
    items = Counter()
    for module, function, size, shape, dtype in counter.seen.values():
        items[(component(module), function, shape, str(dtype).removeprefix("torch."))] += size
    print(f"\n== {name}: {mb(counter.total)} MB saved for backward")
    for kind, size in kinds.most_common():
        print(f"  {kind:40s} {mb(size):10.2f} MB")
    print("  by component (all layers of a kind):")
    for (kind, part), size in parts.most_common():
        print(f"    {kind[:6]} {part:34s} {mb(size):10.2f} MB")
    print("  by source function:")
    for function, size in functions.most_common(top):
        print(f"    {function:50s} {mb(size):10.2f} MB")
    print(f"  largest items (component, function, shape, dtype; {top}):")
    for (part, function, shape, dtype), size in items.most_common(top):
        print(f"    {mb(size):9.2f} MB  {part:24s} {function:44s} {list(shape)} {dtype}")
    return {
        "total_mb": mb(counter.total),
        "by_kind_mb": {k: mb(v) for k, v in kinds.items()},
        "by_component_mb": {f"{k}/{p}": mb(v) for (k, p), v in parts.items()},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--no-hf", action="store_true")
    parser.add_argument("--peak", action="store_true", help="also ours' live-byte peak")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    install_flex_like_attention()
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = build(args.seq_len, args.dtype, args.block_size, run_dir)
        config = trainer.model_config
        ours, batch, diffusion = measure_ours(trainer, args.peak)
        results = {
            "shape": {"seq_len": args.seq_len, "block": args.block_size, "dtype": args.dtype},
            "ours": report("turbo-dllm (qwen3_8, torch chunked GDN)", ours, config, args.top),
        }
        if not args.no_hf:
            hf = measure_hf(trainer, batch, diffusion)
            results["hf"] = report("transformers Qwen3_5ForCausalLM", hf, config, args.top)
            results["ratio"] = round(ours.total / hf.total, 3)
            print(f"\nours / HF: {results['ratio']}x")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
