"""Can this host run a RunSpec's kernels? One function for doctor, the launcher and workers.

`require_kernels(spec)` raises a DllmError whose hint is the command that fixes it:
`kernels: native` needs an active bundle that fits the host (and, with `load=True`, whose ops
load into this process); `kernels: jit` needs ninja and a C++ compiler; `kernels: reference`
always runs. There is no fallback from native to reference.

`require_attention_kernels(spec)` does the same for `model.attention: turbo`, whose Triton op
comes from the active bundle (or, with `kernels: jit`, from the shipped source).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from turbo_dllm.errors import DllmError

__all__ = ["require_attention_kernels", "require_kernels"]

TURBO_OP = "block_diffusion_attention"
# The op `kernels: native` serves the trainer (kernels.merge_attention_partials).
MERGE_OP = "merge_attention_partials"


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
            # torch builds with $CXX when it is set, whatever else is installed
            chosen = bool(os.environ.get("CXX"))
            raise DllmError(
                f"kernels: jit needs a C++ compiler, {compiler!r}"
                + (" (from CXX)" if chosen else "")
                + " was not found",
                hint="set CXX to a C++ compiler that is installed, or unset it"
                if chosen
                else "install g++ (e.g. apt-get install g++) or set CXX",
            )
        return f"jit: builds ops from source with {compiler} + ninja on first use"
    if kind != "native":
        raise ValueError(f"unknown kernels setting {kind!r}")

    from turbo_dllm.bundles.store import active_bundle
    from turbo_dllm.host import collect_fingerprint
    from turbo_dllm.kernels.loader import install_command, load_bundle_op

    bundle = active_bundle()
    if bundle is None:
        raise _no_active_bundle("`kernels: native`", "`kernels: reference`", fingerprint)
    host = fingerprint or collect_fingerprint()
    differences = bundle.target.differences(host)
    if differences:
        raise DllmError(
            f"the RunSpec asks for `kernels: native`, but the active bundle {bundle.bundle_id} "
            "does not fit this host: " + "; ".join(map(str, differences)),
            hint=install_command(),
        )
    if load:
        # The trainer's op first (a bundle without it cannot serve the run), then the rest.
        wanted = dict.fromkeys((MERGE_OP, *(op.name for op in bundle.manifest.ops)))
        loaded = [load_bundle_op(name) for name in wanted]
        names = ", ".join(op.name for op in loaded)
        return f"loaded {names} from {bundle.bundle_id} ({bundle.short_sha})"
    return f"{bundle.bundle_id} ({bundle.short_sha}) fits this host"


def require_attention_kernels(spec: Any, *, load: bool = False, fingerprint=None) -> str:
    """Raise unless `model.attention: turbo` can run here (a bundle that fits this host and
    holds its op, unless `kernels: jit`); returns a one-line summary. Other backends pass."""
    if spec.model.attention != "turbo":
        return f"model.attention {spec.model.attention}: no kernel bundle needed"
    if spec.kernels == "jit":
        return f"turbo: {TURBO_OP} from the shipped Triton source (kernels: jit)"
    from turbo_dllm.bundles.store import active_bundle
    from turbo_dllm.host import collect_fingerprint
    from turbo_dllm.kernels.loader import install_command, load_bundle_op

    bundle = active_bundle()
    if bundle is None:
        raise _no_active_bundle("`model.attention: turbo`", "`model.attention: flex`", fingerprint)
    differences = bundle.target.differences(fingerprint or collect_fingerprint())
    if differences:
        raise DllmError(
            f"the RunSpec asks for `model.attention: turbo`, but the active bundle "
            f"{bundle.bundle_id} does not fit this host: " + "; ".join(map(str, differences)),
            hint=install_command(),
        )
    op = bundle.manifest.op(TURBO_OP)
    if op is None or "cuda" not in op.devices:
        raise DllmError(
            f"the RunSpec asks for `model.attention: turbo`, but the active bundle "
            f"{bundle.bundle_id} has no GPU kernels for {TURBO_OP}",
            hint=f"install a GPU bundle of this turbo-dllm version: {install_command()}",
        )
    if load:
        load_bundle_op(TURBO_OP)
    return f"turbo: {TURBO_OP} from {bundle.bundle_id} ({bundle.short_sha})"


def _no_active_bundle(asks: str, instead: str, fingerprint) -> DllmError:
    """The error for a RunSpec that `asks` for the bundle's kernels where none is active: one
    installed but not active (e.g. after `dllm bundle deactivate`) is named with its fix."""
    from turbo_dllm.host import collect_fingerprint
    from turbo_dllm.kernels.loader import inactive_bundles, install_command

    inactive = inactive_bundles(fingerprint=fingerprint or collect_fingerprint)
    if inactive is not None:
        return DllmError(
            f"the RunSpec asks for {asks}, but no kernel bundle is active: " + inactive.detail,
            hint=inactive.hint(f"or set {instead}"),
        )
    return DllmError(
        f"the RunSpec asks for {asks}, but no kernel bundle is installed",
        hint=f"{install_command()}   # or set {instead}",
    )
