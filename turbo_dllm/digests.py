"""The sha256 of large files we only read (model weights), remembered across processes.

A launch records the sha256 of every weight file of `model.path` (and of a drafter's target),
and a drafter run, its export and its evaluation fingerprint the target again: for an 8B model
that is 16 GB read each time, tens of seconds per launch on fast storage, minutes on a shared
file system. `sha256_files` reads the files in parallel threads (hashlib releases the GIL) and
keeps each digest in `<dllm home>/digests.json` under the file's stamp: device, inode, size,
mtime and ctime. Any write to a file changes its ctime (which no user can set back), so a file
whose stamp matches is the file that was read, and its digest is taken without reading it.
File times tick coarsely (a few ms locally, up to seconds on network file systems), so two
writes in one tick can leave the same stamp: a file changed less than `_SETTLE_NS` before it was
read is not remembered (git's "racily clean" files, handled the same way).

Only for identity records (provenance, fingerprints). What verifies downloaded or unpacked
content (bundles, packs, mirrors) reads the bytes every time.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from turbo_dllm.fsutil import sha256_file, write_atomic

__all__ = ["CACHE_NAME", "sha256_files"]

CACHE_NAME = "digests.json"
_MAX_ENTRIES = 20_000  # the oldest are dropped beyond this (~3 MB of JSON)
_MAX_THREADS = 8
_SETTLE_NS = 3_000_000_000


def sha256_files(paths: Sequence[str | Path]) -> list[str]:
    """The sha256 hex digest of each file, in order (OSError as `open` raises it)."""
    settled = time.time_ns() - _SETTLE_NS
    stamps = [_stamp(path) for path in paths]
    cache = _load()
    digests: list[str | None] = [_cached(cache, stamp) for stamp in stamps]
    missing = [i for i, digest in enumerate(digests) if digest is None]
    if missing:
        threads = min(len(missing), _MAX_THREADS, os.cpu_count() or 1)
        with ThreadPoolExecutor(threads) as pool:
            read = pool.map(lambda i: sha256_file(paths[i]), missing)
            for i, digest in zip(missing, read, strict=True):
                digests[i] = digest
                # Stamped before reading: a write while it was read changes the ctime, so
                # such a file never matches this entry again.
                cache.pop(stamps[i][0], None)
                if stamps[i][1][2] < settled:
                    cache[stamps[i][0]] = {"stamp": stamps[i][1], "sha256": digest}
        _save(cache)
    return digests  # type: ignore[return-value]


def _stamp(path: str | Path) -> tuple[str, list[int]]:
    """(device:inode, [size, mtime_ns, ctime_ns]) of the file `path` names."""
    stat = os.stat(path)
    return f"{stat.st_dev}:{stat.st_ino}", [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]


def _cached(cache: dict, stamp: tuple[str, list[int]]) -> str | None:
    entry = cache.get(stamp[0])
    if isinstance(entry, dict) and entry.get("stamp") == stamp[1]:
        digest = entry.get("sha256")
        if isinstance(digest, str) and len(digest) == 64:
            return digest
    return None


def _cache_path() -> Path:
    from turbo_dllm.paths import dllm_home

    return dllm_home() / CACHE_NAME


def _load() -> dict:
    """The cache, or an empty one when it is missing, unreadable or not ours (never an error:
    it only saves reading)."""
    try:
        cache = json.loads(_cache_path().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(cache, dict):
        return {}
    return {key: entry for key, entry in cache.items() if isinstance(entry, dict)}


def _save(cache: dict) -> None:
    """Write the cache (whole or not at all); a home that cannot be written keeps none."""
    keep = dict(list(cache.items())[-_MAX_ENTRIES:])
    path = _cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(keep, separators=(",", ":")))
    except OSError:
        pass
