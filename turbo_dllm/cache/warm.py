"""`dllm cache pack --warm`: run a spec's first training step to fill fresh compile caches.

The step runs in a child process (`dllm train`, under torchrun when the topology needs several
ranks) whose DLLM_COMPILE_CACHE points at an empty folder, so the pack holds exactly what this
recipe compiles and nothing else the user's cache happens to have.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from turbo_dllm.errors import DllmError

__all__ = ["warm_caches"]


def warm_caches(config: Path, overrides: list[str], root: Path, world_size: int) -> Path:
    """Train one step of `config` with its compile caches under `root`; returns the toolchain
    folder holding `inductor/` and `triton/`."""
    # One step; what only shapes later steps (the warm-up length, checkpoints) must allow it.
    step = ["train", "--config", str(config)]
    for override in [*overrides, "training.steps=1", "scheduler.warmup_steps=0"]:
        step += ["--set", override]
    args = [*step, "--run-dir", str(root / "run")]
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
        # The step's own command, quoted: the hint named only training.steps=1, so it dropped
        # the user's --set overrides and failed on any spec with a warm-up ("scheduler.
        # warmup_steps: 5 exceeds training.steps (1)") instead of showing the step's problem.
        raise DllmError(
            f"the warm-up step of {config} failed (exit {proc.returncode})",
            hint=f"run `{shlex.join(['dllm', *step])}` to see why",
        )
    cache = root / "cache"
    folders = [p for p in cache.iterdir() if p.is_dir()] if cache.is_dir() else []
    if len(folders) > 1:
        raise DllmError(f"the warm-up step left {len(folders)} compile caches in {cache}")
    # Importing torch._dynamo makes the toolchain folder (and its inductor/) whether or not
    # anything compiles: an empty one went on to "the compile caches are empty (<a deleted
    # temp folder>): nothing to pack", hinting to pass the --warm just given.
    if not folders or not any(path.is_file() for path in folders[0].rglob("*")):
        raise DllmError(
            f"the warm-up step of {config} compiled nothing: no pack to make",
            hint="on CPU only training.compile: true compiles (add --set training.compile=true)",
        )
    return folders[0]
