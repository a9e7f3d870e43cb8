"""`dllm env sync` in a process of its own with a stand-in uv (a shell script that runs the real
uv but stops at a chosen command and writes its pid), for the tests that signal a sync midway."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def sync_held_by_uv(uv: Path, pid_file: Path, manifest_file: Path, venv: Path) -> Iterator:
    """Start `dllm env sync --manifest manifest_file --venv venv` with `uv` as its uv, wait until
    the stand-in wrote its pid into `pid_file`, and yield (the sync's process, uv's pid). On the
    way out both are killed (the machine went down: uv is gone too)."""
    driver = (
        "import sys\n"
        "from turbo_dllm.envs import uvtool\n"
        f"uvtool.uv_binary = lambda: {str(uv)!r}\n"
        "from turbo_dllm.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", driver, "env", "sync", "--manifest", manifest_file,
         "--venv", venv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    uv_pid = None
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.is_file() and pid_file.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        uv_pid = int(pid_file.read_text())
        yield proc, uv_pid
    finally:
        proc.kill()
        if uv_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(uv_pid, signal.SIGKILL)
