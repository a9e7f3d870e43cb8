"""Block-diffusion attention: the mask predicate (`layout`) and the kernels (`backends`)."""

from turbo_dllm.train.attention.backends import (
    FlexAttention,
    ReferenceAttention,
    TurboAttention,
    build_attention,
)
from turbo_dllm.train.attention.canvas import CanvasLayout
from turbo_dllm.train.attention.layout import (
    BlockDiffusionLayout,
    allowed,
    allowed_pairs,
    dense_mask,
    local_allowed,
    prefix_allowed,
)

__all__ = [
    "BlockDiffusionLayout",
    "CanvasLayout",
    "FlexAttention",
    "ReferenceAttention",
    "TurboAttention",
    "allowed",
    "allowed_pairs",
    "build_attention",
    "dense_mask",
    "local_allowed",
    "prefix_allowed",
]
