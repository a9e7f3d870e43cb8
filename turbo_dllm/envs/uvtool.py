"""Running uv: the resolver and installer behind `dllm env lock` and `dllm env sync`.

uv comes from the `uv` Python package (`turbo-dllm[env]`), so its version is pinned like any other
dependency. Every call passes `--no-config` and runs with uv's index variables removed from the
environment: the manifest and the command line decide where packages come from, never a stray
`uv.toml` or `UV_INDEX_URL` on the host.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache

from turbo_dllm.errors import DllmError

__all__ = ["run_uv", "sigterm_unwinds", "uv_binary", "uv_version"]

# Variables that would add or replace package sources behind the manifest's back.
_SOURCE_VARIABLES = (
    "UV_INDEX",
    "UV_INDEX_URL",
    "UV_DEFAULT_INDEX",
    "UV_EXTRA_INDEX_URL",
    "UV_FIND_LINKS",
    "UV_NO_INDEX",
    "UV_INDEX_STRATEGY",
    "UV_CONFIG_FILE",
    "UV_PYTHON",
    "UV_SYSTEM_PYTHON",
    "UV_REQUIRE_HASHES",
    "UV_OFFLINE",
    "UV_PYTHON_DOWNLOADS",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
)


@lru_cache(maxsize=1)
def uv_binary() -> str:
    try:
        import uv
    except ImportError as error:
        raise DllmError(
            "uv is not installed in this environment",
            hint=f"{sys.executable} -m pip install 'turbo-dllm[env]' (or pip install uv)",
        ) from error
    try:
        return uv.find_uv_bin()
    except FileNotFoundError as error:
        raise DllmError(
            "the uv package is installed but its binary is missing",
            hint=f"{sys.executable} -m pip install --force-reinstall uv",
        ) from error


@lru_cache(maxsize=1)
def uv_version() -> str:
    """`uv X.Y.Z`, recorded in every manifest as the resolver that produced it."""
    out = subprocess.run(
        [uv_binary(), "--version"], capture_output=True, text=True, check=True
    ).stdout.split()
    return " ".join(out[:2])


def run_uv(
    args: Sequence[str],
    *,
    what: str,
    hint: str | None = None,
    extra_env: dict[str, str] | None = None,
    stream: bool = False,
    ok_codes: Sequence[int] = (0,),
) -> subprocess.CompletedProcess[str]:
    """Run `uv ARGS --no-config`; a failure is a DllmError that quotes uv's own explanation.

    `stream=True` lets uv's progress reach the terminal (stderr) instead of capturing it.
    `ok_codes` are the exit statuses that are answers, not failures (`uv pip check`: 1).
    """
    env = {k: v for k, v in os.environ.items() if k not in _SOURCE_VARIABLES}
    env["UV_PYTHON_DOWNLOADS"] = "never"  # never fetch an interpreter behind the user's back
    env.update(extra_env or {})
    command = [uv_binary(), *args, "--no-config"]
    if stream:
        returncode, stdout, stderr = _tee(command, env)
        proc = subprocess.CompletedProcess(command, returncode, stdout, stderr)
    else:
        proc = subprocess.run(command, env=env, text=True, capture_output=True)
    if proc.returncode not in ok_codes:
        detail = (proc.stderr or "").strip().splitlines()
        explanation = "\n".join(detail[-25:]) if detail else f"exit status {proc.returncode}"
        raise DllmError(f"{what} failed:\n{explanation}", hint=hint)
    return proc


def _tee(command: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Run with uv's stderr (its progress) copied to ours line by line, and kept for errors."""
    with subprocess.Popen(
        command, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as proc:
        kept: list[str] = []

        def pump() -> None:
            for line in proc.stderr:
                kept.append(line)
                sys.stderr.write(line)

        thread = threading.Thread(target=pump, daemon=True)
        thread.start()
        try:
            stdout = proc.stdout.read()
            proc.wait()
        except BaseException:
            # Ctrl-C or SIGTERM reached dllm alone (`kill PID`, a scheduler): uv must not go on
            # writing into a venv the caller is about to remove (Popen's exit would wait for
            # it to finish, or, on Ctrl-C, leave it running).
            _stop(proc)
            raise
        finally:
            thread.join(timeout=10)
    return proc.returncode, stdout, "".join(kept)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class _Terminated(BaseException):
    """SIGTERM reached dllm while it ran uv: unwind like Ctrl-C, so nothing is left half-made."""


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Let SIGTERM (`kill`, `timeout`, a scheduler's limit) unwind the work in this block before
    it ends the process: its default action ended dllm on the spot, leaving uv running on into
    a venv that sync had just created (and would have removed on any other failure). After the
    unwinding the process still ends by SIGTERM, as it would have.

    Only in the main thread, and only where SIGTERM has its default action (a caller with a
    handler of its own keeps it).
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return
    received = False

    def on_sigterm(signum, frame) -> None:
        nonlocal received
        if not received:  # a second one must not cut the unwinding short
            received = True
            raise _Terminated

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    except _Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        raise  # only where the signal could not end the process
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
