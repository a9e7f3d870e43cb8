"""SIGTERM unwinds a job like Ctrl-C does, then still ends the process by SIGTERM.

SIGTERM's default action (`kill`, `timeout`, a scheduler's time limit) ends the process on the
spot: no `finally`, no `except`, so whatever a job was making is left half-made (data prepare's
staging folder, the venv `dllm env sync` had just created with uv still installing into it,
`dllm mirror create`'s partial folder). Inside `unwinding_on_sigterm()` it raises instead, so
the job's own cleanup runs, and the process then ends by SIGTERM as it would have (its exit
status says so to whoever sent it).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Terminated", "signals_deferred", "unwinding_on_sigterm"]


class Terminated(BaseException):
    """SIGTERM reached the job (a BaseException: no `except Exception` swallows it)."""


@contextmanager
def unwinding_on_sigterm() -> Iterator[None]:
    """Within this block, SIGTERM unwinds the stack; after the unwinding the process ends by
    SIGTERM. A second SIGTERM does not cut the unwinding short.

    Only in the main thread, and only where SIGTERM has its default action (a caller with a
    handler of its own keeps it). A child forked inside the block (a pool worker that has not
    reset the handler yet) ends by the signal at once, as it would have.
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return
    owner = os.getpid()
    received = False

    def on_sigterm(signum, frame) -> None:
        nonlocal received
        if os.getpid() != owner:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if not received:
            received = True
            raise Terminated

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    except Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(owner, signal.SIGTERM)
        raise  # only where the signal could not end the process
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Within this block, SIGINT and SIGTERM wait: each one received is raised again when the
    block ends, to whatever handles it outside (Ctrl-C's KeyboardInterrupt, the unwinding
    above, the default action). For a step that must finish once begun, such as the renames
    that install and activate a bundle: an interrupt then lands before it or after it, never
    inside. Only in the main thread (elsewhere the block runs as it is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def hold(signum, frame) -> None:
        if signum not in received:
            received.append(signum)

    saved = {number: signal.signal(number, hold) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)
        for number in received:
            signal.raise_signal(number)
