"""GPU tests skip only without CUDA or without a device; a broken CUDA host fails loudly."""

from __future__ import annotations

import types

import pytest

from tests.cuda_state import cuda_state


def fake_torch(*, cuda="12.8", devices=1, available=True):
    def is_available():
        if isinstance(available, Exception):
            raise available
        return available

    return types.SimpleNamespace(
        version=types.SimpleNamespace(cuda=cuda),
        cuda=types.SimpleNamespace(device_count=lambda: devices, is_available=is_available),
    )


def test_no_cuda_build_or_no_device_skips(monkeypatch):
    monkeypatch.setattr("glob.glob", lambda pattern: [])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert cuda_state(fake_torch(cuda=None)) == "absent"
    assert cuda_state(fake_torch(devices=0)) == "absent"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # hidden on purpose
    assert cuda_state(fake_torch(devices=1, available=False)) == "absent"


def test_a_present_but_broken_gpu_fails_loudly(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(pytest.UsageError, match="raised"):
        cuda_state(fake_torch(available=RuntimeError("CUDA driver version is insufficient")))
    with pytest.raises(pytest.UsageError, match="is False"):
        cuda_state(fake_torch(available=False))
    with pytest.raises(pytest.UsageError, match="unusable"):
        cuda_state(fake_torch(), probe="raise SystemExit('no kernel image for this device')")
    assert cuda_state(fake_torch(), probe="pass") == "usable"
