"""The one place that lists every model family and training objective this install can run.

Torch-free (`config/` derives the RunSpec schema and its validation from it). A family of this
package is its folder under `turbo_dllm/families/` plus one line in `BUILTIN_FAMILIES`; an
objective is its module under `turbo_dllm/train/objectives/` plus one line in
`BUILTIN_OBJECTIVES`. Another installed package adds its own through the entry-point groups
`turbo_dllm.families` and `turbo_dllm.objectives` (`plugins.py`; docs/architecture.md, "Adding
a family").
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from turbo_dllm.errors import DllmError
from turbo_dllm.families.base import AXES, Family, FamilyConfig, FamilyMismatch, Objective
from turbo_dllm.families.decoder import CAUSAL_LM, QWEN3
from turbo_dllm.families.dflash import DFLASH
from turbo_dllm.families.diffusion_gemma import DIFFUSION_GEMMA
from turbo_dllm.families.nemotron_diffusion import NEMOTRON_DIFFUSION
from turbo_dllm.families.qwen3_8 import QWEN3_8
from turbo_dllm.plugins import Plugins, load_plugins

__all__ = [
    "AXES",
    "BUILTIN_FAMILIES",
    "BUILTIN_OBJECTIVES",
    "CONFIG_FIELDS",
    "CONFIG_METHODS",
    "FAMILIES",
    "OBJECTIVES",
    "PLANNED",
    "PLUGINS",
    "PLUGIN_FIX",
    "families_reading",
    "get_family",
    "get_objective",
    "resolve_model_config",
    "unavailable_reason",
]

BUILTIN_FAMILIES: Mapping[str, Family] = {
    family.name: family
    for family in (
        CAUSAL_LM,
        QWEN3,
        NEMOTRON_DIFFUSION,
        QWEN3_8,
        DFLASH,
        DIFFUSION_GEMMA,
    )
}

BUILTIN_OBJECTIVES: Mapping[str, Objective] = {
    objective.name: objective
    for objective in (
        Objective(
            "block_diffusion",
            "BD3-LM: absorbing mask per block, antithetic t, 1/t weight",
            "turbo_dllm.train.objectives.block_diffusion",
        ),
        Objective(
            "fast_dllm_v2",
            "Fast-dLLM v2: complementary masks, labels shifted by one, unit weight",
            "turbo_dllm.train.objectives.fast_dllm_v2",
        ),
        Objective(
            "autoregressive",
            "next-token cross-entropy, token-causal attention (targets, AR drafters)",
            "turbo_dllm.train.objectives.autoregressive",
            stream_block_size=1,
        ),
        Objective(
            "dflash_distillation",
            "DFlash: draft blocks at sampled anchors from the target's features (CE or KL)",
            "turbo_dllm.train.objectives.dflash_distillation",
        ),
        Objective(
            "diffusiongemma_sft",
            "DiffusionGemma native SFT: uniform-state canvas noise, encoder AR loss, "
            "self-conditioning",
            "turbo_dllm.train.objectives.diffusiongemma_sft",
        ),
    )
}

# The families and objectives other installed packages add (entry points), and the ones that
# failed to load (each with why: a broken plugin only takes its own names away).
PLUGINS: Plugins = load_plugins(BUILTIN_FAMILIES, BUILTIN_OBJECTIVES)
FAMILIES: Mapping[str, Family] = {**BUILTIN_FAMILIES, **PLUGINS.families}
OBJECTIVES: Mapping[str, Objective] = {**BUILTIN_OBJECTIVES, **PLUGINS.objectives}
# Plugins that loaded but break the torch-free start: said once, on stderr (the `dllm doctor`
# plugins check says it too); under torchrun by global rank 0 only, not once per worker.
if os.environ.get("RANK", "0") == "0":
    for _warning in PLUGINS.warnings.values():
        print(f"dllm: warning: plugin {_warning}", file=sys.stderr)

# Names the product defines whose code has not landed: refused with "not available in this
# version" rather than "unknown" (they are not in the schema).
PLANNED: Mapping[str, tuple[str, ...]] = {
    "family": (),
    "objective": (),
}


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise _unavailable("family", name, FAMILIES) from None


def get_objective(name: str) -> Objective:
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise _unavailable("objective", name, OBJECTIVES) from None


def unavailable_reason(kind: str, name: Any, *, with_fix: bool = True) -> str | None:
    """Why a name the schema does not offer is missing, where there is more to say than
    "unknown": its plugin failed to load (with what to do about it, unless `with_fix` is
    false: a caller that gives `PLUGIN_FIX` as its hint), or the product defines it and this
    version lacks it."""
    if not isinstance(name, str):
        return None
    broken = PLUGINS.problems[kind].get(name)
    if broken is not None:
        fix = f" (to fix: {PLUGIN_FIX})" if with_fix else ""
        return f"{kind} {name!r} could not be loaded from its plugin: {broken}{fix}"
    if name in PLANNED[kind]:
        return f"{kind} {name!r} is not available in this version"
    return None


# What to do about a plugin that was left out.
PLUGIN_FIX = (
    "fix or reinstall the package that declares it (`pip show <package>` says where it is), or "
    "uninstall it; `dllm doctor` lists every plugin"
)


def _unavailable(kind: str, name: str, available: Mapping[str, Any]) -> DllmError:
    if name in PLUGINS.problems[kind]:
        return DllmError(unavailable_reason(kind, name, with_fix=False) or "", hint=PLUGIN_FIX)
    label = "model family" if kind == "family" else kind
    return DllmError(
        f"{label} {name!r} is not available in this version",
        hint=f"available: {', '.join(available)}",
    )


def families_reading(model_type: Any, config: dict[str, Any] | None = None) -> list[str]:
    """The families whose config reader accepts a Hugging Face `model_type`; given that
    model's config.json (`config`), those that can train it (`Family.reads`: a plain qwen3
    folder is no DFlash drafter's), where any can."""
    named = [f for f in FAMILIES.values() if model_type in f.model_types]
    able = [f for f in named if config is not None and f.reads(config)]
    return [f.name for f in able or named]


