"""Run dirs as data: find, list, summarize and compare the runs under a root (default ./runs).

A run's status comes from its `result.json` (the exit code) and, for a submitted SLURM job,
from SLURM itself: its job is pending or running before any result exists, and a job SLURM
ends (scancel, time limit, node failure) never writes one. A run resumed by hand (`dllm train
--run-dir`) is its latest attempt: its own `result.json` (`resumed_by`) outranks SLURM's word on
the job that came before.

A run that stopped early on purpose, to be resumed, is `stopped`, never `ok`: exit status 143
(SIGTERM, SLURM's time-limit warning: the step under way saved) or exit status 0 short of its
last step (`training.max_duration_s`, each attempt's time budget: the trainer saves and exits 0
so the next job resumes). `ok` is exit status 0 at the last step (or with no step recorded,
where nothing tells the two apart). `resume_command` names the command that continues it.

A local or torchrun run without a result has its launcher's record (`launcher.json`: host, pid,
start time; a `dllm train --run-dir` resume records itself the same way): `running` while
that process lives on this host, `died` once it is gone (SIGKILL, the OOM killer, a reboot:
nothing wrote a result), `interrupted` where Ctrl-C ended its launch (both with when the run
last wrote a step); `unknown` when it was launched on another host, which this one cannot
look into. A run recorded before launchers recorded themselves reads `no result`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from turbo_dllm.errors import DllmError
from turbo_dllm.jobs.drift import differ, flat_diff, manifest_drift
from turbo_dllm.jobs.manifest import MANIFEST_NAME, DriftItem, RunManifest, read_manifest
from turbo_dllm.jobs.result import launcher_alive, read_launchers, read_result, this_host
from turbo_dllm.train.metrics import METRICS_NAME, last_metrics_record
from turbo_dllm.train.stop import EXIT_TERMINATED, Stop

__all__ = [
    "DEFAULT_ROOT",
    "RunSummary",
    "check_root",
    "diff_manifests",
    "find_run",
    "last_step",
    "list_runs",
    "resume_command",
    "resume_way",
    "resume_where",
    "stop_cause",
    "summarize",
    "unreadable_runs",
    "unrecorded_runs",
]

DEFAULT_ROOT = "runs"
# SLURM states in which the batch script ran to its end and wrote result.json: the exit code
# there says more than SLURM's word. Every other end state (CANCELLED, TIMEOUT, ...) is SLURM's.
_SCRIPT_ENDED = ("COMPLETED", "FAILED")
# SLURM's words for a job it ended before its script did: its script, submitted again, resumes
# the run from its latest complete checkpoint.
_SLURM_ENDED = (
    "cancelled",
    "timeout",
    "preempted",
    "node_fail",
    "boot_fail",
    "deadline",
    "out_of_memory",
)


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    path: Path
    name: str | None
    created_at: str
    backend: str
    processes: str
    steps_done: int | None
    steps_total: int
    last_loss: float | None
    exit_code: int | None
    replay_of: str | None
    slurm_job_id: str | None = None
    slurm_state: str | None = None  # None: not a submitted SLURM job, or SLURM forgot it
    resumed: bool = False  # the latest attempt was a `dllm train` (SLURM's job is history)
    finished_at: str | None = None  # when its result.json says it ended
    # Without a result: "running", "died", "interrupted" or "unknown" from its launcher's
    # record (None: none).
    launcher: str | None = None
    launcher_hosts: tuple[str, ...] = ()  # where its launchers ran (every node's)
    last_written_at: str | None = None  # metrics.jsonl's last write (its last step)
    resumed_here: bool = False  # running: a `dllm train --run-dir` resume
    saved_nothing: bool = False  # stopped (143) with no checkpoint: before its first step
    slurm_unreachable: str | None = None  # why SLURM could not be asked (squeue missing, ...)
    # The command that continues the run from its last checkpoint (`resume_command`): shown
    # while the run is `resumable`.
    resume_with: str | None = None

    @property
    def stopped_by(self) -> str | None:
        """Why a `stopped` run stopped: "SIGTERM" (exit 143) or "training.max_duration_s"
        (exit 0 short of its last step); None for any other status."""
        if self.status != "stopped":
            return None
        return stop_cause(self.exit_code, self.steps_done, self.steps_total)

    @property
    def resumable(self) -> bool:
        """Whether the run ended short of its end with its checkpoints there to go on from, so
        that `resume_with` is the way on: `stopped`, `died`, `interrupted`, or a SLURM job that
        SLURM ended (cancelled, timeout, preempted, ...). Not a run that finished, still runs,
        failed (exit N: a resume fails the same way until the cause is fixed) or whose state
        is unknown."""
        status = self.status
        if status in ("stopped", "died", "interrupted"):
            return True
        return self.slurm_state is not None and status in _SLURM_ENDED

    @property
    def status(self) -> str:
        if self.slurm_state and self.slurm_state not in _SCRIPT_ENDED:
            return self.slurm_state.lower()  # pending, running, cancelled, timeout, ...
        if self.exit_code is not None:
            # SIGTERM / SLURM's warning (143), or the time budget (0 short of the last step):
            # saved, and resumable. Not "ok": a script reading that moved on with a run that
            # trained 21 of its 30 steps.
            if stop_cause(self.exit_code, self.steps_done, self.steps_total):
                return "stopped"
            return "ok" if self.exit_code == 0 else f"exit {self.exit_code}"
        if self.slurm_state:
            return self.slurm_state.lower()
        if self.backend == "slurm":
            # Submitted, but neither a result nor SLURM's memory of the job (squeue keeps
            # finished jobs for minutes; sacct only where the cluster keeps accounting).
            return "unknown" if self.slurm_job_id else "not submitted"
        # No launcher record: recorded before launchers recorded themselves, or killed between
        # writing its manifest and starting.
        return self.launcher or "no result"

    @property
    def status_detail(self) -> str:
        """The status with what it rests on, for people: where, and since when."""
        status = self.status
        if status in ("died", "interrupted"):
            when = (
                f"last wrote a step at {self.last_written_at}"
                if self.last_written_at
                else "before its first step"
            )
            why = "no launcher alive" if status == "died" else "stopped by Ctrl-C"
            return f"{status} ({when}; {why}, no result)"
        if status == "unknown" and self.slurm_unreachable:
            # Not a job SLURM forgot: a pending or running job read the same, with no word why.
            return f"unknown (no answer from SLURM: {self.slurm_unreachable})"
        if status == "unknown" and self.launcher == "unknown":
            return f"unknown (launched on {', '.join(self.launcher_hosts)})"
        if status == "running" and self.resumed_here:
            return "running (`dllm train` resume)"
        if status == "stopped" and self.saved_nothing:
            # It stopped before its first step (a SLURM time limit too short for one): there
            # was no step under way to save, and a resume starts over.
            return (
                f"stopped (exit {EXIT_TERMINATED} before it saved any step: a resume starts over)"
            )
        if status == "stopped" and self.stopped_by == Stop.TIME_LIMIT.cause:
            return (
                f"stopped (exit 0: {Stop.TIME_LIMIT.cause} reached at step {self.steps_done}/"
                f"{self.steps_total}, saved, resumable)"
            )
        if status == "stopped":
            return f"stopped (exit {EXIT_TERMINATED}: the step under way saved, resumable)"
        return status

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "path": str(self.path),
            "name": self.name,
            "created_at": self.created_at,
            "backend": self.backend,
            "processes": self.processes,
            "steps_done": self.steps_done,
            "steps_total": self.steps_total,
            "last_loss": self.last_loss,
            "exit_code": self.exit_code,
            "status": self.status,
            "stopped_by": self.stopped_by,
            "resume_command": self.resume_with if self.resumable else None,
            "slurm_job_id": self.slurm_job_id,
            "slurm_state": self.slurm_state,
            "slurm_unreachable": self.slurm_unreachable,
            "replay_of": self.replay_of,
            "finished_at": self.finished_at,
            "resumed": self.resumed,
            "launcher_hosts": list(self.launcher_hosts),
            "last_written_at": self.last_written_at,
        }


def check_root(root: str | Path) -> Path:
    """`root` as a folder of run dirs; a DllmError saying what it is when it is none."""
    root = Path(root)
    if root.is_dir():
        return root
    what = "is not a folder" if root.exists() else "does not exist"
    raise DllmError(
        f"run root {str(root)!r} {what}",
        hint="pass --root the folder that holds the run dirs (default ./runs), or a run dir path",
    )


def find_run(ref: str | Path, root: str | Path = DEFAULT_ROOT, *, manifest: bool = True) -> Path:
    """A run dir from a path, an id under `root`, or a unique prefix of one.
    With `manifest=False` (what reads only the metrics: plots) a folder `dllm train --run-dir`
    wrote, which has metrics but no manifest, counts too: as a path, or by its name under
    `root`."""
    path = Path(ref)
    if path.name == MANIFEST_NAME and path.is_file():
        return path.parent.resolve()
    root = Path(root)
    for folder in (path, root / path):  # a run dir's path, or its whole name under root
        if (folder / MANIFEST_NAME).is_file():
            return folder.resolve()
        if (folder / METRICS_NAME).is_file():
            if not manifest:
                return folder.resolve()
            raise DllmError(
                f"{str(folder)!r} has no {MANIFEST_NAME}: a `dllm train --run-dir` run, which "
                "records metrics and checkpoints only",
                hint="`dllm run plot` reads it; `dllm launch --config F` records a run with its "
                "manifest (show, diff, replay)",
            )
    candidates = sorted(
        p.parent for p in root.glob(f"*/{MANIFEST_NAME}") if p.parent.name.startswith(str(ref))
    )
    if len(candidates) == 1:
        return candidates[0].resolve()
    if candidates:
        raise DllmError(
            f"{str(ref)!r} matches {len(candidates)} runs under {root}: "
            + ", ".join(p.name for p in candidates[:8])
            + (", ..." if len(candidates) > 8 else ""),
            hint="give more of the run id",
        )
    for folder in (path, root / path):
        # A folder or file that is there but no run dir: "no run 'data' under runs" left out
        # why that path was not taken.
        if folder.exists():
            lacks = MANIFEST_NAME if manifest else f"{MANIFEST_NAME} or {METRICS_NAME}"
            what = f"it has no {lacks}" if folder.is_dir() else "a file"
            raise DllmError(
                f"{str(folder)!r} is not a run dir ({what})",
                hint="pass a run dir that `dllm launch` wrote, or its id (`dllm run list` shows "
                "them); --root names the folder that holds them",
            )
    where = "" if root.is_dir() else f" ({'not a folder' if root.exists() else 'no such folder'})"
    raise DllmError(
        f"no run {str(ref)!r} under {root}{where}",
        hint="`dllm run list` shows the runs; pass --root for another folder, or a run dir path",
    )


def unrecorded_runs(root: str | Path = DEFAULT_ROOT) -> list[Path]:
    """Folders under `root` with training metrics but no manifest: `dllm train --run-dir` runs
    (not replayable; `dllm run plot` reads them)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(
        p.parent for p in root.glob(f"*/{METRICS_NAME}") if not (p.parent / MANIFEST_NAME).exists()
    )


