"""The one user-facing error type.

A `DllmError` is a user mistake or an environment problem the user can fix: the CLI prints
its message and hint and exits 2 without a traceback. Any other exception is a bug.
"""

from __future__ import annotations

__all__ = ["DllmError", "describe_validation_error"]


class DllmError(Exception):
    """A problem the user can fix: `message` says what is wrong, `hint` how to fix it."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\nhint: {self.hint}"


def describe_validation_error(error, limit: int | None = None) -> str:
    """One line from a pydantic ValidationError: `path: message; ...` (at most `limit` items).

    For machine files we read back (catalogs, manifests, artifacts); user-written YAML gets the
    richer report of `turbo_dllm.config.load.format_validation_error`.
    """
    items = error.errors()[:limit] if limit else error.errors()
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in items)
