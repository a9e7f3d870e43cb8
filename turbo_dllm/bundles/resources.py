"""Files the package ships: native sources, the targets list and the releases lock.

One source of truth each: `native/` and `bundles/` at the repository root. The package reaches
them through `turbo_dllm/_data/{native,bundles}` (links in the checkout, copied into wheels as
package data); when a copy of the tree lost the links, the checkout paths are used directly.
"""

from __future__ import annotations

from pathlib import Path

from turbo_dllm.errors import DllmError

__all__ = ["native_root", "releases_lock_path", "shipped_path", "targets_path"]

_PACKAGE = Path(__file__).resolve().parent.parent
_CHECKOUT = _PACKAGE.parent


def shipped_path(*parts: str) -> Path:
    """`_data/<parts>` inside the package, else `<parts>` in the source checkout."""
    for root in (_PACKAGE / "_data", _CHECKOUT):
        candidate = root.joinpath(*parts)
        if candidate.exists():
            return candidate
    raise DllmError(
        f"this turbo-dllm installation lacks {'/'.join(parts)}",
        hint="reinstall turbo-dllm (pip install --force-reinstall turbo-dllm)",
    )


def native_root() -> Path:
    return shipped_path("native")


def targets_path() -> Path:
    return shipped_path("bundles", "targets.toml")


def releases_lock_path() -> Path:
    return shipped_path("bundles", "releases.lock")
