"""Read TOML with the standard library's parser where it exists (Python 3.11+), else tomlkit.

Reading is on the path of every `dllm bundle install`, where import time counts; writing (which
must keep comments and formatting) always uses tomlkit.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TomlError", "loads"]


class TomlError(ValueError):
    """A document that is not valid TOML."""


def loads(text: str) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomlkit

        try:
            return tomlkit.parse(text).unwrap()
        except Exception as error:  # tomlkit raises several parse error types
            raise TomlError(str(error)) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise TomlError(str(error)) from None
    except RecursionError:  # tomllib recurses per nesting level of arrays and tables
        raise TomlError("nested too deeply") from None
