"""`dllm launch` as a library: prepare (compile + manifest), check, materialize, start.

The steps are separate so `--dry-run` can stop after `prepare_*` (and `check_run_dir`, which
refuses a run dir that already holds a run) with nothing written, and so a replay shares every
step with a fresh launch except how the spec and layout are obtained (from the recorded
manifest) and the drift comparison against it.
"""

from __future__ import annotations

import contextlib
import shlex
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from turbo_dllm.config.runspec import RunSpec
from turbo_dllm.errors import DllmError, os_error_hint
from turbo_dllm.host.view import HostView
from turbo_dllm.jobs import provenance
from turbo_dllm.jobs.compiler import compile_plan
from turbo_dllm.jobs.drift import manifest_drift
from turbo_dllm.jobs.manifest import (
    MANIFEST_NAME,
    OPTIONAL_INPUTS,
    CodeVersion,
    DriftItem,
    ReplayRef,
    RunManifest,
    read_manifest,
    spec_sha256,
    write_exclusive,
    write_manifest,
)
from turbo_dllm.jobs.options import LaunchOptions, NodeRange, SlurmOptions
from turbo_dllm.jobs.plan import JobPlan
from turbo_dllm.jobs.result import (
    RESULT_NAME,
    end_launcher,
    now,
    record_launcher,
    write_result,
)
from turbo_dllm.paths import new_run_dir
from turbo_dllm.train.metrics import METRICS_NAME

__all__ = [
    "PreparedJob",
    "build_manifest",
    "check_run_dir",
    "materialize",
    "prepare_launch",
    "prepare_replay",
    "readiness",
    "start",
]

SPEC_NAME = "spec.yaml"
DEFAULT_ROOT = "runs"


@dataclass(frozen=True)
class PreparedJob:
    """A compiled job, not yet written anywhere."""

    spec: RunSpec
    plan: JobPlan
    manifest: RunManifest
    source: str  # the config or manifest it came from
    host: HostView
    drift: list[DriftItem] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return Path(self.plan.run_dir)

    @property
    def multi_node(self) -> bool:
        return self.plan.multi_node


# --- prepare ----------------------------------------------------------------------------------


def prepare_launch(
    config: str | Path,
    overrides: list[str],
    options: LaunchOptions,
    argv: list[str],
) -> PreparedJob:
    """Compile a RunSpec file into a plan and the manifest it would write (no side effects)."""
    from turbo_dllm.data.spec import load_training_spec

    _refuse_a_manifest_as_config(Path(config))
    spec = load_training_spec(config, overrides)
    run_dir, explicit = _run_dir(options, spec.launch.run_dir, DEFAULT_ROOT)
    fingerprint = _fingerprint()
    host = HostView.from_fingerprint(fingerprint)
    spec, plan = _compile(spec, options, host, run_dir, explicit, source=str(config))
    _check_artifact(spec, config)
    manifest = build_manifest(spec, plan, argv, fingerprint)
    _refuse_paths_that_are_not_utf8(manifest)
    return PreparedJob(spec=spec, plan=plan, manifest=manifest, source=str(config), host=host)


def _refuse_paths_that_are_not_utf8(manifest: RunManifest) -> None:
    """A path whose name is not UTF-8 (a folder named in Latin-1, `caf\\xe9`: Python reads its
    byte as a lone surrogate) cannot be written into the run's records, which are UTF-8 JSON and
    YAML. The launch wrote them anyway, escaped, and every worker then refused its own manifest
    ("unable to parse raw data as a unicode string"): a failed run dir left behind."""
    found: list[str] = []

    def walk(value: Any, where: str) -> None:
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                found.append(f"{where or 'argv'}: {value!r}")
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{where}.{key}" if where else str(key))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, f"{where}[{index}]")

    record = manifest.model_dump(mode="json")
    walk(record["spec"], "spec")  # every path of the run (its run dir: launch.run_dir)
    walk(record["plan"]["cwd"], "plan.cwd")  # the folder the launch ran in
    walk((record.get("replay_of") or {}).get("manifest"), "replay_of.manifest")
    if found:
        raise DllmError(
            "these paths are not valid UTF-8, which the run's records (manifest.json, "
            "spec.yaml) are written in:\n" + "\n".join(f"  - {line}" for line in found[:8]),
            hint="rename the folders to UTF-8 names (convmv -f latin1 -t utf8 -r --notest DIR "
            "does it) or choose others (--run-dir, the spec's paths)",
        )


def _refuse_a_manifest_as_config(config: Path) -> None:
    """A run manifest given as --config (for --manifest) was read as a RunSpec: two dozen
    'unknown key' problems (`data.fingerprint`, ...) and a hint to fix the fields."""
    import json

    from turbo_dllm.jobs.manifest import FORMAT

    if config.suffix.lower() != ".json":
        return
    try:
        document = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # the spec loader says what is wrong with it
    if isinstance(document, dict) and document.get("format") == FORMAT:
        raise DllmError(
            f"{config} is a run manifest, not a RunSpec",
            hint=f"to replay that run, pass it as --manifest {config}; to launch its spec with "
            f"changes, pass --config {config.parent / SPEC_NAME}",
        )


