"""What a model family and a training objective are, as the registry (`turbo_dllm.registry`) holds them.

A family is one folder under `turbo_dllm/families/` (docs/architecture.md, "Adding a family"):
its torch-free half (this descriptor, the Hugging Face config reader, presets, validation rules)
is imported by `config/` to build the RunSpec schema and validate specs; its torch half (model,
parallelize plan, state-dict adapter) is named by a module path and imported only by the
trainer, export and tests, through `Family.runtime()`. The trainer never branches on a family's
name: it calls the runtime's functions (`FamilyRuntime`).
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import json
import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from turbo_dllm.errors import DllmError, os_error_hint
from turbo_dllm.sigterm import Terminated

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = [
    "AXES",
    "RUNTIME_FUNCTIONS",
    "Family",
    "artifact_mask_problems",
    "checkpoint_mask_problems",
    "FamilyConfig",
    "FamilyMismatch",
    "FamilyRuntime",
    "ModelMisfit",
    "ModelUnreadable",
    "Objective",
    "DECODER_SIZES",
    "decoder_shape_problems",
    "derived_head_dim",
    "head_dim_for",
    "HEAD_DIM_DEFAULTS",
    "KEY_DEFAULTS",
    "key_default",
    "kv_heads_for",
    "hf_config_errors",
    "json_type_problems",
    "raise_on_json_types",
    "import_failure",
    "no_attention_dropout",
    "nonpositive_fields",
    "number_problems",
    "raise_if_unusable",
    "read_hf_config",
]

# Topology axes beyond plain replicated data parallelism (`topology.dp`), as the RunSpec names them.
AXES = ("fsdp", "cp", "bp", "tp", "sp", "ep")
# The functions every family's runtime module has (`FamilyRuntime`): `Family.runtime()` refuses
# a module that lacks one, naming it, before the trainer or export calls it.
RUNTIME_FUNCTIONS = ("build_model", "layers", "check_tensor_parallel", "apply_tensor_parallel")
# `model.config_overrides` keys a flat `rope_parameters` holds too (it wins over the root key).
_ROPE_KEYS = ("rope_theta", "partial_rotary_factor")
# `model.config_overrides` keys a multimodal config's root governs (transformers' composite
# model reads them there, not in `text_config`): set at the root too.
_ROOT_KEYS = ("tie_word_embeddings",)
# Real-valued keys a config.json may still spell as an integer (Qwen3's `rope_theta: 1000000`).
_REAL_KEYS = (*_ROPE_KEYS, "rms_norm_eps", "initializer_range")
# Keys a config.json holds as an object or a list: an override sets them whole, never from a
# scalar.
_STRUCTURED_KEYS = (
    "rope_parameters",
    "rope_scaling",
    "layer_types",
    "text_config",
    "vision_config",
    "per_layer_config",
    "architectures",
    "id2label",
    "label2id",
)
# The keys every transformers config takes (`PretrainedConfig.__init__`), whatever its model.
HF_COMMON_KEYS = frozenset(
    {
        "transformers_version",
        "architectures",
        "output_hidden_states",
        "return_dict",
        "dtype",
        "torch_dtype",
        "chunk_size_feed_forward",
        "is_encoder_decoder",
        "id2label",
        "label2id",
        "problem_type",
        "model_type",
    }
)


class FamilyMismatch(DllmError):
    """The model a RunSpec points at is of a type its `model.family` does not read."""

    def __init__(
        self,
        message: str,
        hint: str | None = None,
        *,
        model_type: Any = None,
        readers: list[str] | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, hint)
        self.model_type = model_type
        # The families that read that model's config.json, where the raiser knows them; else
        # the registry asks each family (`Family.reads`) about `config`, that config.json.
        self.readers = readers
        self.config = config


class ModelMisfit(DllmError):
    """The model a RunSpec describes cannot be built as given (reported by validation at
    `path`, or at each of `problems`' (field path, message) pairs where it has several, unlike
    a folder that cannot be read here, which doctor and the trainer report)."""

    def __init__(
        self,
        message: str,
        hint: str | None = None,
        *,
        path: str = "model",
        problems: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(message, hint)
        self.path = path
        self.problems = problems


class ModelUnreadable(DllmError):
    """A model config file that cannot be read here (missing, unreadable, not a JSON object):
    validation leaves it to `dllm doctor` and the trainer, on the host that has the file."""


class FamilyConfig(Protocol):
    """What the trainer reads from any family's model config (a frozen, torch-free value)."""

    model_type: str
    vocab_size: int
    hidden_size: int

    def to_hf_dict(self) -> dict[str, Any]: ...
    def num_params(self) -> int: ...
    def step_flops(self, *, stream_tokens: int, scored_tokens: int, pairs: int) -> float:
        """A family with the `LAST_LAYER_QUERIES` trim also takes `last_layer=(query tokens,
        pairs)`: what its last layer computes (`train.parallel.plan.model_work`)."""
        ...


