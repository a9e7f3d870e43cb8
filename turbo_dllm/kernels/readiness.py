"""Can this host run a RunSpec's kernels? One function for doctor, the launcher and workers.

`require_kernels(spec)` raises a DllmError whose hint is the command that fixes it:
`kernels: native` needs an active bundle that fits the host (and, with `load=True`, whose ops
load into this process); `kernels: jit` needs ninja and a C++ compiler; `kernels: reference`
always runs. There is no fallback from native to reference.
"""

from __future__ import annotations

import shutil
from typing import Any

from turbo_dllm.errors import DllmError

__all__ = ["require_kernels"]


def _kind(spec_or_kind: Any) -> str:
    return spec_or_kind if isinstance(spec_or_kind, str) else spec_or_kind.kernels


def require_kernels(spec_or_kind: Any, *, load: bool = False, fingerprint=None) -> str:
    """Raise unless the kernels the spec asks for can run here; returns a one-line summary.

    `fingerprint` defaults to `collect_fingerprint()` (DLLM_OVERRIDE_* applied, so a login node
    can check for its compute nodes); `load=True` also loads every op into this process, which
    checks the real process (torch ABI, GPUs) without overrides.
    """
    kind = _kind(spec_or_kind)
    if kind == "reference":
        return "reference kernels (pure torch): nothing to install"
    if kind == "jit":
        from torch.utils.cpp_extension import get_cxx_compiler, is_ninja_available

        if not is_ninja_available():
            raise DllmError("kernels: jit needs ninja to build the ops", hint="pip install ninja")
        compiler = get_cxx_compiler()
        if shutil.which(compiler) is None:
            raise DllmError(
                f"kernels: jit needs a C++ compiler, {compiler!r} was not found",
                hint="install g++ (e.g. apt-get install g++) or set CXX",
            )
        return f"jit: builds ops from source with {compiler} + ninja on first use"
    if kind != "native":
        raise ValueError(f"unknown kernels setting {kind!r}")

    from turbo_dllm.bundles.store import active_bundle
    from turbo_dllm.host import collect_fingerprint
    from turbo_dllm.kernels.loader import install_command, load_bundle_op

    bundle = active_bundle()
    if bundle is None:
        raise DllmError(
            "the RunSpec asks for `kernels: native`, but no kernel bundle is installed",
            hint=f"{install_command()}   (or set `kernels: reference`)",
        )
    host = fingerprint or collect_fingerprint()
    differences = bundle.target.differences(host)
    if differences:
        raise DllmError(
            f"the RunSpec asks for `kernels: native`, but the active bundle {bundle.bundle_id} "
            "does not fit this host: " + "; ".join(map(str, differences)),
            hint=install_command(),
        )
    if load:
        loaded = [load_bundle_op(op.name) for op in bundle.manifest.ops]
        names = ", ".join(op.name for op in loaded)
        return f"loaded {names} from {bundle.bundle_id} ({bundle.short_sha})"
    return f"{bundle.bundle_id} ({bundle.short_sha}) fits this host"
