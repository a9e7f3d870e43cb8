"""`dllm launch`: compile a RunSpec into a job, record its manifest, start its workers.

dllm launch --config F [--set k=v] [--nproc-per-node N] [--nnodes N|MIN:MAX]
            [--node-rank R --master-addr A --master-port P | --rdzv-endpoint H:P]
            [--max-restarts K] [--backend auto|local|torchrun|slurm] [--dry-run]
dllm launch --manifest runs/<id>/manifest.json [--allow-drift]
"""

from __future__ import annotations

import json
import sys

from turbo_dllm.cli._output import add_overrides, emit_json


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "launch",
        help="compile a RunSpec into a job, write its manifest and run it",
        description="Compile a RunSpec and this host into a job plan, write "
        "runs/<id>/manifest.json before any worker starts, and run the job locally, under "
        "torchrun or as a SLURM job. With --manifest, replay a recorded run.",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="RunSpec YAML")
    source.add_argument("--manifest", help="replay the run recorded in this manifest")
    add_overrides(p)
    p.add_argument("--allow-drift", action="store_true", help="replay despite drift and record it")
    layout = p.add_argument_group("layout")
    layout.add_argument(
        "--backend",
        choices=("auto", "local", "torchrun", "slurm"),
        default="auto",
        help="auto: one process in-process, anything more under torchrun",
    )
    layout.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        metavar="N",
        help="processes per node (default: the topology's product / nodes)",
    )
    layout.add_argument(
        "--nnodes", default=None, metavar="N|MIN:MAX", help="node count, or an elastic range"
    )
    layout.add_argument(
        "--max-restarts",
        type=int,
        default=None,
        metavar="K",
        help="restart the workers up to K times; they resume from the last checkpoint",
    )
    meet = p.add_argument_group("rendezvous (multi-node)")
    meet.add_argument(
        "--node-rank", type=int, default=None, metavar="R", help="this node (static launches)"
    )
    meet.add_argument("--master-addr", default=None, metavar="HOST", help="node 0's address")
    meet.add_argument(
        "--master-port",
        type=int,
        default=None,
        metavar="PORT",
        help="default 29500; SLURM: derived from the job id, so jobs sharing a node differ",
    )
    meet.add_argument(
        "--rdzv-endpoint", default=None, metavar="HOST:PORT", help="c10d rendezvous (elastic)"
    )
    meet.add_argument("--rdzv-id", default=None, metavar="ID", help="default: the run id")
    meet.add_argument(
        "--rdzv-conf",
        default=None,
        metavar="K=V,...",
        help="c10d rendezvous settings, e.g. last_call_timeout=5 (how long an elastic job waits "
        "for more nodes once MIN have joined; torchrun's default is 30 s)",
    )
    where = p.add_argument_group("run dir")
    where.add_argument(
        "--run-dir",
        default=None,
        help="exactly this run dir: a new folder, or one that holds no run",
    )
    where.add_argument(
        "--run-root",
        default=None,
        help="make <root>/<stamp>-<id> (default runs; a replay: beside the recorded run)",
    )
    slurm = p.add_argument_group("slurm")
    slurm.add_argument("--submit", action="store_true", help="call sbatch on the script")
    slurm.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,
        metavar="G",
        help="default: --nproc-per-node on a host with GPUs, none on a CPU host",
    )
    slurm.add_argument(
        "--cpus-per-task",
        type=int,
        default=None,
        metavar="C",
        help="CPUs for each node's processes (default: one per process)",
    )
    slurm.add_argument("--partition", default=None, metavar="NAME")
    slurm.add_argument("--account", default=None, metavar="NAME")
    slurm.add_argument("--time", default=None, help="SLURM time limit, e.g. 04:00:00")
    slurm.add_argument(
        "--sbatch",
        action="append",
        default=[],
        metavar="OPTION",
        help="extra #SBATCH line, e.g. --sbatch=--exclusive",
    )
    p.add_argument("--dry-run", action="store_true", help="print plan and manifest; touch nothing")
    p.add_argument("--json", action="store_true", help="with --dry-run: one JSON object")
    p.set_defaults(func=_launch)


