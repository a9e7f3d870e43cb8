"""Whether a folder a run writes (its run dir, its checkpoints) can be made, and what is in the
way where it cannot: said before any training work, not when the first checkpoint is saved.

Read-only: nothing is created. Shared by doctor's checks (and so `dllm launch`'s readiness)
and `dllm train`'s start.
"""

from __future__ import annotations

import os
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
    if nearest is not None and not os.access(nearest, os.W_OK | os.X_OK):
        return FolderProblem(
            "it is not writable" if nearest == target else f"{nearest} is not writable"
        )
    return None


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