def unreadable_runs(root: str | Path, listed: list[RunSummary]) -> list[Path]:
    """Run dirs under `root` that `list_runs` could not read (a torn or edited manifest, or
    result / launcher / SLURM record): named by `dllm run list`, not left out without a word."""
    paths = {run.path for run in listed} | set(data_artifacts(root))
    return sorted(p.parent for p in Path(root).glob(f"*/{MANIFEST_NAME}") if p.parent not in paths)


def data_artifacts(root: str | Path) -> list[Path]:
    """Folders under `root` that are data artifacts (`dllm data prepare`'s manifest.json), not
    runs: `dllm run list --root data` named them runs "with a record that cannot be read"."""
    import json

    found = []
    for path in sorted(Path(root).glob(f"*/{MANIFEST_NAME}")):
        try:
            with open(path, "rb") as handle:
                text = handle.read(1 << 22)
            # only what could be one: a run's torn or nested-too-deep record stays unreadable
            document = json.loads(text) if b'"turbo_dllm.data.v1"' in text else None
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(document, dict) and document.get("format") == "turbo_dllm.data.v1":
            found.append(path.parent)
    return found


def list_runs(root: str | Path = DEFAULT_ROOT) -> list[RunSummary]:
    root = Path(root)
    if not root.is_dir():
        return []
    summaries = []
    for manifest_path in sorted(root.glob(f"*/{MANIFEST_NAME}")):
        try:
            summaries.append(summarize(manifest_path.parent, ask_slurm=False))
        except DllmError:
            continue  # not ours or damaged; `dllm run show` explains it
    summaries = _with_slurm_states(summaries)
    return sorted(summaries, key=lambda s: (s.created_at, s.run_id))


