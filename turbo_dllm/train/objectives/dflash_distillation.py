"""DFlash distillation: train a drafter to draft blocks at sampled anchors of real text.

For each sequence, anchors are drawn among the valid positions i (supervised, with a supervised
next token of the same document): `uniform` (a random subset) or `locality` (a random cyclic
start, stride block_size made coprime with the candidate count), at most `max_anchors`, sorted.
Each anchor a gives one draft block of B slots [a's token, mask x (B-1)] at positions a + k.

Slot contract (`sample_from_anchor`):
- false (z-lab): slot k drafts the token at a + k; slot 0 (the anchor itself) is not scored;
- true: slot k drafts the token at a + 1 + k.
The teacher's distribution for a drafted position t is the target's prediction from t - 1.
A slot is supervised when t is in the sequence, supervised and in the anchor's document. Slot
weights decay with distance from the anchor: exp(-(k-1)/gamma) (exp(-k/gamma) with
sample_from_anchor), 1 without `decay_gamma`. With `greedy_path` (any loss but paper_ce) a slot
also weighs 0 unless the true tokens between its anchor and it are the target's greedy choices
(the only prefixes speculative decoding asks a slot about; families/dflash/plan.py:
greedy_path), and DFlash2's hard labels become the target's greedy tokens; the normalising
count stays that of the supervised slots, so it stays known before the target runs.

Losses: `paper_ce`, cross-entropy against the true token; `speculators_kl`, forward KL from the
target's distribution (its own final norm and head on its last hidden state) to the drafter's,
walked in row chunks without materialising [N, V] logits; `greedy_ce`, cross-entropy against the
target's greedy token there (the argmax of that distribution: what greedy verification
accepts). DFlash2 drafters train with the hard-label kinds `dflash` / `dpace*` plus the
candidate selector's loss, whose weight (`selector_weight`) is 0 for `selector_warmup_steps`
steps and then ramps linearly to `selector_loss_alpha` over `selector_ramp_steps`
(families/dflash/hard_labels.py). The sum over supervised slots is divided by the GLOBAL count
of supervised slots, like every objective here.

Shown slots (`reveal_blocks` > 0): that fraction of the blocks, drawn per block, show some of
their slots' true tokens in place of the mask: each block draws a rate u ~ U(0, 1) and shows
each slot (but the anchor) with probability u, always keeping one hidden. Shown slots are not
scored. A drafter trained so refines its own draft in several forwards (`dllm dflash eval
--draft-steps`: each forward shows its most confident guesses to the next).

Anchors and shown slots are keyed noise (seed, step, global sample index), so
`supervised_count(batch, key)` draws exactly the anchors and slots `corrupt` will, and a resumed
run redraws them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from turbo_dllm.families.dflash.config import HARD_LABEL_LOSSES, TEACHER_LOSSES, needs_teacher
from turbo_dllm.train.objectives.base import NoiseKey, sample_generator, to_device

__all__ = [
    "HARD_LABEL_LOSSES",
    "TEACHER_LOSSES",
    "DFlashDistillation",
    "DraftBatch",
    "build",
    "draw_anchors",
    "selector_weight",
    "valid_anchors",
]


def selector_weight(step: int, alpha: float, warmup_steps: int, ramp_steps: int) -> float:
    """The selector loss's weight at (0-based) optimizer step `step`: 0 during the warmup, then
    alpha * (steps into the ramp + 1) / ramp_steps, capped at alpha."""
    if step < warmup_steps:
        return 0.0
    if ramp_steps <= 0:
        return alpha
    return alpha * min(1.0, (step - warmup_steps + 1) / ramp_steps)


def valid_anchors(loss_mask: torch.Tensor, doc_ids: torch.Tensor | None) -> torch.Tensor:
    """(R, L) bool: positions whose token and next token are supervised, in one document."""
    supervised = loss_mask.to("cpu", torch.bool)
    valid = torch.zeros_like(supervised)
    valid[:, :-1] = supervised[:, :-1] & supervised[:, 1:]
    if doc_ids is not None:
        docs = doc_ids.to("cpu")
        valid[:, :-1] &= (docs[:, :-1] == docs[:, 1:]) & (docs[:, :-1] >= 0)
    return valid


def draw_anchors(
    candidates: torch.Tensor, limit: int, how: str, stride: int, generator: torch.Generator
) -> torch.Tensor:
    """At most `limit` of the sorted `candidates` (1-D positions), sorted."""
    n = int(candidates.numel())
    if n <= limit:
        return candidates
    if how == "uniform":
        picked = torch.randperm(n, generator=generator)[:limit]
    else:  # locality: a cyclic walk from a random start; a coprime stride keeps picks unique
        step = max(1, stride)
        while math.gcd(step, n) != 1:
            step += 1
        start = int(torch.randint(n, (), generator=generator))
        picked = (start + step * torch.arange(limit)) % n
    return candidates[picked.sort().values]


@dataclass
class DraftBatch:
    """One micro-batch of draft blocks.

    context_ids (R, L) the sequences (the target's input); doc_ids (R, L) or None;
    anchors (R, N) positions, padded with 0 where `anchor_valid` (R, N) is False;
    score_index (n,) flat indices into the draft tokens viewed as (R * N * B); targets (n,);
    weights (n,) float32; teacher_index (n,) flat indices into the context viewed as (R * L):
    the position whose target output predicts the drafted token.
    """

    context_ids: torch.Tensor
    doc_ids: torch.Tensor | None
    anchors: torch.Tensor
    anchor_valid: torch.Tensor
    score_index: torch.Tensor
    targets: torch.Tensor
    weights: torch.Tensor
    teacher_index: torch.Tensor
    block_size: int
    loss: str
    rows: torch.Tensor | None = None  # the data artifact's rows (offline features' index)
    dpace_alpha: float = 0.5  # D-PACE: a slot's acceptance (1 - alpha) p + alpha
    selector_weight: float = 0.0  # DFlash2: the selector loss's weight at this step
    greedy_path: bool = False  # score a slot only on the target's greedy path (plan.greedy_path)
    shown: torch.Tensor | None = None  # (R, N, B) bool: slots showing their true token

    def to(self, device: torch.device | str) -> DraftBatch:
        def move(t):
            return None if t is None else to_device(t, device)

        return replace(
            self,
            **{
                name: move(getattr(self, name))
                for name in (
                    "context_ids",
                    "doc_ids",
                    "anchors",
                    "anchor_valid",
                    "score_index",
                    "targets",
                    "weights",
                    "teacher_index",
                    "shown",
                )
            },
        )

    @property
    def num_scored(self) -> int:
        return int(self.targets.numel())

    @property
    def stream_tokens(self) -> int:
        return int(self.anchors.numel()) * self.block_size

    def attention_pairs(self) -> int:
        """(query, key) pairs: each valid block's B x B local pairs plus B x (its context)."""
        starts = torch.zeros_like(self.anchors)
        if self.doc_ids is not None:
            docs = self.doc_ids.to("cpu")
            idx = torch.arange(docs.shape[1]).expand_as(docs)
            new = torch.ones_like(docs, dtype=torch.bool)
            new[:, 1:] = docs[:, 1:] != docs[:, :-1]
            first = torch.where(new, idx, 0).cummax(dim=1).values
            starts = first.gather(1, self.anchors.to("cpu"))
        context = (self.anchors.to("cpu") - starts) * self.anchor_valid.to("cpu")
        b = self.block_size
        return int(self.anchors.numel() * b * b + b * int(context.sum()))


class DFlashDistillation:
    name = "dflash_distillation"

    def __init__(
        self,
        *,
        block_size: int,
        max_anchors: int,
        anchor_sampling: str = "uniform",
        decay_gamma: float | None = None,
        sample_from_anchor: bool = False,
        loss: str = "speculators_kl",
        dpace_alpha: float = 0.5,
        selector_loss_alpha: float = 1.0,
        selector_warmup_steps: int = 0,
        selector_ramp_steps: int = 0,
        greedy_path: bool = False,
        reveal_blocks: float = 0.0,
    ) -> None:
        if max_anchors < 1:
            raise ValueError(f"max_anchors must be at least 1 (got {max_anchors})")
        if anchor_sampling not in ("uniform", "locality"):
            raise ValueError(f"unknown anchor sampling {anchor_sampling!r}")
        if loss not in ("paper_ce", *TEACHER_LOSSES, *HARD_LABEL_LOSSES):
            raise ValueError(f"unknown dflash loss {loss!r}")
        self.dpace_alpha = dpace_alpha
        self.selector_schedule = (selector_loss_alpha, selector_warmup_steps, selector_ramp_steps)
        self.block_size = block_size
        self.max_anchors = max_anchors
        self.anchor_sampling = anchor_sampling
        self.decay_gamma = decay_gamma
        self.sample_from_anchor = sample_from_anchor
        self.loss = loss
        if greedy_path and loss == "paper_ce":
            raise ValueError(
                "greedy_path needs the target's outputs: paper_ce's labels are the true tokens "
                f"(greedy_path trains {', '.join((*TEACHER_LOSSES, *HARD_LABEL_LOSSES))})"
            )
        if not 0.0 <= reveal_blocks < 1.0:
            raise ValueError(f"reveal_blocks must be in [0, 1) (got {reveal_blocks})")
        if reveal_blocks and sample_from_anchor:
            raise ValueError(
                "reveal_blocks needs sample_from_anchor false (slot k holds token a + k)"
            )
        self.reveal_blocks = reveal_blocks
        self.greedy_path = greedy_path
        self.needs_teacher = needs_teacher(loss, greedy_path)

    def slot_weights(self) -> torch.Tensor:
        """(B,) float64: each slot's weight (0 for the unscored anchor slot)."""
        k = torch.arange(self.block_size, dtype=torch.float64)
        if self.sample_from_anchor:
            distance = k
        else:
            distance = k - 1
        weights = (
            torch.exp(-distance / self.decay_gamma)
            if self.decay_gamma is not None
            else torch.ones_like(k)
        )
        if not self.sample_from_anchor:
            weights[0] = 0.0
        return weights

    def _anchors(self, batch, key: NoiseKey) -> tuple[torch.Tensor, torch.Tensor]:
        valid = valid_anchors(batch["loss_mask"], batch.get("doc_ids"))
        picked = [
            draw_anchors(
                valid[r].nonzero().flatten(),
                self.max_anchors,
                self.anchor_sampling,
                self.block_size,
                sample_generator(key, key.first_sample + r),
            )
            for r in range(valid.shape[0])
        ]
        width = max(1, max(len(p) for p in picked))
        anchors = torch.zeros(len(picked), width, dtype=torch.long)
        present = torch.zeros(len(picked), width, dtype=torch.bool)
        for r, p in enumerate(picked):
            anchors[r, : len(p)] = p
            present[r, : len(p)] = True
        return anchors, present

    def _slots(
        self, batch, anchors, present, key
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(R, N, B) drafted positions, whether each slot is supervised, and whether it is shown
        (its true token in place of the mask; a shown slot is not supervised)."""
        supervised = batch["loss_mask"].to("cpu", torch.bool)
        rows, length = supervised.shape
        k = torch.arange(self.block_size)
        offset = k + 1 if self.sample_from_anchor else k
        target = anchors[:, :, None] + offset  # (R, N, B)
        inside = target < length
        clamped = target.clamp(max=length - 1)
        row = torch.arange(rows)[:, None, None]
        real = present[:, :, None] & inside  # a token of the anchor's document
        doc_ids = batch.get("doc_ids")
        if doc_ids is not None:
            docs = doc_ids.to("cpu")
            real &= docs[row, clamped] == docs[row, anchors[:, :, None]]
        ok = real & supervised[row, clamped]
        if not self.sample_from_anchor:
            ok[:, :, 0] = False
        shown = self._shown(anchors.shape, key) & real
        return clamped, ok & ~shown, shown

    def _shown(self, shape, key) -> torch.Tensor:
        """(R, N, B) bool: the slots shown (module docstring); none without reveal_blocks."""
        rows, width = shape
        shown = torch.zeros(rows, width, self.block_size, dtype=torch.bool)
        if not self.reveal_blocks:
            return shown
        for r in range(rows):
            generator = sample_generator(key, key.first_sample + r, purpose="dflash-shown")
            # max_anchors rows, whatever the batch's width: a row draws what it draws alone
            draws = torch.rand(self.max_anchors, self.block_size + 1, generator=generator)[:width]
            picked, rate, slot = draws[:, 0] < self.reveal_blocks, draws[:, 1:2], draws[:, 2:]
            keep_hidden = slot == slot.max(dim=1, keepdim=True).values  # one slot stays hidden
            shown[r, :, 1:] = picked[:, None] & (slot < rate) & ~keep_hidden
        return shown

    def supervised_count(self, batch, key: NoiseKey | None = None) -> int:
        anchors, present = self._anchors(batch, key)
        return int(self._slots(batch, anchors, present, key)[1].sum())

    def corrupt(self, batch, key: NoiseKey) -> DraftBatch:
        ids = batch["input_ids"].to("cpu", torch.long)
        rows, length = ids.shape
        anchors, present = self._anchors(batch, key)
        target, ok, shown = self._slots(batch, anchors, present, key)
        r, n, k = ok.nonzero(as_tuple=True)
        b = self.block_size
        width = anchors.shape[1]
        position = target[r, n, k]
        weights = self.slot_weights()[k].to(torch.float32)
        doc_ids = batch.get("doc_ids")
        return DraftBatch(
            context_ids=ids,
            doc_ids=None if doc_ids is None else doc_ids.to("cpu"),
            anchors=anchors,
            anchor_valid=present,
            score_index=(r * width + n) * b + k,
            targets=ids[r, position],
            weights=weights,
            teacher_index=r * length + position - 1,
            block_size=b,
            loss=self.loss,
            rows=batch.get("rows"),
            dpace_alpha=self.dpace_alpha,
            selector_weight=(
                selector_weight(key.step, *self.selector_schedule)
                if self.loss in HARD_LABEL_LOSSES
                else 0.0
            ),
            greedy_path=self.greedy_path,
            shown=shown if self.reveal_blocks else None,
        )


def build(spec, mask_token_id: int, vocab_size: int | None = None) -> DFlashDistillation:
    """The objective of a RunSpec's `objective` section (the registry's entry point)."""
    return DFlashDistillation(
        block_size=spec.block_size,
        max_anchors=spec.max_anchors,
        anchor_sampling=spec.anchor_sampling,
        decay_gamma=spec.decay_gamma,
        sample_from_anchor=spec.sample_from_anchor,
        loss=spec.dflash_loss,
        dpace_alpha=spec.dpace_alpha,
        selector_loss_alpha=spec.selector_loss_alpha,
        selector_warmup_steps=spec.selector_warmup_steps,
        selector_ramp_steps=spec.selector_ramp_steps,
        greedy_path=spec.greedy_path,
        reveal_blocks=spec.reveal_blocks,
    )
