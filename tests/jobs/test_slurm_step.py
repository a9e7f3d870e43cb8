"""slurm_step, the SLURM job's step on every node, without SLURM: a real torchrun with two workers
under it, and SIGUSR1 sent to every process of the step as SLURM sends its warning before the
time limit (its process tracking finds the workers too; srun passes it on again). Each worker
gets SIGTERM exactly once, from torchrun, and the step ends with 143; the real cluster runs the
whole job in test_slurm_time_limit.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

WORKER = """
import os, signal, sys, time
log = open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.log"), "a", buffering=1)
got = []
def note(signum, frame):
    got.append(signum)
    log.write(f"{signal.Signals(signum).name}\\n")
signal.signal(signal.SIGTERM, note)
log.write(f"ready {os.getpid()}\\n")
while not got:
    time.sleep(0.05)
time.sleep(2)  # the step under way and its save: a second SIGTERM here would be noted
log.write("saved\\n")
sys.exit(143)
"""


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").iterdir():
            children = (task / "children").read_text().split()
            found += map(int, children)
            todo += map(int, children)
    return found


def start_step(tmp_path: Path, script: str) -> tuple[subprocess.Popen, list[Path]]:
    """slurm_step running a real torchrun of two workers of `script` (each logs `ready PID`
    to rank<N>.log in tmp_path first), and their logs."""
    worker = tmp_path / "worker.py"
    worker.write_text(textwrap.dedent(script))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    torchrun += ["--nproc-per-node", "2", "--max-restarts", "0", str(worker), str(tmp_path)]
    step = subprocess.Popen(
        [sys.executable, "-m", "turbo_dllm.jobs.backends.slurm_step", *torchrun],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    logs = [tmp_path / "rank0.log", tmp_path / "rank1.log"]
    return step, logs


def wait_until_ready(step: subprocess.Popen, logs: list[Path]) -> None:
    deadline = time.monotonic() + 60
    while not all(p.exists() and "ready" in p.read_text() for p in logs):
        assert time.monotonic() < deadline and step.poll() is None, "workers never started"
        time.sleep(0.1)


def test_the_warning_reaches_each_worker_once_as_sigterm(tmp_path):
    step, logs = start_step(tmp_path, WORKER)
    try:
        wait_until_ready(step, logs)
        # As SLURM signals a step: every process in it, and the step's task once more (srun).
        for pid in [step.pid, *descendants(step.pid), step.pid]:
            os.kill(pid, signal.SIGUSR1)
        output, _ = step.communicate(timeout=60)
    finally:
        if step.poll() is None:
            step.kill()
    assert step.returncode == 143, output
    for log in logs:
        assert log.read_text().splitlines()[1:] == ["SIGTERM", "saved"], (log, output)
    assert output.count("SIGUSR1 (SLURM's warning before the job's time limit") == 1, output


ORPHAN = """
import os, sys, time
from turbo_dllm.jobs.worker import LAUNCHER_PID_VARIABLE
from turbo_dllm.train.stop import TerminationRequest, stop_with_parent
parent = os.getppid()
launcher = os.environ.get(LAUNCHER_PID_VARIABLE)
assert stop_with_parent(parent, int(launcher) if launcher else None) is True
log = open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.log"), "a", buffering=1)
with TerminationRequest() as stop:
    log.write(f"ready {os.getpid()}\\n")
    while not stop.parent_gone:
        time.sleep(0.05)
    time.sleep(2)  # the step under way and its save: the step must not end before it
    log.write("saved\\n")
sys.exit(143)
"""


def test_a_killed_torchrun_s_workers_save_before_the_step_ends(tmp_path):
    """torchrun SIGKILLed (the OOM killer) under SLURM: its workers stop on their parent-death
    signal (train/stop.py) and save, but the step ended with torchrun and SLURM killed them
    mid-save. slurm_step is their subreaper now and waits for them; the step ends with 143."""
    step, logs = start_step(tmp_path, ORPHAN)
    workers = []
    try:
        wait_until_ready(step, logs)
        workers = [int(p.read_text().split()[1]) for p in logs]
        children = Path(f"/proc/{step.pid}/task/{step.pid}/children").read_text().split()
        (torchrun_pid,) = map(int, children)
        os.kill(torchrun_pid, signal.SIGKILL)
        output, _ = step.communicate(timeout=60)
    finally:
        if step.poll() is None:
            step.kill()
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert step.returncode == 143, output
    for log in logs:
        assert log.read_text().splitlines()[1:] == ["saved"], (log, output)
    assert "without stopping its 2 worker(s): they saved the step under way" in output, output
