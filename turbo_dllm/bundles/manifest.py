"""`bundle.json`: what a native-kernel bundle holds and how it was built.

The first member of every bundle archive. It names the bundle's target, lists every other file
with its sha256 and size (extraction checks each file against it), records per op the library,
torch.ops namespace and source hash (the loader checks it), and the build provenance.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Literal, TypeVar

from turbo_dllm.bundles.target import BundleTarget
from turbo_dllm.errors import DllmError, os_error_hint
from turbo_dllm.host import GpuArch, HostFingerprint
from turbo_dllm.records import Record, RecordError, checked

__all__ = [
    "ARCHIVE_PREFIX",
    "ARCHIVE_SUFFIX",
    "BUNDLE_FORMAT",
    "MANIFEST_NAME",
    "BuildProvenance",
    "BundleFile",
    "BundleManifest",
    "BundleOp",
    "archive_name",
    "canonical_version",
    "check_relative_path",
    "check_sha256",
    "find_by_name_or_sha",
    "parse_manifest",
    "read_manifest",
]

BUNDLE_FORMAT = "turbo_dllm.bundle.v1"
MANIFEST_NAME = "bundle.json"
ARCHIVE_PREFIX = "turbo-dllm-kernels-"
ARCHIVE_SUFFIX = ".tar.zst"
SHA256 = r"^[0-9a-f]{64}$"
_SHA256 = re.compile(SHA256)
_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
# A version already in its PEP 440 canonical spelling (1.2.0, 1.2.0rc1, 1.2.0.post3, 1.2.0.dev0:
# no epoch, no local part, numbers without leading zeros, lowercase a/b/rc, .post, .dev) is
# checked without importing packaging (~2-8 ms of a ~0.1 s install); any other spelling goes
# through packaging, which canonicalizes or refuses it.
_NUMBER = r"(?:0|[1-9][0-9]*)"
_CANONICAL = re.compile(
    rf"{_NUMBER}(?:\.{_NUMBER})*(?:(?:a|b|rc){_NUMBER})?(?:\.post{_NUMBER})?(?:\.dev{_NUMBER})?"
)


def check_sha256(value: str) -> str:
    if not _SHA256.match(value):
        raise ValueError(f"{value!r} is not a sha256 hex digest (64 lowercase hex digits)")
    return value


_Hashed = TypeVar("_Hashed")
MIN_SHA_PREFIX = 6  # shorter prefixes of a 64-digit sha256 are too easily ambiguous


def find_by_name_or_sha(
    items: Sequence[_Hashed], ident: str, name: Callable[[_Hashed], str]
) -> tuple[list[_Hashed], str | None]:
    """The installed things (bundles, packs) `ident` names: by `name`, else by a sha256 prefix of
    MIN_SHA_PREFIX+ characters. The second value is a hint for when none matched although the
    listing visibly starts with `ident`: a prefix too short to count."""
    matches = [item for item in items if name(item) == ident]
    prefix = ident.lower()
    if not matches and len(ident) >= MIN_SHA_PREFIX:
        matches = [item for item in items if item.sha256.startswith(prefix)]
    short = not matches and 0 < len(ident) < MIN_SHA_PREFIX
    if short and any(item.sha256.startswith(prefix) for item in items):
        return matches, f"a sha256 prefix needs at least {MIN_SHA_PREFIX} characters"
    return matches, None


def _check_name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(f"{value!r} is not a lowercase identifier (a-z, 0-9, _)")
    return value


def check_relative_path(path: str) -> str:
    """A plain relative path inside a bundle: `lib/x.so`; no `..`, no absolute, no oddities."""
    parts = path.split("/")
    if not path or path.startswith("/") or any(not _PART.match(p) for p in parts):
        raise ValueError(f"{path!r} is not a plain relative path (a/b.c, no '..', no '/' first)")
    return path


def canonical_version(text: str) -> str:
    if _CANONICAL.fullmatch(text):
        return text
    from packaging.version import InvalidVersion, Version

    try:
        return str(Version(text))
    except InvalidVersion:
        raise ValueError(f"invalid version: {text!r}") from None


def archive_name(version: str, target: BundleTarget) -> str:
    return f"{ARCHIVE_PREFIX}{canonical_version(version)}-{target}{ARCHIVE_SUFFIX}"


class BundleFile(Record):
    path: str = checked(check_relative_path)
    sha256: str = checked(check_sha256)
    size: int

    def _problems(self) -> Iterator[tuple[str, str]]:
        if self.size < 0:
            yield "size", f"must be >= 0, got {self.size}"


class BundleOp(Record):
    """A native op: `namespace` is its torch.ops namespace, `library` the shared library's path
    inside the bundle."""

    name: str = checked(_check_name)
    namespace: str = checked(_check_name)
    library: str
    source_sha256: str = checked(check_sha256)
    devices: tuple[Literal["cpu", "cuda"], ...]
    archs: tuple[GpuArch, ...] = ()


class BuildProvenance(Record):
    turbo_dllm: str
    cxx: str
    nvcc: str | None = None
    cflags: tuple[str, ...]
    cuda_cflags: tuple[str, ...] = ()
    torch: str
    cuda: str | None = None
    host: HostFingerprint


class BundleManifest(Record):
    format: Literal["turbo_dllm.bundle.v1"] = BUNDLE_FORMAT
    name: str
    version: str = checked(canonical_version)
    target: BundleTarget
    files: tuple[BundleFile, ...]
    ops: tuple[BundleOp, ...]
    build: BuildProvenance

    def _problems(self) -> Iterator[tuple[str, str]]:
        expected = archive_name(self.version, self.target).removesuffix(ARCHIVE_SUFFIX)
        if self.name != expected:
            yield "name", f"name {self.name!r} should be {expected!r}"
        paths = [f.path for f in self.files]
        duplicates = sorted({p for p in paths if paths.count(p) > 1})
        if duplicates:
            yield "files", f"files listed twice: {', '.join(duplicates)}"
        if MANIFEST_NAME in paths:
            yield "files", f"{MANIFEST_NAME} must not list itself"
        names = [op.name for op in self.ops]
        if len(set(names)) != len(names):
            yield "ops", "an op is listed twice"
        for op in self.ops:
            if op.library not in paths:
                yield "ops", f"op {op.name!r}: library {op.library!r} is not in files"
            if "cuda" in op.devices and self.target.cuda is None:
                yield "ops", f"op {op.name!r} has CUDA kernels in a CPU bundle"

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def op(self, name: str) -> BundleOp | None:
        return next((op for op in self.ops if op.name == name), None)

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


def parse_manifest(data: bytes, source: str) -> BundleManifest:
    try:
        return BundleManifest.model_validate_json(data)
    except RecordError as error:
        raise DllmError(
            f"{source}: invalid {MANIFEST_NAME}: {error}",
            hint="the bundle is damaged or not a turbo-dllm bundle; rebuild or re-download it",
        ) from None


def read_manifest(path: Path) -> BundleManifest:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise DllmError(
            f"cannot read {path}: {error.strerror}",
            hint=os_error_hint(error.errno or 0) or "check that file and its permissions",
        ) from None
    return parse_manifest(data, str(path))
