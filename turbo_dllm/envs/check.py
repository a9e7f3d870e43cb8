"""Drift between an environment and its manifest: missing, mismatched and extra packages.

Versions are compared exactly, local labels included (`2.13.0+cpu` is not `2.13.0+cu130`).
Installed files carry no wheel hash, so a check cannot prove which wheel a version came from; the
hashes are enforced when `dllm env sync` installs, and this check catches everything that
happened afterwards (a `pip install -U`, a missing package, a stray extra).
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from turbo_dllm.envs.inventory import Environment
from turbo_dllm.envs.manifest import EnvManifest

__all__ = [
    "IGNORED_EXTRAS",
    "Drift",
    "Mismatch",
    "PackageRef",
    "compare",
    "drift_fixes",
    "same_version",
]

# Installer tooling that venv creators add on their own; it does not change what the code runs.
IGNORED_EXTRAS = frozenset({"pip"})


@dataclass(frozen=True)
class PackageRef:
    name: str
    version: str


@dataclass(frozen=True)
class Mismatch:
    name: str
    expected: str
    found: str


@dataclass
class Drift:
    target: str
    manifest_sha256: str
    python: str
    missing: list[PackageRef] = field(default_factory=list)
    mismatched: list[Mismatch] = field(default_factory=list)
    extra: list[PackageRef] = field(default_factory=list)
    checked: int = 0

    @property
    def clean(self) -> bool:
        return not (self.missing or self.mismatched or self.extra)

    def summary(self) -> str:
        if self.clean:
            return f"{self.checked} packages match manifest {self.target}"
        parts = []
        if self.mismatched:
            parts.append(
                f"{len(self.mismatched)} mismatched ("
                + ", ".join(f"{m.name} {m.found} != {m.expected}" for m in self.mismatched[:4])
                + (", ..." if len(self.mismatched) > 4 else "")
                + ")"
            )
        if self.missing:
            parts.append(
                f"{len(self.missing)} missing ("
                + ", ".join(f"{m.name}=={m.version}" for m in self.missing[:4])
                + (", ..." if len(self.missing) > 4 else "")
                + ")"
            )
        if self.extra:
            parts.append(
                f"{len(self.extra)} extra ("
                + ", ".join(f"{e.name} {e.version}" for e in self.extra[:4])
                + (", ..." if len(self.extra) > 4 else "")
                + ")"
            )
        return f"drift from manifest {self.target}: " + "; ".join(parts)

    def to_json(self) -> dict:
        return {
            "format": "turbo_dllm.env_check.v1",
            "target": self.target,
            "manifest_sha256": self.manifest_sha256,
            "python": self.python,
            "clean": self.clean,
            "checked": self.checked,
            "missing": [asdict(m) for m in self.missing],
            "mismatched": [asdict(m) for m in self.mismatched],
            "extra": [asdict(e) for e in self.extra],
        }


def same_version(found: str, expected: str) -> bool:
    try:
        return Version(found) == Version(expected)
    except InvalidVersion:
        return found == expected


def compare(manifest: EnvManifest, environment: Environment) -> Drift:
    """Every pinned, provided and project package against what `environment` imports."""
    drift = Drift(
        target=manifest.target,
        manifest_sha256=manifest.content_sha256(),
        python=environment.python,
    )
    if environment.python != manifest.python:
        # The whole environment is for another interpreter: every pin is suspect.
        drift.mismatched.append(Mismatch("python", manifest.python, environment.python))
    expected = {p.name: p.version for p in manifest.packages}
    expected.update({p.name: p.version for p in manifest.provided})
    records = {p.name: p.record_sha256 for p in manifest.provided if p.record_sha256}
    expected[manifest.project.name] = manifest.project.version
    for name, version in sorted(expected.items()):
        installed = environment.get(name)
        drift.checked += 1
        if installed is None:
            drift.missing.append(PackageRef(name, version))
        elif not same_version(installed.version, version):
            drift.mismatched.append(Mismatch(name, version, installed.version))
        elif records.get(name) and installed.record_sha256 != records[name]:
            # Same version, other files: a rebuilt wheel reinstalled (a file edited in place
            # keeps its RECORD: installed files are not re-hashed).
            drift.mismatched.append(
                Mismatch(
                    name,
                    f"{version} (RECORD {records[name][:12]})",
                    f"{installed.version} (RECORD {(installed.record_sha256 or 'none')[:12]})",
                )
            )
    for dist in environment.distributions:
        if dist.name not in expected and dist.name not in IGNORED_EXTRAS:
            drift.extra.append(PackageRef(dist.name, dist.version))
    return drift


def _manifest_inside(sync_source: str, venv) -> Path | None:
    """The `--manifest FILE` of `sync_source` where that file lies inside `venv` (its copy)."""
    words = shlex.split(sync_source)
    if len(words) != 2 or words[0] != "--manifest":
        return None
    file = Path(words[1])
    return file if Path(venv) in file.parents else None


def drift_fixes(
    manifest: EnvManifest, drift: Drift, environment: Environment, *, sync_source: str
) -> list[str]:
    """What fixes each part of `drift` (empty when clean), as commands the user can run.

    `dllm env sync` fixes pinned packages and extras, but not everything: it refuses a venv of
    another Python, never installs the packages the base interpreter provides, and installs the
    project itself only from a mirror that carries its wheel. Each of those gets its own fix.
    `sync_source` names the manifest that was compared the way sync takes it (`--target T`,
    `--manifest FILE`), so the sync command restores exactly that manifest.
    """
    if drift.clean:
        return []
    venv = environment.prefix if environment.is_venv else ".venv"
    # Commands are printed to be pasted: a path with a space is quoted (`sync_source` comes
    # quoted from the caller).
    sync = f"dllm env sync {sync_source} --venv {shlex.quote(str(venv))}"
    if any(m.name == "python" for m in drift.mismatched):
        python = f"python{manifest.python}"
        inside = _manifest_inside(sync_source, venv) if environment.is_venv else None
        if inside is not None:
            # The venv's own copy goes with the venv: removed first, the sync that followed
            # named a file that was no longer there. Kept beside the venv, it is still there.
            saved = shlex.quote(f"{Path(venv)}.{inside.name}")
            where = shlex.quote(str(venv))
            return [
                f"{venv} runs Python {environment.python} and sync keeps a venv's Python: make "
                "it anew, keeping its manifest (removing the venv removes the copy in it): "
                f"`cp {shlex.quote(str(inside))} {saved} && rm -r {where} && dllm env sync "
                f"--manifest {saved} --venv {where} --python {python}`"
            ]
        if environment.is_venv:
            return [
                f"{venv} runs Python {environment.python} and sync keeps a venv's Python: remove "
                f"{venv}, then {sync} --python {python}"
            ]
        return [f"{sync} --python {python}, then use {venv}"]
    provided = {p.name: p.version for p in manifest.provided}
    project = manifest.project.name
    wrong = {m.name for m in drift.mismatched} | {m.name for m in drift.missing}
    fixes = []
    if any(name not in provided and name != project for name in wrong) or drift.extra:
        fixes.append(sync)
    base = sorted(name for name in wrong if name in provided)
    if base:
        specs = " ".join(f"'{name}=={provided[name]}'" for name in base)
        fixes.append(
            f"sync never installs what the base interpreter provides ({', '.join(base)}): "
            f"restore it with `uv pip install --python {shlex.quote(str(environment.executable))} "
            "--no-deps "
            f"--reinstall {specs}`, or, if the change is meant, re-lock: "
            f"dllm env lock --target {manifest.target} --from-environment"
        )
    found = next((m.found for m in drift.mismatched if m.name == project), None)
    if found is not None:
        fixes.append(
            f"{project} {found} is installed and manifest {manifest.target} is for "
            f"{manifest.project.version}: sync the manifest of the installed release "
            f"(dllm env sync --target {manifest.target} --venv {shlex.quote(str(venv))})"
        )
    elif project in wrong:
        fixes.append(
            f"install {project} {manifest.project.version} itself: `uv pip install --python "
            f"{shlex.quote(str(environment.executable))} --no-deps WHEEL` (sync installs it only from a mirror "
            "that carries its wheel: --mirror DIR|URL)"
        )
    return fixes
