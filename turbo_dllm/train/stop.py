"""Why a run stops early (`Stop`), and SIGTERM as a request to stop at the next step boundary,
with a checkpoint of the last step.

Two things stop a run before its last step: `training.max_duration_s` running out (exit status
0: a later launch resumes it) and SIGTERM (exit status 143). The trainer asks `stop_requested`
at every step boundary and between the micro-batches of an evaluation (a long one would overrun
either: `Trainer.evaluate`), and the ranks agree on the highest reason (`Stop` is ordered).

A scheduler's time limit or preemption (SLURM sends SIGTERM, then SIGKILL after its KillWait),
torchrun passing on a SIGTERM, `kill` or `timeout`: the trainer finishes the step it is in,
saves it and ends with exit status 143 (128 + SIGTERM) instead of losing every step since the
last checkpoint. One stop often arrives as several SIGTERMs: `scancel` or a preemption signals
every process of a SLURM step, the workers and the torchrun that passes its own on to them. So
a SIGTERM within `REPEAT_WINDOW_S` of the first is the same request and changes nothing (ignored
by the kernel, whatever the main thread is doing); one after it ends the process at once (the
default action again), for whoever means to cut a long save short.

Only the main thread can take signals, and a handler someone else installed (a launcher that
forwards signals, a test harness) is left alone: then SIGTERM does what it did before.

A torchrun worker also stops when torchrun itself ends without stopping it (SIGKILL, the OOM
killer, a crash): torchrun starts each worker in a session of its own, so nothing else would end
it, and it would train on orphaned, holding its GPU and writing into the run dir. The worker asks
Linux for `PARENT_GONE_SIGNAL` when its parent ends (`stop_with_parent`, PR_SET_PDEATHSIG) and,
while it trains, takes that signal as a stop request as SIGTERM's first: the step under way is
finished and saved, exit 143. It is a signal of its own, never a SIGTERM: torchrun that dies in
its own shutdown, after it passed a SIGTERM on, would otherwise deliver the worker's second
SIGTERM, which past the repeat window ends it at once, mid-save. Taking it again (or after a
SIGTERM) changes nothing.
"""

from __future__ import annotations

import enum
import os
import signal
import sys
import threading

from turbo_dllm.host.probes import process_stat

__all__ = [
    "EXIT_TERMINATED",
    "PARENT_GONE_SIGNAL",
    "REPEAT_WINDOW_S",
    "Stop",
    "TerminationRequest",
    "parent_of",
    "stop_requested",
    "stop_with_parent",
]

EXIT_TERMINATED = 128 + signal.SIGTERM

# How long after the first SIGTERM another one counts as the same stop, passed on by another
# process (torchrun, srun, SLURM signalling each process of a step): they follow it within
# milliseconds to a second; a person's second `kill` rarely comes that fast.
REPEAT_WINDOW_S = 5.0

# Sent by Linux to a torchrun worker whose torchrun ended (`stop_with_parent`). Not SIGTERM (a
# second one ends the trainer at once) and not SIGUSR1 (a SLURM job's time-limit warning, which
# torchrun and its workers ignore: jobs/backends/slurm_step.py).
PARENT_GONE_SIGNAL = signal.SIGUSR2
_PR_SET_PDEATHSIG = 1

# The pid of the parent this process stops with, once `stop_with_parent` asked for the signal.
_watched_parent: int | None = None


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
    """This rank's reason to stop now: a SIGTERM received (or its torchrun gone), else
    `elapsed_s` of this attempt's training time (since it started or resumed) at or past
    `training.max_duration_s`."""
    if termination.received or termination.parent_gone:
        return Stop.SIGTERM
    if max_duration_s is not None and elapsed_s >= max_duration_s:
        return Stop.TIME_LIMIT
    return Stop.NONE


def parent_of(pid: int) -> int | None:
    """The parent pid of process `pid` (Linux /proc), or None where it is gone or unreadable."""
    fields = process_stat(pid)
    return int(fields[1]) if fields and len(fields) > 1 else None  # field 4: the parent


