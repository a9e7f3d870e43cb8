"""`dllm mirror verify`: is every byte of the mirror what `MIRROR.json` and the locks say?

Checks, collecting every problem before reporting: each listed file's sha256 and size; no
unlisted files; the PEP 503 pages are exactly what the wheels produce; every pin of every
manifest has a wheel whose hash the manifest allows; the project wheel; each catalog parses,
is the one `releases.lock` pins (when it pins the release) and every bundle it lists that the
mirror carries has the catalog's sha256 and size.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from turbo_dllm.envs.manifest import parse_manifest
from turbo_dllm.errors import DllmError
from turbo_dllm.mirror.layout import MIRROR_FILE, MirrorIndex, simple_pages
from turbo_dllm.mirror.source import MirrorSource, open_mirror

__all__ = ["VerifyReport", "verify_mirror"]

UNLISTED = ": not listed in MIRROR.json"


@dataclass
class VerifyReport:
    location: str
    index: MirrorIndex
    checked_files: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def fix(self) -> str | None:
        """What puts a failing mirror right (None when it passed): files it does not list are
        deleted; anything else is a copy gone wrong, so copy it again from where it was made,
        or make it again there with the command MIRROR.json's release and targets give."""
        if self.ok:
            return None
        stray = [p.split(": ", 1)[0] for p in self.problems if p.endswith(UNLISTED)]
        if len(stray) == len(self.problems):
            return (
                f"delete what MIRROR.json does not list ({', '.join(stray[:3])}"
                f"{', ...' if len(stray) > 3 else ''}): a mirror holds only what "
                "`dllm mirror create` wrote"
            )
        index = self.index
        command = (
            f"dllm mirror create DIR --release {index.release or 'R'} --targets "
            f"{','.join(index.targets) or 'T'}"
        )
        if index.has_wheels:
            command += " --with-wheels (or --wheels-from WHEELS)"
        if index.of_kind("catalog"):
            command += " --from SOURCE"
        return (
            f"{self.location} is not what was made: copy the mirror again from the machine "
            f"it was made on, or make it again there ({command} --force) and copy that; "
            "then `dllm mirror verify` it"
        )

    def to_json(self) -> dict:
        return {
            "format": "turbo_dllm.mirror_verify.v1",
            "mirror": self.location,
            "ok": self.ok,
            "release": self.index.release,
            "targets": self.index.targets,
            "files": self.checked_files,
            "problems": self.problems,
            "notes": self.notes,
            "fix": self.fix,
        }


def _check_files(source: MirrorSource, report: VerifyReport) -> None:
    for entry in report.index.files:
        report.checked_files += 1
        try:
            found = source.digest(entry.path, entry.size)
        except DllmError as error:  # unreadable (a folder, no permission, a broken transfer)
            report.problems.append(f"{entry.path}: {error.message}")
            continue
        if found is None:
            report.problems.append(f"{entry.path}: missing")
        elif found != (entry.sha256, entry.size):
            report.problems.append(
                f"{entry.path}: sha256 {found[0][:16]}... size {found[1]}, "
                f"MIRROR.json says {entry.sha256[:16]}... size {entry.size}"
            )
    if source.local is not None:
        listed = {f.path for f in report.index.files} | {MIRROR_FILE}
        # A link to a folder is no file, and rglob does not enter it: listed as what it is,
        # or the mirror would pass with a way out of it (`serve` refuses to follow one).
        entries = (p for p in source.local.rglob("*") if p.is_file() or p.is_symlink())
        for path in sorted(entries):
            relative = path.relative_to(source.local).as_posix()
            if relative not in listed:
                report.problems.append(f"{relative}{UNLISTED}")


def _check_simple_index(source: MirrorSource, report: VerifyReport) -> None:
    if source.local is None:
        return
    wheels = {
        Path(f.path).name: (source.local / f.path, f.sha256) for f in report.index.of_kind("wheel")
    }
    if not wheels:
        return
    for relative, text in simple_pages(wheels).items():
        path = source.local / relative
        try:  # bytes, not text: a damaged page need not be UTF-8
            same = path.is_file() and path.read_bytes() == text.encode("utf-8")
        except OSError:
            same = False
        if not same:
            report.problems.append(f"{relative}: does not match the wheels (rebuild the mirror)")


