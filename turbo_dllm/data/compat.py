"""Does an artifact fit a RunSpec? Shared by `dllm data validate --config` and `dllm doctor`.

The checks: sequence length; the block size, for the objectives whose attention blocks tile
every sequence (block_diffusion, fast_dllm_v2: documents aligned to the artifact's block size are
aligned to any divisor of it; the other objectives never need documents on block boundaries, and
autoregressive streams blocks of 1); the model's vocabulary covers every id the artifact may hold;
and the mask token is inside the model's vocabulary and, for the objectives that mask with the
artifact's mask token (block_diffusion, fast_dllm_v2), the artifact's; a drafter's
`model.dflash.mask_token_id` (dflash_distillation) must be the artifact's mask token too.
"""

from __future__ import annotations

from turbo_dllm.data.artifact import DataManifest
from turbo_dllm.errors import DllmError

__all__ = ["artifact_problems", "eval_artifact_problems", "eval_sequences", "model_vocab_size"]

# Objectives whose stream is cut into blocks of objective.block_size from position 0, where a
# block holding the end of one document and the start of the next would leak across documents,
# and whose noise is the artifact's mask token. The others (autoregressive: token-causal;
# dflash_distillation: blocks at anchors, masked with model.dflash.mask_token_id;
# diffusiongemma_sft: a canvas from the response start, uniform-state noise) need neither.
_TILED_MASKED = frozenset({"block_diffusion", "fast_dllm_v2"})


def model_vocab_size(model) -> tuple[int | None, str]:
    """(vocab size, where it came from) for a RunSpec `model` section; None when unknowable.

    Order: model.config_overrides.vocab_size; then the family's own config reader
    (`turbo_dllm.registry.resolve_model_config`: a local HF folder's config.json, a preset, or a
    config.json path).
    """
    override = model.config_overrides.get("vocab_size")
    if isinstance(override, int) and not isinstance(override, bool):
        return override, "model.config_overrides.vocab_size"
    where = f"model.path {model.path}" if model.path else f"model.from_config {model.from_config}"
    from turbo_dllm.registry import resolve_model_config

    return int(resolve_model_config(model).vocab_size), where


def _vocab_fix(model, needed: int, manifest: DataManifest, artifact, vocab: int) -> str:
    """How to make the model's vocabulary cover `needed` ids: a random init (from_config, or
    an override already) takes a larger vocab_size; a checkpoint's embedding is what it is, so
    the data is prepared with its tokenizer. Where the data was prepared with the folder's
    tokenizer and still does not fit, that tokenizer is not the model's (it has ids past the
    embedding), or the mask token the preparation gave (`tokenizer.mask_token_id`) lies past it:
    preparing with the folder's tokenizer again would not help. (Data of another tokenizer
    gets the first fix: the tokenizer rule names it too.)"""
    target = getattr(model.dflash, "target", None) if model.family == "dflash" else None
    if target is not None:  # a drafter reads and writes its target's vocabulary
        return (
            f"prepare the data with the tokenizer of model.dflash.target {target}, whose ids "
            "its embedding covers (a drafter has its target's vocabulary)"
        )
    if not model.path or "vocab_size" in model.config_overrides:
        return f"set model.config_overrides.vocab_size: {needed}"
    from turbo_dllm.data.tokenizers import folder_vocabulary, vocabulary_fits

    pairs = folder_vocabulary(model.path) or []
    mask = manifest.special_tokens["mask"]
    top = max((i for _, i in pairs), default=-1)
    if top >= vocab:
        return (
            f"the tokenizer saved in model.path {model.path} has ids up to {top}, past the "
            f"{vocab} rows of its model's embedding (config.json vocab_size): it is not this "
            "model's tokenizer; put the model's own tokenizer files in that folder and prepare "
            "the data with it"
        )
    same = artifact is not None and vocabulary_fits(
        artifact, manifest.tokenizer.vocab_sha256, pairs
    )
    if mask >= vocab and pairs and same:
        return (
            f"the artifact's mask token {mask} has no row in the model's embedding: prepare the "
            f"data with tokenizer.mask_token_id below {vocab} (an id its text never holds) or "
            "tokenizer.mask_token naming an unused token of the vocabulary"
        )
    return (
        f"prepare the data with the tokenizer of model.path {model.path}, whose ids its "
        "embedding covers"
    )


