"""Load native ops from the active bundle, after checking they belong in this process.

Checks, in order, each failing with what differs and the command that fixes it: a bundle is
active; its target fits this process (Python, platform, torch major.minor, torch CUDA, C++ ABI,
visible GPUs); the op's source hash equals the hash of the sources this turbo-dllm ships; the
op's files match bundle.json (its library; a Triton op's source and compiled kernels). Only then is it loaded (torch.ops.load_library) and given its
Python side (autograd, fake kernels). The result is cached per (bundle, op) for the process.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import NamedTuple

from turbo_dllm import __version__
from turbo_dllm.bundles.manifest import BundleFile
from turbo_dllm.bundles.store import BundleStore, DamagedBundle, InstalledBundle
from turbo_dllm.errors import DllmError

__all__ = [
    "ROLLBACK_COMMAND",
    "InactiveBundles",
    "LoadedOp",
    "inactive_bundles",
    "install_command",
    "load_bundle_op",
    "load_bundle_triton_op",
    "process_fingerprint",
    "seed_compiled_kernels",
]

_LOCK = threading.Lock()
_CACHE: dict[tuple[str, str], LoadedOp] = {}


@dataclass(frozen=True)
class LoadedOp:
    name: str
    namespace: str
    devices: tuple[str, ...]
    bundle_id: str
    sha256: str
    source: str | None = None  # a Triton op: the path of its module inside the bundle


def install_command() -> str:
    """The command that installs this turbo-dllm version's bundle, as it runs when pasted here:
    without DLLM_BUNDLE_INDEX, `--auto` stops at "no bundle index given", so the command then
    names `--index URL` for the user to fill in (the release server, or `--mirror DIR`)."""
    from turbo_dllm.bundles.sources import INDEX_VARIABLE

    command = f"dllm bundle install --release v{__version__} --auto"
    return command if os.environ.get(INDEX_VARIABLE) else f"{command} --index URL"


ROLLBACK_COMMAND = "dllm bundle rollback"


class InactiveBundles(NamedTuple):
    """What the store holds while no bundle is active, and the command that makes one active."""

    detail: str  # e.g. "0.1.0-<target> (<sha>) is installed"
    command: str  # ROLLBACK_COMMAND or `install_command()`

    @property
    def rollback(self) -> bool:
        return self.command == ROLLBACK_COMMAND

    def hint(self, alternative: str | None = None) -> str:
        """The fix line: the command, then what it does and `alternative` after a shell '#'."""
        notes = ["re-activates it"] if self.rollback else []
        notes += [alternative] if alternative else []
        return f"{self.command}   # {'; '.join(notes)}" if notes else self.command


def inactive_bundles(store: BundleStore | None = None, fingerprint=None) -> InactiveBundles | None:
    """For a store with no active bundle: the bundles it still holds (`dllm bundle deactivate`
    keeps the active one installed, as the store's previous bundle) and the command that makes
    one active: `dllm bundle rollback` where that previous bundle is readable and fits
    `fingerprint` (a fingerprint, or a function that returns one, called only when there is a
    bundle to compare; default: this process), else the install command. None when the store
    holds no bundle at all."""
    store = store or BundleStore()
    previous = store.linked("previous")
    if isinstance(previous, DamagedBundle):
        return InactiveBundles(
            f"the installed bundle {previous.short_sha} is damaged: {previous.problem}",
            install_command(),
        )
    if previous is not None:
        name = f"{previous.bundle_id} ({previous.short_sha})"
        host = fingerprint or process_fingerprint
        differences = previous.target.differences(host() if callable(host) else host)
        if differences:
            return InactiveBundles(
                f"{name} is installed, but built for another environment: "
                + "; ".join(map(str, differences)),
                install_command(),
            )
        return InactiveBundles(f"{name} is installed", ROLLBACK_COMMAND)
    try:
        entries = store.entries()
    except OSError:  # an unreadable store: nothing to name
        return None
    if not entries:
        return None
    names = ", ".join(
        f"{e.bundle_id} ({e.short_sha})" if isinstance(e, InstalledBundle) else e.short_sha
        for e in entries
    )
    verb = "is" if len(entries) == 1 else "are"
    return InactiveBundles(f"{names} {verb} installed", install_command())


def process_fingerprint():
    """The fingerprint of this very process: torch imported (exact ABI), no overrides."""
    import torch  # noqa: F401  (probe_torch reads the imported module: exact values)

    from turbo_dllm.host import collect_fingerprint

    return collect_fingerprint(apply_overrides=False)


def check_bundle_fits(bundle: InstalledBundle, fingerprint=None) -> None:
    differences = bundle.target.differences(fingerprint or process_fingerprint())
    if differences:
        raise DllmError(
            f"the active kernel bundle {bundle.bundle_id} ({bundle.short_sha}) was built for "
            f"another environment: " + "; ".join(map(str, differences)),
            hint=f"install the bundle for this environment: {install_command()}",
        )


def load_bundle_op(name: str, store: BundleStore | None = None) -> LoadedOp:
    """Load op `name` from the active bundle (cached); DllmError with a fix on any mismatch."""
    store = store or BundleStore()
    key = (os.path.realpath(store.root / "active"), name)
    with _LOCK:
        cached = _CACHE.get(key)
        if cached is not None:
            return cached
        loaded = _load(name, store)
        _CACHE[key] = loaded
        return loaded


def _load(name: str, store: BundleStore) -> LoadedOp:
    import torch

    from turbo_dllm.bundles.native import load_native_op
    from turbo_dllm.kernels.ops import register_python_side

    bundle = store.active()
    if bundle is None:
        inactive = inactive_bundles(store)
        if inactive is not None:  # e.g. `dllm bundle deactivate`: installed, none active
            raise DllmError(
                "no native-kernel bundle is active (kernels: native needs one): " + inactive.detail,
                hint=inactive.hint("or use `kernels: reference`"),
            )
        raise DllmError(
            "no native-kernel bundle is installed (kernels: native needs one)",
            hint=f"{install_command()}   # or use `kernels: reference`",
        )
    check_bundle_fits(bundle)
    op = bundle.manifest.op(name)
    if op is None:
        raise DllmError(
            f"the active bundle {bundle.bundle_id} has no op {name!r}",
            hint=f"install the bundle of this turbo-dllm version: {install_command()}",
        )
    native = load_native_op(name)
    expected = native.source_sha256()
    if op.source_sha256 != expected:
        raise DllmError(
            f"op {name!r} in the active bundle {bundle.bundle_id} was built from other sources "
            f"than turbo-dllm {__version__} ships (source sha256 {op.source_sha256[:12]} vs "
            f"{expected[:12]})",
            hint=f"{install_command()}; while developing kernels use `kernels: jit`",
        )
    library = bundle.path / op.library
    _check_file(bundle, next(f for f in bundle.manifest.files if f.path == op.library), store)
    if native.spec.is_triton:  # imported from the bundle's copy, named by the source hash
        # ... with every other file of the op (its compiled kernels): a damaged one is refused
        # here, where doctor and the trainer's start load the op, not at its first launch
        for entry in bundle.manifest.files:
            if entry.path.startswith(f"triton/{name}/") and entry.path != op.library:
                _check_file(bundle, entry, store)
        from turbo_dllm.kernels.triton_ops import import_triton_source

        module = import_triton_source(library, name, op.source_sha256)
        return LoadedOp(
            name, module.__name__, tuple(op.devices), bundle.bundle_id, bundle.sha256, str(library)
        )
    if not hasattr(getattr(torch.ops, op.namespace), name):
        try:
            torch.ops.load_library(str(library))
        except OSError as error:
            raise DllmError(
                f"cannot load {library}: {error}",
                hint="an 'undefined symbol' means a torch or C++ ABI mismatch; "
                f"{install_command()}",
            ) from None
    register_python_side(name, op.namespace)
    return LoadedOp(name, op.namespace, tuple(op.devices), bundle.bundle_id, bundle.sha256)


def _check_file(
    bundle: InstalledBundle, entry: BundleFile, store: BundleStore | None = None
) -> None:
    """A file the loader is about to use has the bytes bundle.json lists for it.

    The fix installs this very bundle again from where its install.json says it came
    (`--index https://...` or `--mirror DIR`, `BundleStore.reinstall_command`): it was
    `install_command()`'s `--index URL`, left for the user to fill in although the store knew."""
    from turbo_dllm.fsutil import sha256_file

    path = bundle.path / entry.path
    if not path.is_file():
        problem = "is missing from the bundle (removed after install)"
    elif sha256_file(path) != entry.sha256:
        problem = "does not match its bundle.json (damaged or modified after install)"
    else:
        return
    command = (store or BundleStore()).reinstall_command(bundle.sha256) or install_command()
    # The command alone, to paste ("dllm bundle verify; then CMD" stopped bash at `then`).
    raise DllmError(
        f"{path} {problem}",
        hint=f"install the bundle again: {command} (dllm bundle verify names every damaged file)",
    )


def seed_compiled_kernels(name: str, store: BundleStore | None = None) -> int:
    """Hand the active bundle's compiled Triton kernels of op `name` to this process's Triton
    cache (bundles/triton_cache.py), every file checked against bundle.json first; returns the
    entries written. Called where the op is about to launch, not by checks (doctor loads ops
    without touching any cache)."""
    from turbo_dllm.bundles.triton_cache import seed, triton_cache_dir

    load_bundle_op(name, store)  # the op's checks first
    bundle = (store or BundleStore()).active()
    prefix = f"triton/{name}/compiled/"
    entries = [f for f in bundle.manifest.files if f.path.startswith(prefix)]
    for entry in entries:
        _check_file(bundle, entry, store)
    if not entries:
        return 0
    cache = triton_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    return seed(bundle.path / prefix, cache)


def load_bundle_triton_op(name: str, store: BundleStore | None = None) -> tuple[str, str]:
    """(module path in the active bundle, source sha256) of Triton op `name`, checked."""
    loaded = load_bundle_op(name, store)
    if loaded.source is None:
        raise DllmError(f"op {name!r} of the active bundle is not a Triton op")
    from turbo_dllm.bundles.native import load_native_op

    return loaded.source, load_native_op(name).source_sha256()
