"""Local backend: one worker, run in this process.

A single process needs no supervisor, so the launcher runs the recorded worker command's
arguments through the same worker entry (`turbo_dllm.jobs.worker`) in-process: what the manifest
says ran is exactly what ran, without a second interpreter start. The plan's worker environment
applies for the run (its OMP_NUM_THREADS as torch's intra-op thread count), then is restored.
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

    import torch

    saved = {key: os.environ.get(key) for key in plan.env}
    os.environ.update(plan.env)
    # OMP_NUM_THREADS is read once, when the thread pool starts (this process's already has):
    # the recorded count is set on torch itself, as a torchrun worker starts with it.
    threads = plan.env.get("OMP_NUM_THREADS")
    saved_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(int(threads))
    try:
        return int(main(worker[3:]) or 0)
    finally:
        torch.set_num_threads(saved_threads)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
