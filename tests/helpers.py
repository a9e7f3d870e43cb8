"""Assertions and runners shared by the tests."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def benchmark_module(name: str):
    """The script benchmarks/<name>.py imported as a module (the scripts import their siblings
    by name, so benchmarks/ is on the path while it loads)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def run_in_triton_interpreter(script: str, *args: str, timeout: float = 600) -> str:
    """`script` (Python source) in a child process with Triton's interpreter on (it must be on
    before triton is imported) and the repository importable; its stdout, once it exited 0."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def assert_user_error(result, *needles: str) -> None:
    """The error contract: exit 2, `dllm: error:` and a hint on stderr, no traceback."""
    assert result.code == 2, (result.code, result.err)
    assert result.err.startswith("dllm: error:"), result.err
    assert "Traceback" not in result.err
    for needle in needles:
        assert needle in result.err, (needle, result.err)


def assert_failed_check(result, *needles: str) -> None:
    """`dllm data validate`'s failed check (as the `verify` commands': exit 1, not an error's
    2): what failed on stdout (`FAIL: ...`), its fix on stderr (`fix: ...`), no traceback."""
    assert result.code == 1, (result.code, result.out, result.err)
    assert result.out.startswith("FAIL: "), result.out
    assert result.err.startswith("fix: "), result.err
    assert "Traceback" not in result.err
    for needle in needles:
        assert needle in result.out + result.err, (needle, result.out, result.err)


def wait_for_file(child: subprocess.Popen, path: Path, what: str, timeout: float = 120) -> None:
    """Poll until `path` exists (a process held at a point writes it there), failing with
    `child`'s stderr if it ended first or with `what` if `timeout` seconds pass."""
    import time

    deadline = time.monotonic() + timeout
    while not path.exists():
        assert child.poll() is None, child.stderr.read()
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
