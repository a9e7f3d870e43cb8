"""Real multi-process runs for the parallel tests: spawn ranks, collect per-case errors."""

from __future__ import annotations

import json
import os
import sys
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


def _cases_worker(rank: int, world: int, results: str, batch) -> None:
    """batch: prefix -> (run_case, cases); rank 0 writes prefix -> name -> error."""
    errors = {
        prefix: {case[0]: run_case(world, *case) for case in cases.get(world, [])}
        for prefix, (run_case, cases) in batch.items()
    }
    if rank == 0:
        Path(results).write_text(json.dumps(errors))


# The modules that declared their cases (declare_cases, at import): prefix -> (module name,
# run_case, cases). SELECTED: the modules with a test in this session (conftest.py sets it after
# collection); a module imported for a helper alone is not run for it.
_DECLARED: dict[str, tuple[str, object, dict]] = {}
_FOUND: dict[str, dict[int, dict]] = {}  # results kept for their module's own call
_RUN: set[str] = set()  # prefixes whose cases a shared run has run (once, even if asked again)
SELECTED: set[str] = set()
_shared_failed = False


def declare_cases(prefix: str, run_case, cases) -> None:
    """Declare a module's cases (call it at import): the first `errors_per_world` of the session
    then runs the cases of every declared module with a selected test on the same processes, one
    start per world size instead of one per module and world size."""
    module = sys._getframe(1).f_globals["__name__"]
    _DECLARED[prefix] = (module, run_case, cases)


def _run_batch(batch: dict, tmp_path_factory, name: str) -> dict[str, dict[int, dict]]:
    worlds = sorted({world for _, cases in batch.values() for world in cases})
    found: dict[str, dict[int, dict]] = {prefix: {} for prefix in batch}
    for world in worlds:
        tmp = tmp_path_factory.mktemp(f"{name}-{world}")
        results = tmp / "errors.json"
        run_gloo(_cases_worker, world, tmp, str(results), batch)
        for prefix, errors in json.loads(results.read_text()).items():
            if world in batch[prefix][1]:
                found[prefix][world] = errors
    return found


# The shared run, in a child process started with the session (tests/distributed/conftest.py)
# on the core the other tests leave idle (tests/prefetch.py).
SHARED_KEY = "distributed shared cases"
_CHILD = "import sys; from tests.distributed import harness; harness.run_shared(sys.argv[1:])"


def shared_command(modules: list[str]) -> list[str]:
    """The child that runs `modules`' declared cases and writes what `_run_batch` found."""
    return [sys.executable, "-c", _CHILD, "{work}", *modules]


class _Folders:
    """tmp_path_factory's mktemp, in a folder of the child's own."""

    def __init__(self, root: Path):
        self.root = root

    def mktemp(self, name: str) -> Path:
        folder = self.root / name
        folder.mkdir(parents=True)
        return folder


def run_shared(argv: list[str]) -> None:
    """The child's side: import the modules (they declare their cases), run them all."""
    import importlib

    work, modules = Path(argv[0]), argv[1:]
    for name in modules:
        importlib.import_module(name)
    batch = {
        prefix: (run_case, cases)
        for prefix, (module, run_case, cases) in _DECLARED.items()
        if module in modules
    }
    found = _run_batch(batch, _Folders(work / "runs"), "shared")
    (work / "found.json").write_text(json.dumps(found))


def _shared(batch: dict, tmp_path_factory) -> dict[str, dict[int, dict]]:
    """The shared run's results: the background child's where it ran this batch, else a run
    now. Raises where the run failed."""
    from tests import prefetch

    if prefetch.started(SHARED_KEY):
        done, work = prefetch.result(SHARED_KEY)
        if done.returncode:
            raise RuntimeError(f"the shared run failed:\n{done.stderr[-3000:]}")
        found = json.loads((work / "found.json").read_text())
        if set(found) == set(batch):  # JSON keys are strings: the world sizes back to ints
            return {p: {int(w): e for w, e in worlds.items()} for p, worlds in found.items()}
    return _run_batch(batch, tmp_path_factory, "shared")


def errors_per_world(run_case, cases, tmp_path_factory, prefix: str) -> dict[int, dict]:
    """For each world size in `cases` (world -> [(name, *params)]), run every case on that many
    processes as run_case(world, name, *params) (a module-level function); rank 0's results,
    name -> error, are returned keyed by world size.

    The cases of the other modules that declared theirs (`declare_cases`) and have a selected
    test run on the same processes, after this module's, and are kept for their own call. If
    that shared run fails, each module's cases run on processes of their own from then on, so a
    failure is reported by its own module alone."""
    global _shared_failed
    if prefix in _FOUND:
        return _FOUND.pop(prefix)
    batch = {prefix: (run_case, cases)}
    if not _shared_failed:
        for other, (module, other_case, other_cases) in _DECLARED.items():
            if other not in batch and other not in _RUN and module in SELECTED:
                batch[other] = (other_case, other_cases)
    if len(batch) > 1:
        try:
            found = _shared(batch, tmp_path_factory)
        except Exception:
            _shared_failed = True
        else:
            _RUN.update(found)
            _FOUND.update(found)
            return _FOUND.pop(prefix)
    return _run_batch({prefix: (run_case, cases)}, tmp_path_factory, prefix)[prefix]
