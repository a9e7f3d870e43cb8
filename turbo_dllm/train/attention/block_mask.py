"""FlexAttention BlockMasks built eagerly, a band of query tiles at a time.

`torch.compile(create_block_mask)` never holds the Sq x Sk mask, but it compiles the predicate
it is given, and compiles again when a new mask_mod closes over other integers (block size, the
canvas start of a DiffusionGemma batch, a window) until dynamo makes them symbolic; each compile
takes minutes on an H200 (DiffusionGemma's first step sat in its mask compiles for over two
minutes). For a mask that is built once per layout and cached, evaluating the predicate eagerly
over bands of query tiles compiles nothing and bounds the memory to one band: a few elementwise
passes over Sq x Sk (0.5-0.8 s for an 8K stream on a 2-core CPU; not yet timed on a GPU).
The result is the BlockMask `create_block_mask` makes: the same partial and full tile lists, in
the same order, and the same mask_mod for the partial tiles.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["block_mask_from_predicate"]

TILE = 128  # FlexAttention's default BLOCK_SIZE
_BAND_ELEMENTS = 1 << 24  # predicate values per band (16 Mi: the int64 temporaries 128 MiB each)


def block_mask_from_predicate(
    mask_mod: Callable,
    q_len: int,
    kv_len: int,
    device: torch.device | str,
    *,
    batch: int | None = None,
):
    """The BlockMask of `mask_mod(b, h, q_idx, kv_idx)` (elementwise tensor ops that broadcast)
    over q_len x kv_len, for `batch` rows (None: one mask for every row) and every head."""
    from torch.nn.attention.flex_attention import BlockMask

    device = torch.device(device)
    rows = 1 if batch is None else batch
    q_tiles, kv_tiles = -(-q_len // TILE), -(-kv_len // TILE)
    kv = torch.arange(kv_tiles * TILE, device=device)
    kv_valid = kv < kv_len
    kv = kv.clamp(max=kv_len - 1)[None, None, :]  # padding tiles: evaluated in range, then off
    b = torch.arange(rows, device=device)[:, None, None]
    h = torch.zeros((), dtype=torch.long, device=device)
    band = max(1, _BAND_ELEMENTS // (rows * kv_tiles * TILE * TILE))  # query tiles per band
    partial, full = [], []
    for start in range(0, q_tiles, band):
        stop = min(start + band, q_tiles)
        q = torch.arange(start * TILE, stop * TILE, device=device)
        q_valid = q < q_len
        q = q.clamp(max=q_len - 1)[None, :, None]
        visible = mask_mod(b, h, q, kv).expand(rows, -1, -1)
        visible = visible & q_valid[None, :, None] & kv_valid[None, None, :]
        tiles = visible.reshape(rows, stop - start, TILE, kv_tiles, TILE)
        any_visible = tiles.any(dim=4).any(dim=2)
        all_visible = tiles.all(dim=4).all(dim=2)
        partial.append(any_visible & ~all_visible)
        full.append(all_visible)
    partial_tiles = torch.cat(partial, dim=1)[:, None]  # (rows, 1 head, q tiles, kv tiles)
    full_tiles = torch.cat(full, dim=1)[:, None]
    return BlockMask.from_kv_blocks(
        *_ordered(partial_tiles),
        *_ordered(full_tiles),
        BLOCK_SIZE=TILE,
        mask_mod=mask_mod,
        seq_lengths=(q_len, kv_len),
    )


def _ordered(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(count, indices) per query tile: the kv tiles that are set, in ascending order first."""
    count = tiles.sum(dim=-1, dtype=torch.int32)
    indices = torch.argsort((~tiles).to(torch.int32), dim=-1, stable=True).to(torch.int32)
    return count, indices
