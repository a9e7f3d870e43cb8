"""Whether a folder a run writes (its run dir, its checkpoints) can be made, and what is in the
way where it cannot: said before any training work, not when the first checkpoint is saved.

Read-only: nothing is created. Shared by doctor's checks (and so `dllm launch`'s readiness)
and `dllm train`'s start.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FolderProblem", "checkpoint_dir_problem", "folder_problem"]


@dataclass(frozen=True)
class FolderProblem:
    detail: str  # what is wrong, said of the folder asked about ("it is a file, not a folder")
    blocker: Path | None = None  # the file in the way; None: a folder that cannot be written

    def fix(self, choose: str) -> str:
        """The fix line; `choose` says how to pick another folder ("set launch.run_dir")."""
        if self.blocker is not None:
            return (
                f"move the file {self.blocker} out of the way, or {choose} to a path that goes "
                "through folders only"
            )
        return f"{choose} to a folder you can write"


def folder_problem(target: str | Path) -> FolderProblem | None:
    """Why a folder cannot be made (or written) at `target`, or None where it can: `target`, or
    a folder above it, is a file; or the nearest folder that exists cannot be written."""
    target = Path(target).absolute()
    nearest = None
    for candidate in (*reversed(target.parents), target):
        try:
            if not candidate.exists():
                break
        except OSError:  # e.g. a folder above that may not be searched
            break
        if not candidate.is_dir():
            if candidate == target:
                return FolderProblem("it is a file, not a folder", candidate)
            return FolderProblem(
                f"the path goes through {candidate}, which is a file, not a folder", candidate
            )
        nearest = candidate
    if nearest is None:
        return None
    where = "it" if nearest == target else str(nearest)
    # A read-only mount first: os.access fails there too (EROFS), and "permission denied" sent
    # the user to chmod. Root passes os.access elsewhere: a kernel file system (/proc, /sys)
    # where no folder can be made is said as such (it was "/proc is full, 0 bytes free").
    mount, kind, read_only = _mount_of(nearest)
    if read_only:
        return FolderProblem(f"{where} is on a read-only file system (mounted at {mount})")
    if not os.access(nearest, os.W_OK | os.X_OK):
        return FolderProblem(f"{where} is not writable (permission denied)")
    if kind in _KERNEL_FILE_SYSTEMS:
        on = "is" if nearest == mount else f"is on {mount},"
        return FolderProblem(
            f"{where} {on} the kernel's {kind} file system: no folder can be made there"
        )
    return None


# File systems the kernel fills with its own entries: mkdir there fails (or makes a cgroup).
_KERNEL_FILE_SYSTEMS = frozenset(
    {
        "proc",
        "sysfs",
        "devpts",
        "securityfs",
        "pstore",
        "efivarfs",
        "bpf",
        "tracefs",
        "debugfs",
        "fusectl",
        "configfs",
        "cgroup",
        "cgroup2",
        "mqueue",
        "binfmt_misc",
        "nsfs",
    }
)


def _mount_of(folder: Path) -> tuple[Path, str | None, bool]:
    """The mount point of the file system holding the existing `folder`, its type (None where
    /proc/self/mountinfo cannot be read) and whether it is mounted read-only."""
    from turbo_dllm.fsutil import file_system

    mount, _ = file_system(folder)
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    kind = None
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return mount, None, read_only
    for line in lines:  # a later mount at the same place hides an earlier one
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not rest:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), parts[4])  # \040: a space
        if Path(point) == mount:
            kind = rest.split()[0]
    return mount, kind, read_only


def checkpoint_dir_problem(spec: Any, run_dir: Path | None) -> tuple[str, str] | None:
    """(detail, fix) where the checkpoints of `spec` cannot be written, else None: its
    `checkpoint.dir`, or, unset, `<run_dir>/checkpoints` where the run dir already exists (a
    new one is made with nothing in the way; the run dir's own problems are its check's)."""
    if spec.checkpoint.dir is not None:
        folder, choose = Path(spec.checkpoint.dir), "set checkpoint.dir"
    elif run_dir is not None and Path(run_dir).is_dir():
        folder, choose = Path(run_dir) / "checkpoints", "set checkpoint.dir"
    else:
        return None
    problem = folder_problem(folder)
    if problem is None:
        return None
    return f"cannot write checkpoints to {folder}: {problem.detail}", problem.fix(choose)
