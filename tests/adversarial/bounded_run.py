"""Run `dllm` in a child process under a memory cap, for inputs built to exhaust memory.

A regression test for a memory bomb must fail, not take the machine down, on code that still
has the bug: the child's address space is capped with RLIMIT_AS (an allocation past it raises
MemoryError there), and its time with a timeout.
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


def run_dllm(*args, cwd=None, memory_mib: int = 512, timeout: float = 60):
    """`python -m turbo_dllm ARGS` with at most `memory_mib` of address space; (code, out, err)."""
    limit = memory_mib << 20

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

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
