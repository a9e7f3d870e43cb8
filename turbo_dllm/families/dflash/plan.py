"""How a drafter's training micro-batch becomes model inputs: the trainer's sequence plan.

`DraftPlan.prepare(draft_batch, device)` gets the target's features (online: the frozen target
runs here, `target.TargetFeatures`; offline: the batch's rows of the feature artifact,
`features.FeatureStore`),
lays the anchors' blocks out as the drafter's tokens [anchor, mask x (B-1)] at positions
anchor + 0..B-1, builds the attention mask (a block sees itself, bidirectionally, and the
context of its document before its anchor) and the scoring hook (`paper_ce`,
`speculators_kl`, or DFlash2's hard-label kinds, `hard_labels.py`). The max(cp, bp) ranks of a
context group read the same batch and share its anchors in dual-end order. Under context
parallelism (cp) the context is cut into cp contiguous shards: a rank projects only its shard
of the features (fc, hidden_norm, each layer's context K/V) and the layers all-gather the
context K/V over the cp group (`DraftContext.group`); with bp > cp (fused), bp / cp groups of
cp ranks each hold one sharded copy of the context, and the anchors are still spread over all
max(cp, bp) ranks.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch

from turbo_dllm.errors import DllmError
from turbo_dllm.families.dflash.config import DFlashConfig
from turbo_dllm.families.dflash.hard_labels import hard_label_loss
from turbo_dllm.families.dflash.losses import frozen_linear_argmax, frozen_linear_kl
from turbo_dllm.families.dflash.model import DraftContext
from turbo_dllm.train.losses import linear_cross_entropy
from turbo_dllm.train.objectives.dflash_distillation import HARD_LABEL_LOSSES, DraftBatch
from turbo_dllm.train.parallel.plan import ModelInputs

__all__ = [
    "DraftPlan",
    "draft_attention_mask",
    "draft_score",
    "greedy_path",
    "share_anchors",
    "target_guesses",
]


def draft_attention_mask(
    anchors: torch.Tensor,
    anchor_valid: torch.Tensor,
    doc_ids: torch.Tensor | None,
    context_len: int,
    block_size: int,
) -> torch.Tensor:
    """(R, 1, N*B, L + N*B) bool: context rows [doc start, anchor) of the block's document,
    then the block's own B tokens (padding blocks see only themselves)."""
    rows, n = anchors.shape
    device = anchors.device
    anchor_q = anchors.repeat_interleave(block_size, dim=1)  # (R, Q)
    valid_q = anchor_valid.repeat_interleave(block_size, dim=1)
    kv = torch.arange(context_len, device=device)
    context = (kv[None, None, :] < anchor_q[:, :, None]) & valid_q[:, :, None]
    if doc_ids is not None:
        docs = doc_ids.to(device)
        context &= docs.gather(1, anchor_q)[:, :, None] == docs[:, None, :]
    block = torch.arange(n * block_size, device=device) // block_size
    local = (block[:, None] == block[None, :]).expand(rows, -1, -1)
    return torch.cat([context, local], dim=-1)[:, None]


def draft_score(
    batch: DraftBatch,
    teacher: torch.Tensor | None,
    hidden: torch.Tensor,
    head: torch.Tensor,
    drafter=None,
) -> torch.Tensor:
    """The objective's weighted loss summed over the supervised slots (the output hook; a
    DFlash2 drafter hands itself as `drafter`, for its unary logits and selector)."""
    guess = path = None
    if batch.greedy_path or batch.loss == "greedy_ce":
        guess = target_guesses(teacher, head)
    if batch.greedy_path:
        path = greedy_path(batch, guess)
    if batch.loss in HARD_LABEL_LOSSES:
        if path is None:
            return hard_label_loss(batch, hidden, head, drafter)
        # on the target's greedy path the hard label is its greedy token (what verification
        # accepts), and only on-path slots count
        labels = guess.flatten()[batch.teacher_index]
        return hard_label_loss(batch, hidden, head, drafter, labels=labels, on_path=path > 0)
    flat = hidden.reshape(-1, hidden.shape[-1]).index_select(0, batch.score_index)
    if batch.loss == "paper_ce":
        return linear_cross_entropy(flat, head, batch.targets, batch.weights)
    weights = batch.weights if path is None else batch.weights * path
    if batch.loss == "greedy_ce":
        return linear_cross_entropy(flat, head, guess.flatten()[batch.teacher_index], weights)
    rows = teacher.reshape(-1, teacher.shape[-1]).index_select(0, batch.teacher_index)
    return frozen_linear_kl(flat, head, rows.to(flat.dtype), weights)


