"""SLURM backend: an sbatch script in the run dir that starts torchrun on every node.

One SLURM task per node runs torchrun, which starts one worker per GPU (or per CPU process).
The nodes meet through a c10d rendezvous on the allocation's first host (from
SLURM_JOB_NODELIST), with the job id as the rendezvous id, so the script needs no address known
at submission time. Its port is derived from the job id too (unless --master-port fixes one):
two jobs that share a node then meet on different ports instead of the second one failing with
RendezvousConnectionError.

With a time limit (`--time`) the script asks SLURM to warn the job's steps `stop_warning_s`
seconds before it (`#SBATCH --signal=USR1@<s>`): srun starts torchrun under `slurm_step`, which
turns that warning into one SIGTERM for each worker, so the workers save the step under way and
the job ends before the limit (exit 143) instead of being killed at it. An `--sbatch` line of
the user's own `--signal=USR1@<s>` comes later in the script, and sbatch takes it instead.

`--submit` hands the script to `sbatch` and records the job id in the run dir
(`slurm_job.json`); the script records srun's exit status (`result.json`) when it ends, and
`job_states` asks SLURM (squeue, then sacct) about jobs that have not ended or never got there
(cancelled, timed out).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from turbo_dllm.errors import DllmError
from turbo_dllm.formats import read_json_record
from turbo_dllm.fsutil import write_atomic
from turbo_dllm.jobs.backends.torchrun import torchrun_argv
from turbo_dllm.jobs.options import NodeRange, SlurmOptions
from turbo_dllm.jobs.plan import JobPlan, Rendezvous, SlurmJob
from turbo_dllm.jobs.result import now
from turbo_dllm.train.stop import EXIT_TERMINATED

__all__ = [
    "PORT_BASE",
    "PORT_SPAN",
    "SCRIPT_NAME",
    "STOP_WARNING_S",
    "SUBMISSION_NAME",
    "find_sbatch",
    "job_states",
    "query_job_states",
    "read_submission",
    "record_running_job",
    "render_script",
    "rendezvous_endpoint",
    "shell_line",
    "slurm_job",
    "srun_torchrun_argv",
    "stop_warning_s",
    "submit",
    "time_limit_s",
]

SCRIPT_NAME = "job.sbatch"
SUBMISSION_NAME = "slurm_job.json"
SUBMISSION_FORMAT = "turbo_dllm.slurm_job.v1"
# Rendezvous ports 20000..29999: below Linux's ephemeral range (32768+), where the kernel picks
# the ports of outgoing connections, so a derived port is not taken by chance.
PORT_BASE = 20000
PORT_SPAN = 10000
_DERIVED_PORT = "$DLLM_RDZV_PORT"
_HEAD_NODE = "$DLLM_HEAD_NODE"
_NAMES = r"(?:DLLM_HEAD_NODE|DLLM_RDZV_PORT|DLLM_STARTED|DLLM_STATUS|SLURM_JOB_ID)\b"
_SCRIPT_VARIABLE = re.compile(r"\$" + _NAMES)
_OTHER_DOLLAR = re.compile(r"\$(?!" + _NAMES + ")")
_JOB_ID = re.compile(r"^(\d+)(?:;(\S+))?$|Submitted batch job (\d+)")
# How long before its time limit a job is warned (SIGUSR1) to save the step under way and stop:
# the step's end, a save, and SLURM's timer, which may send the warning up to a minute early.
# A short limit is warned a quarter of it ahead instead.
STOP_WARNING_S = 300
_STEP_MODULE = "turbo_dllm.jobs.backends.slurm_step"


def time_limit_s(time: str | None) -> int | None:
    """A SLURM time limit (sbatch --time: MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS,
    DAYS-HOURS, DAYS-HOURS:MINUTES, DAYS-HOURS:MINUTES:SECONDS) in seconds; None for none
    (unset, UNLIMITED, INFINITE, 0)."""
    if time is None or time.strip().lower() in ("unlimited", "infinite"):
        return None
    days, dash, clock = time.strip().partition("-")
    if not dash:
        days, clock = "0", days
    parts = [int(part) for part in clock.split(":")]
    if dash:  # DAYS-HOURS[:MINUTES[:SECONDS]]
        hours, minutes, seconds = (parts + [0, 0])[:3]
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    else:  # MINUTES[:SECONDS]
        hours, (minutes, seconds) = 0, (parts + [0])[:2]
    total = ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    return total or None


def stop_warning_s(time: str | None) -> int | None:
    """How long before the time limit `time` the job's steps are warned; None without one."""
    limit = time_limit_s(time)
    return None if limit is None else max(1, min(STOP_WARNING_S, limit // 4))


def slurm_job(
    run_dir: Path,
    nnodes: NodeRange,
    gpus_per_node: int,
    cpus_per_task: int,
    options: SlurmOptions,
) -> SlurmJob:
    if any(c in str(run_dir) for c in '"\\\n\r'):
        # The #SBATCH lines name the run dir (--output), and sbatch reads a directive only up
        # to a line break; a backslash in --output turns off its %j pattern.
        raise DllmError(
            "a SLURM job's run dir cannot hold a double quote, a backslash or a line break: "
            f"{str(run_dir)!r}",
            hint="choose another run dir (--run-dir, launch.run_dir or --run-root)",
        )
    script = str(Path(run_dir) / SCRIPT_NAME)
    nodes = str(nnodes.min) if not nnodes.elastic else f"{nnodes.min}-{nnodes.max}"
    return SlurmJob(
        script=script,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        cpus_per_task=cpus_per_task,
        partition=options.partition,
        account=options.account,
        time=options.time,
        stop_warning_s=stop_warning_s(options.time),
        extra=list(options.extra),
        submit=["sbatch", "--parsable", script],
    )


def rendezvous_endpoint(master_port: int | None) -> str:
    """The c10d endpoint the script expands: the head node, a fixed port or the job's own."""
    return f"{_HEAD_NODE}:{master_port if master_port else _DERIVED_PORT}"


def srun_torchrun_argv(
    python: str,
    worker: list[str],
    nnodes: str,
    nproc_per_node: int,
    max_restarts: int,
    rendezvous: Rendezvous,
    cpus_per_task: int,
    log_dir: str,
) -> list[str]:
    inner = torchrun_argv(
        python, worker, nnodes, nproc_per_node, rendezvous, None, max_restarts, log_dir
    )
    # srun does not inherit sbatch's --cpus-per-task (SLURM 22.05+): without it the step, and
    # so every worker torchrun starts, may be confined to one CPU. torchrun runs under
    # slurm_step, which stops it on SLURM's warning before the time limit.
    step = [python, "-m", _STEP_MODULE]
    return ["srun", "--kill-on-bad-exit=1", f"--cpus-per-task={cpus_per_task}", *step, *inner]


def render_script(plan: JobPlan, checkpoint_dir: str | None = None) -> str:
    """The sbatch script for a SLURM plan (deterministic: same plan, same bytes);
    `checkpoint_dir`: the spec's checkpoint.dir (unset: <run dir>/checkpoints)."""
    job = plan.slurm
    if job is None:
        raise ValueError("render_script needs a SLURM plan")
    head = [
        "#!/bin/bash",
        f"# Written by `dllm launch` for run {plan.run_id}.",
        f"# The run manifest (what this job pins) is {plan.run_dir}/manifest.json.",
        f"#SBATCH --job-name={_sbatch_value(f'dllm-{plan.run_id}')}",
        f"#SBATCH --nodes={job.nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if job.gpus_per_node:
        head.append(f"#SBATCH --gpus-per-node={job.gpus_per_node}")
    if job.cpus_per_task:
        head.append(f"#SBATCH --cpus-per-task={job.cpus_per_task}")
    for flag, value in (("partition", job.partition), ("account", job.account), ("time", job.time)):
        if value:
            head.append(f"#SBATCH --{flag}={_sbatch_value(value)}")
    # sbatch expands %-patterns in the whole path (%x: the job name, %j: its id): a run dir
    # with a `%` (runs/p%xq) named a folder that does not exist, and the job failed to start.
    output = plan.run_dir.replace("%", "%%") + "/slurm-%j.out"
    head.append(f"#SBATCH --output={_sbatch_value(output)}")
    # A requeued job (scontrol requeue, a node failure, preemption) keeps its id, so its next
    # start writes the same slurm-<id>.out, which sbatch's default (truncate) emptied: the
    # earlier attempt's steps and errors were lost.
    head.append("#SBATCH --open-mode=append")
    if job.stop_warning_s:
        # To every process of the job's steps (not `B:`, the batch shell alone, which would
        # have to reach each node's step itself); slurm_step acts on it.
        head.append(f"#SBATCH --signal=USR1@{job.stop_warning_s}")
    head += [f"#SBATCH {line}" for line in job.extra]
    srun = next(c.argv for c in plan.commands if c.argv[0] == "srun")
    port = []
    if _DERIVED_PORT in (plan.rendezvous.endpoint or ""):
        port = [
            "# Jobs sharing a node must not share a rendezvous port: each takes its own from the "
            "job id.",
            f"DLLM_RDZV_PORT=$(({PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN}))",
        ]
    record = [
        plan.worker[0],
        "-m",
        "turbo_dllm.jobs.result",
        "--run-dir",
        plan.run_dir,
        "--backend",
        "slurm",
        "--slurm-job-id",
        "$SLURM_JOB_ID",
        "--started",
        "$DLLM_STARTED",
        "--exit-code",
        "$DLLM_STATUS",
    ]
    started = [
        plan.worker[0],
        "-m",
        "turbo_dllm.jobs.result",
        "--run-dir",
        plan.run_dir,
        "--job-started",
        "--slurm-job-id",
        "$SLURM_JOB_ID",
    ]
    body = [
        "",
        "set -euo pipefail",
        f"cd {shlex.quote(plan.cwd)}",
        "# This job is the run's latest attempt (also when resubmitted with `sbatch` by hand):",
        "# its id for `dllm run list`, and no earlier attempt's result.json.",
        shell_line(started),
        "# The first node of the allocation hosts the c10d rendezvous store. (sed reads every",
        "# line: `head -n 1` left early, and under pipefail the SIGPIPE that scontrol then got",
        "# writing a long node list ended the script.)",
        'DLLM_HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        *port,
        *(f"export {key}={shlex.quote(value)}" for key, value in sorted(plan.env.items())),
        "DLLM_STARTED=$(date -u +%Y-%m-%dT%H:%M:%S+00:00)",
        "DLLM_STATUS=0",
        _wrapped(srun) + " || DLLM_STATUS=$?",
        f"if [ \"$DLLM_STATUS\" -eq {EXIT_TERMINATED} ]; then",
        "  # Saved only if a step was under way, or an earlier one was: a stop before the first",
        "  # step (a time limit too short for one) leaves nothing to continue from.",
        f"  if ls -d -- {shlex.quote(checkpoint_dir or plan.run_dir + '/checkpoints')}/step_* "
        "> /dev/null 2>&1; then",
        f"    echo {shlex.quote(_stopped_message(plan))} >&2",
        "  else",
        f"    echo {shlex.quote(_stopped_message(plan, saved=False))} >&2",
        "  fi",
        "fi",
        "# How the workers ended, for `dllm run list` (a job SLURM kills never gets here).",
        shell_line(record),
        'exit "$DLLM_STATUS"',
        "",
    ]
    return "\n".join(head + body)


def _stopped_message(plan: JobPlan, saved: bool = True) -> str:
    """What the job says when its workers stopped on the warning (slurm_step's 143); `saved`:
    whether its checkpoint dir holds a step to continue from."""
    script = shlex.quote(plan.slurm.script) if plan.slurm else SCRIPT_NAME
    if not saved:
        return (
            f"dllm: run {plan.run_id} stopped before its time limit (SIGUSR1: SLURM's warning, "
            f"or scancel --signal=USR1) before it had saved any step (exit {EXIT_TERMINATED}): "
            "nothing to continue from, the script submitted again starts it over; if the limit "
            f"left no time for a step, give it more: sbatch --time=MINUTES {script}"
        )
    return (
        f"dllm: run {plan.run_id} stopped before its time limit (SIGUSR1: SLURM's warning, or "
        f"scancel --signal=USR1), the step under way saved (exit {EXIT_TERMINATED}); continue "
        f"it from there with: sbatch {script}"
    )


def _sbatch_value(value: str) -> str:
    """An `#SBATCH` option's value as sbatch reads it back: unless double-quoted, it splits a
    directive at white space (a run dir with a space became a second, invalid directive), ends
    it at a `#` (a comment) and takes a `'` for a quote."""
    if not any(c.isspace() or c in "#'" for c in value):
        return value
    return f'"{value}"'


def shell_line(argv: list[str]) -> str:
    """One bash command line that lets the script's `$VAR`s expand (endpoint, job id) and
    quotes everything else: what `--dry-run` prints for the srun step."""
    return " ".join(_shell_word(word) for word in argv)


def find_sbatch() -> str:
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise DllmError(
            "--submit needs sbatch, which is not on PATH (not a SLURM login node?)",
            hint="drop --submit to only write the job script into the run dir, then run "
            "`sbatch <run dir>/job.sbatch` on a SLURM login node",
        )
    return sbatch


def submit(job: SlurmJob, run_dir: Path) -> str:
    """Submit with sbatch, record the job id in the run dir and return it."""
    sbatch = find_sbatch()
    proc = subprocess.run([sbatch, *job.submit[1:]], capture_output=True, text=True)
    if proc.returncode != 0:
        said = proc.stderr.strip() or proc.stdout.strip()
        hint = (
            "launch again with what the cluster accepts: --partition, --account, --time, "
            "--gpus-per-node, --cpus-per-task or --sbatch 'OPTION'"
        )
        if any(words in said for words in _NO_CONTROLLER):
            # No job option is at fault: the hint sent the user to change options that sbatch
            # never got to read.
            hint = (
                "sbatch reached no SLURM controller: on a SLURM login node, check its "
                "configuration (SLURM_CONF) and that the controller answers (`sinfo`), then "
                "launch again"
            )
        raise DllmError(f"sbatch failed (exit {proc.returncode}): {said}", hint=hint)
    job_id, cluster = _parse_job_id(proc.stdout)
    _write_submission(Path(run_dir), job_id, cluster, job.script)
    return job_id


# What sbatch says when it reaches no controller (its configuration is missing, or the
# controller is down or unreachable), whatever the job asks for.
_NO_CONTROLLER = (
    "Unable to contact slurm controller",
    "Could not establish a configuration source",
    "Unable to establish a configuration source",
)


def _write_submission(run_dir: Path, job_id: str, cluster: str | None, script: str) -> None:
    record = {
        "format": SUBMISSION_FORMAT,
        "job_id": job_id,
        "cluster": cluster,
        "submitted_at": now(),
        "script": script,
    }
    write_atomic(run_dir / SUBMISSION_NAME, json.dumps(record, indent=2) + "\n")


def record_running_job(run_dir: Path, job_id: str) -> None:
    """The batch script's first step: this job is the run's latest attempt. Its id replaces an
    earlier job's (a resubmitted `sbatch job.sbatch` read as the cancelled job it followed) or
    is recorded for the first time (a script the user submitted without `--submit` read as
    `not submitted`), and an earlier attempt's result.json goes (it read as this one's). A
    damaged record is replaced with a warning naming it: stopping the job would help no one.
    A DllmError, touching nothing, where the recorded job is another one SLURM still runs (the
    script submitted twice): that job is the run's, and this one must not train beside it."""
    import sys

    from turbo_dllm.jobs.result import RESULT_NAME

    try:
        recorded = read_submission(run_dir)
    except DllmError as error:
        print(
            f"dllm: warning: {error.message}; this job records itself in its place", file=sys.stderr
        )
        recorded = None
    if recorded is not None and str(recorded["job_id"]) != job_id:
        earlier = str(recorded["job_id"])
        state = job_states([earlier]).get(earlier)
        if state in _TRAINING_STATES:
            # The same script submitted twice: the trainer's lock stops this job's workers, but
            # this step had already taken the run over (slurm_job.json named this job, and its
            # end wrote result.json, exit 1) while the earlier job trained on: `dllm run list`
            # read `exit 1` for a running run, and its record named the wrong job to scancel.
            script = recorded.get("script") or str(run_dir / SCRIPT_NAME)
            raise DllmError(
                f"run dir {run_dir} is being trained by SLURM job {earlier} ({state}): this job "
                f"({job_id}) would train into it too, so it ends here, leaving the run's records "
                "to that job",
                hint=f"one job per run dir: to continue the run after job {earlier} has ended, "
                f"submit it again then (sbatch {shlex.quote(script)}); to run another, launch it "
                "into a new run dir (--run-dir)",
            )
    if recorded is None or str(recorded["job_id"]) != job_id:
        cluster = os.environ.get("SLURM_CLUSTER_NAME") or None
        _write_submission(run_dir, job_id, cluster, str(run_dir / SCRIPT_NAME))
    (run_dir / RESULT_NAME).unlink(missing_ok=True)


# SLURM states of a job whose workers may be training (squeue's %T words).
_TRAINING_STATES = frozenset(
    {"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "RESIZING"}
)


class _Submission(BaseModel):
    """`slurm_job.json` as `_write_submission` writes it (strict: no `"job_id": 12`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    format: str
    job_id: str = Field(min_length=1)
    cluster: str | None
    submitted_at: str
    script: str


def read_submission(run_dir: Path) -> dict[str, Any] | None:
    """The submission record of a run dir, or None if its job was never submitted. One that
    cannot be read (torn, not UTF-8, nested past the parser's depth), of another format or
    invalid is a DllmError naming it, not read as `not submitted`."""
    record = read_json_record(
        Path(run_dir) / SUBMISSION_NAME,
        _Submission,
        expected=SUBMISSION_FORMAT,
        what="SLURM job record",
        writer="`dllm launch --submit` writes it, and the job itself when it starts",
        without="the run reads as `not submitted` until its job starts (its script records "
        "the job again)",
    )
    return None if record is None else record.model_dump(exclude_unset=True)


def job_states(job_ids: Iterable[str]) -> dict[str, str]:
    """SLURM's state (PENDING, RUNNING, COMPLETED, CANCELLED, ...) of each job it knows.

    squeue answers from the controller's memory, which also keeps finished jobs for a while
    (MinJobAge, 300 s by default); sacct answers from accounting, where a cluster keeps it.
    Jobs neither knows (or no SLURM commands here) are left out: their state is unknown.
    """
    return query_job_states(job_ids)[0]


def query_job_states(job_ids: Iterable[str]) -> tuple[dict[str, str], str | None]:
    """`job_states`, and why SLURM could not be asked where it could not (None where squeue
    answered, if only that it knows none of the jobs): squeue not on PATH, or its error (the
    controller down or unreachable). A job left out then is not one SLURM forgot."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}, None
    states, problem = _states(
        ["squeue", "--states=all", "--noheader", "--format=%i|%T", f"--jobs={','.join(ids)}"]
    )
    missing = [job_id for job_id in ids if job_id not in states]
    if missing:
        states |= _states(
            [
                "sacct",
                "--allocations",
                "--noheader",
                "--parsable2",
                "--format=JobIDRaw,State",
                f"--jobs={','.join(missing)}",
            ]
        )[0]
    return {job_id: states[job_id] for job_id in ids if job_id in states}, problem


def _states(argv: list[str]) -> tuple[dict[str, str], str | None]:
    """`id|STATE` lines of a SLURM query, and what kept the command from answering: nothing
    when it is missing or refuses (an id the controller has forgotten, accounting disabled,
    controller down), with why unless it refused only the ids (`Invalid job id specified`)."""
    command = shutil.which(argv[0])
    if command is None:
        return {}, f"{argv[0]} is not on PATH"
    try:
        proc = subprocess.run([command, *argv[1:]], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return {}, f"{argv[0]} did not answer in 30 s"
    except OSError as error:
        return {}, f"{argv[0]} could not run: {error.strerror or error}"
    if proc.returncode != 0:
        said = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        if any("Invalid job id" in line for line in said):
            return {}, None  # the controller answered: it knows none of these jobs
        return {}, f"{argv[0]} failed (exit {proc.returncode})" + (f": {said[-1]}" if said else "")
    states = {}
    for line in proc.stdout.splitlines():
        job_id, sep, state = line.strip().partition("|")
        if sep and state.strip():
            states[job_id.strip()] = state.split()[0]  # sacct: "CANCELLED by 0"
    return states, None


def _parse_job_id(output: str) -> tuple[str, str | None]:
    for line in reversed(output.strip().splitlines()):
        match = _JOB_ID.search(line.strip())
        if match:
            return match.group(1) or match.group(3), match.group(2)
    raise DllmError(
        f"sbatch printed no job id: {output.strip()!r}",
        hint="check the job with squeue; `dllm run list` cannot follow it without the id",
    )


def _wrapped(argv: list[str]) -> str:
    """One shell command: `srun ... -m torch.distributed.run`, then one option per line."""
    split = argv.index("torch.distributed.run") + 1
    segments: list[list[str]] = [argv[:split]]
    for word in argv[split:]:
        if word.startswith("-") and segments[-1][-1:] != ["-m"]:
            segments.append([])
        segments[-1].append(word)
    lines = [shell_line(segment) for segment in segments]
    return " \\\n    ".join(lines)


def _shell_word(word: str) -> str:
    """Quote for bash, but let the script's own variables expand (rendezvous endpoint and id,
    start time, exit status); any other `$` (in a path, say) stays literal."""
    if not _SCRIPT_VARIABLE.search(word):
        return shlex.quote(word)
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`")
    return '"' + _OTHER_DOLLAR.sub(r"\\$", escaped) + '"'
