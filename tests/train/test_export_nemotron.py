"""nemotron_diffusion from and to the published Nemotron-Labs-Diffusion layout.

The published folders load only through their own code (`auto_map`, trust_remote_code): its
`NemotronLabsDiffusionModel` keeps a Ministral3 decoder as `self.encoder` and the output head as
`self.diffusion_head`, so the tensors are `encoder.*` and `diffusion_head.weight`. The folder
built here has that layout and a few lines of such code (the decoder is transformers'
Ministral3Model, causal: the parity oracle of test_nemotron_diffusion.py).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from tests.train.test_nemotron_diffusion import NEMOTRON, PUBLISHED_ROPE, _ministral3
from tests.train.util import tiny_spec
from turbo_dllm.train.entry import train
from turbo_dllm.train.export import export_checkpoint

transformers = pytest.importorskip("transformers")

CONFIG_CODE = """
from transformers import Ministral3Config


class NemotronLabsDiffusionConfig(Ministral3Config):
    model_type = "nemotron_labs_diffusion"

    def __init__(self, mask_token_id=-1, dlm_paradigm="bidirectional", block_size=32,
                 ar_loss_weight=1.0, **kwargs):
        self.mask_token_id, self.dlm_paradigm, self.block_size = mask_token_id, dlm_paradigm, block_size
        self.ar_loss_weight = ar_loss_weight
        super().__init__(**kwargs)
"""
MODEL_CODE = """
from torch import nn
from transformers import Ministral3Model, Ministral3PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .configuration_nemotron_labs_diffusion import NemotronLabsDiffusionConfig


class NemotronLabsDiffusionModel(Ministral3PreTrainedModel):
    config_class = NemotronLabsDiffusionConfig

    def __init__(self, config):
        super().__init__(config)
        self.encoder = Ministral3Model(config)
        self.diffusion_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids, **kwargs):
        hidden = self.encoder(input_ids=input_ids).last_hidden_state
        return CausalLMOutput(logits=self.diffusion_head(hidden))
"""
AUTO_MAP = {
    "AutoConfig": "configuration_nemotron_labs_diffusion.NemotronLabsDiffusionConfig",
    "AutoModel": "modeling_nemotron_labs_diffusion.NemotronLabsDiffusionModel",
}


def save_published_layout(folder) -> None:
    """A tiny Nemotron-Labs-Diffusion folder as published: remote code, `encoder.*` and
    `diffusion_head.weight`, dlm_paradigm bidirectional."""
    from safetensors.torch import save_file

    hf = _ministral3(**PUBLISHED_ROPE)
    folder.mkdir(parents=True)
    tensors = {
        ("encoder." + name.removeprefix("model.") if name.startswith("model.") else name): t
        for name, t in hf.state_dict().items()
    }
    tensors["diffusion_head.weight"] = tensors.pop("lm_head.weight")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    config = hf.config.to_dict()
    config.update(
        model_type="nemotron_labs_diffusion",
        architectures=["NemotronLabsDiffusionModel"],
        auto_map=AUTO_MAP,
        block_size=8,
        mask_token_id=90,
        dlm_paradigm="bidirectional",
        ar_loss_weight=0.5,
    )
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "configuration_nemotron_labs_diffusion.py").write_text(CONFIG_CODE)
    (folder / "modeling_nemotron_labs_diffusion.py").write_text(MODEL_CODE)


def train_from(folder, run) -> None:
    base = copy.deepcopy(NEMOTRON)
    base["model"] = {"family": "nemotron_diffusion", "path": str(folder), "from_config": None}
    base["objective"]["mask_token_id"] = 90
    base["data"]["synthetic"]["vocab_size"] = 97
    train(tiny_spec("training.steps=2", base=base), run)


def remote_code_logits(folder, ids, tmp_path) -> tuple[torch.Tensor, dict]:
    """The folder loaded as its users load it (AutoModel, trust_remote_code), in a process of
    its own (the code is imported from a module cache under tmp_path)."""
    torch.save(ids, tmp_path / "ids.pt")
    script = f"""
import torch, transformers
model, info = transformers.AutoModel.from_pretrained(
    {str(folder)!r}, trust_remote_code=True, output_loading_info=True)
with torch.no_grad():
    logits = model.eval()(torch.load({str(tmp_path / "ids.pt")!r})).logits
torch.save({{"logits": logits, "info": {{k: sorted(v) for k, v in info.items()}},
            "paradigm": model.config.dlm_paradigm, "class": type(model).__name__}},
           {str(tmp_path / "out.pt")!r})
