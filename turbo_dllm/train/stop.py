"""SIGTERM as a request to stop at the next step boundary, with a checkpoint of the last step.

A scheduler's time limit or preemption (SLURM sends SIGTERM, then SIGKILL after its KillWait),
torchrun passing on a SIGTERM, `kill` or `timeout`: the trainer finishes the step it is in,
saves it and ends with exit status 143 (128 + SIGTERM) instead of losing every step since the
last checkpoint. A second SIGTERM ends the process at once (the default action again).

Only the main thread can take signals, and a handler someone else installed (a launcher that
forwards signals, a test harness) is left alone: then SIGTERM does what it did before.
"""

from __future__ import annotations

import signal
import threading

__all__ = ["EXIT_TERMINATED", "TerminationRequest"]

EXIT_TERMINATED = 128 + signal.SIGTERM


class TerminationRequest:
    """While entered, a SIGTERM is noted (`received`) instead of ending the process."""

    def __init__(self) -> None:
        self.received = False
        self._installed = False

    def __enter__(self) -> TerminationRequest:
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        ):
            signal.signal(signal.SIGTERM, self._note)
            self._installed = True
        return self

    def _note(self, signum, frame) -> None:
        self.received = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one ends the process at once

    def __exit__(self, *exc) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            self._installed = False
