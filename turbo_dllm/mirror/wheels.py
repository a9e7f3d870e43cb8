"""Collecting the wheels a mirror carries: from a local folder, or from the manifests' indexes.

Every wheel is accepted by its sha256 only (the manifest's), wherever it came from: a folder from
`pip download --require-hashes`, PyPI, PyTorch's index or a find-links page. Downloads go to a
temporary name and are renamed once their hash matches.
"""

from __future__ import annotations

import errno
import hashlib
import shutil
import sys
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

from packaging.utils import canonicalize_name

from turbo_dllm.envs.manifest import EnvManifest, Index, Pin, WheelFile
from turbo_dllm.errors import DllmError, os_error_hint
from turbo_dllm.fsutil import mounted_at, sha256_file
from turbo_dllm.mirror.layout import wheel_project

__all__ = ["LocalWheels", "WheelSource", "download_wheel", "scan_wheels"]

_TIMEOUT_S = 120


@dataclass(frozen=True)
class LocalWheels:
    """Wheels found in a folder, by sha256."""

    by_sha256: dict[str, Path]

    def find(self, wheel: WheelFile) -> Path | None:
        return self.by_sha256.get(wheel.sha256)

    def project_wheels(self, name: str, version: str) -> list[Path]:
        wanted = (canonicalize_name(name), version)
        return sorted(p for p in self.by_sha256.values() if wheel_project(p.name) == wanted)


def scan_wheels(folder: Path | None) -> LocalWheels:
    if folder is None:
        return LocalWheels({})
    folder = Path(folder)
    if not folder.is_dir():
        raise DllmError(
            f"--wheels-from {folder} is not a folder",
            hint="pass the folder holding the .whl files (e.g. filled by `pip download`)",
        )
    return LocalWheels({sha256_file(p): p for p in sorted(folder.glob("*.whl"))})


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.hrefs.append(href)


@dataclass(frozen=True)
class WheelSource:
    """Where to look for a pin's files: the manifest's indexes, in order."""

    indexes: tuple[Index, ...]

    @classmethod
    def of(cls, manifest: EnvManifest) -> WheelSource:
        return cls(tuple(manifest.indexes))

    def candidate_urls(self, pin: Pin, wheel: WheelFile) -> list[str]:
        """URLs that claim to be `wheel`, from every index that lists it."""
        import requests

        urls: list[str] = []
        for index in self.indexes:
            if index.kind == "find-links" and index.url.startswith("file://"):
                local = Path(unquote(urlparse(index.url).path)) / wheel.filename
                if local.is_file():
                    urls.append(local.as_uri())
                continue
            page = (
                index.url if index.kind == "find-links" else f"{index.url.rstrip('/')}/{pin.name}/"
            )
            try:
                response = requests.get(page, timeout=_TIMEOUT_S)
            except requests.RequestException as error:
                print(f"skipping {page}: {error}", file=sys.stderr)
                continue
            if response.status_code != 200:
                continue
            parser = _Links()
            parser.feed(response.text)
            for href in parser.hrefs:
                absolute = urljoin(response.url, href)
                if unquote(Path(urlparse(absolute).path).name) == wheel.filename:
                    urls.append(absolute.split("#", 1)[0])
        return urls


class _TooLarge(Exception):
    pass


# Writing the download failed for this machine's reason (not the index's): every URL would.
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}
_FORBIDDEN = {errno.EACCES, errno.EPERM}


def _cannot_write(error: BaseException, partial: Path) -> bool:
    import requests

    if not isinstance(error, OSError) or isinstance(error, requests.RequestException):
        return False
    return error.errno in _DISK_FULL or (
        error.errno in _FORBIDDEN and error.filename in (str(partial), partial)
    )


def _write_error(error: OSError, partial: Path) -> DllmError:
    fix = os_error_hint(error.errno or 0) or "check that folder"
    return DllmError(
        f"cannot write {partial}: {error.strerror}; the mirror was not made",
        hint=f"{fix} ({partial.parent}'s file system is mounted at {mounted_at(partial.parent)}; "
        "the wheels downloaded whole so far are kept: the same command resumes from them)",
    )


def download_wheel(urls: list[str], wheel: WheelFile, dest: Path) -> Path:
    """Fetch the first URL whose bytes hash to `wheel.sha256` into `dest/filename`."""
    import requests

    target = dest / wheel.filename
    partial = dest / f".{wheel.filename}.part"
    problems: list[str] = []
    for url in urls:
        digest = hashlib.sha256()
        try:
            if url.startswith("file://"):
                shutil.copyfile(unquote(urlparse(url).path), partial)
                digest.update(partial.read_bytes())
            else:
                with requests.get(url, stream=True, timeout=_TIMEOUT_S) as response:
                    response.raise_for_status()
                    with open(partial, "wb") as handle:
                        received = 0
                        for block in response.iter_content(1 << 20):
                            received += len(block)
                            if wheel.size is not None and received > wheel.size:
                                # An index that keeps sending is not filling the disk.
                                raise _TooLarge(f"sent more than the manifest's {wheel.size} bytes")
                            handle.write(block)
                            digest.update(block)
        except (OSError, requests.RequestException, _TooLarge) as error:
            if _cannot_write(error, partial):  # the next URL would meet the same disk
                partial.unlink(missing_ok=True)
                raise _write_error(error, partial) from None
            problems.append(f"{url}: {error}")
            partial.unlink(missing_ok=True)
            continue
        if digest.hexdigest() != wheel.sha256:
            problems.append(f"{url}: sha256 {digest.hexdigest()} is not the manifest's")
            partial.unlink(missing_ok=True)
            continue
        partial.replace(target)
        return target
    partial.unlink(missing_ok=True)
    detail = "; ".join(problems) or "no index lists it"
    raise DllmError(
        f"cannot download {wheel.filename}: {detail}",
        hint="download it yourself (pip download --require-hashes) and pass --wheels-from DIR",
    )
