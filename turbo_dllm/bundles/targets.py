"""`bundles/targets.toml`: the build matrix, and picking the entry a build host can build.

An entry names a platform, the Python tags and torch releases it is built for, the CUDA builds of
torch it accepts (none: a CPU entry) and the GPU architectures to compile. A build always uses the
running interpreter and torch, so the concrete `BundleTarget` is the host's Python/torch/ABI plus
the entry's platform and architectures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from turbo_dllm.bundles.target import BundleTarget
from turbo_dllm.errors import DllmError
from turbo_dllm.host import CudaVersion, GpuArch, HostFingerprint, Platform, PythonTag, TorchRelease

__all__ = ["TargetSpec", "TargetsFile", "pick_build_target", "read_targets"]


class TargetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    description: str = ""
    platform: Platform
    pythons: tuple[PythonTag, ...] = Field(min_length=1)
    torch: tuple[TorchRelease, ...] = Field(min_length=1)
    cuda: tuple[CudaVersion, ...] = ()
    archs: tuple[GpuArch, ...] = ()

    @model_validator(mode="after")
    def _cuda_needs_archs(self) -> TargetSpec:
        if bool(self.cuda) != bool(self.archs):
            raise ValueError(f"target {self.name!r}: set both cuda and archs, or neither (CPU)")
        return self

    def problems(self, host: HostFingerprint) -> list[str]:
        """Why this host cannot build this entry (empty: it can)."""
        found = []
        if host.platform != self.platform:
            found.append(f"platform {host.platform} is not {self.platform}")
        if host.python_tag not in self.pythons:
            found.append(f"python {host.python_tag} not in {', '.join(map(str, self.pythons))}")
        release = host.torch_release
        if release is None:
            found.append("torch is not installed")
        elif release not in self.torch:
            found.append(f"torch {release.dotted} not in {', '.join(t.dotted for t in self.torch)}")
        if self.cuda and host.torch_cuda not in self.cuda:
            have = host.torch_cuda.dotted if host.torch_cuda else "none (CPU torch)"
            found.append(f"torch CUDA {have} not in {', '.join(c.dotted for c in self.cuda)}")
        if not self.cuda and host.torch_cuda is not None:
            found.append(
                f"a CPU target needs a CPU build of torch, this one has CUDA {host.torch_cuda.dotted}"
            )
        if host.cxx11_abi is None and release is not None:
            found.append("torch's C++ ABI is unknown")
        return found

    def bundle_target(self, host: HostFingerprint) -> BundleTarget:
        assert host.torch_release is not None and host.cxx11_abi is not None
        return BundleTarget(
            python=host.python_tag,
            torch=host.torch_release,
            cuda=host.torch_cuda if self.cuda else None,
            cxx11_abi=host.cxx11_abi,
            platform=self.platform,
            archs=self.archs,
        )


class TargetsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["turbo_dllm.targets.v1"]
    targets: tuple[TargetSpec, ...]

    @model_validator(mode="after")
    def _unique(self) -> TargetsFile:
        names = [t.name for t in self.targets]
        if len(set(names)) != len(names):
            raise ValueError("target names must be unique")
        return self


def read_targets(path: Path | None = None) -> TargetsFile:
    from turbo_dllm.bundles.resources import targets_path
    from turbo_dllm.bundles.toml import loads

    path = path or targets_path()
    try:
        return TargetsFile.model_validate(loads(path.read_text(encoding="utf-8")))
    except (OSError, ValidationError, ValueError) as error:
        raise DllmError(
            f"invalid targets file {path}: {error}",
            hint="this file ships inside turbo-dllm: reinstall the package "
            "(`pip install --force-reinstall turbo-dllm`) or undo your edit to it",
        ) from None


def pick_build_target(
    name: str, host: HostFingerprint, targets: TargetsFile | None = None
) -> tuple[TargetSpec, BundleTarget]:
    """The entry `name` (or the one entry that fits the host, for `auto`) and its target."""
    targets = targets or read_targets()
    if name != "auto":
        spec = next((t for t in targets.targets if t.name == name), None)
        if spec is None:
            known = ", ".join(t.name for t in targets.targets)
            raise DllmError(f"unknown build target {name!r}", hint=f"targets: auto, {known}")
        problems = spec.problems(host)
        if problems:
            raise DllmError(
                f"this host cannot build target {name!r}: " + "; ".join(problems),
                hint="build under the Python and torch that target lists (bundles/targets.toml)",
            )
        return spec, spec.bundle_target(host)
    reasons = {}
    fits = []
    for spec in targets.targets:
        problems = spec.problems(host)
        if spec.archs and host.gpus and not set(host.gpu_archs) <= set(spec.archs):
            problems.append(
                f"GPUs {'+'.join(map(str, host.gpu_archs))} not covered by "
                f"{'+'.join(map(str, spec.archs))}"
            )
        if spec.archs and not host.gpus:
            problems.append("no GPU visible to pick a GPU target automatically")
        if problems:
            reasons[spec.name] = problems
        else:
            fits.append(spec)
    if len(fits) == 1:
        return fits[0], fits[0].bundle_target(host)
    listing = "\n".join(f"    {n}: {'; '.join(p)}" for n, p in reasons.items())
    if not fits:
        raise DllmError(
            f"no build target fits this host ({host.summary()}):\n{listing}",
            hint="name one with --target NAME, or add an entry to bundles/targets.toml",
        )
    raise DllmError(
        f"several build targets fit this host: {', '.join(t.name for t in fits)}",
        hint="name one with --target NAME",
    )
