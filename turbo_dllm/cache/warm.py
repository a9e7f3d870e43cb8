"""`dllm cache pack --warm`: run a spec's first training step to fill fresh compile caches.

The step runs in a child process (`dllm train`, under torchrun when the topology needs several
ranks) whose DLLM_COMPILE_CACHE points at an empty folder, so the pack holds exactly what this
recipe compiles and nothing else the user's cache happens to have.

The folder (`warm_folder`: a run dir and the caches) is named by host and process and removed on
the way out, SIGTERM included (`dllm cache pack` unwinds on it); one whose pack was killed
outright (SIGKILL, out of memory) is removed by the next `--warm` on that host. The step dies
with its pack (PR_SET_PDEATHSIG): it trained on, orphaned, holding its GPU for minutes and
writing a checkpoint of the model into a folder nothing would remove.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from turbo_dllm.errors import DllmError

__all__ = ["warm_caches", "warm_folder"]

_WARM = "dllm-warm-"


@contextmanager
def warm_folder() -> Iterator[Path]:
    """A scratch folder for the warm-up step in TMPDIR, removed on exit; first the ones packs
    killed outright on this host left."""
    from turbo_dllm.fsutil import owned_prefix, sweep_orphans

    scratch = Path(tempfile.gettempdir())
    sweep_orphans(scratch, _WARM)
    with tempfile.TemporaryDirectory(prefix=owned_prefix(_WARM)) as tmp:
        yield Path(tmp)


def _command(args: list[str], world_size: int) -> list[str]:
    """The warm-up step's command line: `dllm train ARGS`, under torchrun for several ranks."""
    if world_size > 1:
        return [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={world_size}", "-m", "turbo_dllm", *args,
        ]  # fmt: skip
    return [sys.executable, "-m", "turbo_dllm", *args]


def _dies_with_parent() -> None:
    """In the step's process, before exec: SIGKILL it when the pack ends (Linux)."""
    if sys.platform != "linux":
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def warm_caches(config: Path, overrides: list[str], root: Path, world_size: int) -> Path:
    """Train one step of `config` with its compile caches under `root`; returns the toolchain
    folder holding `inductor/` and `triton/`."""
    # One step; what only shapes later steps (the warm-up length, checkpoints) must allow it.
    step = ["train", "--config", str(config)]
    for override in [*overrides, "training.steps=1", "scheduler.warmup_steps=0"]:
        step += ["--set", override]
    command = _command([*step, "--run-dir", str(root / "run")], world_size)
    env = {**os.environ, "DLLM_COMPILE_CACHE": str(root / "cache")}
    for variable in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        env.pop(variable, None)  # ours, fresh: not the user's
    # An exception here (Ctrl-C, SIGTERM's unwinding) kills the step before `root` goes.
    proc = subprocess.run(command, env=env, stdout=sys.stderr, preexec_fn=_dies_with_parent)
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
