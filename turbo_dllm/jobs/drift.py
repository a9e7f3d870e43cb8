"""Drift: how the inputs of a job now differ from what its manifest recorded.

A replay is only the same job if the same code runs on the same kind of host with the same
packages, kernel bundle, data, weights, `model.from_config` file, `checkpoint.resume`
checkpoint and DFlash feature artifact. `manifest_drift` compares those groups field by field
(flattened to dotted paths) and ignores what legitimately differs between two runs of one job:
the host's name, times, the run id and dir. `flat_diff` is the general side-by-side comparison
behind `dllm run diff`.

Values are compared as JSON (`differ`), by type as well as value: Python's `==` took a recorded
`true` for `1` (and `1` for `1.0`), so a replay whose input changed type reported no drift.
"""

from __future__ import annotations

from typing import Any

from turbo_dllm.formats import flatten
from turbo_dllm.jobs.manifest import OPTIONAL_INPUTS, DriftItem, RunManifest, canonical_json

__all__ = [
    "DRIFT_GROUPS",
    "VOLATILE_HOST_KEYS",
    "differ",
    "flat_diff",
    "flatten",
    "manifest_drift",
]

DRIFT_GROUPS = (
    "host",
    "packages",
    "bundle",
    "data",
    "weights",
    "features",
    "model_shape",
    "resume",
    "eval_data",
    "code",
)
# Fingerprint keys that name or time a machine instead of describing what it runs.
VOLATILE_HOST_KEYS = frozenset(
    {"hostname", "host", "node", "collected_at", "created_at", "timestamp", "time", "pid", "user"}
)
# Fields of a data ref that locate rather than identify the artifact.
_DATA_IDENTITY = ("fingerprint", "num_sequences", "seq_len", "vocab_size")
_CODE_IDENTITY = ("package_version", "git_commit", "diff_sha256")
# A feature artifact's: its content fingerprint, its features.json, and what made it.
_FEATURES_IDENTITY = (
    "fingerprint",
    "manifest_sha256",
    "target_fingerprint",
    "data_fingerprint",
    "num_rows",
    "teacher",
)


def differ(recorded: Any, current: Any) -> bool:
    """Two values differ as JSON: by type as well as value. `true` is not `1`, `1` is not `1.0`,
    the string "1" is not the number 1 (Python's `==` took the first two pairs as equal)."""
    return canonical_json(recorded) != canonical_json(current)


def flat_diff(
    recorded: dict[str, Any], current: dict[str, Any], prefix: str = ""
) -> list[DriftItem]:
    """The flattened fields whose values `differ`; a field one side lacks reads as null."""
    left, right = flatten(recorded, prefix), flatten(current, prefix)
    return [
        DriftItem(field=key, recorded=left.get(key), current=right.get(key))
        for key in sorted(set(left) | set(right))
        if differ(left.get(key), right.get(key))
        and not _emptied(key, left, right)
        and not _emptied(key, right, left)
    ]


def _emptied(key: str, one: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether `key` is an empty list or dict on one side whose items the other side has: those
    items' lines say the change. It read as a line of its own, and backwards: a host that gained
    a GPU had `host.gpus: [] -> (none)` above `host.gpus[0].arch: (none) -> sm90`."""
    if one.get(key) not in ([], {}) or key in other:
        return False
    return any(k.startswith((f"{key}.", f"{key}[")) for k in other)


def manifest_drift(recorded: RunManifest, current: RunManifest) -> list[DriftItem]:
    """Every host / packages / bundle / data / weights / code field that differs, in order."""
    items: list[DriftItem] = []
    items += flat_diff(_stable_host(recorded.host), _stable_host(current.host), "host")
    items += _package_drift(recorded.packages, current.packages)
    items += _ref_drift(
        "bundle", _dump(recorded.bundle), _dump(current.bundle), ("bundle_id", "sha256")
    )
    items += _ref_drift("data", _dump(recorded.data), _dump(current.data), _DATA_IDENTITY)
    items += _weights_drift(_dump(recorded.weights), _dump(current.weights))
    # Groups added later: compared only where both manifests recorded them (one from before a
    # group existed holds no value for it, whatever its null reads as).
    both = [g for g in OPTIONAL_INPUTS if recorded.records(g) and current.records(g)]
    for group in both:
        old, new = _dump(getattr(recorded, group)), _dump(getattr(current, group))
        if group == "features":  # a drafter's feature artifact
            items += _ref_drift(group, old, new, _FEATURES_IDENTITY)
        elif group == "eval_data":  # the held-out artifact, identified as the data is
            items += _ref_drift(group, old, new, _DATA_IDENTITY)
        else:  # a drafter's target, a from_config file, a resume checkpoint
            items += _weights_drift(old, new, group)
    items += _ref_drift("code", _dump(recorded.code), _dump(current.code), _CODE_IDENTITY)
    return items


def _stable_host(host: dict[str, Any]) -> dict[str, Any]:
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in VOLATILE_HOST_KEYS}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip({k: v for k, v in host.items() if k != "format"})


def _package_drift(recorded: dict[str, str], current: dict[str, str]) -> list[DriftItem]:
    return [
        DriftItem(field=f"packages.{name}", recorded=recorded.get(name), current=current.get(name))
        for name in sorted(set(recorded) | set(current))
        if differ(recorded.get(name), current.get(name))
    ]


def _ref_drift(
    group: str, recorded: dict | None, current: dict | None, keys: tuple[str, ...]
) -> list[DriftItem]:
    if recorded is None and current is None:
        return []
    if recorded is None or current is None:
        pick = lambda ref: None if ref is None else {k: ref.get(k) for k in keys}  # noqa: E731
        return [DriftItem(field=group, recorded=pick(recorded), current=pick(current))]
    return [
        DriftItem(field=f"{group}.{key}", recorded=recorded.get(key), current=current.get(key))
        for key in keys
        if differ(recorded.get(key), current.get(key))
    ]


def _weights_drift(
    recorded: dict | None, current: dict | None, group: str = "weights"
) -> list[DriftItem]:
    """One item per model file whose content changed, appeared or vanished (paths ignored); a
    whole folder (or checkpoint) that appeared or vanished is one item with its path and files
    (the path too: a vanished resume checkpoint was named only by its files' hashes)."""
    if recorded is None or current is None:
        return _ref_drift(group, recorded, current, ("path", "files"))
    old, new = recorded["files"], current["files"]
    return [
        DriftItem(field=f"{group}.files.{name}", recorded=old.get(name), current=new.get(name))
        for name in sorted(set(old) | set(new))
        if differ(old.get(name), new.get(name))
    ]


def _dump(model: Any) -> dict | None:
    return None if model is None else model.model_dump(mode="json")