class FamilyRuntime(Protocol):
    """The torch half of a family: a module with these functions (see the decoder's runtime).

    Optional: `STREAM_TRIMS`, the work its model may skip where no loss reads it
    (`train.attention.trim`), `model_mask`, `wrap_attention`, `build_sequence_plan`."""

    def build_model(
        self, config: Any, backend: Any, dtype: torch.dtype | None = None
    ) -> nn.Module: ...
    def layers(self, model: nn.Module) -> nn.ModuleList: ...
    def apply_tensor_parallel(
        self, model: nn.Module, tp_mesh: Any, *, sequence_parallel: bool = False
    ) -> None: ...


@dataclass(frozen=True)
class Family:
    """One model family: what it reads, what trains it, how it may be split, where its code is."""

    name: str
    summary: str
    model_types: tuple[str, ...]  # Hugging Face `model_type` values its config reader accepts
    objectives: tuple[str, ...]  # objective names that can train it
    axes: frozenset[str]  # topology axes (of AXES) it supports
    presets: Mapping[str, Mapping[str, Any]]  # random-init shapes: name -> HF config dict
    read_config: Callable[[dict[str, Any]], FamilyConfig]  # HF config dict -> config (torch-free)
    runtime_module: str  # module path of the torch half (a FamilyRuntime)
    # Family-specific rules on a RunSpec: (field path, message) pairs, given the model's config.
    rules: Callable[[Any, FamilyConfig], list[tuple[str, str]]] | None = None
    # Why an axis it lacks is refused, where there is more to say than "not supported".
    axis_reasons: Mapping[str, str] = field(default_factory=dict)
    # "module:function" (spec) -> [(field path, message)]: rules on the files a spec names beyond
    # the model (e.g. a feature artifact), checked where data artifacts are (launch, train,
    # `dllm data validate`), not by torch-free validation: they may read trainer-level formats.
    input_rules: str | None = None
    # RunSpec `model` fields its runtime's build_model takes as keywords (e.g. linear_attention);
    # a family without one refuses a spec that sets it away from its default.
    model_options: tuple[str, ...] = ()
    # Reads a RunSpec's whole `model` section itself, instead of `resolve_config` (a family
    # whose config comes from more than one folder: a drafter and its target).
    configure: Callable[[Any], FamilyConfig] | None = None
    # config.json keys `model.config_overrides` may set beyond those the config already has:
    # the fields of the family's transformers config classes (besides `HF_COMMON_KEYS`) and
    # every key its `read_config` reads. Any other key is refused (a typo would be ignored).
    config_keys: frozenset[str] = frozenset()

    def reads(self, hf: Mapping[str, Any]) -> bool:
        """Whether this family can train the model of config.json `hf`: its model_type is one
        this family reads and its config reader does not refuse it as another kind of model
        (a FamilyMismatch: a DFlash drafter's config says "qwen3" too, and a plain Qwen3
        folder is no drafter). A value the reader refuses is fixable in that config.json: the
        family still trains that kind of folder."""
        if hf.get("model_type") not in self.model_types:
            return False
        try:
            self.read_config(json.loads(json.dumps(hf)))
        except FamilyMismatch:
            return False
        except Exception as error:  # a plugin's reader may raise anything on a bad value
            if import_failure(error) is None:  # Ctrl-C, SIGTERM
                raise
        return True

    def input_problems(self, spec: Any) -> list[tuple[str, str]]:
        """The `input_rules` of this family on `spec` (empty without any)."""
        if self.input_rules is None:
            return []
        module, _, name = self.input_rules.partition(":")
        return getattr(importlib.import_module(module), name)(spec)

    def runtime(self) -> FamilyRuntime:
        try:
            module: ModuleType = importlib.import_module(self.runtime_module)
        except ModuleNotFoundError as error:
            # The module itself (or a package above it) is not there: a misspelt runtime_module
            # or a family package that is not installed here. Not an import inside it, whose
            # traceback shows the line.
            name = error.name or ""
            if name != self.runtime_module and not self.runtime_module.startswith(f"{name}."):
                raise
            raise DllmError(
                f"model family {self.name!r}{self._declared_by()}: its runtime module "
                f"{self.runtime_module!r} cannot be imported (no module named {name!r})",
                hint="Family.runtime_module names the module of the family's torch half "
                "(build_model, layers, ...): check the name, and that its package is installed",
            ) from None
        missing = [f for f in RUNTIME_FUNCTIONS if not callable(getattr(module, f, None))]
        if missing:
            raise DllmError(
                f"model family {self.name!r}{self._declared_by()}: its runtime module "
                f"{self.runtime_module!r} has no {', '.join(missing)} (every family's runtime "
                f"defines {', '.join(RUNTIME_FUNCTIONS)})",
                hint='add them to that module (docs/architecture.md, "The family registry", '
                "lists what each does; a family that refuses tensor parallelism still has a "
                "check_tensor_parallel that raises), or uninstall the package that declares it",
            )
        return _CheckedRuntime(self, module)  # type: ignore[return-value]

    def _declared_by(self) -> str:
        """' (from plugin DIST VERSION)' where an installed package's entry point declares this
        family (found only on an error's path: a plugin's errors name who to ask), else ''."""
        from importlib.metadata import entry_points

        for point in entry_points(group="turbo_dllm.families", name=self.name):
            try:
                mine = point.load() == self
            except BaseException as error:  # (the registry reports a plugin that does not load)
                if import_failure(error) is None:  # Ctrl-C, SIGTERM
                    raise
                mine = False
            dist = getattr(point, "dist", None)
            if mine and dist is not None:
                return f" (from plugin {dist.name} {dist.version})"
        return ""

    def resolve_config(
        self,
        *,
        path: str | None,
        from_config: str | None,
        overrides: Mapping[str, Any] | None = None,
    ) -> FamilyConfig:
        """The model shape a RunSpec asks for: a local HF folder, a preset, or a config.json."""
        if path is not None:
            hf = read_hf_config(Path(path) / "config.json", what="model folder")
            where = f"model.path {path!r}"
        elif from_config is not None:
            if from_config in self.presets:
                hf = json.loads(json.dumps(self.presets[from_config]))  # a deep, plain copy
            elif from_config.endswith(".json") or "/" in from_config:
                hf = read_hf_config(Path(from_config), what="model config")
            else:
                raise DllmError(
                    f"unknown model preset {from_config!r} for family {self.name!r}",
                    hint=f"use one of {', '.join(self.presets)} or a path to a config.json",
                )
            where = f"model.from_config {from_config!r}"
        else:
            raise DllmError(
                "the RunSpec names no model", hint="set model.path or model.from_config"
            )
        text = hf.get("text_config")
        text = text if isinstance(text, dict) else None
        configs = (hf, text) if text is not None else (hf,)
        self._refuse_unknown_keys(overrides or {}, hf, text)
        for key, value in (overrides or {}).items():
            value = _override_value(key, value, _current_value(key, hf, text))
            # A multimodal config keeps its text model in `text_config`, which its reader reads
            # first: a key there changes there (and at the root only where the root has it too,
            # or governs it).
            if text is not None and key in text:
                text[key] = value
            if text is None or key not in text or key in hf or key in _ROOT_KEYS:
                hf[key] = value
            if key not in _ROPE_KEYS:
                continue
            for config in configs:
                rope = config.get("rope_parameters")
                # A flat one (not DiffusionGemma's per-layer-kind dicts): transformers 5 reads it.
                if isinstance(rope, dict) and not any(isinstance(v, dict) for v in rope.values()):
                    config["rope_parameters"] = {**rope, key: value}
        model_type = hf.get("model_type")
        if model_type not in self.model_types:
            raise FamilyMismatch(
                f"{where} is a {model_type!r} model, which model.family {self.name!r} does not "
                f"read (it reads {', '.join(self.model_types)})",
                hint="set model.family to the family of that model",
                model_type=model_type,
                config=hf,
            )
        # Our attention applies no dropout, in every family: a config.json asking for it would
        # train another model than transformers would (a plugin's reader need not check it).
        no_attention_dropout(hf)
        if text is not None:
            no_attention_dropout(text)
        return self.read_config(hf)

    def _refuse_unknown_keys(
        self, overrides: Mapping[str, Any], hf: dict[str, Any], text: dict[str, Any] | None
    ) -> None:
        """A ModelMisfit at each `model.config_overrides` key that neither the config nor a
        config.json of this family has (a misspelled key would be ignored: the model would
        train with the preset's value), with the nearest known key."""
        known = set(hf) | set(text or {}) | set(self.config_keys) | HF_COMMON_KEYS
        found = []
        for key in overrides:
            if key in known or _current_value(key, hf, text) is not None:
                continue
            close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
            suggestion = f"; did you mean {close[0]!r}?" if close else ""
            found.append(
                (
                    f"model.config_overrides.{key}",
                    f"unknown config key{suggestion} (neither this config nor a "
                    f"{'/'.join(self.model_types)} config.json has it)",
                )
            )
        if found:
            raise ModelMisfit(
                "\n".join(f"{path}: {message}" for path, message in found),
                hint="model.config_overrides changes config.json keys of the model",
                path=found[0][0],
                problems=tuple(found),
            )


