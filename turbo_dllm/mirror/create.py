"""`dllm mirror create`: one folder with everything an air-gapped host needs.

For each target: its environment manifest, every wheel the manifest pins (from `--wheels-from`
and, with `--with-wheels`, downloaded from the manifest's indexes), the project's own wheel when
one is at hand, the release catalog and the target's bundles, and any compile-cache packs given
(each fully verified first; `packs/` of a mirror is where `dllm launch` looks for them). Built in a staging folder next to
DIR and renamed into place, so DIR is either the old mirror or the complete new one; a create
holds an flock on its staging folder, so the next create of DIR removes the one a killed create
left (SIGTERM unwinds and removes its own) and leaves a running one's alone. Downloaded
wheels go through `.DIR.downloads` (each under its name only once its sha256 is the manifest's),
as do the release's bundle archives (`bundles/`, see `release.add_release`), which outlives a
create that fails or is stopped: run again, it resumes from them.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from turbo_dllm import __version__
from turbo_dllm.bundles.archive import make_output_dir
from turbo_dllm.envs.manifest import EnvManifest, dump_manifest
from turbo_dllm.errors import DllmError
from turbo_dllm.fsutil import human_size, make_temp_dir, mounted_at, sha256_file, working_name
from turbo_dllm.mirror.layout import (
    MIRROR_FILE,
    FileKind,
    MirrorFile,
    MirrorIndex,
    MirrorProject,
    simple_pages,
)
from turbo_dllm.mirror.wheels import LocalWheels, WheelSource, download_wheel, scan_wheels
from turbo_dllm.sigterm import unwinding_on_sigterm

__all__ = ["MirrorPlan", "create_mirror", "downloads_folder", "place"]


@dataclass
class MirrorPlan:
    dest: Path
    release: str | None
    manifests: list[EnvManifest]
    with_wheels: bool = False  # download what --wheels-from lacks
    wheels_from: Path | None = None
    bundles_from: str | None = None  # release source (URL or folder) for catalog + bundles
    catalog_sha256: str | None = None
    packs: list[Path] = field(default_factory=list)  # compile-cache packs to carry
    force: bool = False
    notes: list[str] = field(default_factory=list)


def _say(message: str) -> None:
    print(message, file=sys.stderr)


def downloads_folder(dest: Path) -> Path:
    """Where `--with-wheels` keeps the wheels it downloaded, next to DIR: they outlive a create
    that fails or is stopped, so the same command again resumes from them; removed once the
    mirror is in place. Only a download whose sha256 is the manifest's gets its wheel's name."""
    return dest.with_name(f".{dest.name}.downloads")


def _downloaded(folder: Path, wheel) -> Path | None:
    """A wheel an earlier, stopped create downloaded into `folder`, re-hashed before use."""
    path = folder / wheel.filename
    if not path.is_file():
        return None
    if sha256_file(path) == wheel.sha256:
        return path
    path.unlink()  # not the manifest's (the manifest changed): downloaded again
    return None


def place(source: Path, target: Path) -> None:
    """`source` at `target`: a hard link where the file system allows (no second copy of
    gigabytes of wheels), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _collect_wheels(
    plan: MirrorPlan, local: LocalWheels, wheels_dir: Path, downloads: Path
) -> tuple[dict[str, str], list[str]]:
    """Copy or download every pinned wheel into `wheels_dir`; {file name: sha256}, problems.
    Downloads go through `downloads` (kept when the create stops: a rerun resumes)."""
    collected: dict[str, str] = {}
    missing: list[str] = []
    for manifest in plan.manifests:
        source = WheelSource.of(manifest)
        for pin in manifest.packages:
            have = 0
            for wheel in pin.wheels:
                if wheel.filename in collected:
                    have += 1
                    continue
                found = local.find(wheel)
                if found is not None:
                    shutil.copyfile(found, wheels_dir / wheel.filename)
                    collected[wheel.filename] = wheel.sha256
                    have += 1
            if have == 0 and plan.with_wheels:
                # One wheel per pin is enough: the manifest lists all that fit the target, and
                # an installer takes any of them.
                for wheel in pin.wheels:
                    fetched = _downloaded(downloads, wheel)
                    if fetched is None:
                        urls = source.candidate_urls(pin, wheel)
                        if not urls:
                            continue
                        _say(f"downloading {wheel.filename}")
                        downloads.mkdir(exist_ok=True)
                        fetched = download_wheel(urls, wheel, downloads)
                    else:
                        _say(f"downloaded before: {wheel.filename}")
                    place(fetched, wheels_dir / wheel.filename)
                    collected[wheel.filename] = wheel.sha256
                    have = 1
                    break
            if have == 0:
                missing.append(f"{pin.name}=={pin.version} ({manifest.target})")
    return collected, missing


