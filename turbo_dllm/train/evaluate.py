"""Held-out evaluation during training (the RunSpec's `eval:` section).

Every `eval.interval` steps, and after the last, the model scores the training objective on
held-out sequences without a backward: the eval artifact's first N sequences (`eval.sequences`,
rounded down to a multiple of the global micro-batch so every data-parallel rank runs the same
number of forwards, which FSDP's collectives need), each corrupted by the objective under a
fixed noise key (step `EVAL_STEP`, the sequence's index). The same sequences under the same
noise at every evaluation: the curve moves only with the weights, never with the samples drawn,
and the loss is the same for any cp / bp / dp layout that evaluates the same sequences (one
process's, up to float rounding), as training's is.

The loss is training's: the objective's weighted sum over the evaluated sequences divided by
their supervised count (each term over its own count for an objective of several), so an
evaluation on the training data reads like the training loss.

A stop that comes during an evaluation (SIGTERM, `training.max_duration_s`: `train.stop`) is
read between its micro-batches: the rest is left off (`LeftOff`) and the step it follows is
saved at once, as at a step boundary. A part of the held-out sequences is not the held-out loss,
so a left-off evaluation logs none: the step's record says `eval_left_off` (the cause) instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from turbo_dllm.data.compat import eval_artifact_problems, eval_sequences
from turbo_dllm.data.loader import artifact_batch
from turbo_dllm.errors import DllmError
from turbo_dllm.train.stop import Stop

__all__ = ["EVAL_STEP", "EvalSet", "LeftOff", "build_eval_set", "check_eval_data"]

# The noise keys' step: no training step draws from it (training steps count from 0).
EVAL_STEP = -1


@dataclass(frozen=True)
class EvalSet:
    """This rank's held-out micro-batches (host tensors, drawn once) and their noise keys."""

    interval: int
    sequences: int  # evaluated by all data-parallel ranks together
    fingerprint: str  # the eval artifact's
    batches: list[dict[str, torch.Tensor]]
    first_samples: list[int]  # each micro-batch's first sequence index (its noise key)
    available: int = 0  # the eval artifact's sequences
    global_batch: int = 0  # training.micro_batch_size x data-parallel ranks

    def due(self, done: int, total: int) -> bool:
        """Whether an evaluation follows step `done` (1-based) of `total`."""
        return done % self.interval == 0 or done == total

    def shortfall(self, wanted: int | None) -> str | None:
        """What the trainer says where an evaluation scores fewer sequences than
        `eval.sequences` asks for (the artifact holds fewer, or they are rounded down to whole
        global micro-batches); None where it scores them all (or all the artifact's)."""
        if wanted is None or wanted == self.sequences:
            return None
        why = []
        if wanted > self.available:
            why.append(f"the held-out artifact holds {self.available:,}")
        if min(wanted, self.available) != self.sequences:
            why.append(f"rounded down to whole global micro-batches of {self.global_batch}")
        return (
            f"note: eval.sequences is {wanted:,}; each evaluation scores {self.sequences:,} "
            f"({', '.join(why)})"
        )


@dataclass(frozen=True)
class LeftOff:
    """An evaluation stopped before its last micro-batch (`Trainer.evaluate`): why, and how far
    it got (this rank's micro-batches; every rank ran as many)."""

    stop: Stop
    done: int
    batches: int

    def record(self) -> dict[str, str]:
        """What the step's metrics record says instead of an eval_loss."""
        return {"eval_left_off": self.stop.cause}

    def __str__(self) -> str:
        return (
            f"its evaluation was left off after {self.done} of {self.batches} held-out "
            "micro-batches (no eval_loss logged)"
        )


def check_eval_data(spec, dp_size: int):
    """The held-out artifact and how many of its sequences an evaluation scores, or a DllmError
    naming every misfit; None without `eval:`. `dllm train` calls it before it makes the run dir
    (a refused run left an empty one behind), the trainer again as it builds the eval set."""
    config = spec.eval
    if config is None:
        return None
    from turbo_dllm.data.artifact import DataArtifact, read_manifest

    try:
        artifact = DataArtifact(config.artifact)
    except DllmError as error:  # named as the held-out data, not as the training data
        raise DllmError(f"eval.artifact: {error.message}", hint=error.hint) from None
    manifest = artifact.manifest
    train = read_manifest(spec.data.artifact) if spec.data.artifact is not None else None
    if found := eval_artifact_problems(manifest, spec, train):
        lines = "\n".join(f"  - {line}" for line in found)
        raise DllmError(
            f"the held-out data does not fit the run:\n{lines}",
            hint="prepare the held-out documents with the training data's prepare.yaml "
            "(its tokenizer and packing), into another output folder",
        )
    return artifact, eval_sequences(spec, manifest, dp_size)


def build_eval_set(spec, *, dp_rank: int, dp_size: int) -> EvalSet | None:
    """This rank's share of the held-out sequences, read once; None without `eval:`."""
    checked = check_eval_data(spec, dp_size)
    if checked is None:
        return None
    artifact, count = checked
    manifest = artifact.manifest
    micro = spec.training.micro_batch_size
    # micro-batch m holds sequences [m * micro, (m + 1) * micro); rank r takes every m = r mod dp
    firsts = list(range(dp_rank * micro, count, micro * dp_size))
    batches = [artifact_batch(artifact, list(range(first, first + micro))) for first in firsts]
    return EvalSet(
        spec.eval.interval,
        count,
        manifest.fingerprint,
        batches,
        firsts,
        available=manifest.num_sequences,
        global_batch=micro * dp_size,
    )
