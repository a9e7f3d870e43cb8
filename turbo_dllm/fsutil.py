"""Durable file writes shared by every format we write: whole-or-nothing, synced to disk."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["fsync_dir", "synced_temp_file", "write_atomic"]


def fsync_dir(folder: str | Path) -> None:
    """Persist a folder's entries (a rename or link inside it); a no-op where unsupported."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def synced_temp_file(path: Path, data: bytes) -> Iterator[str]:
    """A temporary file beside `path` holding `data`, synced to disk, for the caller to rename
    or link into place. It is removed on exit if still there; on success the folder is synced
    so the new name survives a crash."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        yield tmp
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    fsync_dir(path.parent)


def write_atomic(path: str | Path, data: bytes | str) -> Path:
    """Replace `path` with `data` so readers see the old file or the new one, never a mix."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with synced_temp_file(path, payload) as tmp:
        os.replace(tmp, path)
    return path
