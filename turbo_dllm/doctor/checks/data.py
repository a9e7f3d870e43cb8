"""Data checks: the RunSpec's artifact exists, is readable and complete, and fits the run.

An artifact that does not exist yet is a warning (a fresh `dllm init` project is ready except
for `dllm data prepare`, and `dllm launch` refuses to start without it), a failure for prod runs;
one that exists but is broken or does not fit the run is a failure. Cheap by design (manifest + file sizes, no hashing of large arrays): `dllm data validate`
recomputes every hash. The fit rules are shared with it (`turbo_dllm.data.compat`).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from turbo_dllm.doctor import CheckResult, DoctorContext, register_check
from turbo_dllm.errors import DllmError

__all__ = ["prepare_command", "prepare_config_for"]


def _artifact(ctx: DoctorContext) -> str | None:
    if ctx.spec is None:
        return None
    return ctx.spec.data.artifact


def _holds_other_files(folder: Path) -> bool:
    try:
        return folder.is_dir() and any(folder.iterdir())
    except OSError:
        return False


def _shown(path: Path) -> str:
    """A path as a command line the user runs from here would name it."""
    try:
        path = path.relative_to(Path.cwd())
    except ValueError:
        pass
    return shlex.quote(str(path))


def prepare_config_for(config_path: Path | None, artifact: Path) -> Path | None:
    """The prepare config (a YAML file beside the RunSpec `config_path`) whose output.path is
    `artifact`: read as `dllm data prepare` reads it, without validating the rest (prepare says
    what else is wrong with it)."""
    from turbo_dllm.data.artifact import prepare_config_in

    if config_path is None:
        return None
    return prepare_config_in(Path(config_path).absolute().parent, artifact.resolve())


def prepare_command(config_path: Path | None, artifact: Path) -> str:
    """The `dllm data prepare` line that (re)writes `artifact`, as run from here, in backquotes:
    the prepare config beside the RunSpec that names it, with output.overwrite where a folder
    is in the way (prepare refuses to replace one without it: a damaged artifact, an empty
    folder); without one, what the PREPARE.yaml it names must say."""
    config = prepare_config_for(config_path, artifact)
    command = f"dllm data prepare --config {_shown(config) if config else 'PREPARE.yaml'}"
    if artifact.exists():
        command += " --set output.overwrite=true"
    if config is None:
        return f"`{command}` (a prepare.yaml with output.path: {artifact})"
    return f"`{command}`"


def _prepare_fix(ctx: DoctorContext, artifact: Path) -> str:
    """The command that (re)writes `artifact` (only where a check fails: it reads the YAML files
    beside the RunSpec), then the one that checks it against the run doctor checked: its
    --config with doctor's --set values (without them it checked the file's run, which a
    `--set data.seq_len=...` had changed)."""
    command = prepare_command(ctx.config_path, artifact).replace("`", "")
    check = f"dllm data validate {_shown(artifact)}"
    if ctx.config_path is not None:
        check += f" --config {_shown(ctx.config_path)}"
        check += "".join(f" --set {shlex.quote(o)}" for o in ctx.overrides)
    return f"{command} (then {check})"


def _file_in_the_way(name: str, field: str, path: str) -> CheckResult | None:
    """A failure where a file stands at the artifact's path or on the way to it: no artifact can
    be prepared there (prepare refuses: "exists and is not a folder"), so it is not merely "not
    prepared yet", and the prepare fix would not work."""
    from turbo_dllm.doctor.folders import folder_problem

    problem = folder_problem(path)
    if problem is None or problem.blocker is None:  # read-only is fine: an artifact is read
        return None
    return CheckResult(
        name,
        "fail",
        f"{field} {path}: {problem.detail}, so no data artifact can be there",
        fix=problem.fix(f"set {field}"),
    )


@register_check(order=300)
def data_artifact(ctx: DoctorContext) -> CheckResult:
    name = "data artifact"
    if ctx.spec is None:
        return ctx.without_spec(name, "its data")
    path = _artifact(ctx)
    if path is None:
        return CheckResult(name, "pass", "synthetic data (no artifact needed)")
    from turbo_dllm.data.artifact import DataArtifact, unlisted_problems

    folder = Path(path)
    manifest = folder / "manifest.json"
    blocked = _file_in_the_way(name, "data.artifact", path)
    if blocked is not None:
        return blocked
    if not manifest.exists() and _holds_other_files(folder):
        return CheckResult(
            name,
            "fail",
            f"{path} holds files but no manifest.json: not a data artifact (`dllm data prepare` "
            "refuses to write into it)",
            fix="set data.artifact to the folder your prepare.yaml's output.path names, or move "
            f"the files out of {path} and prepare it",
        )
    if not manifest.exists():
        from turbo_dllm.data.writer import restore_hint

        fix = _prepare_fix(ctx, folder)
        backup = restore_hint(folder)
        if backup is not None:
            said, how = backup
            return CheckResult(name, "fail", f"{path} is gone: {said}", fix=f"{how}; or {fix}")
        return CheckResult(
            name,
            "fail" if ctx.prod else "warn",
            f"{path} has not been prepared yet",
            fix=fix,
        )
    try:
        artifact = DataArtifact(path)
    except DllmError as error:
        return CheckResult(name, "fail", error.message, fix=_prepare_fix(ctx, folder))
    # validate's check of the files the manifest does not list (no hashing here): a warning,
    # they change neither training (the loader reads the listed files) nor an export (it copies
    # the listed tokenizer files only)
    # the manifest is read: the data fit check compares it with the run, whatever the warning
    ctx.extras["data_manifest"] = artifact.manifest
    unlisted, removal = unlisted_problems(artifact.root, artifact.manifest)
    if unlisted:
        return CheckResult(
            name,
            "warn",
            f"{path} holds what its manifest does not list: " + "; ".join(unlisted),
            fix=f"{removal}, or prepare it again: {_prepare_fix(ctx, folder)}",
        )
    m = artifact.manifest
    return CheckResult(
        name,
        "pass",
        f"{path}: {m.num_sequences:,} sequences x {m.seq_len}, fingerprint {m.fingerprint[:16]}",
    )


