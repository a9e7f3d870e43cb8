"""The run manifest (`turbo_dllm.run_manifest.v1`): what a run pinned, written before it starts.

A manifest records the resolved RunSpec (and its hash), the host fingerprint, the installed
Python packages, the active kernel bundle, the data artifact's fingerprint, the content hashes of
the model.path weights (and of a from_config file, a resume checkpoint, a DFlash drafter's
target and feature artifact), the code version, the
seeds, the JobPlan and the exact commands. `dllm launch --manifest` replays it and refuses
when any of those inputs drifted. It is written atomically and never replaced: a run dir holds
one job.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from turbo_dllm.errors import DllmError
from turbo_dllm.formats import validate_document
from turbo_dllm.fsutil import synced_temp_file
from turbo_dllm.jobs.plan import JobPlan

__all__ = [
    "FORMAT",
    "OPTIONAL_INPUTS",
    "BundleRef",
    "CodeVersion",
    "DataRef",
    "DriftItem",
    "FeaturesRef",
    "ReplayRef",
    "RunManifest",
    "WeightsRef",
    "canonical_json",
    "read_manifest",
    "sha256_json",
    "spec_sha256",
    "write_exclusive",
    "write_manifest",
]

FORMAT = "turbo_dllm.run_manifest.v1"
MANIFEST_NAME = "manifest.json"
# The input groups added to the manifest after its first version, in the order they came. A
# manifest says which of them it recorded (`recorded_inputs`): one from before a group existed
# did not record it, and a replay or a diff never compares it on that group. Their value alone
# cannot say so (null is also "recorded: none"), nor can the keys of a manifest dumped again
# from this model, which writes every field.
OPTIONAL_INPUTS = ("target_weights", "features", "model_shape", "resume", "eval_data")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CodeVersion(_Strict):
    package_version: str
    git_commit: str | None = None
    diff_sha256: str | None = Field(
        None, description="sha256 of `git diff HEAD` plus untracked, not-ignored files"
    )
    dirty: bool | None = None


class BundleRef(_Strict):
    bundle_id: str
    sha256: str
    target: str | None = None


class DataRef(_Strict):
    artifact: str
    fingerprint: str
    num_sequences: int
    seq_len: int
    vocab_size: int


class WeightsRef(_Strict):
    """The model.path folder's content: sha256 of each file that defines the model."""

    path: str
    files: dict[str, str] = Field(description="file name -> sha256 (config, safetensors, index)")


class FeaturesRef(_Strict):
    """A DFlash feature artifact (`model.dflash.features`) by what its features.json records:
    the content fingerprint over its inputs and every shard's sha256 (the shards are not read
    again: they run to gigabytes), the sha256 of features.json itself, and what made it."""

    artifact: str
    fingerprint: str
    manifest_sha256: str
    target_fingerprint: str
    data_fingerprint: str
    num_rows: int
    teacher: bool


class DriftItem(_Strict):
    field: str
    recorded: Any
    current: Any

    def __str__(self) -> str:
        recorded, current = _show(self.recorded), _show(self.current)
        if recorded == current:  # differ by type only ("1" and 1): both as JSON, strings quoted
            recorded, current = _json(self.recorded), _json(self.current)
        return f"{self.field}: {recorded} -> {current}"


class ReplayRef(_Strict):
    run_id: str
    manifest: str
    manifest_sha256: str
    drift: list[DriftItem] = Field(
        default_factory=list, description="inputs that differed, when replayed with --allow-drift"
    )


