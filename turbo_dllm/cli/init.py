"""`dllm init DIR`: a starter project."""

from __future__ import annotations


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "init",
        help="create a starter project (never overwrites)",
        description="Create a starter project that trains offline on CPU.",
    )
    p.add_argument("directory")
    p.set_defaults(func=_init)


def _init(args) -> int:
    import shlex

    from turbo_dllm.project_init import init_project

    for path in init_project(args.directory):
        print(f"created {path}")
    # Quoted, so the lines paste into a shell whatever the folder's name (`cd my project`), and
    # `./` before a name that starts with '-': `cd -x` is an option to cd, `cd -` the last folder.
    folder = args.directory
    if folder.startswith("-"):
        folder = f"./{folder}"
    print(
        f"\nnext:\n  cd {shlex.quote(folder)}\n  dllm data prepare --config prepare.yaml\n"
        "  dllm doctor --config train.yaml"
    )
    return 0
