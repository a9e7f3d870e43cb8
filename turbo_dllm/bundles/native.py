"""Native op sources: the spec of each op (`native/<op>/op.toml`) and its source hash.

The source hash covers the spec and every file it lists. A bundle records it per op at build
time; the loader recomputes it from the sources this package ships, so kernels built from other
sources than the running turbo-dllm are refused instead of silently used.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from turbo_dllm.bundles.resources import native_root
from turbo_dllm.errors import DllmError
from turbo_dllm.host import GpuArch

__all__ = ["NativeOp", "OpSpec", "load_native_op", "native_op_names"]

_FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")


class OpSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["turbo_dllm.native_op.v1"]
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    summary: str
    headers: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    cuda_sources: tuple[str, ...] = ()
    # A Triton op: Python modules holding the kernels (the first is the one the op imports);
    # no C++ sources then. The bundle ships them as they are, under the source hash.
    triton_sources: tuple[str, ...] = ()
    cuda_archs: tuple[GpuArch, ...] = ()

    @model_validator(mode="after")
    def _one_language(self) -> OpSpec:
        if bool(self.triton_sources) == bool(self.sources):
            raise ValueError("an op has C++ `sources` or `triton_sources`, exactly one of them")
        return self

    @property
    def is_triton(self) -> bool:
        return bool(self.triton_sources)

    @field_validator("headers", "sources", "cuda_sources", "triton_sources")
    @classmethod
    def _plain_file_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if not _FILE_NAME.match(name):
                raise ValueError(f"{name!r} must be a file name inside the op's folder")
        return names


@dataclass(frozen=True)
class NativeOp:
    """An op's spec plus the folder holding its sources."""

    spec: OpSpec
    directory: Path

    @property
    def name(self) -> str:
        return self.spec.name

    def files(self) -> list[str]:
        """Every file the source hash covers, sorted."""
        spec = self.spec
        return sorted(
            {"op.toml", *spec.headers, *spec.sources, *spec.cuda_sources, *spec.triton_sources}
        )

    def source_sha256(self) -> str:
        digest = hashlib.sha256()
        for name in self.files():
            data = (self.directory / name).read_bytes()
            digest.update(f"{name}\0{len(data)}\0".encode())
            digest.update(data)
        return digest.hexdigest()

    def cpu_source_paths(self) -> list[Path]:
        return [self.directory / name for name in self.spec.sources]

    def cuda_source_paths(self) -> list[Path]:
        return [self.directory / name for name in self.spec.cuda_sources]

    def triton_source_paths(self) -> list[Path]:
        return [self.directory / name for name in self.spec.triton_sources]


def native_op_names(root: Path | None = None) -> list[str]:
    root = root or native_root()
    return sorted(p.parent.name for p in root.glob("*/op.toml"))


def load_native_op(name: str, root: Path | None = None) -> NativeOp:
    from turbo_dllm.bundles.toml import loads

    root = root or native_root()
    path = root / name / "op.toml"
    if not path.is_file():
        known = ", ".join(native_op_names(root)) or "none"
        raise DllmError(
            f"unknown native op {name!r} (known: {known})",
            hint="name one of the known ops (--op NAME), or leave --op out to build them all",
        )
    try:
        document = loads(path.read_text(encoding="utf-8"))
        spec = OpSpec.model_validate(document)
    except Exception as error:  # a broken spec in our own sources is a packaging bug
        raise RuntimeError(f"invalid op spec {path}: {error}") from error
    if spec.name != name:
        raise RuntimeError(f"{path} names op {spec.name!r}, not its folder {name!r}")
    op = NativeOp(spec, path.parent)
    missing = [f for f in op.files() if not (op.directory / f).is_file()]
    if missing:
        raise RuntimeError(f"op {name!r} lists missing files: {', '.join(missing)}")
    return op
