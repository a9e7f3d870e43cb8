"""Per-rank activation memory of one training step (whole sequence, CSBP, CP, TP, TP + SP) on CPU.

The 2-GPU context search (benchmarks/context_parallel.py) says how long a sequence fits; this
script says where the bytes go, without a GPU. It runs the real `Trainer.train_step` (plan-sharded
batch, activation checkpointing, FSDP2 over the context group, gloo between processes) with the
attention kernel replaced by a stand-in that behaves like FlexAttention for memory (it returns
out and lse, saves q, k, v, out, lse for backward and allocates dq, dk, dv there, and never
materialises a score matrix), and tracks the live bytes of every tensor storage the step
creates. Reported: the peak per rank, per data token, and the largest live tensors at the peak.
Under a perfect split a CSBP/CP rank holds half of a whole-sequence rank's activations, plus
fixed FSDP buffers (parameter all-gathers, gradient reduce-scatters).

    python benchmarks/memory_model.py                      # L = 4096, whole / csbp / cp
    python benchmarks/memory_model.py --seq-len 8192 --modes whole,csbp --top 15
    python benchmarks/memory_model.py --modes whole,tp,tp-sp   # tensor / sequence parallelism

What it cannot see: the CUDA caching allocator (fragmentation, stream-ordered frees of buffers
used by NCCL), NCCL's own buffers, and kernel workspaces.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import weakref
from collections import Counter
from pathlib import Path

import torch
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# mode -> (world, topology): every mode runs on 2 processes except the whole sequence.
MODES: dict[str, tuple[int, dict]] = {
    "whole": (1, {}),
    "csbp": (2, {"cp": 2, "bp": 2}),
    "cp": (2, {"cp": 2}),
    "tp": (2, {"tp": 2}),
    "tp-sp": (2, {"tp": 2, "sp": True}),
}


class FlexLikeAttention(torch.autograd.Function):
    """Output-shaped stand-in with FlexAttention's memory behaviour (values are meaningless)."""

    @staticmethod
    def forward(ctx, q, k, v):
        group = q.shape[1] // k.shape[1]
        mean = v.mean(dim=2, keepdim=True).repeat_interleave(group, dim=1)
        out = mean.expand(-1, -1, q.shape[2], -1) + 0 * q
        lse = q.new_zeros(q.shape[:3], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, _grad_lse):
        q, k, v, _, _ = ctx.saved_tensors
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)


