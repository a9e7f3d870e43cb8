"""turbo_dllm.locations: one parser for bundle sources and mirrors."""

from __future__ import annotations

import pytest

from turbo_dllm.errors import DllmError
from turbo_dllm.locations import parse_location
from turbo_dllm.mirror.source import open_mirror


def test_urls_folders_and_file_urls(tmp_path):
    served = parse_location("HTTP://127.0.0.1:8000/m", "mirror")
    assert (served.url, served.host, served.folder) == (
        "HTTP://127.0.0.1:8000/m",
        "127.0.0.1",
        None,
    )
    for spelling in (str(tmp_path), tmp_path.as_uri(), f"file://localhost{tmp_path}"):
        assert parse_location(spelling, "mirror").folder == tmp_path.resolve()
        assert parse_location(spelling, "mirror").url is None


@pytest.mark.parametrize(
    "text, message",
    [
        ("ftp://example.com/x", "unsupported mirror 'ftp://example.com/x'"),
        ("file://server/share", "file:// URLs must name a local path"),
        ("/no/such/folder", "mirror folder '/no/such/folder' does not exist"),
    ],
)
def test_what_is_refused_and_why(text, message):
    with pytest.raises(DllmError, match=message):
        parse_location(text, "mirror")
    with pytest.raises(DllmError, match="file:// URLs" if "file:" in text else "mirror"):
        open_mirror(text)  # mirrors and bundle sources refuse the same spellings


def test_a_file_is_not_called_missing(tmp_path):
    index = tmp_path / "MIRROR.json"
    index.write_text("{}")
    with pytest.raises(DllmError, match="is a file, not a folder"):
        parse_location(str(index), "mirror")  # it exists: "does not exist" misled
