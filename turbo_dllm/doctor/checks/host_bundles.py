"""Host and kernel checks (orders 100-199): fingerprint, active bundle, kernels for the spec."""

from __future__ import annotations

import os
import shlex

from turbo_dllm.doctor import CheckResult, DoctorContext, register_check
from turbo_dllm.doctor.host import host_fingerprint as _fingerprint
from turbo_dllm.doctor.host import unreadable_fingerprint
from turbo_dllm.errors import DllmError


def _wants(ctx: DoctorContext) -> str | None:
    return ctx.spec.kernels if ctx.spec is not None else None


@register_check(order=100, name="fingerprint")
def host_fingerprint(ctx: DoctorContext) -> CheckResult:
    try:
        fingerprint = _fingerprint(ctx)
    except DllmError as error:
        return CheckResult(
            "fingerprint", "fail", error.message, fix=error.hint or "fix DLLM_OVERRIDE_*"
        )
    detail = fingerprint.summary()
    if fingerprint.driver:
        detail += f", driver {fingerprint.driver}"
    unknown = _unknown_overrides()
    if unknown:  # a misspelt name: the fingerprint ignores it, without a word
        from turbo_dllm.host.fingerprint import OVERRIDE_VARIABLES

        meant = _meant(unknown)
        return CheckResult(
            "fingerprint",
            "warn",
            f"{detail}; {', '.join(unknown)}: no such DLLM_OVERRIDE_* variable (ignored)",
            fix=f"`unset {' '.join(unknown)}`"
            + (f", and `export {' '.join(meant)}` if that is the variable meant" if meant else "")
            + f" (dllm reads {', '.join(OVERRIDE_VARIABLES)})",
        )
    if fingerprint.overrides:
        from turbo_dllm.host.fingerprint import OVERRIDE_VARIABLES

        set_here = [name for name in OVERRIDE_VARIABLES if name in os.environ]
        return CheckResult(
            "fingerprint",
            "warn",
            f"{detail} (overridden: {', '.join(fingerprint.overrides)})",
            fix=f"unset {' '.join(set_here)} to check the real host",
        )
    if fingerprint.notes:
        return CheckResult(
            "fingerprint",
            "warn",
            f"{detail}; {'; '.join(fingerprint.notes)}",
            fix="check the NVIDIA driver (`nvidia-smi` must work) and the torch installation",
        )
    return CheckResult("fingerprint", "pass", detail)


def _unknown_overrides() -> list[str]:
    """The DLLM_OVERRIDE_* variables set here that the fingerprint does not read."""
    from turbo_dllm.host.fingerprint import OVERRIDE_VARIABLES

    return sorted(
        name
        for name in os.environ
        if name.startswith("DLLM_OVERRIDE_") and name not in OVERRIDE_VARIABLES
    )


def _meant(unknown: list[str]) -> list[str]:
    """`NAME=value` of the variable each unknown one was likely meant to be (..._GPU: _GPUS),
    where that one is not set already."""
    import difflib

    from turbo_dllm.host.fingerprint import OVERRIDE_VARIABLES

    meant: dict[str, str] = {}
    for name in unknown:
        close = difflib.get_close_matches(name, list(OVERRIDE_VARIABLES), n=1, cutoff=0.8)
        if close and close[0] not in os.environ:
            meant.setdefault(close[0], os.environ[name])
    return [f"{name}={shlex.quote(value)}" for name, value in meant.items()]


def _bundle_asked_for(ctx: DoctorContext) -> str | None:
    """What in the RunSpec needs an active bundle that fits: `kernels: native`, or
    `model.attention: turbo` on GPUs (its op comes from the bundle unless `kernels: jit`; on a
    host without GPUs no bundle helps, the attention backend check says so). It said "not
    needed for `kernels: reference`" where the attention backend check failed for no bundle."""
    if ctx.spec is None:
        return None
    if ctx.spec.kernels == "native":
        return "`kernels: native`"
    if ctx.spec.model.attention == "turbo" and ctx.spec.kernels != "jit":
        from turbo_dllm.doctor.checks.train import turbo_on_gpus

        if turbo_on_gpus(ctx):
            return "`model.attention: turbo`"
    return None


@register_check(order=110)
def kernel_bundle(ctx: DoctorContext) -> CheckResult:
    from turbo_dllm.bundles.store import active_bundle

    asked = _bundle_asked_for(ctx)
    wants_bundle = asked is not None
    try:
        bundle = active_bundle()
    except DllmError as error:
        return CheckResult(
            "kernel bundle",
            "fail" if wants_bundle else "warn",
            error.message,
            fix=error.hint or _install_fix(),
        )
    skipped = unreadable_fingerprint(ctx, "kernel bundle")
    if skipped is not None:
        return skipped
    fingerprint = _fingerprint(ctx)
    if bundle is None:
        blocked = _blocked_store()
        if blocked is not None:  # `dllm bundle install` could not make the store there
            return CheckResult(
                "kernel bundle",
                "fail" if wants_bundle else "warn",
                f"none installed, and none can be: {blocked[0]}",
                fix=blocked[1],
            )
        from turbo_dllm.kernels.loader import inactive_bundles

        # `dllm bundle deactivate` keeps the bundle installed: say so, and how to re-activate it
        inactive = inactive_bundles(fingerprint=fingerprint)
        if wants_bundle:
            asks = f"but the config asks for {asked}"
            if inactive is None:
                return CheckResult(
                    "kernel bundle", "fail", f"none installed, {asks}", fix=_install_fix()
                )
            return CheckResult(
                "kernel bundle",
                "fail",
                f"none active, {asks}: {inactive.detail}",
                fix=inactive.hint() if inactive.rollback else _install_fix(),
            )
        if ctx.spec:
            return CheckResult("kernel bundle", "pass", f"not needed for `kernels: {_wants(ctx)}`")
        if inactive is None:
            return CheckResult("kernel bundle", "pass", "none installed")
        how = f" (`{inactive.command}` re-activates it)" if inactive.rollback else ""
        return CheckResult("kernel bundle", "pass", f"none active: {inactive.detail}{how}")
    differences = bundle.target.differences(fingerprint)
    if differences:
        return CheckResult(
            "kernel bundle",
            "fail" if wants_bundle else "warn",
            f"{bundle.bundle_id} ({bundle.short_sha}) does not fit this host: "
            + "; ".join(map(str, differences)),
            fix=_no_torch_fix(fingerprint) or _install_fix(),
        )
    return CheckResult("kernel bundle", "pass", f"{bundle.bundle_id} ({bundle.short_sha}) active")