def summarize(
    run_dir: Path, manifest: RunManifest | None = None, *, ask_slurm: bool = True
) -> RunSummary:
    """A run's summary; `ask_slurm` queries SLURM for a submitted job's state."""
    manifest = manifest or read_manifest(run_dir)
    last = _last_step_record(run_dir)
    result = read_result(run_dir)  # None while absent; a damaged one raises (named apart)
    code = None if result is None else result.get("exit_code")
    finished_at = None if result is None else result.get("finished_at")
    plan = manifest.plan
    summary = RunSummary(
        run_id=manifest.run_id,
        path=Path(run_dir),
        name=_spec_field(manifest, "launch", "name", str),
        created_at=manifest.created_at,
        backend=plan.backend,
        processes=f"{plan.nnodes}x{plan.nproc_per_node}",
        steps_done=_number(last.get("step"), int),
        steps_total=_steps_total(run_dir, manifest),
        last_loss=_number(last.get("loss"), (int, float)),
        exit_code=_number(code, int),
        replay_of=manifest.replay_of.run_id if manifest.replay_of else None,
        slurm_job_id=_slurm_job_id(run_dir) if plan.backend == "slurm" else None,
        resumed=result is not None and result.get("resumed_by") is not None,
        finished_at=finished_at if isinstance(finished_at, str) else None,
        saved_nothing=code == EXIT_TERMINATED and not _has_checkpoint(run_dir, manifest),
        resume_with=resume_command(manifest, Path(run_dir).absolute()),
    )
    if result is None and plan.backend != "slurm":
        summary = _with_launcher(summary)
    return _with_slurm_states([summary])[0] if ask_slurm else summary


