"""Typed identifiers of a host: Python ABI tag, GPU architecture, torch release, CUDA version.

Each is an immutable value that parses from text and prints back its canonical form
(`PythonTag.parse("3.12") -> cp312`, `GpuArch.parse("9.0") -> sm90`), in the spirit of
`packaging.tags.Tag`: code compares values, never glued-together strings. Each works as a pydantic
field type (validated from a string, serialized to its canonical string) and as a record field
(`turbo_dllm.records`). They are plain slotted classes, not dataclasses, because every
`dllm bundle install` imports them (see `turbo_dllm.records` for why that matters).
"""

from __future__ import annotations

import re
import sys
from typing import Any, TypeVar

from turbo_dllm.errors import DllmError

__all__ = [
    "CudaVersion",
    "GpuArch",
    "Identifier",
    "InvalidIdentifier",
    "Platform",
    "PythonTag",
    "TorchRelease",
]

T = TypeVar("T", bound="Identifier")


class InvalidIdentifier(DllmError, ValueError):
    """Text that is not a valid identifier; also a ValueError so pydantic reports it per field."""


class Identifier:
    """Base of identifiers: `parse` + canonical `__str__` + pydantic (de)serialization.

    A subclass lists its fields in `__slots__` and sets them in `__init__` with `_init`; it then
    compares, orders and hashes by those fields (in order), like a frozen, ordered dataclass.
    """

    __slots__: tuple[str, ...] = ()

    def _init(self, **values: Any) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def _key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._key() == other._key()  # type: ignore[attr-defined]

    def __lt__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._key() < other._key()  # type: ignore[attr-defined]

    def __le__(self, other: object) -> bool:
        return self == other or self < other

    def __gt__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._key() > other._key()  # type: ignore[attr-defined]

    def __ge__(self, other: object) -> bool:
        return self == other or self > other

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._key()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({fields})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), self._key()

    @classmethod
    def parse(cls: type[T], text: str) -> T:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    @classmethod
    def coerce(cls: type[T], value: Any) -> T:
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        raise InvalidIdentifier(f"expected a {cls.__name__} string, got {value!r}")

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_plain_validator_function(
            cls.coerce,
            serialization=core_schema.plain_serializer_function_ser_schema(str),
        )

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> dict[str, Any]:
        return {"type": "string", "title": cls.__name__}


class PythonTag(Identifier):
    """A Python ABI tag: `cp312`, `cp313t` (free-threaded). Parses `3.12` and `cp312`."""

    __slots__ = ("implementation", "major", "minor", "abiflags")
    implementation: str
    major: int
    minor: int
    abiflags: str

    def __init__(self, implementation: str, major: int, minor: int, abiflags: str = "") -> None:
        self._init(implementation=implementation, major=major, minor=minor, abiflags=abiflags)

    _PATTERN = re.compile(r"^(?:(?P<impl>[a-z]{2})(?P<ver>\d{2,3})|(?P<dotted>\d+\.\d+))(?P<t>t?)$")

    @classmethod
    def parse(cls, text: str) -> PythonTag:
        match = cls._PATTERN.match(text.strip().lower())
        if not match:
            raise InvalidIdentifier(
                f"invalid Python tag: {text!r}", hint="write it as cp312 (or 3.12)"
            )
        if match["dotted"]:
            major, minor = (int(p) for p in match["dotted"].split("."))
            return cls("cp", major, minor, match["t"])
        digits = match["ver"]
        return cls(match["impl"], int(digits[0]), int(digits[1:]), match["t"])

    @classmethod
    def running(cls) -> PythonTag:
        impl = "cp" if sys.implementation.name == "cpython" else sys.implementation.name[:2]
        free_threaded = "t" if getattr(sys, "_is_gil_enabled", lambda: True)() is False else ""
        return cls(impl, sys.version_info.major, sys.version_info.minor, free_threaded)

    def __str__(self) -> str:
        return f"{self.implementation}{self.major}{self.minor}{self.abiflags}"


