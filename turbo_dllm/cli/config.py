"""`dllm config validate | schema`."""

from __future__ import annotations

from turbo_dllm.cli._output import add_overrides, check_world_size, emit_json, emit_schema, group


def register(subparsers) -> None:
    commands = group(subparsers, "config", "validate RunSpecs and print their schema")
    p = commands.add_parser("validate", help="validate a RunSpec and print it fully resolved")
    p.add_argument("--config", required=True, help="RunSpec YAML")
    add_overrides(p)
    p.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="also check the topology against this many processes",
    )
    p.add_argument("--json", action="store_true", help="print the resolved spec as JSON")
    p.set_defaults(func=_validate)
    p = commands.add_parser("schema", help="print the RunSpec JSON Schema (for editors)")
    p.set_defaults(func=_schema)


def _validate(args) -> int:
    import sys

    import yaml

    from turbo_dllm.data.spec import load_training_spec

    check_world_size(args.world_size)
    spec = load_training_spec(args.config, args.overrides, world_size=args.world_size)
    resolved = spec.model_dump(mode="json")
    if args.json:
        emit_json(resolved)
    else:
        print(f"# {args.config}: valid", file=sys.stderr)
        print(yaml.safe_dump(resolved, sort_keys=False, allow_unicode=True, width=1 << 20), end="")
    return 0


def _schema(args) -> int:
    from turbo_dllm.config.runspec import RunSpec

    emit_schema(RunSpec)
    return 0
