"""`dllm env lock`: resolve a target's environment with uv and write its manifest.

uv resolves for the target, not for this host (`--python-version`, `--python-platform`), wheels
only (a cluster node must never compile an sdist), and writes a PEP 751 `pylock.toml`; from that
we keep, per package, the version and every target-compatible wheel's file name, size and sha256.
The sources used are recorded in `indexes`, apart from the pins.

A manifest fixes one point of its targets.toml entry (which lists several Pythons and torch
releases): one Python, one torch build. torch is pinned with its build's local label:
`torch==2.13.0+cpu` for a CPU target (PyTorch's CPU build: no CUDA libraries, a tenth of the
size), `+cu130` for a CUDA 13.0 target. Python and torch default to this interpreter's when the
entry allows them, so the CPU manifest pins what CI actually runs.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from turbo_dllm.envs.manifest import EnvManifest, Index, Pin, Project, WheelFile
from turbo_dllm.envs.targets import (
    python_platform,
    source_root,
    target_spec,
    torch_index_url,
    torch_local_label,
)
from turbo_dllm.envs.uvtool import run_uv, uv_version
from turbo_dllm.errors import DllmError

__all__ = [
    "LockPoint",
    "LockRequest",
    "Staleness",
    "lock_environment",
    "lock_point",
    "lock_staleness",
    "project_requirements",
]

DEFAULT_INDEX = "https://pypi.org/simple"
DEFAULT_EXTRAS = ("data", "env")


@dataclass
class LockRequest:
    target: str  # a bundles/targets.toml entry
    extras: Sequence[str] = DEFAULT_EXTRAS
    python_version: str | None = None  # one of the entry's Pythons (default: this interpreter)
    torch_version: str | None = None  # e.g. 2.13.0 (the build's local label is added)
    cuda: str | None = None  # one of the entry's CUDA versions (default: its only one)
    index_url: str | None = DEFAULT_INDEX  # None: no default index (--no-index)
    extra_index_urls: Sequence[str] | None = None  # None: the target's PyTorch index
    find_links: Sequence[str] = ()
    requirements: Sequence[str] | None = None  # None: the project's dependencies + torch
    python_platform: str | None = None
    offline: bool = False
    no_deps: bool = False  # pin exactly `requirements` (used for hand-made manifests)
    project: Project | None = None
    notes: list[str] = field(default_factory=list)


def _read_pyproject(root: Path) -> dict:
    import tomlkit

    return tomlkit.parse((root / "pyproject.toml").read_text(encoding="utf-8")).unwrap()


def project_requirements(extras: Sequence[str]) -> tuple[Project, list[str]]:
    """The project's name/version and its dependencies with `extras`, from pyproject.toml."""
    import turbo_dllm

    root = source_root()
    if root is None:
        raise DllmError(
            "dllm env lock reads the project's dependencies from its pyproject.toml",
            hint="run it from a source checkout (pip install -e .), or pass --requirement",
        )
    project = _read_pyproject(root)["project"]
    optional = project.get("optional-dependencies", {})
    unknown = sorted(set(extras) - set(optional))
    if unknown:
        raise DllmError(
            f"unknown extras: {', '.join(unknown)}",
            hint=f"choose from: {', '.join(sorted(optional))}",
        )
    requirements = list(project.get("dependencies", []))
    for extra in extras:
        requirements.extend(optional[extra])
    info = Project(name=project["name"], version=turbo_dllm.__version__, extras=sorted(extras))
    return info, requirements


@dataclass(frozen=True)
class LockPoint:
    """The one point of a targets.toml entry a manifest pins: Python, torch, CUDA, C++ ABI."""

    spec: object  # TargetSpec
    python: object  # PythonTag
    torch_version: str  # base version, e.g. 2.13.0
    cuda: object  # CudaVersion | None
    cxx11_abi: bool

    @property
    def python_dotted(self) -> str:
        return f"{self.python.major}.{self.python.minor}"

    @property
    def torch_requirement(self) -> str:
        return f"torch=={self.torch_version}+{torch_local_label(self.cuda)}"

    def bundle_target(self) -> str:
        from turbo_dllm.bundles.target import BundleTarget
        from turbo_dllm.host import TorchRelease

        return str(
            BundleTarget(
                python=self.python,
                torch=TorchRelease.parse(self.torch_version),
                cuda=self.cuda,
                cxx11_abi=self.cxx11_abi,
                platform=self.spec.platform,
                archs=self.spec.archs,
            )
        )


def _running_torch() -> tuple[Version | None, bool | None]:
    from importlib import metadata

    try:
        version = Version(metadata.version("torch"))
    except metadata.PackageNotFoundError:
        return None, None
    from turbo_dllm.host import collect_fingerprint

    return version, collect_fingerprint(apply_overrides=False).cxx11_abi