class _CheckedRuntime:
    """A family's runtime module whose `build_model` and `layers` results are checked against
    the contract where they are returned (`Family.runtime()`): a plugin's build_model returning
    something other than an `nn.Module` (or a layers() other than an `nn.ModuleList` of the
    model's own) failed later, deep in the trainer or export, with a traceback naming neither
    the family nor its plugin. Every other attribute is the module's own."""

    def __init__(self, family: Family, module: ModuleType) -> None:
        self._family = family
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def __repr__(self) -> str:
        return f"<runtime of family {self._family.name!r}: {self._module.__name__}>"

    def build_model(self, *args: Any, **kwargs: Any) -> nn.Module:
        from torch import nn

        model = self._module.build_model(*args, **kwargs)
        if not isinstance(model, nn.Module):
            raise self._broken(
                f"build_model returned {_described(model)}, not a torch.nn.Module",
                "build_model(config, attention_backend, dtype) returns the model: an nn.Module "
                "made on the meta device (`families.base.on_meta_device`)",
            )
        return model

    def layers(self, model: nn.Module) -> nn.ModuleList:
        from torch import nn

        blocks = self._module.layers(model)
        if not isinstance(blocks, nn.ModuleList):
            raise self._broken(
                f"layers(model) returned {_described(blocks)}, not a torch.nn.ModuleList",
                "layers(model) returns the model's own nn.ModuleList of repeated blocks (such "
                "as model.model.layers), which checkpointing, compile and FSDP2 wrap in place",
            )
        if not any(part is blocks for part in model.modules()):
            raise self._broken(
                "layers(model) returned an nn.ModuleList that is not a part of the model "
                "build_model made (wrapping its blocks would change nothing the model runs)",
                "layers(model) returns the model's own nn.ModuleList of repeated blocks (such "
                "as model.model.layers), not a new one",
            )
        return blocks

    def _broken(self, what: str, contract: str) -> DllmError:
        family = self._family
        return DllmError(
            f"model family {family.name!r}{family._declared_by()}: its runtime module "
            f"{family.runtime_module!r}: {what}",
            hint=f'{contract} (docs/architecture.md, "The family registry"): fix that '
            "module, or uninstall the package that declares the family",
        )


