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
    from pathlib import Path

    from turbo_dllm.cli._output import shell_path
    from turbo_dllm.project_init import init_project

    for path in init_project(args.directory):
        print(f"created {path}")
    # Pasted into a shell whatever the folder's name (`cd my project`, `cd -x`: shell_path);
    # no `cd .` for a project made in the current folder.
    here = Path(args.directory).resolve() == Path.cwd().resolve()
    cd = "" if here else f"\n  cd {shell_path(args.directory)}"
    print(
        f"\nnext:{cd}\n  dllm data prepare --config prepare.yaml\n"
        "  dllm doctor --config train.yaml\n  dllm launch --config train.yaml"
    )
    return 0
