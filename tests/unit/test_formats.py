"""turbo_dllm.formats: the shared format check and validation of files we read back."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict

from turbo_dllm.errors import DllmError
from turbo_dllm.formats import validate_document


class Thing(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: str
    size: int


def check(document):
    return validate_document(
        document, Thing, expected="t.v1", what="thing file", source="x.json", hint="remake it"
    )


def test_a_valid_document_becomes_the_model():
    assert check({"format": "t.v1", "size": 3}) == Thing(format="t.v1", size=3)


@pytest.mark.parametrize("document", [{"size": 3}, {"format": "t.v2", "size": 3}, [1, 2], None])
def test_a_wrong_or_missing_format_names_what_was_found_and_expected(document):
    with pytest.raises(DllmError) as caught:
        check(document)
    found = document.get("format") if isinstance(document, dict) else None
    assert caught.value.message == (
        f"x.json is not a thing file (format {found!r}, expected 't.v1')"
    )
    assert caught.value.hint == "remake it"


def test_every_validation_problem_is_listed_with_its_location():
    with pytest.raises(DllmError) as caught:
        check({"format": "t.v1", "size": "big", "colour": "red"})
    message = caught.value.message
    assert message.startswith("x.json is not a valid thing file: ")
    assert "size: " in message and "colour: " in message
    assert caught.value.hint == "remake it"