def _described(value: Any) -> str:
    """`value` for an error message: its type and the start of its repr."""
    text = repr(value)
    text = text if len(text) <= 60 else f"{text[:57]}..."
    return f"a {type(value).__name__} ({text})" if value is not None else "None"


@dataclass(frozen=True)
class Objective:
    """One training objective; its module has `build(objective_spec, mask_token_id,
    vocab_size=None)` (the model's vocabulary, for objectives that draw tokens from it); a
    plugin's `build(objective_spec, mask_token_id)`, the contract before vocab_size, still
    serves and is called without it."""

    name: str
    summary: str
    runtime_module: str
    # The block size its stream always uses, whatever `objective.block_size` says (the
    # autoregressive objective: 1, token-causal); None: `objective.block_size`.
    stream_block_size: int | None = None

    def build(self, spec: Any, mask_token_id: int, vocab_size: int | None = None) -> Any:
        build = importlib.import_module(self.runtime_module).build
        if _accepts_keyword(build, "vocab_size"):
            return build(spec, mask_token_id, vocab_size=vocab_size)
        return build(spec, mask_token_id)


def _accepts_keyword(function: Callable, name: str) -> bool:
    """Whether `function` takes `name=` (a parameter of that name, or **kwargs)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): pass it, as before
        return True
    return any(
        p.kind == p.VAR_KEYWORD
        or (p.name == name and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        for p in parameters
    )


def import_failure(error: BaseException) -> str | None:
    """Why importing a plugin's module failed, for `error` escaping the import; None for Ctrl-C
    and a SIGTERM that unwinds the job (`sigterm`): those are the user's, not the plugin's. A
    module that calls `sys.exit()` (a script's `if __name__` guard left out, an argparse run at
    import) raises SystemExit, which would end every `dllm` command that reads a RunSpec, with
    the plugin's exit status and nothing said (0 for `sys.exit()`)."""
    if isinstance(error, (KeyboardInterrupt, Terminated, GeneratorExit)):
        return None
    if isinstance(error, SystemExit):
        return (
            f"importing it called sys.exit({error.code!r}): a plugin's module must not exit "
            "(run its script code under `if __name__ == '__main__':`)"
        )
    return f"importing it failed: {type(error).__name__}: {error}"


