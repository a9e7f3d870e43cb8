"""Load YAML configs into strict pydantic models with readable errors.

Shared by the RunSpec and every other YAML the user writes (prepare.yaml). A bad document never
escapes as a raw pydantic or YAML exception: it becomes one `DllmError` that lists every problem
with its dotted path, and an unknown key comes with the nearest valid name.
"""

from __future__ import annotations

import datetime
import difflib
import os
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from turbo_dllm.config.bounded_yaml import (
    MAX_DEPTH,
    MAX_YAML_BYTES,
    parse_yaml,
    trailing_comment,
)
from turbo_dllm.errors import DllmError, os_error_hint

__all__ = [
    "absolute_path",
    "apply_overrides",
    "format_validation_error",
    "load_model",
    "load_runspec",
    "read_yaml",
    "resolve_paths",
]

M = TypeVar("M", bound=BaseModel)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping in the YAML file `path`, parsed within the bounds of `bounded_yaml`."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            # Bounded: a config named by mistake as /dev/zero or a huge file must not fill memory.
            data = handle.read(MAX_YAML_BYTES + 1)
        if len(data) > MAX_YAML_BYTES:
            raise DllmError(
                f"{path}: larger than {MAX_YAML_BYTES >> 20} MiB; not a config file",
                hint="pass the YAML config itself (a RunSpec or prepare.yaml is a few KiB): "
                "check the path",
            )
        text = _utf8(data, path)
    except FileNotFoundError:
        raise DllmError(
            f"config file not found: {str(path)!r}",
            hint=_nearest_config(path) or "check the path, or create one with `dllm init DIR`",
        ) from None
    except IsADirectoryError:
        raise _a_folder(path) from None
    except OSError as error:
        raise DllmError(
            f"cannot read config {str(path)!r}: {error}",
            hint=os_error_hint(error.errno or 0) or "check that path and its permissions",
        ) from None
    document = parse_yaml(text, str(path))
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise DllmError(
            f"{path}: the top level must be a mapping of sections, not {type(document).__name__}",
            hint="write each section as `name:` at the start of a line (`model:`, `training:` "
            "in a RunSpec; `source:`, `packing:` in a prepare.yaml), its fields indented below",
        )
    return document


def _nearest_config(path: Path) -> str | None:
    """ "did you mean train.yaml?" where the missing file's folder holds a YAML file of a name
    close to it (`train.yml`, `trian.yaml`); None where none is."""
    import difflib
    import shlex

    try:
        names = [
            entry.name
            for entry in path.parent.iterdir()
            if entry.suffix in (".yaml", ".yml") and entry.is_file()
        ]
    except OSError:
        return None
    match = difflib.get_close_matches(path.name, sorted(names), n=1, cutoff=0.75)
    if not match:
        return None
    return f"did you mean {shlex.quote(str(path.with_name(match[0])))}?"


