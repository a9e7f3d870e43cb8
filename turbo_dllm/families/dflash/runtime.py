"""The dflash family's torch half (`FamilyRuntime`): build, layers, weights, training plan.

Beyond the decoder's runtime it provides optional hooks the trainer calls when a family has
them: `materialize` (the drafter's own weights, then the target's frozen embeddings and head),
`build_sequence_plan` (the frozen target's features and the draft-block layout), and
`target_record` / `check_target` (the target's identity a checkpoint records and a resume
compares: a drafter continues only against the weights it was trained against).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from turbo_dllm.errors import DllmError
from turbo_dllm.families.base import on_meta_device
from turbo_dllm.families.dflash.config import DFlashConfig, needs_teacher
from turbo_dllm.families.dflash.model import DFlashDrafter, drafter_class

__all__ = [
    "apply_tensor_parallel",
    "build_model",
    "build_sequence_plan",
    "check_target",
    "check_tensor_parallel",
    "layers",
    "load_target_weights",
    "materialize",
    "readable_weights",
    "require_model_folder",
    "resolve_device",
    "target_record",
]


def build_model(config: DFlashConfig, backend=None, dtype: torch.dtype | None = None) -> nn.Module:
    """The drafter on the meta device (its frozen embeddings and head included)."""
    return on_meta_device(lambda: drafter_class(config)(config), dtype)


def require_model_folder(flag: str, folder: str | Path) -> None:
    """A folder a `dllm dflash` flag names must hold a model (config.json): the loader's own
    error would point the user at `model.path`, a RunSpec key, not at the flag."""
    if not (Path(folder) / "config.json").is_file():
        raise DllmError(
            f"{flag} {str(folder)!r} is not a model folder (no config.json)",
            hint=f"point {flag} at a Hugging Face folder (`dllm export` / `dllm dflash export` "
            "write one)",
        )


def require_target_weights(flag: str, folder: str | Path) -> None:
    """A target whose weights are compared with a drafter's record (its content fingerprint
    covers config.json and each `*.safetensors`) must hold some: a folder without any would
    read as a target of "other weights", and a DFlash drafter could not take its embeddings and
    head from it."""
    if not any(Path(folder).glob("*.safetensors")):
        raise DllmError(
            f"{flag} {str(folder)!r} holds no safetensors weights (no *.safetensors file beside "
            "its config.json)",
            hint=f"point {flag} at the complete target folder (`dllm export` writes one; "
            "transformers' save_pretrained converts .bin weights)",
        )


@contextmanager
def readable_weights(what: str, folder: str | Path) -> Iterator[None]:
    """Loading `folder`'s weights inside: a damaged or non-safetensors `*.safetensors` file is a
    DllmError naming the folder (safetensors' own error is a traceback that names no file)."""
    from safetensors import SafetensorError

    from turbo_dllm.train.weights import UnreadableWeights

    try:
        yield
    except (SafetensorError, UnreadableWeights) as error:
        reason = error.message if isinstance(error, UnreadableWeights) else error
        raise DllmError(
            f"{what} {str(folder)!r}: its safetensors weights are unreadable ({reason})",
            hint="the file is damaged, truncated or not safetensors: copy or export the folder "
            "again",
        ) from None


def resolve_device(device: str | None, flag: str = "--device") -> torch.device:
    """The device a `dllm dflash` command runs on (`None`: cuda if available, else cpu), checked
    before any work: torch's own errors for a misspelled or absent device are tracebacks."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise DllmError(
            f"{flag} {device!r} is not a torch device", hint="use cpu, cuda or cuda:N"
        ) from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise DllmError(f"{flag} {device!r}: no CUDA GPU is available here", hint="use cpu")
    return resolved


def layers(model: nn.Module) -> nn.ModuleList:
    return model.layers


def check_tensor_parallel(config: DFlashConfig, tp: int) -> None:
    if tp > 1:
        raise DllmError("a dflash drafter is replicated: topology.tp must be 1", hint=_NO_TP)


def apply_tensor_parallel(model, tp_mesh, *, sequence_parallel: bool = False) -> None:
    raise DllmError("a dflash drafter is replicated: topology.tp must be 1", hint=_NO_TP)


_NO_TP = (
    "set topology.tp: 1 (and topology.sp: false); spread a drafter run with topology.fsdp, "
    "cp or bp, or more data-parallel processes"
)


# drafter name -> the target checkpoint's name for the same tensor
_TARGET_NAMES = {
    "embed_tokens.weight": "model.embed_tokens.weight",
    "lm_head.weight": "lm_head.weight",
}


@torch.no_grad()
def load_target_weights(model: DFlashDrafter, target_path: str | Path) -> None:
    """Fill the frozen embeddings and head from the target's folder (a tied target's head is
    its embedding)."""
    from turbo_dllm.train.weights import (
        _fill,
        _open_safetensors,
        _param_device,
        _read_tensor,
        _safetensors_index,
    )

    where = _safetensors_index(Path(target_path))
    params = dict(model.named_parameters(remove_duplicate=False))
    for name, target_name in _TARGET_NAMES.items():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        if target_name not in where:
            raise DllmError(
                f"the target {str(target_path)!r} has no {target_name!r}",
                hint="model.dflash.target must be the drafter's target folder",
            )
        param = params[name]
        with _open_safetensors(where[target_name]) as handle:
            tensor = _read_tensor(handle, where[target_name], target_name)
        if tuple(tensor.shape) != tuple(param.shape):
            raise DllmError(
                f"the target's {target_name!r} has shape {tuple(tensor.shape)}, the drafter "
                f"expects {tuple(param.shape)}",
                hint="the drafter does not fit this target",
            )
        _fill(param, tensor.to(device=_param_device(param), dtype=param.dtype))


def materialize(
    model: DFlashDrafter, device: torch.device, *, seed: int, weights_from: str | None = None
) -> DFlashDrafter:
    """Allocate and fill: the drafter's weights (a folder, else deterministic random init),
    then the target's embeddings and head."""
    from turbo_dllm.train.weights import allocate, init_weights, load_hf_weights

    allocate(model, device)
    if weights_from is not None:
        with readable_weights("the drafter", weights_from):
            load_hf_weights(model, model.config, weights_from)
    else:
        init_weights(model, model.config, seed)
    if model.config.target_path is None:
        raise DllmError("the drafter names no target", hint="set model.dflash.target")
    with readable_weights("the target", model.config.target_path):
        load_target_weights(model, model.config.target_path)
    return model