def stop_cause(exit_code: int | None, steps_done: int | None, steps_total: int) -> str | None:
    """Why a run with this exit status and progress stopped before its end, to be resumed:
    "SIGTERM" for exit status 143 (a SIGTERM, SLURM's time-limit warning, a worker's torchrun
    gone: the step under way saved), "training.max_duration_s" for exit status 0 short of its
    last step (its time budget ran out: saved, exit 0 so the next job resumes); None for a run
    that finished (0 at its last step, or no step recorded to tell), failed or has not ended."""
    if exit_code == EXIT_TERMINATED:
        return Stop.SIGTERM.cause
    if exit_code == 0 and steps_done is not None and steps_done < steps_total:
        return Stop.TIME_LIMIT.cause
    return None


def last_step(run_dir: Path) -> int | None:
    """The last step `metrics.jsonl` records in `run_dir` (None: none yet)."""
    return _number(_last_step_record(run_dir).get("step"), int)


def _last_step_record(run_dir: Path) -> dict[str, Any]:
    # the last record with an integer step (a damaged or step-less line is skipped)
    return last_metrics_record(run_dir, lambda r: _number(r.get("step"), int) is not None)


def resume_command(manifest: RunManifest, run_dir: Path) -> str:
    """The command that continues the run in `run_dir` from its last checkpoint, with its
    layout; the one every message names (`dllm run show`'s `resume`, the launch's closing
    line, a refused launch's or `dllm train`'s ways on: `resume_way`).

    A SLURM job: its script submitted again. A multi-node job: its launch, run again on every
    node from the folder it ran in (its nodes join the run again and resume); a static
    rendezvous's `--node-rank` reads `R`, each node's own rank (the manifest holds the argv of
    the node that recorded it). One process: `dllm train` with the environment its plan
    recorded (its thread count, `OMP_NUM_THREADS=N`: a bare `dllm train` ran with this shell's,
    which changes how CPU ops round; none for a run recorded before the field, which ran with
    torch's default). Several on one node: that `dllm train` under torchrun with the plan's
    process count and worker environment (a bare `dllm train` of a 2-process run stops at the
    topology's world size check)."""
    plan = manifest.plan
    if plan.slurm is not None:
        return f"sbatch {shlex.quote(plan.slurm.script)}"
    if plan.multi_node:
        argv = list(manifest.argv)
        if "--node-rank" in argv[:-1]:
            argv[argv.index("--node-rank") + 1] = NODE_RANK
        return f"cd {shlex.quote(plan.cwd)} && {shlex.join(argv)}"
    run_dir = Path(run_dir)
    spec = shlex.quote(str(run_dir / "spec.yaml"))  # launcher.SPEC_NAME
    train = f"--config {spec} --run-dir {shlex.quote(str(run_dir))}"
    env = " ".join(f"{key}={shlex.quote(value)}" for key, value in sorted(plan.env.items()))
    if plan.world_sizes == [1]:
        return f"{env + ' ' if env else ''}dllm train {train}"
    torchrun = shlex.join(
        [plan.worker[0], "-m", "torch.distributed.run", "--standalone"]
        + ["--nproc-per-node", str(plan.nproc_per_node)]
    )
    return f"{env} {torchrun} -m turbo_dllm train {train}"


