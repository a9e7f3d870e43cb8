"""Cross-field rules of a RunSpec, all collected into one report.

`problems(spec)` returns every violated rule as (field path, message); `check(spec)` raises one
`DllmError` listing them all. Rules that need the launch (world size) take it as an argument, so
`dllm config validate` and `dllm launch` share them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from turbo_dllm import registry
from turbo_dllm.config.runspec import ObjectiveSpec, RunSpec
from turbo_dllm.config.topology import ParallelLayout, context_stream_lengths
from turbo_dllm.errors import DllmError
from turbo_dllm.families.base import FamilyMismatch, ModelMisfit, ModelUnreadable

__all__ = ["Problem", "check", "problems"]

_PINNED_REVISION = re.compile(r"^[0-9a-f]{7,64}$")


@dataclass(frozen=True)
class Problem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def problems(spec: RunSpec, world_size: int | None = None) -> list[Problem]:
    found: list[Problem] = []

    def add(path: str, message: str) -> None:
        found.append(Problem(path, message))

    model, objective, data, topo = spec.model, spec.objective, spec.data, spec.topology

    # --- what the family supports (turbo_dllm.registry) ---------------------------------------
    family = registry.FAMILIES[model.family]
    if model.path is None and model.from_config is None:
        add(
            "model",
            "set model.path (a local HF folder) or model.from_config (a preset or config.json)",
        )
    elif model.path is not None and model.from_config is not None:
        add(
            "model",
            f"model.path ({model.path}) and model.from_config ({model.from_config}) both name the "
            "weights to start from: drop one (model.from_config=null keeps the folder)",
        )
    if objective.name not in family.objectives:
        add(
            "objective.name",
            f"{objective.name!r} cannot train model family {model.family!r} "
            f"(allowed: {', '.join(family.objectives)})",
        )
    refused = set()
    for axis in registry.AXES:
        used = getattr(topo, axis)
        if (used is True or (used is not False and used > 1)) and axis not in family.axes:
            reason = family.axis_reasons.get(axis, f"family {model.family!r} does not support it")
            add(f"topology.{axis}", f"{axis} is not supported here: {reason}{_axis_fix(axis)}")
            refused.add(f"topology.{axis}")
    if model.linear_attention != "torch" and "linear_attention" not in family.model_options:
        add(
            "model.linear_attention",
            f"model family {model.family!r} has no linear-attention layers (leave it at torch)",
        )

    # --- objective and data shapes ---------------------------------------------------------
    if objective.eps_min > objective.eps_max:
        add("objective.eps_min", f"must be <= objective.eps_max ({objective.eps_max})")
    # The block size of the model's stream (the autoregressive objective always uses 1).
    block = registry.OBJECTIVES[objective.name].stream_block_size or objective.block_size
    if data.seq_len % block:
        below = data.seq_len // block * block
        nearest = f"{below} or {below + block}" if below else str(block)
        add(
            "data.seq_len",
            f"{data.seq_len} is not a multiple of objective.block_size ({objective.block_size}; "
            f"nearest: {nearest})",
        )
    if (data.artifact is None) == (data.synthetic is None):
        add("data", "set exactly one of data.artifact (a prepared folder) or data.synthetic")
    if data.synthetic is not None and objective.mask_token_id is not None:
        if objective.mask_token_id >= data.synthetic.vocab_size:
            add(
                "objective.mask_token_id",
                f"{objective.mask_token_id} is outside the synthetic "
                f"vocabulary (size {data.synthetic.vocab_size})",
            )

    # --- topology ---------------------------------------------------------------------------
    if topo.sp and "topology.sp" not in refused:
        context = max(topo.cp, topo.bp)
        if topo.tp <= 1:
            add("topology.sp", "sequence parallelism needs topology.tp > 1")
        elif data.seq_len % (context * topo.tp):
            unit = math.lcm(context * topo.tp, block)  # whole blocks too
            below = data.seq_len // unit * unit
            nearest = f"{below} or {below + unit}" if below else str(unit)
            add(
                "topology.sp",
                f"sequence parallelism splits each rank's tokens over tp: data.seq_len "
                f"({data.seq_len}) must be a multiple of max(cp, bp) x tp = {context * topo.tp} "
                f"(nearest that are whole blocks too: {nearest}; or sp: false)",
            )
    for path, message in ParallelLayout.from_topology(topo).problems(world_size):
        if path not in refused:  # a refused axis: its degree's rules do not matter
            add(path, message)
    if topo.cp > 1 and data.seq_len % (2 * topo.cp * block):
        unit = 2 * topo.cp * block
        below = data.seq_len // unit * unit
        nearest = f"{below} or {below + unit}" if below else str(unit)
        add(
            "data.seq_len",
            f"context parallelism shards the sequence zigzag into 2*cp chunks of "
            f"whole blocks: seq_len must be a multiple of {unit} (nearest: {nearest})",
        )
    if topo.bp > 1 and data.seq_len // block < 2 * topo.bp:
        blocks = data.seq_len // block
        fewer = f"topology.bp <= {blocks // 2}" if blocks >= 4 else "topology.bp = 1"
        add(
            "data.seq_len",
            f"block parallelism gives each rank a pair of blocks: needs at least "
            f"{2 * topo.bp} blocks, got {blocks} ({fewer}, or data.seq_len >= "
            f"{2 * topo.bp * block})",
        )
    if message := _uneven_sp_shares(spec, block, refused):
        add("topology.sp", message)
    if spec.eval is not None and objective.name == "dflash_distillation":
        add(
            "eval",
            "a drafter's held-out measure is its acceptance on real prompts: `dllm dflash "
            "eval` (eval: scores the training objective on held-out token data)",
        )
    for field, readers in OBJECTIVE_FIELDS.items():
        value = getattr(objective, field)
        if objective.name not in readers and value != ObjectiveSpec.model_fields[field].default:
            add(
                f"objective.{field}",
                f"{value!r} would be ignored: only {' and '.join(readers)} reads it, this run's "
                f"objective is {objective.name} (leave it out)",
            )
    family_found = _family_rules(spec, family)
    tp_found = [i for i, (path, _) in enumerate(family_found) if path == "topology.tp"]
    if tp_found and "topology.tp" not in refused:
        fits = _tp_that_fit(spec, family)
        if fits:
            path, message = family_found[tp_found[-1]]
            family_found[tp_found[-1]] = (
                path,
                f"{message} (the tp degrees up to 8 that split this model: "
                f"{', '.join(map(str, fits))})",
            )
    for path, message in family_found:
        add(path, message)
    if model.attention == "turbo":
        for message in _turbo_rules(spec):
            add("model.attention", message)

    # --- production rules -------------------------------------------------------------------
    if spec.launch.kind == "prod":
        if data.artifact is None:
            add("data.artifact", "prod runs need a prepared dataset, not synthetic data")
        if model.path is not None and not (
            model.revision and _PINNED_REVISION.match(model.revision)
        ):
            add("model.revision", "prod runs need the model pinned to a commit hash")
        elif model.path is not None and set(model.revision) == {"0"}:
            # The prod recipes' placeholder: it passed as a pin, and the run's manifest then
            # recorded a commit that no checkpoint has.
            add(
                "model.revision",
                f"{model.revision!r} is a placeholder (all zeros), not the commit of "
                f"{model.path}: set it to the commit the folder was downloaded at (its "
                "snapshot folder's name in the Hugging Face cache, "
                "hub/models--ORG--NAME/snapshots/<commit>; or `git -C FOLDER rev-parse HEAD` "
                "for a git clone)",
            )
        if model.path is None:
            add("model.path", "prod runs train a real checkpoint (model.path), not a random init")
        if spec.kernels == "jit":
            add(
                "kernels",
                "prod runs use prebuilt, verified kernels: 'native' or 'reference', not 'jit'",
            )

    # --- training ---------------------------------------------------------------------------
    if (
        spec.profiler.enabled
        and spec.profiler.start_step + spec.profiler.num_steps > spec.training.steps
    ):
        add(
            "profiler",
            f"window ends at step {spec.profiler.start_step + spec.profiler.num_steps} "
            f"but training.steps is {spec.training.steps}",
        )
    if spec.scheduler.warmup_steps > spec.training.steps:
        add(
            "scheduler.warmup_steps",
            f"{spec.scheduler.warmup_steps} exceeds training.steps ({spec.training.steps})",
        )
    return found


# The objective fields only some objectives read: another objective would ignore a value set
# there without a word (compared with the default, since a written spec.yaml spells out every
# default).
OBJECTIVE_FIELDS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(
        (
            "anchor_sampling",
            "max_anchors",
            "decay_gamma",
            "dflash_loss",
            "greedy_path",
            "reveal_blocks",
            "dpace_alpha",
            "selector_loss_alpha",
            "selector_warmup_steps",
            "selector_ramp_steps",
            "sample_from_anchor",
        ),
        ("dflash_distillation",),
    ),
    "self_conditioning_probability": ("diffusiongemma_sft",),
    "encoder_loss_weight": ("diffusiongemma_sft",),
}


def _family_rules(spec: RunSpec, family) -> list[tuple[str, str]]:
    """The family's own rules (e.g. tp must divide the heads) on the model the spec names.

    The shape is read from the preset or the local config.json and checked as the trainer
    checks it (without building weights): a config it would refuse is refused here. A model
    file that cannot be read here is reported by `dllm doctor`'s model check and by the trainer
    on the host that has it.
    """
    model = spec.model
    if model.path is None and model.from_config is None:
        return []  # reported with the other model rules
    try:
        config = registry.resolve_model_config(model)
    except FamilyMismatch as error:
        return [("model.family", f"{error.message}; {error.hint}")]
    except ModelMisfit as error:
        return list(error.problems) or _reported(error.path, error)
    except ModelUnreadable:
        return []
    except DllmError as error:
        return _reported(_model_config_path(model), error)
    return _vocabulary_rules(spec, config) + (family.rules(spec, config) if family.rules else [])


def _splits(seq_len: int, block: int, cp: int, bp: int, tp: int) -> bool:
    """Whether every context rank's share of the stream splits evenly over tp (with the
    layout rules holding for `seq_len`)."""
    return all(n % tp == 0 for n in context_stream_lengths(seq_len, block, cp, bp))


def _uneven_sp_shares(spec: RunSpec, block: int, refused: set[str]) -> str | None:
    """Sequence parallelism cuts each rank's share of [x_t ; x_0] into tp equal pieces; under
    block parallelism the shares differ (noisy blocks plus a clean prefix), and one that tp does
    not divide made the workers' collectives disagree (gloo aborted the run). Checked where the
    other layout rules hold, so the shares are defined."""
    topo, seq_len = spec.topology, spec.data.seq_len
    cp, bp, tp = topo.cp, topo.bp, topo.tp
    context = max(cp, bp)
    if not topo.sp or tp <= 1 or bp <= 1 or bp > 65536 or "topology.sp" in refused:
        return None  # (each share is O(1), the ranks O(bp): a bound no real group reaches)
    unit = math.lcm(context * tp, block, 2 * cp * block if cp > 1 else 1)
    if (
        seq_len % unit
        or seq_len // block < 2 * bp
        or (cp > 1 and (bp < cp or bp % cp))
        or _splits(seq_len, block, cp, bp, tp)
    ):
        return None  # fits, or another rule says what to change
    shares = context_stream_lengths(seq_len, block, cp, bp)
    uneven = sorted({n for n in shares if n % tp})
    candidates = [seq_len - k * unit for k in range(1, 65)] + [
        seq_len + k * unit for k in range(1, 65)
    ]
    fits = [
        n for n in candidates if n > 0 and n // block >= 2 * bp and _splits(n, block, cp, bp, tp)
    ]
    nearest = sorted(sorted(fits, key=lambda n: abs(n - seq_len))[:2])
    lengths = f"data.seq_len {' or '.join(map(str, nearest))} splits evenly, " if nearest else ""
    return (
        f"sequence parallelism cuts each rank's share of the stream [x_t ; x_0] into tp = {tp} "
        f"equal pieces, but under bp = {bp} (cp = {cp}) the ranks of a context group hold "
        f"{', '.join(map(str, shares))} tokens (block size {block}), and "
        f"{', '.join(map(str, uneven))} {'does' if len(uneven) == 1 else 'do'} not split: "
        f"{lengths}or set sp: false"
    )


def _axis_fix(axis: str) -> str:
    """What to set for an axis the family refuses, and the families that have it."""
    others = [name for name, family in registry.FAMILIES.items() if axis in family.axes]
    off = "false" if axis == "sp" else "1"
    where = f" (model families with {axis}: {', '.join(others)})" if others else ""
    return f"; set topology.{axis}: {off}{where}"


def _tp_that_fit(spec: RunSpec, family) -> list[int]:
    """The tp degrees 2 .. 8 (a bound: tp may be any integer) for which the family's rules find nothing to refuse on
    topology.tp for this model (its heads, MLP ... divide), so a refusal can name them."""
    if not family.rules:
        return []
    try:
        config = registry.resolve_model_config(spec.model)
    except DllmError:
        return []
    fits = []
    for tp in range(2, 9):
        trial = spec.model_copy(
            update={"topology": spec.topology.model_copy(update={"tp": tp, "sp": False})}
        )
        if not any(path == "topology.tp" for path, _ in family.rules(trial, config)):
            fits.append(tp)
    return [1, *fits]


def _vocabulary_rules(spec: RunSpec, config) -> list[tuple[str, str]]:
    """Token ids the model has no embedding for, which the trainer refuses (every family)."""
    found = []
    synthetic, mask = spec.data.synthetic, spec.objective.mask_token_id
    if synthetic is not None and synthetic.vocab_size > config.vocab_size:
        found.append(
            (
                "data.synthetic.vocab_size",
                f"{synthetic.vocab_size} exceeds the model's vocab_size {config.vocab_size}",
            )
        )
    if mask is not None and mask >= config.vocab_size:
        found.append(
            (
                "objective.mask_token_id",
                f"{mask} is outside the model's vocabulary (vocab_size {config.vocab_size})",
            )
        )
    return found


def _reported(path: str, error: DllmError) -> list[tuple[str, str]]:
    """`error` as problems at `path`: one per line of a reader's list ("model config is not
    usable:" then "  - ..." lines), else one with its hint."""
    message = error.message.removeprefix(f"{path}: ")
    head, *items = message.split("\n")
    if items and head.endswith(":") and all(i.startswith("  - ") for i in items):
        return [(path, item[len("  - ") :]) for item in items]
    return [(path, message + (f" ({error.hint})" if error.hint else ""))]