"""
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = torch.load(tmp_path / "out.pt")
    return out["logits"], out


def ours_causal(checkpoint):
    """Our model on the checkpoint's weights, attending causally (as the oracle's decoder)."""
    from turbo_dllm.registry import get_family
    from turbo_dllm.train.checkpoint import load_tensors, read_meta, resolve_checkpoint
    from turbo_dllm.train.weights import allocate

    def causal(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    checkpoint = resolve_checkpoint(checkpoint)
    meta = read_meta(checkpoint)
    family = get_family(meta.family)
    model = allocate(
        family.runtime().build_model(family.read_config(meta.model), causal), torch.device("cpu")
    )
    state = {"model": model.state_dict()}
    load_tensors(state, checkpoint)
    model.load_state_dict(state["model"])
    return model.eval()


def test_a_published_layout_folder_trains_and_exports_in_that_layout(tmp_path):
    """The loader read `model.*` / `model.encoder.*` and `lm_head.weight`, so a published
    folder was "21 weights missing"; the export wrote `model.*` / `lm_head.weight`, which the
    published code does not read (every weight newly initialised)."""
    from safetensors import safe_open

    save_published_layout(tmp_path / "source")
    train_from(tmp_path / "source", tmp_path / "run")
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    with safe_open(str(tmp_path / "source/model.safetensors"), framework="pt") as source:
        with safe_open(str(out / "model.safetensors"), framework="pt") as exported:
            assert set(exported.keys()) == set(source.keys())
    # and the export reads back (training from it again)
    train_from(out, tmp_path / "again")


def test_a_tied_model_exports_its_head_as_the_published_code_reads_it(tmp_path):
    """That code ties nothing: a tied model's head is written as `diffusion_head.weight`."""
    from safetensors import safe_open

    spec = tiny_spec(
        "training.steps=2",
        "model.config_overrides.tie_word_embeddings=true",
        "checkpoint.interval=2",
        base=NEMOTRON,
    )
    train(spec, tmp_path / "run")
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    with safe_open(str(out / "model.safetensors"), framework="pt") as exported:
        assert torch.equal(
            exported.get_tensor("diffusion_head.weight"),
            exported.get_tensor("encoder.embed_tokens.weight"),
        )
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True


def test_the_export_of_a_remote_code_folder_loads_with_that_code(tmp_path):
    """transformers has no class for the model: the published folder's `auto_map` and code
    files are how it loads. The export kept neither ("Transformers does not recognize this
    architecture"), nor the config keys only that code reads."""
    save_published_layout(tmp_path / "source")
    train_from(tmp_path / "source", tmp_path / "run")
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"] == AUTO_MAP
    assert config["ar_loss_weight"] == 0.5  # a key our reader does not know, kept
    for name in ("configuration_nemotron_labs_diffusion.py", "modeling_nemotron_labs_diffusion.py"):
        assert (out / name).read_bytes() == (tmp_path / "source" / name).read_bytes()
    ids = torch.randint(0, 97, (2, 24))
    theirs, loaded = remote_code_logits(out, ids, tmp_path)
    assert (loaded["class"], loaded["paradigm"]) == ("NemotronLabsDiffusionModel", "bidirectional")
    assert loaded["info"]["missing_keys"] == [] and loaded["info"]["unexpected_keys"] == []
    with torch.no_grad():
        ours = ours_causal(tmp_path / "run/checkpoints")(ids, torch.arange(24))
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-4)


def test_the_export_names_the_paradigm_that_code_infers_with(tmp_path):
    """With dlm_paradigm block_diff the published code builds its training attention (the
    block-diffusion mask over the input's two halves, noisy then clean), at inference too. The
    export said block_diff ("what it was trained as"); published folders, trained so as well,
    say bidirectional, and so does the export now. Our reader reads it back as the same config
    (the paradigm does not change the model it builds)."""
    from turbo_dllm.registry import get_family
    from turbo_dllm.train.checkpoint import read_meta, resolve_checkpoint

    train(tiny_spec("training.steps=2", "checkpoint.interval=2", base=NEMOTRON), tmp_path / "run")
    out = export_checkpoint(tmp_path / "run/checkpoints", tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["dlm_paradigm"] == "bidirectional"
    family = get_family("nemotron_diffusion")
    trained = family.read_config(read_meta(resolve_checkpoint(tmp_path / "run/checkpoints")).model)
    assert trained.dlm_paradigm == "block_diff"
    assert family.resolve_config(path=str(out), from_config=None) == trained
