"""`dllm cache pack --warm`: run a spec's first training step to fill fresh compile caches.

The step runs in a child process (`dllm train`, under torchrun when the topology needs several
ranks) whose DLLM_COMPILE_CACHE points at an empty folder, so the pack holds exactly what this
recipe compiles and nothing else the user's cache happens to have.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from turbo_dllm.errors import DllmError

__all__ = ["warm_caches"]


def warm_caches(config: Path, overrides: list[str], root: Path, world_size: int) -> Path:
    """Train one step of `config` with its compile caches under `root`; returns the toolchain
    folder holding `inductor/` and `triton/`."""
    args = ["train", "--config", str(config), "--run-dir", str(root / "run")]
    # One step; what only shapes later steps (the warm-up length, checkpoints) must allow it.
    for override in [*overrides, "training.steps=1", "scheduler.warmup_steps=0"]:
        args += ["--set", override]
    if world_size > 1:
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={world_size}", "-m", "turbo_dllm", *args,
        ]  # fmt: skip
    else:
        command = [sys.executable, "-m", "turbo_dllm", *args]
    env = {**os.environ, "DLLM_COMPILE_CACHE": str(root / "cache")}
    for variable in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        env.pop(variable, None)  # ours, fresh: not the user's
    proc = subprocess.run(command, env=env, stdout=sys.stderr)
    if proc.returncode != 0:
        raise DllmError(
            f"the warm-up step of {config} failed (exit {proc.returncode})",
            hint=f"run `dllm train --config {config} --set training.steps=1` to see why",
        )
    cache = root / "cache"
    folders = [p for p in cache.iterdir() if p.is_dir()] if cache.is_dir() else []
    if not folders:
        raise DllmError(
            f"the warm-up step of {config} compiled nothing",
            hint="nothing compiles on CPU unless training.compile is true",
        )
    if len(folders) != 1:
        raise DllmError(f"the warm-up step left {len(folders)} compile caches in {cache}")
    return folders[0]
