"""A mirror to read from: a folder (`DIR`, `file://DIR`) or a served one (`http(s)://HOST:PORT`).

Readers (`dllm env sync --mirror`, `dllm mirror verify`) go through `MirrorSource`, so a folder
carried to an air-gapped machine and the same folder served on loopback behave the same. The
bytes come through the same `Source` a bundle install reads (bundles/sources.py: one reader of
mirror folders and served mirrors, with its transfer deadline and bounded restarts).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path

from turbo_dllm.bundles.sources import (
    LocalSource,
    NotFound,
    Source,
    TransientError,
    open_source,
    transfer_deadline,
)
from turbo_dllm.errors import DllmError
from turbo_dllm.formats import validate_document
from turbo_dllm.locations import parse_location
from turbo_dllm.mirror.layout import MIRROR_FILE, MIRROR_FORMAT, MirrorIndex, not_a_mirror

__all__ = ["MirrorSource", "open_mirror"]

MAX_DOCUMENT_BYTES = 64 * 1024 * 1024  # MIRROR.json, manifests, catalogs, pages


@dataclass(frozen=True)
class MirrorSource:
    location: str  # as the user wrote it
    local: Path | None  # the folder, for a local mirror
    url: str | None  # the base URL (trailing slash), for a served mirror
    source: Source  # the reader, shared with bundle installs (bundles/sources.py)

    @property
    def is_local(self) -> bool:
        return self.local is not None

    @property
    def simple_url(self) -> str:
        """The PEP 503 index root, for pip's and uv's `--index-url`; a mirror made without
        wheels has none (`require_wheels` says so first)."""
        if self.local is not None:
            return (self.local / "simple").as_uri() + "/"
        return f"{self.url}simple/"

    def read_bytes(self, relative: str, limit: int | None = None) -> bytes | None:
        """A file of the mirror, or None when the mirror does not have it; a file over `limit`
        bytes is an error (a served mirror is not trusted to send a bounded amount)."""
        limit = MAX_DOCUMENT_BYTES if limit is None else limit
        chunks = self._chunks(relative)
        if chunks is None:
            return None
        data = bytearray()
        for chunk in chunks:
            data += chunk
            if len(data) > limit:
                chunks.close()
                raise DllmError(
                    f"{self.location}: {relative} is over the {limit}-byte cap",
                    hint="the mirror serves something else under that name: check the mirror's "
                    "URL, and `dllm mirror verify DIR` on the mirror's folder",
                )
        return bytes(data)

    def digest(self, relative: str, limit: int) -> tuple[str, int] | None:
        """(sha256, size) of a file of the mirror, read in chunks; reading stops past `limit`
        bytes (the size then says so). None when the mirror does not have it."""
        chunks = self._chunks(relative)
        if chunks is None:
            return None
        digest, size = hashlib.sha256(), 0
        for chunk in chunks:
            digest.update(chunk)
            size += len(chunk)
            if size > limit:
                chunks.close()
                break
        return digest.hexdigest(), size

    def _chunks(self, relative: str) -> Generator[bytes, None, None] | None:
        """The file's bytes as they arrive, or None when the mirror does not have it."""
        try:
            opened = self.source.open(relative, 0, transfer_deadline().at)
        except NotFound:
            return None
        except TransientError as error:
            raise DllmError(
                f"cannot read {relative} from the mirror {self.location}: {error}",
                hint="start it with `dllm mirror serve DIR` or pass --mirror DIR",
            ) from None
        return self._stream(opened, relative)

    def _stream(self, opened, relative: str) -> Generator[bytes, None, None]:
        try:
            yield from opened.chunks
        except TransientError as error:
            raise DllmError(
                f"{self.location}: {relative} broke off: {error}",
                hint="check that the mirror's server still runs (`dllm mirror serve DIR`), then "
                "run the command again",
            ) from None
        finally:
            opened.close()

    def require_wheels(self, otherwise: str = "") -> None:
        """Refuse a mirror made without wheels where its package index is needed: it has no
        simple/ index, and `--index-url M/simple/` would name nothing. `otherwise`: the
        command's own way around it, added to the hint."""
        index = self.index()
        if index.project is None and not any(f.kind == "wheel" for f in index.files):
            raise DllmError(
                f"mirror {self.location} carries no wheels: it has no index for --index-url",
                hint="recreate it with `dllm mirror create --with-wheels` (or --wheels-from "
                f"DIR){otherwise}",
            )

    def index(self) -> MirrorIndex:
        raw = self.read_bytes(MIRROR_FILE)
        if raw is None:
            raise not_a_mirror(self.location)
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as error:  # RecursionError: nested too deeply
            raise DllmError(
                f"{self.location}/{MIRROR_FILE}: not JSON: {error}",
                hint=f"{MIRROR_FILE} is damaged: copy the mirror again whole, or make it again "
                "with `dllm mirror create ... --force`",
            ) from None
        return validate_document(
            data,
            MirrorIndex,
            expected=MIRROR_FORMAT,
            what="mirror index",
            source=f"{self.location}/{MIRROR_FILE}",
            hint="recreate the mirror with this version of dllm",
        )

    def manifest_text(self, target: str) -> str | None:
        relative = f"manifests/{target}.toml"
        raw = self.read_bytes(relative)
        if raw is None:
            return None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DllmError(
                f"{self.location}: {relative} is not UTF-8 text ({error.reason} at byte "
                f"{error.start}): the file is damaged",
                hint="`dllm mirror verify` names every damaged file; copy the mirror again",
            ) from None


def open_mirror(location: str | Path) -> MirrorSource:
    """`DIR`, `file:///DIR` or `http(s)://HOST[:PORT][/PREFIX]`."""
    text = str(location)
    where = parse_location(text, "mirror")
    if where.url is not None:
        url = where.url.rstrip("/") + "/"
        return MirrorSource(text, None, url, open_source(url))
    return MirrorSource(text, where.folder, None, LocalSource(where.folder, text))