def _model_config_path(model) -> str:
    """Where a config the trainer would refuse comes from: the overrides when the config is
    usable without them, else the folder or preset the spec names."""
    if model.config_overrides:
        try:
            registry.resolve_model_config(model.model_copy(update={"config_overrides": {}}))
        except DllmError:
            pass
        else:
            return "model.config_overrides"
    return "model.path" if model.path is not None else "model.from_config"


def _turbo_rules(spec: RunSpec) -> list[str]:
    """turbo's kernels are written for head dims 64 and 128 (whether a bundle holds them is a
    host question: `dllm doctor --config` and the launch readiness check ask it)."""
    try:
        config = registry.resolve_model_config(spec.model)
    except DllmError:
        return []  # reported by the family rules, doctor or the trainer
    head_dim = getattr(config, "head_dim", None)
    if head_dim in (None, 64, 128):
        return []
    return [f"turbo supports head dim 64 or 128, this model has {head_dim}; use flex"]


def check(spec: RunSpec, world_size: int | None = None, source: str = "RunSpec") -> RunSpec:
    """Raise one DllmError listing every problem, or return the spec unchanged."""
    found = problems(spec, world_size)
    if found:
        lines = "\n".join(f"  - {p}" for p in found)
        raise DllmError(
            f"{source} has {len(found)} problem{'s' if len(found) > 1 else ''}:\n{lines}",
            hint="fix the fields above; `dllm config schema` lists every field and its type",
        )
    return spec
