"""Where turbo-dllm keeps its files: one home (platformdirs, or $DLLM_HOME) and run dirs."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["dllm_home", "new_run_dir", "use_matplotlib_config_dir"]

MATPLOTLIB_CONFIG_VARIABLE = "MPLCONFIGDIR"


def dllm_home() -> Path:
    """The root of caches and stores: $DLLM_HOME, else the platform's user data dir."""
    override = os.environ.get("DLLM_HOME")
    if override:
        try:
            return Path(override).expanduser()
        except RuntimeError:  # ~name of a user this machine does not know, or no HOME for ~
            from turbo_dllm.errors import DllmError

            raise DllmError(
                f"DLLM_HOME={override!r}: {override.split('/')[0]} is not a home folder here",
                hint="set DLLM_HOME to an absolute path",
            ) from None
    from platformdirs import user_data_path

    return user_data_path("turbo-dllm", appauthor=False)


def new_run_dir(root: str | Path = "runs") -> Path:
    # Imported here: every `dllm bundle install` imports this module and never needs them.
    import secrets
    from datetime import datetime, timezone

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path(root) / f"{stamp}-{secrets.token_hex(3)}"


def use_matplotlib_config_dir() -> Path:
    """Point matplotlib's config and font cache at `<dllm home>/matplotlib` (a user's own
    MPLCONFIGDIR wins); call before importing matplotlib. Left alone it writes them under
    ~/.config and ~/.cache, or into a fresh temp folder when those are not writable."""
    folder = Path(os.environ.get(MATPLOTLIB_CONFIG_VARIABLE) or dllm_home() / "matplotlib")
    folder.mkdir(parents=True, exist_ok=True)
    os.environ[MATPLOTLIB_CONFIG_VARIABLE] = str(folder)
    return folder
