"""The host fingerprint: every fact that decides which native-kernel bundle this machine needs.

`collect_fingerprint()` reads the probes (no torch import, no CUDA init) and then applies the
`DLLM_OVERRIDE_*` environment variables, the way conda's `CONDA_OVERRIDE_CUDA` lets a GPU-less
login node solve for a GPU target. Overridden fields are listed in `overrides`, so nothing that
reads a fingerprint can mistake a pretend host for a real one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

from turbo_dllm.errors import DllmError
from turbo_dllm.host import probes
from turbo_dllm.host.identifiers import (
    CudaVersion,
    GpuArch,
    InvalidIdentifier,
    Platform,
    PythonTag,
    TorchRelease,
)
from turbo_dllm.records import Record

__all__ = [
    "FINGERPRINT_FORMAT",
    "OVERRIDE_VARIABLES",
    "GpuInfo",
    "HostFingerprint",
    "collect_fingerprint",
]

FINGERPRINT_FORMAT = "turbo_dllm.fingerprint.v1"
_NONE_WORDS = {"", "none", "cpu", "no"}


class GpuInfo(Record):
    index: int
    name: str
    arch: GpuArch

    def _problems(self) -> Iterator[tuple[str, str]]:
        if self.index < 0:
            yield "index", f"must be >= 0, got {self.index}"


class HostFingerprint(Record):
    """What this host is, for bundle selection. No paths, no timestamps, no serial numbers.

    `python` is the interpreter version (3.12.7), `python_tag` its ABI tag (cp312), `platform`
    the OS and CPU in wheel-tag spelling (linux_x86_64), `torch` torch's full version
    (2.11.0+cu130), `torch_cuda` the CUDA torch was built with, `cxx11_abi` torch's
    _GLIBCXX_USE_CXX11_ABI, `driver` the NVIDIA kernel driver; `overrides` lists the fields taken
    from DLLM_OVERRIDE_* variables instead of probes, `notes` the probes that could not answer.
    """

    format: Literal["turbo_dllm.fingerprint.v1"] = FINGERPRINT_FORMAT
    python: str
    python_tag: PythonTag
    platform: Platform
    glibc: str | None = None
    torch: str | None = None
    torch_cuda: CudaVersion | None = None
    cxx11_abi: bool | None = None
    driver: str | None = None
    gpus: tuple[GpuInfo, ...] = ()
    nccl: str | None = None
    triton: str | None = None
    overrides: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def torch_release(self) -> TorchRelease | None:
        return TorchRelease.parse(self.torch) if self.torch else None

    @property
    def gpu_archs(self) -> tuple[GpuArch, ...]:
        """Distinct architectures of the visible GPUs, sorted."""
        return tuple(sorted({gpu.arch for gpu in self.gpus}))

    def summary(self) -> str:
        """One line for humans: `cp312 linux_x86_64 torch 2.11.0+cu130 (cu130) 8x sm90`."""
        torch = f"torch {self.torch}" if self.torch else "no torch"
        cuda = f" ({self.torch_cuda})" if self.torch_cuda else " (cpu)" if self.torch else ""
        if self.gpus:
            counts: dict[str, int] = {}
            for gpu in self.gpus:
                counts[str(gpu.arch)] = counts.get(str(gpu.arch), 0) + 1
            gpus = ", ".join(f"{n}x {arch}" for arch, n in sorted(counts.items()))
        else:
            gpus = "no GPU"
        return f"{self.python_tag} {self.platform} {torch}{cuda}, {gpus}"


def _parse_python(value: str) -> dict[str, Any]:
    tag = PythonTag.parse(value)
    return {"python": f"{tag.major}.{tag.minor}", "python_tag": tag}


def _parse_optional(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse_value(value: str) -> Any:
        return None if value.strip().lower() in _NONE_WORDS else parse(value.strip())

    return parse_value


def _parse_bool(value: str) -> bool | None:
    word = value.strip().lower()
    if word in {"1", "true", "yes", "cxx11"}:
        return True
    if word in {"0", "false", "no", "cxx98"}:
        return False
    if word in {"", "none"}:
        return None
    raise InvalidIdentifier(f"invalid C++11 ABI flag: {value!r}", hint="write 1 or 0")


def _parse_gpus(value: str) -> tuple[GpuInfo, ...]:
    if value.strip().lower() in _NONE_WORDS:
        return ()
    archs = [GpuArch.parse(token) for token in value.split(",") if token.strip()]
    return tuple(
        GpuInfo(index=i, name=f"override {arch}", arch=arch) for i, arch in enumerate(archs)
    )


def _parse_torch(value: str) -> str | None:
    word = value.strip()
    if word.lower() in {"", "none"}:
        return None
    TorchRelease.parse(word)  # validates
    return word


# variable -> (fields it sets, parser returning {field: value})
OVERRIDE_VARIABLES: dict[str, tuple[str, Callable[[str], dict[str, Any]]]] = {
    "DLLM_OVERRIDE_PYTHON": ("python version / ABI tag: 3.12 or cp312", _parse_python),
    "DLLM_OVERRIDE_PLATFORM": (
        "platform: linux_x86_64",
        lambda v: {"platform": Platform.parse(v)},
    ),
    "DLLM_OVERRIDE_GLIBC": (
        "glibc version: 2.35, or none",
        lambda v: {"glibc": _parse_optional(str)(v)},
    ),
    "DLLM_OVERRIDE_TORCH": (
        "torch version: 2.11 or 2.11.0+cu130, or none",
        lambda v: {"torch": _parse_torch(v)},
    ),
    "DLLM_OVERRIDE_CUDA": (
        "CUDA version torch was built with: 13.0 or cu130, or none for a CPU torch",
        lambda v: {"torch_cuda": _parse_optional(CudaVersion.parse)(v)},
    ),
    "DLLM_OVERRIDE_CXX11_ABI": (
        "torch's C++11 ABI flag: 1 or 0",
        lambda v: {"cxx11_abi": _parse_bool(v)},
    ),
    "DLLM_OVERRIDE_DRIVER": (
        "NVIDIA driver version: 580.95.05, or none",
        lambda v: {"driver": _parse_optional(str)(v)},
    ),
    "DLLM_OVERRIDE_GPUS": (
        "visible GPUs as architectures: sm90,sm90 (empty or none: no GPU)",
        lambda v: {"gpus": _parse_gpus(v)},
    ),
    "DLLM_OVERRIDE_NCCL": ("NCCL version, or none", lambda v: {"nccl": _parse_optional(str)(v)}),
    "DLLM_OVERRIDE_TRITON": (
        "Triton version, or none",
        lambda v: {"triton": _parse_optional(str)(v)},
    ),
}


def collect_fingerprint(
    *, apply_overrides: bool = True, environ: Mapping[str, str] | None = None
) -> HostFingerprint:
    """Probe this host; then apply DLLM_OVERRIDE_* (unless `apply_overrides` is False).

    The kernel loader passes `apply_overrides=False`: it must check the process it runs in, not
    the host a user asked to resolve for.
    """
    env = os.environ if environ is None else environ
    torch = probes.probe_torch()
    gpu_probe = probes.probe_gpus()
    notes = [*torch.notes, *gpu_probe.notes]
    gpus = []
    for index, name, capability in gpu_probe.gpus:
        try:
            gpus.append(GpuInfo(index=index, name=name, arch=GpuArch.parse(capability)))
        except InvalidIdentifier:
            notes.append(
                f"GPU {index} ({name}) reports an unknown compute capability {capability!r}"
            )
    fields: dict[str, Any] = {
        "python": sys.version.split()[0],  # what platform.python_version() returns
        "python_tag": PythonTag.running(),
        "platform": Platform.running(),
        "glibc": probes.probe_glibc(),
        "torch": torch.version,
        "torch_cuda": CudaVersion.parse(torch.cuda) if torch.cuda else None,
        "cxx11_abi": torch.cxx11_abi,
        "driver": probes.probe_driver(),
        "gpus": tuple(gpus),
        "nccl": probes.probe_package_version(
            "nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"
        ),
        "triton": probes.probe_package_version("triton", "pytorch-triton"),
    }
    overridden: list[str] = []
    if apply_overrides:
        for variable, (_, parse) in OVERRIDE_VARIABLES.items():
            if variable not in env:
                continue
            try:
                values = parse(env[variable])
            except InvalidIdentifier as error:
                raise DllmError(
                    f"{variable}={env[variable]!r}: {error.message}",
                    hint=error.hint or f"unset {variable} or fix its value",
                ) from None
            fields.update(values)
            overridden.extend(values)
    return HostFingerprint(**fields, overrides=tuple(overridden), notes=tuple(notes))