def target_record(config: DFlashConfig) -> dict:
    """The target's identity for a checkpoint (`checkpoint.json`'s `target`): its folder, its
    content fingerprint (the one a feature artifact records) and its files' stamps."""
    from turbo_dllm.families.dflash.target_identity import target_record as record

    return record(config.target_path)


def check_target(recorded: dict, config: DFlashConfig, checkpoint: str | Path) -> dict:
    """The target's record when `config`'s target holds the weights `recorded` (a checkpoint's
    record) was trained against; a DllmError naming both otherwise. The files are hashed only
    when their stamps differ from the record's (another folder, or files written since)."""
    from turbo_dllm.families.dflash.target_identity import current_target_record

    current = current_target_record(recorded, config.target_path)
    saved = recorded.get("fingerprint")
    if saved == current["fingerprint"]:
        return current
    was, now = recorded.get("path", "?"), current["path"]
    holds = f"{now!r} now holds" if was == now else f"model.dflash.target {now!r} holds"
    raise DllmError(
        f"checkpoint {str(checkpoint)!r} was trained against the target {was!r} (fingerprint "
        f"{str(saved)[:12]}), and {holds} other weights (fingerprint "
        f"{current['fingerprint'][:12]}): the drafter learned that target's hidden states",
        hint="point model.dflash.target at the target it was trained against (a copy of it "
        "anywhere resumes), or train into a new run dir (--run-dir); to go on from its weights "
        "against this target, `dllm dflash export` it and set model.path to the export",
    )


def build_sequence_plan(dims, attention, *, spec, config: DFlashConfig, device, merge_backend=None):
    """The drafter's plan: the frozen target's features online, or from the feature artifact."""
    from turbo_dllm.families.dflash.plan import DraftPlan
    from turbo_dllm.families.dflash.target import TargetFeatures

    share = {}
    if dims is not None and dims.context > 1:  # cp / bp: this rank's share of the anchors
        share = {"rank": dims.get_mesh("context").get_local_rank(), "size": dims.context}
    if dims is not None and dims.cp > 1:  # cp: this rank's shard of the context
        cp = dims.get_mesh("cp")
        share.update(cp_rank=cp.get_local_rank(), cp_size=dims.cp, cp_group=cp.get_group())
    if spec.model.dflash.features is not None:
        from turbo_dllm.families.dflash.features import FeatureStore

        return DraftPlan(config, store=FeatureStore(spec.model.dflash.features), **share)
    teacher = needs_teacher(spec.objective.dflash_loss, spec.objective.greedy_path)
    target = TargetFeatures(
        config.target_path, config, teacher=teacher, device=device, compile=spec.training.compile
    )
    return DraftPlan(config, target, **share)