@register_check(order=310, name="data fit")
def data_fits_run(ctx: DoctorContext) -> CheckResult:
    name = "data fit"
    manifest = ctx.extras.get("data_manifest")
    if ctx.spec is None:
        return ctx.without_spec(name, "its data against the model")
    if manifest is None:
        if _artifact(ctx) is None:
            return CheckResult(name, "pass", "synthetic data (nothing to compare)")
        # the data artifact check failed or warned, with its fix: nothing was compared
        return CheckResult(
            name, "skip", "not checked: no data artifact to compare (see the data artifact check)"
        )
    from turbo_dllm.data.compat import artifact_problems
    from turbo_dllm.registry import get_family

    found = artifact_problems(manifest, ctx.spec)
    # the family's own input rules (packed rows it cannot train, its checkpoint's mask token):
    # what `dllm train` and `dllm launch` refuse, said here before a run is started
    family = get_family(ctx.spec.model.family)
    found += [f"{path}: {message}" for path, message in family.input_problems(ctx.spec)]
    # A model that does not load ("model: model folder config not found ...") is the model
    # check's failure, with the fix that helps; said here too, it had "prepare the data again"
    # for a fix, which changes nothing.
    unloaded = any(problem.startswith("model: ") for problem in found)
    found = [problem for problem in found if not problem.startswith("model: ")]
    if found:
        return CheckResult(
            name,
            "fail",
            "; ".join(found),
            fix="change those RunSpec fields or prepare the data again to match",
        )
    if unloaded:
        return CheckResult(
            name,
            "pass",
            f"seq_len {manifest.seq_len} and block size fit; the vocabulary is not compared: "
            "the model does not load (see the model check)",
        )
    return CheckResult(
        name,
        "pass",
        f"seq_len {manifest.seq_len}, block size, vocab {manifest.vocab_size} and mask token "
        f"{manifest.special_tokens['mask']} fit the model",
    )


@register_check(order=320, name="held-out data")
def eval_data(ctx: DoctorContext) -> CheckResult:
    """The held-out artifact (`eval.artifact`): prepared, readable, and fitting the run and the
    training data (`data.compat.eval_artifact_problems`, what the trainer refuses)."""
    name = "held-out data"
    if ctx.spec is None:
        return ctx.without_spec(name, "its held-out data")
    if ctx.spec.eval is None:
        return CheckResult(name, "pass", "no held-out evaluation (eval: unset)")
    from turbo_dllm.data.artifact import DataArtifact
    from turbo_dllm.data.compat import eval_artifact_problems, eval_sequences

    path = ctx.spec.eval.artifact
    folder = Path(path)
    blocked = _file_in_the_way(name, "eval.artifact", path)
    if blocked is not None:
        return blocked
    if not (folder / "manifest.json").exists():
        # a failure, not data.artifact's warning: nothing else stops `dllm launch` from
        # recording and starting a run that stops before its first step
        return CheckResult(
            name,
            "fail",
            f"eval.artifact {path} has not been prepared yet (the run would stop before its "
            "first step)",
            fix=_prepare_fix(ctx, folder),
        )
    try:
        manifest = DataArtifact(path).manifest
    except DllmError as error:
        return CheckResult(name, "fail", error.message, fix=_prepare_fix(ctx, folder))
    found = eval_artifact_problems(manifest, ctx.spec, ctx.extras.get("data_manifest"))
    if found:
        return CheckResult(
            name,
            "fail",
            "; ".join(found),
            fix="prepare the held-out documents with the training data's prepare.yaml (its "
            f"tokenizer and packing) into {path}",
        )
    try:  # the trainer's rounding: whole global micro-batches, every rank as many
        evaluated = eval_sequences(ctx.spec, manifest, _data_parallel_size(ctx))
    except DllmError as error:
        return CheckResult(name, "fail", error.message, fix=error.hint)
    return CheckResult(
        name,
        "pass",
        f"{path}: {evaluated:,} of {manifest.num_sequences:,} sequences, every "
        f"{ctx.spec.eval.interval} steps",
    )


def _data_parallel_size(ctx: DoctorContext) -> int:
    """The data-parallel ranks of the launch's plan, else of the spec's topology."""
    from turbo_dllm.config.topology import ParallelLayout

    plan = ctx.extras.get("job_plan")
    layout = getattr(plan, "layout", None)
    if layout is not None:
        return ParallelLayout.from_dict(layout).dp_size
    return ctx.spec.topology.layout.dp_size
