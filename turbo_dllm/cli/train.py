"""`dllm train --config F [--run-dir D] [--set k=v]`: run the trainer in this process.

Under `torchrun --nproc-per-node N -m turbo_dllm train ...` every rank runs this same command.
"""

from __future__ import annotations

import contextlib

from turbo_dllm.cli._output import add_overrides, shell_path


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a RunSpec in this process (or on every torchrun rank)",
        description="Train a RunSpec. Resumes from the latest checkpoint in the run directory.",
    )
    p.add_argument("--config", required=True, help="RunSpec YAML")
    p.add_argument(
        "--run-dir",
        default=None,
        help="run directory (default: launch.run_dir, else runs/<UTC stamp>-<id>)",
    )
    add_overrides(p)
    p.set_defaults(func=_train)


def _train(args) -> int:
    import os

    from turbo_dllm import cli

    # A rank of a hand-run torchrun stops with it, as `dllm launch`'s workers do: torchrun starts
    # each rank in a session of its own, so one that dies without stopping them (SIGKILL, the OOM
    # killer) would leave them training on, orphaned; each saves the step under way instead.
    if cli.STARTED_UNDER is not None:
        from turbo_dllm.jobs.worker import stop_with_torchrun

        if not stop_with_torchrun(cli.STARTED_UNDER):
            from turbo_dllm.train.stop import EXIT_TERMINATED

            return EXIT_TERMINATED
    if args.run_dir is not None and not args.run_dir.strip():
        from turbo_dllm.errors import DllmError

        # `--run-dir "$DIR"` with DIR unset trained into the current folder (its checkpoints/
        # and metrics.jsonl beside whatever is there, resumed by the next such command)
        raise DllmError(
            "--run-dir is empty (an unset shell variable?)",
            hint="give --run-dir a folder, or leave it out (launch.run_dir, else a fresh "
            "runs/<stamp>-<id>)",
        )
    from turbo_dllm.data.spec import load_training_spec
    from turbo_dllm.train.entry import resolve_run_dir, train, world_size_from_env

    # The process count is checked on its own, below: a spec of several processes run in one
    # read "the launch has 1 processes" and "fix the fields above", though nothing was wrong
    # with its fields; it needs its processes started, as its launch (or torchrun) does.
    world = world_size_from_env()
    spec = load_training_spec(args.config, args.overrides)
    _check_process_count(spec, world, args)
    from turbo_dllm.jobs.launcher import check_inputs

    check_inputs(spec, args.config)  # before the run dir exists
    from turbo_dllm.train.evaluate import check_eval_data

    check_eval_data(spec, spec.topology.layout.dp_size)  # the held-out data's too
    # `~` is the home folder, as in the spec's launch.run_dir (bash leaves --run-dir=~/a as it is)
    requested = None if args.run_dir is None else os.path.expanduser(args.run_dir)
    run_dir = resolve_run_dir(spec, requested)
    _check_checkpoint_dir(spec, run_dir)  # before the run dir exists, and any step
    made = not run_dir.exists()
    _make_run_dir(run_dir)
    if not _check_recorded_spec(spec, run_dir, args):
        code = 1
        try:
            code = train(spec, run_dir)
        except KeyboardInterrupt:
            _interrupted(args, spec, run_dir, world)
            raise
        finally:
            # A run refused before it wrote anything (no weights in model.path, flex on CPU,
            # wandb missing) left its new run dir behind, empty: a fresh stamped one per attempt.
            if made and code != 0:
                with contextlib.suppress(OSError):  # rmdir: only while nothing is in it
                    run_dir.rmdir()
        return code
    return _attempt(spec, run_dir, train)


