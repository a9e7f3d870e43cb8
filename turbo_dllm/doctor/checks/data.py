"""Data checks: the RunSpec's artifact exists, is readable and complete, and fits the run.

An artifact that does not exist yet is a warning (a fresh `dllm init` project is ready except
for `dllm data prepare`, and `dllm launch` refuses to start without it), a failure for prod runs;
one that exists but is broken or does not fit the run is a failure. Cheap by design (manifest + file sizes, no hashing of large arrays): `dllm data validate`
recomputes every hash. The fit rules are shared with it (`turbo_dllm.data.compat`).
"""

from __future__ import annotations

from turbo_dllm.doctor import CheckResult, DoctorContext, register_check
from turbo_dllm.errors import DllmError

__all__: list[str] = []


def _artifact(ctx: DoctorContext) -> str | None:
    if ctx.spec is None:
        return None
    return ctx.spec.data.artifact


@register_check(order=300)
def data_artifact(ctx: DoctorContext) -> CheckResult:
    name = "data artifact"
    if ctx.spec is None:
        return CheckResult(name, "pass", "no RunSpec given (pass --config to check its data)")
    path = _artifact(ctx)
    if path is None:
        return CheckResult(name, "pass", "synthetic data (no artifact needed)")
    from pathlib import Path

    from turbo_dllm.data.artifact import DataArtifact

    fix = (
        "dllm data prepare --config prepare.yaml (then dllm data validate "
        f"{path} --config {ctx.config_path})"
    )
    if not (Path(path) / "manifest.json").exists():
        return CheckResult(
            name,
            "fail" if ctx.prod else "warn",
            f"{path} has not been prepared yet",
            fix=fix,
        )
    try:
        artifact = DataArtifact(path)
    except DllmError as error:
        return CheckResult(name, "fail", error.message, fix=fix)
    ctx.extras["data_manifest"] = artifact.manifest
    m = artifact.manifest
    return CheckResult(
        name,
        "pass",
        f"{path}: {m.num_sequences:,} sequences x {m.seq_len}, fingerprint {m.fingerprint[:16]}",
    )


@register_check(order=310)
def data_fits_run(ctx: DoctorContext) -> CheckResult:
    name = "data fit"
    manifest = ctx.extras.get("data_manifest")
    if manifest is None:
        detail = "synthetic data" if ctx.spec is not None and _artifact(ctx) is None else "skipped"
        return CheckResult(name, "pass", f"{detail} (nothing to compare)")
    from turbo_dllm.data.compat import artifact_problems
    from turbo_dllm.registry import get_family

    found = artifact_problems(manifest, ctx.spec)
    # the family's own input rules (packed rows it cannot train, its checkpoint's mask token):
    # what `dllm train` and `dllm launch` refuse, said here before a run is started
    family = get_family(ctx.spec.model.family)
    found += [f"{path}: {message}" for path, message in family.input_problems(ctx.spec)]
    if found:
        return CheckResult(
            name,
            "fail",
            "; ".join(found),
            fix="change those RunSpec fields or prepare the data again to match",
        )
    return CheckResult(
        name,
        "pass",
        f"seq_len {manifest.seq_len}, block size, vocab {manifest.vocab_size} and mask token "
        f"{manifest.special_tokens['mask']} fit the model",
    )
