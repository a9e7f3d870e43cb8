"""Local backend: one worker, run in this process.

A single process needs no supervisor, so the launcher runs the recorded worker command's
arguments through the same worker entry (`turbo_dllm.jobs.worker`) in-process: what the manifest
says ran is exactly what ran, without a second interpreter start.
"""

from __future__ import annotations

import os

from turbo_dllm.errors import DllmError
from turbo_dllm.jobs.plan import JobPlan

__all__ = ["run_local"]


def run_local(plan: JobPlan) -> int:
    from turbo_dllm.jobs.worker import main

    worker = plan.worker
    if worker[1:3] != ["-m", "turbo_dllm.jobs.worker"]:
        raise DllmError(
            f"the local backend runs `python -m turbo_dllm.jobs.worker ...`, not {worker!r}"
        )

    saved = {key: os.environ.get(key) for key in plan.env}
    os.environ.update(plan.env)
    try:
        return int(main(worker[3:]) or 0)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