def _project_wheel(plan: MirrorPlan, local: LocalWheels, wheels_dir: Path) -> MirrorProject | None:
    projects = {(m.project.name, m.project.version) for m in plan.manifests}
    if len(projects) != 1:
        raise DllmError(
            "the manifests are for different project versions: "
            + ", ".join(f"{n} {v}" for n, v in sorted(projects)),
            hint="a mirror carries one turbo-dllm version: pass the manifests locked for it "
            "(`dllm env lock` again for the others)",
        )
    ((name, version),) = projects
    candidates = local.project_wheels(name, version)
    if not candidates:
        plan.notes.append(
            f"no {name} {version} wheel in --wheels-from: the mirror installs its dependencies "
            "only (build one with `pip wheel --no-deps .` and pass its folder)"
        )
        return None
    if len(candidates) > 1:
        raise DllmError(
            f"several {name} {version} wheels in {plan.wheels_from}: "
            + ", ".join(p.name for p in candidates),
            hint="keep one",
        )
    wheel = candidates[0]
    shutil.copyfile(wheel, wheels_dir / wheel.name)
    return MirrorProject(
        name=name, version=version, wheel=f"wheels/{wheel.name}", sha256=sha256_file(wheel)
    )


def _inventory(root: Path, kinds: dict[str, FileKind]) -> list[MirrorFile]:
    files = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = path.relative_to(root).as_posix()
        if relative == MIRROR_FILE:
            continue
        top = relative.split("/", 1)[0]
        kind = kinds.get(relative) or {
            "wheels": "wheel",
            "simple": "index",
            "manifests": "manifest",
            "releases": "catalog",
            "bundles": "bundle",
            "packs": "pack",
        }.get(top, "other")
        files.append(
            MirrorFile(path=relative, sha256=sha256_file(path), size=path.stat().st_size, kind=kind)
        )
    return files


def _carry_packs(packs: list[Path], staging: Path) -> None:
    """Verify each pack completely (every member against its pack.json) and copy it in."""
    from turbo_dllm.cache.packs import publish_packs

    for path in publish_packs(packs, staging):
        _say(f"pack {path.name}")


def create_mirror(plan: MirrorPlan, add_release=None) -> MirrorIndex:
    """Build the mirror; `add_release(plan, staging_root)` copies catalogs and bundles in."""
    dest = plan.dest.absolute()
    if dest.exists() and not dest.is_dir():  # else a traceback from iterdir()
        raise DllmError(f"{dest} is a file, not a folder", hint="pass a folder for the mirror")
    if dest.exists() and any(dest.iterdir()):
        # --force replaces a mirror, never a folder of other files (a USB stick's root, $HOME)
        if not (dest / MIRROR_FILE).is_file():
            raise DllmError(
                f"{dest} holds files and is not a mirror (no {MIRROR_FILE})",
                hint=f"pass a new or empty folder, e.g. {dest}/dllm (--force replaces only a "
                "mirror, never other files)",
            )
        if not plan.force:
            raise DllmError(
                f"{dest} exists and is not empty: it is a mirror",
                hint="pass --force to replace it",
            )
    if not plan.manifests:
        raise DllmError("no targets to mirror", hint="pass --targets NAME[,NAME]")
    make_output_dir(dest.parent)
    # SIGTERM (`timeout`, a scheduler's limit) too removes the staging folder, which may hold
    # gigabytes of wheels, before it ends dllm.
    with unwinding_on_sigterm():
        return _create(plan, dest, add_release)


def _partial_prefix(dest: Path) -> str:
    return working_name(dest.name, ".partial-")  # a long DIR name still fits a file name


def _hold(folder: Path) -> int:
    """An fd holding an exclusive flock on `folder` for as long as it stays open (the kernel
    drops it when this process dies, however): how `_sweep_partials` tells a live create's
    staging folder from one a killed create left."""
    import fcntl

    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _sweep_partials(dest: Path, own: Path) -> None:
    """Remove the staging folders of creates of `dest` that were killed (SIGKILL, the OOM
    killer, a lost node: SIGTERM unwinds by itself), which hold every file copied so far and
    were otherwise left next to DIR for good. One whose create is alive holds its flock."""
    import fcntl

    prefix = _partial_prefix(dest)
    try:
        found = [p for p in dest.parent.iterdir() if p.name.startswith(prefix) and p != own]
    except OSError:
        return
    for path in sorted(found):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a create of this DIR that is still running
            continue
        else:
            shutil.rmtree(path, ignore_errors=True)
            _say(f"removed {path}, the staging folder a create that was killed left")
        finally:
            os.close(fd)


