"""Reading back our versioned files: the `format` check and validation every reader shares.

Each reader parses its own bytes (JSON, TOML, a file or a mirror) and hands the document here;
a wrong or missing `format` and a document that fails its model raise the same two `DllmError`
shapes everywhere, naming the source, the expected format and every problem found.
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError

from turbo_dllm.errors import DllmError, describe_validation_error

__all__ = ["validate_document"]

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


def _article(what: str) -> str:
    """'a run manifest', 'an environment manifest'."""
    return "an" if what[:1].lower() in "aeiou" else "a"
