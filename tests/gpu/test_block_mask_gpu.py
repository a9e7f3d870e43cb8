"""The eager BlockMask builder on CUDA equals torch's compiled create_block_mask at training
lengths (bands of several query tiles, a 16K stream)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from tests.train.test_block_mask import assert_same_block_mask
from turbo_dllm.train.attention.block_mask import block_mask_from_predicate
from turbo_dllm.train.attention.canvas import CanvasLayout
from turbo_dllm.train.attention.layout import BlockDiffusionLayout, allowed

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda", 0)


def _on_cpu(mask):
    return mask.to("cpu")


@pytest.mark.parametrize("kind", ["bd3", "canvas"])
def test_eager_block_mask_equals_compiled_create_block_mask_on_cuda(kind):
    if kind == "bd3":
        layout = BlockDiffusionLayout(8192, 32)

        def mask_mod(b, h, q, kv):
            return allowed(layout, q, kv)
    else:
        layout = CanvasLayout(8192, 256, 1000).with_window(1024)

        def mask_mod(b, h, q, kv):
            return layout.allowed(q, kv)

    S = layout.stream_len
    ours = block_mask_from_predicate(mask_mod, S, S, CUDA)
    theirs = torch.compile(create_block_mask)(mask_mod, None, None, S, S, device=CUDA)
    assert_same_block_mask(_on_cpu(ours), _on_cpu(theirs))
