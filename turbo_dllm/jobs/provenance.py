"""Provenance probes for the run manifest: packages, code version, kernel bundle, data, weights.

Each probe answers "what exactly would this job run with?" for one input, as plain JSON-able
values, so the manifest can pin it and a replay can compare it field by field.
"""

from __future__ import annotations

import hashlib
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from turbo_dllm.digests import sha256_files
from turbo_dllm.fsutil import sha256_file

__all__ = [
    "active_bundle_ref",
    "code_version",
    "data_ref",
    "features_ref",
    "host_fingerprint",
    "installed_packages",
    "model_shape_ref",
    "resume_ref",
    "weights_ref",
]

# The files of a Hugging Face model folder that decide what the trainer loads.
_WEIGHT_PATTERNS = ("config.json", "*.safetensors", "*.safetensors.index.json")


def installed_packages() -> dict[str, str]:
    """Every installed distribution -> version, by canonical name; the first on sys.path wins
    (the one `import` would load)."""
    from packaging.utils import canonicalize_name

    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata.get("Name") if dist.metadata else None
        if name:
            found.setdefault(canonicalize_name(name), dist.version)
    return dict(sorted(found.items()))


def host_fingerprint() -> dict[str, Any]:
    from turbo_dllm.host import collect_fingerprint

    return collect_fingerprint().model_dump(mode="json")


def active_bundle_ref() -> dict[str, Any] | None:
    """The active native-kernel bundle (id, sha256, target), or None when none is active."""
    try:
        from turbo_dllm.bundles.store import active_bundle
    except ModuleNotFoundError as error:
        if error.name != "turbo_dllm.bundles.store":
            raise
        return None  # a version without bundle support cannot have one active

    bundle = active_bundle()
    if bundle is None:
        return None
    target = getattr(bundle, "target", None)
    return {
        "bundle_id": str(bundle.bundle_id),
        "sha256": str(bundle.sha256),
        "target": None if target is None else str(target),
    }


def data_ref(artifact: str | None) -> dict[str, Any] | None:
    """The data artifact's identity (its content fingerprint); None for synthetic data."""
    if artifact is None:
        return None
    from turbo_dllm.data.artifact import read_manifest

    manifest = read_manifest(Path(artifact))
    return {
        "artifact": str(artifact),
        "fingerprint": str(manifest.fingerprint),
        "num_sequences": int(manifest.num_sequences),
        "seq_len": int(manifest.seq_len),
        "vocab_size": int(manifest.vocab_size),
    }


def features_ref(features: str | None) -> dict[str, Any] | None:
    """A DFlash feature artifact's identity, from its features.json: the content fingerprint it
    records (over what made it and every shard's sha256; the shards are not hashed again), the
    sha256 of features.json, and what made it. None for online features (no artifact), or
    where features.json is not there or not one (the launch's input checks say why)."""
    if features is None:
        return None
    from turbo_dllm.errors import DllmError
    from turbo_dllm.families.dflash.features import read_features_manifest

    try:
        manifest = read_features_manifest(features)
        document = _file_sha256(Path(features) / "features.json")
    except (DllmError, OSError):
        return None
    return {
        "artifact": str(features),
        "fingerprint": str(manifest.fingerprint),
        "manifest_sha256": document,
        "target_fingerprint": str(manifest.target_fingerprint),
        "data_fingerprint": str(manifest.data_fingerprint),
        "num_rows": int(manifest.num_rows),
        "teacher": bool(manifest.teacher),
    }


def weights_ref(model_path: str | None) -> dict[str, Any] | None:
    """The model.path folder's identity: the sha256 of its config.json, safetensors files and
    index (streamed; names relative to the folder, no paths or times); None for random init."""
    if model_path is None:
        return None
    folder = Path(model_path)
    names = sorted({p.name for pattern in _WEIGHT_PATTERNS for p in folder.glob(pattern)})
    paths = [folder / name for name in names]
    try:
        digests = sha256_files(paths)  # read once per file version (turbo_dllm.digests)
    except OSError:  # one vanished or unreadable between listing and reading: say which
        digests = [_file_sha256(path) for path in paths]
    return {"path": str(model_path), "files": dict(zip(names, digests, strict=True))}


