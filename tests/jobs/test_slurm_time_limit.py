"""A SLURM job that reaches its time limit on the real one-node cluster (slurm_cluster.py): the
step under way is saved before the limit, so nothing is lost, and the run continues from it.

Seen before: at the limit SLURM sent SIGTERM to every process of the job's steps (torchrun and
each worker, as its process tracking does) and srun passed it on again; torchrun passed its own
two on to the workers, so each worker got a second SIGTERM, which ends the trainer at once
(train/stop.py), and SLURM killed what was left after KillWait: every step since the last
checkpoint was lost. Now the script asks SLURM to warn the job's steps before the limit
(`#SBATCH --signal=USR1@<s>`), and the step's supervisor (jobs/backends/slurm_step.py) turns
that warning into one SIGTERM for each worker.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.jobs import test_slurm_cluster
from tests.jobs.test_slurm_cluster import losses, statuses
from turbo_dllm.train.checkpoint import find_latest, read_meta

pytestmark = pytest.mark.slow
submit = test_slurm_cluster.submit  # the fixture

# One minute, SLURM's shortest: it warns the job a quarter of its limit (15 s) before it, give or
# take its 30 s timer (it checks limits every 30 s and warns at the first check within warning
# + 30 s of the limit), so 15 to 45 s in, and ends it at 60 to 90 s. The workers train from about
# 15 s in on 2 loaded cores; a warning before their first step is the precondition missed, not
# the property (test_slurm_stop_before_first_step.py tests that case), so then the job runs
# again with two minutes: warned 60 to 90 s in, as this test always waited before.
LIMITS = (("--time", "1"), ("--time", "2"))
LONG = ("--set", "training.steps=1000000")  # trains until SLURM stops it
ENDED = {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"}


def saved_step(run_dir: Path) -> int | None:
    latest = find_latest(run_dir / "checkpoints")
    return None if latest is None else read_meta(latest).step


def trained_a_step(run_dir: Path) -> bool:
    metrics = run_dir / "metrics.jsonl"
    return metrics.is_file() and bool(metrics.read_text().strip())


def test_a_job_at_its_time_limit_saves_the_step_under_way(submit, slurm_cluster, cli):
    for attempt, limit in enumerate(LIMITS):
        name = "limited" if attempt == 0 else f"limited-{limit[1]}min"
        run_dir, job_id = submit(name, "--cpus-per-task", "1", *limit, *LONG)
        state = slurm_cluster.wait_for(job_id, ENDED, timeout=240)
        if trained_a_step(run_dir):
            break
    log = (run_dir / f"slurm-{job_id}.out").read_text()
    trained = losses(run_dir)[-1][0]
    saved = saved_step(run_dir)
    assert saved == trained, (
        f"{trained - (saved or 0)} steps lost: trained to step {trained}, last checkpoint "
        f"{saved} (SLURM: {state})\n{log[-3000:]}"
    )
    # Stopped before the limit (not SLURM's TIMEOUT), and says so with the way on.
    assert state == "FAILED", log[-3000:]  # the script's exit status, 143
    assert json.loads((run_dir / "result.json").read_text())["exit_code"] == 143
    assert statuses(cli)[name] == "stopped"
    script = run_dir / "job.sbatch"
    assert "stopped before its time limit" in log and f"sbatch {script}" in log, log[-3000:]
    assert f"stopping after step {trained}: SIGTERM received (checkpoint saved)" in log

    # The run continues from that step: its own script, submitted again (stopped by hand
    # with the same warning once it has resumed and trained a step). Two minutes on sbatch's
    # command line, which overrides the script's --time: SLURM's own warning, 15 to 45 s into a
    # one-minute job, could come before the resumed workers have trained a step.
    again = slurm_cluster.run("sbatch", "--parsable", "--time=2", str(script))
    assert again.returncode == 0, again.stderr
    new_id = again.stdout.strip().split(";")[0]
    new_log = run_dir / f"slurm-{new_id}.out"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and losses(run_dir)[-1][0] <= trained:
        time.sleep(0.5)
    assert slurm_cluster.run("scancel", "--signal=USR1", new_id).returncode == 0
    slurm_cluster.wait_for(new_id, ENDED)
    text = new_log.read_text()
    assert f"(step {trained})" in text and "resumed from" in text, text[-3000:]
    steps = [step for step, _ in losses(run_dir)]
    assert steps == list(range(1, steps[-1] + 1)) and steps[-1] > trained
    assert saved_step(run_dir) == steps[-1], text[-3000:]
