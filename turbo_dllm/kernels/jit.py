"""The `jit` backend: build native ops from the shipped sources on first use, cache the build.

For kernel development and hosts without a published bundle (never in prod runs). The cache
lives under `dllm_home()/jit/<op>-<key>`, keyed by the sources, Python, torch and its CUDA build,
C++ ABI and GPU architectures, so an upgrade rebuilds instead of loading a stale library.

Concurrent builds serialize on an flock-based lock with a timeout (released by the kernel when a
holder dies, so a killed build never blocks the next one). torch's own build "baton" file, which
a killed build leaves behind and which makes every later build wait forever, is removed while we
hold our lock: nobody else can be building in that folder then.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from turbo_dllm.errors import DllmError
from turbo_dllm.paths import dllm_home

__all__ = ["JIT_LOCK_TIMEOUT_VARIABLE", "jit_build", "load_jit_op"]

JIT_LOCK_TIMEOUT_VARIABLE = "DLLM_JIT_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT_S = 900.0
_LOCK = threading.Lock()
_CACHE: dict[tuple[str, str], str] = {}


def _lock_timeout() -> float:
    raw = os.environ.get(JIT_LOCK_TIMEOUT_VARIABLE)
    if raw is None:
        return DEFAULT_LOCK_TIMEOUT_S
    try:
        return float(raw)
    except ValueError:
        raise DllmError(
            f"{JIT_LOCK_TIMEOUT_VARIABLE}={raw!r} is not a number of seconds",
            hint=f"set it to seconds (e.g. {JIT_LOCK_TIMEOUT_VARIABLE}=600), or unset it for "
            f"the default ({DEFAULT_LOCK_TIMEOUT_S:g} s)",
        ) from None


def jit_build(name: str, *, cuda: bool = False) -> tuple[str, Path]:
    """(torch.ops namespace, build folder) of the JIT build of `name` for this process."""
    import torch

    from turbo_dllm.bundles.compile import namespace_for
    from turbo_dllm.bundles.native import load_native_op
    from turbo_dllm.host import PythonTag

    source_sha = load_native_op(name).source_sha256()
    identity = "|".join(
        [
            str(PythonTag.running()),
            torch.__version__,
            str(torch.version.cuda),
            str(bool(torch._C._GLIBCXX_USE_CXX11_ABI)),
            "+".join(map(str, _archs(cuda))),
        ]
    )
    key = hashlib.sha256(f"{source_sha}|{identity}".encode()).hexdigest()[:16]
    return namespace_for(source_sha, "jit", identity), dllm_home() / "jit" / f"{name}-{key}"


def _archs(cuda: bool) -> tuple:
    if not cuda:
        return ()
    from turbo_dllm.kernels.loader import process_fingerprint

    archs = process_fingerprint().gpu_archs
    if not archs:
        raise DllmError(
            "kernels: jit with CUDA tensors, but no GPU is visible to nvidia-smi",
            hint="check `nvidia-smi` on this host (the driver, CUDA_VISIBLE_DEVICES), or set "
            "kernels: native (the installed bundle) or reference",
        )
    return archs


def load_jit_op(name: str, *, cuda: bool = False, verbose: bool = False) -> str:
    """Build (or reuse) and load op `name`; returns its torch.ops namespace."""
    import torch
    from filelock import FileLock, Timeout

    from turbo_dllm.bundles.compile import compile_op
    from turbo_dllm.bundles.native import load_native_op
    from turbo_dllm.kernels.ops import register_python_side

    namespace, build_dir = jit_build(name, cuda=cuda)
    with _LOCK:
        if (name, namespace) in _CACHE:
            return namespace
        build_dir.parent.mkdir(parents=True, exist_ok=True)
        timeout = _lock_timeout()
        lock = FileLock(str(build_dir) + ".lock", timeout=timeout)
        try:
            lock.acquire()
        except Timeout:
            raise DllmError(
                f"another process has been building {name} in {build_dir} for over {timeout:g} s",
                hint=f"wait for it, or raise {JIT_LOCK_TIMEOUT_VARIABLE}",
            ) from None
        try:
            (build_dir / "lock").unlink(missing_ok=True)  # torch's baton, stale by now
            if not hasattr(getattr(torch.ops, namespace), name):
                compile_op(
                    load_native_op(name),
                    namespace=namespace,
                    build_dir=build_dir,
                    archs=_archs(cuda),
                    verbose=verbose,
                )
        finally:
            lock.release()
        register_python_side(name, namespace)
        _CACHE[(name, namespace)] = namespace
        return namespace