def prepare_replay(
    manifest_path: str | Path,
    options: LaunchOptions,
    argv: list[str],
    *,
    allow_drift: bool = False,
) -> PreparedJob:
    """Re-compile a recorded job into a new run dir; refuse (or record) any input drift."""
    path = Path(manifest_path)
    recorded = read_manifest(path)
    recorded_bytes = (path / MANIFEST_NAME if path.is_dir() else path).read_bytes()
    spec = _recorded_spec(recorded)
    spec = _check_checkpoint_dir(spec)
    layout = _recorded_options(recorded.plan, options)
    run_dir, explicit = _run_dir(layout, None, str(_original_run_dir(path, recorded).parent))
    fingerprint = _fingerprint()
    host = HostView.from_fingerprint(fingerprint)
    spec, plan = _compile(
        spec, layout, host, run_dir, explicit, replay=True, source=str(manifest_path)
    )
    plan = _recorded_threads(plan, recorded.plan)
    current = build_manifest(spec, plan, argv, fingerprint, missing_data_ok=True)
    drift = manifest_drift(recorded, current) + _content_drift(spec)
    if drift and not allow_drift:
        gone = _vanished_resume(drift, spec)
        vanished = _vanished_artifacts(drift, spec)
        lines = "\n".join(
            f"  - {item}{gone if gone and item.field == 'resume' else ''}"
            f"{vanished.get(item.field, '')}"
            for item in drift
        )
        hint = f"restore the recorded {_drifted_groups(drift)}, or pass --allow-drift to run "
        hint += "anyway (the drift is written into the new manifest)"
        if vanished and not gone:
            # --allow-drift cannot run it either: the trainer reads the artifact.
            others = [item for item in drift if item.field not in vanished]
            paths = " and ".join(_vanished_paths(spec, vanished))
            hint = (
                f"prepare {paths} again with the prepare.yaml and sources that made "
                f"{'them' if len(vanished) > 1 else 'it'} (dllm data prepare --config "
                "PREPARE.yaml: the same ones give the recorded fingerprint; --allow-drift "
                "cannot replay without the data)"
                + (
                    f", then restore the recorded {_drifted_groups(others)} or pass "
                    "--allow-drift for that"
                    if others
                    else ""
                )
            )
        if gone:
            # --allow-drift cannot run it: no checkpoint to start from (check_inputs, below).
            others = [item for item in drift if item.field != "resume"]
            folder = path if path.is_dir() else path.parent
            written = [
                p for p in (folder, Path(recorded.plan.run_dir)) if (p / SPEC_NAME).is_file()
            ]
            again = _q(written[0] / SPEC_NAME) if written else "SPEC (the manifest's spec as YAML)"
            hint = (
                f"put the recorded checkpoint back at {recorded.resume.path} (the replay starts "
                "from it, with --allow-drift too)"
                + (
                    f", then restore the recorded {_drifted_groups(others)} or pass --allow-drift "
                    "for that"
                    if others
                    else ""
                )
                + "; or train the run's spec from another checkpoint, as a new run: dllm launch "
                f"--config {again} --set "
                "checkpoint.resume=PATH --run-dir NEW_DIR"
            )
        raise DllmError(
            f"replay of run {recorded.run_id} refused: {len(drift)} input"
            f"{'s' if len(drift) > 1 else ''} drifted since it was recorded "
            f"(recorded -> now):\n{lines}",
            hint=hint,
        )
    # Drift allowed, the inputs must still be there and fit the spec, as a launch's must: the
    # run dir was written, then every worker failed on a vanished or misfit artifact.
    _check_artifact(spec, path)
    import hashlib

    replay_of = ReplayRef(
        run_id=recorded.run_id,
        manifest=str(path.resolve()),
        manifest_sha256=hashlib.sha256(recorded_bytes).hexdigest(),
        drift=drift,
    )
    manifest = current.model_copy(update={"replay_of": replay_of})
    _refuse_paths_that_are_not_utf8(manifest)
    return PreparedJob(
        spec=spec, plan=plan, manifest=manifest, source=str(path), host=host, drift=drift
    )


def _vanished_resume(drift: list[DriftItem], spec: RunSpec) -> str:
    """What a replay finds at checkpoint.resume where the recorded checkpoint is gone (its whole
    record drifted to none), as the end of its drift line; "" where it is not gone."""
    if not any(item.field == "resume" and item.current is None for item in drift):
        return ""
    resume = spec.checkpoint.resume
    if not Path(resume).exists():
        return f": checkpoint.resume {resume} does not exist now"
    return f": checkpoint.resume {resume} holds no complete checkpoint now"


def _vanished_artifacts(drift: list[DriftItem], spec: RunSpec) -> dict[str, str]:
    """The data artifacts (`data`, `eval_data`) whose whole record drifted to none (gone, or
    no artifact there now), each with the end of its drift line: its path, which the recorded
    fingerprint alone did not name."""
    found = {}
    for group, path in _artifact_paths(spec).items():
        if any(item.field == group and item.current is None for item in drift):
            what = "does not exist" if not Path(path).exists() else "holds no artifact"
            found[group] = f": {_ARTIFACT_FIELDS[group]} {path} {what} now"
    return found


