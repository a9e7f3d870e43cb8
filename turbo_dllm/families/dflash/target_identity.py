"""Which target a drafter was trained against: a content fingerprint of the target's folder.

`target_fingerprint` is the sha256 over the sha256 of the target's config.json and of each of
its `*.safetensors` files (content only, no paths or times); a feature artifact records it
(`features.json`) and so does every drafter checkpoint (`checkpoint.json`'s `target`, with the
folder's path and each file's stamp). Hashing reads every byte (seconds per GB), so it is done
once per file version (`turbo_dllm.digests` remembers each file's digest under its stamp, across
processes), and a resume whose target files carry
the stamps its checkpoint recorded (size, mtime, ctime, inode, device: the same files, never
rewritten since: any write changes ctime) takes the recorded fingerprint without reading them.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from turbo_dllm.digests import sha256_files

__all__ = [
    "current_target_record",
    "target_fingerprint",
    "target_record",
]

# (resolved folder, its files' stamps) -> fingerprint, for this process
_FINGERPRINTS: dict[tuple[str, tuple], str] = {}


def _files(folder: Path) -> list[Path]:
    return [folder / "config.json", *sorted(folder.glob("*.safetensors"))]


def _stamps(folder: Path) -> dict[str, dict[str, int]]:
    """Each fingerprinted file's stamp: what changes whenever its content may have."""
    stamps = {}
    for file in _files(folder):
        stat = os.stat(file)
        stamps[file.name] = {
            "bytes": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "ctime_ns": stat.st_ctime_ns,
            "inode": stat.st_ino,
            "device": stat.st_dev,
        }
    return stamps


def _key(folder: Path, stamps: dict[str, dict[str, int]]) -> tuple[str, tuple]:
    return str(folder.resolve()), tuple((n, tuple(s.values())) for n, s in sorted(stamps.items()))


def target_fingerprint(folder: str | Path) -> str:
    """sha256 over the target's config.json and weight files (content only, no paths)."""
    return target_record(folder)["fingerprint"]


def target_record(folder: str | Path) -> dict[str, Any]:
    """{path (absolute), fingerprint, files: {name: stamp}} of a target folder."""
    folder = Path(folder)
    stamps = _stamps(folder)  # before reading: a write while hashing changes them
    key = _key(folder, stamps)
    if key not in _FINGERPRINTS:
        digest = hashlib.sha256()
        for file_digest in sha256_files(_files(folder)):
            digest.update(file_digest.encode())
        _FINGERPRINTS[key] = digest.hexdigest()
    return {"path": str(folder.absolute()), "fingerprint": _FINGERPRINTS[key], "files": stamps}


def current_target_record(recorded: dict[str, Any], folder: str | Path) -> dict[str, Any]:
    """`target_record(folder)`, taking the fingerprint from `recorded` (a checkpoint's record)
    without reading a byte when the folder's files are the ones it stamped."""
    folder = Path(folder)
    stamps = _stamps(folder)
    if recorded.get("files") == stamps and isinstance(recorded.get("fingerprint"), str):
        return {
            "path": str(folder.absolute()),
            "fingerprint": recorded["fingerprint"],
            "files": stamps,
        }
    return target_record(folder)
