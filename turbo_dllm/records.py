"""Strict typed records: the machine files on the path of `dllm bundle install`.

The host fingerprint, the release catalog and lock, `bundle.json` and a store's `install.json`
are read by every install, where importing pydantic and building its models would cost more than
the whole install. Each of those formats is ONE class deriving from `Record`: its annotations are
the schema, and construction validates them, like a frozen pydantic model with `extra="forbid"`:

- `str`, `int`, `bool` (no coercion: `"3"` is not an int, `True` is not an int), `X | None`,
  `tuple[X, ...]` (from a list or a tuple), `dict[str, X]`, `Literal[...]`, nested records (from
  a dict), and value classes with a `coerce` classmethod, such as the host identifiers (parsed
  from their canonical text, dumped to JSON as `str(value)`);
- `name: T = value` gives a default; `checked(fn)` (or `checked(fn, default=...)`) passes the
  type-checked value through `fn`, which returns the value to keep (e.g. the canonical spelling)
  or raises ValueError;
- `_problems()` yields cross-field problems once every field is valid;
- records are keyword-only and immutable, compare by value, and `model_validate(dict)` refuses
  unknown and missing keys (a `format` field is required there even where it has a default:
  the default serves code that builds a record, never a file that lacks it). Every problem is collected into one `RecordError` whose text is
  `location: message; ...` (`bundles.0.sha256: ...`).

Records speak the part of pydantic's API their callers use (`model_validate`,
`model_validate_json`, `model_dump`, `model_dump_json`, `model_copy`), so code that reads a
format does not care which kind of model it is. They are not dataclasses on purpose: creating a
dataclass runs `exec` for each generated method (~0.5 ms a class), which an install importing
dozens of them would feel.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["Record", "RecordError", "checked"]

R = TypeVar("R", bound="Record")
Converter = Callable[[Any], Any]
_MISSING: Any = object()


class RecordError(ValueError):
    """Every problem found in one record: (location, message) pairs."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__(str(self))

    def __str__(self) -> str:
        return "; ".join(f"{loc or '(top)'}: {message}" for loc, message in self.problems)

    def under(self, prefix: str | int) -> list[tuple[str, str]]:
        """The problems with `prefix` prepended to their locations."""
        return [(_join(prefix, loc), message) for loc, message in self.problems]


class _Checked:
    __slots__ = ("check", "default")

    def __init__(self, check: Converter, default: Any) -> None:
        self.check, self.default = check, default


def checked(check: Converter, *, default: Any = _MISSING) -> Any:
    """A field whose type-checked value goes through `check` (see the module docstring)."""
    return _Checked(check, default)


class Record:
    """Base of strict records; subclasses declare annotated fields (see the module docstring)."""

    _fields: tuple[str, ...] = ()
    _defaults: dict[str, Any] = {}
    _checks: dict[str, Converter] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = [n for n in cls.__dict__.get("__annotations__", {}) if not n.startswith("_")]
        defaults, checks = dict(cls._defaults), dict(cls._checks)
        for name in own:
            value = cls.__dict__.get(name, _MISSING)
            if isinstance(value, _Checked):
                checks[name], value = value.check, value.default
            if value is not _MISSING:
                defaults[name] = value
            if name in cls.__dict__:
                delattr(cls, name)  # the value lives on each instance
        cls._fields = (*cls._fields, *own)
        cls._defaults, cls._checks = defaults, checks

    def __init__(self, **values: Any) -> None:
        unknown = [name for name in values if name not in self._fields]
        missing = [n for n in self._fields if n not in values and n not in self._defaults]
        if unknown or missing:
            raise TypeError(
                f"{type(self).__name__}: unknown fields {unknown}, missing fields {missing}"
            )
        converted, problems = _convert(type(self), {**self._defaults, **values})
        for name, value in converted.items():
            object.__setattr__(self, name, value)
        if not problems:
            problems = list(self._problems())
        if problems:
            raise RecordError(problems)

    def _problems(self) -> Iterator[tuple[str, str]]:
        """Rules across fields, as (field, message); runs when every field is valid."""
        return iter(())

    # --- value semantics ------------------------------------------------------------------------
    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._fields)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), self._values()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__name__}({fields})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable; use model_copy(update=...)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    # --- the pydantic-compatible surface --------------------------------------------------------
    @classmethod
    def model_validate(cls: type[R], data: Any) -> R:
        """A record from a decoded JSON/TOML object: unknown and missing keys are problems."""
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise RecordError([("", f"expected an object, got {_show(data)}")])
        values, problems = _convert(cls, data)
        problems += [(str(key), "unknown field") for key in data if key not in cls._fields]
        # A file's `format` is what says which document it is: read back, it must be there even
        # where the class defaults it (for code that builds one).
        problems += [
            (name, "field required")
            for name in cls._fields
            if name not in data and (name not in cls._defaults or name == "format")
        ]
        if problems:
            raise RecordError(problems)
        return cls(**values)

    @classmethod
    def model_validate_json(cls: type[R], data: str | bytes) -> R:
        try:
            document = json.loads(data)
        except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
            raise RecordError([("", f"not valid JSON: {error}")]) from None
        except RecursionError:  # json's decoder recurses per nesting level
            raise RecordError([("", "not valid JSON: nested too deeply")]) from None
        return cls.model_validate(document)

    def model_dump(self, *, mode: str = "python") -> dict[str, Any]:
        """Fields as a dict; `mode="json"`: only JSON types (identifiers as text, lists)."""
        if mode not in ("python", "json"):
            raise ValueError(f"mode must be 'python' or 'json', not {mode!r}")
        return {name: _dump(getattr(self, name), mode == "json") for name in self._fields}

    def model_dump_json(self, *, indent: int | None = None) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=indent)

    def model_copy(self: R, *, update: dict[str, Any] | None = None) -> R:
        """A copy with `update` applied; validated like any new record."""
        return type(self)(
            **{**dict(zip(self._fields, self._values(), strict=True)), **(update or {})}
        )