_ARTIFACT_FIELDS = {"data": "data.artifact", "eval_data": "eval.artifact"}


def _artifact_paths(spec: RunSpec) -> dict[str, str]:
    paths = {"data": spec.data.artifact}
    paths["eval_data"] = spec.eval.artifact if spec.eval is not None else None
    return {field: path for field, path in paths.items() if path}


def _vanished_paths(spec: RunSpec, vanished: dict[str, str]) -> list[str]:
    return [_q(path) for group, path in _artifact_paths(spec).items() if group in vanished]


def _original_run_dir(path: Path, recorded: RunManifest) -> Path:
    """The run a replay goes next to: the run dir its manifest is in, which keeps the run's name
    when it is moved or copied elsewhere (an archive, another host), or else (a manifest kept on
    its own) the run dir it records. The recorded one alone put the replay of a moved run where
    the run had been, making that folder again."""
    folder = (path if path.is_dir() else path.parent).resolve()
    return folder if folder.name == recorded.run_id else Path(recorded.plan.run_dir)


def _recorded_threads(plan: JobPlan, recorded: JobPlan) -> JobPlan:
    """The replay's workers run with the recorded OMP_NUM_THREADS. A launch (in-process or
    under torchrun) derives it from this host's CPUs (cores / processes per node), and the
    thread count changes how CPU ops split their sums and so their rounding: a CPU replay on a
    host with other cores (or another CPU affinity) computed other numbers without a word of
    drift."""
    recorded_threads = recorded.env.get("OMP_NUM_THREADS")
    here = plan.env.get("OMP_NUM_THREADS")
    if recorded_threads is None and here is not None and recorded.backend == "local":
        # A local launch recorded before it recorded its thread count ran with torch's own
        # default: the replay sets none either, as that run did.
        env = {k: v for k, v in plan.env.items() if k != "OMP_NUM_THREADS"}
        note = (
            "replay: no OMP_NUM_THREADS, as recorded (the run predates recording it and ran "
            "with torch's default thread count)"
        )
        return plan.model_copy(update={"env": env, "notes": [*plan.notes, note]})
    if recorded_threads is None or here is None or recorded_threads == here:
        return plan
    note = (
        f"replay: OMP_NUM_THREADS={recorded_threads} as recorded (this host's CPUs would give "
        f"{here}): the CPU thread count changes how CPU ops round"
    )
    return plan.model_copy(
        update={
            "env": {**plan.env, "OMP_NUM_THREADS": recorded_threads},
            "notes": [*plan.notes, note],
        }
    )


_GROUP_NAMES = {
    "host": "host (Python, platform, torch, GPUs, driver; DLLM_OVERRIDE_* variables)",
    "target_weights": "target weights",
    "features": "model.dflash.features artifact",
    "model_shape": "model.from_config file",
    "resume": "checkpoint.resume checkpoint",
    "eval_data": "eval.artifact (held-out data)",
}


def _drifted_groups(drift: list[DriftItem]) -> str:
    """The input groups that drifted, in order: the hint named packages / data / weights / code /
    bundle whatever drifted, and never the host (a host-only drift read as a package one)."""
    groups = dict.fromkeys(item.field.split(".")[0].split("[")[0] for item in drift)
    return " / ".join(_GROUP_NAMES.get(group, group) for group in groups)


def _check_artifact(spec: RunSpec, source: str | Path) -> None:
    """The data artifact must fit the spec (sequence length, blocks, vocabulary, mask token), and
    so must the other inputs the family names (its `input_rules`)."""
    check_inputs(spec, source)


def check_inputs(spec: RunSpec, source: str | Path) -> None:
    """Raise a DllmError listing every way the spec's data artifact and family inputs misfit."""
    from turbo_dllm.registry import get_family

    found = [
        f"{path}: {message}" for path, message in get_family(spec.model.family).input_problems(spec)
    ]
    resume = spec.checkpoint.resume
    if resume not in ("auto", "never"):
        # The worker refused it only once the run dir was written (a `failed` run): a path that
        # is not there, and one that holds no complete checkpoint (an empty folder, a run dir
        # whose checkpoints were removed), as the trainer resolves it.
        from turbo_dllm.train.checkpoint import resolve_checkpoint

        what = (
            "a checkpoints/step_<N> folder, a checkpoints/ folder or a run dir: their newest "
            "complete step"
        )
        if not Path(resume).exists():
            found.append(f"checkpoint.resume: {resume} does not exist ({what})")
        elif not (resolve_checkpoint(resume) / "checkpoint.json").is_file():
            found.append(f"checkpoint.resume: {resume} holds no complete checkpoint ({what})")
    data_found = []
    if spec.data.artifact is not None:
        from turbo_dllm.data.artifact import read_manifest as read_data_manifest
        from turbo_dllm.data.compat import artifact_problems

        artifact, prepare = Path(spec.data.artifact), None
        if not (artifact / "manifest.json").is_file():
            # the prepare config beside the spec that writes it, as doctor names it: the
            # hint said `--config prepare.yaml` from any folder, for any output.path
            from turbo_dllm.doctor.checks.data import prepare_command

            prepare = prepare_command(Path(source), artifact)
        data_manifest = read_data_manifest(artifact, prepare)
        data_found = artifact_problems(data_manifest, spec)
    if data_found or found:
        lines = "\n".join(f"  - {problem}" for problem in data_found + found)
        # the data's misfits are mended by preparing it again; the others (a target or
        # checkpoint folder that is not there) only in the spec or on disk
        hint = "change the spec, or prepare the data again to match it"
        if any(problem.startswith("data.seq_len:") for problem in data_found):
            # the one change that fits it, as a flag (a recipe read at 128 beside a starter
            # project's 256-token artifact: docs/dflash.md)
            hint = (
                f"change the spec (--set data.seq_len={data_manifest.seq_len} fits the "
                "artifact), or prepare the data again to match it"
            )
        if found:
            hint = "fix each input named above (or the spec's field that names it)" + (
                "; prepare the data again to match the spec" if data_found else ""
            )
        raise DllmError(f"{source}: the inputs do not fit the spec:\n{lines}", hint=hint)