def model_shape_ref(from_config: str | None) -> dict[str, Any] | None:
    """A `model.from_config` config.json's content (the model's shape); None for a preset name,
    or where the file is not there (the launch's input checks say so)."""
    if from_config is None or not (from_config.endswith(".json") or "/" in from_config):
        return None  # a preset: the code's own (code version)
    path = Path(from_config)
    if not path.is_file():
        return None
    return {"path": str(from_config), "files": {path.name: _digests([path])[0]}}


def resume_ref(resume: str) -> dict[str, Any] | None:
    """The checkpoint a `checkpoint.resume` path starts the run from, as the trainer resolves it
    (a run dir or a checkpoints/ folder: its newest complete step), with the sha256 of every
    file in it (names relative to the step folder); None for auto / never, or where there is no
    complete checkpoint."""
    if resume in ("auto", "never"):
        return None
    from turbo_dllm.train.checkpoint import resolve_checkpoint

    step = resolve_checkpoint(resume)
    if not (step / "checkpoint.json").is_file():
        return None
    paths = sorted(p for p in step.rglob("*") if p.is_file())
    names = [p.relative_to(step).as_posix() for p in paths]
    return {"path": str(step), "files": dict(zip(names, _digests(paths), strict=True))}


def _digests(paths: list[Path]) -> list[str]:
    try:
        return sha256_files(paths)  # read once per file version (turbo_dllm.digests)
    except OSError:  # one vanished or unreadable between listing and reading: say which
        return [_file_sha256(path) for path in paths]


def code_version() -> dict[str, Any]:
    """Package version, plus the git commit and a hash of uncommitted changes (tracked diffs and
    untracked, not-ignored files) when turbo_dllm runs from a git checkout; else those are None."""
    import turbo_dllm

    state = _git_state(Path(turbo_dllm.__file__).resolve().parent)
    return {"package_version": turbo_dllm.__version__, **state}


def _git(repo: Path, *args: str) -> bytes | None:
    try:
        proc = subprocess.run(
            ["git", "--no-optional-locks", "-C", str(repo), *args],
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _git_state(package_dir: Path) -> dict[str, Any]:
    none = {"git_commit": None, "diff_sha256": None, "dirty": None}
    top = _git(package_dir, "rev-parse", "--show-toplevel")
    if top is None:
        return none
    repo = Path(top.decode().strip())
    # The package must be tracked in that repo (not, say, a venv that sits inside a project).
    if _git(repo, "ls-files", "--error-unmatch", str(package_dir / "__init__.py")) is None:
        return none
    head = _git(repo, "rev-parse", "--verify", "HEAD")
    commit = head.decode().strip() if head else None
    diff = _git(repo, "diff", "HEAD", "--binary", "--no-ext-diff", "--no-color") if commit else b""
    untracked = _git(repo, "ls-files", "--others", "--exclude-standard", "-z") or b""
    digest = hashlib.sha256()
    digest.update(diff or b"")
    names = sorted(n for n in untracked.decode(errors="surrogateescape").split("\0") if n)
    for name in names:
        digest.update(b"\0untracked\0" + name.encode(errors="surrogateescape") + b"\0")
        digest.update(_file_sha256(repo / name).encode())
    dirty = bool(diff) or bool(names)
    return {"git_commit": commit, "diff_sha256": digest.hexdigest(), "dirty": dirty}


def _file_sha256(path: Path) -> str:
    try:
        return sha256_file(path)
    except OSError as error:  # vanished or unreadable between listing and reading
        return f"unreadable:{error.errno}"