def lock_point(request: LockRequest) -> LockPoint:
    """Pick the Python, torch and CUDA of `request` within its targets.toml entry.

    Defaults come from this interpreter when the entry allows them: the CPU target is locked
    with the Python and torch CI runs, so the manifest pins what CI actually uses.
    """
    from turbo_dllm.host import CudaVersion, PythonTag

    spec = target_spec(request.target)
    allowed = ", ".join(map(str, spec.pythons))
    python = PythonTag.parse(request.python_version) if request.python_version else None
    if python is None:
        running = PythonTag.running()
        if running not in spec.pythons:
            raise DllmError(
                f"this Python ({running}) is not one of target {spec.name}'s ({allowed})",
                hint="pass --python-version X.Y",
            )
        python = running
    elif python not in spec.pythons:
        raise DllmError(
            f"Python {python} is not one of target {spec.name}'s ({allowed})",
            hint=f"pass --python-version with one of them ({allowed}; or X.Y), or lock a target "
            "whose Pythons include it (bundles/targets.toml lists them)",
        )
    running_torch, running_abi = _running_torch()
    releases = ", ".join(t.dotted for t in spec.torch)
    if request.torch_version:
        try:
            torch = Version(request.torch_version)
        except InvalidVersion:
            raise DllmError(
                f"--torch {request.torch_version!r} is not a version",
                hint=f"write it as X.Y.Z, one of target {spec.name}'s releases ({releases})",
            ) from None
    elif running_torch is not None and any(
        (t.major, t.minor) == (running_torch.major, running_torch.minor) for t in spec.torch
    ):
        torch = running_torch
    else:
        raise DllmError(
            f"which torch should {spec.name} pin? ({releases})", hint="pass --torch X.Y.Z"
        )
    if not any((t.major, t.minor) == (torch.major, torch.minor) for t in spec.torch):
        raise DllmError(
            f"torch {torch} is not one of target {spec.name}'s releases ({releases})",
            hint=f"pass --torch with one of {releases}",
        )
    cuda = None
    if spec.cuda:
        if request.cuda:
            cuda = CudaVersion.parse(request.cuda)
            if cuda not in spec.cuda:
                raise DllmError(
                    f"CUDA {cuda} is not one of target {spec.name}'s",
                    hint="pass --cuda with one of "
                    + ", ".join(c.dotted for c in spec.cuda)
                    + ", or leave it out where the target lists one",
                )
        elif len(spec.cuda) == 1:
            cuda = spec.cuda[0]
        else:
            raise DllmError(f"target {spec.name} has several CUDA builds", hint="pass --cuda X.Y")
    same_torch = running_torch is not None and running_torch.base_version == torch.base_version
    # torch's Linux wheels use the C++11 ABI since 2.7; the running torch answers for itself.
    cxx11 = (
        running_abi
        if same_torch and running_abi is not None
        else (torch.major, torch.minor) >= (2, 7)
    )
    return LockPoint(spec, python, torch.base_version, cuda, bool(cxx11))


def _source_args(request: LockRequest, cuda) -> tuple[list[str], list[Index]]:
    args: list[str] = []
    indexes: list[Index] = []
    if request.index_url:
        args += ["--index-url", request.index_url]
        indexes.append(Index(url=request.index_url, kind="simple"))
    else:
        args.append("--no-index")
    extra = request.extra_index_urls
    if extra is None:
        extra = [torch_index_url(cuda)]
    for url in extra:
        args += ["--extra-index-url", url]
        indexes.append(Index(url=url, kind="simple"))
    for link in request.find_links:
        location = link if "://" in link else Path(link).resolve().as_uri()
        args += ["--find-links", location]
        indexes.append(Index(url=location, kind="find-links"))
    return args, indexes


def _wheel_of(entry: dict) -> WheelFile:
    url = entry.get("url") or entry.get("path") or ""
    filename = entry.get("name") or unquote(Path(urlparse(url).path).name)
    sha256 = (entry.get("hashes") or {}).get("sha256")
    if not sha256:
        raise DllmError(f"uv gave no sha256 for {filename}", hint="upgrade uv (pip install -U uv)")
    size = entry.get("size")
    if size is None and url.startswith("file://"):
        local = Path(unquote(urlparse(url).path))
        size = local.stat().st_size if local.is_file() else None
    return WheelFile(filename=filename, sha256=sha256, size=size)