def _data_artifacts(spec: RunSpec) -> dict[str, str | None]:
    """The data artifacts the spec reads, by their manifest group: the training data and the
    held-out data of its `eval:` section (None: none)."""
    return {"data": spec.data.artifact, "eval_data": spec.eval.artifact if spec.eval else None}


def _content_drift(spec: RunSpec) -> list[DriftItem]:
    """Re-hash the arrays of every data artifact the spec reads (the training data and the
    held-out data): bytes changed under an unchanged manifest.json are drift too (a launch
    trusts the manifest; a replay checks it), named `<group>.content`. One that is not prepared
    is drift already (its ref records none)."""
    from turbo_dllm.data.artifact import verify

    found = []
    for group, artifact in _data_artifacts(spec).items():
        if artifact is None or not _prepared(artifact):
            continue
        try:
            verify(artifact)
        except DllmError as error:
            # One line: the refusal lists one drift per line, and verify's own list of files
            # read as more drifted inputs than the count said.
            first, *files = error.message.splitlines()
            problems = "; ".join(line.strip().removeprefix("- ") for line in files)
            current = f"{first} {problems}" if problems else first
            recorded = "matches its manifest"
            found.append(DriftItem(field=f"{group}.content", recorded=recorded, current=current))
    return found


def build_manifest(
    spec: RunSpec,
    plan: JobPlan,
    argv: list[str],
    fingerprint: Any,
    *,
    missing_data_ok: bool = False,
) -> RunManifest:
    """The manifest of a compiled job; `missing_data_ok` (replays) records a vanished data
    artifact as no data, which then shows up as drift instead of stopping the comparison."""
    spec_doc = spec.model_dump(mode="json")
    seeds = {"launch.seed": spec.launch.seed}
    drafter = spec.model.dflash if spec.model.family == "dflash" else None
    target = {"target_weights": None, "features": None}  # recorded: none
    if drafter:  # its frozen target, and the feature artifact made from it (None: online)
        target = {
            "target_weights": provenance.weights_ref(drafter.target),
            "features": provenance.features_ref(drafter.features),
        }
    if "PYTHONHASHSEED" in plan.env:
        seeds["PYTHONHASHSEED"] = int(plan.env["PYTHONHASHSEED"])
    return RunManifest(
        run_id=plan.run_id,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        argv=list(argv),
        spec=spec_doc,
        spec_sha256=spec_sha256(spec_doc),
        host=fingerprint.model_dump(mode="json"),
        packages=provenance.installed_packages(),
        bundle=provenance.active_bundle_ref(),
        data=_data_ref(spec.data.artifact, missing_ok=missing_data_ok),
        weights=provenance.weights_ref(spec.model.path),
        **target,
        model_shape=provenance.model_shape_ref(spec.model.from_config),
        resume=provenance.resume_ref(spec.checkpoint.resume),
        eval_data=_data_ref(_data_artifacts(spec)["eval_data"], missing_ok=True),
        recorded_inputs=list(OPTIONAL_INPUTS),  # every one (null: none; not "not recorded")
        code=CodeVersion(**provenance.code_version()),
        seeds=seeds,
        plan=plan,
        commands=[c.argv for c in plan.commands],
    )


def _data_ref(artifact: str | None, *, missing_ok: bool):
    """A data artifact's identity (`provenance.data_ref`); None for none, and with `missing_ok`
    for one not prepared (no manifest.json): a replay's vanished artifact then shows as drift,
    and a launch's unprepared held-out data is refused by the readiness check, naming
    eval.artifact, before anything is written."""
    if artifact is None or (missing_ok and not _prepared(artifact)):
        return None
    return provenance.data_ref(artifact)


def _prepared(artifact: str) -> bool:
    """Whether the artifact's manifest.json is there (`artifact`: its folder or that file)."""
    path = Path(artifact)
    return (path.name == "manifest.json" and path.is_file()) or (path / "manifest.json").is_file()


def _fingerprint() -> Any:
    from turbo_dllm.host import collect_fingerprint

    return collect_fingerprint()


