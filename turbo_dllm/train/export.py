"""Export a training checkpoint as a Hugging Face folder (config.json + model.safetensors).

Runs in one process on the CPU whatever data-parallel size saved the checkpoint: DCP reads the
sharded model tensors back as full tensors. The optimizer state is not read. The folder is
written next to its destination and renamed into place, so it is complete or absent.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

from turbo_dllm.errors import DllmError

__all__ = ["export_checkpoint"]


def export_checkpoint(checkpoint: str | Path, out: str | Path, dtype: str | None = None) -> Path:
    """Write `checkpoint`'s model to `out` in the HF layout; returns `out`."""
    import torch
    import torch.distributed.checkpoint as dcp

    from turbo_dllm.registry import get_family
    from turbo_dllm.train.checkpoint import find_latest, read_meta
    from turbo_dllm.train.weights import allocate, full_state_dict, save_hf

    checkpoint, out = Path(checkpoint), Path(out)
    if not (checkpoint / "checkpoint.json").is_file():
        latest = find_latest(checkpoint)  # a checkpoints/ folder: take its newest
        if latest is not None:
            checkpoint = latest
    meta = read_meta(checkpoint)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DllmError(f"{str(out)!r} already exists and is not empty", hint="choose a new folder")
    name = dtype or meta.param_dtype
    if name not in ("float32", "bfloat16"):
        raise DllmError(f"unknown dtype {name!r}", hint="use float32 or bfloat16")
    # Checkpoints written before the registry name no family: the decoder read them all.
    family = get_family(meta.family or "causal_lm")
    config = family.read_config(meta.model)
    model = allocate(family.runtime().build_model(config, None), torch.device("cpu"))
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=str(checkpoint))
    model.load_state_dict(state["model"])
    staging = out.parent / f".{out.name}.partial"
    if staging.exists():
        shutil.rmtree(staging)
    save_hf(full_state_dict(model), config, staging, dtype=getattr(torch, name))
    if out.exists():
        out.rmdir()
    staging.rename(out)
    return out