class GpuArch(Identifier):
    """A CUDA compute capability: `sm90`, `sm90a`, `sm100`. Parses `sm_90`, `9.0`, `90`."""

    __slots__ = ("major", "minor", "suffix")
    major: int
    minor: int
    suffix: str

    def __init__(self, major: int, minor: int, suffix: str = "") -> None:
        self._init(major=major, minor=minor, suffix=suffix)

    _PATTERN = re.compile(
        r"^(?:sm_?)?(?:(?P<maj>\d+)\.(?P<min>\d)|(?P<digits>\d{2,3}))(?P<sfx>[af]?)$"
    )

    @classmethod
    def parse(cls, text: str) -> GpuArch:
        match = cls._PATTERN.match(text.strip().lower())
        if not match:
            raise InvalidIdentifier(
                f"invalid GPU architecture: {text!r}", hint="write it as sm90 (or 9.0)"
            )
        if match["digits"]:
            digits = match["digits"]
            return cls(int(digits[:-1]), int(digits[-1]), match["sfx"])
        return cls(int(match["maj"]), int(match["min"]), match["sfx"])

    @property
    def capability(self) -> str:
        """The dotted form torch's TORCH_CUDA_ARCH_LIST uses (`9.0`, `9.0a`)."""
        return f"{self.major}.{self.minor}{self.suffix}"

    def __str__(self) -> str:
        return f"sm{self.major}{self.minor}{self.suffix}"


class TorchRelease(Identifier):
    """torch major.minor, the part of its version that fixes the C++ ABI: `torch2.11`."""

    __slots__ = ("major", "minor")
    major: int
    minor: int

    def __init__(self, major: int, minor: int) -> None:
        self._init(major=major, minor=minor)

    _PATTERN = re.compile(r"^(?:torch)?(?P<maj>\d+)\.(?P<min>\d+)(?:\.\d+)?(?:[+.\-a-z0-9]*)$")

    @classmethod
    def parse(cls, text: str) -> TorchRelease:
        """Accepts `torch2.11`, `2.11`, or a full version such as `2.11.0+cu130`."""
        match = cls._PATTERN.match(text.strip().lower())
        if not match:
            raise InvalidIdentifier(
                f"invalid torch release: {text!r}", hint="write it as 2.11 (or torch2.11)"
            )
        return cls(int(match["maj"]), int(match["min"]))

    @property
    def dotted(self) -> str:
        return f"{self.major}.{self.minor}"

    def __str__(self) -> str:
        return f"torch{self.major}.{self.minor}"


class CudaVersion(Identifier):
    """The CUDA major.minor torch was built with: `cu130` (parses `13.0` and `cu130`)."""

    __slots__ = ("major", "minor")
    major: int
    minor: int

    def __init__(self, major: int, minor: int) -> None:
        self._init(major=major, minor=minor)

    _PATTERN = re.compile(r"^(?:cu(?P<digits>\d{2,3})|(?P<maj>\d+)\.(?P<min>\d+)(?:\.\d+)*)$")

    @classmethod
    def parse(cls, text: str) -> CudaVersion:
        match = cls._PATTERN.match(text.strip().lower())
        if not match:
            raise InvalidIdentifier(
                f"invalid CUDA version: {text!r}", hint="write it as 13.0 (or cu130)"
            )
        if match["digits"]:
            digits = match["digits"]
            return cls(int(digits[:-1]), int(digits[-1]))
        return cls(int(match["maj"]), int(match["min"]))

    @property
    def dotted(self) -> str:
        return f"{self.major}.{self.minor}"

    def __str__(self) -> str:
        return f"cu{self.major}{self.minor}"


class Platform(Identifier):
    """An OS + CPU pair in wheel-tag spelling: `linux_x86_64`, `linux_aarch64`."""

    __slots__ = ("name",)
    name: str

    def __init__(self, name: str) -> None:
        self._init(name=name)

    _PATTERN = re.compile(r"^[a-z0-9]+(?:_[a-z0-9]+)+$")

    @classmethod
    def parse(cls, text: str) -> Platform:
        normalized = text.strip().lower().replace("-", "_").replace(".", "_")
        if not cls._PATTERN.match(normalized):
            raise InvalidIdentifier(f"invalid platform: {text!r}", hint="write it as linux_x86_64")
        return cls(normalized)

    @classmethod
    def running(cls) -> Platform:
        import sysconfig

        return cls.parse(sysconfig.get_platform())

    def __str__(self) -> str:
        return self.name
