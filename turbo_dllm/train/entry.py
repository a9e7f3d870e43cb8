"""`train(spec, run_dir, layout)`: the same in one process and on every rank under torchrun.

A launched job's workers call it from `turbo_dllm.jobs.worker` with the plan's layout; `dllm
train` calls it in-process (or on every rank of a hand-written torchrun) with the spec's own.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

__all__ = [
    "end_process",
    "end_without_finalization",
    "run_and_end",
    "resolve_run_dir",
    "train",
    "world_size_from_env",
]


def world_size_from_env() -> int:
    """torchrun's WORLD_SIZE (1 without it); anything but a positive count is a user error here,
    not a layout that fails to fit later."""
    raw = os.environ.get("WORLD_SIZE", "1")
    try:
        world = int(raw)
    except ValueError:
        world = 0
    if world < 1:
        from turbo_dllm.errors import DllmError

        raise DllmError(
            f"WORLD_SIZE={raw!r} is not a process count",
            hint="torchrun sets WORLD_SIZE; unset it to train in one process",
        )
    return world


def resolve_run_dir(spec, requested: str | Path | None) -> Path:
    """--run-dir, else launch.run_dir, else a fresh runs/<stamp>-<id> agreed by all ranks."""
    if requested is not None:
        return Path(requested).absolute()
    if spec.launch.run_dir is not None:
        return Path(spec.launch.run_dir)
    from turbo_dllm.paths import new_run_dir

    if world_size_from_env() == 1:
        return new_run_dir().absolute()
    import torch.distributed as dist

    from turbo_dllm.train.distributed import init_distributed

    env = init_distributed()
    chosen = [str(new_run_dir().absolute()) if env.is_main else None]
    dist.broadcast_object_list(chosen, src=0)
    return Path(chosen[0])


def train(spec, run_dir: str | Path, layout=None) -> int:
    """Train `spec` (a validated RunSpec) into `run_dir` with `layout` (default: the spec's
    topology as a `ParallelLayout`); returns the exit code (0)."""
    import torch.distributed as dist

    from turbo_dllm.train.distributed import init_distributed
    from turbo_dllm.train.trainer import Trainer

    env = init_distributed()
    try:
        return Trainer(spec, run_dir, env, layout=layout).build().run()
    finally:
        if env.distributed and dist.is_initialized():
            dist.destroy_process_group()


def end_process(code: int) -> NoReturn:
    """End this process with `code`: a rank of a multi-process run (one that joined a process
    group) without the interpreter's finalization, logging shut down and stdio flushed first.

    A gloo process group outlives `destroy_process_group` while torch's DTensor sharding cache
    holds its device mesh, so its worker threads (pt_gloo_runloop) are never joined; one still
    releasing the last collective's tensors needs the GIL, and a thread that asks for it while
    the interpreter finalizes is ended by Python inside C++, which aborts the process
    ("terminate called without an active exception"): a finished run, or one that stopped with
    a clear error and exit 2, then ends by SIGABRT. Seen in about one in ten loaded two-rank CPU
    runs (ProcessGroupGloo::runLoop -> decref_pyobject -> PyEval_AcquireThread -> pthread_exit).
    """
    import sys

    distributed = sys.modules.get("turbo_dllm.train.distributed")
    if distributed is None or not distributed.joined_a_group():
        raise SystemExit(code)
    end_without_finalization(code)


def run_and_end(main: Callable[[], int]) -> NoReturn:
    """`end_process(main())`; an exception escaping `main` is printed (sys.excepthook) and ends
    the process with 1, as Python would end it, but through `end_process`: a rank that raised
    would otherwise risk the abort above, which torchrun then reports as its cause (SIGABRT)."""
    import sys

    try:
        code = main()
    except Exception:
        sys.excepthook(*sys.exc_info())
        code = 1
    end_process(code)


def end_without_finalization(code: int) -> NoReturn:
    """os._exit(code) once logging is shut down and stdio flushed (`end_process` says why)."""
    import logging
    import sys

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can reach it
            pass
    os._exit(code)
