"""Which manifest a command uses: an explicit file, a mirror's, or the packaged one.

Order: `--manifest FILE`; else the mirror's `manifests/` when a mirror is given (an air-gapped
host trusts what it carried in: each manifest must be the file `MIRROR.json` lists, by sha256,
and `dllm mirror verify` checks the rest); else the manifests shipped with turbo-dllm.
`--target auto` (or none) picks the one that fits this host.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from turbo_dllm.envs.incomplete import refuse_incomplete
from turbo_dllm.envs.manifest import EnvManifest, load_manifest, parse_manifest
from turbo_dllm.envs.targets import auto_target, manifest_dirs
from turbo_dllm.errors import DllmError

__all__ = [
    "COMPARE_WITH_ANOTHER",
    "RECORDED_MANIFEST",
    "SYNCED_COPY",
    "available_targets",
    "environment_manifest",
    "recorded_manifest_path",
    "select_manifest",
]

RECORDED_MANIFEST = "dllm-env-manifest.toml"
SYNCED_COPY = "synced copy"  # how environment_manifest names a venv's own copy as the origin
# The end of the hint on a damaged synced copy: `dllm env check` has these flags, `dllm doctor`
# has not (its environment check says `dllm env check --target NAME` instead).
COMPARE_WITH_ANOTHER = "pass --target/--manifest to compare with another manifest"


def available_targets(mirror=None) -> dict[str, str]:
    """{target: where its manifest is} for the mirror (if given) or the packaged manifests."""
    if mirror is not None:
        index = mirror.index()
        return {
            Path(f.path).stem: f"{mirror.location}/{f.path}"
            for f in index.of_kind("manifest")
            if f.path.startswith("manifests/")
        }
    found: dict[str, str] = {}
    for folder in manifest_dirs():
        for path in sorted(folder.glob("*.toml")):
            found.setdefault(path.stem, str(path))
    return found


def select_manifest(
    target: str | None = None, *, mirror=None, manifest_file: str | Path | None = None
) -> EnvManifest:
    if manifest_file is not None:
        manifest = load_manifest(manifest_file)
        if target not in (None, "auto") and manifest.target != target:
            raise DllmError(
                f"{manifest_file} is the manifest of {manifest.target}, not {target}",
                hint="drop --target or pass the matching manifest",
            )
        return manifest
    candidates = available_targets(mirror)
    where = f"mirror {mirror.location}" if mirror is not None else "turbo-dllm's manifests/"
    if not candidates:
        raise DllmError(
            f"no environment manifests in {where}",
            hint="generate one with `dllm env lock --target NAME` or pass --manifest FILE",
        )
    if target in (None, "auto"):
        loaded = {name: _load(name, location, mirror) for name, location in candidates.items()}
        return loaded[auto_target(loaded)]
    if target not in candidates:
        raise DllmError(
            f"no environment manifest for target {target} in {where}",
            hint=f"available: {', '.join(sorted(candidates))}",
        )
    return _load(target, candidates[target], mirror)


def _load(target: str, location: str, mirror) -> EnvManifest:
    if mirror is not None:
        text = mirror.manifest_text(target)
        if text is None:
            raise DllmError(
                f"mirror {mirror.location} lists manifests/{target}.toml but lacks it",
                hint=f"dllm mirror verify {shlex.quote(mirror.location)} lists what it is missing",
            )
        _check_listed(mirror, f"manifests/{target}.toml", text)
        manifest = parse_manifest(text, location)
    else:
        manifest = load_manifest(location)
    if manifest.target != target:
        raise DllmError(
            f"{location} declares target {manifest.target}, not {target}",
            hint=f"a manifest is named after its target: rename it {manifest.target}.toml, or "
            "pass it with --manifest FILE",
        )
    return manifest


def _check_listed(mirror, relative: str, text: str) -> None:
    """A mirror's manifest must be the file MIRROR.json lists (sha256): one changed after
    `dllm mirror create` (edited, torn by a copy) is not installed from, whether or not
    `dllm mirror verify` was run first. The wheels are checked by the manifest's hashes, the
    manifest by MIRROR.json's."""
    import hashlib

    listed = mirror.index().file(relative)
    actual = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if listed is not None and listed.sha256 == actual:
        return
    said = "does not list it" if listed is None else f"lists sha256 {listed.sha256[:16]}..."
    raise DllmError(
        f"mirror {mirror.location}: {relative} is not the file MIRROR.json lists (sha256 "
        f"{actual[:16]}..., MIRROR.json {said}): changed after the mirror was made",
        hint=f"`dllm mirror verify {shlex.quote(mirror.location)}` names every damaged file; copy the mirror "
        "again (or recreate it with `dllm mirror create`)",
    )


def recorded_manifest_path(prefix: str | Path) -> Path:
    """Where `dllm env sync` leaves a copy of the manifest it installed: the venv's root."""
    return Path(prefix) / RECORDED_MANIFEST


def environment_manifest(
    prefix: str | Path | None = None,
    target: str | None = None,
    *,
    mirror=None,
    manifest_file: str | Path | None = None,
) -> tuple[EnvManifest, str]:
    """The manifest an environment should match, and where it came from.

    Without an explicit choice, a venv made by `dllm env sync` answers for itself (the copy sync
    left at its root); any other environment gets the packaged manifest of this host's target.
    A venv a sync did not finish (killed midway) matches no manifest: an error that says so.
    """
    refuse_incomplete(sys.prefix if prefix is None else prefix)
    if manifest_file is None and mirror is None and target in (None, "auto"):
        venv = Path(sys.prefix if prefix is None else prefix)
        recorded = recorded_manifest_path(venv)
        if recorded.is_file():
            try:
                return load_manifest(recorded), f"{SYNCED_COPY} {recorded}"
            except DllmError as error:  # its hint would be the packaged manifests' (re-lock)
                raise DllmError(
                    error.message,
                    # The command alone between backquotes: pasted, it runs (it was followed
                    # by "; --target NAME where ...", which bash ran as a command too).
                    hint=f"it is the copy `dllm env sync` left in {venv} (damaged or edited): "
                    f"sync again to rewrite it: `dllm env sync --venv {shlex.quote(str(venv))}` "
                    "(add --target NAME where auto picks another), "
                    f"or {COMPARE_WITH_ANOTHER}",
                ) from None
    manifest = select_manifest(target, mirror=mirror, manifest_file=manifest_file)
    origin = (
        str(manifest_file)
        if manifest_file
        else (f"mirror {mirror.location}" if mirror is not None else "packaged")
    )
    return manifest, origin
