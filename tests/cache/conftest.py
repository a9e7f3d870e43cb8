"""Every pack test sees only its own home's compile cache: an in-process trainer test elsewhere
in the session may have left TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR in os.environ
(`use_compile_cache` sets them for the process), which would point every command here at it."""

from __future__ import annotations

import pytest

CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "DLLM_COMPILE_CACHE")


@pytest.fixture(autouse=True)
def own_compile_cache(monkeypatch):
    for variable in CACHE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)


def clean_env(**extra: str) -> dict[str, str]:
    """os.environ without the cache variables, plus `extra` (for child processes)."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARIABLES}
    return {**env, **extra}