def _compile(
    spec: RunSpec,
    options: LaunchOptions,
    host: HostView,
    run_dir: Path,
    explicit: bool,
    *,
    replay: bool = False,
    source: str = "RunSpec",
) -> tuple[RunSpec, JobPlan]:
    spec = spec.model_copy(
        update={"launch": spec.launch.model_copy(update={"run_dir": str(run_dir)})}
    )
    plan = compile_plan(spec, options, host, run_dir=run_dir, source=source)
    if plan.multi_node and not explicit:
        # A replay runs the recorded spec: its launch.run_dir is no way to choose the run dir.
        raise DllmError(
            "every node of a multi-node launch must write into the same run dir",
            hint="pass --run-dir DIR on shared storage (the same on every node)"
            + ("" if replay else ", or set launch.run_dir in the spec"),
        )
    return spec, plan


def _run_dir(
    options: LaunchOptions, spec_run_dir: str | None, default_root: str
) -> tuple[Path, bool]:
    """The run dir and whether the user named it (a fresh stamped dir otherwise). The command
    line wins over the spec's `launch.run_dir`: `--run-root` was ignored without a word when
    the spec named a run dir. A leading `~` is the home folder, as in a spec's paths: bash leaves
    `--run-dir=~/runs/a` as it is, and the launch made a folder named `~` in the current one."""
    if options.run_dir:
        return Path(options.run_dir).expanduser().resolve(), True
    if spec_run_dir and not options.run_root:
        return Path(spec_run_dir).resolve(), True
    root = Path(options.run_root).expanduser() if options.run_root else default_root
    return new_run_dir(root).resolve(), False


def _recorded_spec(recorded: RunManifest) -> RunSpec:
    from turbo_dllm.config.load import load_model

    return load_model(RunSpec, recorded.spec, f"run {recorded.run_id} manifest spec")


def _check_checkpoint_dir(spec: RunSpec) -> RunSpec:
    """A replay must not share (and auto-resume from) the original run's checkpoints."""
    ckpt = spec.checkpoint.dir
    if ckpt is None:
        return spec
    raise DllmError(
        f"the recorded spec writes checkpoints to a fixed folder ({ckpt}); a replay would "
        "resume from the original run's checkpoints",
        hint="leave checkpoint.dir unset (default: <run dir>/checkpoints) for replayable runs",
    )


def _recorded_options(plan: JobPlan, given: LaunchOptions) -> LaunchOptions:
    """The recorded layout; only where processes meet and where the run goes may change."""
    rdzv = plan.rendezvous
    master_addr = master_port = rdzv_endpoint = None
    if rdzv.kind == "static" and rdzv.endpoint:
        host, _, port = rdzv.endpoint.rpartition(":")
        master_addr, master_port = host, int(port)
    elif rdzv.kind == "c10d" and rdzv.endpoint:
        if plan.backend == "slurm":
            # A fixed --master-port is recorded as a number; the default port follows the job.
            port = rdzv.endpoint.rpartition(":")[2]
            master_port = int(port) if port.isdigit() else None
        else:
            rdzv_endpoint = rdzv.endpoint
    if given.master_addr or given.master_port or given.rdzv_endpoint:
        master_addr, master_port = given.master_addr, given.master_port
        rdzv_endpoint = given.rdzv_endpoint
    rdzv_conf = given.rdzv_conf if given.rdzv_conf is not None else rdzv.conf
    # A recorded static node rank only while the replay still meets statically: a c10d
    # rendezvous (a new --rdzv-endpoint or --rdzv-conf) numbers the nodes itself.
    node_rank = given.node_rank
    if node_rank is None and rdzv.kind == "static" and not (given.rdzv_endpoint or rdzv_conf):
        node_rank = plan.node_rank
    slurm = plan.slurm
    return LaunchOptions(
        backend=plan.backend,
        nproc_per_node=plan.nproc_per_node,
        nnodes=NodeRange(plan.nnodes_min, plan.nnodes_max),
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_id=given.rdzv_id,
        rdzv_conf=rdzv_conf,
        max_restarts=plan.max_restarts,
        run_root=given.run_root,
        run_dir=given.run_dir,
        slurm=SlurmOptions(
            gpus_per_node=slurm.gpus_per_node,
            cpus_per_task=slurm.cpus_per_task,
            partition=slurm.partition,
            account=slurm.account,
            time=slurm.time,
            extra=tuple(slurm.extra),
        )
        if slurm
        else SlurmOptions(),
    )


# --- check, write, start ----------------------------------------------------------------------


def readiness(job: PreparedJob):
    """Doctor's checks for this launch: the real world size and the plan are in the context."""
    from turbo_dllm.doctor import DoctorContext, run_checks

    context = DoctorContext(
        config_path=Path(job.source),
        spec=job.spec,
        world_size=job.plan.world_size,
        run_dir=job.run_dir,
        extras={"job_plan": job.plan, "host_view": job.host},
    )
    return run_checks(context)