def _check_process_count(spec, world: int, args) -> None:
    """The spec's topology needs `dp*fsdp*max(cp,bp)*tp` processes; this `dllm train` is one of
    `world` (1 without torchrun). A mismatch names the command that starts the right count: for
    a run `dllm launch` recorded (--run-dir, or the launch.run_dir its spec.yaml names, so this
    command resumes it), the torchrun line its plan records and its replay; for another spec,
    `dllm launch --config F` (which starts them) or torchrun by hand."""
    import shlex
    import sys

    from turbo_dllm.errors import DllmError

    need = spec.topology.world_size
    if need == world:
        return
    here = (
        "this `dllm train` is 1 (torchrun starts several)"
        if world == 1
        else f"torchrun started {world} (WORLD_SIZE={world})"
    )
    processes = f"{need} process{'es' if need > 1 else ''}"
    message = f"{args.config} needs {processes} ({spec.topology.layout.describe()}); {here}"
    recorded = _recorded_run(args.run_dir if args.run_dir is not None else spec.launch.run_dir)
    if recorded is not None:
        run, ways = recorded
        raise DllmError(
            f"{message}. {run}", hint="; or ".join(ways) + " (the spec's fields need no change)"
        )
    config = shell_path(args.config)
    more = "".join(f" --set {shlex.quote(o)}" for o in args.overrides)
    if args.run_dir is not None:
        more += f" --run-dir {shell_path(args.run_dir)}"
    fit = _fit_to(spec.topology, world)
    if need == 1:
        raise DllmError(
            message,
            hint=f"run it in one process, without torchrun: dllm train --config {config}{more} "
            f"(or dllm launch --config {config}{more}){fit}",
        )
    torchrun = shlex.join(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
        + [str(need)]
    )
    raise DllmError(
        message,
        hint=f"start its {processes}: dllm launch --config {config}{more} (torchrun, "
        f"recorded as a run), or by hand: {torchrun} -m turbo_dllm train --config "
        f"{config}{more}{fit}",
    )


def _fit_to(topo, world: int) -> str:
    """How to make the topology's product the `world` processes this `dllm train` was started
    with, by its data-parallel degrees: "; or fit the spec to ...: add `--set topology.dp=N`"
    (the dp fix of `dllm launch`'s refusal, `world_size_fixes`, and the fsdp one), or why none
    fits (nothing for one process). The hint offered only one process or `dllm launch`."""
    from turbo_dllm.config.topology import world_size_fixes

    fixes = [f for f in world_size_fixes(topo, world, world, 1) if f.startswith("--set ")]
    others = topo.dp * topo.context_degree * topo.tp  # all but fsdp
    if world % others == 0 and world // others != topo.fsdp:
        fixes.append(f"--set topology.fsdp={world // others}")
    started = "one process" if world == 1 else f"the {world} processes torchrun started"
    if fixes:
        shown = " or ".join(f"`{fix}`" for fix in fixes)
        return f"; or fit the spec to {started}: add {shown} to this `dllm train`"
    if world == 1:
        return ""
    rest = topo.fsdp * topo.context_degree * topo.tp
    return f"; no dp fits {started}: {world} is not a multiple of fsdp*max(cp,bp)*tp = {rest}"


def _recorded_run(where):
    """(what the run is, the ways on) where `where` (a run dir, or None) holds a run `dllm
    launch` recorded (a readable manifest.json); else None."""
    import os
    from pathlib import Path
    from shlex import quote

    from turbo_dllm.errors import DllmError
    from turbo_dllm.jobs.manifest import MANIFEST_NAME, read_manifest

    if where is None:
        return None
    run_dir = Path(os.path.expanduser(where)).absolute()
    if not (run_dir / MANIFEST_NAME).is_file():
        return None
    try:
        manifest = read_manifest(run_dir)
    except DllmError:
        return None
    from turbo_dllm.jobs.launcher import _complete
    from turbo_dllm.jobs.runs import resume_way, summarize

    plan = manifest.plan
    run = (
        f"{run_dir} holds run {manifest.run_id}, launched with {plan.backend}, {plan.nnodes} "
        f"node(s) x {plan.nproc_per_node} process(es)"
    )
    again = (
        "run the same job again, into a new run dir: dllm launch --manifest "
        f"{quote(str(run_dir / MANIFEST_NAME))}"
    )
    try:
        summary = summarize(run_dir, manifest)
    except DllmError:  # a damaged record: resuming it is still the way on
        summary = None
    if summary is not None and _complete(summary):
        return f"{run}; it finished (step {summary.steps_done}/{summary.steps_total})", [again]
    resume = resume_way(manifest, run_dir)
    return run, [resume, again]


def _make_run_dir(run_dir) -> None:
    """The run dir exists as a folder before the trainer starts, or a clear error says why not."""
    from turbo_dllm.errors import DllmError

    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        why = "it is not a folder" if run_dir.exists() else (error.strerror or str(error))
        raise DllmError(
            f"cannot create run dir {run_dir}: {why}",
            hint="pass --run-dir a folder you can write (or leave it unset for a fresh one)",
        ) from None


def _check_checkpoint_dir(spec, run_dir) -> None:
    """Checkpoints are first written after the first steps: a checkpoint.dir through a file (or
    one that cannot be written) failed there, after the work ("Not a directory")."""
    from turbo_dllm.doctor.folders import checkpoint_dir_problem
    from turbo_dllm.errors import DllmError

    problem = checkpoint_dir_problem(spec, run_dir)
    if problem is not None:
        raise DllmError(problem[0], hint=problem[1])


