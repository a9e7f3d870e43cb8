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
    print(f"next: dllm config validate --config {shell_path(dest)}")
    return 0
