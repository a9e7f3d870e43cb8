"""Run `dllm` in a child process under a memory cap, for inputs built to exhaust memory.

A regression test for a memory bomb must fail, not take the machine down, on code that still
has the bug: the child's address space is capped with RLIMIT_AS (an allocation past it raises
MemoryError there), the size of any file it writes with RLIMIT_FSIZE (past it the child is killed),
and its time with a timeout.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import turbo_dllm

_ROOT = Path(turbo_dllm.__file__).resolve().parents[1]


def run_dllm(*args, cwd=None, memory_mib: int = 512, file_mib: int = 256, timeout: float = 60):
    """`python -m turbo_dllm ARGS` with at most `memory_mib` of address space and no file
    written past `file_mib`; returns (code, out, err)."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_mib << 20, memory_mib << 20))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_mib << 20, file_mib << 20))

    env = {**os.environ, "PYTHONPATH": str(_ROOT), "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "turbo_dllm", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=cap,
    )
    return SimpleNamespace(code=proc.returncode, out=proc.stdout, err=proc.stderr)
