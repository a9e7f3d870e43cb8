"""Which loader a RunSpec gets, and which token id is the mask.

`data.artifact` streams a prepared artifact (`turbo_dllm.data.loader.ArtifactLoader`, imported
only when used); `data.synthetic` makes motif sequences (`SyntheticLoader`). Both give the same
batches and the same resumable state. The mask token is `objective.mask_token_id` if set, else
the artifact's `special_tokens["mask"]`, else the last id of the synthetic vocabulary.

The fingerprint names the sample stream a checkpoint continues: the artifact's content
fingerprint, or for synthetic data a sha256 over what makes its sequences (count, vocabulary,
seed; not seq_len, which only cuts them).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from turbo_dllm.errors import DllmError

__all__ = ["DataSource", "build_data", "synthetic_fingerprint"]


@dataclass(frozen=True)
class DataSource:
    loader: Any  # iterator of batches with state_dict / load_state_dict
    vocab_size: int  # ids the data can contain (tokenizer vocabulary)
    mask_token_id: int
    fingerprint: str  # the artifact's, or synthetic_fingerprint's


def synthetic_fingerprint(synthetic, seed: int, mask_token_id: int | None = None) -> str:
    """sha256 of the synthetic data's identity (`data.synthetic`, the seed, and the mask token
    its tokens avoid when that is not the default last id)."""
    identity = {"synthetic": synthetic.model_dump(mode="json"), "seed": seed}
    if mask_token_id is not None and mask_token_id != synthetic.vocab_size - 1:
        identity["avoid"] = mask_token_id
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def build_data(spec, *, model_vocab_size: int, dp_rank: int, dp_size: int) -> DataSource:
    """The loader and token facts for `spec` (a RunSpec), checked against the model."""
    data, objective, training = spec.data, spec.objective, spec.training
    if data.artifact is not None:
        from turbo_dllm.data.artifact import read_manifest
        from turbo_dllm.data.loader import ArtifactLoader

        manifest = read_manifest(data.artifact)
        mask = objective.mask_token_id
        if mask is None:
            mask = manifest.special_tokens.get("mask")
        if mask is None:
            raise DllmError(
                f"the artifact {data.artifact!r} names no mask token",
                hint="set objective.mask_token_id, or prepare with a tokenizer that has one",
            )
        loader = ArtifactLoader(
            data.artifact,
            seq_len=data.seq_len,
            micro_batch_size=training.micro_batch_size,
            dp_rank=dp_rank,
            dp_size=dp_size,
            seed=spec.launch.seed,
        )
        source = DataSource(loader, manifest.vocab_size, int(mask), manifest.fingerprint)
    else:
        from turbo_dllm.train.synthetic import SyntheticLoader

        synthetic = data.synthetic
        mask = objective.mask_token_id
        loader = SyntheticLoader(
            num_sequences=synthetic.num_sequences,
            vocab_size=synthetic.vocab_size,
            seq_len=data.seq_len,
            micro_batch_size=training.micro_batch_size,
            dp_rank=dp_rank,
            dp_size=dp_size,
            seed=spec.launch.seed,
            avoid=mask,  # the mask token is never a real token of the stream
        )
        source = DataSource(
            loader,
            synthetic.vocab_size,
            synthetic.vocab_size - 1 if mask is None else int(mask),
            synthetic_fingerprint(synthetic, spec.launch.seed, mask),
        )
    if source.vocab_size > model_vocab_size:
        raise DllmError(
            f"the data uses {source.vocab_size} token ids but the model's vocabulary has "
            f"{model_vocab_size}",
            hint="use a model whose vocab_size covers the tokenizer, or set "
            f"model.config_overrides.vocab_size: {source.vocab_size}",
        )
    if not 0 <= source.mask_token_id < model_vocab_size:
        raise DllmError(
            f"mask token id {source.mask_token_id} is outside the model's vocabulary "
            f"({model_vocab_size})",
            hint="set objective.mask_token_id to an id the model has",
        )
    return source
