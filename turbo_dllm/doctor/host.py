"""This host as the checks of one report see it: its fingerprint, collected once and shared.

A bad DLLM_OVERRIDE_* value is the "fingerprint" check's failure, with its fix; the other checks
that need the host go on with what they can know (the launch checks: the real host's GPUs and
cores) instead of ending the whole report with that error.
"""

from __future__ import annotations

from typing import Any

from turbo_dllm.errors import DllmError

__all__ = ["gpus_overridden", "host_fingerprint", "host_view", "unreadable_fingerprint"]


def host_fingerprint(ctx: Any):
    """collect_fingerprint() (DLLM_OVERRIDE_* applied), once per report; a bad override's
    DllmError is raised to every check that asks."""
    found = ctx.extras.get("fingerprint")
    if found is None:
        from turbo_dllm.host import collect_fingerprint

        try:
            found = collect_fingerprint()
        except DllmError as error:
            found = error
        ctx.extras["fingerprint"] = found
    if isinstance(found, DllmError):
        raise found
    return found


def gpus_overridden(ctx: Any) -> bool:
    """Whether DLLM_OVERRIDE_GPUS (read) describes the GPUs of the host the run goes to (a login
    node checking for its compute nodes), not this process's; False where it cannot be read."""
    try:
        return "gpus" in host_fingerprint(ctx).overrides
    except DllmError:  # the fingerprint check says so; judged on this host
        return False


def host_view(ctx: Any):
    """The GPUs and cores a launch gets here: `dllm launch`'s own view, else this report's
    fingerprint's, else (an override that cannot be read) the real host's."""
    view = ctx.extras.get("host_view")
    if view is None:
        from turbo_dllm.host.view import HostView

        try:
            fingerprint = host_fingerprint(ctx)
        except DllmError:  # said by the fingerprint check
            from turbo_dllm.host import collect_fingerprint

            fingerprint = collect_fingerprint(apply_overrides=False)
        view = ctx.extras["host_view"] = HostView.from_fingerprint(fingerprint)
    return view


def unreadable_fingerprint(ctx: Any, name: str, caused: DllmError | None = None):
    """The skip of check `name`, which compares with this host's fingerprint, where a bad
    DLLM_OVERRIDE_* value keeps it from being read (the fingerprint check fails, with the fix;
    repeated as this check's warning, it said the same problem twice), else None. `caused`:
    the error the check met, skipped only where it is that fingerprint's."""
    try:
        host_fingerprint(ctx)
    except DllmError as error:
        if caused is not None and error.message not in caused.message:
            return None
        from turbo_dllm.doctor import CheckResult

        return CheckResult(
            name,
            "skip",
            "not checked: this host's fingerprint cannot be read (see the fingerprint check)",
        )
    return None
