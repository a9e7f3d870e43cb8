"""Whether this host's GPU tests run, skip, or the session stops: a broken CUDA host must not
pass as a host without GPUs (issue 14: any CUDA error used to read as "no GPU")."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

__all__ = ["cuda_state"]

_PROBE = "import torch; torch.zeros(1, device='cuda').add_(1); torch.cuda.synchronize()"


def _device_present(torch) -> bool:
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False  # GPUs hidden on purpose: a CPU run on a GPU host
    return torch.cuda.device_count() > 0 or bool(glob.glob("/dev/nvidia[0-9]*"))


def cuda_state(torch=None, probe: str = _PROBE) -> str:
    """'absent' (torch built without CUDA, or no device) or 'usable'; raises pytest.UsageError
    when a device is present but CUDA does not work (is_available raises or is False, or a
    kernel cannot run: the probe runs in a subprocess so this process opens no CUDA context)."""
    if torch is None:
        import torch
    if torch.version.cuda is None or not _device_present(torch):
        return "absent"
    try:
        available = torch.cuda.is_available()
    except Exception as error:
        raise pytest.UsageError(
            f"a GPU is present but torch.cuda.is_available() raised: {error!r}"
        ) from error
    if not available:
        raise pytest.UsageError(
            "a GPU is present but torch.cuda.is_available() is False "
            "(driver, CUDA_VISIBLE_DEVICES?); hide the GPUs with CUDA_VISIBLE_DEVICES= for a CPU run"
        )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if proc.returncode != 0:
        raise pytest.UsageError(f"a GPU is present but unusable:\n{proc.stderr[-2000:]}")
    return "usable"
