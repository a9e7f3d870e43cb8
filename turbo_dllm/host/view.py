"""What the compiler needs to know about this host, read from its fingerprint.

The compiler only needs a few facts (visible GPUs, CPU cores); taking them as a small value
instead of probing keeps `compile_plan` a pure function that tests can feed any host.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

__all__ = ["HostView", "host_view"]


@dataclass(frozen=True)
class HostView:
    gpus: tuple[str, ...]  # names of the visible GPUs, in device order
    cpu_count: int

    @classmethod
    def from_fingerprint(cls, fingerprint: Any) -> HostView:
        gpus = tuple(str(getattr(gpu, "name", gpu)) for gpu in (fingerprint.gpus or ()))
        return cls(gpus=gpus, cpu_count=_cpu_count())


def host_view(fingerprint: Any = None) -> HostView:
    if fingerprint is None:
        from turbo_dllm.host import collect_fingerprint

        fingerprint = collect_fingerprint()
    return HostView.from_fingerprint(fingerprint)


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
