"""Filling a (meta-built, possibly sharded) model of any family with weights, and writing them out.

The contract a family's model keeps (docs/architecture.md): parameters under their Hugging Face
names, a `config` with `tie_word_embeddings`, `initializer_range` and `to_hf_dict()`, and
`tie_weights()` to re-tie a tied head after `to_empty`.

Random init is deterministic per parameter name: every parameter gets its own generator seeded
from (seed, name), the full tensor is drawn and each rank keeps its shard. So the same seed
gives the same model at any data-parallel size, and activation checkpointing or compile wrappers
(which change module paths) do not change the weights. Hugging Face safetensors are read one
tensor at a time, so no rank ever holds a second full copy of the model.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from turbo_dllm.errors import DllmError

__all__ = [
    "DEFAULT_MAX_SHARD_SIZE",
    "allocate",
    "clean_fqn",
    "full_state_dict",
    "init_weights",
    "load_hf_weights",
    "materialize",
    "named_parameters_clean",
    "parse_shard_size",
    "save_hf",
    "UnreadableWeights",
    "weight_files",
]

# Wrapper segments that activation checkpointing, torch.compile and FSDP1 add to module paths.
_WRAPPER_SEGMENTS = ("_checkpoint_wrapped_module", "_orig_mod", "_fsdp_wrapped_module")


def clean_fqn(name: str) -> str:
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_SEGMENTS)


# The name of the LM head, which a tied head shares with the embeddings: Hugging Face folders
# leave it out (`save_hf`, `load_hf_weights`), so a tied tensor is never named by it.
_HEAD = "lm_head.weight"


def named_parameters_clean(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """Parameters under their Hugging Face names. A tied weight appears once, under its first
    name other than the head's (a model may register its head before its embeddings)."""
    named: dict[int, list] = {}  # id(param) -> [name, param], in first-registration order
    for name, param in model.named_parameters(remove_duplicate=False):
        seen = named.setdefault(id(param), [clean_fqn(name), param])
        if seen[0] == _HEAD:
            seen[0] = clean_fqn(name)
    for name, param in named.values():
        yield name, param


