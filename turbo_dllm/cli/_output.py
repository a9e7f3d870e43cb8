"""Helpers shared by the command modules: JSON on stdout, humans on stdout, logs on stderr,
and the options several commands take."""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = [
    "add_overrides",
    "check_world_size",
    "emit_json",
    "emit_json_error",
    "emit_schema",
    "group",
    "stderr_console",
]


_emitted = False


def emit_json(obj: Any) -> None:
    """Print exactly one JSON object on stdout (the `--json` contract)."""
    global _emitted
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    _emitted = True


def emit_json_error(message: str, hint: str | None) -> None:
    """A failed `--json` command's one object: `{"error": MESSAGE, "hint": HINT}`, what stderr
    says as `dllm: error:` and `hint:`. Nothing where the command already printed its object."""
    global _emitted
    if not _emitted:
        emit_json({"error": message, "hint": hint})
    _emitted = False


def reset_json() -> None:
    """A new `dllm` command (in-process callers run several) has printed no object yet."""
    global _emitted
    _emitted = False


JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def emit_schema(model: Any) -> None:
    """Print a pydantic model's JSON Schema (`dllm config schema`, `dllm data schema`) with the
    dialect pydantic writes it in ($defs, prefixItems) declared: without "$schema" an editor or
    validator that assumes draft-07 ignored prefixItems and took `optimizer.betas: [a, b]`."""
    emit_json({"$schema": JSON_SCHEMA_DIALECT, **model.model_json_schema()})


def stderr_console():
    from rich.console import Console

    return Console(stderr=True)


def group(subparsers, name: str, help: str, *, quick_exit: bool = False):
    """Add a command group (`dllm NAME SUB ...`) and return its sub-subparsers. `quick_exit`:
    its commands are short and close what they open, so the `dllm` process may spare the
    interpreter's last garbage collection at exit (see `turbo_dllm.cli.main`)."""
    parser = subparsers.add_parser(name, help=help, description=help)
    parser.set_defaults(func=None, group_parser=parser, quick_exit=quick_exit)
    return parser.add_subparsers(dest=f"{name}_command", metavar="SUBCOMMAND")


def shell_path(path) -> str:
    """`path` as a printed command's argument: quoted, and `./` before a name that starts with
    '-' (`cd -x` reads an option, `--config -x.yaml` a missing value, `cd -` the last folder)."""
    import shlex

    text = str(path)
    return shlex.quote(f"./{text}" if text.startswith("-") else text)


def add_overrides(parser, example: str = "training.steps=10") -> None:
    """The `--set KEY=VALUE` option (repeatable) of every command that reads a YAML config."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a field, e.g. --set {example} (repeatable)",
    )


def check_overrides_have_config(args) -> None:
    """--set changes the --config spec: without one it was dropped without a word."""
    if args.overrides and not args.config:
        from turbo_dllm.errors import DllmError

        raise DllmError(
            f"--set {args.overrides[0]} changes the spec of --config, and none was given",
            hint="pass the RunSpec as well: --config F --set KEY=VALUE",
        )


def check_world_size(world_size: int | None) -> None:
    """`--world-size N` (`dllm config validate`, `dllm doctor`): a process count, so 1 or more.
    Checked before the config is read: 0 or -3 was checked as a launch of that many processes
    ("... but the launch has 0 processes"), or not at all where the spec had other problems."""
    if world_size is not None and world_size < 1:
        from turbo_dllm.errors import DllmError

        raise DllmError(
            f"--world-size must be 1 or more, got {world_size}",
            hint="pass the number of processes the launch will start (or leave it out)",
        )
