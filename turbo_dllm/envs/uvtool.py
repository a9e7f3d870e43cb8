"""Running uv: the resolver and installer behind `dllm env lock` and `dllm env sync`.

uv comes from the `uv` Python package (`turbo-dllm[env]`), so its version is pinned like any other
dependency. Every call passes `--no-config` and runs with uv's index variables removed from the
environment: the manifest and the command line decide where packages come from, never a stray
`uv.toml` or `UV_INDEX_URL` on the host.
"""

from __future__ import annotations

import errno
import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Sequence
from functools import lru_cache

from turbo_dllm.errors import DllmError, os_error_hint

__all__ = ["run_uv", "uv_binary", "uv_version"]

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


# uv's file-system failures ("No space left on device (os error 28)") are not a missing or
# unreachable package: the caller's hint (indexes, mirrors) would send the user the wrong way.
_FILE_SYSTEM_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)
_UV_CACHE = "where the venv is, and uv's cache: UV_CACHE_DIR, default ~/.cache/uv"


def _file_system_hint(text: str) -> str | None:
    """The hint for the last OS error uv reports (`(os error N)`), when it is a file system's:
    `errors.os_error_hint`'s, a full disk's naming uv's cache too."""
    codes = re.findall(r"\(os error (\d+)\)", text)
    code = int(codes[-1]) if codes else None
    if code not in _FILE_SYSTEM_ERRORS:
        return None
    hint = os_error_hint(code)
    if code in (errno.ENOSPC, errno.EDQUOT):  # "... free some space and run it again"
        hint = hint.replace("free some space", f"free some space ({_UV_CACHE})")
    return hint


@lru_cache(maxsize=1)
def uv_binary() -> str:
    try:
        import uv
    except ImportError as error:
        raise DllmError(
            "uv is not installed in this environment",
            hint=f"{shlex.quote(sys.executable)} -m pip install 'turbo-dllm[env]' (or pip install uv)",
        ) from error
    try:
        return uv.find_uv_bin()
    except FileNotFoundError as error:
        raise DllmError(
            "the uv package is installed but its binary is missing",
            hint=f"{shlex.quote(sys.executable)} -m pip install --force-reinstall uv",
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
        raise DllmError(
            f"{what} failed:\n{explanation}", hint=_file_system_hint(explanation) or hint
        )
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
