"""The worker entry of a launched job: `python -m turbo_dllm.jobs.worker --manifest M`.

Every worker of a `dllm launch` (in-process, under torchrun, on every SLURM node) reads the run
manifest the launcher wrote before it started them, and trains exactly what it records: the
resolved spec and the plan's parallel layout. Nothing is recomputed from the spec or rewritten:
in an elastic job the plan names the data-parallel axis that absorbs the live world size
(`ParallelLayout.resized`), and the spec stays as the manifest recorded it.

A worker under torchrun stops with it: torchrun starts each worker in a session of its own, so
one that ends without stopping them (SIGKILL, the OOM killer, a crash) would leave them training
on, orphaned. Each asks Linux for a signal when torchrun ends and then saves the step under way
and ends with 143 (train/stop.py `stop_with_parent`); one whose torchrun ended before it asked
ends at once, before training.

A worker's output reaches the console through its launcher, which reads torchrun's pipes (and
keeps a copy in console.log). A launcher that is killed (SIGKILL) takes the pipes' reading end
with it; torchrun, which dies with it, passes a SIGTERM on, and the worker's next line (the step
under way, the stop it acts on) failed with BrokenPipeError: a traceback instead of the save, and
every step since the last checkpoint lost. A worker so started writes to console.log itself once
the pipe is gone (`keep_output_past_the_launcher`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

__all__ = ["LAUNCHER_PID_VARIABLE", "keep_output_past_the_launcher", "layout_for_world", "main"]

# Set by the torchrun backend for torchrun (which passes its environment on to the workers): the
# launcher's pid, torchrun's parent, so a worker also sees a torchrun that ended before it looked.
LAUNCHER_PID_VARIABLE = "DLLM_LAUNCHER_PID"


def layout_for_world(plan, spec, world_size: int):
    """The layout this worker group trains with: the plan's, resized on an elastic restart."""
    from turbo_dllm.config.topology import ParallelLayout

    layout = ParallelLayout.from_dict(plan.layout) if plan.layout else spec.topology.layout
    if plan.elastic_axis:
        return layout.resized(plan.elastic_axis, world_size)
    return layout


class _AfterThePipe:
    """Points fds 1 and 2 at a log file, once: the launcher that read them has gone."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.done = False

    def redirect(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError:  # the run dir is gone or read-only: nowhere to keep the lines
            fd = os.open(os.devnull, os.O_WRONLY)
        try:
            for target in (1, 2):
                os.dup2(fd, target)
        finally:
            os.close(fd)


class _PipeGuarded:
    """A text stream that moves to the log (`_AfterThePipe`) when its pipe breaks, and then
    writes the line again: the write that failed wrote nothing."""

    def __init__(self, stream, after: _AfterThePipe) -> None:
        self._stream = stream
        self._after = after

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._after.redirect()
            return self._stream.write(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._after.redirect()
            self._stream.flush()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def keep_output_past_the_launcher(log_path: Path) -> None:
    """sys.stdout and sys.stderr go on into `log_path` (appended, as the launcher wrote it) once
    their pipe to the launcher breaks, and so do the process's fds 1 and 2 (torch's own C++
    output, a logging handler holding the original stream)."""
    after = _AfterThePipe(log_path)
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _PipeGuarded):
            setattr(sys, name, _PipeGuarded(stream, after))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m turbo_dllm.jobs.worker")
    parser.add_argument("--manifest", required=True, help="runs/<id>/manifest.json")
    args = parser.parse_args(argv)

    from turbo_dllm.config.load import load_model
    from turbo_dllm.config.runspec import RunSpec
    from turbo_dllm.config.validate import check
    from turbo_dllm.errors import (
        DllmError,
        describe_os_error,
        is_file_system_error,
        print_error,
    )
    from turbo_dllm.jobs.manifest import read_manifest
    from turbo_dllm.train.entry import world_size_from_env

    try:
        manifest = read_manifest(Path(args.manifest).parent)
        spec = load_model(RunSpec, manifest.spec, f"{args.manifest} (spec)")
        world = world_size_from_env()
        layout = layout_for_world(manifest.plan, spec, world)
        check(spec, source=f"{args.manifest} (spec)")
        problems = layout.problems(world)
        if problems:
            raise DllmError(
                "the plan's layout does not fit this worker group: "
                + "; ".join(message for _, message in problems),
                hint="launch the job again with `dllm launch --manifest` on the planned nodes",
            )
    except DllmError as error:
        print_error(error.message, error.hint)
        return 2

    from turbo_dllm.jobs.result import RESULT_NAME, now, write_result
    from turbo_dllm.train.entry import train

    plan, started = manifest.plan, now()
    if LAUNCHER_PID_VARIABLE in os.environ and plan.backend == "torchrun":
        from turbo_dllm.jobs.backends.torchrun import console_log

        # A `dllm launch` reads our output through pipes (a SLURM job's goes to a file).
        keep_output_past_the_launcher(console_log(plan.run_dir, plan.multi_node))
    records = plan.multi_node and os.environ.get("RANK", "0") == "0"
    if records:
        # This attempt is the run's status now (as a `dllm train` resume's is): an earlier
        # attempt's result (an early stop, a failure) would read as this one's while it trains.
        (Path(plan.run_dir) / RESULT_NAME).unlink(missing_ok=True)
    try:
        code = train(spec, Path(plan.run_dir), layout=layout)
    except DllmError as error:
        # What `dllm train` prints for it (a vanished data artifact, a bad checkpoint), once per
        # failing rank, and exit 2: it was a traceback from every rank.
        print_error(error.message, error.hint)
        code = 2
    except OSError as error:
        if not is_file_system_error(error):
            raise  # a socket or device error (a lost peer): not a path the user can fix
        # The file system said no (a full disk while a checkpoint is written, a run dir made
        # read-only): the path and the reason, as `dllm train` says them, not a traceback.
        print_error(*describe_os_error(error))
        code = 2
    if records:
        # No launcher sees a multi-node job end (each node's sees its own torchrun only), so
        # global rank 0 records the finished run: a later launch of it is refused, not joined.
        write_result(Path(plan.run_dir), code, started, plan.backend, recorded_by="rank 0")
    return code


def _main_or_interrupted() -> int:
    try:
        return main()
    except KeyboardInterrupt:
        # torchrun passes Ctrl-C on to every worker: end quietly (128 + SIGINT) instead of one
        # traceback per rank; the launcher says the run was interrupted.
        return 130


def stop_with_torchrun(parent: int) -> bool:
    """Under torchrun, ask for `PARENT_GONE_SIGNAL` when `parent` (torchrun, read at the start)
    ends; False where it has ended already (the worker then ends without training)."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:  # not a torchrun worker
        return True
    from turbo_dllm.train.stop import stop_with_parent

    launcher = os.environ.get(LAUNCHER_PID_VARIABLE, "")
    if stop_with_parent(parent, int(launcher) if launcher.isdigit() else None) is False:
        print(
            f"dllm: rank {os.environ.get('RANK', '?')}: its torchrun (pid {parent}) ended before "
            "the worker started: it stops without training",
            file=sys.stderr,
            flush=True,
        )
        return False
    return True


if __name__ == "__main__":
    _torchrun = os.getppid()  # first thing: torchrun, unless it has ended already
    if not stop_with_torchrun(_torchrun):
        from turbo_dllm.train.stop import EXIT_TERMINATED

        sys.exit(EXIT_TERMINATED)
    from turbo_dllm.train.entry import run_and_end

    run_and_end(_main_or_interrupted)