def _attempt(spec, run_dir, train) -> int:
    """Resume a recorded run as its latest attempt: its status (`dllm run list`) is this one's,
    not what the launcher (or SLURM) said of an earlier one. The launcher's stale result goes
    before training starts, this process records itself as the run's launcher ("running"
    while it trains, "died" if it is killed, "interrupted" by Ctrl-C), and this attempt's exit
    code replaces the result
    (rank 0 of a torchrun'd `dllm train`); an interrupted attempt, like an interrupted launch,
    leaves none."""
    import os
    import sys

    from turbo_dllm.errors import DllmError
    from turbo_dllm.jobs.result import (
        RESULT_NAME,
        end_launcher,
        now,
        record_launcher,
        write_result,
    )

    main = os.environ.get("RANK", "0") == "0"
    backend = "local" if os.environ.get("WORLD_SIZE", "1") == "1" else "torchrun"
    if _finished(run_dir, main):
        return 0
    if main:
        # Rank 0 only: the other ranks of a torchrun'd resume would read rank 0's own record
        # (torchrun stops them when rank 0 is refused).
        _refuse_a_live_run(run_dir)
        (run_dir / RESULT_NAME).unlink(missing_ok=True)
        record_launcher(run_dir, by="dllm train")
    started, code, writes, interrupted = now(), 1, main, False
    try:
        code = train(spec, run_dir)
        return code
    except (DllmError, OSError):  # both end as `dllm: error:` with exit 2 (cli/__init__.py)
        code = 2
        raise
    except KeyboardInterrupt:
        writes, interrupted = False, True
        if main:
            from turbo_dllm.jobs.manifest import read_manifest
            from turbo_dllm.jobs.runs import resume_way

            with contextlib.suppress(DllmError):
                way = resume_way(read_manifest(run_dir), run_dir)
                print(f"dllm: stopped by Ctrl-C (no result); {way}", file=sys.stderr, flush=True)
        raise
    finally:
        if writes:
            write_result(run_dir, code, started, backend, resumed_by="dllm train")
        if main:
            end_launcher(run_dir, interrupted=interrupted)


def _interrupted(args, spec, run_dir, world: int) -> None:
    """After Ctrl-C, the command that goes on: it said only `dllm: interrupted`, and the same
    `dllm train --config F` without --run-dir starts a new runs/<stamp> instead of resuming the
    one it stopped. One process only (a torchrun'd rank's line would not start the others)."""
    import shlex
    import sys
    from pathlib import Path

    if world != 1:
        return
    folder = Path(spec.checkpoint.dir or Path(run_dir) / "checkpoints")
    try:
        saved = any(p.is_file() for p in folder.glob("step_*/checkpoint.json"))
    except OSError:
        saved = True
    more = "".join(f" --set {shlex.quote(o)}" for o in args.overrides)
    command = f"dllm train --config {shell_path(args.config)}{more} --run-dir {shell_path(run_dir)}"
    where = "from its last checkpoint" if saved else "(it saved no checkpoint yet: from step 1)"
    print(f"dllm: continue it {where} with: {command}", file=sys.stderr, flush=True)


def _from_its_checkpoint(run_dir, args) -> str:
    """The changed spec as a new run from the recorded run's last checkpoint: "train into a new
    run dir" alone started it over (a new run dir has no checkpoint), so more steps of a
    finished run, say, were not what it trained."""
    import shlex

    if args is None:
        return ""
    given = list(args.overrides)
    if not any(o.split("=", 1)[0].strip() == "checkpoint.resume" for o in given):
        given.append(f"checkpoint.resume={run_dir}")
    sets = "".join(f" --set {shlex.quote(o)}" for o in given)
    return (
        f" from its last checkpoint: dllm train --config {shell_path(args.config)}{sets} "
        "--run-dir NEW_DIR"
    )


