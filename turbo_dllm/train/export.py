"""Export a training checkpoint as a Hugging Face folder (config.json + model.safetensors, or
model-0000i-of-0000N.safetensors and their index past `max_shard_size`, as transformers shards).

Runs in one process on the CPU whatever data-parallel size saved the checkpoint: DCP reads the
sharded model tensors back as full tensors. The optimizer state is not read. The folder is
written next to its destination (a hidden `.<out>.partial-<host>-<pid>-<random>` of its own, removed
on an error, Ctrl-C or SIGTERM, or by the next export once its process was killed), synced to disk and renamed into place, so it is complete or absent,
a crash included; two exports to one --out do not share it, and the second to finish fails.

Beside the weights, a folder `generate` can use needs the tokenizer and the token that ends a
sequence. Both are copied from where training got them (recorded in the checkpoint by
`export_sources`): the model.path folder's generation_config.json and tokenizer files; for a
random-init model trained on a prepared data artifact, the artifact's tokenizer and special
token ids (its pad only where the tokenizer has one: a pad token is never invented,
`_own_pad`). Without a source generation_config.json, one is written from the config's ids.
config.json says what the run trained with where the family's config leaves it open
(`_as_trained`): the mask token a masking objective denoised from (recorded in the checkpoint,
`export_sources`), DiffusionGemma's `canvas_length` as the run's block size, and
Nemotron-Labs-Diffusion's `block_size` where its config had none.
A model whose HF layout holds tensors it neither reads nor trains (`hf_source_prefixes`:
DiffusionGemma's vision tower) gets them copied unchanged from the model.path folder, and one
whose folder loads through code of its own (`auto_map`: Nemotron-Labs-Diffusion) that code.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from turbo_dllm.errors import DllmError
from turbo_dllm.fsutil import fsync_dir, make_temp_dir, owned_prefix, sweep_orphans, working_name
from turbo_dllm.sigterm import unwinding_on_sigterm

__all__ = ["check_out_folder", "export_checkpoint", "export_sources"]

GENERATION_CONFIG = "generation_config.json"
_TOKEN_ID_FIELDS = {"bos": "bos_token_id", "eos": "eos_token_id", "pad": "pad_token_id"}


def export_sources(spec, mask_token_id: int | None) -> dict[str, Any]:
    """The checkpoint fields export reads beyond the model: the folders it copies from
    (absolute paths) and `mask_token_id`, the mask token the run's data used
    (`train.data.DataSource`), recorded where the objective masks with it (else None: an
    autoregressive or SFT model never saw one). Synthetic data's default, its vocabulary's last
    id, is in no other record."""

    def absolute(path: str | None) -> str | None:
        return str(Path(path).absolute()) if path else None

    masks = spec.objective.name in _MASKING_OBJECTIVES
    return {
        "model_path": absolute(spec.model.path),
        "data_artifact": absolute(spec.data.artifact),
        "mask_token_id": int(mask_token_id) if masks and mask_token_id is not None else None,
    }


def export_checkpoint(
    checkpoint: str | Path,
    out: str | Path,
    dtype: str | None = None,
    *,
    finish: Callable[[Path], None] | None = None,
    max_shard_size: int | str | None = None,
    read: list[Path] | None = None,
) -> Path:
    """Write `checkpoint`'s model to `out` in the HF layout; returns `out`. `finish(folder)`
    adds files to the folder before it is renamed into place (`dllm dflash export`'s record).
    Weights past `max_shard_size` bytes (default: transformers' 50GB) are split into shards
    (`save_hf`). `read`, where given, receives the step folder exported (a `checkpoints/`
    folder or run dir: its newest complete step, a newer one where a run training into it pruned
    that one while it was read)."""
    import torch

    from turbo_dllm.registry import get_family
    from turbo_dllm.train.checkpoint import load_tensors, read_meta, resolve_checkpoint
    from turbo_dllm.train.weights import (
        DEFAULT_MAX_SHARD_SIZE,
        allocate,
        full_state_dict,
        parse_shard_size,
    )

    # A bad size is refused before the checkpoint is read.
    shard_bytes = parse_shard_size(
        DEFAULT_MAX_SHARD_SIZE if max_shard_size is None else max_shard_size
    )

    given, out = checkpoint, Path(out)
    checkpoint = resolve_checkpoint(given)  # a checkpoints/ folder: its newest
    for attempt in range(_PRUNED_RETRIES + 1):
        was_there = (checkpoint / "checkpoint.json").is_file()
        try:
            meta = read_meta(checkpoint)
            check_out_folder(out, "the export", example="hf")
            name = dtype or meta.param_dtype
            if name not in ("float32", "bfloat16"):
                raise DllmError(f"unknown dtype {name!r}", hint="use float32 or bfloat16")
            # Checkpoints written before the registry name no family: the decoder read them all.
            family = get_family(meta.family or "causal_lm")
            config = family.read_config(meta.model)
            model = allocate(family.runtime().build_model(config, None), torch.device("cpu"))
            external = set(getattr(model, "external_weights", ()))  # not exported
            state = {"model": {k: v for k, v in model.state_dict().items() if k not in external}}
            load_tensors(state, checkpoint)
            break
        except DllmError:
            if not was_there or checkpoint.exists():
                raise  # not there to begin with, or still there: damaged, or another problem
            checkpoint = _pruned_meanwhile(given, checkpoint, attempt < _PRUNED_RETRIES)
    if read is not None:
        read.append(checkpoint)
    missing, _ = model.load_state_dict(state["model"], strict=not external)
    if set(missing) - external:
        raise DllmError(
            f"the checkpoint lacks {sorted(set(missing) - external)[:5]}",
            hint="its files are incomplete or of another model than its checkpoint.json describes: "
            "export another checkpoint of the run (--checkpoint RUN/checkpoints takes the newest)",
        )
    tensors = full_state_dict(model)
    if hasattr(model, "hf_export_state"):  # a family whose HF layout holds more names
        tensors = model.hf_export_state(tensors)
    _refuse_non_finite(tensors, checkpoint)
    prefixes = tuple(getattr(model, "hf_source_prefixes", ()))
    _warn_if_sources_gone(meta, prefixes)
    tensors.update(_source_tensors(meta, prefixes))
    staging: Path | None = None
    # SIGTERM (`timeout`, a scheduler's limit) unwinds as Ctrl-C does: the staging folder goes.
    with unwinding_on_sigterm():
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            # A name of its own: a second export to the same --out used to share `.<out>.partial`
            # and delete the first's folder while it was written (then rename it half-made).
            # Its host and pid tell a killed export's leftover (model-sized) from a running one's.
            partial = working_name(out.name, ".partial-")
            sweep_orphans(out.parent, partial)
            staging = make_temp_dir(out.parent, owned_prefix(partial))
            _write_folder(staging, meta, model, config, tensors, name, shard_bytes, finish)
            _publish(staging, out)
        except OSError as error:  # --out under a file, a read-only or a full disk
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
            raise DllmError(
                f"cannot write the export to {str(out)!r}: {error.strerror or error}",
                hint="pass --out a new folder in a writable place",
            ) from None
        except BaseException:  # an error or an interrupt: no half-written folder stays behind
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
            raise
    return out


# How many newer steps an export takes, each pruned while it was read, before it gives up.
_PRUNED_RETRIES = 5


def _pruned_meanwhile(given: str | Path, read: Path, again: bool) -> Path:
    """The step to read instead of `read`, which was complete when its read began and is gone
    now: a run training into its folder pruned it (checkpoint.keep_last). Where `given` names
    the folder or its run, their newest complete step, said in a note; where it named that step
    itself, an error saying what happened. (A `dllm export` of a running run failed, as a
    damaged checkpoint or one that does not exist, whenever the run saved and pruned while it
    read the step.)"""
    from turbo_dllm.train.checkpoint import resolve_checkpoint

    newer = resolve_checkpoint(given)
    if not again:  # pruned every time: the run saves faster than a step is read
        raise DllmError(
            f"the checkpoint {str(read)!r} was removed while it was read, as were the "
            f"{_PRUNED_RETRIES} before it (a run training into {read.parent} pruned each: "
            "checkpoint.keep_last)",
            hint="stop that run first, or export from a copy of a step_<N> folder",
        )
    if newer != read and (newer / "checkpoint.json").is_file():
        print(
            f"note: {read.name} was removed while it was read (a run training into "
            f"{read.parent} pruned it: checkpoint.keep_last); exporting {newer.name}",
            file=sys.stderr,
            flush=True,
        )
        return newer
    raise DllmError(
        f"the checkpoint {str(read)!r} was removed while it was read (a run training into "
        f"{read.parent} pruned it: checkpoint.keep_last)",
        hint=f"export the newest step instead: --checkpoint {read.parent} takes it (or stop "
        "that run first)",
    ) from None


def _write_folder(staging, meta, model, config, tensors, dtype, shard_bytes, finish) -> None:
    """The export's files, in `staging`: weights and config, the family's HF config changes,
    tokenizer and generation files, the mask token record, remote code, `finish`'s files."""
    import torch

    from turbo_dllm.train.weights import save_hf

    written = _as_trained(meta, config)  # the run's mask token and block size
    save_hf(tensors, written, staging, dtype=getattr(torch, dtype), max_shard_size=shard_bytes)
    if hasattr(model, "hf_export_config"):  # a family whose HF config is not its checkpoint's
        path = staging / "config.json"
        hf = model.hf_export_config(json.loads(path.read_text()))
        path.write_text(json.dumps(hf, indent=2) + "\n")
    _copy_generation_files(meta, staging)
    if not hasattr(config, "mask_token_id"):  # a family config that records none (decoder)
        _record_mask_token(meta, staging)
    _keep_remote_code(meta, staging)
    if finish is not None:
        finish(staging)


def _publish(staging: Path, out: Path) -> None:
    """Rename the written folder into place, its files and entries synced to disk first and
    the rename after, so a crash or power loss leaves no folder or a whole one (renamed
    unsynced, a folder whose config.json and weights were still in the page cache could stand
    with empty or short files). An empty `out` is replaced by the rename itself; one that was
    filled meanwhile (another export) makes it fail, ENOTEMPTY or EEXIST, and is not touched."""
    for file in staging.rglob("*"):
        if file.is_file() and not file.is_symlink():
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())
    for folder in [*(p for p in staging.rglob("*") if p.is_dir()), staging]:
        fsync_dir(folder)
    try:
        os.rename(staging, out)
    except OSError as error:
        if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        raise DllmError(
            f"{str(out)!r} already exists and is not empty: it was written while this export "
            "ran (another export to the same --out?), and is left as it is",
            hint="choose a new folder",
        ) from None
    fsync_dir(out.parent)


def check_out_folder(out: Path, replaces: str, *, example: str) -> None:
    """`--out` of a command that writes a whole folder beside it and renames it into place
    (`replaces` it: "the export"): absent, or an empty folder. Named as the user gave it: a file
    (an empty one was "not empty" too), a path under a file (the staging folder's mkdir named a
    hidden `.<out>.partial`), a folder with files in it, the shell's own folder (replaced, the
    shell would be left in a removed one; `--out .` was "Invalid argument"). Commands check it
    before their slow work (hashing a target reads every byte of it)."""
    if out.exists() and not out.is_dir():
        raise DllmError(f"{str(out)!r} is a file, not a folder", hint="choose a new folder")
    above = next((p for p in out.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise DllmError(
            f"cannot write --out {str(out)!r}: {str(above)!r} is a file, not a folder",
            hint="pass --out a new folder in a writable place",
        )
    if out.exists() and any(out.iterdir()):
        raise DllmError(f"{str(out)!r} already exists and is not empty", hint="choose a new folder")
    if out.exists() and Path.cwd().resolve().is_relative_to(out.resolve()):
        raise DllmError(
            f"{str(out)!r} is the current folder: {replaces} replaces its --out folder",
            hint=f"pass --out a new folder inside it, e.g. --out {example}",
        )


def _refuse_non_finite(tensors: dict[str, Any], checkpoint: Path) -> None:
    """A run that diverged can save a checkpoint whose weights are already nan or inf (the
    step's update was; its loss is only seen at the next step): exported, it was a folder that
    loads and generates garbage."""
    import torch

    bad = [
        name
        for name, tensor in tensors.items()
        if torch.is_floating_point(tensor) and not bool(torch.isfinite(tensor).all())
    ]
    if bad:
        shown = ", ".join(bad[:3]) + (", ..." if len(bad) > 3 else "")
        raise DllmError(
            f"the checkpoint {str(checkpoint)!r} holds non-finite weights (nan or inf in "
            f"{len(bad)} of {len(tensors)} tensors: {shown}); training diverged before it was "
            "saved",
            hint="export an earlier checkpoints/step_<N> folder, or train again with a lower "
            "optimizer.lr and training.clip_grad_norm set",
        )


def _warn_if_sources_gone(meta, prefixes: tuple[str, ...]) -> None:
    """Say which source folder moved or was deleted since training, what the export lacks for
    it and what it takes instead (`_copy_generation_files`)."""
    model_path = Path(meta.model_path) if meta.model_path else None
    artifact = Path(meta.data_artifact) if meta.data_artifact else None
    if model_path is not None and not model_path.is_dir():
        lost = "its tokenizer and generation_config.json"
        if prefixes:
            lost += f" and its {', '.join(p + '*' for p in prefixes)} tensors"
        instead = []
        if _artifact_tokenizer(meta, artifact):
            instead.append(f"the tokenizer is the data artifact {artifact}'s copy")
        text = meta.model.get("text_config")
        ids = text if isinstance(text, dict) else meta.model
        if any(ids.get(field) is not None for field in _TOKEN_ID_FIELDS.values()):
            instead.append("generation_config.json is written from config.json's token ids")
        print(
            f"warning: {model_path} (recorded in the checkpoint) is gone: the export lacks "
            f"{lost}{''.join('; ' + line for line in instead)} (move the folder back to that "
            "path and export again to carry them over)",
            file=sys.stderr,
        )
    if artifact is not None and not artifact.is_dir():
        print(
            f"warning: {artifact} (recorded in the checkpoint) is gone: the export has no "
            "tokenizer or generation_config.json from it",
            file=sys.stderr,
        )


def _artifact_tokenizer(meta, artifact: Path | None) -> bool:
    """Whether the data artifact still holds a copy of the tokenizer the run trained with."""
    artifact = _same_artifact(
        meta, artifact if artifact and artifact.is_dir() else None, warn=False
    )
    if artifact is None:
        return False
    from turbo_dllm.data.artifact import read_manifest

    return bool(read_manifest(artifact).tokenizer_files)


def _source_tensors(meta, prefixes: tuple[str, ...]) -> dict[str, Any]:
    """The model.path folder's tensors under `prefixes` (a family's `hf_source_prefixes`: HF
    tensors the model neither reads nor trains), to export unchanged."""
    folder = Path(meta.model_path) if meta.model_path else None
    if not prefixes or folder is None or not folder.is_dir():  # random init, or gone (warned)
        return {}
    from turbo_dllm.train.weights import _open_safetensors, _read_tensor, _safetensors_index

    by_file: dict[Path, list[str]] = {}
    for name, file in _safetensors_index(folder).items():
        if name.startswith(prefixes):
            by_file.setdefault(file, []).append(name)
    out = {}
    for file, names in by_file.items():
        with _open_safetensors(file) as handle:
            out.update({name: _read_tensor(handle, file, name) for name in names})
    return out


def _same_artifact(meta, artifact: Path | None, *, warn: bool = True) -> Path | None:
    """`artifact` if it still holds the data the checkpoint was trained on (its fingerprint),
    else None with a warning: prepared again at that path (another tokenizer, say), its tokenizer
    and token ids were copied as the model's without a word."""
    if artifact is None or not (artifact / "manifest.json").is_file():
        return None
    from turbo_dllm.data.artifact import read_manifest

    now = read_manifest(artifact).fingerprint
    trained = meta.data_fingerprint
    if trained is None or now == trained:
        return artifact
    if not warn:
        return None
    print(
        f"warning: {artifact} (recorded in the checkpoint) was prepared again since training "
        f"(fingerprint {now[:16]}, trained on {trained[:16]}): the export has no tokenizer or "
        "token ids from it; copy the tokenizer the run was trained with into the folder",
        file=sys.stderr,
    )
    return None


# Keys of the source config.json a remote-code export does not take: the dtype is the export's,
# the rest is bookkeeping of the folder it came from.
_NOT_CARRIED = frozenset({"dtype", "torch_dtype", "transformers_version", "_name_or_path"})
_RELATIVE_IMPORT = re.compile(r"^\s*(?:from\s+\.(\w+)\s+import|import\s+\.(\w+)\s*$)", re.M)


def _keep_remote_code(meta, folder: Path) -> None:
    """A model.path folder whose config.json maps its classes to code files of its own
    (`auto_map`, loaded with trust_remote_code: the only way a Nemotron-Labs-Diffusion folder
    loads) gives the export, when the export is of its model_type, that map, the files it names
    (and those they import relatively), and the config keys the family's writer does not write,
    which only that code reads (its defaults are unknown here)."""
    model_path = Path(meta.model_path) if meta.model_path else None
    if model_path is None or not (model_path / "config.json").is_file():
        return
    try:
        source = json.loads((model_path / "config.json").read_text())
    except (OSError, ValueError):
        return
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    if not isinstance(source, dict) or not isinstance(source.get("auto_map"), dict):
        return
    if source.get("model_type") != config.get("model_type"):  # exported as another model
        return
    for key, value in source.items():
        if key not in config and key not in _NOT_CARRIED:
            config[key] = value
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    modules = [m for m in map(_module_of, _class_references(source["auto_map"])) if m]
    copied: set[str] = set()
    while modules:
        module = modules.pop()
        file = model_path / f"{module}.py"
        if module in copied or not file.is_file():
            continue
        copied.add(module)
        shutil.copy2(file, folder / file.name)
        for match in _RELATIVE_IMPORT.finditer(file.read_text(errors="replace")):
            modules.append(match[1] or match[2])


def _class_references(auto_map: dict[str, Any]) -> list[str]:
    """The "module.Class" strings of an `auto_map` (a tokenizer's entry is a [slow, fast] list)."""
    found: list[str] = []
    for value in auto_map.values():
        for ref in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(ref, str):
                found.append(ref)
    return found


def _module_of(reference: str) -> str | None:
    """The module file a class reference names in the folder; None for code in another
    repository ("owner/repo--module.Class"), which the reference still points at."""
    if "--" in reference or "." not in reference:
        return None
    return reference.rsplit(".", 1)[0]


# Objectives that denoise from the run's mask token (objective.mask_token_id, else the data's).
# diffusiongemma_sft noises with random ids, autoregressive masks nothing, dflash_distillation
# masks with the drafter's own (model.dflash.mask_token_id, in its config).
_MASKING_OBJECTIVES = frozenset({"block_diffusion", "fast_dllm_v2"})


def _as_trained(meta, config):
    """The family config `config` as the run trained it, for the export's config.json:
    - a config whose `mask_token_id` field is None (a preset's, or a folder without one) gets
      the run's mask token (`_run_mask`) where the objective masks with it, written where the
      family writes its own (diffusion_gemma: text_config.mask_token_id, which our reader and
      transformers' DiffusionGemmaTextConfig keep). A family config without the field (the
      decoder's) gets it from `_record_mask_token`;
    - a config with a `canvas_length` (diffusion_gemma: transformers' DiffusionGemma generates
      canvases of that many tokens) gets the block size the run trained on (`objective.
      block_size`), a preset's placeholder included (a `model.path` folder's already is:
      `families.diffusion_gemma` refuses another). Checkpoints without settings keep theirs;
    - a config whose `block_size` field is None (nemotron_diffusion from a config.json without
      one, which the family's rule then leaves free) gets the block size the run trained on:
      its export said `block_size: null`."""
    import dataclasses

    changes: dict[str, Any] = {}
    if getattr(config, "mask_token_id", 0) is None:  # (None for an objective without one)
        mask = _run_mask(meta)
        if mask is not None:
            changes["mask_token_id"] = mask
    block = (meta.settings or {}).get("objective.block_size")
    if hasattr(config, "canvas_length") and block is not None:
        changes["canvas_length"] = int(block)
    if getattr(config, "block_size", 0) is None and block is not None:
        changes["block_size"] = int(block)  # nemotron_diffusion's, from a config without one
    return dataclasses.replace(config, **changes) if changes else config


def _run_mask(meta) -> int | None:
    """The mask token id the run denoised from, for an objective that masks with one (else
    None: an export must not claim a mask token its model never saw): the checkpoint's record
    (`mask_token_id`, from `export_sources`). A checkpoint written before the record: its
    objective.mask_token_id, or the data artifact's mask token (which the tokenizer may not
    name: a byte-level one, or an id given as tokenizer.mask_token_id) while it holds the data
    trained on; synthetic data's default (its vocabulary's last id) is unknown there, said in a
    warning."""
    if meta.objective not in _MASKING_OBJECTIVES:
        return None
    if meta.mask_token_id is not None:
        return int(meta.mask_token_id)
    mask = (meta.settings or {}).get("objective.mask_token_id")
    artifact = Path(meta.data_artifact) if meta.data_artifact else None
    artifact = _same_artifact(meta, artifact, warn=False)  # a changed one was warned about
    if mask is None and artifact is not None:
        from turbo_dllm.data.artifact import read_manifest

        mask = read_manifest(artifact).special_tokens.get("mask")
    if mask is None and meta.data_artifact is None:
        print(
            "warning: the checkpoint does not record the mask token its run denoised from "
            "(written before turbo-dllm recorded synthetic data's default, the vocabulary's "
            "last id): the export names none; add mask_token_id to its config.json",
            file=sys.stderr,
        )
    return None if mask is None else int(mask)


def _record_mask_token(meta, folder: Path) -> None:
    """config.json's `mask_token_id`, for a family whose config records none (the decoder's):
    the id the run denoised from (`_run_mask`)."""
    mask = _run_mask(meta)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    if mask is None or config.get("mask_token_id") is not None:
        return
    config["mask_token_id"] = int(mask)
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def _own_pad(meta, specials: dict[str, int]) -> bool:
    """Whether the artifact's pad token is one to write as the model's `pad_token_id`: not for
    a `model.path` model (its folder's config says whether it has one: null stays null), nor
    where it is the eos id (`dllm data prepare` pads with eos where the tokenizer has no pad
    token). Written, such a pad is the eos token: transformers builds the embedding with
    `padding_idx = pad_token_id`, so the eos row gets no gradient when the export is trained
    further (ours too, for the families that take padding_idx)."""
    return meta.model_path is None and specials["pad"] != specials.get("eos")


def _copy_generation_files(meta, folder: Path) -> None:
    """generation_config.json, the tokenizer and the special token ids, from the sources."""
    from turbo_dllm.data.tokenizers import tokenizer_folder_files

    model_path = Path(meta.model_path) if meta.model_path else None
    artifact = Path(meta.data_artifact) if meta.data_artifact else None
    model_path = model_path if model_path and model_path.is_dir() else None
    artifact = artifact if artifact and artifact.is_dir() else None
    artifact = _same_artifact(meta, artifact)
    # Every file the tokenizer loads from (its class's vocabulary files, sentencepiece and
    # tiktoken ones included, and its named chat templates in additional_chat_templates/: without
    # them `apply_chat_template(..., chat_template="tool_use")` renders the name itself),
    # verbatim: the model folder's, else the artifact's copy, the files its manifest lists
    # (prepare's record of the tokenizer trained with; a file added to the folder since is not
    # handed on as the model's).
    tokenizer = tokenizer_folder_files(model_path) if model_path is not None else {}
    if not tokenizer and artifact is not None:
        from turbo_dllm.data.artifact import read_manifest, tokenizer_file

        listed = read_manifest(artifact).tokenizer_files
        files = {name: tokenizer_file(artifact, name) for name in listed}
        tokenizer = {name: file for name, file in files.items() if file and file.is_file()}
    for name, file in tokenizer.items():
        (folder / name).parent.mkdir(exist_ok=True)
        shutil.copy2(file, folder / name)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    # Where the family keeps its token ids: DiffusionGemma's in text_config, as transformers
    # reads them (its embedding's padding_idx, generate's eos). Its reader fills Gemma's ids
    # (pad 0, eos 1, bos 2) where a config has none, as transformers does, so a random-init
    # model's are the preset's, not its data's tokenizer's: they are replaced, not filled.
    text = config.get("text_config")
    holder = text if isinstance(text, dict) else config
    invented = meta.model_path is None and holder is not config
    if artifact is not None:
        from turbo_dllm.data.artifact import read_manifest

        specials = read_manifest(artifact).special_tokens
        for role, field in _TOKEN_ID_FIELDS.items():  # fill what the model's config lacks
            if invented:
                holder[field] = None
            if holder.get(field) is None and role in specials:
                if role == "pad" and not _own_pad(meta, specials):
                    continue
                holder[field] = specials[role]
        config_path.write_text(json.dumps(config, indent=2) + "\n")
    if model_path is not None and (model_path / GENERATION_CONFIG).is_file():
        shutil.copy2(model_path / GENERATION_CONFIG, folder / GENERATION_CONFIG)
        return
    if invented and artifact is None:
        return  # synthetic data: no tokenizer, and the config's ids are the preset's
    ids = {f: holder[f] for f in _TOKEN_ID_FIELDS.values() if holder.get(f) is not None}
    if ids:
        generation: dict[str, Any] = {**ids, "_from_model_config": True}
        (folder / GENERATION_CONFIG).write_text(json.dumps(generation, indent=2) + "\n")
