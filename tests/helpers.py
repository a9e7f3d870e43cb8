"""Assertions shared by the tests."""

from __future__ import annotations


def assert_user_error(result, *needles: str) -> None:
    """The error contract: exit 2, `dllm: error:` and a hint on stderr, no traceback."""
    assert result.code == 2, (result.code, result.err)
    assert result.err.startswith("dllm: error:"), result.err
    assert "Traceback" not in result.err
    for needle in needles:
        assert needle in result.err, (needle, result.err)
