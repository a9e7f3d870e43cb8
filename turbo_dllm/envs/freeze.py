"""`dllm env lock --from-environment`: a manifest of what an environment has installed.

For a host whose environment was not made by `dllm env sync` (a vendor image, a qualified GPU
host), resolving afresh would describe some other environment; this locks the one that runs.
Each package is identified as strongly as the environment allows, and the manifest says which:

- the installed wheel's sha256, when the installer recorded it (`direct_url.json`, for wheels
  installed from a file or URL): a pin, like a resolved manifest's;
- else the sha256 of its RECORD (the list of its installed files with their hashes, so it
  changes when a reinstall brings other files; a file edited in place is not re-hashed):
  `provided`, version + RECORD;
- else name and version only: `provided`, version.

`dllm env check` then reports drift: another version, a missing or extra package, or, for a
RECORD-identified one, other files under the same version.
"""

from __future__ import annotations

import sys
from pathlib import Path

from packaging.utils import canonicalize_name

from turbo_dllm.envs.check import IGNORED_EXTRAS
from turbo_dllm.envs.inventory import inspect_environment
from turbo_dllm.envs.manifest import EnvManifest, Pin, Project, Provided, WheelFile
from turbo_dllm.errors import DllmError

__all__ = ["IDENTITY", "lock_from_environment"]

IDENTITY = (
    "locked from an installed environment: packages = installed wheels with a recorded sha256; "
    "provided = the others, with the sha256 of their RECORD where present, else name+version"
)
# Installer tooling that `dllm env check` ignores too.
_SKIP = IGNORED_EXTRAS


def lock_from_environment(target: str, python: str | Path | None = None) -> EnvManifest:
    """The manifest of `python`'s environment (default: this one) for targets.toml `target`."""
    import turbo_dllm
    from turbo_dllm.bundles.targets import pick_build_target
    from turbo_dllm.envs.targets import python_platform
    from turbo_dllm.host import collect_fingerprint

    if python is not None and Path(python).resolve() != Path(sys.executable).resolve():
        raise DllmError(
            "--from-environment locks the environment dllm runs in",
            hint=f"run it with that interpreter: {python} -m turbo_dllm env lock ...",
        )
    environment = inspect_environment()
    spec, bundle_target = pick_build_target(target, collect_fingerprint(apply_overrides=False))
    project = canonicalize_name("turbo-dllm")
    packages, provided = [], []
    for dist in environment.distributions:
        if dist.name in _SKIP or dist.name == project:
            continue
        if dist.wheel is not None:
            filename, sha256 = dist.wheel
            packages.append(
                Pin(
                    name=dist.name,
                    version=dist.version,
                    wheels=[WheelFile(filename=filename, sha256=sha256)],
                )
            )
        else:
            provided.append(
                Provided(name=dist.name, version=dist.version, record_sha256=dist.record_sha256)
            )
    if not packages and not provided:
        raise DllmError(f"the environment of {environment.executable} lists no packages")
    return EnvManifest(
        target=spec.name,
        bundle_target=str(bundle_target),
        python=environment.python,
        python_platform=python_platform(spec.platform),
        resolver=f"installed environment {environment.prefix} (turbo-dllm {turbo_dllm.__version__})",
        project=Project(name=project, version=turbo_dllm.__version__),
        requirements=[
            f"{d.name}=={d.version}"
            for d in environment.distributions
            if d.name not in _SKIP and d.name != project
        ],
        provided=provided,
        packages=packages,
        identity=IDENTITY,
    )
