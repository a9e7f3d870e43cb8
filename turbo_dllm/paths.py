"""Where turbo-dllm keeps its files: one home (platformdirs, or $DLLM_HOME) and run dirs."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["dllm_home", "new_run_dir"]


def dllm_home() -> Path:
    """The root of caches and stores: $DLLM_HOME, else the platform's user data dir."""
    override = os.environ.get("DLLM_HOME")
    if override:
        return Path(override).expanduser()
    from platformdirs import user_data_path

    return user_data_path("turbo-dllm", appauthor=False)


def new_run_dir(root: str | Path = "runs") -> Path:
    # Imported here: every `dllm bundle install` imports this module and never needs them.
    import secrets
    from datetime import datetime, timezone

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path(root) / f"{stamp}-{secrets.token_hex(3)}"
