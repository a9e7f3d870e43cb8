"""`dllm init`: write a starter project that validates and trains offline on CPU."""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

from turbo_dllm.errors import DllmError, describe_os_error

__all__ = ["STARTER_FILES", "init_project"]

# Template file -> path in the project ("gitignore" ships without its dot so packaging keeps it).
STARTER_FILES = {
    "prepare.yaml": "prepare.yaml",
    "train.yaml": "train.yaml",
    "README.md": "README.md",
    "gitignore": ".gitignore",
    "data/train.jsonl": "data/train.jsonl",
}


def init_project(directory: str | Path) -> list[Path]:
    """Create the starter project in `directory`; never overwrite, roll back on any failure."""
    if directory == "":  # an unset shell variable: Path("") is the working folder
        raise DllmError(
            "the project folder is empty ('')", hint="name the folder to create: dllm init DIR"
        )
    root = Path(directory)
    if root.exists() and not root.is_dir():
        raise DllmError(
            f"{str(root)!r} exists and is not a folder",
            hint="name a new folder (or an existing one) for the project: dllm init DIR",
        )
    clashes = [name for name in STARTER_FILES.values() if (root / name).exists()]
    if clashes:
        raise DllmError(
            f"{str(root)!r} already has {', '.join(clashes)}; not overwriting",
            hint="choose an empty or new folder",
        )
    created: list[Path] = []  # files and folders we made, in creation order
    template = resources.files("turbo_dllm") / "init_template"
    try:
        for source, target in STARTER_FILES.items():
            path = root / target
            for parent in reversed([p for p in path.parents if not p.exists()]):
                parent.mkdir()
                created.append(parent)
            with open(path, "xb") as handle:
                created.append(path)
                handle.write((template / source).read_bytes())
        from turbo_dllm.config.load import load_runspec

        load_runspec(root / "train.yaml")
    except BaseException as error:
        for path in reversed(created):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        if isinstance(error, OSError):  # e.g. a parent of DIR is a file, or not writable
            # describe_os_error names the file in the way of a folder, where str(error) named
            # only the path through it ("Not a directory: 'file/p'")
            message, hint = describe_os_error(error)
            raise DllmError(
                f"cannot create the project in {str(root)!r}: {message}",
                hint=hint,
            ) from None
        raise
    return [p for p in created if p.is_file()]
