"""SLURM backend: an sbatch script in the run dir that starts torchrun on every node.

One SLURM task per node runs torchrun, which starts one worker per GPU. The nodes meet through a
c10d rendezvous on the allocation's first host (from SLURM_JOB_NODELIST), with the job id as the
rendezvous id, so the script needs no address known at submission time. `--submit` hands the
script to `sbatch` when it is on PATH.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

from turbo_dllm.errors import DllmError
from turbo_dllm.jobs.backends.torchrun import torchrun_argv
from turbo_dllm.jobs.options import NodeRange, SlurmOptions
from turbo_dllm.jobs.plan import JobPlan, Rendezvous, SlurmJob

__all__ = [
    "SCRIPT_NAME",
    "find_sbatch",
    "render_script",
    "slurm_job",
    "srun_torchrun_argv",
    "submit",
]

SCRIPT_NAME = "job.sbatch"


def slurm_job(
    run_dir: Path, nnodes: NodeRange, gpus_per_node: int, options: SlurmOptions
) -> SlurmJob:
    script = str(Path(run_dir) / SCRIPT_NAME)
    nodes = str(nnodes.min) if not nnodes.elastic else f"{nnodes.min}-{nnodes.max}"
    return SlurmJob(
        script=script,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        cpus_per_task=options.cpus_per_task,
        partition=options.partition,
        account=options.account,
        time=options.time,
        extra=list(options.extra),
        submit=["sbatch", script],
    )


def srun_torchrun_argv(
    python: str,
    worker: list[str],
    nnodes: str,
    nproc_per_node: int,
    max_restarts: int,
    rendezvous: Rendezvous,
) -> list[str]:
    inner = torchrun_argv(python, worker, nnodes, nproc_per_node, rendezvous, None, max_restarts)
    return ["srun", "--kill-on-bad-exit=1", *inner]


def render_script(plan: JobPlan) -> str:
    """The sbatch script for a SLURM plan (deterministic: same plan, same bytes)."""
    job = plan.slurm
    if job is None:
        raise ValueError("render_script needs a SLURM plan")
    head = [
        "#!/bin/bash",
        f"# Written by `dllm launch` for run {plan.run_id}.",
        f"# The run manifest (what this job pins) is {plan.run_dir}/manifest.json.",
        f"#SBATCH --job-name=dllm-{plan.run_id}",
        f"#SBATCH --nodes={job.nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if job.gpus_per_node:
        head.append(f"#SBATCH --gpus-per-node={job.gpus_per_node}")
    if job.cpus_per_task:
        head.append(f"#SBATCH --cpus-per-task={job.cpus_per_task}")
    for flag, value in (("partition", job.partition), ("account", job.account), ("time", job.time)):
        if value:
            head.append(f"#SBATCH --{flag}={value}")
    head.append(f"#SBATCH --output={plan.run_dir}/slurm-%j.out")
    head += [f"#SBATCH {line}" for line in job.extra]
    srun = next(c.argv for c in plan.commands if c.argv[0] == "srun")
    body = [
        "",
        "set -euo pipefail",
        f"cd {shlex.quote(plan.cwd)}",
        "# The first node of the allocation hosts the c10d rendezvous store.",
        'DLLM_HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export DLLM_HEAD_NODE",
        *(f"export {key}={shlex.quote(value)}" for key, value in sorted(plan.env.items())),
        _wrapped(srun),
        "",
    ]
    return "\n".join(head + body)


def find_sbatch() -> str:
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise DllmError(
            "--submit needs sbatch, which is not on PATH (not a SLURM login node?)",
            hint="drop --submit to only write the job script into the run dir, then run "
            "`sbatch <run dir>/job.sbatch` on a SLURM login node",
        )
    return sbatch


def submit(script: Path) -> str:
    """Submit with sbatch; returns its output (the job id line)."""
    sbatch = find_sbatch()
    proc = subprocess.run([sbatch, str(script)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise DllmError(
            f"sbatch failed (exit {proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}",
            hint=f"fix the #SBATCH lines in {script} or pass --slurm-* options, then sbatch it",
        )
    return proc.stdout.strip()


def _wrapped(argv: list[str]) -> str:
    """One shell command: `srun ... -m torch.distributed.run`, then one option per line."""
    split = argv.index("torch.distributed.run") + 1
    segments: list[list[str]] = [argv[:split]]
    for word in argv[split:]:
        if word.startswith("-") and segments[-1][-1:] != ["-m"]:
            segments.append([])
        segments[-1].append(word)
    lines = [" ".join(_shell_word(word) for word in segment) for segment in segments]
    return " \\\n    ".join(lines)


def _shell_word(word: str) -> str:
    """Quote for bash, but let `$VAR` references expand (rendezvous endpoint and id)."""
    if "$" in word:
        return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return shlex.quote(word)
