"""The environment manifest: one target's exact Python package set (`turbo_dllm.env_manifest.v1`).

A manifest is a lock file. It pins every package of the target's environment to one version and
lists the sha256 of every wheel of that version that fits the target (so an installer can refuse
anything else), and it records the indexes the pins were resolved from *separately* from the pins:
a pin names a file and its hash, never a URL, so the same manifest installs from PyPI, from a
mirror folder or from a loopback mirror without a change. `provided` lists packages the base
interpreter must already have (a vendor container's torch, say): sync does not install them and
check compares their versions only.

Written with tomlkit, read with the standard library's parser where it exists, validated with
pydantic (`extra="forbid"`) on every read.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Literal

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from turbo_dllm.bundles.manifest import check_sha256
from turbo_dllm.errors import DllmError
from turbo_dllm.formats import validate_document

__all__ = [
    "FORMAT",
    "EnvManifest",
    "Index",
    "Pin",
    "Project",
    "Provided",
    "WheelFile",
    "dump_manifest",
    "load_manifest",
    "parse_manifest",
]

FORMAT = "turbo_dllm.env_manifest.v1"


def _package_name(value: str) -> str:
    name = canonicalize_name(value)
    if not name:
        raise ValueError(f"invalid package name: {value!r}")
    return name


def _version(value: str) -> str:
    try:
        Version(value)
    except InvalidVersion as error:
        raise ValueError(f"invalid version: {value!r}") from error
    return value


Sha256 = Annotated[str, AfterValidator(check_sha256)]
PackageName = Annotated[str, AfterValidator(_package_name)]
VersionText = Annotated[str, AfterValidator(_version)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WheelFile(_Strict):
    """One wheel of a pinned version; `filename` carries the tags, `sha256` the identity."""

    filename: str
    sha256: Sha256
    size: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _is_wheel(self) -> WheelFile:
        if not self.filename.endswith(".whl") or "/" in self.filename:
            raise ValueError(f"not a wheel file name: {self.filename!r}")
        return self


class Pin(_Strict):
    """A package at one exact version, with every wheel of it that fits the target."""

    name: PackageName
    version: VersionText
    wheels: list[WheelFile] = Field(min_length=1)

    @property
    def hashes(self) -> list[str]:
        return [w.sha256 for w in self.wheels]

    def requirement_line(self) -> str:
        """A pip/uv requirements.txt line that accepts only this manifest's wheels."""
        hashes = " ".join(f"--hash=sha256:{h}" for h in self.hashes)
        return f"{self.name}=={self.version} {hashes}"


class Provided(_Strict):
    """A package the base interpreter supplies (e.g. a container's torch); version-checked only,
    plus its installed files when `record_sha256` (the sha256 of its RECORD) is given."""

    name: PackageName
    version: VersionText
    record_sha256: Sha256 | None = None


class Index(_Strict):
    """A source the pins were resolved from.

    `simple`: a PEP 503 index; the first one is the default (`--index-url`), the others are extra
    indexes. `find-links`: a flat folder or page of wheels. Hashes pin every file, so a package
    may come from whichever source has the file (uv's `unsafe-best-match` is safe here).
    """

    url: str = Field(min_length=1)
    kind: Literal["simple", "find-links"] = "simple"


class Project(_Strict):
    """The project the environment is for; it is not pinned (its wheel is built per release)."""

    name: PackageName
    version: VersionText
    extras: list[str] = Field(default_factory=list)