def _pins_from_pylock(text: str) -> list[Pin]:
    import tomlkit

    data = tomlkit.parse(text).unwrap()
    pins: list[Pin] = []
    problems: list[str] = []
    for package in data.get("packages", []):
        wheels = [_wheel_of(w) for w in package.get("wheels", [])]
        if not wheels:
            problems.append(f"{package['name']}=={package.get('version')}")
            continue
        pins.append(Pin(name=package["name"], version=str(package["version"]), wheels=wheels))
    if problems:
        raise DllmError(
            f"no wheel for the target: {', '.join(problems)}",
            hint="pin a version that publishes wheels for this platform",
        )
    return sorted(pins, key=lambda p: p.name)


def lock_environment(request: LockRequest) -> EnvManifest:
    """Resolve `request` with uv and return the manifest (the caller writes it)."""
    point = lock_point(request)
    platform = request.python_platform or python_platform(point.spec.platform)
    if request.requirements is None:
        project, requirements = project_requirements(request.extras)
        requirements.append(point.torch_requirement)
    else:
        if request.project is None:
            raise DllmError("a lock from explicit requirements needs the project's name/version")
        project, requirements = request.project, list(request.requirements)
    for line in requirements:
        try:
            Requirement(line)
        except InvalidRequirement as error:
            raise DllmError(f"invalid requirement {line!r}: {error}") from error
    source_args, indexes = _source_args(request, point.cuda)
    with tempfile.TemporaryDirectory(prefix="dllm-lock-") as tmp:
        inputs = Path(tmp) / "requirements.in"
        inputs.write_text("".join(line + "\n" for line in requirements), encoding="utf-8")
        output = Path(tmp) / "pylock.toml"
        args = [
            "pip",
            "compile",
            str(inputs),
            "--format",
            "pylock.toml",
            "--output-file",
            str(output),
            "--python-version",
            point.python_dotted,
            "--python-platform",
            platform,
            "--only-binary",
            ":all:",
            "--index-strategy",
            "unsafe-best-match",
            "--no-header",
            "--quiet",
            *source_args,
        ]
        if request.offline:
            args.append("--offline")
        if request.no_deps:
            args.append("--no-deps")
        run_uv(
            args,
            what=f"resolving the environment of {point.spec.name}",
            hint="check the requirements and that the indexes are reachable "
            "(--find-links DIR adds a folder of wheels; --no-torch-index drops PyTorch's index)",
        )
        pins = _pins_from_pylock(output.read_text(encoding="utf-8"))
    pins = [p for p in pins if p.name != canonicalize_name(project.name)]
    return EnvManifest(
        target=point.spec.name,
        bundle_target=point.bundle_target(),
        python=point.python_dotted,
        python_platform=platform,
        resolver=uv_version(),
        project=project,
        requirements=requirements,
        indexes=indexes,
        packages=pins,
    )


@dataclass(frozen=True)
class Staleness:
    """How a manifest stands against what pyproject.toml asks now (`dllm env lock --check`)."""

    added: list[str]  # asked now, not among the inputs the manifest was resolved from
    removed: list[str]  # inputs it was resolved from that pyproject no longer asks
    unsatisfied: list[str]  # asked now, and no pinned or provided version meets it

    @property
    def fresh(self) -> bool:
        return not (self.added or self.removed or self.unsatisfied)


def _marker_environment(manifest: EnvManifest) -> dict[str, str]:
    """The target's values for environment markers (its Python, Linux, its machine)."""
    machine = manifest.python_platform.split("-", 1)[0]
    return {
        "python_version": manifest.python,
        "python_full_version": f"{manifest.python}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "platform_machine": machine,
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }


def lock_staleness(manifest: EnvManifest) -> Staleness:
    """Compare `manifest` with the project's dependencies (with its extras) as pyproject.toml
    lists them now. Every manifest's pins must meet them; a manifest uv resolved must also have
    been resolved from exactly them (a lock from an installed environment records that
    environment's packages as its inputs, so only the first applies)."""
    _, wanted = project_requirements(manifest.project.extras)
    versions = {
        canonicalize_name(p.name): p.version for p in [*manifest.provided, *manifest.packages]
    }
    markers = _marker_environment(manifest)
    unsatisfied = []
    for line in wanted:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate(markers):
            continue
        have = versions.get(canonicalize_name(requirement.name))
        if have is None:
            unsatisfied.append(f"{line} (not in the manifest)")
        elif not requirement.specifier.contains(Version(have), prereleases=True):
            unsatisfied.append(f"{line} (the manifest has {have})")
    added: list[str] = []
    removed: list[str] = []
    if manifest.resolver.startswith("uv "):
        torch = versions.get("torch")
        pinned_torch = {f"torch=={torch}"} if torch else set()
        recorded = {str(Requirement(line)) for line in manifest.requirements} - pinned_torch
        asked = {str(Requirement(line)) for line in wanted}
        added, removed = sorted(asked - recorded), sorted(recorded - asked)
    return Staleness(added=added, removed=removed, unsatisfied=unsatisfied)
