"""A SLURM job's step on every node: torchrun under a supervisor that turns SLURM's warning
before the time limit into one SIGTERM for each worker.

`python -m turbo_dllm.jobs.backends.slurm_step TORCHRUN-ARGV...` is what srun starts (one task
per node). With a time limit the script asks SLURM to warn the job's steps ahead of it
(`#SBATCH --signal=USR1@<seconds>`, `slurm.STOP_WARNING_S`); `scancel --signal=USR1 JOBID`
gives the same warning by hand.

Why SIGUSR1, and why this process: SLURM signals every process of a step (its process tracking
finds torchrun's workers too, though torchrun starts each in a session of its own), and srun
passes a signal it gets on to the step as well. SIGTERM as the warning reached each worker from
SLURM and again from torchrun, and a second SIGTERM ended the trainer at once, mid-save (now one
within 5 s of the first is the same request: train/stop.py); torchrun itself, given two, failed
in its own shutdown. So torchrun and its
workers ignore SIGUSR1 (set here before torchrun starts, it holds across exec), and this process
alone acts on it, once: one SIGTERM to torchrun, which passes it to each worker once; each
finishes the step under way, saves it (train/stop.py) and ends with 143, and so does this step.
torchrun waits `TORCH_ELASTIC_SHUTDOWN_TIMEOUT` seconds for that before it SIGKILLs the workers
(set here where unset; read by the torchruns that have `--shutdown-timeout`, 2.13 does; 2.11
has neither and waits 30 s, so there the step under way and its save must fit in 30 s).

A SIGTERM or SIGINT here (scancel, the limit itself) is not passed on: SLURM signals torchrun
(and the workers) itself. This process waits for torchrun all the same: once it ended, the step
would end and SLURM kill the workers at once.

For the same reason it outlives a torchrun that dies without stopping its workers (SIGKILL, the
OOM killer): it is their subreaper (PR_SET_CHILD_SUBREAPER), so they are reparented here, and it
waits for them to finish the step under way and save it (their parent-death signal,
train/stop.py) before the step ends.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

from turbo_dllm.jobs.backends import exit_code
from turbo_dllm.jobs.worker import LAUNCHER_PID_VARIABLE
from turbo_dllm.train.stop import EXIT_TERMINATED

__all__ = ["SHUTDOWN_TIMEOUT_S", "STOP_SIGNAL", "main"]

STOP_SIGNAL = signal.SIGUSR1
# How long torchrun waits for its workers after passing SIGTERM on, before SIGKILL (its default
# is 30 s). Under SLURM the job's time limit and KillWait bound the stop: this only keeps
# torchrun from cutting a save short that the allocation has time for.
SHUTDOWN_TIMEOUT_S = 3600
_PR_SET_CHILD_SUBREAPER = 36


def _adopt_orphans() -> None:
    """Have descendants whose parent dies (torchrun's workers) reparented to this process, not
    to init; a no-op where Linux cannot be asked."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _wait_for_orphans() -> list[int]:
    """Wait for every child left (torchrun's workers, reparented here when it died); their exit
    codes as a shell reports them."""
    codes = []
    while True:
        try:
            _, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return codes
        codes.append(exit_code(os.waitstatus_to_exitcode(status)))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(
            "usage: python -m turbo_dllm.jobs.backends.slurm_step TORCHRUN-ARGV...", file=sys.stderr
        )
        return 2
    env = dict(os.environ)
    env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(SHUTDOWN_TIMEOUT_S))
    # torchrun's parent, for a worker to tell a torchrun that died before it started (worker.py)
    env[LAUNCHER_PID_VARIABLE] = str(os.getpid())
    _adopt_orphans()
    # Ignored from here on, so torchrun and its workers start ignoring it (an ignored signal
    # stays ignored across fork and exec; a handler would not).
    signal.signal(STOP_SIGNAL, signal.SIG_IGN)
    try:
        torchrun = subprocess.Popen(argv, env=env)
    except OSError as error:
        print(f"dllm: cannot start {argv[0]!r}: {error}", file=sys.stderr)
        return 127
    stopping = False

    def stop(signum, _frame) -> None:
        nonlocal stopping
        if stopping or torchrun.poll() is not None:
            return
        stopping = True
        print(
            f"dllm: {signal.Signals(signum).name} (SLURM's warning before the job's time limit, "
            "or scancel --signal): the workers save the step under way and stop",
            file=sys.stderr,
            flush=True,
        )
        torchrun.send_signal(signal.SIGTERM)

    signal.signal(STOP_SIGNAL, stop)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: None)  # SLURM signals torchrun itself
    returncode = torchrun.wait()
    orphans = _wait_for_orphans()
    if orphans:
        saved = all(code == EXIT_TERMINATED for code in orphans)
        print(
            f"dllm: torchrun ended (exit {exit_code(returncode)}) "
            f"without stopping its {len(orphans)} worker(s): "
            + ("they saved the step under way and stopped" if saved else f"they ended {orphans}"),
            file=sys.stderr,
            flush=True,
        )
        return EXIT_TERMINATED if saved else max(orphans)
    if stopping and returncode != 0:
        # torchrun ends with 1 after a SIGTERM whatever its workers did: the step ends as the
        # workers did, stopped with their step saved (143, as a torchrun launch stopped by
        # SIGTERM ends). 0: they had finished the last step anyway.
        return EXIT_TERMINATED
    return exit_code(returncode)


if __name__ == "__main__":
    sys.exit(main())