def _current_value(key: str, hf: dict[str, Any], text: dict[str, Any] | None) -> Any:
    """What the config holds under `key` before an override (None: it does not have it)."""
    for config in (text, hf) if text is not None else (hf,):
        if key in config:
            return config[key]
        rope = config.get("rope_parameters")
        if key in _ROPE_KEYS and isinstance(rope, dict) and key in rope:
            return rope[key]
    return None


def _override_value(key: str, value: Any, current: Any) -> Any:
    """`value` for the config key `key`, of the type the config has there (`current`), or a
    ModelMisfit naming the key where it has another: the reader would coerce it (`yes` read as
    1 layer, 1.5 as 1) or fail without naming the key. A number may be given as YAML text
    (`1e-6` is a string to YAML 1.1), an integer as an integral float (`2048.0`), and a real
    key a config spells as an integer (`rope_theta: 1000000`) takes any number; keys the config
    does not have are the reader's to check."""
    if current is None and key in _STRUCTURED_KEYS and not isinstance(value, (list, dict)):
        raise ModelMisfit(
            f"model.config_overrides.{key}: a config.json holds an object or a list there, "
            f"which an override cannot set (got {value!r})",
            hint="set it in a config.json (model.from_config) instead",
            path=f"model.config_overrides.{key}",
        )
    if current is None:
        return value
    number = value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            pass
    is_number = isinstance(number, (int, float)) and not isinstance(number, bool)
    if isinstance(current, bool):
        ok, wanted = isinstance(value, bool), "true or false"
    elif isinstance(current, int) and key not in _REAL_KEYS:
        ok, wanted = is_number and float(number).is_integer(), "an integer"
        number = int(number) if ok else number
    elif isinstance(current, (int, float)):
        ok, wanted = is_number, "a number"
    elif isinstance(current, str):
        ok, wanted = isinstance(value, str), "a string"
    elif isinstance(current, list):  # e.g. qwen3_8's layer_types: a whole new list
        ok, wanted = isinstance(value, list), "a list (a scalar cannot set it)"
    elif isinstance(current, dict):
        ok, wanted = isinstance(value, dict), "an object (a scalar cannot set it)"
    else:
        ok, wanted = False, f"a {type(current).__name__}, which an override cannot set"
    if not ok:
        structured = not isinstance(current, (bool, int, float, str))
        raise ModelMisfit(
            f"model.config_overrides.{key}: expected {wanted} (the config has {current!r}), "
            f"got {value!r}",
            hint="set it in a config.json (model.from_config) instead" if structured else None,
            path=f"model.config_overrides.{key}",
        )
    return number if isinstance(current, (int, float)) and not isinstance(current, bool) else value


def read_hf_config(path: Path, *, what: str) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelUnreadable(
            f"{what} config not found: {str(path)!r}",
            hint="point model.path at a Hugging Face folder holding config.json",
        ) from None
    except OSError as error:
        raise ModelUnreadable(
            f"cannot read {str(path)!r}: {error}",
            hint=os_error_hint(error.errno or 0) or "check that file and its permissions",
        ) from None
    except (ValueError, RecursionError) as error:
        raise ModelUnreadable(
            f"cannot read {str(path)!r}: {error}",
            hint="it is not valid JSON: download the model's config.json again (a copy cut "
            "short, or edited by hand?)",
        ) from None
    if not isinstance(value, dict):
        raise ModelUnreadable(f"{str(path)!r} is not a JSON object", hint="is this a config.json?")
    return value


def on_meta_device(build: Callable[[], Any], dtype: Any = None) -> Any:
    """A family's `build_model` body: the module `build()` makes on the meta device (parameters
    have shapes, no storage; the trainer materialises them after parallelising), in `dtype`."""
    import torch

    with torch.device("meta"):
        model = build()
    if dtype is not None:
        model.to(dtype)
    return model