def _options(args):
    from turbo_dllm.jobs.options import LaunchOptions, NodeRange, SlurmOptions

    if args.nnodes:
        nodes = NodeRange.parse(args.nnodes)
    elif args.manifest:
        # A replay's node count is the recorded one: `--node-rank 1` on node 1 of a 2-node
        # run's replay was checked against one node ("--node-rank 1 is outside 0..0").
        from turbo_dllm.jobs.manifest import read_manifest

        plan = read_manifest(args.manifest).plan
        nodes = NodeRange(plan.nnodes_min, plan.nnodes_max)
    else:
        nodes = NodeRange()
    return LaunchOptions(
        backend=args.backend,
        nproc_per_node=args.nproc_per_node,
        nnodes=nodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_id=args.rdzv_id,
        rdzv_conf=args.rdzv_conf,
        max_restarts=args.max_restarts or 0,
        run_root=args.run_root,
        run_dir=args.run_dir,
        slurm=SlurmOptions(
            gpus_per_node=args.gpus_per_node,
            cpus_per_task=args.cpus_per_task,
            partition=args.partition,
            account=args.account,
            time=args.time,
            extra=tuple(args.sbatch),
        ),
    )


def _canonical_argv(args) -> list[str]:
    """The launch as a command line, rebuilt from the parsed options (what the manifest records)."""
    argv = ["dllm", "launch"]
    for action_dest, flag in (
        ("config", "--config"),
        ("manifest", "--manifest"),
        ("backend", "--backend"),
        ("nproc_per_node", "--nproc-per-node"),
        ("nnodes", "--nnodes"),
        ("max_restarts", "--max-restarts"),
        ("node_rank", "--node-rank"),
        ("master_addr", "--master-addr"),
        ("master_port", "--master-port"),
        ("rdzv_endpoint", "--rdzv-endpoint"),
        ("rdzv_id", "--rdzv-id"),
        ("rdzv_conf", "--rdzv-conf"),
        ("run_dir", "--run-dir"),
        ("run_root", "--run-root"),
        ("gpus_per_node", "--gpus-per-node"),
        ("cpus_per_task", "--cpus-per-task"),
        ("partition", "--partition"),
        ("account", "--account"),
        ("time", "--time"),
    ):
        value = getattr(args, action_dest)
        if value is not None and not (action_dest == "backend" and value == "auto"):
            argv += _option_words(flag, str(value))
    for override in args.overrides:
        argv += ["--set", override]
    for line in args.sbatch:
        # One word: a value that starts with "-" (--exclusive) is read back as an option when
        # it stands apart, and the start command or the manifest's argv would not parse.
        argv.append(f"--sbatch={line}")
    for flag in ("allow_drift", "submit"):
        if getattr(args, flag):
            argv.append("--" + flag.replace("_", "-"))
    return argv


def _option_words(flag: str, value: str) -> list[str]:
    """`flag value` as command-line words that parse back: a value that starts with "-" (a
    folder named -r1, given as --run-dir=-r1) is read back as an option when it stands apart
    ("argument --run-dir: expected one argument"), so it goes in one word, `flag=value`."""
    return [f"{flag}={value}"] if value.startswith("-") else [flag, value]


def _replay_conflicts(args) -> list[str]:
    """Flags that would change a recorded job (a replay keeps its spec and layout). A layout
    flag given with the value the run recorded changes nothing and is taken: an explicit
    `--max-restarts 0` on a run recorded with 0 was refused as a change."""
    given = {
        "--set": bool(args.overrides),
        "--backend": args.backend != "auto",
        "--nproc-per-node": args.nproc_per_node is not None,
        "--nnodes": args.nnodes is not None,
        "--max-restarts": args.max_restarts is not None,
        "--gpus-per-node": args.gpus_per_node is not None,
        "--cpus-per-task": args.cpus_per_task is not None,
        "--partition": args.partition is not None,
        "--account": args.account is not None,
        "--time": args.time is not None,
        "--sbatch": bool(args.sbatch),
    }
    flags = [flag for flag, present in given.items() if present]
    comparable = [flag for flag in flags if flag != "--set"]
    if not comparable:
        return flags
    from turbo_dllm.jobs.manifest import read_manifest

    recorded = _recorded_values(read_manifest(args.manifest).plan)
    now = _given_values(args)
    return [flag for flag in flags if flag == "--set" or now[flag] != recorded.get(flag)]


