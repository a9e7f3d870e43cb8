"""Triton's compiled kernels, carried in a bundle so no host compiles them at first use.

Triton keeps each compiled kernel in `<cache dir>/<key>/`: the binary (`.cubin`), its IRs, a
metadata `.json` and a group file `__grp__<name>.json` listing the group's files by **absolute
path**. A lookup keeps the listed files that exist and is a hit when the metadata file is among
them; the kernel it then builds reads the metadata and the files beside it, and a launch needs
only the binary. The key hashes
the kernel's source and dependencies, its specialisation (constexprs, dtypes, argument
divisibility), the compile options, the target GPU and the Triton build, so an entry made on one
host is valid on every host with the same Triton and GPU architecture, which a bundle's target
pins.

`collect` takes a cache a build filled (a fresh folder: only the op's kernels are in it) and
returns each entry's metadata and binary, with the group files listing just those, relative, so
the bundle holds no path of the build host and two builds give the same bytes. The IRs (`.ttir`,
`.ttgir`, `.llir`, `.ptx`, `.source`) are left out: Triton keeps them for inspection, and they
were 38 of the 46.5 MB an sm90 bundle unpacked to and 111 of its 184 files, which every install
unpacked and every process's first launch hashed. `seed` writes a bundle's entries into the cache in
effect, group files last and with this cache's paths, so Triton finds them on first launch.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

__all__ = ["GROUP_PREFIX", "LAUNCH_SUFFIXES", "collect", "seed", "triton_cache_dir"]

GROUP_PREFIX = "__grp__"
# What a launch reads from an entry: the metadata and the binary (`.cubin` on CUDA, `.hsaco` on
# ROCm); the rest of a group is IR kept for inspection.
LAUNCH_SUFFIXES = (".json", ".cubin", ".hsaco")


def triton_cache_dir() -> Path:
    """The folder Triton compiles into in this process (TRITON_CACHE_DIR, else its default)."""
    configured = os.environ.get("TRITON_CACHE_DIR")
    if configured:
        return Path(configured)
    try:
        from triton import knobs

        return Path(knobs.cache.dir)
    except (ImportError, AttributeError):
        return Path.home() / ".triton" / "cache"


def collect(cache_dir: Path) -> dict[str, bytes]:
    """`<key>/<file>` -> bytes of every complete entry under `cache_dir`: its metadata and
    binary, and its group files listing just those, relative.

    Locks, temporary folders, IRs and entries without a group file (a compile that did not
    finish) are left out."""
    files: dict[str, bytes] = {}
    for entry in sorted(p for p in cache_dir.iterdir() if p.is_dir()):
        groups = sorted(entry.glob(f"{GROUP_PREFIX}*.json"))
        if not groups:
            continue
        members: set[str] = set()
        for group in groups:
            children = json.loads(group.read_text())["child_paths"]
            relative = {
                name: Path(path).name
                for name, path in sorted(children.items())
                if name.endswith(LAUNCH_SUFFIXES)
            }
            members.update(relative.values())
            text = json.dumps({"child_paths": relative}, sort_keys=True)
            files[f"{entry.name}/{group.name}"] = text.encode()
        for name in sorted(members):
            files[f"{entry.name}/{name}"] = (entry / name).read_bytes()
    return files


def seed(shipped: Path, cache_dir: Path) -> int:
    """Write the entries under `shipped` (as `collect` laid them out) into `cache_dir`; entries
    already complete there are kept. Returns how many entries were written."""
    written = 0
    for entry in sorted(p for p in shipped.iterdir() if p.is_dir()):
        target = cache_dir / entry.name
        groups = sorted(entry.glob(f"{GROUP_PREFIX}*.json"))
        if not groups or all((target / g.name).is_file() for g in groups):
            continue
        target.mkdir(parents=True, exist_ok=True)
        for member in sorted(entry.iterdir()):
            if not member.name.startswith(GROUP_PREFIX):
                _write_atomic(target / member.name, member.read_bytes())
        for group in groups:  # last: an entry is visible to Triton only once it is whole
            children = json.loads(group.read_text())["child_paths"]
            absolute = {name: str(target / file) for name, file in children.items()}
            _write_atomic(target / group.name, json.dumps({"child_paths": absolute}).encode())
        written += 1
    return written


def _write_atomic(path: Path, data: bytes) -> None:
    """Concurrent workers seeding one cache never expose a half-written file."""
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
