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
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from turbo_dllm.fsutil import write_atomic

__all__ = ["RESULT_FORMAT", "RESULT_NAME", "now", "read_result", "write_result"]

RESULT_NAME = "result.json"
RESULT_FORMAT = "turbo_dllm.run_result.v1"


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
    """The run's result.json as written, or None where it is absent or unreadable: torn, not
    UTF-8 (a non-UTF-8 byte was a UnicodeDecodeError traceback in `dllm run list`), nested
    past the parser's depth."""
    try:
        return json.loads((Path(run_dir) / RESULT_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError
        return None


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
        record_running_job(Path(args.run_dir), args.slurm_job_id)
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
