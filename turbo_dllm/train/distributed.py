"""Processes, and the wrappers applied to a plain model from outside (torchtitan's order).

`init_distributed` reads torchrun's environment (one process without it). The degrees and the
device mesh live in `turbo_dllm.train.parallel.dims.ParallelDims`. The model is wrapped in this
order: activation checkpointing -> compile -> FSDP2 (`fully_shard` per decoder layer, then the
root, which owns embeddings, final norm and the (tied) head) over the mesh's 2-D
(replicate, shard) FSDP view: HSDP when both are > 1, plain FSDP or plain replication otherwise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "DistEnv",
    "apply_activation_checkpointing",
    "apply_compile",
    "apply_fsdp",
    "decoder_layers",
    "init_distributed",
]


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed() -> DistEnv:
    """Join the process group torchrun set up (NCCL on GPU, gloo on CPU); no-op for 1 process."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend=backend, **kwargs)
    return DistEnv(rank=rank, world_size=world, local_rank=local_rank, device=device)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    return model.model.layers


def apply_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each decoder layer in backward instead of storing its activations."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    layers = decoder_layers(model)
    for index, layer in enumerate(layers):
        layers[index] = checkpoint_wrapper(layer, preserve_rng_state=False)


def apply_compile(model: nn.Module) -> None:
    """torch.compile each decoder layer in place (same parameter names, one graph per layer)."""
    for layer in decoder_layers(model):
        layer.compile(fullgraph=False, dynamic=False)


def apply_fsdp(model: nn.Module, mesh, *, reshard_after_forward: bool = True) -> None:
    """FSDP2 over the data-parallel mesh: each layer, then the root (embeddings + head)."""
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    # Backward starts with the root's parameters (head, final norm): keep them gathered.
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
