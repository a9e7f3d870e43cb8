"""The host: what machine, Python, torch, CUDA and GPUs this process runs on.

`collect_fingerprint()` is the one entry point; the identifiers are the typed values bundle
targets are made of. Importing this package is cheap: probes run only when called.
"""

from turbo_dllm.host.fingerprint import (
    FINGERPRINT_FORMAT,
    OVERRIDE_VARIABLES,
    GpuInfo,
    HostFingerprint,
    collect_fingerprint,
)
from turbo_dllm.host.identifiers import (
    CudaVersion,
    GpuArch,
    Identifier,
    InvalidIdentifier,
    Platform,
    PythonTag,
    TorchRelease,
)

__all__ = [
    "FINGERPRINT_FORMAT",
    "OVERRIDE_VARIABLES",
    "CudaVersion",
    "GpuArch",
    "GpuInfo",
    "HostFingerprint",
    "Identifier",
    "InvalidIdentifier",
    "Platform",
    "PythonTag",
    "TorchRelease",
    "collect_fingerprint",
]