def _seed_for(seed: int, name: str) -> int:
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def _fill(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy a full tensor into a parameter, keeping only the local shard of a DTensor."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    with torch.no_grad():
        if isinstance(param, DTensor):
            shard = distribute_tensor(
                full, param.device_mesh, param.placements, src_data_rank=None
            ).to_local()
            param.to_local().copy_(shard)
        else:
            param.copy_(full)


def _param_device(param: torch.Tensor) -> torch.device:
    from torch.distributed.tensor import DTensor

    return param.to_local().device if isinstance(param, DTensor) else param.device


def _is_norm(module: nn.Module) -> bool:
    """A normalisation layer, as transformers' `_init_weights` tells them: torch's norms, or a
    class whose name says LayerNorm or RMSNorm (families name their own)."""
    kind = type(module).__name__
    return (
        isinstance(module, (nn.LayerNorm, nn.GroupNorm)) or "LayerNorm" in kind or "RMSNorm" in kind
    )


def _norm_weights(model: nn.Module) -> set[str]:
    """The clean names of the norm layers' weights (whatever the layers are called)."""
    return {
        clean_fqn(f"{prefix}.weight" if prefix else "weight")
        for prefix, module in model.named_modules()
        if _is_norm(module) and isinstance(getattr(module, "weight", None), nn.Parameter)
    }


@torch.no_grad()
def init_weights(model: nn.Module, config, seed: int) -> None:
    """HF-style init: linear/embedding weights ~ N(0, initializer_range), norms 1, biases 0,
    an embedding's padding_idx row 0.

    A norm is told by its module (`_is_norm`), whatever its name (`ln_1`,
    `post_feedforward_layernorm_1`). A model whose transformers twin initialises some
    parameters otherwise (zero-centred norms, state-space decays) says so with
    `initial_value(name, shape, cpu_generator)`, which returns the full tensor or None for the
    default; its generator is seeded from (seed, name) too.
    """
    std = config.initializer_range
    special = getattr(model, "initial_value", None)
    norms = _norm_weights(model)
    padding_rows = {  # transformers zeroes an embedding's padding_idx row
        clean_fqn(f"{prefix}.weight"): module.padding_idx
        for prefix, module in model.named_modules()
        if isinstance(module, nn.Embedding) and module.padding_idx is not None
    }
    for name, param in named_parameters_clean(model):
        device = _param_device(param)
        value = None
        if special is not None:
            value = special(name, param.shape, torch.Generator().manual_seed(_seed_for(seed, name)))
        if value is not None:
            full = value.to(device=device, dtype=param.dtype)
        elif name in norms or name.endswith("norm.weight"):
            full = torch.ones(param.shape, dtype=param.dtype, device=device)
        elif name.endswith(".bias"):
            full = torch.zeros(param.shape, dtype=param.dtype, device=device)
        else:
            generator = torch.Generator(device=device).manual_seed(_seed_for(seed, name))
            full = torch.empty(param.shape, dtype=torch.float32, device=device)
            full.normal_(0.0, std, generator=generator)
            if name in padding_rows:
                full[padding_rows[name]] = 0.0
            full = full.to(param.dtype)
        _fill(param, full)


class UnreadableWeights(DllmError):
    """A weight file (or the shard index) of a folder that cannot be read as what it claims:
    torn, damaged, not safetensors, or an index naming a file the folder lacks. Names the file;
    callers that know whose folder it is (`families.dflash.runtime.readable_weights`) say so."""


_UNREADABLE_HINT = (
    "the file is damaged, truncated or not safetensors: copy or save the folder again "
    "(transformers' save_pretrained, or dllm export)"
)


def _open_safetensors(file: Path):
    """`safe_open(file)`, a damaged file an `UnreadableWeights` naming it (safetensors' own
    error, e.g. "Error while deserializing header: invalid header length", names no file)."""
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(str(file), framework="pt")
    except SafetensorError as error:
        raise UnreadableWeights(
            f"{str(file)!r} is unreadable as safetensors ({error})", hint=_UNREADABLE_HINT
        ) from None


def _safetensors_index(folder: Path) -> dict[str, Path]:
    """Map every tensor name to the file holding it (single file or sharded index)."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            if not isinstance(weight_map, dict) or not all(
                isinstance(file, str) for file in weight_map.values()
            ):
                raise TypeError("weight_map is not an object of file names")
        except (ValueError, KeyError, TypeError) as error:  # torn JSON, no map, another shape
            reason = f"no {error}" if isinstance(error, KeyError) else str(error)
            raise UnreadableWeights(
                f"{str(index)!r} is not a safetensors shard index ({reason})",
                hint='it maps each tensor to its shard file ({"weight_map": {name: file}}): '
                "copy or save the folder again",
            ) from None
        where = {name: folder / file for name, file in weight_map.items()}
        absent = sorted({file.name for file in where.values() if not file.is_file()})
        if absent:
            shown = ", ".join(absent[:3]) + (" ..." if len(absent) > 3 else "")
            raise UnreadableWeights(
                f"{str(index)!r} lists {len(absent)} shard file(s) that {str(folder)!r} lacks: "
                f"{shown}",
                hint="the folder is incomplete: copy or download every shard the index names",
            )
        return where
    single = folder / "model.safetensors"
    if not single.exists():
        raise DllmError(
            f"no safetensors weights in {str(folder)!r}",
            hint="the folder needs model.safetensors or model.safetensors.index.json "
            "(convert .bin checkpoints with transformers' save_pretrained)",
        )
    with _open_safetensors(single) as handle:
        return {name: single for name in handle.keys()}  # noqa: SIM118 - safe_open has no iter


def weight_index(folder: str | Path) -> dict[str, Path]:
    """Where each tensor of a model folder is (`model.safetensors`, or the shards its index
    names), reading only the index and the file headers: a folder without weights, a shard the
    index names and the folder lacks, a damaged index or header is the trainer's error here
    (`dllm doctor`'s model check, before `dllm launch` writes a run dir)."""
    return _safetensors_index(Path(folder))


@torch.no_grad()
def load_hf_weights(model: nn.Module, config, folder: str | Path) -> None:
    """Load HF-layout safetensors into the model; every parameter must be found.

    A model may say where else a parameter can sit in a checkpoint (`checkpoint_names(name)`,
    e.g. the text half of a multimodal folder under another prefix); the first name present wins.
    """
    folder = Path(folder)
    wanted, stored, by_file = _weights_in(model, config, folder)
    for file, names in by_file.items():
        with _open_safetensors(file) as handle:
            for name in names:
                param = wanted[name]
                tensor = _read_tensor(handle, file, stored[name])
                _check_shape(name, tuple(tensor.shape), param, file, config, folder)
                _fill(param, tensor.to(device=_param_device(param), dtype=param.dtype))


def check_hf_weights(model: nn.Module, config, folder: str | Path) -> None:
    """`load_hf_weights`' refusals (a tensor missing, another shape, a file the index names and
    the folder lacks, a damaged header) without reading the tensors: the model may be on the
    meta device. `dllm doctor`'s model check, so that `dllm launch` refuses before it writes a
    run dir."""
    folder = Path(folder)
    wanted, stored, by_file = _weights_in(model, config, folder)
    for file, names in by_file.items():
        with _open_safetensors(file) as handle:
            for name in names:
                shape = _stored_shape(handle, file, stored[name])
                _check_shape(name, shape, wanted[name], file, config, folder)


def _weights_in(model: nn.Module, config, folder: Path):
    """The model's parameters to fill (`wanted`), each one's name in the folder (`stored`) and
    the names by file; a parameter the folder lacks is refused here."""
    where = _safetensors_index(folder)
    wanted = dict(named_parameters_clean(model))
    for name in getattr(model, "external_weights", ()):  # another folder provides them
        wanted.pop(name, None)
    if config.tie_word_embeddings:
        wanted.pop(_HEAD, None)
    aliases = getattr(model, "checkpoint_names", lambda name: (name,))
    stored: dict[str, str] = {}  # parameter name -> its name in the checkpoint
    for name in wanted:
        found = next((alias for alias in aliases(name) if alias in where), None)
        if found is not None:
            stored[name] = found
    missing = sorted(name for name in wanted if name not in stored)
    if missing:
        _refuse_layers_past_the_folder(missing, where, aliases, config, folder)
        _refuse_an_untied_head_the_folder_lacks(missing, config, folder)
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise DllmError(
            f"{len(missing)} weights missing from {str(folder)!r}: {shown}",
            hint="does config.json match the weights (model_type, layers, tie_word_embeddings)?",
        )
    by_file: dict[Path, list[str]] = {}
    for name in wanted:
        by_file.setdefault(where[stored[name]], []).append(name)
    return wanted, stored, by_file


# The config.json keys a weight's shape follows: where the file leaves one out, the model took
# the default transformers gives that model type, which may not be the model's own value.
_SHAPE_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
)


def _config_document(folder: Path) -> dict | None:
    """`folder`'s config.json as a dict; None where it is unreadable."""
    try:
        document = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def _config_keys(folder: Path) -> set[str] | None:
    """The keys `folder`'s config.json (and its text_config) sets; None where it is unreadable."""
    document = _config_document(folder)
    if document is None:
        return None
    text = document.get("text_config")
    return {*document, *(text if isinstance(text, dict) else ())}


def _check_shape(name: str, shape: tuple[int, ...], param, file: Path, config, folder) -> None:
    if shape == tuple(param.shape):
        return
    hint = "config.json does not match the weights"
    keys = _config_keys(Path(folder)) if folder is not None else None
    absent = [
        key
        for key in _SHAPE_KEYS
        if keys is not None and key not in keys and isinstance(getattr(config, key, None), int)
    ]
    if absent:
        taken = ", ".join(f"{key} {getattr(config, key)}" for key in absent)
        hint = (
            f"{hint}: it leaves out {' and '.join(absent)}, so the model took transformers' "
            f"default for its model_type ({taken}); write the model's own values into "
            "config.json"
        )
    raise DllmError(
        f"weight {name!r} has shape {shape} in {file.name}, the model expects {tuple(param.shape)}",
        hint=hint,
    )


def _stored_shape(handle, file: Path, name: str) -> tuple[int, ...]:
    from safetensors import SafetensorError

    try:
        return tuple(handle.get_slice(name).get_shape())
    except (SafetensorError, RuntimeError) as error:
        raise UnreadableWeights(
            f"{str(file)!r}: tensor {name!r} is unreadable ({error})", hint=_UNREADABLE_HINT
        ) from None


def _refuse_an_untied_head_the_folder_lacks(missing, config, folder: Path) -> None:
    """Where the output head alone is missing and config.json says the head is untied (a folder
    saved from a tied model, its config.json edited or written by hand), say that, instead of
    "does config.json match the weights": transformers would load it with a random head."""
    if missing != [_HEAD] or getattr(config, "tie_word_embeddings", True):
        return
    # Only the root's key ties the head (a multimodal folder's text_config says nothing here:
    # transformers' Qwen3_5ForConditionalGeneration reads the root alone).
    document = _config_document(folder)
    text = document.get("text_config") if document is not None else None
    says = (
        "says tie_word_embeddings: false"
        if document is None or "tie_word_embeddings" in document
        else "leaves out tie_word_embeddings at its root, which for its model_type means false"
        + (
            " (its text_config's value does not tie the model's head)"
            if isinstance(text, dict) and "tie_word_embeddings" in text
            else ""
        )
    )
    raise DllmError(
        f"{str(folder)!r} holds no {_HEAD} (the output head), and its config.json {says} (a "
        "head of its own): a folder of a model whose head is its embedding says true",
        hint="if the model ties its head to the embeddings, set tie_word_embeddings: true in "
        "config.json (or model.config_overrides: {tie_word_embeddings: true}); else the "
        "folder is incomplete: copy or save it again with its head",
    )


_LAYER = re.compile(r"^(.*?\blayers)\.(\d+)\.")


def _refuse_layers_past_the_folder(missing, where, aliases, config, folder: Path) -> None:
    """Where every missing weight is of a layer past the folder's last one (a
    `num_hidden_layers` override larger than the folder's count: the override builds that many
    layers, and the folder has weights for its own), say so instead of "does config.json match
    the weights", which it does."""
    layers = getattr(config, "num_hidden_layers", None)
    found: set[int] = set()
    prefixes: set[str] = set()  # where the model's layers sit in a checkpoint
    for name in missing:
        match = _LAYER.match(name)
        if match is None:
            return  # not only whole layers: another mismatch
        found.add(int(match[2]))
        prefixes.update(m[1] for m in map(_LAYER.match, aliases(name)) if m is not None)
    held = {int(m[2]) for m in map(_LAYER.match, where) if m is not None and m[1] in prefixes}
    if not held or not isinstance(layers, int) or min(found) != max(held) + 1:
        return
    if found != set(range(min(found), layers)):
        return
    count = max(held) + 1
    first = _LAYER.match(missing[0])[1]  # the model's own name for its layers
    gone = f"{first}.{count}.*" + (f" to {first}.{layers - 1}.*" if layers - 1 > count else "")
    raise DllmError(
        f"the model has {layers} layers (num_hidden_layers) and {str(folder)!r} holds weights "
        f"for {count}: {gone} {'are' if layers - 1 > count else 'is'} missing",
        hint=f"set model.config_overrides.num_hidden_layers to {count} or fewer (an override "
        "builds the model's first N layers from the folder's; a config.json that says more "
        "than its weights hold needs correcting), or point model.path at a folder with that "
        "many layers",
    )


def _read_tensor(handle, file: Path, name: str) -> torch.Tensor:
    """One tensor of an open safetensors file; a torn file (its header whole, its data cut
    short) or a name its index wrongly places there is an `UnreadableWeights` naming it."""
    from safetensors import SafetensorError

    try:
        return handle.get_tensor(name)
    except (SafetensorError, RuntimeError) as error:
        raise UnreadableWeights(
            f"{str(file)!r}: tensor {name!r} is unreadable ({error})", hint=_UNREADABLE_HINT
        ) from None


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full (unsharded) CPU tensors under HF names; collective when the model is sharded."""
    from torch.distributed.tensor import DTensor

    out: dict[str, torch.Tensor] = {}
    external = set(getattr(model, "external_weights", ()))  # owned by another folder
    for name, param in named_parameters_clean(model):
        if name in external:
            continue
        tensor = param.full_tensor() if isinstance(param, DTensor) else param
        out[name] = tensor.detach().to("cpu").contiguous()
    return out


# transformers' `save_pretrained` default (5.x) and its size units: decimal, as the Hub counts
# its 50 GB per-file limit (huggingface_hub's parse_size_to_int: "5GB" is 5 * 10**9 bytes).
DEFAULT_MAX_SHARD_SIZE = "50GB"
_SIZE_UNITS = {"TB": 10**12, "GB": 10**9, "MB": 10**6, "KB": 10**3}
_SINGLE = "model.safetensors"
_INDEX = "model.safetensors.index.json"
_SHARD_NAME = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")


def weight_files(folder: str | Path) -> list[str]:
    """The weight files `save_hf` writes that are in `folder`, sorted: model.safetensors, or
    the shards and model.safetensors.index.json of a sharded save (a folder holding both kinds,
    e.g. one written by other tools, lists both)."""
    return sorted(
        p.name
        for p in Path(folder).iterdir()
        if p.is_file() and (p.name in (_SINGLE, _INDEX) or _SHARD_NAME.fullmatch(p.name))
    )


def parse_shard_size(size: int | str) -> int:
    """Bytes per safetensors file: an int, or a string as transformers reads `max_shard_size`
    ("5GB", "500MB", "200KB", "1.5TB"; decimal units, any case), or digits alone (bytes)."""
    bad = DllmError(
        f"max shard size {size!r} is not a size",
        hint='give bytes or a number with a unit, as transformers\' max_shard_size: "5GB", '
        '"500MB", "200KB" (decimal: 1GB = 10^9 bytes; GiB and the like are not read)',
    )
    if isinstance(size, bool):
        raise bad
    if isinstance(size, int):
        value = size
    elif isinstance(size, str):
        text = size.strip()
        if text.isdigit():
            value = int(text)
        else:
            unit = text[-2:].upper()
            if unit not in _SIZE_UNITS:
                raise bad
            try:
                number = float(text[:-2].strip())
            except ValueError:
                raise bad from None
            if not math.isfinite(number):
                raise bad
            value = int(number * _SIZE_UNITS[unit])
    else:
        raise bad
    if value <= 0:
        raise bad
    return value


def _plan_shards(sizes: dict[str, int], limit: int) -> list[list[str]]:
    """Tensor names per file, grouped as huggingface_hub's `split_state_dict_into_shards` (what
    transformers' `save_pretrained` calls) groups them: in order, a new file when the next
    tensor would take this one past `limit`, and a tensor larger than `limit` alone in a file
    of its own, placed when it is met (before the file still being filled)."""
    shards: list[list[str]] = []
    current: list[str] = []
    current_size = 0
    for name, size in sizes.items():
        if size > limit:
            shards.append([name])
            continue
        if current_size + size > limit:
            shards.append(current)
            current, current_size = [], 0
        current.append(name)
        current_size += size
    if current or not shards:  # an empty state is still one (empty) model.safetensors
        shards.append(current)
    return shards


def save_hf(
    state: dict[str, torch.Tensor],
    config,
    folder: str | Path,
    dtype: torch.dtype | None = None,
    *,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Write config.json and the weights in the Hugging Face layout, sharded as transformers'
    `save_pretrained` shards them: one model.safetensors when all the tensors (in `dtype`) fit
    in `max_shard_size` bytes, else model-0000i-of-0000N.safetensors files (a tensor is never
    split; one larger than the limit has a file of its own) and model.safetensors.index.json
    ({"metadata": {"total_parameters", "total_size"}, "weight_map": name -> file}). Tensors are
    converted to `dtype` one file at a time, so the extra memory is one file's, not a second
    copy of the model. Weight files of an earlier save in `folder` that this one does not
    write are removed (a stale index would be read instead of the new weights)."""
    from turbo_dllm.fsutil import save_safetensors

    limit = parse_shard_size(max_shard_size)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = [n for n in state if not (config.tie_word_embeddings and n == _HEAD)]  # re-tied by HF

    def written_size(tensor: torch.Tensor) -> int:
        return tensor.numel() * (dtype or tensor.dtype).itemsize

    sizes = {name: written_size(state[name]) for name in names}
    shards = _plan_shards(sizes, limit)
    count = len(shards)
    files = (
        [_SINGLE]
        if count == 1
        else [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]
    )
    hf = config.to_hf_dict()
    if dtype is not None:
        hf["torch_dtype"] = str(dtype).removeprefix("torch.")
    (folder / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    for stale in weight_files(folder):
        if stale not in files:
            (folder / stale).unlink()
    for file, shard in zip(files, shards, strict=True):
        tensors = {
            name: (state[name].to(dtype) if dtype is not None else state[name]).contiguous()
            for name in shard
        }
        save_safetensors(tensors, folder / file, metadata={"format": "pt"})
        del tensors  # this file's converted copies go before the next file's are made
    if count > 1:
        index = {
            "metadata": {
                "total_parameters": sum(state[name].numel() for name in names),
                "total_size": sum(sizes.values()),
            },
            "weight_map": {
                name: file for file, shard in zip(files, shards, strict=True) for name in shard
            },
        }
        (folder / _INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return folder


def allocate(model: nn.Module, device: torch.device) -> nn.Module:
    """Give a meta model uninitialised storage on `device` (keeping tied weights tied)."""
    model.to_empty(device=device)
    model.tie_weights()  # to_empty() unties plain modules
    return model


def materialize(
    model: nn.Module, device: torch.device, *, seed: int, weights_from: str | None = None
) -> nn.Module:
    """Allocate storage on `device` and fill it: HF weights from a folder, else random init."""
    allocate(model, device)
    if weights_from is not None:
        load_hf_weights(model, model.config, weights_from)
    else:
        init_weights(model, model.config, seed)
    return model
