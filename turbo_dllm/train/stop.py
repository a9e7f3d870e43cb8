"""Why a run stops early (`Stop`), and SIGTERM as a request to stop at the next step boundary,
with a checkpoint of the last step.

Two things stop a run before its last step: `training.max_duration_s` running out (exit status
0: a later launch resumes it) and SIGTERM (exit status 143). The trainer asks `stop_requested`
at every step boundary and between the micro-batches of an evaluation (a long one would overrun
either: `Trainer.evaluate`), and the ranks agree on the highest reason (`Stop` is ordered).

A scheduler's time limit or preemption (SLURM sends SIGTERM, then SIGKILL after its KillWait),
torchrun passing on a SIGTERM, `kill` or `timeout`: the trainer finishes the step it is in,
saves it and ends with exit status 143 (128 + SIGTERM) instead of losing every step since the
last checkpoint. A second SIGTERM ends the process at once (the default action again).

Only the main thread can take signals, and a handler someone else installed (a launcher that
forwards signals, a test harness) is left alone: then SIGTERM does what it did before.
"""

from __future__ import annotations

import enum
import signal
import threading

__all__ = ["EXIT_TERMINATED", "Stop", "TerminationRequest", "stop_requested"]

EXIT_TERMINATED = 128 + signal.SIGTERM


class Stop(enum.IntEnum):
    """Why to stop: ordered, so the ranks' vote (`distributed.highest_on_any_rank`) takes the
    strongest reason any rank has: a SIGTERM's exit status over the time limit's."""

    NONE = 0
    TIME_LIMIT = 1  # training.max_duration_s
    SIGTERM = 2

    @property
    def cause(self) -> str:
        """The reason as the run's log and metrics name it."""
        return ("none", "training.max_duration_s", "SIGTERM")[self]


def stop_requested(
    termination: TerminationRequest, elapsed_s: float, max_duration_s: float | None
) -> Stop:
    """This rank's reason to stop now: a SIGTERM received, else `elapsed_s` of training time
    (across resumes) at or past `training.max_duration_s`."""
    if termination.received:
        return Stop.SIGTERM
    if max_duration_s is not None and elapsed_s >= max_duration_s:
        return Stop.TIME_LIMIT
    return Stop.NONE


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