def _recorded_values(plan) -> dict:
    """The layout flags' values as the recorded plan has them (None: the plan has no such
    setting, so any value given changes the job)."""
    values = {
        "--backend": plan.backend,
        "--nproc-per-node": plan.nproc_per_node,
        "--nnodes": (plan.nnodes_min, plan.nnodes_max),
        "--max-restarts": plan.max_restarts,
    }
    job = plan.slurm
    if job is not None:
        values.update(
            {
                "--gpus-per-node": job.gpus_per_node,
                "--cpus-per-task": job.cpus_per_task,
                "--partition": job.partition,
                "--account": job.account,
                "--time": job.time,
                "--sbatch": tuple(job.extra),
            }
        )
    return values


def _given_values(args) -> dict:
    from turbo_dllm.jobs.options import NodeRange

    nodes = NodeRange.parse(args.nnodes) if args.nnodes is not None else None
    return {
        "--backend": args.backend,
        "--nproc-per-node": args.nproc_per_node,
        "--nnodes": None if nodes is None else (nodes.min, nodes.max),
        "--max-restarts": args.max_restarts,
        "--gpus-per-node": args.gpus_per_node,
        "--cpus-per-task": args.cpus_per_task,
        "--partition": args.partition,
        "--account": args.account,
        "--time": args.time,
        "--sbatch": tuple(args.sbatch),
    }


def _launch(args) -> int:
    from turbo_dllm.errors import DllmError
    from turbo_dllm.jobs import launcher

    for flag, value in (("--config", args.config), ("--manifest", args.manifest)):
        if value is not None and not value.strip():
            # `--manifest "$M"` with M unset: read as no --manifest, it ended in a traceback
            # (a launch of no config)
            raise DllmError(
                f"{flag} is empty (an unset shell variable?)",
                hint="pass a RunSpec YAML (--config F) or a run's manifest.json (--manifest M)",
            )
    if args.json and not args.dry_run:
        raise DllmError(
            "--json goes with --dry-run",
            hint="add --dry-run for the plan and manifest as JSON, or drop --json to launch (a "
            "launch streams its workers' output; `dllm run list --json` reports runs)",
        )
    if args.allow_drift and not args.manifest:
        raise DllmError(
            "--allow-drift only applies to a replay (--manifest)",
            hint="drop --allow-drift, or replay a run: dllm launch --manifest "
            "runs/<id>/manifest.json --allow-drift",
        )
    if args.submit and args.backend != "slurm" and not args.manifest:
        raise DllmError(
            "--submit goes with --backend slurm",
            hint="add --backend slurm, or drop --submit",
        )
    argv = _canonical_argv(args)
    options = _options(args)
    if args.manifest:
        conflicts = _replay_conflicts(args)
        if conflicts:
            raise DllmError(
                f"a replay runs the recorded job; {', '.join(conflicts)} would change it",
                hint=_changed_replay_hint(args.manifest, conflicts, argv),
            )
        job = launcher.prepare_replay(args.manifest, options, argv, allow_drift=args.allow_drift)
        if args.submit and job.plan.backend != "slurm":
            raise DllmError(
                f"--submit goes with a SLURM job, and run {job.manifest.replay_of.run_id} was "
                f"recorded with backend {job.plan.backend}",
                hint="drop --submit: the replay runs here, as the recorded run did",
            )
    else:
        job = launcher.prepare_launch(args.config, args.overrides, options, argv)
    # A run dir that holds a run is refused here, dry run included, before any check or write.
    joins = launcher.check_run_dir(job)

    if args.dry_run:
        return _print_dry_run(job, args.json, _start_command(argv, job), joins, args.submit)
    if args.submit:
        from turbo_dllm.jobs.backends.slurm import find_sbatch

        find_sbatch()  # before anything is written: fail early, not after the run dir exists

    report = launcher.readiness(job)
    if not report.ready:
        failed = [r for r in report.results if r.status == "fail"]
        raise DllmError(
            "not ready to launch:\n"
            + "\n".join(f"  - {r.name}: {r.detail}\n    fix: {r.fix}" for r in failed),
            hint=_not_ready_hint(args),
        )
    _print_warnings(report)
    made_run_dir = not job.run_dir.exists()
    launcher.materialize(job)
    _print_start(job)
    code = launcher.start(job, submit=args.submit, made_run_dir=made_run_dir)
    _print_end(job, code, args.submit)
    return code


