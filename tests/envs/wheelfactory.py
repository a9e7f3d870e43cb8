"""Small, real wheels made in tests: a METADATA, a WHEEL, a RECORD and one module, zipped.

pip and uv install them like any other wheel, so tests can build mirrors and sync environments
without a network or a build backend.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from pathlib import Path

__all__ = ["make_wheel"]


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def make_wheel(
    folder: Path,
    name: str,
    version: str,
    *,
    requires_python: str | None = ">=3.8",
    requires: tuple[str, ...] = (),
) -> Path:
    """Write `{name}-{version}-py3-none-any.whl` into `folder`; importing it gives `VERSION`."""
    module = re.sub(r"[-_.]+", "_", name).lower()  # the wheel spec's normalized file name
    dist_info = f"{module}-{version}.dist-info"
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    if requires_python:
        metadata.append(f"Requires-Python: {requires_python}")
    metadata += [f"Requires-Dist: {r}" for r in requires]
    files = {
        f"{module}/__init__.py": f"VERSION = {version!r}\n".encode(),
        f"{dist_info}/METADATA": ("\n".join(metadata) + "\n").encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in files.items())
    record += f"{dist_info}/RECORD,,\n"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path, data in files.items():
            # A fixed timestamp keeps the wheel (and its sha256) reproducible.
            info = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
            archive.writestr(info, data)
        archive.writestr(zipfile.ZipInfo(f"{dist_info}/RECORD", (2020, 1, 1, 0, 0, 0)), record)
    return target
