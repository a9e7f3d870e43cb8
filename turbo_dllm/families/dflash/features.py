"""Offline target features: `dllm dflash prepare-features` writes them, training reads them.

A feature artifact is a folder:

    features.json            format turbo_dllm.dflash_features.v1: what made it (the target's
                             content fingerprint, its layer ids, the data artifact's
                             fingerprint, seq_len, whether teacher rows are there), its shards,
                             and a fingerprint over all of that and every shard's sha256
    shard_00000.safetensors  `features` (n_real, n_layers x H_t) and, for the KL loss,
                             `teacher` (n_real, H_t): only the real (non-padding) positions of
                             the shard's rows ("compact rows"); `real` (rows, L) bool says which

Rows are the data artifact's rows, in order; the training loader hands each batch's row
indices, and `FeatureStore.lookup` rebuilds the (R, L, F) features with zeros at padding
(a position no anchor's context or teacher ever reads). The features are the numbers the
online path computes (the same `TargetFeatures`, a micro-batch of rows in one forward by default;
on CPU each row gets the same numbers in any batch), so training from them gives the online loss
trace exactly on CPU; CUDA's bf16 kernels may round a row by the batch it came in.

Writing is atomic and resumable: shards go into `.<out>.partial/`, each written whole and
recorded in `progress.json` with its sha256; a rerun with the same inputs keeps the finished
shards; the folder is renamed into place at the end. Training refuses an artifact with a shard
file missing before any work, and checks each shard's sha256 on its first read. A shard is written on a thread while the
target computes the next, so two shards' rows are in host memory at most (128 rows a shard by
default: a row is seq_len x (feature layers + 1 for the teacher) x hidden x 2 bytes in bf16).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from turbo_dllm.errors import DllmError
from turbo_dllm.families.dflash.config import needs_teacher
from turbo_dllm.families.dflash.target_identity import target_fingerprint
from turbo_dllm.fsutil import save_safetensors, sha256_file
from turbo_dllm.sigterm import unwinding_on_sigterm

__all__ = [
    "FEATURES_FORMAT",
    "FeatureStore",
    "FeaturesManifest",
    "feature_problems",
    "prepare_features",
    "read_features_manifest",
    "target_fingerprint",
    "tokenizer_mismatch",
    "tokenizer_problems",
]

FEATURES_FORMAT = "turbo_dllm.dflash_features.v1"


class Shard(BaseModel):
    model_config = ConfigDict(extra="forbid")
    file: str
    first_row: int
    rows: int
    sha256: str


class FeaturesManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: Literal["turbo_dllm.dflash_features.v1"]
    fingerprint: str
    target_fingerprint: str
    target_layer_ids: list[int]
    teacher: bool
    data_fingerprint: str
    seq_len: int
    num_rows: int
    feature_size: int
    hidden_size: int
    dtype: str
    shards: list[Shard]
    # the target's last layer as the HF hidden-state tuple's last entry (after the final norm);
    # absent (False) in artifacts made before, which held that layer's output before it
    final_norm_at_last_layer: bool = False


def read_features_manifest(path: str | Path) -> FeaturesManifest:
    from turbo_dllm.formats import validate_document

    file = Path(path) / "features.json"
    try:
        document = json.loads(file.read_text())
    except FileNotFoundError:
        raise DllmError(
            f"not a feature artifact: {str(path)!r} (no features.json)",
            hint="make one with `dllm dflash prepare-features --config F`",
        ) from None
    except ValueError as error:
        raise DllmError(
            f"{file}: not JSON: {error}",
            hint="the feature artifact is damaged: make it again with `dllm dflash "
            "prepare-features --config F`",
        ) from None
    return validate_document(
        document,
        FeaturesManifest,
        expected=FEATURES_FORMAT,
        what="feature artifact",
        source=str(file),
    )


def feature_problems(manifest: FeaturesManifest, config, spec) -> list[str]:
    """Why a feature artifact cannot feed this drafter run; empty when it can."""
    found = []
    # The target's weights are hashed in full (seconds per GB; once per process for unchanged
    # files): a same-shaped target with other weights must not pass.
    actual = target_fingerprint(config.target_path)
    if manifest.target_fingerprint != actual:
        found.append(
            f"it was made from another target (fingerprint {manifest.target_fingerprint[:12]}, "
            f"{config.target_path!r} is {actual[:12]})"
        )
    if manifest.target_layer_ids != list(config.target_layer_ids):
        found.append(
            f"it holds target layers {manifest.target_layer_ids}, the drafter reads "
            f"{list(config.target_layer_ids)}"
        )
    if not manifest.final_norm_at_last_layer:
        from turbo_dllm.families.dflash import read_target_config

        last = read_target_config(config.target_path).num_hidden_layers - 1
        if last in manifest.target_layer_ids:
            found.append(
                f"it holds the target's last layer ({last}) before the final norm, as features "
                "were made before they followed transformers' hidden-state tuple (after it); "
                "make it again with `dllm dflash prepare-features`"
            )
    if (
        needs_teacher(spec.objective.dflash_loss, spec.objective.greedy_path)
        and not manifest.teacher
    ):
        found.append(
            f"it has no teacher rows, which objective.dflash_loss {spec.objective.dflash_loss}"
            f"{' with greedy_path' if spec.objective.greedy_path else ''} needs"
        )
    if manifest.seq_len != spec.data.seq_len:
        found.append(f"its seq_len is {manifest.seq_len}, data.seq_len is {spec.data.seq_len}")
    if spec.data.artifact is not None:
        from turbo_dllm.data.artifact import read_manifest

        data = read_manifest(spec.data.artifact).fingerprint
        if data != manifest.data_fingerprint:
            found.append(
                f"it was made from other data (fingerprint {manifest.data_fingerprint[:12]}, "
                f"data.artifact is {data[:12]})"
            )
    return found


def missing_shards(root: str | Path, manifest: FeaturesManifest) -> list[str]:
    """The shards `manifest` lists that are not files in `root` (a stat each: cheap, so before
    any work; training would meet one only when a batch first reads its rows)."""
    gone = [s.file for s in manifest.shards if not (Path(root) / s.file).is_file()]
    if not gone:
        return []
    named = ", ".join(gone[:3]) + (f" and {len(gone) - 3} more" if len(gone) > 3 else "")
    verb = "is" if len(gone) == 1 else "are"
    return [
        f"{len(gone)} of its {len(manifest.shards)} shards {verb} missing ({named}); make it "
        "again with `dllm dflash prepare-features`"
    ]


def input_problems(spec) -> list[tuple[str, str]]:
    """The drafter's data and feature artifact against its spec and target (the family's
    input rule)."""
    if spec.model.dflash is None:
        return []
    found = tokenizer_problems(spec)
    features = spec.model.dflash.features
    if features is None:
        return found
    from turbo_dllm.registry import resolve_model_config

    try:
        config = resolve_model_config(spec.model)
        manifest = read_features_manifest(features)
        problems = missing_shards(features, manifest) + feature_problems(manifest, config, spec)
    except DllmError as error:
        problems = [error.message]
    return found + [("model.dflash.features", f"{features!r}: {p}") for p in problems]


def tokenizer_problems(spec) -> list[tuple[str, str]]:
    """The data artifact must be tokenized with the target's tokenizer: the target reads its
    ids, and another tokenizer's ids (within the target's vocabulary) would be other text to
    it, silently. Compared where the target folder holds a tokenizer (by vocabulary)."""
    if spec.data.artifact is None:
        return []
    from turbo_dllm.data.artifact import read_manifest

    try:
        manifest = read_manifest(spec.data.artifact)
    except DllmError:
        return []  # the artifact's own checks say what is wrong with it
    problem = tokenizer_mismatch(spec.data.artifact, manifest, spec.model.dflash.target)
    return [] if problem is None else [("data.artifact", problem)]


def tokenizer_mismatch(artifact, manifest, target) -> str | None:
    """Why the data artifact `artifact` (its `manifest`) was not tokenized with the tokenizer
    saved in the `target` folder (or one it extends); None when it was, or when the folder holds
    none to compare with. The rule `tokenizer_problems` and `dllm dflash eval` share."""
    from turbo_dllm.data.tokenizers import _vocab_sha256, folder_vocabulary, vocabulary_fits

    pairs = folder_vocabulary(target)
    ours = manifest.tokenizer
    if pairs is None or vocabulary_fits(artifact, ours.vocab_sha256, pairs):
        return None
    theirs = _vocab_sha256(pairs)
    return (
        f"{str(artifact)!r} was tokenized with another tokenizer ({ours.kind}, vocabulary "
        f"sha256 {ours.vocab_sha256[:12]}) than the one in the target {str(target)!r} "
        f"(vocabulary sha256 {theirs[:12]}): the target would read its token ids as other text; "
        f"prepare the data with tokenizer {{kind: huggingface, path: {target}}}"
    )


def _plan(spec, config, data_fingerprint: str, teacher: bool) -> dict:
    return {
        "target_fingerprint": target_fingerprint(config.target_path),
        "target_layer_ids": list(config.target_layer_ids),
        "teacher": teacher,
        "data_fingerprint": data_fingerprint,
        "seq_len": spec.data.seq_len,
        "final_norm_at_last_layer": True,
    }


def prepare_features(
    spec,
    out: str | Path,
    *,
    rows_per_shard: int = 128,
    batch_rows: int | None = None,
    progress: bool = True,
    device: str | None = None,
) -> Path:
    """Run the target over every row of `spec.data.artifact` and write the feature artifact,
    `batch_rows` rows a forward (default `training.micro_batch_size`, as online training runs
    the target; a shard's rows only, so a batch never spans two shards)."""
    import torch

    from turbo_dllm.data.artifact import DataArtifact
    from turbo_dllm.families.dflash.runtime import resolve_device
    from turbo_dllm.families.dflash.target import TargetFeatures
    from turbo_dllm.fsutil import file_mode, write_atomic
    from turbo_dllm.registry import resolve_model_config

    out = Path(out)
    if spec.model.family != "dflash" or spec.data.artifact is None:
        raise DllmError(
            "prepare-features needs a dflash RunSpec with data.artifact",
            hint="the drafter's train.yaml: model.family dflash, data.artifact",
        )
    # --out as `dllm export` takes it: an existing empty folder is replaced (resuming reads the
    # staging folder `.<out>.partial/`, never --out); checked before the target is hashed
    from turbo_dllm.train.export import check_out_folder

    check_out_folder(out, "prepare-features", example="features")
    if rows_per_shard < 1:
        raise DllmError(
            f"--rows-per-shard must be at least 1 (got {rows_per_shard})",
            hint="leave --rows-per-shard out for the default",
        )
    batch_rows = spec.training.micro_batch_size if batch_rows is None else batch_rows
    if batch_rows < 1:
        raise DllmError(
            f"--batch-rows must be at least 1 (got {batch_rows})",
            hint="leave --batch-rows out for training.micro_batch_size",
        )
    # data of another tokenizer than the target's would be features of other text, refused
    # only when training reads them (the family's input rule): here, before the target is read
    for key, problem in tokenizer_problems(spec):
        raise DllmError(
            f"{key}: {problem}",
            hint="prepare the drafter's data with the target's tokenizer, then the features",
        )
    # before the staging folder: a bad --device must not leave an empty one behind
    torch_device = resolve_device(device)
    config = resolve_model_config(spec.model)
    data = DataArtifact(spec.data.artifact)
    if data.manifest.seq_len != spec.data.seq_len:
        raise DllmError(
            f"data.seq_len is {spec.data.seq_len}, the artifact holds {data.manifest.seq_len}",
            hint=f"set data.seq_len: {data.manifest.seq_len} (--set "
            f"data.seq_len={data.manifest.seq_len}), or prepare the data again with "
            f"packing.seq_len: {spec.data.seq_len}",
        )
    teacher = needs_teacher(spec.objective.dflash_loss, spec.objective.greedy_path)
    plan = _plan(spec, config, data.manifest.fingerprint, teacher)
    # the target's (and so the shards') dtype, as online: bf16 on CUDA, float32 on CPU
    torch_dtype = torch.bfloat16 if torch_device.type == "cuda" else torch.float32
    dtype = str(torch_dtype).removeprefix("torch.")
    staging = out.parent / f".{out.name}.partial"
    # one writer: a second run into the same --out shared the staging folder (the two wrote
    # each other's shard temp files and progress record, and the later one failed on a name
    # the earlier one's rename had taken away; with another plan it emptied the folder under it)
    # SIGTERM (`timeout`, a scheduler's limit) unwinds as Ctrl-C does: the shard the writer
    # thread finished meanwhile is recorded, not made again by the rerun
    with _one_writer(staging, out), unwinding_on_sigterm():
        progress_file = staging / "progress.json"
        done: dict[str, str] = {}
        if progress_file.is_file():
            try:  # written atomically; a damaged one (a disk error, an edit) starts over
                record = json.loads(progress_file.read_text())
            except (OSError, ValueError):
                record = None
            if (
                isinstance(record, dict)
                and isinstance(record.get("shards"), dict)
                and record.get("plan") == plan
                and record.get("rows_per_shard") == rows_per_shard
                and record.get("dtype") == dtype  # another device: other numbers
            ):
                done = record["shards"]  # resume: keep what a previous run finished
            else:  # emptied, not removed: this process holds the folder itself
                for child in staging.iterdir():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
        # compiled like the online target's (training.compile), so both give the same numbers
        target = TargetFeatures(
            config.target_path,
            config,
            teacher=teacher,
            device=torch_device,
            dtype=torch_dtype,
            compile=spec.training.compile,
        )
        total = len(data)
        shards: list[Shard] = []
        bar = _Bar(total, enabled=progress)
        record = {"plan": plan, "rows_per_shard": rows_per_shard, "dtype": dtype, "shards": done}

        def finish(shard: Shard) -> None:
            """Record a shard whose file is whole (in order, on this thread)."""
            done[shard.file] = shard.sha256
            write_atomic(progress_file, json.dumps(record))
            shards.append(shard)

        # Each shard is written and hashed on a thread while the target computes the next (on a
        # GPU the writing took as long as the computing): two shards in memory at most.
        mode = file_mode()  # read here: reading the umask on the thread would race the main one
        with ThreadPoolExecutor(max_workers=1) as writer:
            pending = None
            for first in range(0, total, rows_per_shard):
                rows = list(range(first, min(first + rows_per_shard, total)))
                name = f"shard_{first // rows_per_shard:05d}.safetensors"
                # a finished shard is kept as recorded: a changed or torn one (a disk error, a
                # copy) is made again, not listed in the manifest under the sha256 it no longer has
                if (
                    name in done
                    and (staging / name).is_file()
                    and sha256_file(staging / name) == done[name]
                ):
                    if pending is not None:
                        finish(pending.result())
                        pending = None
                    bar.advance(len(rows))
                    shards.append(
                        Shard(file=name, first_row=first, rows=len(rows), sha256=done[name])
                    )
                    continue
                try:
                    tensors = _shard_tensors(data, rows, target, batch_rows, bar)
                except BaseException as error:
                    if pending is not None:  # the shard written meanwhile is recorded, so kept
                        finish(pending.result())
                        pending = None
                    if not isinstance(error, torch.OutOfMemoryError):
                        raise
                    raise DllmError(
                        f"the target ran out of device memory on {batch_rows} rows of "
                        f"{spec.data.seq_len} tokens a forward (shard {name})",
                        hint=f"run it again with a smaller --batch-rows (e.g. --batch-rows "
                        f"{max(1, batch_rows // 2)}): the shards written so far are kept",
                    ) from None
                if pending is not None:
                    finish(pending.result())
                shard = Shard(file=name, first_row=first, rows=len(rows), sha256="")
                pending = writer.submit(_write_shard, tensors, staging, shard, mode)
            if pending is not None:
                finish(pending.result())
        bar.close()
        body = {
            **plan,
            "num_rows": total,
            "feature_size": config.feature_size,
            "hidden_size": config.target_hidden_size,
            "dtype": dtype,
            "shards": [s.model_dump() for s in shards],
        }
        fingerprint = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        manifest = FeaturesManifest(format=FEATURES_FORMAT, fingerprint=fingerprint, **body)
        progress_file.unlink()
        write_atomic(staging / "features.json", manifest.model_dump_json(indent=2) + "\n")
        if out.exists():
            out.rmdir()  # an empty --out, replaced
        staging.rename(out)
        return out


@contextmanager
def _one_writer(staging: Path, out: Path) -> Iterator[None]:
    """Make and hold the staging folder `staging` of `out` (an exclusive `flock` on the folder
    itself, as a checkpoint folder is held) while this process writes into it; a folder another
    run holds is refused. Where the file system has no flock, unguarded as before."""
    import fcntl
    import os

    from turbo_dllm.train.export import check_out_folder

    staging.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:  # renamed into --out by a run that just finished
        check_out_folder(out, "prepare-features", example="features")
        raise
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DllmError(
                f"another prepare-features is writing {str(out)!r} (into {str(staging)!r})",
                hint="wait for it to end, or stop it (a rerun goes on from the shards it "
                "finished); or choose another --out",
            ) from None
        except OSError:  # a file system without flock (some NFS and Lustre mounts)
            pass
        # the run that held it may have finished into --out meanwhile
        check_out_folder(out, "prepare-features", example="features")
        yield
    finally:
        os.close(fd)


def _shard_tensors(data, rows: list[int], target, batch_rows: int, bar) -> dict:
    """The tensors of one shard: the target run over its `rows`, `batch_rows` a forward."""
    import torch

    feats, teach, real = [], [], []
    for start in range(0, len(rows), batch_rows):
        batch = rows[start : start + batch_rows]
        ids, docs, keep = [], [], []
        for row in batch:
            row_ids, _, row_docs = data.row(row)
            ids.append(torch.from_numpy(row_ids))
            docs.append(torch.from_numpy(row_docs).long())
            keep.append(~torch.from_numpy(data.padding(row)))
        f, t = target(torch.stack(ids), torch.stack(docs))
        for i, row_keep in enumerate(keep):  # compact rows: the real positions only
            feats.append(f[i][row_keep.to(f.device)].cpu())
            if t is not None:
                teach.append(t[i][row_keep.to(t.device)].cpu())
        real.extend(keep)
        bar.advance(len(batch))
    tensors = {"features": torch.cat(feats).contiguous(), "real": torch.stack(real)}
    if teach:
        tensors["teacher"] = torch.cat(teach).contiguous()
    return tensors


def _write_shard(tensors: dict, staging: Path, shard: Shard, mode: int) -> Shard:
    """Write a shard whole (a temp name, renamed) and return it with its sha256."""
    partial = staging / (shard.file + ".tmp")
    save_safetensors(tensors, partial, mode=mode)
    partial.rename(staging / shard.file)
    return shard.model_copy(update={"sha256": sha256_file(staging / shard.file)})


class _Bar:
    """A rich progress bar on a terminal, a line every few shards otherwise (stderr)."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        self.total, self.count, self.enabled = total, 0, enabled
        self._bar = None
        if enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._bar = Progress(
                TextColumn("[bold]features[/]"),
                BarColumn(),
                MofNCompleteColumn(),
                console=Console(stderr=True),
            )
            self._task = self._bar.add_task("features", total=total)
            self._bar.start()

    def advance(self, rows: int) -> None:
        self.count += rows
        if self._bar is not None:
            self._bar.update(self._task, advance=rows)
        elif self.enabled and (self.count == self.total or self.count % 256 == 0):
            print(f"features: {self.count}/{self.total} rows", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


class FeatureStore:
    """Rows of a feature artifact, rebuilt to (R, L, F) for a batch's row indices."""

    def __init__(self, path: str | Path) -> None:
        self.root = Path(path)
        self.manifest = read_features_manifest(path)
        self._open: dict[str, dict] = {}
        self._checked: set[str] = set()  # shards whose bytes matched their sha256

    def _shard(self, shard: Shard) -> dict:
        if shard.file not in self._open:
            from safetensors import SafetensorError
            from safetensors.torch import load, load_file

            file = self.root / shard.file
            try:
                if shard.file in self._checked:
                    tensors = load_file(str(file))
                else:  # the first read of a shard checks it (one read: hashed in memory)
                    raw = file.read_bytes()
                    if hashlib.sha256(raw).hexdigest() != shard.sha256:
                        raise ValueError("its sha256 is not the one features.json records")
                    tensors = load(raw)
                    self._checked.add(shard.file)
            except (OSError, ValueError, SafetensorError) as error:
                # a damaged shard is features of no target: never train on its numbers
                raise DllmError(
                    f"feature artifact {str(self.root)!r}: {shard.file} cannot be read "
                    f"({error}); the file changed or was lost after it was written",
                    hint="make the feature artifact again with `dllm dflash prepare-features` "
                    "(or copy it whole)",
                ) from None
            counts = tensors["real"].sum(1)
            offsets = [0]
            for c in counts.tolist():
                offsets.append(offsets[-1] + int(c))
            tensors["offsets"] = offsets
            self._open = {shard.file: tensors}  # one shard in memory at a time
        return self._open[shard.file]

    def lookup(self, rows, device, span: slice | None = None):
        """(features (R, L, F), teacher (R, L, H) or None) of the artifact's `rows`; with
        `span` (context parallelism: this rank's shard) the features of those positions only,
        (R, span length, F), so no rank builds the whole context's features."""
        import torch

        m = self.manifest
        length = m.seq_len
        dtype = getattr(torch, m.dtype)
        start, stop = (0, length) if span is None else (span.start, span.stop)
        features = torch.zeros(len(rows), stop - start, m.feature_size, dtype=dtype)
        teacher = torch.zeros(len(rows), length, m.hidden_size, dtype=dtype) if m.teacher else None
        per_shard = m.shards[0].rows
        for i, row in enumerate(rows.tolist()):
            shard = m.shards[row // per_shard]
            tensors = self._shard(shard)
            local = row - shard.first_row
            lo, hi = tensors["offsets"][local], tensors["offsets"][local + 1]
            real = tensors["real"][local]
            first = lo + int(real[:start].sum())  # compact rows: real positions before the span
            inside = real[start:stop]
            features[i, inside] = tensors["features"][first : first + int(inside.sum())]
            if teacher is not None:
                teacher[i, real] = tensors["teacher"][lo:hi]
        return features.to(device), None if teacher is None else teacher.to(device)