def resolve_model_config(model: Any) -> FamilyConfig:
    """The config of a RunSpec's `model` section (family, path or from_config, overrides)."""
    family = get_family(model.family)
    return _checked_config(family, _family_config(family, model))


# What the trainer, doctor and export read from every family's config (`FamilyConfig`,
# docs/architecture.md): a reader that returns something else is the family's bug.
CONFIG_FIELDS = ("model_type", "vocab_size", "tie_word_embeddings", "initializer_range")
CONFIG_METHODS = ("to_hf_dict", "num_params", "step_flops")


def _checked_config(family: Family, config: Any) -> FamilyConfig:
    """`config` if it keeps the `FamilyConfig` contract, else a DllmError naming the family (and
    the plugin that declares it) and what its config lacks, instead of an AttributeError later
    in doctor, the trainer or export."""
    missing = [name for name in CONFIG_FIELDS if not hasattr(config, name)]
    missing += [name for name in CONFIG_METHODS if not callable(getattr(config, name, None))]
    if not missing:
        return config
    source = PLUGINS.sources.get(("family", family.name))
    where = f" (plugin {source})" if source else ""
    reader = "configure" if family.configure is not None else "read_config"
    raise DllmError(
        f"model family {family.name!r}{where}: its {reader} returned a "
        f"{type(config).__name__} without {', '.join(missing)}",
        hint=f"a family's config has {', '.join(CONFIG_FIELDS)} and the methods "
        f'{", ".join(f"{m}()" for m in CONFIG_METHODS)} (docs/architecture.md, "The family '
        "registry\"): fix the family's config class, or uninstall the package that declares it",
    )


def _family_config(family: Family, model: Any) -> Any:
    if family.configure is not None:
        return family.configure(model)
    try:
        return family.resolve_config(
            path=model.path,
            from_config=None if model.path else model.from_config,
            overrides=dict(model.config_overrides),
        )
    except FamilyMismatch as error:
        model_type = error.model_type
        if model_type is None:  # "is a None model": a config.json naming no model_type
            reads = " or ".join(json.dumps(name) for name in family.model_types)
            where = error.message.split(" is a None model", 1)[0]
            raise FamilyMismatch(
                f"{where} names no model_type in its config.json (model.family "
                f"{family.name!r} reads {', '.join(family.model_types)})",
                hint=f'add "model_type": {reads} to that config.json where it is a model of '
                "that kind (transformers' save_pretrained writes it), or point model.path at "
                "the folder the model was saved to",
                model_type=None,
            ) from None
        readers = error.readers or families_reading(model_type, error.config)
        hint = (
            f"set model.family to {' or '.join(readers)}"
            if readers
            else (f"no family of this version reads {model_type!r} models")
        )
        raise FamilyMismatch(error.message, hint=hint, model_type=model_type) from None
