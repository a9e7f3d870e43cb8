"""Resolve which loaded library serves an op for a backend and device.

Kept apart from the package `__init__` because it imports torch: resolution reads the bundle
store (files, symlinks), which torch.compile cannot trace, so it is marked
`assume_constant_result` and runs once at trace time; the compiled graph then calls the op
directly.
"""

from __future__ import annotations

import torch

from turbo_dllm.errors import DllmError

__all__ = ["resolve_namespace"]


@torch.compiler.assume_constant_result
def resolve_namespace(op: str, backend: str, device: str) -> str:
    """The torch.ops namespace holding `op` for `backend` on `device` (loading it if needed)."""
    if backend == "native":
        from turbo_dllm.kernels.loader import install_command, load_bundle_op

        loaded = load_bundle_op(op)
        if device not in loaded.devices:
            raise DllmError(
                f"the active bundle {loaded.bundle_id} has no {device} kernel for {op}",
                hint=f"install the bundle for this host's GPUs: {install_command()}",
            )
        return loaded.namespace
    if backend == "jit":
        from turbo_dllm.kernels.jit import load_jit_op

        return load_jit_op(op, cuda=device == "cuda")
    raise ValueError(f"unknown kernel backend {backend!r} (expected reference, native or jit)")
