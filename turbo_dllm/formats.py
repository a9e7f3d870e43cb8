"""Reading back our versioned files: the `format` check and validation every reader shares.

Each reader parses its own bytes (JSON, TOML, a file or a mirror) and hands the document here;
a wrong or missing `format` and a document that fails its model raise the same two `DllmError`
shapes everywhere, naming the source, the expected format and every problem found.
`read_json_record` reads one JSON file too, for a run dir's status records, which share it.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from turbo_dllm.errors import DllmError, describe_os_error, describe_validation_error

__all__ = ["flatten", "read_json_record", "validate_document"]

Model = TypeVar("Model", bound=BaseModel)


def validate_document(
    document: object,
    model: type[Model],
    *,
    expected: str,
    what: str,
    source: str,
    hint: str | None = None,
    limit: int = 8,
) -> Model:
    """`document` as `model` if its `format` is `expected`; else a DllmError about `source`.

    `what` names the file for people ("run manifest"); `hint` says how to get a good one.
    """
    found = document.get("format") if isinstance(document, dict) else None
    if found != expected:
        raise DllmError(
            f"{source} is not {_article(what)} {what} (format {found!r}, expected {expected!r})",
            hint=hint,
        )
    try:
        return model.model_validate(document)
    except ValidationError as error:
        problems = describe_validation_error(error, limit=limit)
        raise DllmError(f"{source} is not a valid {what}: {problems}", hint=hint) from None


def read_json_record(
    path: Path, model: type[Model], *, expected: str, what: str, writer: str, without: str
) -> Model | None:
    """The JSON record at `path` as `model`, or None where there is no such file: a run dir's
    status records (result.json, launcher.json, slurm_job.json), which a run may not have yet.

    One that cannot be read (torn, not UTF-8, nested past the parser's depth), of another
    format or invalid is a DllmError naming it; its hint says who writes it (`writer`) and
    what removing it makes of the run (`without`), the way on.
    """
    hint = (
        f"{writer}: this one was torn, edited or written by another version of turbo-dllm. "
        f"Remove it (rm {shlex.quote(str(path))}) and {without}"
    )
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except OSError as error:  # permission denied, a folder in its place: not torn
        message, os_hint = describe_os_error(error)
        raise DllmError(f"cannot read {what} {message}", hint=os_hint) from None
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError
        why = "nested deeper than JSON is parsed" if isinstance(error, RecursionError) else error
        raise DllmError(f"cannot read {what} {str(path)!r}: {why}", hint=hint) from None
    return validate_document(
        document, model, expected=expected, what=what, source=str(path), hint=hint
    )


def _article(what: str) -> str:
    """'a run manifest', 'an environment manifest'."""
    return "an" if what[:1].lower() in "aeiou" else "a"


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """A JSON document's leaves by dotted path, for field-by-field comparison of two documents
    (a replay's drift, a compile pack's spec): nested dicts -> {"a.b.c": leaf}; lists of dicts
    index as `a[0].b`, other lists are leaves; an empty dict or list is a leaf of its own."""
    out: dict[str, Any] = {}
    if isinstance(value, dict):
        if not value and prefix:
            out[prefix] = {}
        for key in sorted(value, key=str):
            out.update(flatten(value[key], f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(value, list) and any(isinstance(item, dict) for item in value):
        for index, item in enumerate(value):
            out.update(flatten(item, f"{prefix}[{index}]"))
        if not value:
            out[prefix] = []
    else:
        out[prefix] = value
    return out