def check_run_dir(job: PreparedJob) -> bool:
    """Refuse a run dir that already holds a run, before anything is written (a dry run too):
    a launch never writes into another run's dir, where it would resume its checkpoints and
    append to its metrics under a manifest that does not describe them. The error names the
    run and the ways on. True: this node of a multi-node launch joins the same job, which
    another node recorded there and which has not finished (a finished one is refused too)."""
    run_dir = job.run_dir
    _refuse_a_file_in_the_way(run_dir)
    if (run_dir / MANIFEST_NAME).exists():
        if job.multi_node and not _finished(run_dir):
            _join(job)
            return True
        message = _occupied_by_a_recorded_run(
            run_dir, replay=job.manifest.replay_of is not None, joining=job.multi_node
        )
        raise DllmError(message, hint=f"`dllm run show {_q(run_dir)}` shows that run")
    found = _run_files(run_dir)
    if job.multi_node:  # another node may be writing spec.yaml before its manifest
        found = [name for name in found if name != SPEC_NAME]
    if found:
        raise DllmError(
            f"{run_dir} already holds a run's files ({', '.join(found)}) but no "
            f"{MANIFEST_NAME}: a `dllm train --run-dir` run, or a launch stopped before it "
            "recorded one. A launch there would train on from its checkpoints under a manifest "
            "that does not describe them. Instead:\n"
            f"  - {_NEW_RUN[False]}\n"
            "  - continue that run with the config it was trained with: "
            f"dllm train --config F --run-dir {_q(run_dir)}",
            hint=f"`dllm run plot {_q(run_dir)}` plots what it trained"
            if METRICS_NAME in found
            else None,
        )
    return False


def _refuse_a_file_in_the_way(run_dir: Path) -> None:
    """A run dir that is a file, or whose path goes through one, can never be made: refused with
    the other run dir problems, a dry run too (whose plan and start line named a run dir that
    the launch then refused in its readiness checks)."""
    from turbo_dllm.doctor.folders import folder_problem

    problem = folder_problem(run_dir)
    if problem is not None and problem.blocker is not None:
        raise DllmError(
            f"cannot create run dir {run_dir}: {problem.detail}",
            hint=f"move the file {problem.blocker} out of the way, or pass another --run-dir "
            "(or --run-root, or set launch.run_dir) to a path that goes through folders only",
        )


_NEW_RUN = {  # by whether the launch is a replay, whose spec's launch.run_dir does not count
    False: "a new run: pass --run-dir a new folder, or leave --run-dir and launch.run_dir unset "
    "for a fresh runs/<stamp>-<id>",
    True: "replay into a new run dir: pass --run-dir a new folder, or leave it unset for a "
    "fresh one next to the recorded run",
}
# A multi-node launch needs a run dir named on every node (`_compile`): no fresh default.
_NEW_SHARED_RUN = {
    False: "a new run: pass --run-dir a new folder on shared storage, the same on every node",
    True: "replay into a new run dir: pass --run-dir a new folder on shared storage, the same "
    "on every node",
}


# How `dllm run list` says a run is finished, or still in SLURM's hands: nothing to continue.
_NOTHING_TO_CONTINUE = (
    "ok",
    "pending",
    "running",
    "configuring",
    "completing",
    "suspended",
    "requeued",
)


def _finished(run_dir: Path) -> bool:
    """Whether the run in `run_dir` ran to its end, so no node may join it: exit status 0
    recorded (result.json; a multi-node job's rank 0 writes it) at its last step. A run that
    left no result (failed, stopped) or stopped early with 0 (training.max_duration_s) has not:
    its nodes join it again and resume."""
    from turbo_dllm.jobs.runs import summarize

    try:
        return _complete(summarize(run_dir, ask_slurm=False))
    except DllmError:  # a damaged manifest: joining it says what is wrong with it
        return False


def _complete(run) -> bool:
    """Whether a run's summary says it ended well at its last step."""
    return run.exit_code == 0 and (run.steps_done or 0) >= run.steps_total


def _run_files(run_dir: Path) -> list[str]:
    """The files a run leaves in its run dir (its records, then its outputs) that `run_dir`
    holds: a folder the user made, empty or with other files in it, holds no run."""
    from turbo_dllm.jobs.backends.slurm import SCRIPT_NAME, SUBMISSION_NAME

    names = (SPEC_NAME, SCRIPT_NAME, METRICS_NAME, "checkpoints", RESULT_NAME, SUBMISSION_NAME)
    found = []
    for name in (*names, "console.log"):
        path = run_dir / name
        with contextlib.suppress(OSError):
            if path.is_file() or (path.is_dir() and any(path.iterdir())):
                found.append(name)
    return found


def _q(path: str | Path) -> str:
    """A path as a word of a command line the user pastes (a run dir may hold a space); a
    relative one that starts with "-" as ./-r1, which no command reads as an option."""
    text = str(path)
    return shlex.quote(f"./{text}" if text.startswith("-") else text)