def artifact_problems(manifest: DataManifest, spec) -> list[str]:
    """Every way the artifact does not fit the RunSpec, as `field: message` lines."""
    found: list[str] = []
    if spec.data.seq_len != manifest.seq_len:
        found.append(
            f"data.seq_len: {spec.data.seq_len}, but the artifact holds sequences of "
            f"{manifest.seq_len} tokens"
        )
    from turbo_dllm.registry import get_objective

    objective = spec.objective
    block = get_objective(objective.name).stream_block_size or objective.block_size
    tiled = objective.name in _TILED_MASKED
    if tiled and manifest.packing.align == "block" and manifest.block_size % block:
        found.append(
            f"objective.block_size: {block}, but the artifact aligned documents to blocks of "
            f"{manifest.block_size} (prepare again with packing.block_size: {block})"
        )
    if manifest.seq_len % block:
        found.append(
            f"objective.block_size: {block} does not divide the artifact's seq_len "
            f"{manifest.seq_len}"
        )
    try:
        vocab, where = model_vocab_size(spec.model)
    except DllmError as error:
        # its fix with it: `dllm train` and `dllm launch` print these lines under a hint of
        # their own ("change the spec, or prepare the data again"), not the model's
        found.append(f"model: {error.message}" + (f" ({error.hint})" if error.hint else ""))
        vocab, where = None, ""
    mask = manifest.special_tokens["mask"]
    drafter = getattr(spec.model, "dflash", None)
    if objective.name == "dflash_distillation" and drafter is not None:
        # The drafter fills its draft slots with this id; only the artifact's mask token is
        # kept out of the data, any other id may be a real token of the text.
        if drafter.mask_token_id != mask:
            found.append(
                f"model.dflash.mask_token_id: {drafter.mask_token_id}, but the artifact's mask "
                f"token is {mask}, the one id its data never holds (set model.dflash."
                f"mask_token_id: {mask}, or prepare the data with tokenizer.mask_token_id: "
                f"{drafter.mask_token_id})"
            )
        mask = drafter.mask_token_id
    if objective.mask_token_id is not None and objective.mask_token_id != mask:
        if tiled:
            found.append(
                f"objective.mask_token_id: {objective.mask_token_id}, but the artifact's mask "
                f"token is {mask} (leave mask_token_id unset to use it)"
            )
        else:  # unused by the objective, but the trainer still checks it against the model
            mask = objective.mask_token_id
    if vocab is not None:
        if manifest.vocab_size > vocab:
            fix = _vocab_fix(spec.model, manifest.vocab_size, manifest, spec.data.artifact, vocab)
            found.append(
                f"model: vocabulary of {vocab} ({where}) is smaller than the artifact's "
                f"{manifest.vocab_size} token ids ({fix})"
            )
        elif mask >= vocab:
            found.append(f"model: the mask token {mask} is outside the vocabulary of {vocab}")
    return found


def eval_artifact_problems(eval_manifest, spec, train_manifest=None) -> list[str]:
    """Every way the eval artifact does not fit the RunSpec (as the training data must) or the
    training data (same tokenizer and mask token), as `eval.artifact: ...` lines."""
    found = [f"eval.artifact: {line}" for line in artifact_problems(eval_manifest, spec)]
    synthetic = spec.data.synthetic
    if synthetic is not None and spec.objective.name in _TILED_MASKED:
        # the run masks with objective.mask_token_id, else synthetic data's last id, which the
        # held-out text may hold as a real token (only the artifact's mask token never is)
        mask = spec.objective.mask_token_id
        mask = synthetic.vocab_size - 1 if mask is None else mask
        held_out_mask = eval_manifest.special_tokens["mask"]
        if mask != held_out_mask and mask < eval_manifest.vocab_size:
            found.append(
                f"eval.artifact: the run masks with token {mask} (synthetic data's), which the "
                "held-out data may hold as real text; its mask token is "
                f"{held_out_mask} (set objective.mask_token_id: {held_out_mask}, or train on a "
                "prepared artifact)"
            )
    if train_manifest is not None:
        if eval_manifest.tokenizer != train_manifest.tokenizer:
            found.append(
                "eval.artifact: prepared with another tokenizer than data.artifact (vocabulary "
                f"sha256 {eval_manifest.tokenizer.vocab_sha256[:12]} against "
                f"{train_manifest.tokenizer.vocab_sha256[:12]}): its ids mean other tokens"
            )
        elif eval_manifest.special_tokens.get("mask") != train_manifest.special_tokens.get("mask"):
            found.append(
                f"eval.artifact: its mask token is {eval_manifest.special_tokens.get('mask')}, "
                f"data.artifact's {train_manifest.special_tokens.get('mask')}"
            )
    return found


def eval_sequences(spec, eval_manifest, dp_size: int) -> int:
    """How many held-out sequences an evaluation scores: the artifact's first `eval.sequences`
    (all by default), rounded down to whole global micro-batches (training.micro_batch_size x
    `dp_size`: every rank runs as many forwards, which FSDP's gathers need). None fitting is a
    DllmError (the trainer raises it, doctor reports it)."""
    total = eval_manifest.num_sequences
    wanted = min(spec.eval.sequences or total, total)
    micro = spec.training.micro_batch_size
    global_batch = micro * dp_size
    count = wanted - wanted % global_batch
    if count == 0:
        raise DllmError(
            f"eval: {wanted:,} held-out sequence{'s' if wanted != 1 else ''} (of {total:,} in "
            f"{spec.eval.artifact}) make no whole global micro-batch of {global_batch} "
            f"(training.micro_batch_size {micro} x {dp_size} data-parallel ranks), and every "
            "rank must evaluate as many",
            hint=f"evaluate at least {global_batch} sequences (eval.sequences, or more "
            "held-out documents)",
        )
    return count
