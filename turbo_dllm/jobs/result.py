"""`result.json`: how a run ended (its exit code), written once the workers are done.

The launcher writes it after a local or one-node torchrun job; no node's launcher sees a
multi-node job end, so its global rank 0 worker writes it when training returns (and removes an
earlier attempt's when it starts: `turbo_dllm.jobs.worker`). A SLURM job's launcher only
submits, so the batch script writes it itself when `srun` returns (`python -m
turbo_dllm.jobs.result`); a job SLURM kills (scancel, time limit) never gets that far, and
`dllm run list` asks SLURM. The script also runs it first (`--job-started`): the job that
runs is the run's latest attempt, whether `--submit` or the user's own `sbatch job.sbatch` (a
resubmission after a cancelled or failed job) submitted it, so it records its job id
(`slurm_job.json`) and removes an earlier attempt's `result.json`.

A local or torchrun launcher also records itself when it starts (`launcher.json`; on a
multi-node job each node's as `launcher-<host>.json`): host, pid and the process's start time
(`/proc/<pid>/stat` field 22, with the boot id), so `dllm run list` can tell a run whose
launcher still runs on this host from one whose launcher was killed (SIGKILL, the OOM killer, a
reboot) before it could write `result.json`; a reused pid has another start time.

Each record carries its `format` and is checked on read (`formats.read_json_record`): one that
is torn, of another format or invalid is a DllmError naming it and the way on, never read as
no record (`dllm run list` lists that run as one it cannot read; `dllm run show` says why).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from turbo_dllm.errors import DllmError
from turbo_dllm.formats import read_json_record
from turbo_dllm.fsutil import write_atomic
from turbo_dllm.host.probes import process_stat

__all__ = [
    "LAUNCHER_FORMAT",
    "LAUNCHER_NAME",
    "end_launcher",
    "RESULT_FORMAT",
    "RESULT_NAME",
    "RunLauncher",
    "RunResult",
    "launcher_alive",
    "now",
    "read_launchers",
    "read_result",
    "record_launcher",
    "this_host",
    "write_result",
]

RESULT_NAME = "result.json"
RESULT_FORMAT = "turbo_dllm.run_result.v1"
LAUNCHER_NAME = "launcher.json"
LAUNCHER_FORMAT = "turbo_dllm.run_launcher.v1"


class _Record(BaseModel):
    # strict: an edited `"exit_code": "0"` or `"pid": true` is invalid, not coerced
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class RunResult(_Record):
    """`result.json` as `write_result` writes it."""

    format: str
    exit_code: int
    started_at: str
    finished_at: str
    backend: str
    python: str
    slurm_job_id: str | None = None
    recorded_by: str | None = None  # "rank 0": a multi-node job's worker
    resumed_by: str | None = None  # "dllm train": a `dllm train --run-dir` resume


class RunLauncher(_Record):
    """`launcher.json` (`launcher-<host>.json`) as `record_launcher` and `end_launcher` write it."""

    format: str
    host: str
    pid: int
    start_ticks: int | None
    boot_id: str | None
    started_at: str
    by: str | None = None
    ended_at: str | None = None
    interrupted: bool | None = None


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_result(run_dir: Path, code: int, started: str, backend: str, **extra: str | None) -> None:
    result: dict[str, Any] = {
        "format": RESULT_FORMAT,
        "exit_code": code,
        "started_at": started,
        "finished_at": now(),
        "backend": backend,
        "python": sys.executable,
        **{key: value for key, value in extra.items() if value is not None},
    }
    write_atomic(Path(run_dir) / RESULT_NAME, json.dumps(result, indent=2, sort_keys=True) + "\n")


def read_result(run_dir: Path) -> dict[str, Any] | None:
    """The run's result.json as written, or None where there is none (the run has not ended, or
    was killed before it could write one). One that cannot be read (torn, not UTF-8, nested past
    the parser's depth), of another format or invalid is a DllmError naming it."""
    record = read_json_record(
        Path(run_dir) / RESULT_NAME,
        RunResult,
        expected=RESULT_FORMAT,
        what="run result",
        writer="the run's launcher (a SLURM job's script, a multi-node job's rank 0) writes it "
        "once, whole, when the run ends",
        without="the run reads as one that has not ended (`dllm run list` then asks its "
        "launcher's record or SLURM)",
    )
    return None if record is None else record.model_dump(exclude_unset=True)


def this_host() -> str:
    return socket.gethostname()


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks after boot: /proc/<pid>/stat field 22), or None
    where it does not exist (or has ended and waits to be reaped: a zombie runs nothing)."""
    fields = process_stat(pid)
    if fields is None or len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    try:
        return int(fields[19])  # fields[0] is field 3 (the state), so field 22 is fields[19]
    except ValueError:
        return None


def record_launcher(run_dir: Path, *, multi_node: bool = False, by: str | None = None) -> None:
    """Record this process as the run's launcher (see the module's doc); a multi-node job's
    nodes share the run dir, so each records itself under its own host name. `by`: what else
    runs the job (a `dllm train --run-dir` resume: "dllm train")."""
    record = {
        "format": LAUNCHER_FORMAT,
        "host": this_host(),
        "pid": os.getpid(),
        "start_ticks": _start_ticks(os.getpid()),
        "boot_id": _boot_id(),
        "started_at": now(),
        **({"by": by} if by else {}),
    }
    write_atomic(
        _launcher_path(run_dir, multi_node), json.dumps(record, indent=2, sort_keys=True) + "\n"
    )


def _launcher_path(run_dir: Path, multi_node: bool) -> Path:
    return Path(run_dir) / (f"launcher-{this_host()}.json" if multi_node else LAUNCHER_NAME)


def end_launcher(run_dir: Path, *, multi_node: bool = False, interrupted: bool = False) -> None:
    """Mark this launcher's record ended (`ended_at`) when its launch returns or raises: it no
    longer runs the job though its process may live on; `interrupted` where Ctrl-C ended it
    (an interrupted launch writes no result). A killed launcher never gets here."""
    path = _launcher_path(run_dir, multi_node)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if (
            isinstance(record, dict)
            and record.get("format") == LAUNCHER_FORMAT
            and record.get("pid") == os.getpid()
        ):
            record["ended_at"] = now()
            if interrupted:
                record["interrupted"] = True
            write_atomic(path, json.dumps(record, indent=2, sort_keys=True) + "\n")
    except (OSError, ValueError, RecursionError):
        pass  # not recorded, or damaged: nothing to mark


def read_launchers(run_dir: Path) -> list[dict[str, Any]]:
    """The launcher records in `run_dir` (a multi-node job's: one per node). One that cannot be
    read, of another format or invalid is a DllmError naming it, not left out: a run whose
    only launcher record is damaged read as `no result`, as if none had ever started."""
    records = []
    for path in sorted(Path(run_dir).glob("launcher*.json")):
        record = read_json_record(
            path,
            RunLauncher,
            expected=LAUNCHER_FORMAT,
            what="launcher record",
            writer="the run's launcher (or a `dllm train --run-dir` resume) writes it when it "
            "starts",
            without="the run reads as `no result` (no launcher recorded) until it ends",
        )
        if record is not None:  # gone since the glob listed it
            records.append(record.model_dump(exclude_unset=True))
    return records


def launcher_alive(record: dict[str, Any]) -> bool | None:
    """Whether the recorded launcher still runs: None where this host cannot tell (another
    host's, or no /proc); False once its launch ended (`ended_at`), its pid is gone or belongs to
    a later process (another start time), or the host has rebooted since (another boot id)."""
    if record.get("ended_at"):
        return False
    if record.get("host") != this_host() or not Path("/proc/self/stat").exists():
        return None
    if record.get("boot_id") and record["boot_id"] != _boot_id():
        return False
    ticks, recorded = _start_ticks(record["pid"]), record.get("start_ticks")
    return ticks is not None and (recorded is None or ticks == recorded)


def main(argv: list[str] | None = None) -> int:
    """The batch script's first step (`--job-started`: record this job as the run's) and its
    last (record srun's exit status in the run dir)."""
    parser = argparse.ArgumentParser(prog="python -m turbo_dllm.jobs.result")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--job-started", action="store_true", help="record the job, not its end")
    parser.add_argument("--exit-code", type=int, default=None)
    parser.add_argument("--started", default=None, help="ISO time the job started")
    parser.add_argument("--backend", default=None)
    parser.add_argument("--slurm-job-id", default=None)
    args = parser.parse_args(argv)
    if args.job_started:
        from turbo_dllm.jobs.backends.slurm import record_running_job

        if args.slurm_job_id is None:
            parser.error("--job-started needs --slurm-job-id")
        try:
            record_running_job(Path(args.run_dir), args.slurm_job_id)
        except DllmError as error:
            print(f"dllm: error: {error.message}", file=sys.stderr)
            if error.hint:
                print(f"hint: {error.hint}", file=sys.stderr)
            return 2
        return 0
    if args.exit_code is None or args.started is None or args.backend is None:
        parser.error("--exit-code, --started and --backend are required")
    write_result(
        Path(args.run_dir),
        args.exit_code,
        args.started,
        args.backend,
        slurm_job_id=args.slurm_job_id,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