# The word a multi-node resume command has for each node's own --node-rank.
NODE_RANK = "R"


def resume_where(manifest: RunManifest) -> str:
    """Where `resume_command` runs, where that needs saying: for a multi-node job "on every node
    (...)", with what `R` is; "" otherwise. Every message that prints the command says it so."""
    if not manifest.plan.multi_node or manifest.plan.slurm is not None:
        return ""
    rank = f"; {NODE_RANK}: that node's --node-rank" if "--node-rank" in manifest.argv else ""
    return f"on every node (its launch again, whose nodes join the run and resume{rank})"


def resume_way(manifest: RunManifest, run_dir: Path) -> str:
    """`resume_command` as a refusal's way on: what it runs under, then the command."""
    plan = manifest.plan
    if plan.slurm is not None:
        under = " as a SLURM job"
    elif plan.multi_node:
        under = f" {resume_where(manifest)}"
    elif plan.world_sizes == [1]:
        under = ""
    else:
        under = " (under torchrun, as its plan does)"
    return f"continue it from its last checkpoint{under}: {resume_command(manifest, run_dir)}"


def _has_checkpoint(run_dir: Path, manifest: RunManifest) -> bool:
    """Whether the run's checkpoint dir (checkpoint.dir, relative to the launch's folder, or
    <run dir>/checkpoints) holds a saved step (train.checkpoint, which imports torch, names
    them step_<N>, each with its checkpoint.json)."""
    recorded = _spec_field(manifest, "checkpoint", "dir", str)
    directory = Path(manifest.plan.cwd) / recorded if recorded else Path(run_dir) / "checkpoints"
    try:
        steps = [*directory.glob("step_*"), *directory.glob(".old-step_*")]
        return any((step / "checkpoint.json").is_file() for step in steps)
    except OSError:
        return True  # cannot tell: say what a stop normally does


def _with_launcher(summary: RunSummary) -> RunSummary:
    """A run without a result, with what its launchers' records say (module doc)."""
    records = read_launchers(summary.path)
    if not records:
        return summary
    alive = [launcher_alive(record) for record in records]
    hosts = tuple(dict.fromkeys(str(record["host"]) for record in records))
    metrics = summary.path / METRICS_NAME
    try:
        mtime = metrics.stat().st_mtime
    except OSError:
        written = None
    else:
        written = datetime.fromtimestamp(mtime, timezone.utc).isoformat(timespec="seconds")
    if True in alive:
        state = "running"
    elif None in alive:  # another host's launcher (a multi-node job's other nodes)
        state = "unknown"
    elif any(record.get("interrupted") for record in records):
        state = "interrupted"  # Ctrl-C ended its launch (no result, by design)
    else:
        state = "died"
    # a `dllm train --run-dir` resume records itself as the launcher, "by" it
    resumed_here = any(
        live and record.get("by") == "dllm train"
        for record, live in zip(records, alive, strict=True)
    )
    return replace(
        summary,
        launcher=state,
        launcher_hosts=tuple(h for h in hosts if state != "unknown" or h != this_host()),
        last_written_at=written,
        resumed_here=resumed_here,
    )


def _spec_field(manifest: RunManifest, section: str, key: str, kind: type) -> Any:
    """A recorded spec field if it is a `kind`, else None (RunManifest.recorded)."""
    value = manifest.recorded(section, key)
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def _steps_total(run_dir: Path, manifest: RunManifest) -> int:
    steps = _spec_field(manifest, "training", "steps", int)
    if steps is None:  # was a KeyError traceback in `run list` (every run's) and `run show`
        raise DllmError(
            f"the run manifest in {str(run_dir)!r} records a spec without training.steps (an "
            "integer): written by another version of turbo-dllm, or edited",
            hint=f"`dllm run show {Path(run_dir).name} --json` prints the manifest as recorded",
        )
    return steps