def _occupied_by_a_recorded_run(run_dir: Path, *, replay: bool, joining: bool = False) -> str:
    """What holds `run_dir` (its id, status, progress, when it ended) and the ways on;
    `joining`: a node of a multi-node launch, refused because that run finished."""
    from turbo_dllm.jobs.runs import resume_way, summarize

    manifest = run_dir / MANIFEST_NAME
    ways = [(_NEW_SHARED_RUN if joining else _NEW_RUN)[replay]]
    try:
        recorded = read_manifest(run_dir)
        run = summarize(run_dir, recorded)
    except DllmError as error:  # damaged or edited: still a run, and still not ours to touch
        return (
            f"{run_dir} already holds a run ({MANIFEST_NAME}: {error.message}); a launch does "
            f"not write into another run's dir. Instead:\n  - {ways[0]}"
        )
    done = "no steps yet" if run.steps_done is None else f"step {run.steps_done}/{run.steps_total}"
    if not replay:
        again = f"the same job again, into a new run dir: dllm launch --manifest {_q(manifest)}"
        if recorded.plan.multi_node:
            # Its replay is multi-node too, which takes no default run dir.
            again += " --run-dir DIR, on every node (DIR: a new folder on shared storage)"
        ways.append(again)
    complete = _complete(run)
    if complete and not replay and not joining and not recorded.plan.multi_node:
        if recorded.plan.slurm is None:
            # More steps of a finished run: a new run from its last checkpoint (its own dir
            # takes none; its spec.yaml names that dir, hence --run-dir).
            spec = _q(run_dir / SPEC_NAME)
            ways.append(
                f"more steps, as a new run from its last checkpoint: dllm launch --config {spec} "
                f"--set checkpoint.resume={_q(run_dir)} --set training.steps=N --run-dir NEW_DIR"
            )
    # A run that ended with 0 short of its last step stopped at training.max_duration_s.
    if run.status not in _NOTHING_TO_CONTINUE or (run.status == "ok" and not complete):
        # Its own script submitted again for a SLURM job (which records itself as the run's
        # latest attempt when it starts), its launch on every node for a multi-node one.
        ways.append("if it stopped, " + resume_way(recorded, run_dir))
    ended = ""
    if run.exit_code is not None:  # its result.json: when and how it ended
        at = f" at {run.finished_at}" if run.finished_at else ""
        ended = (
            f", which {'finished' if complete else 'ended'}{at} with exit status {run.exit_code}"
        )
    nodes = " (the nodes of a multi-node launch join its run only until it finishes)"
    return (
        f"{run_dir} already holds run {run.run_id} ({run.status}, {done}){ended}; a launch does "
        f"not write into another run's dir{nodes if joining else ''}. Instead:\n"
        + "\n".join(f"  - {way}" for way in ways)
    )


def _checkpoint_dir(job: PreparedJob) -> str | None:
    """The spec's checkpoint.dir, where a SLURM job's script looks for a saved step."""
    value = job.manifest.recorded("checkpoint", "dir")
    return value if isinstance(value, str) else None


def materialize(job: PreparedJob) -> None:
    """Create the run dir with spec.yaml, manifest.json (and the sbatch script) before any
    worker starts. A multi-node launch joins a run dir another node created for the same job;
    a run dir that holds another run is refused (`check_run_dir`), and the files are created
    exclusively, so a launch that raced this one past that check still cannot replace them."""
    run_dir = job.run_dir
    if check_run_dir(job):
        return
    made_run_dir = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DllmError(
            f"cannot create run dir {run_dir}: {error}",
            hint=f"{os_error_hint(error.errno or 0) or 'check that path'}; or pass another "
            "--run-dir (or --run-root)",
        ) from None
    written: list[Path] = []
    try:
        # UTF-8 as written (a run dir "runs/数据 é" read "runs/\u6570\u636E \xE9" in the file),
        # one line a value (YAML folded a long path with spaces over two lines at 80 columns)
        spec_text = yaml.safe_dump(
            job.manifest.spec, sort_keys=False, allow_unicode=True, width=1 << 20
        )
        spec_text = spec_text.encode()
        spec_path = run_dir / SPEC_NAME
        try:
            written.append(write_exclusive(spec_path, spec_text))
        except DllmError:
            # The nodes of a multi-node launch share the spec.yaml the first of them wrote
            # (written whole: a hard link). Checked before writing, a node that lost the race
            # between the check and its own write (nodes started together) was refused with
            # "spec.yaml already exists; a run dir holds one job".
            if not job.multi_node:
                raise
            _check_shared_spec(spec_path, spec_text)
        if job.plan.slurm is not None:
            from turbo_dllm.jobs.backends.slurm import render_script

            script = Path(job.plan.slurm.script)
            written.append(
                write_exclusive(script, render_script(job.plan, _checkpoint_dir(job)).encode())
            )
            script.chmod(0o755)
        try:
            write_manifest(job.manifest, run_dir)
        except DllmError:
            if job.multi_node:  # another node won the race: join its manifest
                _join(job)
                return
            raise
    except BaseException:
        # Stopped before its manifest (Ctrl-C, a full disk, a file in the way): what this
        # launch wrote goes again. Left, its spec.yaml held the run dir as a run's files
        # without a manifest ("a `dllm train --run-dir` run, or a launch stopped ..."), and
        # the same launch was refused there. (The nodes of a multi-node launch share the
        # spec.yaml one of them wrote, and join a run dir that holds only that.)
        if not job.multi_node and not (run_dir / MANIFEST_NAME).exists():
            for path in written:
                with contextlib.suppress(OSError):
                    path.unlink()
            if made_run_dir:
                with contextlib.suppress(OSError):  # not empty: another writer's files stay
                    run_dir.rmdir()
        raise