class LiveBytes(TorchDispatchMode):
    """Live bytes of the storages created under the mode; the tensors alive at the peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.owners: dict[int, tuple[str, int, tuple[int, ...]]] = {}
        self.at_peak: dict[int, tuple[str, int, tuple[int, ...]]] = {}
        self._op = ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._op = str(func)
        out = func(*args, **(kwargs or {}))
        for tensor in torch.utils._pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self._track(tensor)
        return out

    def _track(self, tensor: torch.Tensor) -> None:
        try:
            storage = tensor.untyped_storage()
            key = storage.data_ptr()
        except (RuntimeError, NotImplementedError):
            return  # a wrapper subclass (DTensor): its local tensors are tracked themselves
        size = storage.nbytes()
        if size == 0 or key in self.owners:
            return
        self.owners[key] = (self._op, size, tuple(tensor.shape))
        self.live += size
        if self.live > self.peak:
            self.peak, self.at_peak = self.live, dict(self.owners)
        weakref.finalize(storage, self._free, key, size)

    def _free(self, key: int, size: int) -> None:
        self.live -= size
        self.owners.pop(key, None)

    def largest(self, top: int) -> list[dict]:
        groups: Counter = Counter()
        for op, size, shape in self.at_peak.values():
            groups[(op, shape)] += size
        return [
            {"op": op, "shape": list(shape), "mb": round(size / 1e6, 2)}
            for (op, shape), size in groups.most_common(top)
        ]


def _install_stand_in() -> None:
    import turbo_dllm.train.attention.backends as backends
    import turbo_dllm.train.parallel.partial_attention as partial

    def attend(q, k, v):
        return FlexLikeAttention.apply(q, k, v)

    partial._reference = lambda q_tokens, k_tokens, scale: attend
    backends.ReferenceAttention.prepare = lambda self, layout, doc_ids, device, **window: None
    backends.ReferenceAttention.__call__ = lambda self, q, k, v, mask: attend(q, k, v)[0]


def _spec(args, topology: dict, world: int):
    from turbo_dllm.config.runspec import RunSpec
    from turbo_dllm.config.validate import check

    document = {
        "launch": {"seed": 0, "kind": "profile"},
        "model": {
            "family": "qwen3",
            "from_config": "tiny",
            "attention": "reference",
            "dtype": args.dtype,
            "config_overrides": {
                "hidden_size": 256,
                "intermediate_size": 768,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 64,
                "num_hidden_layers": 4,
                "max_position_embeddings": max(8192, args.seq_len),
            },
        },
        "objective": {"name": "block_diffusion", "block_size": args.block_size},
        "data": {"synthetic": {"num_sequences": 8, "vocab_size": 512}, "seq_len": args.seq_len},
        "training": {
            "micro_batch_size": 1,
            "steps": 10,
            "activation_checkpointing": True,
            "mlp_chunks": args.mlp_chunks,
        },
        "topology": topology,
        "scheduler": {"name": "constant", "warmup_steps": 0},
        "checkpoint": {"resume": "never"},
        "logging": {"console": False, "jsonl": False},
        "kernels": args.kernels,
    }
    return check(RunSpec.model_validate(document), world_size=world)


def _worker(rank: int, args, mode: str, port: int, out_dir: str) -> None:
    world, topology = MODES[mode]
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    _install_stand_in()
    from turbo_dllm.train.distributed import init_distributed
    from turbo_dllm.train.trainer import Trainer

    env = init_distributed()
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(_spec(args, topology, world), run_dir, env).build()
        trainer.train_step(0)  # optimizer state exists from here on: not activation memory
        tracker = LiveBytes()
        with tracker:
            trainer.train_step(1)
    row = {
        "mode": mode,
        "rank": rank,
        "seq_len": args.seq_len,
        "peak_mb": round(tracker.peak / 1e6, 2),
        "kb_per_data_token": round(tracker.peak / args.seq_len / 1e3, 2),
        "largest": tracker.largest(args.top),
    }
    Path(out_dir, f"{mode}-{rank}.json").write_text(json.dumps(row))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure(args, mode: str) -> list[dict]:
    world = MODES[mode][0]
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_worker, args=(args, mode, _free_port(), out_dir), nprocs=world)
        return [json.loads(Path(out_dir, f"{mode}-{r}.json").read_text()) for r in range(world)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--modes", default="whole,csbp,cp")
    p.add_argument("--dtype", default="float32", help="parameter dtype; bfloat16 is the GPU case")
    p.add_argument("--kernels", default="reference", help="merge op backend: reference|jit|native")
    p.add_argument("--mlp-chunks", type=int, default=1, help="training.mlp_chunks")
    p.add_argument("--top", type=int, default=10, help="largest live tensors to list")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    rows = [row for mode in args.modes.split(",") for row in measure(args, mode)]
    whole = next((r["peak_mb"] for r in rows if r["mode"] == "whole"), None)
    print(f"{'mode':>6} {'rank':>4} {'peak MB':>9} {'KB/token':>9} {'vs whole':>9}")
    for r in rows:
        ratio = f"{r['peak_mb'] / whole:.3f}" if whole else "-"
        print(f"{r['mode']:>6} {r['rank']:>4} {r['peak_mb']:9.1f} {r['kb_per_data_token']:9.2f} "
              f"{ratio:>9}")  # fmt: skip
        if r["rank"] == 0:
            for t in r["largest"]:
                print(f"{'':16}{t['mb']:8.2f} MB  {t['op']:36} {tuple(t['shape'])}")
    if args.out:
        args.out.write_text(json.dumps({"benchmark": "memory_model", "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
