"""Turn one raw record into what the tokenizer needs, or a `BadRecord` that says why not.

Runs inside the tokenizer workers. Each records kind reads its fields by dotted path
(`meta.body`, `turns.0.text`) and checks their types; a problem becomes a `BadRecord` with a
short reason code (counted under `on_error: skip`) and a message that names the field.
"""

from __future__ import annotations

import json
import re
import reprlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from turbo_dllm.data.sources import Oversized
from turbo_dllm.data.spec import (
    ChatRecords,
    PromptCompletionRecords,
    TextRecords,
    TokensRecords,
)

__all__ = ["Extracted", "BadRecord", "extract", "get_field"]


class BadRecord(Exception):
    """A record that cannot become a document. `reason` is a stable code for skip counts."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Extracted:
    """One record's content: exactly one of the fields is set, by records kind."""

    text: str | None = None
    prompt_completion: tuple[str, str] | None = None
    messages: list[dict[str, Any]] | None = None
    ids: np.ndarray | None = None
    loss_mask: np.ndarray | None = None


_MISSING = object()
_INT64 = np.iinfo(np.int64)
# A JSON escape of a UTF-16 surrogate (\ud800-\udfff): only these can make json.loads return a
# string that is not valid Unicode (a lone surrogate), which no tokenizer can encode.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_repr = reprlib.Repr()  # bounded, even for a value nested a thousand deep
_repr.maxlevel, _repr.maxstring, _repr.maxother, _repr.maxlong = 2, 40, 40, 40
_short = _repr.repr


def get_field(record: Any, path: str) -> Any:
    """Follow a dotted path through dicts (keys) and lists (integer parts)."""
    node = record
    for depth, part in enumerate(path.split(".")):
        if isinstance(node, dict):
            child = node.get(part, _MISSING)
        elif isinstance(node, list) and part.isdigit():
            child = node[int(part)] if int(part) < len(node) else _MISSING
        else:
            child = _MISSING
        if child is _MISSING:
            where = ".".join(path.split(".")[:depth]) or "the record"
            keys = (
                f" (keys: {', '.join(str(k)[:40] for k in sorted(map(str, node))[:8])})"
                if isinstance(node, dict)
                else ""
            )
            raise BadRecord(
                "missing_field", f"missing field {path!r}: {where} has no {part!r}{keys}"
            )
        node = child
    return node


def _string(record: Any, path: str) -> str:
    value = get_field(record, path)
    if not isinstance(value, str):
        raise BadRecord("bad_field", f"field {path!r} is {type(value).__name__}, expected a string")
    return value


def _messages(record: Any, path: str) -> list[dict[str, Any]]:
    value = get_field(record, path)
    if not isinstance(value, list) or not value:
        raise BadRecord("bad_field", f"field {path!r} must be a non-empty list of messages")
    for index, message in enumerate(value):
        if not isinstance(message, dict):
            raise BadRecord("bad_field", f"{path}.{index} is not a {{role, content}} object")
        for key in ("role", "content"):
            if key not in message:
                keys = ", ".join(sorted(str(k)[:40] for k in message)[:8]) or "none"
                raise BadRecord("missing_field", f"{path}.{index} has no {key!r} (keys: {keys})")
            if not isinstance(message[key], str):
                raise BadRecord(
                    "bad_field",
                    f"{path}.{index}.{key} must be a string, got {_short(message[key])}",
                )
    return value


def _int_array(value: Any, what: str) -> np.ndarray:
    """`value` (a list of ints or an integer array) as int64 ids; `what` names it in errors."""
    if isinstance(value, np.ndarray):
        array = value
        if array.dtype == np.uint64 and array.size and array.max() > _INT64.max:
            too_large = int(array[np.argmax(array > _INT64.max)])
            raise BadRecord(
                "token_out_of_range", f"{what} holds token id {too_large}, outside any vocabulary"
            )
    elif isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        try:
            array = np.asarray(value, dtype=np.int64)
        except OverflowError:
            too_large = next(v for v in value if not _INT64.min <= v <= _INT64.max)
            raise BadRecord(
                "token_out_of_range",
                f"{what} holds token id {_short(too_large)}, outside any vocabulary",
            ) from None
    else:
        raise BadRecord("bad_field", f"{what} must be a list of integer token ids")
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise BadRecord("bad_field", f"{what} must be a 1-D list of integer token ids")
    return array.astype(np.int64, copy=False)