def _not_ready_hint(args) -> str:
    """What to do about failed readiness checks: fix them and launch again; where the launch
    read a spec file, the doctor line that checks it without launching, as pasteable (it read
    "`dllm doctor --config F`", a placeholder)."""
    import shlex

    from turbo_dllm.cli._output import shell_path

    hint = "fix the checks above, then launch again"
    if not args.config:
        return hint
    sets = "".join(f" --set {shlex.quote(o)}" for o in args.overrides)
    return (
        f"{hint} (dllm doctor --config {shell_path(args.config)}{sets} runs this host's "
        "checks without launching)"
    )


def _changed_replay_hint(manifest: str, conflicts: list[str], argv: list[str]) -> str:
    """How to run the recorded job with changes: its spec.yaml as a new run. That spec names
    the run's own dir (launch.run_dir), so the launch needs a new --run-dir (without one it is
    refused as a launch into the recorded run). The changes are the ones given, as they were
    given (`--set training.steps=5`, not `--set ...`), so the line needs only NEW_DIR."""
    import shlex
    from pathlib import Path

    from turbo_dllm.cli._output import shell_path

    folder = Path(manifest) if Path(manifest).is_dir() else Path(manifest).parent
    spec = folder / "spec.yaml"  # launcher.SPEC_NAME
    config = shell_path(spec) if spec.is_file() else "F"
    words, given, at = argv[2:], [], 0
    while at < len(words):  # _canonical_argv: `--flag value` or `--flag=value`; two switches
        word = words[at]
        one = "=" in word or word in ("--allow-drift", "--submit")
        option = words[at : at + (1 if one else 2)]
        if word.split("=", 1)[0] in conflicts:
            given += option
        at += len(option)
    changes = shlex.join(given) if given else " ".join(f"{flag} ..." for flag in conflicts)
    return (
        f"launch its spec with the new settings, as a new run: dllm launch --config {config} "
        f"{changes} --run-dir NEW_DIR"
    )


def _start_command(argv: list[str], job) -> str:
    """The launch that starts exactly the printed plan, as a bash line that runs when pasted.

    The plan's own commands read <run dir>/manifest.json, which only a launch writes (before
    any worker starts), and a launch without --run-dir stamps a new run id:
    so the line is this launch, pinned to the printed run dir, from the directory it ran in.
    """
    import shlex

    words = argv[2:]
    if "--run-root" in words:
        at = words.index("--run-root")
        del words[at : at + 2]
    words = [word for word in words if not word.startswith("--run-root=")]
    if not any(word == "--run-dir" or word.startswith("--run-dir=") for word in words):
        words += _option_words("--run-dir", str(job.run_dir))
    launch = [sys.executable, "-m", "turbo_dllm", "launch", *words]
    return f"cd {shlex.quote(job.plan.cwd)} && {shlex.join(launch)}"


def _print_dry_run(job, as_json: bool, start_command: str, joins: bool, submit: bool) -> int:
    from turbo_dllm.jobs.describe import describe_plan, describe_topology

    manifest = job.manifest.model_dump(mode="json")
    if as_json:
        emit_json(
            {
                "dry_run": True,
                "plan": job.plan.model_dump(mode="json"),
                "topology": describe_topology(job.plan.layout) if job.plan.layout else None,
                "manifest": manifest,
                "drift": [d.model_dump(mode="json") for d in job.drift],
                "start_command": start_command,
                "joins": joins,
            }
        )
        return 0
    print("# plan (dry run: nothing written, nothing started)")
    for line in describe_plan(job.plan):
        print(line)
    writes = (
        "joins the job another node recorded in the run dir (same spec)"
        if joins
        else "writes the run dir's spec.yaml and manifest.json"
    )
    runs = "then runs the command(s) above"
    if job.plan.backend == "slurm":
        # The launch writes the batch script, and runs sbatch only with --submit: "then runs
        # the command(s) above" said a job would start that the line only writes.
        writes = "writes the run dir's spec.yaml, manifest.json and job.sbatch"
        runs = (
            "then submits job.sbatch (sbatch)"
            if submit
            else "and submits nothing (add --submit, or run the sbatch command above)"
        )
    print(f"\n# to run it (paste into bash): {writes}, {runs}")
    print(start_command)
    if job.drift:
        print("\n# drift since the recorded run (recorded -> now)")
        for item in job.drift:
            print(f"  {item}")
    path = job.run_dir / "manifest.json"
    where = (
        f"this node's; {path} holds the recorded one" if joins else f"would be written to {path}"
    )
    print(f"\n# manifest ({where})")
    print(json.dumps(manifest, indent=2, sort_keys=True))
    return 0


