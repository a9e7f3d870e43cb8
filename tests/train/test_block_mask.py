"""The eager BlockMask builder against torch's own `create_block_mask` (the oracle)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from turbo_dllm.train.attention import backends
from turbo_dllm.train.attention import block_mask as block_mask_module
from turbo_dllm.train.attention.backends import FlexAttention
from turbo_dllm.train.attention.block_mask import block_mask_from_predicate
from turbo_dllm.train.attention.canvas import CanvasLayout
from turbo_dllm.train.attention.layout import BlockDiffusionLayout, allowed


def assert_same_block_mask(ours, theirs) -> None:
    """Equal tile counts and, within each count, equal tile lists (the padding after them is
    unused, so it is not compared)."""
    assert ours.seq_lengths == theirs.seq_lengths
    assert ours.BLOCK_SIZE == theirs.BLOCK_SIZE
    for count, indices in [
        ("kv_num_blocks", "kv_indices"),
        ("full_kv_num_blocks", "full_kv_indices"),
        ("q_num_blocks", "q_indices"),
        ("full_q_num_blocks", "full_q_indices"),
    ]:
        n = getattr(ours, count)
        assert torch.equal(n, getattr(theirs, count)), count
        a, b = getattr(ours, indices), getattr(theirs, indices)
        assert a.shape == b.shape, indices
        used = torch.arange(a.shape[-1]) < n[..., None]
        assert torch.equal(torch.where(used, a, -1), torch.where(used, b, -1)), indices


# lengths that are and are not multiples of the 128-token tile
@pytest.mark.parametrize("L, B", [(256, 16), (200, 8), (448, 64)])
def test_block_diffusion_masks_equal_create_block_mask(L, B):
    layout = BlockDiffusionLayout(L, B)
    S = layout.stream_len

    def mask_mod(b, h, q, kv):
        return allowed(layout, q, kv)

    ours = block_mask_from_predicate(mask_mod, S, S, "cpu")
    assert_same_block_mask(ours, create_block_mask(mask_mod, None, None, S, S, device="cpu"))
    assert int(ours.kv_num_blocks.sum()) > 0  # partial tiles: the mask_mod's
    if L == 448:  # full tiles too (at 64-token blocks whole 128 x 128 tiles are visible)
        assert int(ours.full_kv_num_blocks.sum()) > 0


def test_per_row_document_masks_equal_create_block_mask():
    layout = BlockDiffusionLayout(200, 8)
    S = layout.stream_len
    torch.manual_seed(0)
    docs = torch.randint(0, 3, (3, 200)).sort(dim=1).values
    stream = torch.cat([docs, docs], 1)

    def mask_mod(b, h, q, kv):
        return allowed(layout, q, kv) & (stream[b, q] == stream[b, kv])

    ours = block_mask_from_predicate(mask_mod, S, S, "cpu", batch=3)
    assert_same_block_mask(ours, create_block_mask(mask_mod, 3, None, S, S, device="cpu"))


@pytest.mark.parametrize("start, window", [(40, None), (40, 50), (0, 100)])
def test_canvas_masks_equal_create_block_mask_across_bands(start, window, monkeypatch):
    """DiffusionGemma's canvas pattern, with bands of one query tile (several bands per mask)."""
    monkeypatch.setattr(block_mask_module, "_BAND_ELEMENTS", 1)
    layout = CanvasLayout(300, 16, start).with_window(window)
    S = layout.stream_len

    def mask_mod(b, h, q, kv):
        return layout.allowed(q, kv)

    ours = block_mask_from_predicate(mask_mod, S, S, "cpu")
    assert_same_block_mask(ours, create_block_mask(mask_mod, None, None, S, S, device="cpu"))


def test_rectangular_masks_equal_create_block_mask():
    """Queries and keys of different lengths (context parallelism's local queries against the
    gathered keys)."""
    layout = CanvasLayout(300, 16, 20)
    local = torch.arange(130, 300)
    gathered = torch.arange(layout.stream_len)

    def mask_mod(b, h, q, kv):
        return layout.allowed(local[q], gathered[kv])

    ours = block_mask_from_predicate(mask_mod, local.numel(), gathered.numel(), "cpu")
    theirs = create_block_mask(mask_mod, None, None, local.numel(), gathered.numel(), device="cpu")
    assert_same_block_mask(ours, theirs)


def test_a_wrong_tile_class_is_caught_by_the_comparison():
    layout = BlockDiffusionLayout(256, 16)
    S = layout.stream_len

    def mask_mod(b, h, q, kv):
        return allowed(layout, q, kv)

    ours = block_mask_from_predicate(mask_mod, S, S, "cpu")
    theirs = create_block_mask(mask_mod, None, None, S, S, device="cpu")
    ours.full_kv_num_blocks[0, 0, -1] -= 1  # one full tile dropped from the last query tile
    with pytest.raises(AssertionError):
        assert_same_block_mask(ours, theirs)


def test_flex_builds_one_document_masks_without_compiling(monkeypatch):
    """The cached masks (one document per row, every canvas) compile nothing: a compiled builder
    would recompile for each layout's integers."""

    def no_compile(*args, **kwargs):
        raise AssertionError("torch.compile called while building a one-document BlockMask")

    monkeypatch.setattr(torch, "compile", no_compile)
    # on CPU the compiled builder is the eager create_block_mask: refuse it too, as on a GPU
    monkeypatch.setattr(backends, "create_block_mask_for", no_compile)
    layout = CanvasLayout(300, 16, 40)
    mask = FlexAttention(compile=True).prepare(layout, None, torch.device("cpu"))
    S = layout.stream_len
    expected = create_block_mask(
        lambda b, h, q, kv: layout.allowed(q, kv), None, None, S, S, device="cpu"
    )
    assert_same_block_mask(mask, expected)
