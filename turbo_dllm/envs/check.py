"""Drift between an environment and its manifest: missing, mismatched and extra packages.

Versions are compared exactly, local labels included (`2.13.0+cpu` is not `2.13.0+cu130`).
Installed files carry no wheel hash, so a check cannot prove which wheel a version came from; the
hashes are enforced when `dllm env sync` installs, and this check catches everything that
happened afterwards (a `pip install -U`, a missing package, a stray extra).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from packaging.version import InvalidVersion, Version

from turbo_dllm.envs.inventory import Environment
from turbo_dllm.envs.manifest import EnvManifest

__all__ = ["IGNORED_EXTRAS", "Drift", "Mismatch", "PackageRef", "compare", "same_version"]

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
            # Same version, other files (a rebuilt wheel, an edited install).
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