class RunManifest(_Strict):
    format: Literal["turbo_dllm.run_manifest.v1"] = FORMAT
    run_id: str
    created_at: str
    argv: list[str] = Field(description="the `dllm launch` command that made this run")
    spec: dict[str, Any]
    spec_sha256: str
    host: dict[str, Any]
    packages: dict[str, str]
    bundle: BundleRef | None
    data: DataRef | None
    weights: WeightsRef | None = None  # None: random init (or a manifest from before weights)
    # A DFlash drafter's frozen target (model.dflash.target): its features and head are what
    # the drafter learns from. Absent from other families' manifests and older ones.
    target_weights: WeightsRef | None = None
    # Its feature artifact (model.dflash.features; None: the target runs online). Absent from
    # other families' manifests and older ones, whose replays then do not compare it.
    features: FeaturesRef | None = None
    # What else the spec reads by path: a `model.from_config` config.json (the model's shape) and
    # a `checkpoint.resume` checkpoint (the step the run starts from, as resolved: a run dir or a
    # checkpoints/ folder names its newest complete step). None where the spec names none; absent
    # from older manifests, whose replays then do not compare them.
    model_shape: WeightsRef | None = None
    resume: WeightsRef | None = None
    # The held-out artifact the `eval:` section scores (None: no evaluation): a replay's
    # eval_loss is comparable only on the same held-out sequences. Absent from older manifests.
    eval_data: DataRef | None = None
    # Which OPTIONAL_INPUTS this manifest recorded. A manifest written before this field has the
    # keys of the groups its version wrote (write_manifest writes every field of its version):
    # those it recorded, read once from the file itself (`_recorded_inputs`) and kept from then
    # on, so a manifest dumped again still says what it recorded.
    recorded_inputs: list[
        Literal["target_weights", "features", "model_shape", "resume", "eval_data"]
    ] = Field(default_factory=lambda: list(OPTIONAL_INPUTS))
    code: CodeVersion
    seeds: dict[str, int]
    plan: JobPlan
    commands: list[list[str]]
    replay_of: ReplayRef | None = None

    def records(self, group: str) -> bool:
        """Whether this manifest recorded input `group` (a value, null included); a group not
        in OPTIONAL_INPUTS is in every manifest."""
        return group not in OPTIONAL_INPUTS or group in self.recorded_inputs

    @model_validator(mode="before")
    @classmethod
    def _recorded_inputs(cls, data: Any) -> Any:
        """A manifest from before `recorded_inputs` recorded the groups it has keys for; and
        none records a group it holds no key for (write_manifest writes every field)."""
        if isinstance(data, dict):
            listed = data.get("recorded_inputs", OPTIONAL_INPUTS)
            if isinstance(listed, list | tuple):  # else: refused as the field's type
                kept = [g for g in listed if g not in OPTIONAL_INPUTS or g in data]
                data = {**data, "recorded_inputs": kept}  # an unknown name: refused below
        return data

    def recorded(self, section: str, key: str) -> Any:
        """`spec[section][key]` as recorded, None where the spec lacks it (one recorded by
        another version, or edited with its hash rewritten)."""
        part = self.spec.get(section)
        return part.get(key) if isinstance(part, dict) else None

    @model_validator(mode="after")
    def _consistent(self) -> RunManifest:
        if self.spec_sha256 != spec_sha256(self.spec):
            raise ValueError("spec_sha256 does not match the recorded spec")
        if self.commands != [c.argv for c in self.plan.commands]:
            raise ValueError("commands do not match plan.commands")
        if self.run_id != self.plan.run_id:
            raise ValueError("run_id does not match plan.run_id")
        return self


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_json(value: Any) -> str:
    return hashlib.sha256(canonical_json(value)).hexdigest()


def spec_sha256(spec: dict[str, Any]) -> str:
    """Hash of the job a spec describes: its canonical JSON without `launch.run_dir` (where a run
    is written is not what it computes, so a replay into a new dir keeps the hash)."""
    launch = spec.get("launch", {})
    if not isinstance(launch, dict):  # an edited manifest's `launch: null`: no hash matches it
        return sha256_json(spec)
    return sha256_json({**spec, "launch": {k: v for k, v in launch.items() if k != "run_dir"}})


def read_manifest(path: str | Path) -> RunManifest:
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_NAME
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DllmError(
            f"run manifest not found: {str(path)!r}",
            hint="pass runs/<id>/manifest.json (see `dllm run list`)",
        ) from None
    except json.JSONDecodeError as error:
        if path.suffix.lower() not in (".yaml", ".yml"):
            raise _unreadable_manifest(path, error) from None
        # a RunSpec given where a manifest goes (`dllm launch --manifest train.yaml`)
        raise DllmError(
            f"{str(path)!r} is a YAML file, not a run manifest (the manifest.json `dllm launch` "
            "writes into a run dir)",
            hint=f"to launch that RunSpec, pass it as --config {_config_word(path)}; to "
            "replay a run, pass its runs/<id>/manifest.json (see `dllm run list`)",
        ) from None
    except (OSError, UnicodeDecodeError, RecursionError) as error:
        raise _unreadable_manifest(path, error) from None
    try:
        return validate_document(
            document,
            RunManifest,
            expected=FORMAT,
            what="run manifest",
            source=str(path),
            hint="pass an unmodified manifest.json that `dllm launch` wrote into a run dir",
        )
    except DllmError as error:
        newer = _written_by_a_newer_version(document)
        if newer is None:
            raise
        who, version = newer
        problems = error.message.partition("is not a valid run manifest: ")[2]
        detail = f", which does not read it ({problems})" if problems else ""
        upgrade = f"'turbo-dllm>={version}'" if version else "-U turbo-dllm"
        raise DllmError(
            f"{path} was written by {who}, newer than this turbo-dllm {_version()}{detail}",
            hint="read or replay it with the turbo-dllm that wrote it (the same environment "
            f"as the run's), or install it here: python -m pip install {upgrade}",
        ) from None


