"""Resolve a host fingerprint against a release catalog into exactly one bundle.

The rule lives in `BundleTarget.differences`; this module applies it to every catalog entry and
keeps the trace: the choice plus every rejected candidate with the fields that differ. Zero or
several matches is an error that prints the host's values, that trace, and what to do.
"""

from __future__ import annotations

from typing import NamedTuple

from turbo_dllm.bundles.catalog import Catalog, CatalogEntry
from turbo_dllm.bundles.target import BundleTarget, FieldDifference
from turbo_dllm.errors import DllmError
from turbo_dllm.host import HostFingerprint

__all__ = [
    "BUILD_MISSING_HINT",
    "BundleUnavailable",
    "Candidate",
    "Resolution",
    "host_values",
    "resolve",
    "select_bundle",
]

BUILD_MISSING_HINT = (
    "or build one here from the package's sources: dllm bundle install --auto --build missing"
)


class BundleUnavailable(DllmError):
    """No published bundle can serve this host: none fits, or there is no index to read.

    The one case `dllm bundle install --build missing` builds for; integrity and trust failures
    are other errors and never lead to a build.
    """


class Candidate(NamedTuple):
    entry: CatalogEntry
    differences: tuple[FieldDifference, ...]

    @property
    def fits(self) -> bool:
        return not self.differences


class Resolution(NamedTuple):
    release: str
    host: HostFingerprint
    candidates: tuple[Candidate, ...]

    @property
    def matches(self) -> list[CatalogEntry]:
        return [c.entry for c in self.candidates if c.fits]

    def trace(self) -> str:
        lines = []
        for candidate in self.candidates:
            verdict = "fits" if candidate.fits else "; ".join(map(str, candidate.differences))
            lines.append(f"    {candidate.entry.target}: {verdict}")
        return "\n".join(lines) or "    (the catalog lists no bundles)"


def host_values(host: HostFingerprint) -> str:
    gpus = "+".join(str(g.arch) for g in host.gpus) or "none"
    torch = host.torch_release or "none"
    abi = {True: "cxx11", False: "cxx98", None: "unknown"}[host.cxx11_abi]
    text = (
        f"python {host.python_tag}, platform {host.platform}, torch {torch}, "
        f"cuda {host.torch_cuda or 'cpu'}, abi {abi}, gpus {gpus}"
    )
    if host.overrides:
        text += f" (overridden: {', '.join(host.overrides)})"
    return text


def resolve(catalog: Catalog, host: HostFingerprint) -> Resolution:
    candidates = tuple(
        Candidate(entry, tuple(entry.target.differences(host))) for entry in catalog.bundles
    )
    return Resolution(catalog.release, host, candidates)


def select_bundle(
    catalog: Catalog, host: HostFingerprint, *, target: BundleTarget | None = None
) -> tuple[CatalogEntry, Resolution]:
    """The one catalog entry for `host` (restricted to `target` when given), or a DllmError."""
    resolution = resolve(catalog, host)
    matches = resolution.matches
    if target is not None:
        named = [e for e in catalog.bundles if e.target == target]
        if not named:
            raise DllmError(
                f"release {catalog.release} has no bundle for target {target}\n"
                f"  candidates:\n{resolution.trace()}",
                hint="pick one of the targets above, or use --auto",
            )
        if named[0] not in matches:
            candidate = next(c for c in resolution.candidates if c.entry == named[0])
            raise DllmError(
                f"bundle {target} does not fit this host: "
                + "; ".join(map(str, candidate.differences))
                + f"\n  host: {host_values(host)}",
                hint="use --auto to pick the bundle for this host, or set DLLM_OVERRIDE_* "
                "to install for another host (see docs/bundles.md)",
            )
        return named[0], resolution
    if len(matches) == 1:
        return matches[0], resolution
    if not matches:
        # `--build missing` builds for the host it runs on, not the one DLLM_OVERRIDE_* describe
        build = (
            "or build one on a host like the one DLLM_OVERRIDE_* describe (`dllm bundle build`) "
            "and publish it"
            if host.overrides
            else BUILD_MISSING_HINT
        )
        raise BundleUnavailable(
            f"no bundle in release {catalog.release} fits this host\n"
            f"  host: {host_values(host)}\n  candidates:\n{resolution.trace()}",
            hint="install a Python/torch that one of these targets uses, run with "
            f"`kernels: reference`, {build}",
        )
    raise DllmError(
        f"{len(matches)} bundles in release {catalog.release} fit this host; expected exactly one\n"
        f"  host: {host_values(host)}\n  candidates:\n{resolution.trace()}",
        hint="pick one with --target NAME; the release's publisher should remove the overlap",
    )
