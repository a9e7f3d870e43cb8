"""`train(spec, run_dir, layout)`: the same in one process and on every rank under torchrun.

A launched job's workers call it from `turbo_dllm.jobs.worker` with the plan's layout; `dllm
train` calls it in-process (or on every rank of a hand-written torchrun) with the spec's own.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["resolve_run_dir", "train", "world_size_from_env"]


def world_size_from_env() -> int:
    """torchrun's WORLD_SIZE (1 without it); anything but a positive count is a user error here,
    not a layout that fails to fit later."""
    raw = os.environ.get("WORLD_SIZE", "1")
    try:
        world = int(raw)
    except ValueError:
        world = 0
    if world < 1:
        from turbo_dllm.errors import DllmError

        raise DllmError(
            f"WORLD_SIZE={raw!r} is not a process count",
            hint="torchrun sets WORLD_SIZE; unset it to train in one process",
        )
    return world


def resolve_run_dir(spec, requested: str | Path | None) -> Path:
    """--run-dir, else launch.run_dir, else a fresh runs/<stamp>-<id> agreed by all ranks."""
    if requested is not None:
        return Path(requested).absolute()
    if spec.launch.run_dir is not None:
        return Path(spec.launch.run_dir)
    from turbo_dllm.paths import new_run_dir

    if world_size_from_env() == 1:
        return new_run_dir().absolute()
    import torch.distributed as dist

    from turbo_dllm.train.distributed import init_distributed

    env = init_distributed()
    chosen = [str(new_run_dir().absolute()) if env.is_main else None]
    dist.broadcast_object_list(chosen, src=0)
    return Path(chosen[0])


def train(spec, run_dir: str | Path, layout=None) -> int:
    """Train `spec` (a validated RunSpec) into `run_dir` with `layout` (default: the spec's
    topology as a `ParallelLayout`); returns the exit code (0)."""
    import torch.distributed as dist

    from turbo_dllm.train.distributed import init_distributed
    from turbo_dllm.train.trainer import Trainer

    env = init_distributed()
    try:
        return Trainer(spec, run_dir, env, layout=layout).build().run()
    finally:
        if env.distributed and dist.is_initialized():
            dist.destroy_process_group()
