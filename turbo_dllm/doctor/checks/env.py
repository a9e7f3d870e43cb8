"""Environment checks (orders 200-299): does this Python environment match its manifest?

Drift is a warning for smoke and profile runs (a newer numpy rarely breaks a smoke test) and a
failure for `kind: prod`, whose run manifests promise the exact package set.
"""

from __future__ import annotations

import shlex
import sys

from turbo_dllm.doctor import CheckResult, DoctorContext, register_check
from turbo_dllm.doctor.host import unreadable_fingerprint
from turbo_dllm.errors import DllmError

NAME = "environment"


@register_check(order=200, name="environment")
def environment_manifest(ctx: DoctorContext) -> CheckResult:
    from turbo_dllm.envs.check import compare, drift_fixes
    from turbo_dllm.envs.incomplete import refuse_incomplete
    from turbo_dllm.envs.inventory import inspect_environment
    from turbo_dllm.envs.select import COMPARE_WITH_ANOTHER, SYNCED_COPY, recorded_manifest_path
    from turbo_dllm.envs.select import environment_manifest as find_manifest

    bad = "fail" if ctx.prod else "warn"
    try:  # a venv whose sync was killed midway: packages may be half-written, whatever the kind
        refuse_incomplete(sys.prefix)
    except DllmError as error:
        return CheckResult(NAME, "fail", error.message, fix=error.hint)
    try:
        manifest, origin = find_manifest()
    except DllmError as error:
        # chosen by this host's fingerprint, unreadable: the fingerprint check says so
        skipped = unreadable_fingerprint(ctx, NAME, caused=error)
        if skipped is not None:
            return skipped
        # The reasons follow on indented lines ("  cpu-x86_64: gpus: host sm80, ..."): keep them
        # (the first line alone ends in a colon), on the one line a check has.
        lines = [line.strip() for line in error.message.splitlines() if line.strip()]
        fix = error.hint or "dllm env sync --target TARGET --venv .venv"
        if fix.startswith("pass --target NAME"):  # `dllm env check`'s flag: doctor has none
            fix = (
                "dllm env check --target NAME compares with a named manifest (dllm env list); "
                "a venv made by dllm env sync --target NAME --venv .venv is checked against "
                "it" + fix.removeprefix("pass --target NAME")
            )
        # (a damaged synced copy's hint ends so; doctor has neither flag)
        fix = fix.replace(
            COMPARE_WITH_ANOTHER,
            "compare with another manifest: dllm env check --target NAME (or --manifest FILE)",
        )
        return CheckResult(
            NAME,
            bad,
            "no environment manifest to compare with: "
            + " ".join(lines[:1] + [" | ".join(lines[1:])]).strip(),
            fix=fix,
        )
    environment = inspect_environment()
    drift = compare(manifest, environment)
    short = manifest.content_sha256()[:12]
    if drift.clean:
        return CheckResult(NAME, "pass", f"{drift.summary()} ({short}, {origin})")
    # A synced venv is compared with the copy sync left in it: re-sync exactly that copy (the
    # packaged manifest of this target may be another one, or none: a mirror's, a file's).
    synced = origin.startswith(SYNCED_COPY)
    source = (
        f"--manifest {shlex.quote(str(recorded_manifest_path(sys.prefix)))}"
        if synced
        else f"--target {manifest.target}"
    )
    fixes = drift_fixes(manifest, drift, environment, sync_source=source)
    for i, fix in enumerate(fixes):
        if fix.startswith("dllm env sync"):
            fixes[i] = f"{fix} (add --mirror DIR|URL --offline on an air-gapped host)"
            if not (drift.missing or drift.mismatched):  # only packages the manifest does not pin
                fixes[i] = (
                    f"every pinned package matches; {fixes[i]} makes the venv exactly the "
                    "manifest and uninstalls the extras (development tools such as pytest too)"
                )
    fix = "; ".join(fixes) + "; details: dllm env check"
    return CheckResult(NAME, bad, f"{drift.summary()} ({short}, {origin})", fix=fix)
