"""Recipes: RunSpec YAML files shipped inside the package.

A recipe's name is its path under `config/recipes/` without `.yaml` (`smoke/cpu-tiny`). Its first
comment lines carry `# hardware:` and `# summary:`.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from turbo_dllm.errors import DllmError

__all__ = ["Recipe", "copy_recipe", "find_recipe", "list_recipes"]


@dataclass(frozen=True)
class Recipe:
    name: str
    hardware: str
    summary: str
    text: str


def _root():
    return resources.files("turbo_dllm.config") / "recipes"


def _parse(name: str, text: str) -> Recipe:
    meta = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        key, sep, value = line.lstrip("# ").partition(":")
        if sep:
            meta[key.strip()] = value.strip()
    return Recipe(name, meta.get("hardware", "?"), meta.get("summary", ""), text)


def list_recipes() -> list[Recipe]:
    found = []

    def walk(node, prefix: str) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name.removesuffix(".yaml")):
            if child.is_dir():
                walk(child, f"{prefix}{child.name}/")
            elif child.name.endswith(".yaml"):
                found.append(_parse(prefix + child.name[: -len(".yaml")], child.read_text("utf-8")))

    walk(_root(), "")
    return found


def find_recipe(name: str) -> Recipe:
    if not name or name.startswith(("/", "\\")) or ".." in name.split("/") or "\\" in name:
        raise DllmError(
            f"invalid recipe name {name!r}",
            hint="names look like smoke/cpu-tiny; see `dllm recipe list`",
        )
    recipes = {r.name: r for r in list_recipes()}
    if name.endswith(".yaml"):
        name = name[: -len(".yaml")]
    if name not in recipes:
        import difflib

        close = difflib.get_close_matches(name, list(recipes), n=1)
        hint = f"did you mean {close[0]!r}?" if close else "see `dllm recipe list`"
        raise DllmError(f"no recipe named {name!r}", hint=hint)
    return recipes[name]


def copy_recipe(name: str, dest: str | Path) -> Path:
    """Write a recipe to `dest` (a file, or a folder to put `<basename>.yaml` in); never overwrites."""
    recipe = find_recipe(name)
    if dest == "":  # an unset shell variable: Path("") is the working folder
        raise DllmError(
            "the destination is empty ('')",
            hint="name a file or folder: dllm recipe copy NAME DEST",
        )
    # "DIR/" names a folder even before it exists (Path drops the slash: it became a file DIR).
    as_folder = str(dest).endswith(("/", os.sep))
    dest = Path(dest)
    if dest.is_dir() or as_folder:
        dest = dest / (recipe.name.rsplit("/", 1)[-1] + ".yaml")
    blocker = next((p for p in (dest.parent, *dest.parent.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():  # "mkdir -p" would fail on that file
        raise DllmError(
            f"{str(blocker)!r} is a file, not a folder",
            hint="copy into a folder, or to a new file in one",
        )
    if not dest.parent.is_dir():
        raise DllmError(  # quoted: the hint pastes into a shell
            f"folder {str(dest.parent)!r} does not exist",
            hint=f"mkdir -p {shlex.quote(str(dest.parent))}",
        )
    try:
        # O_EXCL: refuse to overwrite even if the file appears between a check and the write.
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise DllmError(
            f"{str(dest)!r} already exists; not overwriting",
            hint="choose another destination or remove the file first",
        ) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(recipe.text)
    except BaseException as error:
        # A full disk or Ctrl-C left a cut-off file that the next copy refused to overwrite.
        dest.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.filename is None:  # a write names no path
            raise OSError(error.errno, error.strerror or str(error), str(dest)) from None
        raise
    return dest