def _tokens(record: Any, spec: TokensRecords, want_mask: bool) -> Extracted:
    ids = _int_array(get_field(record, spec.field), f"field {spec.field!r}")
    if not want_mask or spec.loss_mask_field is None:
        return Extracted(ids=ids)
    raw = get_field(record, spec.loss_mask_field)
    if isinstance(raw, list) and all(v in (0, 1) for v in raw):
        mask = np.asarray(raw, dtype=np.uint8)
    else:
        raise BadRecord("bad_field", f"field {spec.loss_mask_field!r} must be a list of 0/1 values")
    if len(mask) != len(ids):
        raise BadRecord(
            "bad_field",
            f"field {spec.loss_mask_field!r} has {len(mask)} values but "
            f"{spec.field!r} has {len(ids)} ids",
        )
    return Extracted(ids=ids, loss_mask=mask)


def extract(payload: str, item: Any, records, supervision: str) -> Extracted:
    """The content of one raw item (a JSON line, a row, a text or an id array)."""
    if isinstance(item, Oversized):
        raise BadRecord("too_large", item.message())
    if payload == "text":
        try:
            return Extracted(text=item.decode("utf-8"))
        except UnicodeDecodeError as error:
            raise BadRecord(
                "bad_text", f"not UTF-8 text ({error.reason} at byte {error.start})"
            ) from None
    if payload == "ids":
        return Extracted(ids=_int_array(np.asarray(item), "the array"))
    check_unicode = False
    if payload in ("json", "json_ids"):
        if item[:3] == b"\xef\xbb\xbf":  # a UTF-8 byte order mark on the first line
            item = item[3:]
        check_unicode = _SURROGATE_ESCAPE.search(item) is not None
        try:
            item = json.loads(item)
        except json.JSONDecodeError as error:
            error = _line_error(item, error)
            raise BadRecord(
                "malformed_json", f"malformed JSON: {error.msg} (column {error.colno})"
            ) from None
        except ValueError as error:  # bytes that are not UTF-8
            raise BadRecord("malformed_json", f"malformed JSON: {error}") from None
        except RecursionError:  # the decoder recurses once per [ or {
            raise BadRecord("malformed_json", "malformed JSON: nested too deeply") from None
        if payload == "json_ids":
            if isinstance(item, dict):  # {"input_ids": [...]}: the jsonl source reads those
                keys = ", ".join(sorted(str(k)[:40] for k in item)[:8]) or "none"
                raise BadRecord(
                    "bad_field",
                    f"the line is a JSON object (keys: {keys}), not a list of token ids; a "
                    "token_ids source reads lines that are lists: for objects that hold ids "
                    "use source {kind: jsonl} with records {kind: tokens, field: KEY}",
                )
            return Extracted(ids=_int_array(item, "the line"))
        if not isinstance(item, dict):
            raise BadRecord("malformed_json", f"expected a JSON object, got {type(item).__name__}")
    extracted = _extract_record(item, records, supervision)
    if check_unicode:
        _check_unicode(extracted, records)
    return extracted


def _line_error(line: bytes, error: json.JSONDecodeError) -> json.JSONDecodeError:
    """The decoder's error for `line` without its line ending: the ending is not part of the
    record, and a line cut short reached it (a string's end read 'Invalid control character',
    a value's 'Expecting value (column 1)' of the line after the newline)."""
    stripped = line.rstrip(b"\r\n")
    if len(stripped) == len(line):
        return error
    try:
        json.loads(stripped)
    except json.JSONDecodeError as better:
        return better
    except (ValueError, RecursionError):
        pass
    return error


def _extract_record(item: Any, records, supervision: str) -> Extracted:
    if isinstance(records, TextRecords):
        return Extracted(text=_string(item, records.field))
    if isinstance(records, PromptCompletionRecords):
        return Extracted(
            prompt_completion=(
                _string(item, records.prompt_field),
                _string(item, records.completion_field),
            )
        )
    if isinstance(records, ChatRecords):
        return Extracted(messages=_messages(item, records.field))
    if isinstance(records, TokensRecords):
        return _tokens(item, records, want_mask=supervision == "provided")
    raise AssertionError(f"unhandled records {records!r}")


def _check_unicode(extracted: Extracted, records) -> None:
    """Refuse text holding a lone surrogate (JSON `"\\ud800"`): it has no UTF-8 encoding."""
    texts: list[tuple[str, str]] = []
    if extracted.text is not None:
        texts.append((records.field, extracted.text))
    if extracted.prompt_completion is not None:
        fields = (records.prompt_field, records.completion_field)
        texts += zip(fields, extracted.prompt_completion, strict=True)
    for index, message in enumerate(extracted.messages or []):
        texts += [(f"{records.field}.{index}.{key}", message[key]) for key in ("role", "content")]
    for path, text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            raise BadRecord(
                "bad_text",
                f"field {path!r} is not valid Unicode: a lone surrogate "
                f"{text[error.start]!r} at character {error.start}",
            ) from None
