"""Environment checks (orders 200-299): does this Python environment match its manifest?

Drift is a warning for smoke and profile runs (a newer numpy rarely breaks a smoke test) and a
failure for `kind: prod`, whose run manifests promise the exact package set.
"""

from __future__ import annotations

import sys

from turbo_dllm.doctor import CheckResult, DoctorContext, register_check
from turbo_dllm.errors import DllmError

NAME = "environment"


@register_check(order=200)
def environment_manifest(ctx: DoctorContext) -> CheckResult:
    from turbo_dllm.envs.check import compare
    from turbo_dllm.envs.inventory import inspect_environment
    from turbo_dllm.envs.select import environment_manifest as find_manifest

    bad = "fail" if ctx.prod else "warn"
    try:
        manifest, origin = find_manifest()
    except DllmError as error:
        return CheckResult(
            NAME,
            bad,
            f"no environment manifest for this host: {error.message.splitlines()[0]}",
            fix=error.hint or "dllm env sync --target TARGET --venv .venv",
        )
    drift = compare(manifest, inspect_environment())
    short = manifest.content_sha256()[:12]
    if drift.clean:
        return CheckResult(NAME, "pass", f"{drift.summary()} ({short}, {origin})")
    venv = sys.prefix if sys.prefix != sys.base_prefix else ".venv"
    sync = (
        f"dllm env sync --target {manifest.target} --venv {venv} "
        "(add --mirror DIR|URL --offline on an air-gapped host)"
    )
    if not (drift.missing or drift.mismatched):  # only packages the manifest does not pin
        fix = (
            f"every pinned package matches; {sync} makes the venv exactly the manifest and "
            "uninstalls the extras (development tools such as pytest too); details: dllm env check"
        )
    else:
        fix = f"{sync}; details: dllm env check"
    return CheckResult(NAME, bad, f"{drift.summary()} ({short}, {origin})", fix=fix)
