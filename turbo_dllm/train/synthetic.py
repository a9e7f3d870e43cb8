"""Synthetic token sequences with the loader protocol, for smoke runs and benchmarks.

Pure noise cannot be learned, so a loss curve on it says nothing. Each sequence here is a chain
of "motifs" (short fixed token strings drawn from a seeded pool), so a model can learn them and
the loss visibly falls, while generation stays vectorised for 64K-token sequences. Token ids
avoid the run's mask token (`avoid`: by default the last id of the vocabulary, the default mask
token for synthetic data, which checkpoints record as their `mask_token_id` so that an export
names it), so a masked position never looks like a real token.

Batches follow the data-parallel contract: at each call, rank r of P gets the r-th slice of
`micro_batch_size` sequences of the next P * micro_batch_size in the epoch's shuffled order.
The state (epoch, cursor) counts global samples, so it resumes at any data-parallel size.
"""

from __future__ import annotations

from typing import Any

import torch

from turbo_dllm.errors import DllmError

__all__ = ["SyntheticLoader"]

_MOTIFS = 64
_MOTIF_LEN = 8


class SyntheticLoader:
    def __init__(
        self,
        *,
        num_sequences: int,
        vocab_size: int,
        seq_len: int,
        micro_batch_size: int,
        dp_rank: int = 0,
        dp_size: int = 1,
        seed: int = 0,
        avoid: int | None = None,
    ) -> None:
        if vocab_size < 3:
            raise DllmError(
                f"synthetic vocab_size must be at least 3 (got {vocab_size})",
                hint="set data.synthetic.vocab_size to 3 or more (its last id is the mask token)",
            )
        avoid = vocab_size - 1 if avoid is None else avoid
        per_call = micro_batch_size * dp_size
        if per_call > num_sequences:
            raise DllmError(
                f"data.synthetic.num_sequences ({num_sequences}) is smaller than one global "
                f"micro-batch ({micro_batch_size} x {dp_size} ranks)",
                hint="raise data.synthetic.num_sequences",
            )
        self.num_sequences = num_sequences
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.micro_batch_size = micro_batch_size
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.seed = seed
        self.epoch = 0
        self.cursor = 0
        pool_gen = torch.Generator().manual_seed(seed * 1_000_003 + 17)
        # Zipf-like token frequencies (like text), so even unigram statistics are learnable.
        zipf = 1.0 / torch.arange(1, vocab_size + 1, dtype=torch.float64)
        if 0 <= avoid < vocab_size:
            zipf[avoid] = 0.0  # (a trailing zero leaves the default's draws as they were)
        draws = torch.multinomial(zipf, _MOTIFS * _MOTIF_LEN, replacement=True, generator=pool_gen)
        self._motifs = draws.view(_MOTIFS, _MOTIF_LEN)
        self._order: tuple[int, torch.Tensor] | None = None

    # --- the sample stream -------------------------------------------------------------------
    def sequence(self, index: int) -> torch.Tensor:
        """Sequence `index` of the dataset (independent of epoch, rank and batch size)."""
        gen = torch.Generator().manual_seed(self.seed * 7_919 + index * 104_729 + 1)
        count = -(-self.seq_len // _MOTIF_LEN)
        choice = torch.randint(0, _MOTIFS, (count,), generator=gen)
        return self._motifs[choice].reshape(-1)[: self.seq_len]

    def _permutation(self) -> torch.Tensor:
        if self._order is None or self._order[0] != self.epoch:
            gen = torch.Generator().manual_seed(self.seed * 31 + self.epoch * 1_000_033 + 5)
            self._order = (self.epoch, torch.randperm(self.num_sequences, generator=gen))
        return self._order[1]

    def __iter__(self) -> SyntheticLoader:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        per_call = self.micro_batch_size * self.dp_size
        if self.cursor + per_call > self.num_sequences:
            self.epoch, self.cursor = self.epoch + 1, 0
        start = self.cursor + self.dp_rank * self.micro_batch_size
        indices = self._permutation()[start : start + self.micro_batch_size]
        self.cursor += per_call
        ids = torch.stack([self.sequence(int(i)) for i in indices])
        return {
            "input_ids": ids,
            "loss_mask": torch.ones_like(ids, dtype=torch.bool),
            "doc_ids": torch.zeros_like(ids, dtype=torch.int32),
        }

    # --- resumable state -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