def _check_shared_spec(spec_path: Path, spec_text: bytes) -> None:
    """Another node wrote the run dir's spec.yaml: it must be this node's spec."""
    try:
        same = spec_path.read_bytes() == spec_text
    except OSError as error:
        raise DllmError(f"cannot read {spec_path}: {error.strerror or error}") from None
    if not same:
        raise DllmError(
            f"{spec_path} holds another job's spec (another node launched another config or "
            "other --set values into this run dir)",
            hint="launch the same config on every node, or pass --run-dir a new folder",
        )


def _join(job: PreparedJob) -> None:
    other = read_manifest(job.run_dir)
    if other.spec_sha256 != job.manifest.spec_sha256:
        raise DllmError(
            f"{job.run_dir} holds a different job (spec {other.spec_sha256[:12]}, "
            f"this node's {job.manifest.spec_sha256[:12]})",
            hint="launch the same config on every node",
        )
    drift = manifest_drift(other, job.manifest)
    drift = [d for d in drift if not d.field.startswith("host.")]
    if drift:
        lines = "\n".join(f"  - {item}" for item in drift)
        raise DllmError(
            f"this node differs from the node that recorded {job.run_dir}:\n{lines}",
            hint="install the same packages, code and data on every node",
        )


def start(job: PreparedJob, *, submit: bool = False, made_run_dir: bool = False) -> int:
    """Start the workers (or write/submit the SLURM job) and return the exit status.
    `made_run_dir`: `materialize` created the run dir (a refused submission removes it)."""
    plan = job.plan
    if plan.backend == "slurm":
        if not submit:
            return 0
        from turbo_dllm.jobs.backends.slurm import submit as sbatch

        try:
            job_id = sbatch(plan.slurm, job.run_dir)
        except DllmError as error:
            _discard(job, made_run_dir)
            raise DllmError(
                f"{error.message}\nNothing was submitted, and the launch's files are removed "
                f"from {job.run_dir} again, so the same launch with other options can use it.",
                hint=error.hint,
            ) from None
        print(f"Submitted batch job {job_id}")
        return 0
    started = now()
    # Who runs the job, so `dllm run list` tells a live run from one whose launcher was killed
    # before it could write result.json. Not recorded (a full disk): the run reads `no result`.
    with contextlib.suppress(OSError):
        record_launcher(job.run_dir, multi_node=job.multi_node)
    interrupted = False
    try:
        return _run_workers(job, started)
    except KeyboardInterrupt:
        interrupted = True  # `dllm run list`: interrupted, not died
        # Where it goes on from: a Ctrl-C said only `dllm: interrupted`, though a time budget
        # or a SIGTERM names the command; the line was left for `dllm run show` to find.
        from turbo_dllm.jobs.runs import resume_way

        print(
            f"dllm: run {job.plan.run_id} stopped by Ctrl-C (no result); "
            f"{resume_way(job.manifest, job.run_dir)}",
            file=sys.stderr,
            flush=True,
        )
        raise
    finally:
        # However start() ends (a result, an error, Ctrl-C): this launch no longer runs the
        # job, even where its process lives on (a Python session that called start()).
        end_launcher(job.run_dir, multi_node=job.multi_node, interrupted=interrupted)


def _run_workers(job: PreparedJob, started: str) -> int:
    plan = job.plan
    if plan.backend == "local":
        from turbo_dllm.jobs.backends.local import run_local

        try:
            code = run_local(plan)
        except KeyboardInterrupt:
            raise  # an interrupted launch leaves no result.json, as under torchrun
        except BaseException as error:
            # The trainer raised in this process: record the status this launch ends with, as
            # a failed torchrun job records torchrun's, so `dllm run list` says it failed.
            with contextlib.suppress(OSError):  # a full disk: the original error says more
                write_result(job.run_dir, _exit_status(error), started, plan.backend)
            raise
    else:
        from turbo_dllm.jobs.backends.torchrun import console_log, run_torchrun

        code = run_torchrun(plan, log_path=console_log(job.run_dir, job.multi_node))
    if not job.multi_node:
        write_result(job.run_dir, code, started, plan.backend)
    return code


def _discard(job: PreparedJob, made_run_dir: bool) -> None:
    """Remove what `materialize` wrote for a SLURM job that sbatch refused: a run that never
    ran, which `dllm run list` showed as `not submitted` and which held its run dir."""
    from turbo_dllm.jobs.backends.slurm import SCRIPT_NAME

    for name in (MANIFEST_NAME, SCRIPT_NAME, SPEC_NAME):
        with contextlib.suppress(OSError):
            (job.run_dir / name).unlink()
    if made_run_dir:
        with contextlib.suppress(OSError):  # not empty: the user's files stay
            job.run_dir.rmdir()


def _exit_status(error: BaseException) -> int:
    """The exit status of a `dllm` process that `error` ends: 2 for what the CLI reports as a
    user error (`DllmError`, a file-system error), a `SystemExit`'s own code, else 1 (a bug's
    traceback)."""
    if isinstance(error, SystemExit):
        code = error.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 2 if isinstance(error, (DllmError, OSError)) else 1
