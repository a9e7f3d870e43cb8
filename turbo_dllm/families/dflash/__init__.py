"""DFlash speculative drafters: family `dflash`, trained by `dflash_distillation`.

Torch-free: the descriptor the registry lists and how a RunSpec's `model` section becomes a
drafter config (a drafter folder, or a fresh drafter shaped after `model.dflash.target`). The
torch half is `runtime` (model.py, the target's features, the training plan).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from turbo_dllm.errors import DllmError
from turbo_dllm.families.base import (
    Family,
    FamilyMismatch,
    ModelMisfit,
    ModelUnreadable,
    read_hf_config,
)
from turbo_dllm.families.dflash.config import (
    DFLASH2_FIELDS,
    HARD_LABEL_LOSSES,
    TEACHER_LOSSES,
    V1_LOSSES,
    DFlashConfig,
    drafter_problems,
)

__all__ = ["DFLASH", "configure", "read_target_config"]

# `model.from_config: target` is the one preset: a fresh drafter shaped after the target.
PRESETS: dict[str, dict[str, Any]] = {"target": {}}


def read_target_config(path: str) -> Any:
    """The target's DecoderConfig (a Llama / Qwen2 / Qwen3 folder)."""
    from turbo_dllm.families.decoder import CAUSAL_LM

    try:
        config = CAUSAL_LM.resolve_config(path=path, from_config=None)
    except ModelUnreadable as error:
        raise ModelUnreadable(
            f"DFlash target: {error.message}",
            hint="point model.dflash.target at the target's Hugging Face folder (config.json)",
        ) from None
    except FamilyMismatch as error:  # it said "model.path ...: set model.family"
        if error.readers == ["dflash"]:  # a drafter's folder: said below
            config = None
        else:
            raise FamilyMismatch(
                f"DFlash target: {str(path)!r} is a {error.model_type!r} model, not a Llama, "
                "Qwen2 or Qwen3",
                hint="point --target (or model.dflash.target) at the folder of a Llama, Qwen2 "
                "or Qwen3 model: the drafter reads that family's hidden states",
                model_type=error.model_type,
            ) from None
    # A drafter folder's config.json is a qwen3 one too (its own layers): read as a target, it
    # has no embeddings or head (transformers would make them up at random)
    hf = read_hf_config(Path(path) / "config.json", what="target")
    architectures = hf.get("architectures") or []
    if "dflash_config" in hf or any(str(a).startswith("DFlash") for a in architectures):
        raise DllmError(
            f"DFlash target: {str(path)!r} is a DFlash drafter folder "
            f"({', '.join(map(str, architectures)) or 'dflash_config'}), not a target model",
            hint="point model.dflash.target (or --target) at the Hugging Face folder of the "
            "model the drafter drafts for",
        )
    return config


def configure(model: Any) -> DFlashConfig:
    """The drafter config of a RunSpec's `model` section, checked against its target; every
    misfit is a `ModelMisfit` at the field that is wrong, which validation reports before any
    work. A target or drafter folder that cannot be read here is a `ModelUnreadable` (left to
    `dllm doctor` and the trainer, as any model folder is)."""
    spec = model.dflash
    if spec is None:
        raise ModelMisfit(
            "model.family dflash needs model.dflash (at least model.dflash.target)",
            hint="name the target's folder: model.dflash.target: path/to/target",
            path="model.dflash",
        )
    if model.config_overrides:
        raise ModelMisfit(
            "model.config_overrides does not apply to a dflash drafter",
            hint="set the drafter's shape in model.dflash (num_layers, intermediate_size, ...)",
            path="model.config_overrides",
        )
    shape2 = sorted(set(DFLASH2_FIELDS) & _given(spec))
    if shape2 and spec.architecture != "DFlash2DraftModel":
        raise ModelMisfit(
            f"model.dflash.{', '.join(shape2)} shape a DFlash2 drafter, but "
            f"model.dflash.architecture is {spec.architecture}",
            hint="set model.dflash.architecture: DFlash2DraftModel, or drop those fields",
            path=f"model.dflash.{shape2[0]}",
        )
    if model.path is None and model.from_config != "target":
        raise ModelMisfit(
            f"model.from_config {model.from_config!r} is not a dflash preset",
            hint="use model.from_config: target (a fresh drafter shaped after model.dflash."
            "target) or model.path (a drafter folder)",
            path="model.from_config",
        )
    with _misfit_at("model.dflash.target"):
        target = read_target_config(spec.target)
    if model.path is not None:
        hf = read_hf_config(Path(model.path) / "config.json", what="drafter")
        with _misfit_at("model.path"):
            config = dataclasses.replace(DFlashConfig.from_hf_dict(hf), target_path=spec.target)
        _check_folder_shape(spec, config, model.path)
    else:
        try:
            config = DFlashConfig.from_target(target, spec, target_path=spec.target)
        except DllmError as error:
            raise _shape_misfit(error, spec) from None
    problems = drafter_problems(config, target)
    if problems:
        raise ModelMisfit(
            f"the drafter does not fit the target {spec.target!r}:\n"
            + "\n".join(f"  - {p}" for p in problems),
            hint="shape the drafter after this target (model.from_config: target) or pick the "
            "target it was trained for",
            path="model.path" if model.path is not None else "model.dflash.target",
        )
    return config


def _given(spec: Any) -> set[str]:
    """The model.dflash fields given a value other than their default: a spec written back
    with every default spelled out (the run dir's spec.yaml, a manifest) sets them all."""
    fields = type(spec).model_fields
    return {
        name
        for name in spec.model_fields_set
        if fields[name].is_required() or getattr(spec, name) != fields[name].default
    }