# --- converters, derived from the annotations once per class -----------------------------------
_CONVERTERS: dict[type, tuple[tuple[str, Converter], ...]] = {}


def _converters(cls: type[Record]) -> tuple[tuple[str, Converter], ...]:
    found = _CONVERTERS.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls)
        found = _CONVERTERS[cls] = tuple((n, _converter(hints[n])) for n in cls._fields)
    return found


def _convert(cls: type[Record], data: dict[str, Any]) -> tuple[dict[str, Any], list[tuple]]:
    """The valid fields among `data` (converted and checked), and the problems of the others."""
    values: dict[str, Any] = {}
    problems: list[tuple[str, str]] = []
    for name, convert in _converters(cls):
        if name not in data:
            continue
        try:
            value = convert(data[name])
            check = cls._checks.get(name)
            values[name] = value if check is None else check(value)
        except RecordError as error:
            problems += error.under(name)
        except (ValueError, TypeError) as error:
            problems.append((name, _message(error)))
    return values, problems


def _converter(hint: Any) -> Converter:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) != 1 or len(args) != 2:
            raise TypeError(f"records support `X | None` unions only, not {hint}")
        inner = _converter(options[0])
        return lambda value: None if value is None else inner(value)
    if origin is tuple:
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"records support tuple[X, ...] only, not {hint}")
        return _sequence(_converter(args[0]))
    if origin is dict:
        if args[0] is not str:
            raise TypeError(f"records support dict[str, X] only, not {hint}")
        return _mapping(_converter(args[1]))
    if origin is typing.Literal:
        return _literal(args)
    if isinstance(hint, type) and issubclass(hint, Record):
        return lambda value: value if isinstance(value, hint) else hint.model_validate(value)
    if isinstance(hint, type) and callable(getattr(hint, "coerce", None)):
        return hint.coerce  # an identifier: its instance, or its text
    if hint in (str, int, bool):
        return _exact(hint)
    raise TypeError(f"records do not support fields of type {hint}")


_KIND = {str: "a string", int: "an integer", bool: "true or false"}


def _exact(kind: type) -> Converter:
    def convert(value: Any) -> Any:
        # Subclasses (torch's TorchVersion is a str) become the plain type; a bool is not an int.
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise TypeError(f"expected {_KIND[kind]}, got {_show(value)}")
        return value if type(value) is kind else kind(value)

    return convert


def _literal(choices: tuple[Any, ...]) -> Converter:
    def convert(value: Any) -> Any:
        if value not in choices or type(value) is not type(choices[0]):
            allowed = " or ".join(repr(c) for c in choices)
            raise ValueError(f"must be {allowed}, got {_show(value)}")
        return value

    return convert


def _sequence(item: Converter) -> Converter:
    def convert(value: Any) -> tuple[Any, ...]:
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"expected a list, got {_show(value)}")
        items, problems = [], []
        for index, element in enumerate(value):
            try:
                items.append(item(element))
            except RecordError as error:
                problems += error.under(index)
            except (ValueError, TypeError) as error:
                problems.append((str(index), _message(error)))
        if problems:
            raise RecordError(problems)
        return tuple(items)

    return convert


def _mapping(item: Converter) -> Converter:
    def convert(value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise TypeError(f"expected an object, got {_show(value)}")
        items, problems = {}, []
        for key, element in value.items():
            if not isinstance(key, str):
                problems.append((repr(key), "keys must be strings"))
                continue
            try:
                items[key] = item(element)
            except RecordError as error:
                problems += error.under(key)
            except (ValueError, TypeError) as error:
                problems.append((key, _message(error)))
        if problems:
            raise RecordError(problems)
        return items

    return convert


def _dump(value: Any, as_json: bool) -> Any:
    if isinstance(value, Record):
        return value.model_dump(mode="json" if as_json else "python")
    if isinstance(value, tuple):
        items = [_dump(v, as_json) for v in value]
        return items if as_json else tuple(items)
    if isinstance(value, dict):
        return {k: _dump(v, as_json) for k, v in value.items()}
    if as_json and not isinstance(value, (str, int, float, type(None))):
        return str(value)  # an identifier: its canonical text
    return value


def _join(prefix: str | int, loc: str) -> str:
    return f"{prefix}.{loc}" if loc else str(prefix)


def _message(error: Exception) -> str:
    return getattr(error, "message", None) or str(error)


def _show(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"