@functools.cache
def hf_cache_argument(forward: Callable[..., Any]) -> str:
    """The name a transformers `forward` takes its KV cache under: `past_key_values` until
    transformers 5.2x renamed it `cache` (both are in use on our hosts: 5.17 on the H200)."""
    names = inspect.signature(forward).parameters
    return "cache" if "cache" in names else "past_key_values"


@contextmanager
def hf_config_errors(
    *,
    missing_hint: str,
    what: str = "config.json",
    fix: str | None = None,
) -> Iterator[None]:
    """Around a config reader's `cls(...)` from a config.json dict: a missing key or a value of
    the wrong type becomes one DllmError naming the field or the value (`fix`: its hint; a
    family that takes no model.config_overrides says so)."""
    try:
        yield
    except KeyError as missing:
        raise DllmError(f"{what} lacks the field {missing.args[0]!r}", hint=missing_hint) from None
    except (TypeError, ValueError, ArithmeticError) as error:
        raise DllmError(
            f"{what} has a bad value: {error}",
            hint=fix or "fix that value in config.json, or set it with model.config_overrides",
        ) from None


# What a config.json key must hold, for `json_type_problems`: "int" (a JSON integer; 4.0 too),
# "real" (any JSON number), "flag" (true or false), "text" (a string), "ids" (a token id or a
# list of them), "ints" (a list of integers), "object", "list"; a trailing "?" allows null (the reader's default), a trailing "!" marks a key
# the reader requires (no default: removing it is no fix).
_KIND_WORDS = {
    "int": "an integer",
    "real": "a number",
    "flag": "true or false",
    "text": "a string",
    "ids": "a token id or a list of them",
    "object": "an object ({...})",
    "list": "a list ([...])",
    "ints": "a list of integers",
}


def _of_kind(value: Any, kind: str) -> bool:
    if isinstance(value, bool):
        return kind == "flag"
    if kind == "int":
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if kind == "real":
        return isinstance(value, (int, float))
    if kind == "text":
        return isinstance(value, str)
    if kind == "ints":
        return isinstance(value, list) and all(_of_kind(v, "int") for v in value)
    if kind in ("object", "list"):
        return isinstance(value, dict if kind == "object" else list)
    if kind == "ids":
        return isinstance(value, int) or (
            isinstance(value, list) and all(_of_kind(v, "int") for v in value)
        )
    return False


