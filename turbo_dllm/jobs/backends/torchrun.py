"""torchrun backend: `python -m torch.distributed.run` supervises the workers.

torchrun gives us what a launcher should not re-implement: one process per rank with RANK /
LOCAL_RANK / WORLD_SIZE set, static or c10d (elastic) rendezvous across nodes, and restarts of
the whole worker group on failure (`--max-restarts`), after which the trainer resumes from its
last complete checkpoint. We start it as a child, stream its output (and keep a copy in the run
dir), forward termination signals, and return its exit status.

torchrun dies with the launcher (PR_SET_PDEATHSIG: SIGTERM, which it passes on to the workers),
and the workers with torchrun (jobs/worker.py: each saves the step under way and ends with 143
when torchrun ends without stopping it). The launcher's pid goes to torchrun's environment
(`DLLM_LAUNCHER_PID`), and so to the workers: a worker whose torchrun ended before the worker
asked to be told stops as well. The launcher reads the workers' output to its end, so it returns
once they ended too, whatever ended torchrun.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

from turbo_dllm.errors import DllmError
from turbo_dllm.jobs.backends import exit_code
from turbo_dllm.jobs.plan import Command, JobPlan, Rendezvous

__all__ = ["console_log", "node_commands", "run_process", "run_torchrun", "torchrun_argv"]

_FORWARDED = (signal.SIGINT, signal.SIGTERM)


def torchrun_argv(
    python: str,
    worker: list[str],
    nnodes: str,
    nproc_per_node: int,
    rendezvous: Rendezvous,
    node_rank: int | None,
    max_restarts: int,
    log_dir: str,
) -> list[str]:
    """The torchrun command line for one node; `worker` is `[python, "-m", module, args...]`.

    `--log-dir` keeps torchrun's per-attempt folders (workers' error files) in the run dir;
    without it torchrun leaves a `torchelastic_*` folder in the temp folder after every run.
    """
    argv = [python, "-m", "torch.distributed.run", "--nnodes", nnodes]
    argv += ["--nproc-per-node", str(nproc_per_node)]
    if rendezvous.kind == "standalone":
        argv.append("--standalone")
    elif rendezvous.kind == "static":
        host, _, port = (rendezvous.endpoint or "").rpartition(":")
        argv += ["--node-rank", str(node_rank or 0), "--master-addr", host, "--master-port", port]
    elif rendezvous.kind == "c10d":
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", rendezvous.endpoint or ""]
        argv += ["--rdzv-id", rendezvous.run_id or "dllm"]
        if rendezvous.conf:
            argv += ["--rdzv-conf", rendezvous.conf]
    argv += ["--max-restarts", str(max_restarts), "--log-dir", log_dir]
    return argv + worker[1:]


def node_commands(
    *,
    python: str,
    worker: list[str],
    nnodes: str,
    nproc_per_node: int,
    rendezvous: Rendezvous,
    node_rank: int | None,
    max_restarts: int,
    log_dir: str,
) -> list[Command]:
    """One command for every node (rendezvous assigns ranks) or one per static node rank."""
    if rendezvous.kind == "static" and nnodes != "1":
        return [
            Command(
                where=f"node {rank}" + (" (this node)" if rank == node_rank else ""),
                argv=torchrun_argv(
                    python, worker, nnodes, nproc_per_node, rendezvous, rank, max_restarts, log_dir
                ),
            )
            for rank in range(int(nnodes))
        ]
    where = "every node" if rendezvous.kind == "c10d" else "this node"
    argv = torchrun_argv(
        python, worker, nnodes, nproc_per_node, rendezvous, node_rank, max_restarts, log_dir
    )
    return [Command(where=where, argv=argv)]


def console_log(run_dir: str | Path, multi_node: bool) -> Path:
    """Where a node's launcher keeps torchrun's output (one file per host on a multi-node job),
    and where its workers write once that launcher is gone (jobs/worker.py)."""
    return Path(run_dir) / ("console.log" if not multi_node else f"console-{os.uname()[1]}.log")


def run_torchrun(plan: JobPlan, log_path: Path | None = None) -> int:
    commands = plan.commands
    if len(commands) > 1:
        mine = [c for c in commands if c.where.endswith("(this node)")]
        if len(mine) != 1:
            raise DllmError("the plan has no command for this node", hint="pass --node-rank")
        commands = mine
    return run_process(commands[0].argv, env=plan.env, cwd=plan.cwd, log_path=log_path)


def run_process(
    argv: list[str], *, env: dict[str, str], cwd: str, log_path: Path | None = None
) -> int:
    """Run `argv`, stream its stdout/stderr to ours (and to `log_path`), forward SIGINT/SIGTERM."""
    log = open(log_path, "ab") if log_path else None  # noqa: SIM115 (closed below)
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            # the workers check their torchrun's parent against it (jobs/worker.py)
            env={**os.environ, **env, "DLLM_LAUNCHER_PID": str(os.getpid())},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
    except OSError as error:
        if log:
            log.close()
        raise DllmError(f"cannot start {argv[0]!r}: {error}") from None
    lock = threading.Lock()
    received: list[int] = []
    pumps = [
        threading.Thread(target=_pump, args=(stream, sink, log, lock, received), daemon=True)
        for stream, sink in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr))
    ]
    for pump in pumps:
        pump.start()
    previous = _forward_signals(proc, received)
    try:
        returncode = proc.wait()
    finally:
        _restore_signals(previous)
        for pump in pumps:
            pump.join()
        if log:
            log.close()
    if received:
        # Ctrl-C / SIGTERM reached the launcher: now that torchrun and its workers are gone, end
        # as a one-process launch does, not as a run that failed with torchrun's exit status 1:
        # SIGINT is `dllm: interrupted` (130, no result.json); on SIGTERM the workers saved the
        # step under way (train/stop.py) and the launch ends with 143, recorded as its result.
        if received[0] == signal.SIGINT:
            raise KeyboardInterrupt
        return exit_code(-received[0])
    return exit_code(returncode)


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGTERM it when the launcher dies, so a killed
    launcher never leaves torchrun and its workers running without anyone streaming them."""
    import ctypes

    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _pump(
    source: IO[bytes],
    sink: IO[str],
    log: IO[bytes] | None,
    lock: threading.Lock,
    received: list[int],
) -> None:
    target = getattr(sink, "buffer", None)
    # Whole lines, so the two streams interleave line by line in the log.
    for chunk in iter(source.readline, b""):
        with lock:
            if received and log:
                # Interrupted: torchrun's shutdown (its SignalException traceback) goes to the
                # log only; the launcher's `dllm: interrupted` is the line on the console.
                pass
            elif target is not None:
                target.write(chunk)
                target.flush()
            else:  # a text-only stream (e.g. a test's capture)
                sink.write(chunk.decode(errors="replace"))
                sink.flush()
            if log:
                log.write(chunk)
                log.flush()
    source.close()


def _forward_signals(proc: subprocess.Popen, received: list[int]) -> dict[int, object]:
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for signum in _FORWARDED:

        def forward(signum, _frame, _proc=proc):
            received.append(signum)
            if _proc.poll() is None:
                _proc.send_signal(signum)

        previous[signum] = signal.signal(signum, forward)
    return previous


def _restore_signals(previous: dict[int, object]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)  # type: ignore[arg-type]
