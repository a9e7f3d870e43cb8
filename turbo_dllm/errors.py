"""The one user-facing error type, and how every `dllm` process reports what the user can fix.

A `DllmError` is a user mistake or an environment problem the user can fix: the CLI (and a
launched job's worker) prints its message and hint and exits 2 without a traceback. So does a
file-system `OSError` (`describe_os_error` names the path and a fix). Any other exception is a bug.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

__all__ = [
    "DllmError",
    "describe_os_error",
    "describe_validation_error",
    "is_file_system_error",
    "print_error",
]


class DllmError(Exception):
    """A problem the user can fix: `message` says what is wrong, `hint` how to fix it."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\nhint: {self.hint}"


def describe_validation_error(error, limit: int | None = None) -> str:
    """One line from a pydantic ValidationError: `path: message; ...` (at most `limit` items).

    For machine files we read back (catalogs, manifests, artifacts); user-written YAML gets the
    richer report of `turbo_dllm.config.load.format_validation_error`.
    """
    items = error.errors()[:limit] if limit else error.errors()
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in items)


_OS_ERROR_HINTS = {
    errno.ENOSPC: "the disk is full: free some space and run it again",
    errno.EDQUOT: "your disk quota is used up: free some space and run it again",
    errno.EACCES: "check that path's permissions, or choose a path you can write",
    errno.EPERM: "check that path's permissions, or choose a path you can write",
    errno.EROFS: "that file system is read-only: choose a path on a writable one",
    errno.ENOTDIR: "a part of that path is a file, not a folder: choose another path",
    errno.EEXIST: "something already exists there: choose another path",
    errno.EISDIR: "that path is a folder where a file was expected: choose another path",
    errno.ENOENT: "a part of that path does not exist",
}


def os_error_hint(code: int) -> str | None:
    """The hint for a file-system error number (ENOSPC: the disk is full ...), else None."""
    return _OS_ERROR_HINTS.get(code)


def describe_os_error(error: OSError) -> tuple[str, str]:
    """An OSError as (message, hint): the path(s) it names and the OS's reason."""
    reason = error.strerror or str(error) or type(error).__name__
    if error.filename is None:
        message = reason
    else:
        paths = [_path_text(error.filename)]
        if error.filename2 is not None:
            paths.append(_path_text(error.filename2))
        message = f"{' -> '.join(map(repr, paths))}: {reason}"
        if error.errno in (errno.ENOTDIR, errno.EEXIST):
            # mkdir through a file says "Not a directory" / "File exists": name that file.
            blocker = _file_in_the_way(paths[0])
            if blocker is not None:
                message += f" ({blocker!r} is a file, not a folder)"
    hint = _OS_ERROR_HINTS.get(
        error.errno, "a file-system error: check that path, its permissions and free space"
    )
    return message, hint


def is_file_system_error(error: OSError) -> bool:
    """Whether the file system said no (a path, a permission, a full disk), not a socket."""
    return error.filename is not None or error.errno in _OS_ERROR_HINTS


def _path_text(name) -> str:
    return os.fsdecode(name) if isinstance(name, (str, bytes, os.PathLike)) else str(name)


def _file_in_the_way(path: str) -> str | None:
    for candidate in (Path(path), *Path(path).parents):
        try:
            if candidate.exists():
                return None if candidate.is_dir() else str(candidate)
        except OSError:
            return None
    return None


def print_error(message: str, hint: str | None) -> None:
    """What every `dllm` process prints for a problem the user can fix, on stderr."""
    print(f"dllm: error: {message}", file=sys.stderr)
    if hint:
        print(f"hint: {hint}", file=sys.stderr)
