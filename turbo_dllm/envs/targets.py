"""Targets as the environment code sees them: `bundles/targets.toml` entries and manifest files.

A manifest is named after a targets.toml entry (`manifests/cpu-x86_64.toml`) and fixes one point
of that entry: one Python, one torch build. That point is the concrete bundle target the
environment needs (`cp311-torch2.13-cpu-cxx11-linux_x86_64`), recorded in the manifest as
`bundle_target`, so one name selects both the packages and the native kernels of a host.

`auto` picks the manifest whose bundle target fits this host on the fields an environment does
not install itself (Python, platform, GPUs): a fresh host has no torch yet, and a drifted torch
must still find its manifest to be reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from turbo_dllm.errors import DllmError

__all__ = [
    "ENVIRONMENT_FIELDS",
    "auto_target",
    "manifest_differences",
    "manifest_dirs",
    "python_platform",
    "source_root",
    "target_spec",
    "torch_index_url",
    "torch_local_label",
]

PYTORCH_INDEX = "https://download.pytorch.org/whl"
# Fields of a bundle target that a host has before its environment is installed.
ENVIRONMENT_FIELDS = frozenset({"python", "platform", "gpus"})


def target_spec(name: str):
    """The `bundles/targets.toml` entry called `name` (a `TargetSpec`)."""
    from turbo_dllm.bundles.targets import read_targets

    targets = read_targets()
    spec = next((t for t in targets.targets if t.name == name), None)
    if spec is None:
        known = ", ".join(t.name for t in targets.targets)
        raise DllmError(f"unknown target {name!r}", hint=f"targets (bundles/targets.toml): {known}")
    return spec


def torch_local_label(cuda) -> str:
    """The local version label of torch's build: `cpu`, or `cu130` for CUDA 13.0."""
    return "cpu" if cuda is None else str(cuda)


def torch_index_url(cuda) -> str:
    """PyTorch's own index for a torch build (its CPU and CUDA builds live there)."""
    return f"{PYTORCH_INDEX}/{torch_local_label(cuda)}"


def python_platform(platform, manylinux: str = "2_28") -> str:
    """uv's `--python-platform` for a wheel platform: `linux_x86_64` -> `x86_64-manylinux_2_28`.

    torch's Linux wheels are manylinux_2_28, so no host that runs torch is older than that.
    """
    text = str(platform)
    if text.startswith("linux_"):
        return f"{text.removeprefix('linux_')}-manylinux_{manylinux}"
    raise DllmError(
        f"no uv platform for target platform {text!r}",
        hint="pass --python-platform explicitly (see `uv pip compile --help`)",
    )


def source_root() -> Path | None:
    """The source checkout this package runs from (editable install), if any."""
    import turbo_dllm

    root = Path(turbo_dllm.__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and 'name = "turbo-dllm"' in pyproject.read_text(encoding="utf-8"):
        return root
    return None


def manifest_dirs() -> list[Path]:
    """Where shipped manifests live: the package's `_data/manifests` (a link to the checkout's
    `manifests/`, copied into wheels), else the checkout's `manifests/`."""
    package = Path(__file__).resolve().parent.parent
    candidates = [package / "_data" / "manifests", package.parent / "manifests"]
    return [d for d in candidates if d.is_dir()][:1]


def manifest_differences(manifest, host) -> list:
    """Why `manifest`'s environment cannot serve `host` (empty: it can)."""
    from turbo_dllm.bundles.target import BundleTarget

    target = BundleTarget.parse(manifest.bundle_target)
    return [d for d in target.differences(host) if d.field in ENVIRONMENT_FIELDS]


def auto_target(manifests: Mapping[str, object], *, what: str = "environment manifest") -> str:
    """The one manifest (by target name) that fits this host; an error listing reasons otherwise.

    When several fit a host without GPUs (a CUDA target also "covers" zero GPUs), the CPU ones win.
    """
    from turbo_dllm.bundles.target import BundleTarget
    from turbo_dllm.host import collect_fingerprint

    host = collect_fingerprint()
    fits: list[str] = []
    reasons: list[str] = []
    for name, manifest in sorted(manifests.items()):
        differences = manifest_differences(manifest, host)
        if differences:
            reasons.append(f"  {name}: " + "; ".join(map(str, differences)))
        else:
            fits.append(name)
    if len(fits) > 1 and not host.gpus:
        cpu = [n for n in fits if BundleTarget.parse(manifests[n].bundle_target).cuda is None]
        fits = cpu or fits
    if len(fits) == 1:
        return fits[0]
    if not fits:
        listing = "\n".join(reasons) or "  (none)"
        raise DllmError(
            f"no {what} fits this host ({host.summary()}):\n{listing}",
            hint="pass --target NAME, or make one with `dllm env lock --target NAME` (on a host "
            "whose environment is already right: add --from-environment)",
        )
    raise DllmError(f"several {what}s fit this host: {', '.join(fits)}", hint="pass --target NAME")