def _create(plan: MirrorPlan, dest: Path, add_release) -> MirrorIndex:
    staging = make_temp_dir(dest.parent, _partial_prefix(dest))
    held = _hold(staging)
    downloads = downloads_folder(dest)
    done = False
    try:
        _sweep_partials(dest, staging)
        (staging / "manifests").mkdir()
        for manifest in plan.manifests:
            path = staging / "manifests" / f"{manifest.target}.toml"
            path.write_text(dump_manifest(manifest), encoding="utf-8")
        # The release first: a missing --from, a catalog off its pin or a target the release
        # has no bundle for was refused only after every wheel was downloaded (gigabytes).
        if add_release is not None and plan.release is not None:
            add_release(plan, staging)
        project = None
        if plan.with_wheels or plan.wheels_from is not None:
            wheels_dir = staging / "wheels"
            wheels_dir.mkdir()
            local = scan_wheels(plan.wheels_from)
            collected, missing = _collect_wheels(plan, local, wheels_dir, downloads)
            if missing:
                raise DllmError(
                    f"{len(missing)} pinned packages have no wheel: {', '.join(missing[:10])}"
                    + (", ..." if len(missing) > 10 else ""),
                    hint="pass --with-wheels to download them, or --wheels-from DIR holding them "
                    "(pip download --require-hashes --no-deps -r requirements.txt -d DIR)",
                )
            project = _project_wheel(plan, local, wheels_dir)
            wheels = {p.name: (p, sha256_file(p)) for p in sorted(wheels_dir.glob("*.whl"))}
            for relative, text in simple_pages(wheels).items():
                page = staging / relative
                page.parent.mkdir(parents=True, exist_ok=True)
                page.write_text(text, encoding="utf-8")
        _carry_packs(plan.packs, staging)
        index = MirrorIndex(
            created_by=f"dllm {__version__}",
            release=plan.release,
            targets=sorted(m.target for m in plan.manifests),
            project=project,
            files=_inventory(staging, {}),
        )
        # MIRROR.json last: a folder without it is not a mirror.
        (staging / MIRROR_FILE).write_text(
            json.dumps(index.model_dump(mode="json"), indent=2, sort_keys=True) + "\n",
            encoding="utf-8",
        )
        if dest.exists():
            _check_still_replaceable(plan, dest)
            _replace_folder(staging, dest)  # the old mirror may end up at `staging`
        else:
            staging.rename(dest)
        done = True
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # It named a file in the staging folder, gone by the time it was read, and no size.
        written = sum(p.stat().st_size for p in staging.rglob("*") if p.is_file())
        raise DllmError(
            f"the disk filled while the mirror {dest} was written ({human_size(written)} "
            "written by then); the staging folder was removed and nothing was kept",
            hint=f"the mirror needs more than {human_size(written)} free on "
            f"{mounted_at(dest.parent)}: free space there, or pass a DIR on a larger disk",
        ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        os.close(held)
        _settle_downloads(downloads, done)
    return index


def _check_still_replaceable(plan: MirrorPlan, dest: Path) -> None:
    """`create_mirror`'s checks of DIR again, at the rename: another create of DIR (or anything
    else) may have filled it since, and this one replaced that without --force."""
    if not any(dest.iterdir()):
        return
    if not (dest / MIRROR_FILE).is_file() or not plan.force:
        raise DllmError(
            f"{dest} was filled while this create ran (another `dllm mirror create`?); "
            "it was left as it is and nothing was written",
            hint="check what is there; pass --force to replace a mirror",
        )


def _settle_downloads(downloads: Path, done: bool) -> None:
    """Remove the downloads folder once the mirror is in place; after a failure or a stop keep
    the wheels that were downloaded whole and checked (never a `.part`) and the release's
    bundle downloads (`bundles/`: whole archives and `<sha256>.part` files, both hashed again
    when the next create uses them), and say so."""
    if not downloads.is_dir():
        return
    if done:
        shutil.rmtree(downloads, ignore_errors=True)
        return
    for partial in downloads.glob(".*.part"):
        partial.unlink(missing_ok=True)
    wheels = sorted(downloads.glob("*.whl"))
    bundles = sorted(downloads.glob("bundles/*"))
    if not wheels and not bundles:
        shutil.rmtree(downloads, ignore_errors=True)
        return
    kept = [
        f"{len(found)} downloaded {what}{'' if len(found) == 1 else 's'}"
        for found, what in ((wheels, "wheel"), (bundles, "bundle"))
        if found
    ]
    _say(f"kept {' and '.join(kept)} in {downloads}: the same command again resumes from them")


def _replace_folder(new: Path, dest: Path) -> None:
    """Put the finished mirror `new` in place of the existing folder `dest` (--force) so that
    `dest` is never missing: one atomic exchange where the system has it (Linux renameat2),
    which leaves the old mirror at `new` for the caller to delete. Elsewhere two renames
    through `.<name>.old`, the old mirror put back when the second one fails."""
    from turbo_dllm.bundles.store import exchange

    if exchange(new, dest):
        return
    old = dest.with_name(f".{dest.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    dest.rename(old)
    try:
        new.rename(dest)
    except BaseException:
        old.rename(dest)
        raise
    shutil.rmtree(old, ignore_errors=True)