def _json_shown(value: Any) -> str:
    """`value` as config.json spells it, for an error message."""
    if isinstance(value, str):
        return f"the string {json.dumps(value)}"
    text = json.dumps(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def json_type_problems(
    config: Mapping[str, Any], kinds: Mapping[str, str], *, prefix: str = ""
) -> list[str]:
    """A problem line for each key of `kinds` that `config` holds with a value of another JSON
    type than its kind (see `_KIND_WORDS`), naming the key (after `prefix`, e.g.
    "text_config.") and what it must hold: a reader's int()/float()/bool() would otherwise fail
    without naming the key, or read "4" as 4, 2.5 as 2 and "false" as true."""
    found = []
    for key, kind in kinds.items():
        if key not in config:
            continue
        value = config[key]
        optional, required = kind.endswith("?"), kind.endswith("!")
        kind = kind.rstrip("?!")
        if (value is None and optional) or (value is not None and _of_kind(value, kind)):
            continue
        wanted = _KIND_WORDS[kind]
        if value is None and not required:
            wanted += " (or remove the key for the default)"
        elif isinstance(value, str) and kind in ("int", "real"):
            wanted += f", written without quotes ({value})" if _numeric(value) else ""
        found.append(f"{prefix}{key} is {_json_shown(value)}; it must be {wanted}")
    return found


def _numeric(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def raise_on_json_types(problems: list[str], *, what: str = "config.json") -> None:
    """One DllmError listing each of `json_type_problems`' lines, if there are any."""
    if problems:
        raise DllmError(
            f"{what} has values of the wrong type:\n"
            + "\n".join(f"  - {what}'s {p}" for p in problems),
            hint="write each as the model's value, of the type named (numbers without quotes, "
            "true or false for a flag), in config.json, or set it with model.config_overrides",
        )


def checkpoint_mask_problems(spec: Any, mask: int | None) -> list[tuple[str, str]]:
    """A checkpoint with its own mask token (`mask`, from a mask-token migration) must be masked
    with it: `objective.mask_token_id` another id, or unset over synthetic data (the trainer then
    masks with its last id) and that id another, is refused. (Unset over an artifact, the
    trainer masks with the artifact's: an input rule, `artifact_mask_problems`.)"""
    chosen = spec.objective.mask_token_id
    if mask is None:
        return []
    if chosen is not None and chosen != mask:
        return [
            ("objective.mask_token_id", f"{chosen} is not the checkpoint's mask token ({mask})")
        ]
    last = spec.data.synthetic.vocab_size - 1 if spec.data.synthetic is not None else None
    if chosen is None and last is not None and last != mask:
        return [
            (
                "objective.mask_token_id",
                f"unset, so the synthetic data would be masked with its last id ({last}), not "
                f"the checkpoint's mask token ({mask}); set it to {mask}",
            )
        ]
    return []


def artifact_mask_problems(spec: Any, mask: int | None, data_mask: int | None) -> list:
    """The input rule beside `checkpoint_mask_problems`: with `objective.mask_token_id` unset
    the trainer masks with the artifact's mask token (`data_mask`), which must be the
    checkpoint's (`mask`)."""
    if spec.objective.mask_token_id is not None or mask is None or data_mask in (None, mask):
        return []
    return [
        (
            "objective.mask_token_id",
            f"unset, so the trainer would mask with the artifact's mask token ({data_mask}), not "
            f"the checkpoint's ({mask}): prepare the data again with the model folder's "
            f"tokenizer (tokenizer.path), whose mask token is {mask}",
        )
    ]


def no_attention_dropout(config: dict[str, Any]) -> None:
    """Refuse a config.json asking for attention dropout: transformers applies it while
    training, our attention kernels apply none, so the run would train another model."""
    value = config.get("attention_dropout")
    if value:
        raise DllmError(
            f"attention_dropout {value} is not supported: turbo-dllm trains without attention "
            "dropout",
            hint="set model.config_overrides.attention_dropout: 0.0 to train without it",
        )


# transformers' head_dim for a config.json without one, by model_type (for qwen3_5 and
# diffusion_gemma, of their text config): its config class's default, or None where it derives
# hidden_size // num_attention_heads (LlamaConfig's None; Qwen2Config has no head_dim field and
# its attention derives it). nemotron_labs_diffusion is remote code whose config class is
# transformers' Ministral3Config (the family's parity oracle). A table, not an import of
# transformers (which imports torch: validation is torch-free);
# tests/families/test_head_dim_defaults.py holds it to the installed transformers.
HEAD_DIM_DEFAULTS: dict[str, int | None] = {
    "llama": None,
    "qwen2": None,
    "qwen3": 128,
    "qwen3_5": 256,
    "qwen3_5_text": 256,
    "diffusion_gemma": 256,
    "ministral3": 128,
    "nemotron_labs_diffusion": 128,
}


# transformers' defaults, by model_type, for other keys a config.json may lack where they
# differ between models (num_key_value_heads: LlamaConfig's None is num_attention_heads, but
# Qwen2Config / Qwen3Config default to 32), as its config classes declare them: read only where
# the key is absent (a null num_key_value_heads is num_attention_heads in every family).
# tests/families/test_head_dim_defaults.py holds it to the installed transformers.
KEY_DEFAULTS: dict[str, dict[str, int]] = {
    "llama": {"max_position_embeddings": 2048},
    "qwen2": {"num_key_value_heads": 32, "max_position_embeddings": 32768},
    "qwen3": {"num_key_value_heads": 32, "max_position_embeddings": 32768},
    "qwen3_5_text": {
        "num_key_value_heads": 4,
        "max_position_embeddings": 32768,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
    },
    "diffusion_gemma": {"num_key_value_heads": 4, "max_position_embeddings": 131_072},
}
KEY_DEFAULTS["qwen3_5"] = KEY_DEFAULTS["qwen3_5_text"]


def kv_heads_for(config: Mapping[str, Any], model_type: str, heads: int) -> int:
    """A config.json's `num_key_value_heads`; null: `heads` (every family); absent: the
    model_type's transformers default (`KEY_DEFAULTS`), else `heads` (Llama). An absent one
    whose default does not divide the heads is refused here, saying where the number comes
    from (transformers would build a model whose heads do not group)."""
    if "num_key_value_heads" in config:
        value = config["num_key_value_heads"]
        return heads if value is None else int(value)
    default = KEY_DEFAULTS.get(model_type, {}).get("num_key_value_heads")
    if default is None:
        return heads
    if heads > 0 and heads % default:
        raise ValueError(
            f"num_key_value_heads is absent, so transformers takes {model_type}'s default, "
            f"{default}, and num_attention_heads ({heads}) is not a multiple of it: give the "
            "model's num_key_value_heads"
        )
    return default


def key_default(model_type: str, key: str, fallback: int) -> int:
    """`key`'s transformers default for `model_type` (`KEY_DEFAULTS`), else `fallback`."""
    return KEY_DEFAULTS.get(model_type, {}).get(key, fallback)


def head_dim_for(config: Mapping[str, Any], model_type: str, hidden_size: int, heads: int) -> int:
    """The head size transformers gives the model of `config` (a config.json dict, or its
    text_config): its `head_dim`; where it has none, the model_type's default
    (`HEAD_DIM_DEFAULTS`: Qwen3 128, not hidden_size / heads), else hidden_size / heads. A null
    `head_dim` derives it where transformers takes null (a None default: Llama); where its
    class holds an integer (Qwen3, Ministral3) transformers refuses null, and so do we."""
    value = config.get("head_dim")
    if value is not None:
        return int(value)
    default = HEAD_DIM_DEFAULTS.get(model_type)
    if default is not None and "head_dim" in config:
        raise ValueError(
            f"head_dim is null, which a {model_type} config does not take: give the model's "
            f"head size, or remove the key for {model_type}'s default ({default})"
        )
    return default if default is not None else derived_head_dim(None, hidden_size, heads)


def derived_head_dim(head_dim: Any, hidden_size: int, heads: int) -> int:
    """A config.json's `head_dim`, or, where it has none, hidden_size / heads, which must then
    divide evenly (a truncated head would not be the model the config describes)."""
    if head_dim is not None:
        return int(head_dim)
    if heads <= 0:
        return 0  # reported by the size checks (num_attention_heads must be positive)
    if hidden_size % heads:
        raise ValueError(
            f"hidden_size ({hidden_size}) is not a multiple of num_attention_heads ({heads}), "
            "and head_dim is not set"
        )
    return hidden_size // heads


def number_problems(
    config: Any, names: tuple[str, ...], *, zero: bool = False, at_most: float | None = None
) -> list[str]:
    """A problem line for every number of `config` in `names` (fields, or keys of a dict
    `config`) outside its range: finite and > 0 (>= 0 with `zero`), and <= `at_most`."""
    found = []
    for name in names:
        value = config[name] if isinstance(config, dict) else getattr(config, name)
        low = ">= 0" if zero else "> 0"
        high = f" and <= {at_most}" if at_most is not None else ""
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (
            number
            and math.isfinite(value)
            and (value >= 0 if zero else value > 0)
            and (at_most is None or value <= at_most)
        ):
            found.append(f"{name} must be a finite number {low}{high} (got {value!r})")
    return found


def nonpositive_fields(config: Any, names: tuple[str, ...]) -> list[str]:
    """A problem line for every field of `config` in `names` that is not a positive number."""
    return [
        f"{name} must be positive (got {getattr(config, name)!r})"
        for name in names
        if int(getattr(config, name)) <= 0
    ]


# The sizes every decoder family's config has; each must be positive.
DECODER_SIZES = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)


def decoder_shape_problems(
    config: Any,
    extra: tuple[str, ...] = (),
    kv_heads: tuple[str, ...] = ("num_key_value_heads",),
) -> list[str]:
    """The checks every decoder family's config makes: `DECODER_SIZES` and the family's `extra`
    sizes positive, the query heads a multiple of each of the `kv_heads` counts, and the numbers
    that would make the loss NaN in range: `rms_norm_eps` and (where it has one) `rope_theta`
    positive, `initializer_range` not negative."""
    problems = nonpositive_fields(config, DECODER_SIZES + extra)
    positive = (
        ("rms_norm_eps", "rope_theta") if hasattr(config, "rope_theta") else ("rms_norm_eps",)
    )
    problems += number_problems(config, positive)
    problems += number_problems(config, ("initializer_range",), zero=True)
    heads = config.num_attention_heads
    for name in kv_heads:
        kv = getattr(config, name)
        if kv > 0 and heads % kv:
            problems.append(f"num_attention_heads ({heads}) must be a multiple of {name} ({kv})")
    return problems


def raise_if_unusable(
    problems: list[str],
    *,
    what: str = "model config",
    hint: str = "fix config.json or model.config_overrides",
) -> None:
    """One DllmError listing every problem a config reader found, if it found any."""
    if problems:
        raise DllmError(
            f"{what} is not usable:\n" + "\n".join(f"  - {p}" for p in problems), hint=hint
        )
