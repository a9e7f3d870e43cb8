"""Where torch.compile keeps what it built: one cache per toolchain, under the dllm home.

A cold compile of a Qwen3-1.7B-shaped model's layers (inductor's kernels, FlexAttention's forward
and backward) made the first step take 180-230 s on an H200 host; a warm cache skips most of it.
Left alone, inductor writes to /tmp/torchinductor_<user> (wiped with /tmp, on many clusters at
the end of every job) and Triton to ~/.triton/cache (often a shared home, where concurrent
compiles from several nodes are known to break). Workers therefore point both at
`<dllm home>/compile-cache/<toolchain>/`, or at `$DLLM_COMPILE_CACHE/<toolchain>/` (say,
node-local scratch), unless the user set the variables themselves.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from turbo_dllm.errors import DllmError
from turbo_dllm.paths import dllm_home

__all__ = [
    "COMPILE_CACHE_VARIABLE",
    "INDUCTOR_CACHE_VARIABLE",
    "TRITON_CACHE_VARIABLE",
    "cache_size_bytes",
    "compile_cache_dir",
    "prepare_compile_cache",
    "toolchain_key",
    "use_compile_cache",
]

COMPILE_CACHE_VARIABLE = "DLLM_COMPILE_CACHE"
INDUCTOR_CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"
TRITON_CACHE_VARIABLE = "TRITON_CACHE_DIR"


def toolchain_key() -> str:
    """torch, Triton and Python versions as one folder name (what a compiled artifact depends on
    beyond the code and the GPU, both of which the caches key on themselves)."""
    import importlib.metadata

    import torch

    triton = "none"
    for dist in ("triton", "pytorch-triton"):
        try:
            triton = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    key = f"torch-{torch.__version__}_triton-{triton}_{py}"
    return re.sub(r"[^A-Za-z0-9._-]", "_", key)


def compile_cache_dir() -> Path:
    """`$DLLM_COMPILE_CACHE/<toolchain>` if set, else `<dllm home>/compile-cache/<toolchain>`."""
    root = os.environ.get(COMPILE_CACHE_VARIABLE)
    base = Path(root).expanduser() if root else dllm_home() / "compile-cache"
    return base / toolchain_key()


def prepare_compile_cache() -> dict[str, str]:
    """The two cache variables a worker will use (the user's own where set, else ours), with
    their folders created (a DllmError when they cannot be)."""
    folder = compile_cache_dir()
    defaults = {
        INDUCTOR_CACHE_VARIABLE: folder / "inductor",
        TRITON_CACHE_VARIABLE: folder / "triton",
    }
    settings = {name: os.environ.get(name) or str(path) for name, path in defaults.items()}
    for name, path in settings.items():
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
        except OSError as error:
            hint = (  # the user's own variable wins over ours: it is the one to change
                f"set {name} to a writable folder, or unset it to use {COMPILE_CACHE_VARIABLE}"
                if os.environ.get(name)
                else f"set {COMPILE_CACHE_VARIABLE} to a writable folder (or "
                f"{INDUCTOR_CACHE_VARIABLE} and {TRITON_CACHE_VARIABLE} yourself)"
            )
            raise DllmError(
                f"the compile cache {path} cannot be created: {error}", hint=hint
            ) from None
    return settings


def use_compile_cache() -> dict[str, str]:
    """Point this process's inductor and Triton caches at `prepare_compile_cache()`. Call before
    anything compiles. Returns the two settings in effect."""
    settings = prepare_compile_cache()
    os.environ.update(settings)
    return settings


def cache_size_bytes(folder: Path) -> int:
    """Bytes of the regular files under `folder` (0 when it does not exist)."""
    if not folder.is_dir():
        return 0
    return sum(entry.stat().st_size for entry in folder.rglob("*") if entry.is_file())