def _print_warnings(report) -> None:
    for r in report.results:
        if r.status == "warn":
            print(f"dllm: warning: {r.name}: {r.detail} (fix: {r.fix})", file=sys.stderr)


def _print_start(job) -> None:
    plan = job.plan
    sizes = "/".join(map(str, plan.world_sizes))
    err = sys.stderr
    print(
        f"dllm: run {plan.run_id}: {plan.backend}, {plan.nnodes} node(s) x "
        f"{plan.nproc_per_node} process(es) = {sizes} on {plan.device}",
        file=err,
    )
    print(f"dllm: manifest {job.run_dir / 'manifest.json'}", file=err)
    for note in plan.notes:  # what --dry-run and `dllm run show` print: a tp group across
        print(f"dllm: note: {note}", file=err)  # nodes, oversubscribed CPUs, a CPU-only job
    if job.drift:
        print(
            f"dllm: replaying with {len(job.drift)} drifted input(s), recorded in the manifest",
            file=err,
        )
    err.flush()


def _print_end(job, code: int, submit: bool) -> None:
    from shlex import quote

    from turbo_dllm.errors import DllmError
    from turbo_dllm.train.stop import EXIT_TERMINATED

    plan = job.plan
    if plan.backend == "slurm":
        if not submit:
            print(
                f"wrote {plan.slurm.script}\nsubmit with: sbatch {quote(plan.slurm.script)} "
                "(`dllm run list` follows the job once it starts; with --submit, from its "
                "submission)"
            )
        else:
            from turbo_dllm.jobs.backends.slurm import read_submission

            try:
                record = read_submission(job.run_dir)
            except DllmError:  # the job, started, writes it too: say so without its id
                record = None
            job_id = record["job_id"] if record else "JOBID"
            print(
                f"dllm: follow it with `dllm run show {quote(str(job.run_dir))}` (state from "
                f"SLURM); cancel with scancel {job_id}",
                file=sys.stderr,
            )
        return
    resume = None
    if code == EXIT_TERMINATED:  # SIGTERM: the trainer saved the step under way and ended
        verdict = "stopped by SIGTERM (exit 143; the step under way was saved, it resumes there)"
        resume = _resume(job)
    elif code == 0 and _stopped_early(job, done := _last_step(job)):
        # training.max_duration_s, this attempt's time budget: the trainer saved its last step
        # and ended with 0 so that the next job resumes. It said "finished" at 21 of 30 steps.
        verdict = _time_budget_stop(job, done)
        resume = _resume(job)
    else:
        verdict = "finished" if code == 0 else f"failed (exit {code})"
    print(f"dllm: run {plan.run_id} {verdict}: {job.run_dir}", file=sys.stderr)
    if resume:
        from turbo_dllm.jobs.runs import resume_where

        where = resume_where(job.manifest)
        where = f" this, {where}" if where else ""
        print(f"dllm: continue it from there with{where}: {resume}", file=sys.stderr)
    print(f"dllm: plots: dllm run plot {quote(str(job.run_dir))}", file=sys.stderr)


def _last_step(job) -> int | None:
    """The last step the run's metrics record (None: none)."""
    from turbo_dllm.jobs.runs import last_step

    return last_step(job.run_dir)


def _stopped_early(job, done: int | None) -> bool:
    """Whether a run that ended with exit status 0 at step `done` (its metrics' last) stopped
    short of its last step (its time budget, training.max_duration_s: `runs.stop_cause`)."""
    from turbo_dllm.jobs.runs import stop_cause

    return stop_cause(0, done, job.spec.training.steps) is not None


def _time_budget_stop(job, done: int | None) -> str:
    budget = job.spec.training.max_duration_s
    budget = f"={budget:g} s" if budget is not None else ""
    return (
        f"stopped by its time budget (training.max_duration_s{budget} reached) after step "
        f"{done} of {job.spec.training.steps}, not finished (exit 0; the step was saved, it "
        "resumes there)"
    )


def _resume(job) -> str:
    """The command that continues the run from its last checkpoint (`runs.resume_command`; a
    multi-node job's, its launch, on every node)."""
    from turbo_dllm.jobs.runs import resume_command

    return resume_command(job.manifest, job.run_dir.absolute())
