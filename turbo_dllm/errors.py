"""The one user-facing error type.

A `DllmError` is a user mistake or an environment problem the user can fix: the CLI prints
its message and hint and exits 2 without a traceback. Any other exception is a bug.
"""

from __future__ import annotations

__all__ = ["DllmError"]


class DllmError(Exception):
    """A problem the user can fix: `message` says what is wrong, `hint` how to fix it."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\nhint: {self.hint}"
