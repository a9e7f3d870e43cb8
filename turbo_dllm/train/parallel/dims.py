"""The device meshes of a run's parallel layout (`turbo_dllm.config.topology.ParallelLayout`).

The layout (degrees, rules, rank coordinates; torch-free) is decided before any worker starts and
reaches the worker in its job plan; this module only builds the meshes it describes.

Flattened meshes answer the questions the trainer asks:
  "dp"           (dp_replicate, dp_shard)                  which batch a rank reads
  "context"      (clean_replica, cp)                       which ranks share a sequence
  "dp_shard_ctx" (dp_shard, clean_replica, cp)             FSDP2 shards parameters here
  "loss"         (dp_replicate, dp_shard, clean_replica, cp) global token counts, loss sums
  "fsdp"         2-D (dp_replicate, dp_shard_ctx): what `build_mesh` returns for FSDP2 / HSDP
  "tp"           the tensor-parallel group (tp > 1): ranks that split each layer's matmuls

With tp > 1 the "fsdp" and "tp" meshes are slices of one (dp_replicate, dp_shard_ctx, tp) mesh,
so FSDP2's data-parallel placements compose with the tensor-parallel ones into 2-D DTensors. The
ranks of a tp group hold identical losses: reductions over ranks use `loss_group()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from turbo_dllm.config.topology import MESH_DIMS, ContextMode, ParallelLayout
from turbo_dllm.errors import DllmError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from turbo_dllm.config.runspec import TopologySpec

__all__ = ["MESH_DIMS", "ContextMode", "ParallelDims"]

_FLATTENED: dict[str, tuple[str, ...]] = {
    "dp": ("dp_replicate", "dp_shard"),
    "context": ("clean_replica", "cp"),
    "dp_shard_ctx": ("dp_shard", "clean_replica", "cp"),
    "loss": ("dp_replicate", "dp_shard", "clean_replica", "cp"),
}


@dataclass
class ParallelDims:
    """Degrees of every parallel axis; `build_mesh` turns them into a named DeviceMesh."""

    dp_replicate: int
    dp_shard: int
    cp: int
    bp: int
    tp: int
    world_size: int
    ep: int = 1  # expert parallel: groups of ep neighbouring data-parallel ranks
    _meshes: dict[str, DeviceMesh] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        found = [message for _, message in self.layout.problems(self.world_size)]
        if found:
            raise DllmError(
                "invalid parallel layout: " + "; ".join(found),
                hint="see docs/parallelism.md for the supported cp/bp/dp combinations",
            )

    @property
    def layout(self) -> ParallelLayout:
        return ParallelLayout(
            dp=self.dp_replicate, fsdp=self.dp_shard, cp=self.cp, bp=self.bp, tp=self.tp, ep=self.ep
        )

    @classmethod
    def from_layout(cls, layout: ParallelLayout, world_size: int) -> ParallelDims:
        return cls(
            dp_replicate=layout.dp,
            dp_shard=layout.fsdp,
            cp=layout.cp,
            bp=layout.bp,
            tp=layout.tp,
            world_size=world_size,
            ep=layout.ep,
        )

    @classmethod
    def from_topology(cls, topology: TopologySpec, world_size: int) -> ParallelDims:
        return cls.from_layout(ParallelLayout.from_topology(topology), world_size)

    # --- derived degrees (the layout's) -------------------------------------------------------
    @property
    def context(self) -> int:
        return self.layout.context

    @property
    def clean_replica(self) -> int:
        return self.layout.clean_replica

    @property
    def mode(self) -> ContextMode:
        return self.layout.mode

    @property
    def dp_size(self) -> int:
        return self.layout.dp_size

    @property
    def grad_average_size(self) -> int:
        """Ranks FSDP averages gradients over (every rank but tensor-parallel peers).

        Each rank's loss covers only its share of the scored tokens, so the trainer scales its
        loss by this to turn FSDP's average into the sum the single-rank gradient is.
        """
        return self.dp_replicate * self.dp_shard * self.context

    @property
    def dp_rank(self) -> int:
        """Which batch this rank reads: ranks of one context group share it."""
        if "dp" in self._meshes:
            return self._meshes["dp"].get_local_rank()
        if "fsdp" in self._meshes:  # data parallelism only: the rank's place in the 2-D mesh
            replica, shard = self._meshes["fsdp"].get_coordinate()
            return replica * self.dp_shard + shard
        return 0

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return self.layout.mesh_shape

    # --- mesh ---------------------------------------------------------------------------------
    def build_mesh(self, device_type: str) -> DeviceMesh | None:
        """Create the meshes (needs torch.distributed initialised).

        Returns the mesh FSDP2 shards over: 2-D (dp_replicate, dp_shard_ctx), HSDP when both are
        > 1; None for one process, and with tensor parallelism alone (no rank to shard over).
        The world mesh and every named group are then available from `get_mesh`.
        """
        if self.world_size == 1:
            return None
        from torch.distributed.device_mesh import init_device_mesh

        if self.tp == 1 and self.mode == "none":  # data parallelism only: one 2-D mesh
            fsdp = init_device_mesh(
                device_type,
                (self.dp_replicate, self.dp_shard),
                mesh_dim_names=("dp_replicate", "dp_shard"),
            )
            self._meshes = {"fsdp": fsdp, "world": fsdp}
            if self.ep > 1:
                self._meshes.update(self._expert_meshes(device_type))
            return fsdp
        world = init_device_mesh(device_type, self.mesh_shape, mesh_dim_names=MESH_DIMS)
        meshes: dict[str, DeviceMesh] = {"world": world}
        for name in MESH_DIMS:
            meshes[name] = world[name]
        for name, dims in _FLATTENED.items():
            meshes[name] = world[dims]._flatten(name)
        if self.tp > 1:
            # FSDP2 composes its placements with the tensor-parallel ones only when both meshes
            # share one root: a 3-D (dp_replicate, dp_shard_ctx, tp) mesh (same rank groups as
            # the world mesh) gives both, without slicing flattened dimensions.
            dp_tp = init_device_mesh(
                device_type,
                (self.dp_replicate, self.dp_shard * self.context, self.tp),
                mesh_dim_names=("dp_replicate", "dp_shard_ctx", "tp"),
            )
            meshes["fsdp"] = dp_tp[("dp_replicate", "dp_shard_ctx")]
            meshes["tp"] = dp_tp["tp"]
            self._meshes = meshes
            return meshes["fsdp"] if self.grad_average_size > 1 else None
        # With tp == 1 the ranks of (dp_shard, clean_replica, cp) are consecutive, so a fresh
        # 2-D mesh has the same groups as the flattened view, without slicing flattened dims.
        meshes["fsdp"] = init_device_mesh(
            device_type,
            (self.dp_replicate, self.dp_shard * self.context),
            mesh_dim_names=("dp_replicate", "dp_shard_ctx"),
        )
        if self.ep > 1:  # (cp/bp: the layout allows ep with any tp == 1 layout)
            meshes.update(self._expert_meshes(device_type))
        self._meshes = meshes
        return meshes["fsdp"]

    def _expert_meshes(self, device_type: str) -> dict[str, DeviceMesh]:
        """ep: groups of ep neighbouring ranks (tp == 1: every rank), ep_replica: the ranks
        holding the same experts."""
        import torch
        from torch.distributed.device_mesh import DeviceMesh

        ranks = torch.arange(self.world_size).view(self.world_size // self.ep, self.ep)
        mesh = DeviceMesh(device_type, ranks, mesh_dim_names=("ep_replica", "ep"))
        return {"ep": mesh["ep"], "ep_replica": mesh["ep_replica"]}

    def get_mesh(self, name: str) -> DeviceMesh:
        """The mesh of axis or flattened group `name`; raises if unknown or not built."""
        if not self._meshes:
            raise RuntimeError("ParallelDims.build_mesh() has not been called")
        if name not in self._meshes:
            raise KeyError(f"no mesh named {name!r} (known: {', '.join(sorted(self._meshes))})")
        return self._meshes[name]

    def loss_group(self):
        """Process group for sums over ranks that count each tp group once (None = world)."""
        if self.tp == 1:
            return None
        return self.get_mesh("loss").get_group()

    def get_optional_mesh(self, name: str) -> DeviceMesh | None:
        """Like `get_mesh`, but None when that group has a single rank (axis not in use)."""
        mesh = self.get_mesh(name)
        return mesh if mesh.size() > 1 else None