# model.dflash fields that shape a fresh drafter, and the config attribute each becomes
_SHAPE_FIELDS = {
    "num_layers": "num_hidden_layers",
    "block_size": "block_size",
    "target_layer_ids": "target_layer_ids",
    "mask_token_id": "mask_token_id",
    "sample_from_anchor": "sample_from_anchor",
    "intermediate_size": "intermediate_size",
    "architecture": "architecture",
    **{name: name for name in DFLASH2_FIELDS},
}


def _check_folder_shape(spec: Any, config: DFlashConfig, folder: str) -> None:
    """A drafter folder (model.path) keeps its own shape: a model.dflash field given another
    value would be ignored, so it is refused at that field."""
    found = []
    for name in sorted(_given(spec) & set(_SHAPE_FIELDS)):
        wanted, actual = getattr(spec, name), getattr(config, _SHAPE_FIELDS[name])
        if isinstance(actual, tuple):
            actual = list(actual)
        if name in DFLASH2_FIELDS and not config.is_dflash2:
            continue  # refused above unless the architecture asks for DFlash2 (then it differs)
        if wanted != actual:
            found.append(
                (
                    f"model.dflash.{name}",
                    f"{wanted!r}, but the drafter folder {folder!r} has {actual!r}; a drafter "
                    "folder keeps its shape (give its value, or start a fresh drafter with "
                    "model.from_config: target)",
                )
            )
    if found:
        raise ModelMisfit(
            "model.path is a drafter folder, whose shape is its own: "
            + "; ".join(f"{path} {message}" for path, message in found),
            hint="set these fields to the folder's values (or drop them), or train a fresh "
            "drafter (model.from_config: target) to change its shape",
            path=found[0][0],
            problems=tuple(found),
        )


@contextmanager
def _misfit_at(path: str) -> Iterator[None]:
    """A config error (not an unreadable file) inside becomes a ModelMisfit at `path`."""
    try:
        yield
    except (ModelUnreadable, ModelMisfit):
        raise
    except DllmError as error:
        message, hint = error.message, error.hint
        if isinstance(error, FamilyMismatch):  # the target's family, not model.family's
            message = f"the target is a {error.model_type!r} model, not a Llama, Qwen2 or Qwen3"
            hint = "point model.dflash.target at the folder of a Llama, Qwen2 or Qwen3 model"
        raise ModelMisfit(message, hint, path=path) from None


def _shape_misfit(error: DllmError, spec: Any) -> ModelMisfit:
    """A fresh drafter's shape problems ("drafter config is not usable:" then "  - ..." lines),
    each at the model.dflash field it names (else at model.dflash)."""
    head, *items = error.message.split("\n")
    fields = set(type(spec).model_fields)
    found = []
    for item in items or [head]:
        text = item.removeprefix("  - ")
        name = text.split(" ", 1)[0]
        found.append((f"model.dflash.{name}" if name in fields else "model.dflash", text))
    return ModelMisfit(error.message, error.hint, path=found[0][0], problems=tuple(found))


def _rules(spec: Any, config: DFlashConfig) -> list[tuple[str, str]]:
    found = []
    objective = spec.objective
    if objective.block_size != config.block_size:
        found.append(
            (
                "objective.block_size",
                f"{objective.block_size} is not the drafter's block size ({config.block_size})",
            )
        )
    if objective.sample_from_anchor != config.sample_from_anchor:
        found.append(
            (
                "objective.sample_from_anchor",
                f"{objective.sample_from_anchor} is not the drafter's slot contract "
                f"(sample_from_anchor: {config.sample_from_anchor})",
            )
        )
    kinds = HARD_LABEL_LOSSES if config.is_dflash2 else V1_LOSSES
    if objective.dflash_loss not in kinds:
        found.append(
            (
                "objective.dflash_loss",
                f"{objective.dflash_loss!r} does not train a {config.architecture} (it trains "
                f"with {', '.join(kinds)})",
            )
        )
    if objective.reveal_blocks and (config.is_dflash2 or config.sample_from_anchor):
        found.append(
            (
                "objective.reveal_blocks",
                "trains DFlashDraftModel drafters with sample_from_anchor false only (slot k "
                "shows the token at anchor + k; DFlash2's losses weigh a block's slots in order)",
            )
        )
    if objective.greedy_path and objective.dflash_loss == "paper_ce":
        found.append(
            (
                "objective.greedy_path",
                "needs the target's outputs: paper_ce's labels are the true tokens (use "
                f"{' or '.join(TEACHER_LOSSES)}; a DFlash2 drafter's hard labels work too)",
            )
        )
    return found


_NOT_SHARDED = "a drafter is small and replicated; the original refuses it too"
DFLASH = Family(
    name="dflash",
    input_rules="turbo_dllm.families.dflash.features:input_problems",
    summary="a DFlash / DFlash2 block-diffusion drafter over a frozen target's hidden states",
    model_types=("qwen3",),
    objectives=("dflash_distillation",),
    axes=frozenset({"fsdp", "cp", "bp"}),
    presets=PRESETS,
    read_config=DFlashConfig.from_hf_dict,
    runtime_module="turbo_dllm.families.dflash.runtime",
    rules=_rules,
    axis_reasons={
        "tp": _NOT_SHARDED,
        "sp": _NOT_SHARDED,
        "ep": "a drafter has no experts",
    },
    configure=configure,
)
