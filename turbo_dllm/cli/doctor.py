"""`dllm doctor [--config F [--set K=V ...]] [--json]`: readiness report; exit 0 ready, 1 not ready, 2
error."""

from __future__ import annotations

import shlex
from pathlib import Path

from turbo_dllm.cli._output import (
    add_overrides,
    check_overrides_have_config,
    check_world_size,
    emit_json,
)

_STYLE = {
    "pass": "[green]pass[/]",
    "warn": "[yellow]warn[/]",
    "fail": "[red]FAIL[/]",
    "skip": "[dim]skip[/]",  # not checked; another check says why
}


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "doctor",
        help="check that this host is ready to train",
        description="Readiness report: exit 0 ready, 1 not ready, 2 error.",
    )
    p.add_argument("--config", help="also check this RunSpec")
    add_overrides(p)  # the run as `dllm launch --config F --set ...` will see it
    p.add_argument(
        "--world-size", type=int, default=None, help="check for a launch with this many processes"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_doctor)


def build_context(
    config: str | None, world_size: int | None = None, overrides: list[str] | None = None
):
    """Parse the config for the checks; a bad config is a failed check, not a crash (a path
    that holds no file to check is an error: exit 2)."""
    from turbo_dllm.config.load import load_runspec, read_yaml
    from turbo_dllm.data.spec import check_not_a_prepare_spec
    from turbo_dllm.doctor import DoctorContext
    from turbo_dllm.errors import DllmError

    context = DoctorContext(
        config_path=Path(config) if config else None,
        world_size=world_size,
        overrides=list(overrides or []),
    )
    if config:
        try:
            document = read_yaml(config)
        except DllmError:
            if not Path(config).is_file():
                # Not there, a folder, a device: a path that holds nothing to check is bad
                # input (exit 2, as `dllm config validate` and `dllm launch` say it), not a
                # report of this host with a failed config check (exit 1).
                raise
            document = None  # not UTF-8, not YAML: load_runspec reports it as it always does
        except Exception:
            document = None
        try:
            # A prepare.yaml (beside train.yaml in a starter project) is said as such, not as
            # five unknown RunSpec keys with wrong guesses.
            check_not_a_prepare_spec(
                document,
                config,
                hint="pass the RunSpec (train.yaml) to `dllm doctor --config`; a prepare config "
                f"is checked by running it: dllm data prepare --config {shlex.quote(config)}",
            )
            _not_a_run_manifest(document, Path(config))
        except DllmError as error:
            context.config_error, context.config_hint = error.message, error.hint
            context.config_hint_fixes = True
            return context
        try:
            # Without the process count: a RunSpec that fits another count is valid, and the
            # world size check (launch.py) judges the count with the flags that make the two
            # match (in the config check, its fix was a `dllm config validate` that passes).
            context.spec = load_runspec(config, overrides)
        except DllmError as error:
            context.config_error, context.config_hint = error.message, error.hint
    return context


def _not_a_run_manifest(document, config: Path) -> None:
    """A run's manifest.json given for its RunSpec: said as such, with the spec that run
    recorded beside it (it was read as a RunSpec: 'format: unknown key', 'run_id: ...')."""
    from turbo_dllm.errors import DllmError
    from turbo_dllm.jobs.manifest import FORMAT

    if not isinstance(document, dict) or document.get("format") != FORMAT:
        return
    spec = config.parent / "spec.yaml"  # what `dllm launch` wrote beside it
    replay = f"dllm launch --manifest {shlex.quote(str(config))} replays that run"
    # Its launch.run_dir is that run's dir, which a launch of it refuses: checked without it.
    raise DllmError(
        f"{config} is a run manifest, not a RunSpec",
        hint=f"check the spec that run recorded, in a new run dir: dllm doctor --config "
        f"{shlex.quote(str(spec))} --set launch.run_dir=null; {replay}"
        if spec.is_file()
        else f"pass the RunSpec (train.yaml); {replay}",
    )


def _doctor(args) -> int:
    from turbo_dllm.doctor import run_checks

    if args.config is not None and not args.config.strip():
        from turbo_dllm.errors import DllmError

        # `--config "$SPEC"` with SPEC unset: read as no --config, it reported the host "ready"
        raise DllmError(
            "--config is empty (an unset shell variable?)",
            hint="pass the RunSpec to check (--config train.yaml), or leave --config out to "
            "check this host alone",
        )
    check_world_size(args.world_size)  # was checked as if it made sense
    check_overrides_have_config(args)  # a run's --set without its RunSpec checked nothing
    if args.overrides:
        from turbo_dllm.config.load import apply_overrides

        # A --set that is no KEY=VALUE is a bad option (exit 2, as config validate and launch
        # say it), not a failed config check whose fix repeated it.
        apply_overrides({}, args.overrides)
    report = run_checks(build_context(args.config, args.world_size, args.overrides))
    if args.json:
        emit_json(report.to_json())
    else:
        from rich.console import Console
        from rich.markup import escape

        # soft_wrap: a line wider than the terminal wraps there, not at hard line breaks rich
        # would insert, so a fix's command copied from the report is one line.
        console = Console(highlight=False, soft_wrap=True)
        width = max((len(r.name) for r in report.results), default=0)
        for r in report.results:
            console.print(f"{_STYLE[r.status]}  {r.name:<{width}}  {escape(r.detail)}")
            if r.fix and r.status != "pass":
                console.print(f"      fix: {escape(r.fix)}")
        console.print("[bold green]ready[/]" if report.ready else "[bold red]not ready[/]")
    return 0 if report.ready else 1
