"""Write an artifact so that it is complete or invisible.

Arrays are streamed into a staging folder next to the target (same filesystem), hashing as they
go; the manifest is written last, then the folder is renamed into place. Replacing an existing
artifact moves it to a backup first and deletes the backup only after the new one is in place.
A lock (under DLLM_HOME) serialises jobs writing the same target, which also makes it safe to
clean up what a killed job left behind: backups, and staging folders (named by host and process,
so a job of another DLLM_HOME, which the lock does not hold back, keeps its own while it runs; the
one of the two that finishes second publishes over the other's artifact only with overwrite). A job SIGKILLed
between its two renames leaves the output path empty and the previous artifact in its backup
(`.NAME.backup-*`): readers name it with the `mv` that restores it (`restore_hint`), and the next
job writing that output restores it first, before anything else (a backup is never deleted while
no artifact stands in its place), then goes on as it would have: without output.overwrite it
refuses the artifact now there, with it it replaces it once the new one is complete.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from turbo_dllm.errors import DllmError
from turbo_dllm.fsutil import (
    flock_holder,
    fsync_dir,
    make_temp_dir,
    owned_prefix,
    sweep_orphans,
)
from turbo_dllm.sigterm import signals_deferred

__all__ = [
    "ArrayWriter",
    "check_target",
    "leftover_backup",
    "restore_hint",
    "staged_artifact",
    "staging_note",
    "write_json",
]


class ArrayWriter:
    """Append-only little-endian array file that hashes what it writes."""

    def __init__(self, path: Path, dtype: str, row_shape: tuple[int, ...] = ()) -> None:
        self.path = path
        self.dtype = dtype
        self.np_dtype = np.dtype(dtype).newbyteorder("<")
        self.row_shape = row_shape
        self._handle = open(path, "wb")  # noqa: SIM115 - closed in finish()
        self._digest = hashlib.sha256()
        self.bytes = 0

    def write(self, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array, dtype=self.np_dtype)
        view = memoryview(data).cast("B")
        self._handle.write(view)
        self._digest.update(view)
        self.bytes += len(view)

    def finish(self) -> dict:
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
        per_row = int(np.prod(self.row_shape)) if self.row_shape else 1
        count = self.bytes // (self.np_dtype.itemsize * per_row)
        return {
            "file": self.path.name,
            "dtype": self.dtype,
            "shape": [count, *self.row_shape],
            "bytes": self.bytes,
            "sha256": self._digest.hexdigest(),
        }

    def abort(self) -> None:
        self._handle.close()


def write_json(path: Path, document: dict) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(document, indent=2, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _is_artifact(path: Path) -> bool:
    try:
        document = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(document, dict) and str(document.get("format", "")).startswith(
        "turbo_dllm.data."
    )


# Every entry an artifact folder holds (tokenizer/ only with a Hugging Face tokenizer).
_ARTIFACT_ENTRIES = {"manifest.json", "tokens.bin", "loss_mask.bin", "documents.bin", "tokenizer"}
_ARRAYS = ("tokens.bin", "loss_mask.bin", "documents.bin")


def _damage(path: Path) -> str | None:
    """What is wrong with `path` if it is one of our artifacts whose manifest.json is damaged
    (cut short, overwritten with garbage), else None.

    Ours means: manifest.json is there but is no JSON object at all (a readable manifest of
    another format is someone else's), at least one of our arrays is there, and nothing is
    there that an artifact does not hold. A folder of the user's own is never taken for one.
    """
    manifest = path / "manifest.json"
    try:
        if not manifest.is_file() or manifest.is_symlink():
            return None
        entries = list(path.iterdir())
        try:
            document = json.loads(manifest.read_bytes())
        except ValueError as error:  # also a manifest that is not UTF-8
            reason = f"is not valid JSON ({error})"
        else:
            if isinstance(document, dict):
                return None
            reason = f"holds a JSON {type(document).__name__}, not an object"
    except OSError:
        return None
    names = {entry.name for entry in entries}
    if not names <= _ARTIFACT_ENTRIES or not any(
        (path / name).is_file() and not (path / name).is_symlink() for name in _ARRAYS
    ):
        return None
    if "tokenizer" in names and not (path / "tokenizer").is_dir():
        return None
    return reason


def check_target(target: Path, overwrite: bool) -> None:
    """Refuse early (before any work) to clobber something we should not."""
    if leftover_backup(target) is not None:
        return  # the job restores it first (under the lock), then checks again
    try:
        if not target.exists():
            if (blocker := _file_in_the_way(target)) is not None:
                raise DllmError(
                    f"output path {_shown(target)} goes through {_shown(blocker)}, which is "
                    "a file, not a folder",
                    hint="choose another output.path",
                )
            return
    except OSError as error:  # a name too long, a loop of links
        raise DllmError(
            f"output path {_shown(target)}: {error.strerror}", hint="choose another output.path"
        ) from None
    if not target.is_dir():
        raise DllmError(
            f"output path {str(target)!r} exists and is not a folder",
            hint="choose another output.path (the artifact is a folder)",
        )
    # Checked before overwrite: output.overwrite would not replace this folder either.
    damage = None
    if not _is_artifact(target) and any(target.iterdir()):
        damage = _damage(target)
        if damage is None:
            raise DllmError(
                f"output {str(target)!r} is a non-empty folder that is not a data artifact; "
                "refusing to replace it",
                hint="choose another output.path",
            )
    if not overwrite:
        what = f" (a data artifact whose manifest.json {damage})" if damage else ""
        raise DllmError(
            f"output {str(target)!r} already exists{what}",
            hint="set output.overwrite: true (or --set output.overwrite=true) to replace it",
        )


def _written_meanwhile(target: Path) -> None:
    """Refuse to publish over what appeared at `target` while this job ran (another job writing
    the same output, not serialised with this one: another DLLM_HOME, another host)."""
    check_target(target, overwrite=True)  # a folder of someone else's is named as such
    raise DllmError(
        f"output {str(target)!r} already exists: it was written while this job ran",
        hint="set output.overwrite: true (or --set output.overwrite=true) to replace it",
    )


def _file_in_the_way(target: Path) -> Path | None:
    """The nearest existing folder of `target` when it is no folder (a file), else None."""
    for parent in target.parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def _shown(target: Path, limit: int = 200) -> str:
    text = str(target)
    return (
        repr(text) if len(text) <= limit else repr(f"{text[:limit]}...") + f" ({len(text)} chars)"
    )


def _lock_for(target: Path):
    from filelock import FileLock

    from turbo_dllm.paths import dllm_home

    locks = dllm_home() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(os.fsencode(target)).hexdigest()[:24]  # a name may not be UTF-8
    return FileLock(str(locks / f"data-{key}.lock"))


@contextmanager
def _held(lock, target: Path) -> Iterator[None]:
    """Hold `lock`; where another job holds it, say so (and which process) before waiting: a
    second prepare to one output sat silent for as long as the first ran."""
    from filelock import Timeout

    try:
        lock.acquire(timeout=0)
    except Timeout:
        by = ""
        try:
            fd = os.open(lock.lock_file, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            pass
        else:
            try:
                holder = flock_holder(fd)
            finally:
                os.close(fd)
            by = f" (pid {holder})" if holder else ""
        print(
            f"dllm: waiting for another `dllm data prepare` writing {target}{by} to finish",
            file=sys.stderr,
            flush=True,
        )
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _backups(target: Path) -> list[Path]:
    """The backups a job replacing `target` made (`.NAME.backup-*` beside it), oldest first."""
    name = glob.escape(target.name)  # `out[v2]` or `out*` as a pattern matches others' leftovers
    found = []
    for backup in target.parent.glob(f".{name}.backup-*"):
        try:
            if backup.is_dir() and not backup.is_symlink():
                found.append((backup.stat().st_mtime, backup))
        except OSError:
            continue
    return [backup for _, backup in sorted(found)]


def _stands_empty(target: Path) -> bool:
    """Whether no artifact stands at `target`: nothing there, or an empty folder."""
    try:
        return not target.exists() or (target.is_dir() and not any(target.iterdir()))
    except OSError:
        return False


def leftover_backup(target: str | Path) -> Path | None:
    """The previous artifact at `target`, moved aside by a `dllm data prepare` that was killed
    before it moved the new one in: its newest backup, where `target` is gone (or an empty
    folder); else None."""
    try:
        target = Path(target).resolve()
        if not _stands_empty(target):
            return None
        backups = _backups(target)
    except (OSError, RuntimeError):  # a name too long, a loop of links
        return None
    return backups[-1] if backups else None


def restore_hint(target: str | Path) -> tuple[str, str] | None:
    """(what happened, how to restore it) where `leftover_backup` finds one, else None."""
    backup = leftover_backup(target)
    if backup is None:
        return None
    resolved = Path(target).resolve()
    command = f"mv {shlex.quote(str(backup))} {shlex.quote(str(resolved))}"
    if resolved.exists():  # an empty folder: mv would move the backup into it
        command = f"rmdir {shlex.quote(str(resolved))} && {command}"
    said = (
        f"a backup of the previous artifact is at {str(backup)!r} (a `dllm data prepare` "
        "replacing it was killed after moving it aside)"
    )
    how = (
        f"to get it back, restore it with `{command}` (the next `dllm data prepare` to this "
        "output restores it too, before it writes)"
    )
    return said, how


# The staging folder's name after `.NAME.staging-`: this host, the writing process, a random part
# (`owned_prefix`); an older turbo-dllm's had the random part alone.
_OWNED = re.compile(r"^.+-\d+-[0-9a-f]{12}$")


def _staging_prefix(target: Path) -> str:
    from turbo_dllm.fsutil import working_name

    return working_name(target.name, ".staging-")


def staging_note(target: str | Path) -> tuple[str, str] | None:
    """What the staging folders beside `target` say about its absence, and what to do: a
    `dllm data prepare` writing it now (wait for it), or one killed mid-write (its folder left,
    with its size, and the `rm` that frees it); None where there are none."""
    from turbo_dllm.fsutil import human_size

    try:
        target = Path(target).resolve()
        prefix = _staging_prefix(target)
        found = sorted(target.parent.glob(f"{glob.escape(prefix)}*"))
    except (OSError, RuntimeError):
        return None
    host, said, todo = os.uname().nodename, [], []
    for folder in found:
        rest = folder.name[len(prefix) :]
        where, pid = rest.rsplit("-", 2)[:2] if _OWNED.match(rest) else (None, "0")
        if where is not None and where != host:  # its process cannot be asked from here
            said.append(
                f"a `dllm data prepare` on host {where} (pid {pid}) is writing it, or was killed "
                f"there ({folder})"
            )
            todo.append(
                f"wait for that prepare to finish; where it is gone, `rm -r "
                f"{shlex.quote(str(folder))}` frees its space (a prepare on {where} removes it too)"
            )
            continue
        if where is not None and _alive(int(pid)):
            said.append(f"a `dllm data prepare` (pid {pid}) is writing it ({folder})")
            todo.append("wait for that prepare to finish")
            continue
        try:
            size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        except OSError:
            size = 0
        said.append(
            f"a `dllm data prepare` writing it was killed before it finished and left its "
            f"staging folder {folder} ({human_size(size)})"
        )
        todo.append(
            f"`rm -r {shlex.quote(str(folder))}` frees its space (the next prepare to "
            "this output removes it too)"
        )
    if not said:
        return None
    return "; ".join(said), "; ".join(dict.fromkeys(todo))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's
    return True


def _recover(target: Path) -> Path | None:
    """Clean up after a job that was killed; the backup restored to `target` where one was
    killed between its two renames, else None.

    A staging folder is removed once its process is gone (this host's; another host's stays):
    the lock serialises only jobs that share DLLM_HOME, and one with another DLLM_HOME (another
    user, a node-local home) writing the same output lost its staging folder mid-job."""
    prefix = _staging_prefix(target)
    sweep_orphans(target.parent, prefix)
    for stale in target.parent.glob(f"{glob.escape(prefix)}*"):
        if not _OWNED.match(stale.name[len(prefix) :]):  # an older turbo-dllm's, killed
            shutil.rmtree(stale, ignore_errors=True)
    backups = _backups(target)
    restored = None
    if backups and _stands_empty(target):
        # Killed between moving the old artifact aside and moving the new one in: put it back,
        # never delete it while no artifact stands in its place (an empty folder made since).
        restored = backups.pop()
        if target.exists():
            os.rmdir(target)
        os.rename(restored, target)
        fsync_dir(target.parent)
    for backup in backups:  # an artifact stands: these are ones it replaced, as asked
        shutil.rmtree(backup, ignore_errors=True)
    return restored


@contextmanager
def staged_artifact(target: Path, overwrite: bool) -> Iterator[Path]:
    """Yield an empty staging folder; on clean exit it replaces `target` atomically.

    On any exception the staging folder is removed and `target` is left exactly as it was.
    """
    target = Path(target).resolve()
    check_target(target, overwrite)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DllmError(
            f"cannot create the folder of output path {_shown(target)}: {error.strerror}",
            hint="choose an output.path in a folder you can write",
        ) from None
    with _held(_lock_for(target), target):
        restored = _recover(target)
        if restored is not None:
            if not overwrite:
                raise DllmError(
                    f"output {str(target)!r} already exists: restored just now from "
                    f"{restored}, the backup of the previous artifact that a "
                    "`dllm data prepare` replacing it was killed after moving aside",
                    hint="set output.overwrite: true (or --set output.overwrite=true) to "
                    "replace it",
                )
            print(
                f"dllm: restored {target} from {restored} (the previous artifact, moved aside "
                "by a prepare that was killed while replacing it); it is replaced once the "
                "new one is complete",
                file=sys.stderr,
            )
        check_target(target, overwrite)
        try:
            staging = make_temp_dir(target.parent, owned_prefix(_staging_prefix(target)))
        except OSError as error:
            raise DllmError(
                f"cannot write next to output path {_shown(target)}: {error.strerror}",
                hint="choose an output.path in a folder you can write (with a shorter name)",
            ) from None
        try:
            yield staging
            _publish(staging, target, overwrite)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def _publish(staging: Path, target: Path, overwrite: bool) -> None:
    # Every file was synced as it was finished; the staging folder's entries are too, before
    # the rename, and the rename itself after it: a power loss leaves the old state or the new.
    fsync_dir(staging)
    if not target.exists():
        try:
            os.rename(staging, target)
        except OSError as error:  # a folder with files in it, made there since the check
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        else:
            fsync_dir(target.parent)
            return
    if not overwrite:  # no job of this DLLM_HOME wrote it (the lock): one of another did
        _written_meanwhile(target)
    check_target(target, overwrite=True)
    backup = make_temp_dir(target.parent, f".{target.name}.backup-")
    os.rmdir(backup)
    # Ctrl-C or SIGTERM between the two renames raised there: the old artifact was left in its
    # backup, the output empty, and the complete new one deleted with the staging folder. Held
    # now, it takes effect once the new one is in and the backup gone.
    with signals_deferred():
        os.rename(target, backup)
        try:
            os.rename(staging, target)
        except BaseException:
            os.rename(backup, target)
            raise
        fsync_dir(target.parent)
        shutil.rmtree(backup, ignore_errors=True)
