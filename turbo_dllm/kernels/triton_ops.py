"""Triton ops: import an op's Triton source (shipped or from the bundle) under its source hash.

A Triton op's spec (`native/<op>/op.toml`) lists `triton_sources`; the first is the module the
op runs. Two places provide it: `jit` imports the file this turbo-dllm ships (Triton compiles
its kernels on first launch, into Triton's own cache), `native` imports the copy in the active
bundle, after the loader checked that bundle's target, the op's source hash and the file's bytes.
Each copy becomes its own module, named by its source hash, so it is imported once per process.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType

from turbo_dllm.errors import DllmError

__all__ = ["import_triton_source", "triton_module"]

_LOCK = threading.Lock()
_SEEDED: set[str] = set()


def import_triton_source(path: Path, op: str, source_sha256: str) -> ModuleType:
    """Import the Triton module at `path` as `turbo_dllm_triton_<op>_<sha12>` (cached)."""
    name = f"turbo_dllm_triton_{op}_{source_sha256[:12]}"
    with _LOCK:
        module = sys.modules.get(name)
        if module is not None:
            return module
        try:
            import triton  # noqa: F401
        except ImportError:
            raise DllmError(
                f"op {op!r} is written in Triton, which is not installed",
                hint="install the torch build's triton (pip install triton)",
            ) from None
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise DllmError(f"cannot import the Triton source {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and triton.jit look the module up by name
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module


def triton_module(op: str, backend: str) -> ModuleType:
    """The module of Triton op `op` for `backend` ('native': the active bundle; 'jit': shipped)."""
    from turbo_dllm.bundles.native import load_native_op

    if backend == "jit":
        native = load_native_op(op)
        if not native.spec.triton_sources:
            raise DllmError(f"op {op!r} has no Triton source")
        return import_triton_source(native.triton_source_paths()[0], op, native.source_sha256())
    if backend == "native":
        from turbo_dllm.kernels.loader import load_bundle_triton_op, seed_compiled_kernels

        path, source_sha = load_bundle_triton_op(op)
        module = import_triton_source(Path(path), op, source_sha)
        with _LOCK:
            if op not in _SEEDED:  # once per process: the bundle's compiled kernels, if any
                seed_compiled_kernels(op)
                _SEEDED.add(op)
        return module
    raise ValueError(f"unknown kernel backend {backend!r} (expected reference, native or jit)")