def _a_folder(path: Path) -> DllmError:
    """A folder named as a config (a `dllm init` project instead of its train.yaml): the YAML
    files in it are what could be meant."""
    try:
        found = sorted(str(p) for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
    except OSError:
        found = []
    shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    return DllmError(
        f"{path} is a folder, not a config file",
        hint=f"pass one of the YAML files in it: {shown}" if found else "pass a YAML file",
    )


def _utf8(data: bytes, path: Path) -> str:
    """`data` as text, or an error naming the line and column of its first byte that is not
    UTF-8 (a file saved as Latin-1): Python's message gives a byte offset in the file."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        before = data[: error.start].decode("utf-8", errors="replace")
        line = before.count("\n") + 1
        column = len(before) - before.rfind("\n")
        raise DllmError(
            f"{path}:{line}:{column}: byte 0x{data[error.start]:02x} is not UTF-8 text",
            hint="save the file as UTF-8 (the encoding YAML configs are read in)",
        ) from None


def apply_overrides(document: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `key.path=value` overrides; values are parsed as YAML scalars (`3`, `true`, `null`)."""
    result = _deep_copy(document)
    for item in overrides:
        key, sep, raw = item.partition("=")
        # `--set "training.steps = 3"`: the key was ' training' ("unknown key; did you mean
        # 'training'?"); white space around the key is no part of it.
        key = ".".join(part.strip() for part in key.split("."))
        if not sep or not key or any(not part or part.split() != [part] for part in key.split(".")):
            raise DllmError(
                f"bad override {_shorten(item)!r}", hint="write --set section.field=value"
            )
        if key.count(".") >= MAX_DEPTH:
            raise DllmError(
                f"--set {_shorten(key)}: nested deeper than {MAX_DEPTH} levels",
                hint="a --set key is a field's path, such as training.steps: check the key "
                "(`dllm config schema` lists the fields)",
            )
        try:
            value = parse_yaml(raw, f"--set {key}", key=key) if raw.strip() else ""
        except yaml.YAMLError:  # not YAML: the value is the text itself
            value = raw
        else:
            _refuse_a_comment(key, raw, value)
        node = result
        parts = key.split(".")
        for index, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                whole = ".".join(parts[: index + 1])
                raise DllmError(
                    f"override {_shorten(item)!r}: {part!r} is a value, not a section",
                    hint=f"set it whole (--set {_shorten(whole)}=VALUE), or check the key: "
                    "`dllm config schema` lists the fields",
                )
            node = child
        node[parts[-1]] = value
    return result


def _refuse_a_comment(key: str, raw: str, value: Any) -> None:
    """A `--set` value with ` #...` in it: YAML reads that as a comment and drops it, so
    `--set "launch.name=run #2"` named the run 'run' and `data.artifact=data/v2 #new` read
    data/v2, without a word. A command-line value holds no comments: refuse and say to quote."""
    comment = trailing_comment(raw)
    if comment is None:
        return
    quoted = '"' + raw.strip().replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise DllmError(
        f"--set {key}: {_shorten(comment)!r} is a YAML comment, so the value would be "
        f"{value!r} without it",
        hint="leave the comment out, or quote the value to keep the '#' as text"
        + (f": --set '{key}={quoted}'" if "'" not in raw else " (YAML double quotes)"),
    )


def load_model(model: type[M], document: Any, source: str) -> M:
    try:
        return model.model_validate(document)
    except ValidationError as error:
        raise DllmError(
            format_validation_error(error, model, source),
            hint="`dllm config schema` lists every field and its type",
        ) from None
    except (TypeError, ValueError, RecursionError) as error:  # exotic YAML values
        raise DllmError(
            f"{source}: invalid document: {error}",
            hint="`dllm config schema` lists every field and its type",
        ) from None


def load_runspec(
    path: str | Path, overrides: list[str] | None = None, world_size: int | None = None
):
    from turbo_dllm.config.validate import check

    written = read_yaml(path)
    try:
        spec = _runspec(written, path, overrides or [])
    except DllmError as error:
        message = _from_the_command_line(error.message, overrides or [])
        raise DllmError(message, hint=error.hint) from None
    try:
        return check(spec, world_size=world_size, source=str(path))
    except DllmError as error:
        if not overrides:
            raise
        message = _sets_that_took_part(error.message, written, path, overrides, world_size)
        raise DllmError(message, hint=error.hint) from None


def _runspec(written: dict[str, Any], path: str | Path, overrides: list[str]):
    """The RunSpec of the file's document `written` with `overrides` applied, its paths
    absolute; not yet checked across fields (`validate.check`)."""
    from turbo_dllm.config.runspec import RunSpec

    document = apply_overrides(written, overrides)
    # a --set path is the shell's, one written in the file the file's (`resolve_paths`)
    command_line_paths(document, overrides, _PATH_FIELDS, Path.cwd(), _names_a_file)
    spec = load_model(RunSpec, document, str(path))
    return resolve_paths(spec, Path(path).resolve().parent)


def _sets_that_took_part(
    message: str,
    written: dict[str, Any],
    path: str | Path,
    overrides: list[str],
    world_size: int | None,
) -> str:
    """A cross-field report (`validate.check`) with each problem a `--set` took part in marked:
    `  - scheduler.warmup_steps: 5 exceeds training.steps (3) (from --set training.steps=3)`.
    The problem sits at a field of the file, so without the mark a user looked in the file for
    the 3. A --set took part where the problem's line is not there (or reads otherwise) once
    that --set is left out; where the spec does not load without it, where the line names its
    key. A problem at the --set's own field says only `(from --set)`, as a single-field one."""
    import re

    from turbo_dllm.config.validate import problems

    by_key: dict[str, list[str]] = {}  # key -> its --set items, as typed
    for item in overrides:
        key = ".".join(part.strip() for part in item.partition("=")[0].split("."))
        by_key.setdefault(key, []).append(item)
    without: dict[str, set[str] | None] = {}  # key -> the problem lines with its --set left out
    for key, items in by_key.items():
        others = [item for item in overrides if item not in items]
        try:
            spec = _runspec(written, path, others)
            without[key] = {f"  - {p}" for p in problems(spec, world_size)}
        except (DllmError, OSError):
            without[key] = None
    lines = []
    for line in message.split("\n"):
        field, colon, _ = line.removeprefix("  - ").partition(": ")
        if line.startswith("  - ") and colon:
            own = [k for k in by_key if field == k or field.startswith((f"{k}.", f"{k}["))]
            took_part = [
                item
                for key, items in by_key.items()
                if (
                    line not in without[key]
                    if without[key] is not None
                    else re.search(rf"(?<![\w.]){re.escape(key)}(?!\w)", line)
                )
                for item in items
            ]
            if own:
                line += " (from --set)"
            elif took_part:
                line += " (from " + " and ".join(f"--set {_shorten(i)}" for i in took_part) + ")"
        lines.append(line)
    return "\n".join(lines)


def _from_the_command_line(message: str, overrides: list[str]) -> str:
    """A validation report whose problems a `--set` made say so (`  - training.steps: ... (got
    'abc') (from --set)`): the report is headed by the file's name, where a user looked for a
    value they had typed on the command line."""
    keys = {}  # key -> what YAML made of its value, where that is a mapping or a list
    for item in overrides:
        key, _, raw = item.partition("=")
        key = ".".join(p.strip() for p in key.split("."))
        keys[key] = _collection(raw, key)
    lines = []
    for line in message.split("\n"):
        path, colon, rest = line.partition(": ")
        field = path.removeprefix("  - ")
        if colon and path.startswith("  - "):
            for key, kind in keys.items():
                if field == key or field.startswith((f"{key}.", f"{key}[")):
                    line = f"{line} (from --set)"
                    if kind is not None and field == key:
                        line += f"; {kind}"
                    break
        lines.append(line)
    return "\n".join(lines)


def _collection(raw: str, key: str) -> str | None:
    """Where YAML reads a `--set` value as a mapping or a list (`v1: final`, `- x`, `[x]`),
    what it did and how to keep the text (a field wanting text then says only "should be a
    valid string"); else None."""
    try:
        value = parse_yaml(raw, f"--set {key}", key=key) if raw.strip() else ""
    except (yaml.YAMLError, DllmError):
        return None
    if not isinstance(value, (dict, list)):
        return None
    kind = "a mapping" if isinstance(value, dict) else "a list"
    quoted = '"' + raw.strip().replace("\\", "\\\\").replace('"', '\\"') + '"'
    how = f"--set '{key}={quoted}'" if "'" not in raw else "YAML double quotes around it"
    return f"YAML read {_shorten(raw.strip())!r} as {kind}: to keep it as text, quote it: {how}"


# The RunSpec fields that name files (`resolve_paths`).
_PATH_FIELDS = (
    "model.path",
    "model.from_config",
    "model.dflash.target",
    "model.dflash.features",
    "data.artifact",
    "eval.artifact",
    "launch.run_dir",
    "checkpoint.dir",
    "checkpoint.resume",
)


def _names_a_file(field: str, value: Any) -> bool:
    if not isinstance(value, str) or not value:
        return False
    if field == "checkpoint.resume":
        return value not in ("auto", "never")
    if field == "model.from_config":  # a preset's name, or a config.json
        return value.endswith(".json") or "/" in value
    return True


def command_line_paths(
    document: dict[str, Any],
    overrides: list[str],
    fields: tuple[str, ...],
    cwd: Path,
    names_a_file: Callable[[str, Any], bool] = lambda field, value: bool(value),
) -> None:
    """A relative path given with `--set` is the shell's, taken against the current folder as
    every command-line path is (`--set checkpoint.resume=runs/a/checkpoints` from the project
    folder, with `--config runs/b/spec.yaml`); one written in the YAML file stays relative to
    the file (the reader's own resolution). In place, before validation. `fields`: the dotted
    fields that name files (a list of paths counts: `source.paths`)."""
    for item in overrides:
        key = ".".join(part.strip() for part in item.partition("=")[0].split("."))
        for field in fields:
            if field != key and not field.startswith(key + "."):
                continue
            node: Any = document
            *parents, last = field.split(".")
            for part in parents:
                node = node.get(part) if isinstance(node, dict) else None
            if not isinstance(node, dict):
                continue
            value = node.get(last)
            if isinstance(value, list):
                node[last] = [
                    absolute_path(v, cwd) if isinstance(v, str) and names_a_file(field, v) else v
                    for v in value
                ]
            elif isinstance(value, str) and names_a_file(field, value):
                node[last] = absolute_path(value, cwd)


def absolute_path(value: str, base_dir: Path) -> str:
    """A path a config names, absolute: `~` and `~user` expanded as a shell would (a `~name` of
    no user here stays as written), then a relative one taken against `base_dir`."""
    expanded = Path(os.path.expanduser(value))
    return str(expanded if expanded.is_absolute() else (base_dir / expanded).resolve())


def resolve_paths(spec, base_dir: Path):
    """Make the spec's relative file paths absolute against `base_dir` (the config's folder)."""

    def absolute(value: str | None) -> str | None:
        return None if value is None else absolute_path(value, base_dir)

    model = spec.model
    from_config = model.from_config
    if from_config and (from_config.endswith(".json") or "/" in from_config):
        from_config = absolute(from_config)
    resume = spec.checkpoint.resume  # auto, never, or a checkpoint's path
    if resume not in ("auto", "never"):
        resume = absolute(resume)
    dflash = model.dflash
    if dflash is not None:
        dflash = dflash.model_copy(
            update={"target": absolute(dflash.target), "features": absolute(dflash.features)}
        )
    return spec.model_copy(
        update={
            "model": model.model_copy(
                update={
                    "path": absolute(model.path),
                    "from_config": from_config,
                    "dflash": dflash,
                }
            ),
            "data": spec.data.model_copy(update={"artifact": absolute(spec.data.artifact)}),
            "eval": spec.eval
            and spec.eval.model_copy(update={"artifact": absolute(spec.eval.artifact)}),
            "launch": spec.launch.model_copy(update={"run_dir": absolute(spec.launch.run_dir)}),
            "checkpoint": spec.checkpoint.model_copy(
                update={"dir": absolute(spec.checkpoint.dir), "resume": resume}
            ),
        }
    )


def format_validation_error(error: ValidationError, model: type[BaseModel], source: str) -> str:
    lines = []
    # A value no member of a union takes gets one error per member, each at the field's path
    # plus the member's tag (`...rope_theta.int`, `...rope_theta.float`): one line per field.
    unions: dict[str, tuple[list[str], str]] = {}
    for item in error.errors():
        loc = [str(p) for p in item["loc"]]
        if loc and _is_union_tag(loc[-1]):
            loc = loc[:-1]
        path = ".".join(loc) or "(top level)"
        if item["type"] == "extra_forbidden":
            names = _field_names_at(model, item["loc"][:-1])
            close = difflib.get_close_matches(loc[-1], names, n=1, cutoff=0.5)
            suggestion = f"; did you mean {close[0]!r}?" if close else ""
            valid = f" (valid: {', '.join(sorted(names))})" if names and not close else ""
            lines.append(f"  - {path}: unknown key{suggestion}{valid}")
            continue
        given = item.get("input")
        if given is None and item["type"] in ("model_type", "dict_type") and loc:
            # `training:` with nothing under it (its fields commented out) is YAML's null
            lines.append(
                f"  - {path}: is empty (a section with nothing under it): give it fields, or "
                f"remove the `{loc[-1]}:` line for the defaults"
            )
            continue
        shown = "" if isinstance(given, (dict, list)) else f" (got {given!r})"
        if isinstance(given, (datetime.date, datetime.time)):
            # YAML reads 2024-01-01 as a date: "got datetime.date(2024, 1, 1)" for a name
            shown = f" (got {given.isoformat()}, which YAML reads as a date: quote it for text)"
        # A validator's own message, without the "Value error, " pydantic puts before it.
        message = item["msg"].removeprefix("Value error, ")
        if path in unions:
            messages = unions[path][0]
            if message not in messages:
                messages.append(message)
            continue
        unions[path] = ([message], shown)
        lines.append(path)  # filled in below, once every member's message is known
    lines = [
        f"  - {line}: {_either(unions[line][0])}{unions[line][1]}" if line in unions else line
        for line in lines
    ]
    count = len(lines)
    return f"{source} has {count} problem{'s' if count > 1 else ''}:\n" + "\n".join(lines)


def _either(messages: list[str]) -> str:
    """'Input should be a valid integer or a valid string' from each member's message."""
    lead = "Input should be "
    first, rest = messages[0], messages[1:]
    if first.startswith(lead):
        rest = [m[len(lead) :] if m.startswith(lead) else m for m in rest]
    return " or ".join([first, *rest])


# The tags pydantic appends to an error's path for the member of a union that refused a value.
_UNION_TAGS = ("int", "float", "bool", "str", "none")
_UNION_TAG_PREFIXES = ("literal[", "function-", "constrained-", "list[", "tuple[", "dict[")


def _is_union_tag(part: str) -> bool:
    return part in _UNION_TAGS or part.startswith(_UNION_TAG_PREFIXES)


def _field_names_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names of the sub-model found by following `loc` from `model`."""
    current: Any = model
    for part in loc:
        current = _submodel(current, part)
        if current is None:
            return []
    return list(current.model_fields) if _is_model(current) else []


def _submodel(annotation: Any, part: Any) -> Any:
    if _is_model(annotation):
        field = annotation.model_fields.get(str(part))
        return _unwrap(field.annotation) if field else None
    if isinstance(part, int):
        args = typing.get_args(annotation)
        return _unwrap(args[0]) if args else None
    # A tagged or plain union: pydantic puts the member's name in the path.
    for arg in typing.get_args(annotation):
        if _is_model(arg) and arg.__name__ == part:
            return arg
    return None


def _unwrap(annotation: Any) -> Any:
    models = [a for a in typing.get_args(annotation) if _is_model(a)]
    if len(models) == 1:
        return models[0]
    return annotation


def _is_model(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, BaseModel)


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


def _shorten(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
