"""The key of a compile-cache pack: the host facts and the spec digest that decide reuse.

Inductor and Triton key their own entries on the graph, the code and the device, so a cache is
never *wrongly* reused; but a pack built under another torch, Triton, Python, CUDA or GPU
architecture is dead weight (every entry misses), and one from another model shape saves nothing.
`PackKey.differences` is the fit rule, written once, shaped like a bundle target's: exact on every
field, each difference named with the host's value and the pack's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from turbo_dllm.host import CudaVersion, GpuArch, HostFingerprint, Platform, PythonTag
from turbo_dllm.records import Record

__all__ = [
    "COMPILE_RELEVANT",
    "PackDifference",
    "PackKey",
    "compile_relevant",
    "host_pack_key",
    "spec_digest",
]

# The RunSpec fields a compiled graph depends on (section -> fields; None: the whole section).
# Left out on purpose: launch, data sources, optimizer and scheduler values, checkpointing,
# logging, profiling, step counts: none of them changes a traced graph.
COMPILE_RELEVANT: dict[str, tuple[str, ...] | None] = {
    "model": ("family", "from_config", "config_overrides", "dtype", "attention"),
    "objective": None,
    "data": ("seq_len",),
    "training": ("micro_batch_size", "activation_checkpointing", "mlp_chunks", "compile"),
    "topology": None,
    "kernels": None,
}
# `model` fields that joined the key later count only where they are set (`linear_attention`
# away from torch, `dflash` at all), so the digest of a spec without them, and so every pack
# made before, holds. `linear_attention` picks the GDN layers' kernels; a drafter's `dflash`
# section shapes it (layers, block size, architecture), its target counting by config.json like
# a model folder (the drafter is shaped after it) and its offline features not at all.
_DFLASH_PATHS = ("target", "features")
# Keys of a model folder's config.json that do not shape the model.
_CONFIG_NOISE = {"_name_or_path", "transformers_version", "architectures", "torch_dtype", "dtype"}


class PackDifference(NamedTuple):
    """One reason a pack does not fit: `field`, the host's (or run's) value, the pack's."""

    field: str
    host: str
    pack: str

    def __str__(self) -> str:
        return f"{self.field}: host {self.host}, pack {self.pack}"


class PackKey(Record):
    torch: str
    triton: str | None = None
    python: PythonTag
    cuda: CudaVersion | None = None
    gpus: tuple[GpuArch, ...] = ()
    platform: Platform
    spec_sha256: str | None = None  # None: collected without naming the spec it came from

    def differences(
        self, host: HostFingerprint, spec_sha256: str | None = None
    ) -> list[PackDifference]:
        """Every reason this pack cannot serve `host` (and the run whose digest is given)."""
        found: list[PackDifference] = []
        pairs: list[tuple[str, Any, Any]] = [
            ("python", host.python_tag, self.python),
            ("platform", host.platform, self.platform),
            ("torch", host.torch, self.torch),
            ("triton", host.triton, self.triton),
            ("cuda", host.torch_cuda, self.cuda),
            ("gpus", "+".join(map(str, host.gpu_archs)), "+".join(map(str, self.gpus))),
        ]
        for field, host_value, pack_value in pairs:
            if host_value != pack_value:
                found.append(PackDifference(field, _show(host_value), _show(pack_value)))
        if spec_sha256 is not None and self.spec_sha256 not in (None, spec_sha256):
            found.append(PackDifference("spec", spec_sha256[:12], self.spec_sha256[:12]))
        return found

    def label(self) -> str:
        """Short text for names and listings: `cp311-torch2.13.0+cpu-cpu`."""
        device = "+".join(map(str, self.gpus)) or "cpu"
        return f"{self.python}-torch{self.torch}-{device}"

    def _problems(self) -> Iterator[tuple[str, str]]:
        if self.gpus and self.cuda is None:
            yield "gpus", "a pack with GPU architectures needs a CUDA torch"


def host_pack_key(host: HostFingerprint, spec_sha256: str | None) -> PackKey:
    if host.torch is None:
        from turbo_dllm.errors import DllmError

        raise DllmError(
            "torch is not installed: there is no compile cache to pack",
            hint="pack on a host with the run's environment (`dllm env sync`), in that venv",
        )
    return PackKey(
        torch=host.torch,
        triton=host.triton,
        python=host.python_tag,
        cuda=host.torch_cuda,
        gpus=host.gpu_archs,
        platform=host.platform,
        spec_sha256=spec_sha256,
    )


def compile_relevant(spec: Any) -> dict[str, Any]:
    """The compile-relevant part of a RunSpec (a pydantic model or its JSON dict).

    A model given as a local folder (or a preset given as a config.json path) is represented by
    its config.json (minus the keys that do not shape the model), not its path: the same model
    in another folder compiles the same.
    """
    document = spec if isinstance(spec, dict) else spec.model_dump(mode="json")
    part: dict[str, Any] = {}
    for section, fields in COMPILE_RELEVANT.items():
        value = document.get(section)
        if fields is None or not isinstance(value, dict):
            part[section] = value
        else:
            part[section] = {f: value.get(f) for f in fields}
    model = document.get("model") or {}
    if model.get("linear_attention", "torch") != "torch":
        part["model"]["linear_attention"] = model["linear_attention"]
    dflash = model.get("dflash")
    if isinstance(dflash, dict):
        shape = {k: v for k, v in dflash.items() if k not in _DFLASH_PATHS}
        if dflash.get("target"):
            shape["target_config"] = _model_shape(Path(dflash["target"]) / "config.json")
        part["model"]["dflash"] = shape
    preset = model.get("from_config")
    if model.get("path"):
        part["model"]["config"] = _model_shape(Path(model["path"]) / "config.json")
    elif isinstance(preset, str) and preset.endswith(".json"):  # a config.json given by path
        part["model"]["from_config"] = None
        part["model"]["config"] = _model_shape(Path(preset))
    return part


def _model_shape(config: Path) -> dict[str, Any]:
    try:
        shape = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"unreadable_config": str(config)}
    return {k: v for k, v in sorted(shape.items()) if k not in _CONFIG_NOISE}


def spec_digest(spec: Any) -> str:
    text = json.dumps(compile_relevant(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _show(value: object) -> str:
    return "none" if value in (None, "") else str(value)
