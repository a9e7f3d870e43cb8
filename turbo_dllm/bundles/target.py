"""A bundle target: the exact host a native-kernel bundle was built for, as one typed value.

Canonical text (also part of the archive name):

    cp312-torch2.11-cu130-cxx11-linux_x86_64-sm90      CUDA build, GPU architectures joined by +
    cp311-torch2.13-cpu-cxx11-linux_x86_64             CPU build (no architecture field)

Fields, in order: Python ABI tag, torch major.minor, torch's CUDA build (or `cpu`), C++ ABI
(`cxx11` / `cxx98`), platform, GPU architectures. `BundleTarget.parse(str(t)) == t` always holds.
`differences(host)` is the selection rule of the design, written once: exact on every field, and
the architectures must cover every visible GPU.
"""

from __future__ import annotations

from typing import NamedTuple

from turbo_dllm.host import (
    CudaVersion,
    GpuArch,
    HostFingerprint,
    Identifier,
    InvalidIdentifier,
    Platform,
    PythonTag,
    TorchRelease,
)

__all__ = ["BundleTarget", "FieldDifference"]

# How a bundle target is written (`--target`, a catalog's entries).
_TARGET_SHAPE = (
    "write it as cp312-torch2.11-cu130-cxx11-linux_x86_64-sm90 "
    "or cp312-torch2.11-cpu-cxx11-linux_x86_64"
)


class FieldDifference(NamedTuple):
    """One reason a target does not fit a host: `field`, the host's value, the target's."""

    field: str
    host: str
    target: str

    def __str__(self) -> str:
        return f"{self.field}: host {self.host}, bundle {self.target}"


class BundleTarget(Identifier):
    __slots__ = ("python", "torch", "cuda", "cxx11_abi", "platform", "archs")
    python: PythonTag
    torch: TorchRelease
    cuda: CudaVersion | None
    cxx11_abi: bool
    platform: Platform
    archs: tuple[GpuArch, ...]

    def __init__(
        self,
        python: PythonTag,
        torch: TorchRelease,
        cuda: CudaVersion | None,
        cxx11_abi: bool,
        platform: Platform,
        archs: tuple[GpuArch, ...] = (),
    ) -> None:
        self._init(
            python=python,
            torch=torch,
            cuda=cuda,
            cxx11_abi=cxx11_abi,
            platform=platform,
            archs=tuple(sorted(set(archs))),  # one canonical form
        )
        if self.cuda is None and self.archs:
            raise InvalidIdentifier(
                f"a CPU target has no GPU architectures: {self!s}",
                hint="drop the -smXX field of a cpu target (cp312-torch2.11-cpu-cxx11-"
                "linux_x86_64), or name the CUDA build (cu130) in its third field",
            )
        if self.cuda is not None and not self.archs:
            raise InvalidIdentifier(
                f"a CUDA target needs GPU architectures: {self!s}",
                hint="append them, e.g. -sm90",
            )

    @classmethod
    def parse(cls, text: str) -> BundleTarget:
        parts = text.strip().split("-")
        if len(parts) not in (5, 6):
            raise InvalidIdentifier(f"invalid bundle target: {text!r}", hint=_TARGET_SHAPE)
        python, torch, cuda, abi, platform = parts[:5]
        if not torch.startswith("torch"):
            raise InvalidIdentifier(
                f"invalid bundle target: {text!r}: second field {torch!r} must look like torch2.11",
                hint=_TARGET_SHAPE,
            )
        if abi not in ("cxx11", "cxx98"):
            raise InvalidIdentifier(
                f"invalid bundle target: {text!r}: fourth field {abi!r} must be cxx11 or cxx98",
                hint=_TARGET_SHAPE,
            )
        archs = tuple(GpuArch.parse(a) for a in parts[5].split("+")) if len(parts) == 6 else ()
        return cls(
            python=PythonTag.parse(python),
            torch=TorchRelease.parse(torch),
            cuda=None if cuda == "cpu" else CudaVersion.parse(cuda),
            cxx11_abi=abi == "cxx11",
            platform=Platform.parse(platform),
            archs=archs,
        )

    @property
    def kind(self) -> str:
        return "cpu" if self.cuda is None else "cuda"

    def __str__(self) -> str:
        fields = [
            str(self.python),
            str(self.torch),
            str(self.cuda) if self.cuda else "cpu",
            "cxx11" if self.cxx11_abi else "cxx98",
            str(self.platform),
        ]
        if self.archs:
            fields.append("+".join(str(a) for a in self.archs))
        return "-".join(fields)

    def differences(self, host: HostFingerprint) -> list[FieldDifference]:
        """Every reason this target cannot serve `host`; empty means it fits."""
        found: list[FieldDifference] = []

        def differ(field: str, host_value: object, target_value: object) -> None:
            found.append(FieldDifference(field, _show(host_value), _show(target_value)))

        if host.python_tag != self.python:
            differ("python", host.python_tag, self.python)
        if host.platform != self.platform:
            differ("platform", host.platform, self.platform)
        if host.torch_release != self.torch:
            differ("torch", host.torch_release, self.torch)
        if host.torch_cuda != self.cuda:
            differ("cuda", host.torch_cuda or "cpu", self.cuda or "cpu")
        if host.cxx11_abi != self.cxx11_abi:
            differ("cxx11_abi", host.cxx11_abi, self.cxx11_abi)
        uncovered = [a for a in host.gpu_archs if a not in self.archs]
        if uncovered:  # a CPU target has no architectures: it serves hosts without GPUs
            differ(
                "gpus",
                "+".join(map(str, host.gpu_archs)),
                "+".join(map(str, self.archs)) or "none",
            )
        return found


def _show(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)
