"""Stream training batches from an artifact: sharded, shuffled, resumable, nothing lost or repeated.

The loader sees one infinite global stream of samples: epoch e is a permutation of all sequences
drawn from a generator seeded with (seed, e), and the epochs follow each other. Step s consumes
global positions [s*G, (s+1)*G) with G = micro_batch_size * dp_size; data-parallel rank r takes
the r-th slice of micro_batch_size. So every sequence appears exactly once per epoch across the
ranks, epochs wrap with a fresh shuffle, and the whole state is one number (how many global
samples were consumed) that is the same on every rank. Resuming restores it exactly, even with a
different dp_size or micro batch size (the stream continues where it stopped).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from turbo_dllm.data.artifact import DataArtifact
from turbo_dllm.errors import DllmError

__all__ = ["STATE_FORMAT", "ArtifactLoader", "artifact_batch"]

STATE_FORMAT = "turbo_dllm.loader.v1"


class ArtifactLoader:
    """Iterate dict batches {"input_ids", "loss_mask", "doc_ids"} of shape [micro_batch, seq_len],
    with "rows", the artifact rows they are (what a DFlash feature artifact is indexed by)."""

    def __init__(
        self,
        path: str | Path,
        *,
        seq_len: int,
        micro_batch_size: int,
        dp_rank: int,
        dp_size: int,
        seed: int,
    ) -> None:
        if dp_size < 1 or not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank {dp_rank} is not in [0, dp_size={dp_size})")
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        self.artifact = DataArtifact(path)
        manifest = self.artifact.manifest
        if seq_len != manifest.seq_len:
            raise DllmError(
                f"data.seq_len is {seq_len} but the artifact {str(path)!r} holds sequences of "
                f"{manifest.seq_len} tokens",
                hint="set data.seq_len to match, or prepare the data again with "
                f"packing.seq_len: {seq_len}",
            )
        if manifest.num_sequences == 0:
            raise DllmError(
                f"the artifact {str(path)!r} holds no sequences",
                hint="`dllm data validate` checks it; prepare it again (output.overwrite: true) "
                "from a source that holds documents",
            )
        self.seq_len = seq_len
        self.micro_batch_size = micro_batch_size
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.seed = seed
        self.num_sequences = manifest.num_sequences
        self.fingerprint = manifest.fingerprint
        self.consumed = 0  # global samples consumed by all ranks together
        self._orders: dict[int, np.ndarray] = {}

    # -- order -----------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self.consumed // self.num_sequences

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            if len(self._orders) >= 2:
                self._orders.pop(min(self._orders))
            rng = np.random.default_rng([self.seed, epoch])
            self._orders[epoch] = rng.permutation(self.num_sequences)
        return self._orders[epoch]

    def indices(self, step_start: int) -> list[int]:
        """Artifact rows this rank reads for the step whose global stream starts at `step_start`."""
        first = step_start + self.dp_rank * self.micro_batch_size
        rows = []
        for position in range(first, first + self.micro_batch_size):
            epoch, offset = divmod(position, self.num_sequences)
            rows.append(int(self._order(epoch)[offset]))
        return rows

    # -- iteration -------------------------------------------------------------------------------

    def __iter__(self) -> ArtifactLoader:
        return self

    def __next__(self) -> dict[str, Any]:
        rows = self.indices(self.consumed)
        self.consumed += self.micro_batch_size * self.dp_size
        return artifact_batch(self.artifact, rows)

    # -- state -----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON-able values; identical on every rank."""
        epoch, cursor = divmod(self.consumed, self.num_sequences)
        return {
            "format": STATE_FORMAT,
            "fingerprint": self.fingerprint,
            "seed": self.seed,
            "num_sequences": self.num_sequences,
            "epoch": epoch,
            "cursor": cursor,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") != STATE_FORMAT:
            raise DllmError(f"not a data loader state (format: {state.get('format')!r})")
        if state.get("fingerprint") != self.fingerprint:
            raise DllmError(
                "the checkpoint was trained on different data (artifact fingerprint "
                f"{str(state.get('fingerprint'))[:16]}, this artifact {self.fingerprint[:16]})",
                hint="point data.artifact at the artifact the run started with",
            )
        if state.get("seed") != self.seed:
            raise DllmError(
                f"the checkpoint's data order used seed {state.get('seed')}, this run {self.seed}",
                hint="resume with the same launch.seed",
            )
        epoch, cursor = int(state["epoch"]), int(state["cursor"])
        if not 0 <= cursor < self.num_sequences or epoch < 0:
            raise DllmError(f"invalid loader state: epoch {epoch}, cursor {cursor}")
        self.consumed = epoch * self.num_sequences + cursor


def artifact_batch(artifact: DataArtifact, rows: list[int]) -> dict[str, Any]:
    """The batch of these artifact rows, as the trainer takes it: {"input_ids", "loss_mask",
    "doc_ids"} of shape [len(rows), seq_len], and "rows" (what a DFlash feature artifact is
    indexed by)."""
    import torch

    tokens, masks, docs = zip(*(artifact.row(r) for r in rows), strict=True)
    return {
        "input_ids": torch.from_numpy(np.stack(tokens)),
        "loss_mask": torch.from_numpy(np.stack(masks)),
        "doc_ids": torch.from_numpy(np.stack(docs)),
        "rows": torch.tensor(rows, dtype=torch.long),
    }
