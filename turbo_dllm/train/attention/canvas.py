"""The block-diffusion pattern of an encoder-decoder family: a noisy canvas over a causal stream.

DiffusionGemma's clean stream is its encoder: token-causal (not block-causal), optionally within
a sliding window. The noisy canvas is the response, in blocks of B starting at an absolute
position `canvas_start` (the response start, not necessarily a multiple of B); canvas block c
covers positions canvas_start + cB .. canvas_start + (c+1)B - 1. The stream is [canvas (C) ;
clean (L)], canvas positions canvas_start.., clean positions 0..L-1. Who sees whom:

    canvas q (block c) -> canvas kv   iff same block                         (bidirectional)
    canvas q (block c) -> clean kv j  iff j < canvas_start + cB  [and j >= canvas_start + cB - (W-1)]
    clean q i          -> clean kv j  iff j <= i                 [and j > i - W]
    clean q            -> canvas kv   never

with W the layer's sliding window (bracketed terms on sliding layers only): exactly what
transformers' DiffusionGemma does at generation (the encoder's sliding cache keeps W-1 keys).
A BD3-style whole-sequence stream is the case canvas_start = 0, C = L.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

__all__ = ["CanvasLayout"]


@dataclass(frozen=True)
class CanvasLayout:
    seq_len: int  # L: clean tokens
    block_size: int  # B
    canvas_start: int = 0  # absolute position of the canvas's first token
    canvas_blocks: int | None = None  # default: the blocks from canvas_start to L (rounded up)
    window: int | None = None  # this mask's sliding window W (None: full attention)

    def __post_init__(self) -> None:
        if self.seq_len <= 0 or self.block_size <= 0:
            raise ValueError("seq_len and block_size must be positive")
        if not 0 <= self.canvas_start < self.seq_len:
            raise ValueError(f"canvas_start {self.canvas_start} is outside 0..{self.seq_len - 1}")
        if self.canvas_blocks is None:
            blocks = -(-(self.seq_len - self.canvas_start) // self.block_size)
            object.__setattr__(self, "canvas_blocks", blocks)

    @classmethod
    def whole(cls, seq_len: int, block_size: int) -> CanvasLayout:
        """Every block of the sequence noisy (the standard block-diffusion stream)."""
        return cls(seq_len, block_size, 0, seq_len // block_size)

    def with_window(self, window: int | None) -> CanvasLayout:
        return replace(self, window=window)

    @property
    def canvas_len(self) -> int:
        return self.canvas_blocks * self.block_size

    @property
    def stream_len(self) -> int:
        return self.canvas_len + self.seq_len

    @property
    def num_blocks(self) -> int:
        return self.canvas_blocks

    def positions(self, device: torch.device | str | None = None) -> torch.Tensor:
        canvas = torch.arange(self.canvas_len, device=device) + self.canvas_start
        return torch.cat([canvas, torch.arange(self.seq_len, device=device)])

    # --- the predicate (broadcastable integer tensors) ------------------------------------
    def is_noisy(self, idx: torch.Tensor) -> torch.Tensor:
        return idx < self.canvas_len

    def token(self, idx: torch.Tensor) -> torch.Tensor:
        """Absolute position of stream index `idx`."""
        return torch.where(idx < self.canvas_len, idx + self.canvas_start, idx - self.canvas_len)

    def allowed(self, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        C, B, W = self.canvas_len, self.block_size, self.window
        q_noisy, kv_noisy = q_idx < C, kv_idx < C
        j = kv_idx - C  # the clean key's position (meaningful where not kv_noisy)
        # canvas q: same canvas block, or a clean key before the block's first position
        block_start = self.canvas_start + (q_idx // B) * B
        canvas_kv = kv_noisy & ((q_idx // B) == (kv_idx // B))
        prefix = ~kv_noisy & (j < block_start)
        # clean q: token-causal
        i = q_idx - C
        causal = ~kv_noisy & (j <= i)
        if W is not None:
            prefix = prefix & (j >= block_start - (W - 1))
            causal = causal & (j > i - W)
        return torch.where(q_noisy, canvas_kv | prefix, causal)

    def dense_mask(self, device: torch.device | str | None = None) -> torch.Tensor:
        """Boolean (1, 1, S, S), True = may attend."""
        idx = torch.arange(self.stream_len, device=device)
        return self.allowed(idx[:, None], idx[None, :])[None, None]

    def pairs(self) -> int:
        """Allowed (query, key) pairs of one row (closed form, O(L))."""
        B, W = self.block_size, self.window
        c = torch.arange(self.canvas_blocks)
        block_start = self.canvas_start + c * B
        prefix = torch.minimum(block_start, torch.tensor(self.seq_len))
        if W is not None:
            prefix = torch.minimum(prefix, torch.tensor(W - 1))
        canvas = int((prefix + B).sum()) * B
        i = torch.arange(self.seq_len)
        clean = i + 1 if W is None else torch.minimum(i + 1, torch.tensor(W))
        return canvas + int(clean.sum())
