"""Processes, the data-parallel mesh, and the wrappers applied to a plain model.

`init_distributed` reads torchrun's environment (one process without it). `DataParallelDims`
validates the data-parallel degrees once and builds the mesh ("dp_replicate", "dp_shard").
The model is then wrapped from outside, in this order: activation checkpointing -> compile ->
FSDP2 (`fully_shard` per decoder layer, then the root, which owns embeddings, final norm and
the (tied) head). With dp_replicate > 1 and dp_shard > 1 that is HSDP; with one of them 1 it
is plain FSDP or plain replication. Context/block parallel axes (cp, bp, tp) are handled by
`turbo_dllm.train.parallel`, whose ParallelDims supersedes this one when they are in use.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from turbo_dllm.errors import DllmError

__all__ = [
    "DistEnv",
    "DataParallelDims",
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


@dataclass(frozen=True)
class DataParallelDims:
    """Data-parallel degrees: replicated (dp) x sharded (fsdp) == world size."""

    dp_replicate: int
    dp_shard: int
    world_size: int

    def __post_init__(self) -> None:
        if self.dp_replicate * self.dp_shard != self.world_size:
            raise DllmError(
                f"topology dp={self.dp_replicate} x fsdp={self.dp_shard} does not match "
                f"{self.world_size} processes",
                hint="make topology.dp * topology.fsdp equal --nproc-per-node * nodes",
            )

    @classmethod
    def from_spec(cls, topology, world_size: int) -> DataParallelDims:
        for axis in ("cp", "bp", "tp", "ep"):
            if getattr(topology, axis) > 1:
                raise DllmError(
                    f"topology.{axis} > 1 is not handled by the data-parallel trainer",
                    hint="this version trains with dp/fsdp only",
                )
        return cls(topology.dp, topology.fsdp, world_size)

    @property
    def dp_size(self) -> int:
        return self.dp_replicate * self.dp_shard

    def build_mesh(self, device_type: str):
        """The 2-D data-parallel mesh, or None for a single process."""
        if self.world_size == 1:
            return None
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(
            device_type,
            (self.dp_replicate, self.dp_shard),
            mesh_dim_names=("dp_replicate", "dp_shard"),
        )


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
