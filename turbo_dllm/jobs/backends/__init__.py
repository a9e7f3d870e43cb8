"""Backends that start a JobPlan's workers: local (in-process), torchrun, SLURM (sbatch)."""

from __future__ import annotations

__all__ = ["exit_code"]


def exit_code(returncode: int) -> int:
    """A child's exit status as a shell reports it: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode
