"""Where a bundle index or a mirror lives: a folder, `file:///folder`, or an `http(s)://` URL.

`dllm bundle install --index/--mirror`, `dllm env sync --mirror` and `dllm mirror verify` all
parse their location here, so they accept and refuse the same spellings. Parsing touches no
network; a folder must exist.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple
from urllib.parse import unquote, urlparse

from turbo_dllm.errors import DllmError

__all__ = ["Location", "parse_location"]


class Location(NamedTuple):  # not a dataclass: `dllm bundle install` keeps its imports lean
    text: str  # as the user wrote it
    url: str | None = None  # an http(s) URL
    host: str = ""  # its lower-cased host name
    folder: Path | None = None  # an existing local folder, resolved


def parse_location(text: str, what: str) -> Location:
    """`text` as a URL or a local folder; `what` names it in errors ("mirror", ...)."""
    parsed = urlparse(text)
    if parsed.scheme in ("http", "https"):
        return Location(text, url=text, host=(parsed.hostname or "").lower())
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise DllmError(f"{text!r}: file:// URLs must name a local path (file:///path)")
        path = Path(unquote(parsed.path))
    elif len(parsed.scheme) > 1:  # one letter would be a Windows drive, i.e. a path
        raise DllmError(
            f"unsupported {what} {text!r}", hint="use a folder, file:///folder, http:// or https://"
        )
    else:
        path = Path(text)
    folder = path.expanduser().resolve()
    if not folder.is_dir():
        # A file there (say the mirror's MIRROR.json) exists: name what is wrong with it.
        state = "is a file, not a folder" if folder.exists() else "does not exist"
        raise DllmError(f"{what} folder {str(folder)!r} {state}", hint="check the path")
    return Location(text, folder=folder)
