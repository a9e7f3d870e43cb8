"""What the trainer and export ask of any family's model (docs/architecture.md, "The family
registry"), held on a small GPT-style model written here the way a new family would be: its own
module names (`ln_1`, `wte`), torch's LayerNorm, its head registered before its embeddings."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors import safe_open
from torch import nn

from turbo_dllm.errors import DllmError
from turbo_dllm.registry import get_family
from turbo_dllm.train.distributed import apply_mlp_chunking
from turbo_dllm.train.weights import (
    allocate,
    full_state_dict,
    load_hf_weights,
    materialize,
    named_parameters_clean,
    save_hf,
)


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    vocab_size: int = 40
    hidden_size: int = 16
    num_hidden_layers: int = 2
    initializer_range: float = 0.02
    tie_word_embeddings: bool = False

    def to_hf_dict(self):
        return {"model_type": "toygpt", **dataclasses.asdict(self)}


class Block(nn.Module):
    def __init__(self, config: ToyConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.hidden_size)
        self.fc = nn.Linear(config.hidden_size, config.hidden_size)


class ToyGPT(nn.Module):
    """GPT-2's names; with `head_first`, the head is registered before the embeddings."""

    def __init__(self, config: ToyConfig, head_first: bool = False) -> None:
        super().__init__()
        self.config = config
        if head_first:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.h = nn.ModuleList(Block(config) for _ in range(config.num_hidden_layers))
        self.ln_f = nn.LayerNorm(config.hidden_size)
        if not head_first:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.wte.weight


def _toy(config: ToyConfig, **kwargs) -> ToyGPT:
    with torch.device("meta"):
        return ToyGPT(config, **kwargs)


def test_random_init_finds_norms_by_their_module_not_their_name():
    """`ln_1` / `ln_f` (torch LayerNorms) were drawn from N(0, 0.02) like a linear weight, since
    only names ending in `norm.weight` counted as norms: a new family trained from a near-zero
    residual stream, silently."""
    model = materialize(_toy(ToyConfig()), torch.device("cpu"), seed=0)
    for name in ("h.0.ln_1.weight", "h.1.ln_1.weight", "ln_f.weight"):
        assert torch.equal(model.get_parameter(name), torch.ones(16)), name
    assert torch.equal(model.h[0].ln_1.bias, torch.zeros(16))
    assert model.h[0].fc.weight.std() < 0.1 and not torch.equal(
        model.wte.weight, torch.ones(40, 16)
    )


def test_diffusion_gemma_moe_branch_norms_start_at_one():
    """The same rule hit a registered family: DiffusionGemma's `post_feedforward_layernorm_1`,
    `pre_feedforward_layernorm_2` and `post_feedforward_layernorm_2` (RMSNorms whose names end
    in a digit) started at ~0.02 in a random-init run, where transformers starts them at one."""
    family = get_family("diffusion_gemma")
    config = family.resolve_config(path=None, from_config="tiny")
    model = materialize(family.runtime().build_model(config, None), torch.device("cpu"), seed=0)
    norms = {
        name: param
        for name, param in named_parameters_clean(model)
        if "feedforward_layernorm_" in name
    }
    assert norms
    for name, param in norms.items():
        assert torch.equal(param, torch.ones_like(param)), name


def test_a_tied_head_registered_first_keeps_its_embeddings(tmp_path):
    """A tied model whose head comes first named the shared tensor `lm_head.weight`, which
    save_hf leaves out of a tied folder: the export had no embeddings at all, and loading a
    folder never filled them (they stayed uninitialised)."""
    config = ToyConfig(tie_word_embeddings=True)
    trained = materialize(_toy(config, head_first=True), torch.device("cpu"), seed=0)
    assert "wte.weight" in dict(named_parameters_clean(trained))
    save_hf(full_state_dict(trained), config, tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as handle:
        assert "wte.weight" in set(handle.keys())
    loaded = allocate(_toy(config, head_first=True), torch.device("cpu"))
    with torch.no_grad():
        loaded.wte.weight.zero_()
    load_hf_weights(loaded, config, tmp_path)
    assert torch.equal(loaded.wte.weight, trained.wte.weight)
    assert loaded.lm_head.weight is loaded.wte.weight


def test_mlp_chunks_on_layers_without_a_chunked_mlp_is_refused():
    """`training.mlp_chunks` set `layer.mlp.chunks` on whatever was there: a family's MLP that
    never reads `chunks` (or a layer whose MLP has another name, which raised AttributeError)
    trained unchunked without a word."""
    chunked = ToyGPT(ToyConfig())
    for block in chunked.h:
        block.mlp = nn.Module()
        block.mlp.chunks = 1
    apply_mlp_chunking(chunked.h, 4)
    assert [block.mlp.chunks for block in chunked.h] == [4, 4]
    with pytest.raises(DllmError, match=r"training.mlp_chunks 4: layer 0 \(Block\) has no MLP"):
        apply_mlp_chunking(ToyGPT(ToyConfig()).h, 4)
    plain = ToyGPT(ToyConfig())
    for block in plain.h:
        block.mlp = nn.Linear(2, 2)  # an MLP without `chunks`
    with pytest.raises(DllmError, match="set training.mlp_chunks: 1"):
        apply_mlp_chunking(plain.h, 2)
