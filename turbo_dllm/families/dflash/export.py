"""`dllm dflash export`: a drafter checkpoint as the folder SGLang and vLLM serve.

Files (REFERENCE-FAMILIES §1(5)):
- `config.json`: `architectures: ["DFlashDraftModel"]`, `model_type: qwen3`, the layer keys,
  `block_size`, `target_hidden_size`, and `dflash_config` {block_size, mask_token_id,
  target_layer_ids}; `rope_theta` at the root;
- `model.safetensors`: the drafter's own tensors only (`fc`, `hidden_norm`, `norm`, `layers.*`);
  the target's embeddings and LM head are never copied (engines take them from the target);
- `training_export.json` (`turbo_dllm.dflash_export.v1`): where it came from (step, objective,
  data fingerprint, seed, the content fingerprint of the target it was trained against where
  the checkpoint records one) and the sha256 of the two files above (and of the target's
  config.json when `--target` is given).

`--target` checks the drafter against that target: its shape, and its weights against the
checkpoint's record of the target it was trained against (a same-shape target with other
weights is refused).

The folder is assembled next to `out` and renamed into place: complete or absent.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from turbo_dllm.errors import DllmError

__all__ = ["EXPORT_FORMAT", "export_drafter"]

EXPORT_FORMAT = "turbo_dllm.dflash_export.v1"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _check_target_weights(meta, checkpoint: Path, target: str | Path) -> None:
    """`--target` must hold the weights the checkpoint was trained against, where it records
    them (a checkpoint written before the record is checked by shape only)."""
    from turbo_dllm.families.dflash.target_identity import current_target_record

    recorded = meta.target
    if not recorded or not recorded.get("fingerprint"):
        return
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
) -> Path:
    from turbo_dllm.families.dflash import read_target_config
    from turbo_dllm.families.dflash.config import DFlashConfig, drafter_problems
    from turbo_dllm.families.dflash.runtime import require_model_folder
    from turbo_dllm.train.checkpoint import read_meta, resolve_checkpoint
    from turbo_dllm.train.export import export_checkpoint

    checkpoint, out = resolve_checkpoint(checkpoint), Path(out)  # a checkpoints/ folder: its newest
    meta = read_meta(checkpoint)
    if meta.family != "dflash":
        raise DllmError(
            f"{str(checkpoint)!r} is a {meta.family!r} checkpoint, not a dflash drafter",
            hint="`dllm export` writes other families' checkpoints",
        )
    config = DFlashConfig.from_hf_dict(meta.model)
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
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DllmError(f"{str(out)!r} already exists and is not empty", hint="choose a new folder")

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
            "files": {
                name: {"sha256": _sha256(folder / name), "bytes": (folder / name).stat().st_size}
                for name in ("config.json", "model.safetensors")
            },
            "target_config_sha256": (
                _sha256(Path(target) / "config.json") if target is not None else None
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
        (folder / "training_export.json").write_text(json.dumps(record, indent=2) + "\n")

    export_checkpoint(checkpoint, out, dtype=dtype, finish=write_record)
    return out