def _version() -> str:
    from turbo_dllm import __version__

    return __version__


def _written_by_a_newer_version(document: Any) -> tuple[str, str | None] | None:
    """Who wrote a manifest this version cannot read, where that is a later turbo-dllm (and its
    version where recorded): a later `code.package_version` (whose new fields this version does
    not know) or a later format (`turbo_dllm.run_manifest.v2`). None: damaged or edited, as far
    as this one can tell."""
    from packaging.version import InvalidVersion, Version

    code = document.get("code") if isinstance(document, dict) else None
    recorded = code.get("package_version") if isinstance(code, dict) else None
    try:
        newer = isinstance(recorded, str) and Version(recorded) > Version(_version())
    except InvalidVersion:
        newer = False
    found = document.get("format") if isinstance(document, dict) else None
    prefix, _, number = FORMAT.rpartition(".v")
    later = isinstance(found, str) and found.startswith(f"{prefix}.v")
    later = later and found.removeprefix(f"{prefix}.v").isdigit()
    later = later and int(found.removeprefix(f"{prefix}.v")) > int(number)
    if not (newer or later):
        return None
    who = f"turbo-dllm {recorded}" if newer else "a later turbo-dllm"
    return (f"{who} (format {found})" if later else who), (recorded if newer else None)


def _unreadable_manifest(path: Path, error: BaseException) -> DllmError:
    why = "nested deeper than JSON is parsed" if isinstance(error, RecursionError) else error
    return DllmError(
        f"cannot read run manifest {str(path)!r}: {why}",
        hint="it is torn or was edited: `dllm launch` writes it once, whole; a run dir "
        "without a readable manifest cannot be shown, diffed or replayed",
    )


def manifest_bytes(manifest: RunManifest) -> bytes:
    return (json.dumps(manifest.model_dump(mode="json"), indent=2, sort_keys=True) + "\n").encode()


def write_manifest(manifest: RunManifest, run_dir: Path) -> Path:
    """Write run_dir/manifest.json atomically; refuse to replace an existing one."""
    return write_exclusive(Path(run_dir) / MANIFEST_NAME, manifest_bytes(manifest))


def write_exclusive(path: Path, data: bytes) -> Path:
    """Atomically create `path` with `data`: readers see the whole file or none; never replaces.

    The bytes go to a temporary file in the same folder (fsynced), which is then hard-linked to
    the final name; link() fails if the name exists, so two writers cannot both win.
    """
    with synced_temp_file(path, data) as tmp:
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise DllmError(
                f"{path} already exists; a run dir holds one job",
                hint="launch into a new run dir (leave --run-dir unset for a fresh one)",
            ) from None
        except OSError:  # filesystems without hard links: exclusive-create then rename
            if path.exists():
                raise DllmError(
                    f"{path} already exists; a run dir holds one job",
                    hint="launch into a new run dir (leave --run-dir unset for a fresh one)",
                ) from None
            os.replace(tmp, path)
    return path


def _config_word(path: Path) -> str:
    """`path` as the pasted word after --config: quoted, and ./-t.yaml for one that starts
    with "-" (`--config -t.yaml` reads as a missing value)."""
    text = str(path)
    return shlex.quote(f"./{text}" if text.startswith("-") else text)


def _show(value: Any) -> str:
    """A drift value as read: `(none)` for none, a string as it is, a folder's record (its path
    and every file's sha256) as its path and file count, anything else as JSON. The record read
    as JSON was one long line of hashes, without its path for a folder that vanished."""
    if value is None:
        return "(none)"
    if isinstance(value, dict) and isinstance(value.get("files"), dict) and len(value) <= 2:
        count = len(value["files"])
        return f"{value.get('path') or 'a folder'} ({count} file{'s' if count != 1 else ''})"
    return value if isinstance(value, str) else _json(value)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)