def stop_with_parent(parent: int, grandparent: int | None = None) -> bool | None:
    """Ask Linux to send this process `PARENT_GONE_SIGNAL` when its parent ends (called at a
    torchrun worker's start, `parent` being `os.getppid()` read before anything else ran).

    Returns True where the parent is still the one the worker started under, False where it is
    gone already (it ended before the request, which then never comes: the caller stops), None
    where Linux cannot be asked (another system). `grandparent`, where known (the launcher that
    started torchrun), also catches a torchrun that ended before `parent` was read: the worker's
    parent is then whatever adopted it, whose own parent is not the launcher. Until a
    `TerminationRequest` is entered the signal's default action ends the worker (nothing trained
    yet to save); while one is, it is a stop request.
    """
    global _watched_parent
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    signal.signal(PARENT_GONE_SIGNAL, signal.SIG_DFL)  # one inherited as ignored would be lost
    if prctl(_PR_SET_PDEATHSIG, int(PARENT_GONE_SIGNAL), 0, 0, 0) != 0:
        return None
    _watched_parent = parent
    if os.getppid() != parent:  # it ended before the request: no signal will come
        return False
    if grandparent is not None and parent_of(parent) not in (grandparent, None):
        return False  # `parent` adopted this worker: its torchrun had ended already
    return True


class TerminationRequest:
    """While entered, a SIGTERM is noted (`received`) instead of ending the process, and so is a
    torchrun worker's parent ending (`parent_gone`, see `stop_with_parent`)."""

    def __init__(self) -> None:
        self.received = False
        self.parent_gone = False
        self._installed: list[signal.Signals] = []
        self._window: threading.Timer | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> TerminationRequest:
        if threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, self._note)
                self._installed.append(signal.SIGTERM)
            watched = _watched_parent is not None
            if watched and signal.getsignal(PARENT_GONE_SIGNAL) == signal.SIG_DFL:
                signal.signal(PARENT_GONE_SIGNAL, self._note_parent_gone)
                self._installed.append(PARENT_GONE_SIGNAL)
                if os.getppid() != _watched_parent:  # it ended before this handler was set
                    self._note_parent_gone(PARENT_GONE_SIGNAL, None)
        return self

    def _note(self, signum, frame) -> None:
        self.received = True
        # Repeats inside the window are ignored by the kernel itself: a Python handler would only
        # run when the main thread returns to Python (after a long CUDA wait it could be seconds
        # late, and take a repeat for a second request). After it, the default action again,
        # set from a timer thread through libc (signal.signal serves the main thread alone).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self._window = threading.Timer(REPEAT_WINDOW_S, self._end_window)
        self._window.daemon = True
        self._window.start()

    def _end_window(self) -> None:
        with self._lock:
            if signal.SIGTERM in self._installed:  # still entered
                _set_default_action(signal.SIGTERM)

    def _note_parent_gone(self, signum, frame) -> None:
        # Idempotent, and SIGTERM's handling stays as it was: a SIGTERM that came before (torchrun
        # passing one on, then dying) or comes after is the first, not a second one.
        if os.getppid() == _watched_parent:
            return  # the parent lives (the signal sent by hand, or a thread of it ended)
        if not self.parent_gone:
            self.parent_gone = True
            rank = os.environ.get("RANK", "?")
            message = (
                f"dllm: rank {rank}: its torchrun (pid {_watched_parent}) ended without stopping "
                "it: the step under way is saved and the worker stops (exit 143)\n"
            )
            try:
                os.write(2, message.encode())  # not print: the main thread may be in one
            except OSError:
                pass  # no one reads stderr any more

    def __exit__(self, *exc) -> None:
        with self._lock:
            if self._window is not None:
                self._window.cancel()
            for signum in self._installed:
                signal.signal(signum, signal.SIG_DFL)
            self._installed = []


def _set_default_action(signum: signal.Signals) -> None:
    """`signum`'s default action, from any thread (libc's signal(); Python's bookkeeping still
    names the handler it last set, which `TerminationRequest.__exit__` sets back to the default)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal(int(signum), ctypes.c_void_p(0))  # SIG_DFL
    except (OSError, AttributeError):
        pass  # no libc to ask: repeats stay ignored until the run ends (SIGKILL still ends it)
