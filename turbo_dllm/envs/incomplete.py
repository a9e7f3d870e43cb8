"""The mark `dllm env sync` keeps in a venv while it works on it: an unfinished venv is known.

A venv cannot be built aside and renamed into place: uv writes its absolute path into
`bin/activate` and into the shebang of every console script it installs (`uv venv
--relocatable` covers the standard entry points only). So sync marks the venv itself instead:
`<venv>/dllm-env-incomplete.json` is written (and fsynced) before sync changes anything there
(before `uv venv` for a venv it creates) and removed only after the result checked clean. Sync
holds an exclusive lock (flock) on it while it runs; the kernel drops the lock when the process
dies, SIGKILL and a lost machine included. So a mark nobody holds is a sync that did not finish:
`dllm env check` and `dllm doctor` refuse to take that venv for one, and the next sync removes
a venv it had been creating and makes it anew, or reinstalls every pin of one it had been
updating. A failure sync sees, Ctrl-C and SIGTERM still clean up (and remove the mark) on the spot.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from turbo_dllm.errors import DllmError
from turbo_dllm.fsutil import fsync_dir

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux/macOS: no lock, the mark alone
    fcntl = None

__all__ = ["MARK", "Interrupted", "SyncMark", "interrupted_sync", "refuse_incomplete"]

MARK = "dllm-env-incomplete.json"
_FORMAT = "turbo_dllm.env_sync_incomplete.v1"


@dataclass(frozen=True)
class Interrupted:
    """What a mark nobody holds says: the sync that left it, as far as it could be read."""

    created: bool  # that sync was creating the venv (else updating an existing one)
    target: str | None
    pid: int | None
    started: str | None
    command: str | None = None  # the `dllm env sync ...` line that sync ran, where it said


class SyncMark:
    """The mark of the running sync: written and locked by `place`, removed by `remove`."""

    def __init__(self, venv: Path, fd: int) -> None:
        self.venv = venv
        self.fd = fd

    @classmethod
    def place(
        cls, venv: Path, *, created: bool, target: str, command: str | None = None
    ) -> SyncMark:
        path = venv / MARK
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise _running(venv, path) from None
            record = {
                "format": _FORMAT,
                "created": created,
                "target": target,
                "pid": os.getpid(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "command": command,  # run again, it finishes the job (refuse_incomplete)
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
            os.fsync(fd)  # durable before uv writes anything: a lost machine leaves it too
            fsync_dir(venv)
            fsync_dir(venv.parent)  # a venv folder sync has just made
        except BaseException:
            os.close(fd)
            raise
        return cls(venv, fd)

    def remove(self) -> None:
        """The venv is complete (or sync cleaned up after itself): the mark goes, then the lock."""
        with contextlib.suppress(FileNotFoundError):
            (self.venv / MARK).unlink()
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _read(path: Path) -> dict:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _running(venv: Path, path: Path) -> DllmError:
    pid = _read(path).get("pid")
    who = f" (pid {pid})" if isinstance(pid, int) else ""
    return DllmError(
        f"{venv} is being synced right now by another `dllm env sync`{who}",
        hint="wait for it to finish; its venv is not complete until then",
    )


def interrupted_sync(venv: str | Path) -> Interrupted | None:
    """The sync that left `venv` unfinished (killed, or its machine lost), None when there is
    no mark. A sync still running there (it holds the mark's lock) is an error."""
    venv = Path(venv)
    path = venv / MARK
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:  # unreadable: still a mark
        return Interrupted(created=False, target=None, pid=None, started=None)
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _running(venv, path) from None
    finally:
        os.close(fd)
    record = _read(path)
    target, pid, started = record.get("target"), record.get("pid"), record.get("started")
    command = record.get("command")
    return Interrupted(
        # Unreadable (edited, torn): taken for an update, so that no sync ever removes a venv
        # it cannot tell it made.
        created=record.get("created") is True,
        target=target if isinstance(target, str) else None,
        pid=pid if isinstance(pid, int) else None,
        started=started if isinstance(started, str) else None,
        command=command if isinstance(command, str) and command.startswith("dllm ") else None,
    )


def refuse_incomplete(venv: str | Path) -> None:
    """`dllm env check` and `dllm doctor`: an unfinished venv is not compared with a manifest
    (its missing packages would read as mere drift, or an interrupted update as none)."""
    state = interrupted_sync(venv)
    if state is None:
        return
    what = "creating" if state.created else "updating"
    when = f" (started {state.started}, pid {state.pid})" if state.started and state.pid else ""
    synced = f" (it was syncing manifest {state.target})" if state.target else ""
    venv_arg = shlex.quote(str(venv))
    # The command as that sync was run (its source and venv, absolute), so that it pastes; a mark
    # of an older dllm does not say it.
    again = (
        f"run `{state.command}` again"
        if state.command
        else f"run that `dllm env sync ... --venv {venv_arg}` again{synced}"
    )
    raise DllmError(
        f"{venv} is an incomplete venv: the `dllm env sync` {what} it{when} did not finish (it was "
        f"killed, or its machine went down): {Path(venv) / MARK} is its mark",
        hint=f"{again}: it "
        + (
            "removes the incomplete venv and creates it anew"
            if state.created
            else "reinstalls every pinned package and finishes the update"
        )
        + f"; or remove {venv_arg}",
    )
