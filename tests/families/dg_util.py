"""Tiny random DiffusionGemma models in transformers and in turbo-dllm, on the same weights."""

from __future__ import annotations

import copy

import torch

from turbo_dllm.families.diffusion_gemma.attention import StreamAttention
from turbo_dllm.families.diffusion_gemma.config import PRESETS, DiffusionGemmaConfig
from turbo_dllm.families.diffusion_gemma.runtime import build_model
from turbo_dllm.train.attention import ReferenceAttention
from turbo_dllm.train.weights import materialize


def tiny_hf_dict(**text) -> dict:
    """The `tiny` preset (2 sliding layers, window 5, 1 full; 4 experts, top-2), smaller."""
    hf = copy.deepcopy(PRESETS["tiny"])
    small = dict(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=48,
        head_dim=8,
        global_head_dim=16,
        sliding_window=5,
        moe_intermediate_size=16,
        max_position_embeddings=256,
    )
    hf["text_config"].update({**small, **text})
    hf["canvas_length"] = 4
    return hf


def hf_model(folder, hf: dict | None = None, seed: int = 0):
    """A random HF model saved to `folder`, with non-trivial norms and scales."""
    import transformers

    hf = hf or tiny_hf_dict()
    config = transformers.DiffusionGemmaConfig(
        text_config=hf["text_config"],
        vision_config=hf["vision_config"],
        canvas_length=hf["canvas_length"],
    )
    torch.manual_seed(seed)
    model = transformers.DiffusionGemmaForBlockDiffusion(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("norm.weight", "scale", "per_expert_scale")):
                param.add_(0.2 * torch.randn_like(param))
        for name, buffer in model.named_buffers():
            if name.endswith("layer_scalar"):
                buffer.fill_(0.9)
    model.save_pretrained(str(folder))
    return model.eval()


def ours(folder=None, hf: dict | None = None, backend=None, seed: int = 0):
    config = DiffusionGemmaConfig.from_hf_dict(hf or tiny_hf_dict())
    if folder is not None:
        import json
        from pathlib import Path

        config = DiffusionGemmaConfig.from_hf_dict(
            json.loads((Path(folder) / "config.json").read_text())
        )
    attention = StreamAttention(backend or ReferenceAttention(), config)
    model = build_model(config, attention)
    model = materialize(
        model, torch.device("cpu"), seed=seed, weights_from=None if folder is None else str(folder)
    )
    return model.eval(), attention
