"""`dllm dflash export`: a drafter checkpoint as the folder SGLang and vLLM serve.

Files (REFERENCE-FAMILIES §1(5)):
- `config.json`: `architectures: ["DFlashDraftModel"]`, `model_type: qwen3`, the layer keys,
  `block_size`, `target_hidden_size`, and `dflash_config` {block_size, mask_token_id,
  target_layer_ids}; `rope_theta` at the root;
- `model.safetensors`: the drafter's own tensors only (`fc`, `hidden_norm`, `norm`, `layers.*`);
  the target's embeddings and LM head are never copied (engines take them from the target).
  Past `--max-shard-size` they are sharded as `dllm export` shards them:
  `model-0000i-of-0000N.safetensors` and `model.safetensors.index.json`;
- `generation_config.json` and the tokenizer's files, where the run's data artifact (or model
  folder) gives them (`dllm export` writes the same);
- `training_export.json` (`turbo_dllm.dflash_export.v1`): where it came from (step, objective,
  data fingerprint, seed, the content fingerprint of the target it was trained against where
  the checkpoint records one) and the sha256 and size of every file written (config.json, each
  weight file: each shard and the index, or the one model.safetensors, generation_config.json,
  the tokenizer's files; `files_complete: true` says so), and the sha256 of the target's
  config.json when `--target` is given. `verify_export` checks a folder against it. A record
  written before `files_complete` lists config.json and the weight files only.

`--target` checks the drafter against that target: its shape, and its weights against the
checkpoint's record of the target it was trained against (a same-shape target with other
weights is refused).

The folder is assembled next to `out` and renamed into place: complete or absent.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from turbo_dllm.errors import DllmError
from turbo_dllm.fsutil import sha256_file

__all__ = ["EXPORT_FORMAT", "export_drafter", "verify_export"]

EXPORT_FORMAT = "turbo_dllm.dflash_export.v1"
RECORD_NAME = "training_export.json"


def _consumed_files(folder: Path) -> list[str]:
    """The files of `folder` that a loader of the drafter reads (our eval, transformers, SGLang,
    vLLM): the weight files, the tokenizer's files, every `*.json` (config.json,
    generation_config.json, ...) and `*.py` (remote code); not a README or a .gitattributes."""
    from turbo_dllm.data.tokenizers import tokenizer_files
    from turbo_dllm.train.weights import weight_files

    names = {*weight_files(folder), *(p.name for p in tokenizer_files(folder))}
    names.update(p.name for p in folder.iterdir() if p.is_file() and p.suffix in (".json", ".py"))
    names.discard(RECORD_NAME)
    return sorted(names)


def verify_export(folder: str | Path) -> list[str]:
    """Check a `dllm dflash export` folder against its training_export.json: every file the
    record lists is there with its sha256 and size, and every file there that a loader reads is
    listed (a shard, an index or a model.safetensors the record does not know would be loaded
    unchecked; so would a generation_config.json or a tokenizer file, where the record says it
    lists every file the export wrote: `files_complete`; a record written before it lists
    config.json and the weights only, and only unlisted weight files fail it). Either layout
    passes: one model.safetensors, or shards and their index. Returns the checked names; a
    DllmError names each file that does not match."""
    from turbo_dllm.train.weights import weight_files

    folder = Path(folder)
    path = folder / RECORD_NAME
    hint = (
        "export the drafter again with `dllm dflash export` (or copy it whole); to use the "
        f"folder as it is, unchecked, remove its {RECORD_NAME}"
    )
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise DllmError(f"{str(path)!r} is unreadable ({error})", hint=hint) from None
    found = record.get("format") if isinstance(record, dict) else None
    if found != EXPORT_FORMAT:  # another record, or one a later version writes differently
        raise DllmError(
            f"{str(path)!r} is not a DFlash export record (format {found!r}, expected "
            f"{EXPORT_FORMAT!r})",
            hint=f"{hint}; a folder exported by a newer turbo-dllm needs that version",
        )
    files = record.get("files")
    if not isinstance(files, dict) or not files:
        raise DllmError(f"{str(path)!r} records no files", hint=hint)
    problems = []
    for name in sorted(files):
        entry, file = files[name], folder / name
        if Path(name).name != name or name in ("", ".", "..", RECORD_NAME):
            problems.append(f"{name!r}: not a file of the folder")  # the record was edited
        elif not isinstance(entry, dict):
            problems.append(f"{name}: no sha256 recorded")
        elif not file.is_file():
            problems.append(f"{name}: missing")
        elif entry.get("bytes") is not None and file.stat().st_size != entry["bytes"]:
            problems.append(f"{name}: {file.stat().st_size} bytes, recorded {entry['bytes']}")
        elif sha256_file(file) != entry.get("sha256"):
            problems.append(f"{name}: sha256 differs from the recorded one")
    # every file a loader reads, where the record says it lists them all; else (a record
    # written before it did) the weight files
    read = _consumed_files(folder) if record.get("files_complete") is True else weight_files(folder)
    problems += [f"{name}: not in the record" for name in read if name not in files]
    if problems:
        raise DllmError(
            f"{str(folder)!r} does not match its {RECORD_NAME}:\n"
            + "\n".join(f"  - {p}" for p in problems),
            hint=hint,
        )
    return sorted(files)


def _check_target_weights(meta, checkpoint: Path, target: str | Path) -> None:
    """`--target` must hold the weights the checkpoint was trained against, where it records
    them (a checkpoint written before the record is checked by shape only)."""
    from turbo_dllm.families.dflash.runtime import require_target_weights
    from turbo_dllm.families.dflash.target_identity import current_target_record

    recorded = meta.target
    if not recorded or not recorded.get("fingerprint"):
        return
    require_target_weights("--target", target)  # none would read as "other weights"
    current = current_target_record(recorded, target)
    if current["fingerprint"] == recorded["fingerprint"]:
        return
    raise DllmError(
        f"{str(checkpoint)!r} was trained against the target {recorded.get('path', '?')!r} "
        f"(fingerprint {recorded['fingerprint'][:12]}), and --target {str(target)!r} holds "
        f"other weights (fingerprint {current['fingerprint'][:12]})",
        hint="pass the target the drafter was distilled from (a copy of it anywhere passes), "
        "or leave --target out",
    )


def export_drafter(
    checkpoint: str | Path,
    out: str | Path,
    *,
    target: str | Path | None = None,
    dtype: str | None = None,
    max_shard_size: int | str | None = None,
) -> Path:
    """Write `checkpoint`'s drafter to `out` as the serving folder (the module's doc). Weights
    past `max_shard_size` bytes (default: transformers' 50GB) are sharded as `dllm export`
    shards them; the record hashes every file written."""
    from turbo_dllm.families.dflash import read_target_config
    from turbo_dllm.families.dflash.config import DFlashConfig, drafter_problems
    from turbo_dllm.families.dflash.runtime import require_model_folder
    from turbo_dllm.train.checkpoint import read_meta, resolve_checkpoint
    from turbo_dllm.train.export import check_out_folder, export_checkpoint
    from turbo_dllm.train.weights import DEFAULT_MAX_SHARD_SIZE, parse_shard_size

    # A bad size is refused before the checkpoint is read (as `dllm export` refuses it).
    shard_bytes = parse_shard_size(
        DEFAULT_MAX_SHARD_SIZE if max_shard_size is None else max_shard_size
    )
    checkpoint, out = resolve_checkpoint(checkpoint), Path(out)  # a checkpoints/ folder: its newest
    meta = read_meta(checkpoint)
    if meta.family != "dflash":
        raise DllmError(
            f"{str(checkpoint)!r} is a {meta.family!r} checkpoint, not a dflash drafter",
            hint="`dllm export` writes other families' checkpoints",
        )
    config = DFlashConfig.from_hf_dict(meta.model)
    # before --target's weights are compared (hashing reads every byte of the target)
    check_out_folder(out, "the export", example="drafter")
    if target is not None:
        require_model_folder("--target", target)
        problems = drafter_problems(config, read_target_config(str(target)))
        if problems:
            raise DllmError(
                f"the drafter does not fit the target {str(target)!r}:\n"
                + "\n".join(f"  - {p}" for p in problems),
                hint="pass the target the drafter was distilled from",
            )
        _check_target_weights(meta, checkpoint, target)

    last = config.num_target_layers - 1
    if config.target_layers_recorded and last in config.target_layer_ids:
        # SGLang and vLLM capture a layer's output as it enters the next one: none follows the
        # last, so their serve lines below would start a drafter that never gets that feature.
        print(
            f"dllm: warning: the drafter reads the target's last layer ({last}, target_layer_ids "
            f"{list(config.target_layer_ids)}), which SGLang and vLLM cannot capture: this folder "
            "runs through transformers only (docs/dflash.md, 'Which hidden state')",
            file=sys.stderr,
        )
    # the slot contract (REFERENCE-FAMILIES §1(1)): a block drafts B - 1 tokens after its
    # anchor, or B with sample_from_anchor (slot 0 drafts the token after the anchor too)
    drafts = config.block_size if config.sample_from_anchor else config.block_size - 1

    def write_record(folder: Path) -> None:
        record = {
            "format": EXPORT_FORMAT,
            "architecture": config.architecture,
            "checkpoint_step": meta.step,
            "objective": meta.objective,
            "seed": meta.seed,
            "data_fingerprint": meta.data_fingerprint,
            "target_fingerprint": (meta.target or {}).get("fingerprint"),
            "train_time_s": meta.train_time_s,
            # every file written (config.json, the weights: one file or shards + index,
            # generation_config.json, the tokenizer's files), which `files_complete` says
            "files": {
                path.name: {"sha256": sha256_file(path), "bytes": path.stat().st_size}
                for path in sorted(folder.iterdir())
                if path.is_file() and path.name != RECORD_NAME
            },
            "files_complete": True,
            "target_config_sha256": (
                sha256_file(Path(target) / "config.json") if target is not None else None
            ),
            "serve": {
                "sglang": "--speculative-algorithm DFLASH --speculative-draft-model-path "
                f"<this folder> --speculative-dflash-block-size {config.block_size}",
                "vllm": json.dumps(
                    {
                        "method": "dflash",
                        "model": "<this folder>",
                        "num_speculative_tokens": drafts,
                    }
                ),
            },
        }
        (folder / RECORD_NAME).write_text(json.dumps(record, indent=2) + "\n")

    export_checkpoint(checkpoint, out, dtype=dtype, finish=write_record, max_shard_size=shard_bytes)
    return out
