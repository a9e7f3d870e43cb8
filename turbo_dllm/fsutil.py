"""Durable file writes shared by every format we write: whole-or-nothing, synced to disk.

Temporary files and folders are made here, not with `tempfile.mkstemp`/`mkdtemp`: those create
0600/0700 whatever the umask, and what we write is renamed into place as the real thing
(catalogs, mirrors, data artifacts, run manifests, checkpoints), which other users on shared
storage must be able to read when the umask allows. Ours are created with 0666/0777 and the
umask applied by the kernel, like any `open()` or `mkdir()`.
"""

from __future__ import annotations

import glob
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "file_mode",
    "flock_holder",
    "fsync_dir",
    "make_temp_dir",
    "make_temp_file",
    "owned_prefix",
    "save_safetensors",
    "sha256_file",
    "sweep_orphans",
    "synced_temp_file",
    "write_atomic",
]

_ATTEMPTS = 100


def make_temp_file(folder: str | Path, prefix: str, suffix: str = "") -> tuple[int, str]:
    """A new, exclusively created file in `folder` (fd, path), mode 0666 minus the umask."""
    for _ in range(_ATTEMPTS):
        path = os.path.join(folder, f"{prefix}{os.urandom(6).hex()}{suffix}")
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {folder}")


def make_temp_dir(folder: str | Path, prefix: str) -> Path:
    """A new folder in `folder`, mode 0777 minus the umask."""
    for _ in range(_ATTEMPTS):
        path = Path(folder) / f"{prefix}{os.urandom(6).hex()}"
        try:
            path.mkdir(0o777)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name in {folder}")


# What `owned_prefix` and `make_temp_dir` add to a working folder's name at most: a host name
# (64 bytes), a pid, two dashes and 12 hex digits.
_OWNED_BYTES = 64 + 10 + 2 + 12


def working_name(name: str, tag: str) -> str:
    """`.<name><tag>`, the hidden working folder's name prefix beside `name` (`.out.partial-`),
    with `name` cut so that the whole folder name fits a file name's 255 bytes: an `--out` of a
    legal 240-byte name failed with "File name too long" for its working folder. A cut name ends
    with `~` and 8 hex digits of the whole one's digest, so two long names stay apart."""
    room = 255 - _OWNED_BYTES - len(os.fsencode(f".{tag}"))
    raw = os.fsencode(name)
    if len(raw) <= room:
        return f".{name}{tag}"
    import hashlib

    cut = name
    while len(os.fsencode(cut)) > room - 9:  # by characters: a multi-byte one stays whole
        cut = cut[:-1]
    return f".{cut}~{hashlib.sha256(raw).hexdigest()[:8]}{tag}"


def owned_prefix(name: str) -> str:
    """The name prefix of a working folder this process owns: `name`, then this host and
    process id, so `sweep_orphans` can tell a killed process's leftovers from a running one's."""
    return f"{name}{os.uname().nodename}-{os.getpid()}-"


def sweep_orphans(root: str | Path, name: str) -> None:
    """Remove the folders under `root` named by `owned_prefix(name)` whose process on this host
    is gone (SIGKILLed or out of memory before its own clean-up ran); another host's (shared
    storage) and a running process's stay."""
    prefix = f"{name}{os.uname().nodename}-"
    for folder in Path(root).glob(f"{glob.escape(prefix)}*"):
        pid = folder.name[len(prefix) :].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except OSError:
            pass  # alive, another user's


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
    fd, tmp = make_temp_file(path.parent, prefix=f".{path.name}.", suffix=".tmp")
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


def save_safetensors(
    tensors: dict, path: str | Path, metadata: dict | None = None, mode: int | None = None
) -> Path:
    """`safetensors.torch.save_file`, with the file's mode a plain `open()` would give (0666
    minus the umask): safetensors 0.8 creates it 0600, which other users of shared storage
    (a serving account, a colleague loading the export) cannot read. From a thread other than
    the main one pass `mode` (`file_mode()`, read before): reading the umask sets it for a
    moment, and a file the main thread created then would get none."""
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata=metadata)
    os.chmod(path, file_mode() if mode is None else mode)
    return Path(path)


def file_mode() -> int:
    """The mode a plain `open()` gives a new file: 0666 minus the process's umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """The sha256 hex digest of a file's bytes, read in `chunk`-sized pieces."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def file_system(path: str | Path) -> tuple[Path, int | None]:
    """The mount point of the file system holding `path` (or the nearest folder above it that
    exists), and the bytes free on it for this user (None when that cannot be read, or the file
    system has no size: /proc, or a tmpfs without a limit, reports 0 blocks, none of them free)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path.parent != path:
        path = path.parent
    try:
        device = path.stat().st_dev
        while path.parent != path and path.parent.stat().st_dev == device:
            path = path.parent
        info = os.statvfs(path)
    except OSError:
        return path, None
    if info.f_blocks == 0:
        return path, None
    return path, info.f_bavail * info.f_frsize


def mounted_at(path: str | Path) -> str:
    """Where the file system holding `path` is mounted and its free space, for a hint about a
    full or read-only disk: "/mnt/scratch, 3.4 GiB free"."""
    mount, free = file_system(path)
    return f"{mount}, {human_size(free)} free" if free is not None else str(mount)


def human_count(n: int) -> str:
    """A count (of parameters) as people say it: 1.72B, 27.3M, 41.2K; a tiny test model is not
    `0.0M`."""
    for unit, scale, digits in (("B", 1e9, 2), ("M", 1e6, 1), ("K", 1e3, 1)):
        if n >= scale:
            return f"{n / scale:.{digits}f}{unit}"
    return str(n)


def human_size(count: int) -> str:
    """`count` bytes for a person: "512 bytes", "3.4 GiB"."""
    if count < 1024:
        return f"{count} bytes"
    value, unit = count / 1024, "KiB"
    for bigger in ("MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f} {unit}"


def flock_holder(fd: int) -> int | None:
    """The pid that holds a `flock` on the file (or folder) `fd` opens, from /proc/locks (None:
    unknown: none, or not Linux)."""
    st = os.fstat(fd)
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:  # "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF" ("->" waits)
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK" or "->" in fields:
            continue
        try:
            parts = fields[5].split(":")
            major, minor, inode = int(parts[0], 16), int(parts[1], 16), int(parts[2])
            pid = int(fields[4])
        except (ValueError, IndexError):
            continue
        if (major, minor, inode) == (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino):
            return pid
    return None