def target_guesses(teacher: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """(R, L) long: the target's greedy next token after every context position: the argmax of
    the frozen head over its last hidden states (`teacher`, (R, L, H), final-normed)."""
    rows, length, hidden = teacher.shape
    return frozen_linear_argmax(teacher.reshape(-1, hidden), head).view(rows, length)


def greedy_path(batch: DraftBatch, guess: torch.Tensor) -> torch.Tensor:
    """(n,) float32: 1 for a scored slot whose block, from the anchor up to the drafted
    position, holds the target's own greedy tokens (`guess`, from `target_guesses`), else 0.

    Speculative decoding only ever asks slot k for its token after slots 1..k-1 were accepted,
    that is, after the target's greedy choices; where the true text left that path, the
    target's output at slot k answers a question decoding never asks.
    """
    rows, length = guess.shape
    ids = batch.context_ids.to(guess.device)
    miss = torch.zeros(rows, length, dtype=torch.int32, device=guess.device)
    miss[:, 1:] = guess[:, :-1] != ids[:, 1:]  # position t's token is not the greedy choice
    misses = miss.cumsum(1).flatten()  # misses[r * L + t]: off-path tokens at 1..t
    anchors = batch.anchors.to(guess.device).flatten()[batch.score_index // batch.block_size]
    row = batch.teacher_index // length  # teacher_index = r * L + (drafted position - 1)
    between = misses[batch.teacher_index] - misses[row * length + anchors]  # a + 1 .. t - 1
    return (between == 0).to(torch.float32)


def draft_tokens(batch: DraftBatch, mask_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, N*B) token ids [anchor token, mask x (B-1)] per block (a shown slot holds its true
    token), and their positions."""
    rows, n = batch.anchors.shape
    b = batch.block_size
    tokens = torch.full((rows, n, b), mask_token_id, dtype=torch.long, device=batch.anchors.device)
    tokens[:, :, 0] = torch.where(
        batch.anchor_valid, batch.context_ids.gather(1, batch.anchors), mask_token_id
    )
    positions = batch.anchors[:, :, None] + torch.arange(b, device=batch.anchors.device)
    if batch.shown is not None:
        at = positions.clamp(max=batch.context_ids.shape[1] - 1).reshape(rows, n * b)
        true = batch.context_ids.gather(1, at).view(rows, n, b)
        tokens = torch.where(batch.shown.to(tokens.device), true, tokens)
    return tokens.reshape(rows, n * b), positions.reshape(rows, n * b)


def share_anchors(batch: DraftBatch, rank: int, size: int) -> DraftBatch:
    """This rank's anchors under block parallelism, in dual-end order: a row's valid anchors
    (sorted, so cost grows with the index j: the context before it) pair up as (j, n-1-j), and
    pair p goes to rank p % size, so every rank holds about the same context cost. Anchors are
    compacted and the scored slots renumbered; the ranks' losses add up to the whole batch's."""
    rows, width = batch.anchors.shape
    b = batch.block_size
    valid = batch.anchor_valid
    index = valid.long().cumsum(1) - 1  # valid anchors come first in each row
    count = valid.sum(1, keepdim=True)
    pair = torch.minimum(index, count - 1 - index)
    mine = valid & (pair % size == rank)
    new_width = max(1, int(mine.sum(1).max()))
    column = mine.long().cumsum(1) - 1
    r, n = mine.nonzero(as_tuple=True)
    anchors = torch.zeros(rows, new_width, dtype=batch.anchors.dtype, device=batch.anchors.device)
    present = torch.zeros(rows, new_width, dtype=torch.bool, device=valid.device)
    anchors[r, column[r, n]] = batch.anchors[r, n]
    present[r, column[r, n]] = True
    shown = None
    if batch.shown is not None:
        shown = batch.shown.new_zeros(rows, new_width, b)
        shown[r, column[r, n]] = batch.shown[r, n]
    sr = batch.score_index // (width * b)
    sn = (batch.score_index // b) % width
    sk = batch.score_index % b
    keep = mine[sr, sn]
    return replace(
        batch,
        anchors=anchors,
        anchor_valid=present,
        score_index=((sr * new_width + column[sr, sn]) * b + sk)[keep],
        targets=batch.targets[keep],
        weights=batch.weights[keep],
        teacher_index=batch.teacher_index[keep],
        shown=shown,
    )


class DraftPlan:
    """The target's features online or from a feature artifact; with bp > 1 each rank of the
    context group drafts its dual-end share of the anchors (`share_anchors`)."""

    attention_backend = None  # the drafter attends with SDPA over an explicit mask

    def __init__(
        self,
        config: DFlashConfig,
        target=None,
        store=None,
        *,
        rank: int = 0,
        size: int = 1,
        cp_rank: int = 0,
        cp_size: int = 1,
        cp_group=None,
    ) -> None:
        self.config = config
        self.target = target  # online: a TargetFeatures
        self.store = store  # offline: a FeatureStore
        self.rank, self.context_size = rank, size
        self.cp_rank, self.cp_size, self.cp_group = cp_rank, cp_size, cp_group

    def prepare(self, batch: DraftBatch, device: torch.device) -> ModelInputs:
        length = batch.context_ids.shape[1]
        shard = None
        if self.cp_size > 1:  # this rank's contiguous shard of the context
            if length % self.cp_size:
                raise DllmError(
                    f"seq_len {length} is not a multiple of cp = {self.cp_size}",
                    hint=f"set data.seq_len to a multiple of {self.cp_size} (topology.cp)",
                )
            size = length // self.cp_size
            shard = slice(self.cp_rank * size, (self.cp_rank + 1) * size)
        if self.store is not None:
            if batch.rows is None:
                raise DllmError(
                    "offline features need data.artifact (rows to look up)",
                    hint="set data.artifact to the artifact model.dflash.features was made "
                    "from, or unset model.dflash.features to run the target while training",
                )
            features, teacher = self.store.lookup(batch.rows.cpu(), device, span=shard)
        else:  # the frozen target runs over the whole sequence (its own forward is not sharded)
            features, teacher = self.target(batch.context_ids, batch.doc_ids)
            if shard is not None:
                features = features[:, shard]
        if self.context_size > 1:
            batch = share_anchors(batch, self.rank, self.context_size)
        tokens, draft_positions = draft_tokens(batch, self.config.mask_token_id)
        mask = draft_attention_mask(
            batch.anchors, batch.anchor_valid, batch.doc_ids, length, batch.block_size
        )
        positions = torch.arange(length, device=device)
        group = None
        if shard is not None:  # the layers gather the context K/V over the cp group
            positions, group = positions[shard], self.cp_group
        context = DraftContext(features, positions, mask, group)
        return ModelInputs(
            input_ids=tokens,
            positions=draft_positions,
            mask=context,
            batch=batch,
            output=partial(draft_score, batch, teacher),
        )