class EnvManifest(_Strict):
    format: Literal["turbo_dllm.env_manifest.v1"] = FORMAT
    target: str = Field(min_length=1)
    bundle_target: str = Field(
        description="the concrete bundle target this environment needs, "
        "e.g. cp311-torch2.13-cpu-cxx11-linux_x86_64"
    )
    python: str = Field(pattern=r"^\d+\.\d+$", description="Python major.minor of the target")
    python_platform: str = Field(min_length=1, description="uv --python-platform used to lock")
    resolver: str = Field(description="the resolver that produced the pins, e.g. `uv 0.13.9`")
    project: Project
    requirements: list[str] = Field(description="the resolver's inputs")
    indexes: list[Index] = Field(default_factory=list)
    provided: list[Provided] = Field(default_factory=list)
    packages: list[Pin] = Field(default_factory=list)
    identity: str | None = Field(
        None,
        description="how packages are identified, when not by resolved wheel hashes "
        "(a manifest locked from an environment says so here)",
    )

    @field_validator("bundle_target")
    @classmethod
    def _bundle_target(cls, value: str) -> str:
        from turbo_dllm.bundles.target import BundleTarget

        return str(BundleTarget.parse(value))

    @model_validator(mode="after")
    def _unique(self) -> EnvManifest:
        names = [p.name for p in self.packages] + [p.name for p in self.provided]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"packages listed twice: {', '.join(duplicates)}")
        if self.project.name in names:
            raise ValueError(f"the project {self.project.name!r} must not be pinned as a package")
        urls = [i.url for i in self.indexes]
        if len(set(urls)) != len(urls):
            raise ValueError("index urls must be unique")
        return self

    def pin(self, name: str) -> Pin | None:
        wanted = canonicalize_name(name)
        return next((p for p in self.packages if p.name == wanted), None)

    def content_sha256(self) -> str:
        """Hash of the canonical content: what two hosts compare to know they share a lock."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def requirements_txt(self, names: set[str] | None = None, *, sources: bool = False) -> str:
        """requirements.txt text for the pins (all, or those in `names`), hashes included.

        `sources=True` starts it with the manifest's indexes as pip/uv options, so
        `pip download -r` fetches from where the pins were resolved.
        """
        lines = []
        if sources:
            simple = [i.url for i in self.indexes if i.kind == "simple"]
            lines += [f"--index-url {simple[0]}"] if simple else ["--no-index"]
            lines += [f"--extra-index-url {url}" for url in simple[1:]]
            lines += [f"--find-links {i.url}" for i in self.indexes if i.kind == "find-links"]
        pins = [p for p in self.packages if names is None or p.name in names]
        lines += [p.requirement_line() for p in pins]
        return "".join(line + "\n" for line in lines)


def parse_manifest(text: str, source: str) -> EnvManifest:
    from turbo_dllm.bundles.toml import TomlError, loads

    try:
        data = loads(text)
    except TomlError as error:
        raise DllmError(
            f"{source}: not valid TOML: {error}",
            hint="regenerate it with `dllm env lock --target TARGET` (a manifest is written by "
            "dllm, not by hand)",
        ) from error
    return validate_document(
        data,
        EnvManifest,
        expected=FORMAT,
        what="environment manifest",
        source=source,
        hint="regenerate it with `dllm env lock --target TARGET`",
    )


def load_manifest(path: str | Path) -> EnvManifest:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as error:
        raise DllmError(
            f"no environment manifest at {path}",
            hint="check the path; `dllm env list` lists the packaged manifests (--target NAME)",
        ) from error
    except (OSError, UnicodeDecodeError) as error:  # a folder, unreadable, not text
        reason = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
        raise DllmError(
            f"cannot read the environment manifest {path}: {reason}",
            hint="pass a manifests/<target>.toml written by `dllm env lock`",
        ) from None
    return parse_manifest(text, str(path))


def dump_manifest(manifest: EnvManifest) -> str:
    """TOML text: scalars first, then arrays of tables, one `[[packages]]` block per pin."""
    import tomlkit

    data = manifest.model_dump(mode="json", exclude_none=True)
    doc = tomlkit.document()
    doc.add(tomlkit.comment("Environment manifest: generated by `dllm env lock`; do not edit."))
    doc.add(tomlkit.comment("Pins name files and hashes; `indexes` say where they were resolved."))
    for key in ("format", "target", "bundle_target", "python", "python_platform", "resolver"):
        doc[key] = data[key]
    if data.get("identity"):
        doc["identity"] = data["identity"]
    requirements = tomlkit.array()
    requirements.multiline(True)
    requirements.extend(data["requirements"])
    doc["requirements"] = requirements
    doc["project"] = data["project"]
    for key in ("indexes", "provided"):
        if data[key]:
            doc[key] = tomlkit.aot()
            for row in data[key]:
                doc[key].append(tomlkit.item(row))
    packages = tomlkit.aot()
    for row in data["packages"]:
        table = tomlkit.table()
        table["name"] = row["name"]
        table["version"] = row["version"]
        wheels = tomlkit.array()
        wheels.multiline(True)
        for wheel in row["wheels"]:
            inline = tomlkit.inline_table()
            inline.update(wheel)
            wheels.append(inline)
        table["wheels"] = wheels
        packages.append(table)
    if data["packages"]:  # an empty array of tables would print as `packages = []`, first
        doc["packages"] = packages
    return tomlkit.dumps(doc)