def _finished(run_dir, main: bool) -> bool:
    """Whether the recorded run finished (exit status 0 at its last step): then there is nothing
    to resume, and its records stay as they are. A `dllm train` of a finished run removed the
    launch's result.json and wrote its own, so the run read as ended by a resume that trained
    nothing, at the time of that resume. Every rank reads the same files and none of them changes
    anything here, so all ranks decide alike."""
    from shlex import quote

    from turbo_dllm.errors import DllmError
    from turbo_dllm.jobs.launcher import _complete
    from turbo_dllm.jobs.manifest import MANIFEST_NAME
    from turbo_dllm.jobs.runs import summarize

    try:
        run = summarize(run_dir, ask_slurm=False)
    except DllmError:  # a damaged record: the resume writes its own in its place
        return False
    if not _complete(run):
        return False
    if main:
        import sys

        at = f" at {run.finished_at}" if run.finished_at else ""
        print(
            f"nothing to do: run {run.run_id} finished{at} (step "
            f"{run.steps_done}/{run.steps_total}); its records are left as they are. The same "
            f"job again, into a new run dir: dllm launch --manifest "
            f"{quote(str(run_dir / MANIFEST_NAME))}",
            file=sys.stderr,
        )
    return True


# What `dllm run list` calls a run that something still trains (or SLURM still holds).
_LIVE = ("running", "pending", "configuring", "completing", "suspended", "requeued")


def _refuse_a_live_run(run_dir) -> None:
    """A resume of a run that still trains is refused before it touches the run's records: it
    removed the live run's result, replaced its launcher's record with its own and, refused
    later by the checkpoint folder's lock, wrote `exit 2` as the result of the run still
    training (`dllm run list` said `exit 2`, then `exit 2` again after a Ctrl-C of the launch,
    whose record was gone)."""
    from shlex import quote

    from turbo_dllm.errors import DllmError
    from turbo_dllm.jobs.result import launcher_alive, read_launchers
    from turbo_dllm.jobs.runs import summarize

    try:
        run = summarize(run_dir)
    except DllmError:  # a damaged record: the resume writes its own in its place
        return
    if run.status not in _LIVE:
        return
    if run.slurm_state:
        who = f"its SLURM job {run.slurm_job_id} is {run.status}"
        stop = f"scancel {run.slurm_job_id}"
    else:
        live = [r for r in read_launchers(run_dir) if launcher_alive(r)]
        who = ", ".join(
            f"its {r.get('by') or 'dllm launch'} runs as pid {r['pid']} on {r['host']} "
            f"(since {r['started_at']})"
            for r in live
        )
        stop = "stop it"
    raise DllmError(
        f"{run_dir} is not over: {who}; a resume would train beside it",
        hint=f"wait for it to end (`dllm run show {quote(str(run_dir))}`) or {stop}, then "
        "resume; or train into a new run dir",
    )


def _check_recorded_spec(spec, run_dir, args=None) -> bool:
    """A run dir that `dllm launch` recorded resumes only with the spec its manifest holds:
    another one would append steps the manifest does not describe (`dllm run list`: 9/6).
    True: `run_dir` is such a run."""
    from turbo_dllm.jobs.manifest import MANIFEST_NAME, read_manifest, spec_sha256

    if not (run_dir / MANIFEST_NAME).is_file():
        return False
    from turbo_dllm.errors import DllmError

    manifest = read_manifest(run_dir)
    current = spec.model_dump(mode="json")
    if manifest.spec_sha256 != spec_sha256(current):
        from turbo_dllm.jobs.drift import flat_diff

        # Not launch.run_dir, which the hash leaves out (where a run is written is not what it
        # computes): it was listed as a change beside the real ones, `'/x/runs/k' -> None` for
        # the train.yaml the run was launched from.
        changed = [
            f"{d.field}: {d.recorded!r} -> {d.current!r}"
            for d in flat_diff(manifest.spec, current)
            if d.field != "launch.run_dir"
        ]
        shown = "; ".join(changed[:5]) + (
            f"; and {len(changed) - 5} more" if len(changed) > 5 else ""
        )
        raise DllmError(
            f"{run_dir} holds a run recorded by `dllm launch` with another spec ({shown})",
            hint="resume it with the spec its manifest records (--config "
            f"{shell_path(run_dir / 'spec.yaml')}, "
            "no --set; undo any edit of that file: the fields above), or train into a new run "
            f"dir{_from_its_checkpoint(run_dir, args)}",
        )
    if manifest.data is not None and spec.data.artifact is not None:
        # The same path with other content (prepared again): the resumed loader would walk
        # another stream than the one the manifest and the checkpoints record.
        from turbo_dllm.data.artifact import read_manifest as read_data_manifest

        now = read_data_manifest(spec.data.artifact).fingerprint
        if now != manifest.data.fingerprint:
            raise DllmError(
                f"{run_dir} was recorded with data artifact fingerprint "
                f"{manifest.data.fingerprint[:16]}, but {spec.data.artifact} now holds "
                f"{now[:16]}",
                hint="restore the recorded data to resume the run, or train into a new run dir",
            )
    return True
