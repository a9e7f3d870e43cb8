"""`dllm recipe list | show NAME | copy NAME DEST`."""

from __future__ import annotations

from turbo_dllm.cli._output import emit_json, group


def register(subparsers) -> None:
    commands = group(subparsers, "recipe", "packaged RunSpec recipes")
    p = commands.add_parser("list", help="list recipes with their hardware and summary")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_list)
    p = commands.add_parser("show", help="print a recipe")
    p.add_argument("name")
    p.set_defaults(func=_show)
    p = commands.add_parser("copy", help="copy a recipe to a file or folder (never overwrites)")
    p.add_argument("name")
    p.add_argument("dest")
    p.set_defaults(func=_copy)


def _list(args) -> int:
    from turbo_dllm.config.recipe_catalog import list_recipes

    recipes = list_recipes()
    if args.json:
        emit_json(
            {
                "recipes": [
                    {"name": r.name, "hardware": r.hardware, "summary": r.summary} for r in recipes
                ]
            }
        )
        return 0
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(box=None)
    # The name is what `recipe show` / `copy` take: never cut, whatever the terminal's width
    # (the other columns wrap around it).
    table.add_column("name", no_wrap=True, min_width=max((len(r.name) for r in recipes), default=4))
    # Folded, not cut: a word longer than its column (flash-linear-attention) lost its end to
    # an ellipsis in a narrow terminal or a pipe (80 columns).
    table.add_column("hardware", overflow="fold")
    table.add_column("summary", overflow="fold")
    for r in recipes:
        # Escaped: rich reads `[...]` as markup and dropped `[gdn]` from the hardware line's
        # `pip install 'turbo-dllm[gdn]'`.
        table.add_row(escape(r.name), escape(r.hardware), escape(r.summary))
    Console().print(table)
    return 0


def _show(args) -> int:
    from turbo_dllm.config.recipe_catalog import find_recipe

    print(find_recipe(args.name).text, end="")
    return 0


def _copy(args) -> int:
    from turbo_dllm.cli._output import shell_path
    from turbo_dllm.config.recipe_catalog import copy_recipe

    dest = copy_recipe(args.name, args.dest)
    print(f"wrote {dest}")
    missing = _missing_inputs(dest)
    for key, path, what in missing:
        print(f"needs: {key}: {path} is not there yet ({what})")
    print(f"next: dllm config validate --config {shell_path(dest)}")
    if missing:
        # validate checks the spec alone and says "valid" without these; doctor looks for them
        print(
            f"then: dllm doctor --config {shell_path(dest)}   # checks those folders once they exist"
        )
    return 0


# The local inputs a recipe reads, relative to its file: `config validate` says "valid" without
# them (it checks the spec alone), so a copy named none and `launch` was the first to refuse.
_INPUTS = (
    (("model", "path"), "a local Hugging Face folder: config.json and safetensors"),
    (("model", "dflash", "target"), "the target's local Hugging Face folder"),
    (("model", "dflash", "features"), "a feature artifact: dllm dflash prepare-features"),
    (
        ("data", "artifact"),
        "a prepared data artifact: dllm data prepare --config PREPARE.yaml, its output.path "
        "this folder; `dllm init DIR` writes a prepare.yaml to start from, docs/data.md",
    ),
)


def _missing_inputs(config) -> list[tuple[str, str, str]]:
    from pathlib import Path

    from turbo_dllm.config.bounded_yaml import parse_yaml
    from turbo_dllm.config.load import absolute_path

    document = parse_yaml(Path(config).read_text("utf-8"), str(config))
    missing = []
    for keys, what in _INPUTS:
        value = document
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if not isinstance(value, str) or not value:
            continue
        # as validation resolves it: `~` expanded, a relative path the recipe file's
        path = Path(absolute_path(value, Path(config).parent))
        if not path.exists():
            missing.append((".".join(keys), str(path), what))
    return missing
