"""Real multi-process runs for the parallel tests: spawn ranks, collect per-case errors."""

from __future__ import annotations

import json
import os
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from turbo_dllm.train.entry import end_without_finalization


def _entry(rank: int, world: int, store: str, fn, args, backend: str, timeout_s) -> None:
    if backend == "nccl":
        torch.cuda.set_device(rank)
    timeout = {"timeout": timedelta(seconds=timeout_s)} if timeout_s else {}
    dist.init_process_group(
        backend, init_method=f"file://{store}", rank=rank, world_size=world, **timeout
    )
    try:
        fn(rank, world, *args)
    except Exception:
        traceback.print_exc()
        raise
    finally:
        if dist.is_initialized():  # the trainer's entry destroys the group it ran in
            dist.destroy_process_group()
    # As a launched rank ends: without the interpreter's finalization, where gloo's threads
    # can abort a finished rank (turbo_dllm.train.entry.end_process says why).
    end_without_finalization(0)


def run_gloo(
    fn, world: int, tmp_path: Path, *args, backend: str = "gloo", timeout_s: float | None = None
) -> None:
    """Run fn(rank, world, *args) on `world` processes (module-level fn, picklable args).

    `timeout_s` bounds every collective (default: torch's), so a test of a would-be hang fails.
    """
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    store = tmp_path / f"store-{world}"
    mp.spawn(
        _entry, args=(world, str(store), fn, args, backend, timeout_s), nprocs=world, join=True
    )


def _cases_worker(rank: int, world: int, results: str, run_case, cases) -> None:
    errors = {case[0]: run_case(world, *case) for case in cases[world]}
    if rank == 0:
        Path(results).write_text(json.dumps(errors))


def errors_per_world(run_case, cases, tmp_path_factory, prefix: str) -> dict[int, dict]:
    """For each world size in `cases` (world -> [(name, *params)]), run every case on that many
    processes as run_case(world, name, *params) (a module-level function); rank 0's results,
    name -> error, are returned keyed by world size."""
    found = {}
    for world in cases:
        tmp = tmp_path_factory.mktemp(f"{prefix}-{world}")
        results = tmp / "errors.json"
        run_gloo(_cases_worker, world, tmp, str(results), run_case, cases)
        found[world] = json.loads(results.read_text())
    return found