def _number(value: Any, kind: type | tuple[type, ...]) -> Any:
    """`value` if it is a number of `kind` (never a bool), else None: files a person edited or
    damaged read as unknown, not as a crash."""
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def _slurm_job_id(run_dir: Path) -> str | None:
    from turbo_dllm.jobs.backends.slurm import read_submission

    record = read_submission(run_dir)  # None also for one not UTF-8 or nested past the parser
    return str(record["job_id"]) if record else None


def _with_slurm_states(summaries: list[RunSummary]) -> list[RunSummary]:
    """Fill in SLURM's state of the submitted jobs that may still be running or that SLURM may
    have ended (one query for all of them); a clean exit code needs no question."""
    from turbo_dllm.jobs.backends.slurm import query_job_states

    ask = [
        s.slurm_job_id for s in summaries if s.slurm_job_id and s.exit_code != 0 and not s.resumed
    ]
    if not ask:
        return summaries
    states, problem = query_job_states(ask)
    return [
        replace(s, slurm_state=states.get(s.slurm_job_id), slurm_unreachable=problem)
        if s.slurm_job_id in ask
        else s
        for s in summaries
    ]


def diff_manifests(a: RunManifest, b: RunManifest) -> dict[str, list[DriftItem]]:
    """Two manifests side by side, grouped: replay-relevant inputs first, then spec and plan.

    A spec or plan field whose values differ only where each names its own run (its dir, its
    id) is left out, so paths that only say "this run" do not bury the differences that
    matter; the dirs and ids show once under "run". Every group's values differ by type as
    well as value (`drift.differ`).
    """
    dump_a, dump_b = a.model_dump(mode="json"), b.model_dump(mode="json")
    only_the_run = _differ_only_by_the_run(a, b)
    return {
        "inputs": manifest_drift(a, b),
        **{
            group: [
                item
                for item in flat_diff(dump_a[group], dump_b[group], group)
                if not only_the_run(item)
            ]
            for group in ("spec", "plan")
        },
        "run": [
            # Only where it differs: a run diffed with itself listed its dir as a difference.
            *(
                [DriftItem(field="run_dir", recorded=a.plan.run_dir, current=b.plan.run_dir)]
                if a.plan.run_dir != b.plan.run_dir
                else []
            ),
            *(
                item
                for key in ("run_id", "created_at", "argv", "seeds", "replay_of")
                for item in flat_diff({key: dump_a.get(key)}, {key: dump_b.get(key)})
            ),
        ],
    }


def _differ_only_by_the_run(a: RunManifest, b: RunManifest) -> Callable[[DriftItem], bool]:
    """Whether a field's two values are one value, each naming its own run: a's becomes b's
    when its run dir and its id (as a word of its own: a path part, a job name's) are swapped
    for b's, or the other way round. Both ways, because an id may also stand as a word in a
    path both runs share (runs `a` and `b` under a folder `x-b`): swapping b's id out of b's
    value would change that shared part too, swapping a's into it does not."""

    def into(src: RunManifest, dst: RunManifest) -> Callable[[Any], Any]:
        run_id = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(src.run_id)}(?![A-Za-z0-9_])")

        def swap(value: Any) -> Any:  # a leaf may be a list (argv) or a dict
            if isinstance(value, str):
                parts = value.split(src.plan.run_dir)
                return dst.plan.run_dir.join(run_id.sub(lambda _: dst.run_id, p) for p in parts)
            if isinstance(value, list):
                return [swap(v) for v in value]
            if isinstance(value, dict):
                return {k: swap(v) for k, v in value.items()}
            return value

        return swap

    a_to_b, b_to_a = into(a, b), into(b, a)

    def only_the_run(item: DriftItem) -> bool:
        left, right = item.recorded, item.current
        # by type as well as value, as flat_diff compares (`drift.differ`: 1 is not 1.0)
        return not differ(a_to_b(left), right) or not differ(b_to_a(right), left)

    return only_the_run