_INDEX_NOTE = (
    "URL: your release server, or --mirror DIR; without one, build it here: dllm bundle install "
    "--auto --build missing"
)


def _install_fix() -> str:
    """The install command (`install_command`, which names `--index URL` where no
    DLLM_BUNDLE_INDEX is set), with building the bundle here as the way without a server."""
    from turbo_dllm.kernels.loader import install_command

    command = install_command()
    if not command.endswith("--index URL"):
        return command
    return f"{command}   # {_INDEX_NOTE}"


def explain_index(hint: str) -> str:
    """A kernel loader's hint with the install command in it (`... --auto --index URL   # or
    set ...`), with what URL is and building here as the way without one, as the kernel
    bundle check's fix says: pasted as it was, `--index URL` fetched from "URL"."""
    from turbo_dllm.kernels.loader import install_command

    command = install_command()
    if not command.endswith("--index URL") or command not in hint or _INDEX_NOTE in hint:
        return hint
    head, _, tail = hint.partition(command)
    tail = tail.strip()
    if tail.startswith("#"):  # the hint's own comment goes on after the note
        return f"{head}{command}   # {_INDEX_NOTE}; {tail.lstrip('# ')}"
    return f"{head}{command}   # {_INDEX_NOTE}" + (f" {tail}" if tail else "")


def _no_torch_fix(fingerprint) -> str | None:
    """Where torch is missing every bundle differs from this host in its torch: installing or
    building another (the install fix) cannot help (a build needs torch too); torch does."""
    if fingerprint.torch is not None or "torch" in fingerprint.overrides:
        return None
    return (
        "install torch first (the torch check's fix): the bundle is matched to the torch it was "
        "built for, and fits again once that torch is back"
    )


def _blocked_store() -> tuple[str, str] | None:
    """(detail, fix) where a file is in the way of the bundle store's folders."""
    from turbo_dllm.bundles.store import BundleStore
    from turbo_dllm.doctor.folders import folder_problem

    store = BundleStore().store_dir
    problem = folder_problem(store)
    if problem is None or problem.blocker is None:  # an unwritable home: the cache dir check
        return None
    return f"{store}: {problem.detail}", problem.fix("set DLLM_HOME")


@register_check(order=120, name="kernels")
def kernels_for_spec(ctx: DoctorContext) -> CheckResult:
    """Load the kernels the config asks for (or, without a config, the active bundle's). With
    DLLM_OVERRIDE_* (a login node checking for its compute nodes) the bundle's target is only
    compared with the host they describe: loading checks this very process, which is not it."""
    from turbo_dllm.bundles.store import active_bundle
    from turbo_dllm.kernels.readiness import require_kernels

    kind = _wants(ctx)
    if kind is None:
        try:
            bundle = active_bundle()
            if bundle is None:
                if ctx.config_path is not None:  # (it said "pass --config" to one that did)
                    return ctx.without_spec("kernels", "the kernels it asks for")
                return CheckResult(
                    "kernels", "pass", "no bundle to load (pass --config to check one)"
                )
            skipped = unreadable_fingerprint(ctx, "kernels")
            if skipped is not None:
                return skipped
            differences = bundle.target.differences(_fingerprint(ctx))
        except DllmError as error:
            return CheckResult("kernels", "warn", error.message, fix=error.hint or "reinstall")
        if differences:  # require_kernels would say "the RunSpec asks for": none was given
            return CheckResult(
                "kernels",
                "warn",
                f"not loaded: the active bundle {bundle.bundle_id} ({bundle.short_sha}) does "
                "not fit this host: " + "; ".join(map(str, differences)),
                fix=_no_torch_fix(_fingerprint(ctx)) or _install_fix(),
            )
        kind = "native"
    if kind == "native":
        skipped = unreadable_fingerprint(ctx, "kernels")
        if skipped is not None:
            return skipped
    try:
        fingerprint = _fingerprint(ctx) if kind == "native" else None
        overridden = fingerprint is not None and bool(fingerprint.overrides)
        detail = require_kernels(kind, load=not overridden, fingerprint=fingerprint)
    except DllmError as error:
        status = "fail" if ctx.spec is not None else "warn"
        return CheckResult(
            "kernels", status, error.message, fix=explain_index(error.hint or "see docs/bundles.md")
        )
    if overridden:
        detail += " (the DLLM_OVERRIDE_* host; not loaded into this one)"
    return CheckResult("kernels", "pass", detail)
