"""RunSpec: the typed description of one training run.

Strict pydantic models (`extra="forbid"`): unknown keys are errors. Field-level rules (ranges,
choices) live here; rules that relate several fields live in `turbo_dllm.config.validate`, which
collects every problem at once. Defaults are the CPU smoke run, so an almost empty file works.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PositiveInt, model_validator

from turbo_dllm import registry

__all__ = [
    "CheckpointSpec",
    "DFlashSpec",
    "DataSpec",
    "EvalSpec",
    "LaunchSpec",
    "LoggingSpec",
    "ModelSpec",
    "ObjectiveSpec",
    "OptimizerSpec",
    "ProfilerSpec",
    "RunSpec",
    "SchedulerSpec",
    "SyntheticDataSpec",
    "TopologySpec",
    "TrainingSpec",
    "WandbSpec",
]


def _landed(kind: str, available: tuple[str, ...]):
    """Refuse a name the schema lacks but more is known of (its plugin failed to load, or the
    product defines it and this version lacks it), saying so rather than 'unknown'."""

    def check(value):
        reason = None if value in available else registry.unavailable_reason(kind, value)
        if reason is not None:
            raise ValueError(f"{reason} (available: {', '.join(available)})")
        return value

    return BeforeValidator(check)


# The schema offers exactly what the registry holds: what this version can run.
_FAMILIES = tuple(registry.FAMILIES)
_OBJECTIVES = tuple(registry.OBJECTIVES)
ModelFamily = Annotated[Literal[_FAMILIES], _landed("family", _FAMILIES)]  # type: ignore[valid-type]
ObjectiveName = Annotated[Literal[_OBJECTIVES], _landed("objective", _OBJECTIVES)]  # type: ignore[valid-type]


def _not_bool(value):
    """A YAML boolean (true/false, yes/no, on/off) is a Python int and float, but never a
    count, a seed or a rate: refuse it where pydantic would read it as 1 or 0."""
    if isinstance(value, bool):
        raise ValueError(
            "expected a number, not a boolean (YAML reads yes/no, on/off and true/false as "
            "booleans)"
        )
    return value


def _only_bool(value):
    """A flag is true or false: pydantic would also read 1/0 and the strings "yes", "on", "1"
    as one, so `--set topology.sp=1` (meant as a degree) would turn it on."""
    if not isinstance(value, bool):
        raise ValueError("expected true or false (a flag is not a number or a string)")
    return value


# A flag as the RunSpec reads it: a YAML boolean only.
Bool = Annotated[bool, BeforeValidator(_only_bool)]
# Numbers as the RunSpec reads them: as pydantic's, but a boolean is not one.
Int = Annotated[int, BeforeValidator(_not_bool)]
PosInt = Annotated[PositiveInt, BeforeValidator(_not_bool)]
Float = Annotated[float, BeforeValidator(_not_bool)]
# Bounded numbers for a field that may also be None, or a list's or tuple's items: the bound sits
# under the boolean check. A bound put over it (`Annotated[Float, Field(gt=0)]`, or a Field bound
# on `Float | None`) is still enforced, but pydantic writes it into the JSON Schema as `gt`/`ge`,
# keys no JSON Schema validator knows, so an editor accepted what validate refuses.
NonNegInt = Annotated[int, Field(ge=0), BeforeValidator(_not_bool)]
PosFloat = Annotated[float, Field(gt=0.0), BeforeValidator(_not_bool)]
# A file, folder or revision: an empty one (`--set launch.run_dir=`) would resolve to the config's folder.
NonEmptyStr = Annotated[str, Field(min_length=1)]
# An Adam beta: torch refuses one outside [0, 1) when it builds the optimizer.
Beta = Annotated[float, Field(ge=0.0, lt=1.0), BeforeValidator(_not_bool)]


def _override_scalar(value):
    """A `model.config_overrides` value is one number, flag or string. A list or a mapping
    (`layer_types: [...]`, `rope_scaling: {...}`) got one pydantic line per member of the union
    ("Input should be a valid integer", "... a valid number", ...), none saying what to do."""
    lead = "an override is a number, true/false or a string, not"
    if value is None:
        raise ValueError(f"{lead} null; remove the key to keep the config's own value")
    if isinstance(value, (list, tuple, dict)):
        kind = "a mapping" if isinstance(value, dict) else "a list"
        raise ValueError(
            f"{lead} {kind}; set a key that holds a list or an object (layer_types, "
            "rope_scaling, ...) in a config.json and point model.from_config at it"
        )
    return value


# A `model.config_overrides` value: a scalar (a list or mapping is refused in one line).
OverrideValue = Annotated[int | float | bool | str, BeforeValidator(_override_scalar)]

# Bounds a typo cannot cross: past any context trained here (data artifacts share it), and seeds
# every generator we seed accepts.
MAX_SEQ_LEN = 1 << 22
MAX_SEED = (1 << 63) - 1


class _Strict(BaseModel):
    # inf / nan are never a learning rate, epsilon or duration.
    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False
    )


class LaunchSpec(_Strict):
    seed: Int = Field(
        0, ge=0, le=MAX_SEED, description="Seed for model init, noise and data order."
    )
    kind: Literal["smoke", "profile", "prod"] = Field(
        "smoke", description="prod enables the strict reproducibility rules."
    )
    run_dir: NonEmptyStr | None = Field(
        None, description="Run directory; default runs/<UTC stamp>-<short id>."
    )
    name: str | None = Field(None, description="Human name shown in `dllm run list`.")


class DFlashSpec(_Strict):
    """A DFlash drafter's target and, for a fresh drafter (`model.from_config: target`), its
    shape. The drafter shares the target's embeddings and LM head (frozen, read from `target`,
    never saved with the drafter); docs/dflash.md."""

    target: NonEmptyStr = Field(
        description="The target's local Hugging Face folder (Llama/Qwen2/Qwen3): its shape, its "
        "frozen embeddings and LM head, and, when `features` is unset, the model run in the "
        "training process (no grad) to produce the drafter's context features."
    )
    num_layers: PosInt = Field(1, description="Decoder layers of a fresh drafter.")
    block_size: Int = Field(
        16,
        ge=2,
        description="Tokens per drafted block [anchor, mask x (B-1)]; objective.block_size must "
        "equal it.",
    )
    target_layer_ids: list[NonNegInt] | None = Field(
        None,
        min_length=1,
        description="0-based target layers whose outputs are concatenated as the drafter's "
        "context features. Default: the middle layer for one draft layer, else one per draft "
        "layer spread evenly over layers 1 .. n-3 (as z-lab's DFlash).",
    )
    mask_token_id: Int = Field(
        ge=0, description="The token id of the block's masked slots (exported in dflash_config)."
    )
    sample_from_anchor: Bool = Field(
        False,
        description="Slot contract: false (z-lab): slot k drafts token anchor+k, slot 0 is the "
        "anchor itself; true: slot k drafts anchor+1+k. objective.sample_from_anchor must equal it.",
    )
    intermediate_size: PosInt | None = Field(
        None, description="MLP width of a fresh drafter; default: the target's."
    )
    features: NonEmptyStr | None = Field(
        None,
        description="A feature artifact made by `dllm dflash prepare-features`: training reads "
        "the target's features from it instead of running the target.",
    )
    architecture: Literal["DFlashDraftModel", "DFlash2DraftModel"] = Field(
        "DFlashDraftModel",
        description="A fresh drafter's architecture. DFlash2DraftModel adds block-local dynamic "
        "grouped convolutions to every layer and a low-rank candidate selector, and trains with "
        "the hard-label losses (objective.dflash_loss dflash / dpace...).",
    )
    conv_kernel_size: PosInt = Field(
        4,
        description="DFlash2: taps of each block-local causal convolution (it never reads "
        "across a block's start).",
    )
    conv_group_size: PosInt = Field(
        16,
        description="DFlash2: channels that share one dynamic convolution coefficient; must "
        "divide the hidden size.",
    )
    selector_rank: PosInt = Field(
        64, description="DFlash2: rank of the candidate selector's (predecessor, candidate) score."
    )
    selector_top_k: PosInt = Field(
        8,
        description="DFlash2: candidates per slot the selector ranks (the top-k of the unary "
        "logits).",
    )
    final_logit_softcapping: PosFloat | None = Field(
        None, description="DFlash2: unary logits are c * tanh(z / c); None: no cap."
    )
    output_multiplier: Float = Field(
        1.0, gt=0.0, description="DFlash2: unary logits = softcap(multiplier * logits)."
    )


class ModelSpec(_Strict):
    family: ModelFamily = "qwen3"
    path: NonEmptyStr | None = Field(None, description="Local Hugging Face model folder.")
    revision: NonEmptyStr | None = Field(None, description="Pinned revision (commit) of `path`.")
    from_config: NonEmptyStr | None = Field(
        "tiny",
        description="Random init from a preset name (tiny, qwen3-0.6b, qwen3-1.7b) or a config.json "
        "path. Default: tiny, or none where `path` is set.",
    )
    config_overrides: dict[str, OverrideValue] = Field(
        default_factory=dict, max_length=256, description="config.json keys to change."
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Parameter dtype; bfloat16 autocast is used on CUDA either way."
    )
    attention: Literal["reference", "flex", "turbo"] = Field(
        "reference",
        description="reference: SDPA + explicit mask (CPU); flex: FlexAttention (GPU); turbo: "
        "our Triton block-diffusion kernel (GPU; from the kernel bundle, or the shipped source "
        "with kernels: jit; head dim 64 or 128).",
    )
    linear_attention: Literal["torch", "fla"] = Field(
        "torch",
        description="Kernel of linear-attention (Gated DeltaNet) layers: torch (chunked "
        "reference, any device) or fla (flash-linear-attention, CUDA). Families without them "
        "refuse fla.",
    )
    dflash: DFlashSpec | None = Field(
        None, description="The target (and fresh shape) of a `family: dflash` drafter."
    )

    @model_validator(mode="before")
    @classmethod
    def _path_replaces_default_preset(cls, data: Any) -> Any:
        # `path: DIR` alone means "start from that folder": the `tiny` preset is only the
        # default of a spec that names no weights. Both named explicitly stays a conflict.
        if isinstance(data, dict) and data.get("path") is not None and "from_config" not in data:
            return {**data, "from_config": None}
        return data


class ObjectiveSpec(_Strict):
    name: ObjectiveName = "block_diffusion"
    block_size: PosInt = 16
    noise_schedule: Literal["log_linear"] = "log_linear"
    eps_min: Float = Field(1e-3, gt=0.0, le=1.0)
    eps_max: Float = Field(1.0, gt=0.0, le=1.0)
    antithetic: Bool = True
    loss_weighting: Literal["inverse_t", "unit"] | None = Field(
        None, description="Default: inverse_t for block_diffusion, unit for fast_dllm_v2."
    )
    mask_token_id: NonNegInt | None = Field(
        None,
        description="Default: the data artifact's mask token (or vocab_size-1 for synthetic).",
    )
    # --- dflash_distillation -------------------------------------------------------------
    anchor_sampling: Literal["uniform", "locality"] = Field(
        "uniform",
        description="dflash_distillation: how anchors are drawn among the valid ones. uniform: "
        "a random subset; locality: a random cyclic start, stride block_size (made coprime with "
        "the candidate count), so anchors are spread and unique with uniform marginals.",
    )
    max_anchors: PosInt = Field(
        512, description="dflash_distillation: at most this many anchors (blocks) per sequence."
    )
    decay_gamma: PosFloat | None = Field(
        None,
        description="dflash_distillation: slot k's weight is exp(-(k-1)/gamma) (exp(-k/gamma) "
        "with sample_from_anchor); None: every slot weighs 1.",
    )
    dflash_loss: Literal[
        "paper_ce",
        "speculators_kl",
        "greedy_ce",
        "dflash",
        "dpace",
        "dpace-cumulative-confidence-only",
        "dpace-continuation-value-only",
    ] = Field(
        "speculators_kl",
        description="dflash_distillation. DFlash drafters: paper_ce: cross-entropy against the "
        "true token; speculators_kl: forward KL(target || drafter) over the full vocabulary, "
        "computed in row chunks (the target then runs all its layers); greedy_ce: cross-entropy "
        "against the target's greedy token (its argmax; what greedy verification accepts). "
        "DFlash2 drafters (hard labels, plus the selector loss): dflash: cross-entropy weighted "
        "by the slot decay; "
        "dpace: weighted by the expected accepted continuation from the slot (D-PACE, from the "
        "drafter's own detached gold probabilities); dpace-cumulative-confidence-only: by the "
        "probability the block is accepted up to the slot; dpace-continuation-value-only: by "
        "the continuation beyond it (dpace / cumulative).",
    )
    greedy_path: Bool = Field(
        False,
        description="dflash_distillation, any loss but paper_ce: score a slot only where the "
        "true tokens from the anchor up to it are the target's greedy choices (decoding asks "
        "a slot only after the target accepted the ones before it; elsewhere the teacher's "
        "output is for a prefix it never sees). Off-path slots weigh 0; the loss is still "
        "divided by the count of supervised slots. DFlash2's hard-label losses then take the "
        "target's greedy token as the label (as greedy_ce does) and D-PACE counts only on-path "
        "slots. The target runs all its layers (or the feature artifact needs teacher rows).",
    )
    reveal_blocks: Float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="dflash_distillation, DFlash drafters: the fraction of blocks that show "
        "some slots' true tokens in place of the mask (each such block shows each slot with a "
        "rate drawn from U(0, 1), one slot always hidden; shown slots are not scored). Trains "
        "the drafter to refine its own draft over several forwards (dllm dflash eval "
        "--draft-steps). Needs sample_from_anchor false.",
    )
    dpace_alpha: Float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="dflash_distillation, dpace*: a slot's acceptance is (1 - alpha) p + alpha, "
        "p the drafter's detached probability of the gold token.",
    )
    selector_loss_alpha: Float = Field(
        1.0,
        ge=0.0,
        description="dflash_distillation, DFlash2: weight of the candidate selector's "
        "cross-entropy (over the top-k candidates) next to the token loss.",
    )
    selector_warmup_steps: Int = Field(
        0,
        ge=0,
        description="dflash_distillation, DFlash2: optimizer steps with the selector loss off "
        "(the original spells this as a ratio of the run's steps).",
    )
    selector_ramp_steps: Int = Field(
        0,
        ge=0,
        description="dflash_distillation, DFlash2: steps after the warmup over which the "
        "selector weight rises linearly to selector_loss_alpha (0: at once).",
    )
    sample_from_anchor: Bool = Field(
        False,
        description="dflash_distillation: the slot contract (model.dflash.sample_from_anchor).",
    )
    self_conditioning_probability: Float = Field(
        0.5, ge=0.0, le=1.0, description="diffusiongemma_sft: share of examples self-conditioned."
    )
    encoder_loss_weight: Float = Field(
        1.0, ge=0.0, description="diffusiongemma_sft: weight of the encoder's next-token loss."
    )


class SyntheticDataSpec(_Strict):
    num_sequences: PosInt = 256
    vocab_size: PosInt = 512


class DataSpec(_Strict):
    artifact: NonEmptyStr | None = Field(None, description="Folder made by `dllm data prepare`.")
    synthetic: SyntheticDataSpec | None = Field(None, description="Random tokens (smoke tests).")
    seq_len: PosInt = Field(256, le=MAX_SEQ_LEN)


class EvalSpec(_Strict):
    """Held-out loss during training: the same sequences under the same noise at every
    evaluation, so its curve compares the weights, not the samples drawn."""

    artifact: NonEmptyStr = Field(
        description="Held-out data: a folder made by `dllm data prepare` like data.artifact's "
        "(same tokenizer and seq_len), from documents the run does not train on."
    )
    interval: PosInt = Field(
        description="Evaluate after every `interval` optimizer steps, and after the last."
    )
    sequences: PosInt | None = Field(
        None,
        description="Evaluate the artifact's first N sequences (default: all), rounded down "
        "to a multiple of the global micro-batch (training.micro_batch_size x data-parallel "
        "ranks).",
    )


class TrainingSpec(_Strict):
    micro_batch_size: PosInt = 2
    grad_accumulation: PosInt = 1
    steps: PosInt = 50
    clip_grad_norm: PosFloat | None = 1.0
    activation_checkpointing: Bool | Literal["keep_attention", "keep_matmuls"] = Field(
        False,
        description="Recompute each layer in the backward instead of keeping its activations. "
        "'keep_attention': recompute all but the attention kernels' outputs (selective "
        "checkpointing): the backward reruns projections, norms and MLPs but not attention, "
        "whose cost grows with the context, for one more hidden-sized tensor kept per layer. "
        "'keep_matmuls': keep the matmuls' outputs too, so only norms, activations and other "
        "pointwise ops rerun (most of the layer's activations kept: for long contexts with "
        "memory to spare).",
    )
    mlp_chunks: PosInt = Field(
        1,
        description="Split each MLP's tokens into this many chunks, each recomputed on its own in "
        "the backward: the MLP's activations (its largest) then peak at 1/mlp_chunks, for one "
        "more MLP forward per step; for the longest contexts, where attention dominates the cost.",
    )
    compile: Bool = False
    max_duration_s: PosFloat | None = Field(
        None, description="Stop (after a checkpoint) once this many seconds have passed."
    )


class TopologySpec(_Strict):
    dp: PosInt = Field(1, description="Replicated data parallel degree.")
    fsdp: PosInt = Field(1, description="Sharded data parallel degree (FSDP2).")
    cp: PosInt = Field(1, description="Context parallel degree.")
    bp: PosInt = Field(1, description="Block parallel degree (CSBP).")
    tp: PosInt = Field(1, description="Tensor parallel degree.")
    sp: Bool = Field(False, description="Sequence parallelism inside the tensor-parallel group.")
    ep: PosInt = Field(1, description="Expert parallel degree (MoE families).")

    @property
    def layout(self):
        """This topology as the torch-free `ParallelLayout` (degrees, rules, rank coordinates)."""
        from turbo_dllm.config.topology import ParallelLayout

        return ParallelLayout.from_topology(self)

    @property
    def context_degree(self) -> int:
        return self.layout.context

    @property
    def world_size(self) -> int:
        return self.layout.world_size


class OptimizerSpec(_Strict):
    name: Literal["adamw"] = "adamw"
    lr: Float = Field(3e-4, gt=0.0)
    betas: tuple[Beta, Beta] = (0.9, 0.95)
    eps: Float = Field(1e-8, gt=0.0)
    weight_decay: Float = Field(0.1, ge=0.0)


class SchedulerSpec(_Strict):
    name: Literal["constant", "linear", "cosine", "wsd"] = "cosine"
    warmup_steps: Int = Field(5, ge=0)
    min_lr_ratio: Float = Field(0.1, ge=0.0, le=1.0)
    decay_fraction: Float = Field(
        0.2,
        gt=0.0,
        le=1.0,
        description="wsd only: the share of the steps after warmup that decay linearly to "
        "min_lr_ratio; the rest stay at the peak lr.",
    )


class CheckpointSpec(_Strict):
    dir: NonEmptyStr | None = Field(None, description="Default: <run_dir>/checkpoints.")
    interval: PosInt | None = Field(
        None, description="Steps between checkpoints; None: only at the end."
    )
    keep_last: PosInt = 2
    resume: Literal["auto", "never"] | NonEmptyStr = Field(
        "auto", description="auto: latest checkpoint in dir if any; never; or a checkpoint path."
    )


class WandbSpec(_Strict):
    project: str
    entity: str | None = None
    mode: Literal["online", "offline", "disabled"] | None = Field(
        None, description="W&B mode; unset: the environment's WANDB_MODE, else offline."
    )


class LoggingSpec(_Strict):
    console: Bool = True
    jsonl: Bool = True
    every: PosInt = 1
    wandb: WandbSpec | None = None
    tensorboard: Bool = Field(
        False,
        description="Write the step records as TensorBoard scalars into <run_dir>/tensorboard/.",
    )


class ProfilerSpec(_Strict):
    enabled: Bool = False
    start_step: Int = Field(3, ge=0)
    num_steps: PosInt = 3
    memory_snapshot: Bool = Field(
        False,
        description="CUDA: record allocations from the first step; dump the allocator snapshot "
        "and a summary by allocating line into profile/ after the window's last step and when "
        "a step runs out of memory.",
    )


class RunSpec(_Strict):
    """One training run. `dllm config schema` prints this as JSON Schema."""

    launch: LaunchSpec = LaunchSpec()
    model: ModelSpec = ModelSpec()
    objective: ObjectiveSpec = ObjectiveSpec()
    data: DataSpec = DataSpec(synthetic=SyntheticDataSpec())
    eval: EvalSpec | None = Field(
        None, description="Held-out evaluation (its loss in metrics.jsonl as eval_loss)."
    )
    training: TrainingSpec = TrainingSpec()
    topology: TopologySpec = TopologySpec()
    optimizer: OptimizerSpec = OptimizerSpec()
    scheduler: SchedulerSpec = SchedulerSpec()
    checkpoint: CheckpointSpec = CheckpointSpec()
    logging: LoggingSpec = LoggingSpec()
    profiler: ProfilerSpec = ProfilerSpec()
    kernels: Literal["native", "reference", "jit"] = Field(
        "reference",
        description="native: ops from the installed bundle; reference: pure torch; jit: build from source (never in prod).",
    )
