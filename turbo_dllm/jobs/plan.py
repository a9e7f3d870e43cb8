"""JobPlan: everything needed to start a job, decided before any process starts.

A plan is pure data (pydantic, strict): the backend, the process layout (nodes x processes per
node), how processes meet, the device mesh the topology implies, each rank's role, the worker
environment and the exact commands. It is printed by `--dry-run`, embedded in the run manifest,
and read back on replay, so it carries no live objects.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Command", "JobPlan", "MeshAxis", "RankRole", "Rendezvous", "SlurmJob"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MeshAxis(_Strict):
    """One named axis of the device mesh (`config.topology.MESH_DIMS`); the degrees multiply to
    the world size. (Plans before the layout moved into them named dp, fsdp, context, tp.)"""

    name: Literal["dp_replicate", "dp_shard", "clean_replica", "cp", "tp", "dp", "fsdp", "context"]
    degree: int = Field(ge=1)


class RankRole(_Strict):
    """Where a global rank runs and its coordinate on every mesh axis."""

    rank: int
    node_rank: int
    local_rank: int
    coords: dict[str, int]


class Rendezvous(_Strict):
    """How the processes of a job find each other (torch.distributed.run's options)."""

    kind: Literal["none", "standalone", "static", "c10d"]
    endpoint: str | None = None  # host:port of the c10d store or of rank 0
    run_id: str | None = None
    conf: str | None = None  # c10d settings (torchrun --rdzv-conf), e.g. last_call_timeout=5


class Command(_Strict):
    """One command line and where to run it ("this process", "node 0", "every node", ...)."""

    where: str
    argv: list[str]


class SlurmJob(_Strict):
    """The sbatch job: its script in the run dir and the allocation it asks for."""

    script: str
    nodes: str
    gpus_per_node: int
    cpus_per_task: int | None = None
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    stop_warning_s: int | None = Field(
        None,
        description="seconds before the time limit SLURM warns the job's steps (SIGUSR1, "
        "`#SBATCH --signal`), so the workers save the step under way and stop in time; None: "
        "no time limit set",
    )
    extra: list[str] = Field(default_factory=list)
    submit: list[str]


class JobPlan(_Strict):
    backend: Literal["local", "torchrun", "slurm"]
    run_id: str
    run_dir: str
    cwd: str
    device: Literal["cpu", "cuda"]
    dist_backend: Literal["gloo", "nccl"] | None
    nnodes_min: int = Field(ge=1)
    nnodes_max: int = Field(ge=1)
    nproc_per_node: int = Field(ge=1)
    node_rank: int | None
    world_sizes: list[int] = Field(description="every world size the job may run at")
    elastic_axis: Literal["dp", "fsdp"] | None = Field(
        None, description="the data-parallel axis that follows the node count (elastic jobs)"
    )
    layout: dict[str, Any] | None = Field(
        None,
        description="the parallel layout the workers train with (config.topology.ParallelLayout); "
        "elastic jobs resize elastic_axis to the live world size",
    )
    mesh: list[MeshAxis]
    ranks: list[RankRole] | None = Field(
        None, description="per-rank roles; None for elastic jobs (the layout changes)"
    )
    rendezvous: Rendezvous
    max_restarts: int = Field(ge=0)
    env: dict[str, str]
    worker: list[str] = Field(description="the trainer command every worker process runs")
    commands: list[Command]
    slurm: SlurmJob | None = None
    notes: list[str] = Field(default_factory=list)

    @property
    def elastic(self) -> bool:
        return self.nnodes_min != self.nnodes_max

    @property
    def multi_node(self) -> bool:
        """A torchrun job over several nodes: each node's launcher writes into one run dir and
        sees only its own torchrun end."""
        return self.backend == "torchrun" and self.nnodes_max > 1

    @property
    def world_size(self) -> int | None:
        return self.world_sizes[0] if len(self.world_sizes) == 1 else None

    @property
    def nnodes(self) -> str:
        if self.elastic:
            return f"{self.nnodes_min}:{self.nnodes_max}"
        return str(self.nnodes_min)
