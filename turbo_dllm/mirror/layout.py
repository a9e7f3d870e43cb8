"""The mirror's on-disk layout and its inventory file, `MIRROR.json` (`turbo_dllm.mirror.v1`).

```
DIR/MIRROR.json                  every file below with sha256 + size (written last)
DIR/simple/index.html            PEP 503 root: one link per project
DIR/simple/<project>/index.html  one link per wheel: ../../wheels/<file>#sha256=<hex>
DIR/wheels/<file>.whl            flat, so DIR/wheels also works as `--find-links`
DIR/manifests/<target>.toml      the environment manifests the mirror serves
DIR/releases/<vX>/catalog.toml   bundle catalogs (the bundles' publish layout)
DIR/bundles/...                  bundle archives (the bundles' publish layout)
DIR/packs/<pack>.tar.zst         compile-cache packs (`dllm cache`; offered to `dllm launch`)
```

The same folder works as a path (`--mirror DIR`, `file://`) and over HTTP (`dllm mirror serve`):
every link is relative.
"""

from __future__ import annotations

import html
import re
import shlex
import zipfile
from email.parser import HeaderParser
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from packaging.utils import canonicalize_name, parse_wheel_filename
from pydantic import BaseModel, ConfigDict, Field, field_validator

from turbo_dllm.errors import DllmError
from turbo_dllm.locations import parse_location

__all__ = [
    "MIRROR_FILE",
    "MIRROR_FORMAT",
    "FileKind",
    "MirrorFile",
    "MirrorIndex",
    "MirrorProject",
    "mirror_folder",
    "not_a_mirror",
    "simple_pages",
    "wheel_project",
]

MIRROR_FILE = "MIRROR.json"
MIRROR_FORMAT = "turbo_dllm.mirror.v1"

FileKind = Literal["wheel", "index", "manifest", "catalog", "bundle", "pack", "other"]

_SHA256 = r"^[0-9a-f]{64}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _inside_the_mirror(path: str) -> str:
    """A plain relative POSIX path: readers join it to the mirror's root, so `../x` or `/x`
    sent `dllm mirror verify` (the check of a mirror one was handed) to hash files outside it,
    and `../../dev/zero` kept it reading for ever."""
    parts = path.split("/")
    if (
        path.startswith("/")
        or "\\" in path
        or "\0" in path
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise ValueError(f"{path!r} is not a plain relative path inside the mirror")
    return path


class MirrorFile(_Strict):
    path: str = Field(description="POSIX path relative to the mirror root")
    sha256: str = Field(pattern=_SHA256)
    size: int = Field(ge=0)
    kind: FileKind

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        return _inside_the_mirror(value)


class MirrorProject(_Strict):
    """The project's own wheel: not pinned by manifests (built per release), listed here."""

    name: str
    version: str
    wheel: str
    sha256: str = Field(pattern=_SHA256)

    @field_validator("wheel")
    @classmethod
    def _check_wheel(cls, value: str) -> str:
        return _inside_the_mirror(value)


class MirrorIndex(_Strict):
    format: Literal["turbo_dllm.mirror.v1"] = MIRROR_FORMAT
    created_by: str
    release: str | None = None
    targets: list[str] = Field(default_factory=list)
    project: MirrorProject | None = None
    files: list[MirrorFile] = Field(default_factory=list)

    def file(self, path: str) -> MirrorFile | None:
        return next((f for f in self.files if f.path == path), None)

    def of_kind(self, kind: FileKind) -> list[MirrorFile]:
        return [f for f in self.files if f.kind == kind]

    @property
    def has_wheels(self) -> bool:
        """Whether the mirror carries wheels (the project's, or pinned ones): a pip/uv index."""
        return self.project is not None or bool(self.of_kind("wheel"))


def not_a_mirror(location: str | Path) -> DllmError:
    """The error for a place that exists but holds no `MIRROR.json` (every reader says it so).
    A folder `dllm bundle publish` wrote (releases/<release>/catalog.toml, bundles/) is a bundle
    index, not a full mirror: said so, with the ways it is used."""
    folder = Path(location) if not str(location).startswith(("http:", "https:", "file:")) else None
    if folder is not None and any(folder.glob("releases/*/catalog.toml")):
        return DllmError(
            f"{location} is a bundle index (what `dllm bundle publish` writes), not a mirror "
            f"(no {MIRROR_FILE}: no wheels or environment manifests)",
            hint=f"install from it with `dllm bundle install --mirror {shlex.quote(str(location))}"
            f" --auto`, or serve it with any static file server: python3 -m http.server "
            f"--directory {shlex.quote(str(location))} 8000; a full mirror comes from "
            "`dllm mirror create DIR --release vX`",
        )
    return DllmError(
        f"{location} is not a mirror (no {MIRROR_FILE})",
        hint="create one with `dllm mirror create DIR --release vX`",
    )


def mirror_folder(location: str | Path) -> Path:
    """The resolved folder of a local mirror, for what takes a folder only (`dllm mirror serve
    DIR`). Parsed as every `--mirror` reader parses it (`parse_location`): a path that does not
    exist, a file and a URL are each named as such, not called a folder without MIRROR.json."""
    text = str(location)
    where = parse_location(text, "mirror")
    if where.folder is None:
        raise DllmError(
            f"mirror {text!r} is a URL: this takes a mirror folder",
            hint="pass the mirror's folder (the URL is for --mirror and pip/uv --index-url)",
        )
    if not (where.folder / MIRROR_FILE).is_file():
        raise not_a_mirror(where.folder)
    return where.folder


def wheel_project(filename: str) -> tuple[str, str]:
    """(normalized project name, version) from a wheel file name."""
    name, version, _, _ = parse_wheel_filename(filename)
    return canonicalize_name(name), str(version)


def _requires_python(wheel: Path) -> str | None:
    """Requires-Python from the wheel's METADATA, for `data-requires-python` (PEP 503)."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            name = next(
                (n for n in archive.namelist() if re.match(r"^[^/]+\.dist-info/METADATA$", n)),
                None,
            )
            if name is None:
                return None
            headers = HeaderParser().parsestr(archive.read(name).decode("utf-8", "replace"))
    except (zipfile.BadZipFile, OSError):
        return None
    return headers.get("Requires-Python")


def _page(title: str, links: list[str]) -> str:
    body = "\n".join(links)
    return (
        "<!DOCTYPE html>\n<html>\n<head>\n"
        '<meta name="pypi:repository-version" content="1.0">\n'
        f"<title>{html.escape(title)}</title>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def simple_pages(wheels: dict[str, tuple[Path, str]]) -> dict[str, str]:
    """PEP 503 pages for `wheels` ({file name: (local path, sha256)}): {relative path: html}."""
    projects: dict[str, list[tuple[str, str, str | None]]] = {}
    for filename, (path, sha256) in sorted(wheels.items()):
        name, _ = wheel_project(filename)
        projects.setdefault(name, []).append((filename, sha256, _requires_python(path)))
    pages: dict[str, str] = {}
    root_links = [f'<a href="{quote(name)}/">{html.escape(name)}</a>' for name in sorted(projects)]
    pages["simple/index.html"] = _page("Simple index", root_links)
    for name, files in projects.items():
        links = []
        for filename, sha256, requires_python in files:
            attribute = (
                f' data-requires-python="{html.escape(requires_python, quote=True)}"'
                if requires_python
                else ""
            )
            href = f"../../wheels/{quote(filename)}#sha256={sha256}"
            links.append(f'<a href="{href}"{attribute}>{html.escape(filename)}</a>')
        pages[f"simple/{name}/index.html"] = _page(f"Links for {name}", links)
    return pages