def _check_manifests(source: MirrorSource, report: VerifyReport) -> None:
    wheel_hashes = {Path(f.path).name: f.sha256 for f in report.index.of_kind("wheel")}
    for target in report.index.targets:
        try:
            text = source.manifest_text(target)
        except DllmError as error:  # unreadable, or not UTF-8
            report.problems.append(error.message)
            continue
        if text is None:  # a listed one is named missing by _check_files already
            path = f"manifests/{target}.toml"
            if report.index.file(path) is None:
                report.problems.append(f"{path}: missing")
            continue
        try:
            manifest = parse_manifest(text, f"manifests/{target}.toml")
        except DllmError as error:
            report.problems.append(error.message)
            continue
        if not wheel_hashes:
            continue
        uncovered = [
            f"{pin.name}=={pin.version}"
            for pin in manifest.packages
            if not any(wheel_hashes.get(w.filename) == w.sha256 for w in pin.wheels)
        ]
        if uncovered:
            report.problems.append(
                f"manifest {target}: no wheel in the mirror for {', '.join(uncovered[:8])}"
                + (", ..." if len(uncovered) > 8 else "")
            )
    project = report.index.project
    if project is not None:
        listed = report.index.file(project.wheel)
        if listed is None or listed.sha256 != project.sha256:
            report.problems.append(f"project wheel {project.wheel}: not listed with its sha256")


def _check_catalogs(source: MirrorSource, report: VerifyReport) -> None:
    from turbo_dllm.bundles.catalog import parse_catalog, read_releases_lock

    catalogs = [f for f in report.index.of_kind("catalog") if f.path.endswith("/catalog.toml")]
    bundles = {Path(f.path).name: f for f in report.index.of_kind("bundle")}
    lock = read_releases_lock()
    for entry in catalogs:
        data = source.read_bytes(entry.path)
        if data is None:
            continue  # reported as missing already
        try:
            catalog = parse_catalog(data, entry.path)
        except DllmError as error:
            report.problems.append(error.message)
            continue
        pin = lock.releases.get(catalog.release)
        digest = hashlib.sha256(data).hexdigest()
        if pin is None:
            report.notes.append(
                f"release {catalog.release} is not pinned in this dllm's releases.lock: "
                f"install with --catalog-sha256 {digest}"
            )
        elif pin.catalog_sha256 != digest:
            report.problems.append(
                f"{entry.path}: sha256 {digest} is not the one releases.lock pins for "
                f"{catalog.release} ({pin.catalog_sha256})"
            )
        for bundle in catalog.bundles:
            carried = bundles.get(bundle.file)
            if carried is None:
                continue
            if (carried.sha256, carried.size) != (bundle.sha256, bundle.size):
                report.problems.append(
                    f"{carried.path}: does not match catalog {catalog.release} "
                    f"(sha256 {bundle.sha256[:16]}..., size {bundle.size})"
                )
    catalog_files = {
        b.file
        for f in catalogs
        if (data := source.read_bytes(f.path)) is not None
        for b in _safe_entries(data, f.path)
    }
    for name, carried in sorted(bundles.items()):
        if carried.path.endswith(".tar.zst") and name not in catalog_files:
            report.problems.append(f"{carried.path}: listed in no catalog of the mirror")


def _safe_entries(data: bytes, source: str):
    from turbo_dllm.bundles.catalog import parse_catalog

    try:
        return parse_catalog(data, source).bundles
    except DllmError:
        return ()


def verify_mirror(location: str | Path) -> VerifyReport:
    source = open_mirror(location)
    report = VerifyReport(location=str(location), index=source.index())
    _check_files(source, report)
    _check_simple_index(source, report)
    _check_manifests(source, report)
    _check_catalogs(source, report)
    return report
