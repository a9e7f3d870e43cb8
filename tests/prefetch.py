"""Long child processes a module's tests only wait on, started when the session starts.

The suite runs one test at a time on a 2-core host, so while most tests run on one core the
other idles. A module whose tests check the output of a long child process (the Triton
interpreter's kernel cases, the sm90 compiles) declares the command at import with `declare`;
once collection is done, `start` runs the commands of the modules with a selected test, one at a
time, on a background thread, and the tests' `result` waits for theirs. A command no session
started (its module imported by another) runs when asked, in the foreground.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

__all__ = ["declare", "result", "start", "started", "stop", "submit"]

# key -> (module name, commands, extra environment, timeout in seconds a command)
_DECLARED: dict[str, tuple[str, list[list[str]], dict[str, str], float]] = {}
_STARTED: dict[str, Future] = {}
_POOL: ThreadPoolExecutor | None = None


def declare(
    key: str, *commands: list[str], env: dict[str, str] | None = None, timeout: float
) -> None:
    """Declare `commands` (argv lists, run in order while each exits 0, with this interpreter's
    environment plus `env`; "{work}" in an argument is a folder of their own) for the calling
    module. `result(key)` gives the last CompletedProcess (text, stdout and stderr captured)
    and the folder."""
    module = sys._getframe(1).f_globals["__name__"]
    _DECLARED[key] = (module, [list(argv) for argv in commands], dict(env or {}), timeout)


def _run(commands, env, timeout, work: Path, home: Path | None):
    full = {**os.environ, **env}
    if home is not None:  # no session home yet when the session starts: one of its own
        full["DLLM_HOME"] = str(home)
    work.mkdir(parents=True, exist_ok=True)
    for argv in commands:
        argv = [arg.replace("{work}", str(work)) for arg in argv]
        done = subprocess.run(argv, env=full, capture_output=True, text=True, timeout=timeout)
        if done.returncode:
            break
    return done, work


def submit(
    key: str,
    *commands: list[str],
    work: Path,
    env: dict[str, str] | None = None,
    timeout: float,
    home: Path | None = None,
) -> None:
    """Queue `commands` (as `declare` takes them) on the background thread now; `result(key)`
    waits for them. For commands known only once the session's tests are."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch")
    _STARTED[key] = _POOL.submit(
        _run, [list(argv) for argv in commands], dict(env or {}), timeout, work, home or work
    )


def start(selected_modules: set[str], base: Path) -> None:
    """Start, one after another on one background thread, the commands of `selected_modules`
    (`base`: a folder for their DLLM_HOME and work folders)."""
    for key, (module, commands, env, timeout) in _DECLARED.items():
        if module in selected_modules:
            work = base / re.sub(r"[^A-Za-z0-9]+", "-", key)
            submit(key, *commands, work=work, env=env, timeout=timeout, home=base / "home")


def started(key: str) -> bool:
    """Whether `key`'s commands run (or ran) in the background and no one took the result."""
    return key in _STARTED


def result(key: str) -> tuple[subprocess.CompletedProcess, Path]:
    """The declared commands' outcome and folder: the background run's, else a run now."""
    started = _STARTED.pop(key, None)
    if started is not None:
        return started.result()
    _, commands, env, timeout = _DECLARED[key]
    return _run(commands, env, timeout, Path(tempfile.mkdtemp(prefix="prefetch-")), None)


def stop() -> None:
    """End of session: commands not yet started are dropped (a run cut short by -x)."""
    if _POOL is not None:
        _POOL.shutdown(wait=True, cancel_futures=True)
