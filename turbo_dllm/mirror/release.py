"""What a mirror carries besides wheels: the targets' manifests, the release catalog, bundles.

The catalog and bundles are fetched with the bundles' own code (`turbo_dllm.bundles.fetch`) and
trusted the way `dllm bundle install` trusts them: the catalog must hash to its `releases.lock`
pin (or `--catalog-sha256`), each bundle to its catalog entry. The catalog is copied byte for
byte, so its hash, and so its pin, holds in the mirror too.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from turbo_dllm.envs.manifest import EnvManifest, load_manifest
from turbo_dllm.errors import DllmError

__all__ = ["add_release", "mirror_manifests"]


def mirror_manifests(targets: str, manifest_files: list[str]) -> list[EnvManifest]:
    """The manifests to mirror: `--manifest` files, plus `--targets` names / `all` / `auto`.

    `auto` (the default) means this host's target, unless manifest files were given.
    """
    from turbo_dllm.envs.select import available_targets, select_manifest

    chosen: dict[str, EnvManifest] = {}
    for file in manifest_files:
        manifest = load_manifest(file)
        if manifest.target in chosen:
            raise DllmError(
                f"two --manifest files for target {manifest.target}",
                hint=f"pass one environment manifest per target: drop one of those for "
                f"{manifest.target}",
            )
        chosen[manifest.target] = manifest
    names = [n.strip() for n in targets.split(",") if n.strip()]
    if names == ["auto"]:
        if chosen:
            return list(chosen.values())
        manifest = select_manifest("auto")
        return [manifest]
    if names == ["all"]:
        names = sorted(available_targets())
    for name in names:
        if name not in chosen:
            chosen[name] = select_manifest(name)
    return [chosen[n] for n in sorted(chosen)]


def add_release(plan, staging: Path) -> None:
    """Copy the release catalog and the manifests' bundles from `plan.bundles_from`."""
    from turbo_dllm.bundles.archive import BundleRejected
    from turbo_dllm.bundles.catalog import (
        MAX_CATALOG_BYTES,
        catalog_path,
        parse_catalog,
        read_releases_lock,
        sha256_bytes,
        trusted_catalog_sha256,
    )
    from turbo_dllm.bundles.fetch import INDEX_VARIABLE, download, open_source
    from turbo_dllm.bundles.sources import NotFound

    if not plan.bundles_from and not os.environ.get(INDEX_VARIABLE):
        raise DllmError(
            f"where do release {plan.release}'s catalog and bundles come from?",
            hint=f"pass --from URL|DIR (a bundle index or a published folder), or set {INDEX_VARIABLE}",
        )
    expected = trusted_catalog_sha256(plan.release, read_releases_lock(), plan.catalog_sha256)
    source = open_source(plan.bundles_from)
    relative = catalog_path(plan.release)
    data = source.read_small(relative, MAX_CATALOG_BYTES)
    actual = sha256_bytes(data)
    if actual != expected:
        raise BundleRejected(
            f"catalog {source.url(relative)} has sha256 {actual}, but the release pins {expected}",
            hint="mirror from the official index or a faithful copy of it",
        )
    catalog = parse_catalog(data, source.url(relative))
    if catalog.release != plan.release:
        raise BundleRejected(
            f"{source.url(relative)} is the catalog of {catalog.release!r}",
            hint="the index serves another release's catalog under this release's name: mirror "
            "from the official index or a faithful copy of it",
        )
    (staging / relative).parent.mkdir(parents=True, exist_ok=True)
    (staging / relative).write_bytes(data)
    from turbo_dllm.mirror.create import downloads_folder, place

    bundles_dir = staging / "bundles"
    # Next to DIR, not in staging: a create that fails or is stopped keeps what it downloaded
    # (a `.part` to resume, or whole archives, hashed again when used).
    downloads = downloads_folder(plan.dest.absolute()) / "bundles"
    for manifest in plan.manifests:
        entry = next((e for e in catalog.bundles if str(e.target) == manifest.bundle_target), None)
        if entry is None:
            listed = ", ".join(str(e.target) for e in catalog.bundles) or "none"
            raise DllmError(
                f"release {plan.release} has no bundle for {manifest.bundle_target} "
                f"(the environment of target {manifest.target}); it has: {listed}",
                hint="build and publish one (`dllm bundle build`, `dllm bundle publish`)",
            )
        dest = bundles_dir / entry.file
        if dest.exists():
            continue
        print(f"fetching {entry.file}", file=sys.stderr)
        try:
            archive = download(
                source,
                f"bundles/{entry.file}",
                sha256=entry.sha256,
                size=entry.size,
                dest_dir=downloads,
            )
        except NotFound as error:  # the catalog was there: --from and the release are right
            raise DllmError(
                f"{error.message}: the release's catalog lists it, but {source.location} does "
                "not hold it",
                hint="that index is incomplete (a copy or sync that stopped?): copy its bundles/ "
                "again whole, or pass another --from",
            ) from None
        bundles_dir.mkdir(exist_ok=True)
        place(archive, dest)  # the download stays until the mirror is in place
