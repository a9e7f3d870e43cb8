"""A multimodal qwen3_5 folder ties its head as transformers' Qwen3_5ForConditionalGeneration
does: by the root's `tie_word_embeddings` (false where absent), whatever `text_config` says."""

from __future__ import annotations

import json

import pytest
import torch

from tests.train.test_qwen3_8_model import HF_SHAPE, VOCAB, causal
from turbo_dllm.errors import DllmError
from turbo_dllm.families.qwen3_8.runtime import build_model
from turbo_dllm.registry import get_family
from turbo_dllm.train.weights import materialize

transformers = pytest.importorskip("transformers")

# The text model of tests/train/test_qwen3_8_model.py, two layers (one of each kind).
TEXT = {**HF_SHAPE, "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"]}
VISION = dict(
    depth=1,
    hidden_size=16,
    intermediate_size=32,
    num_heads=2,
    out_hidden_size=48,
    patch_size=4,
    spatial_merge_size=1,
    temporal_patch_size=1,
)


@pytest.mark.parametrize(
    "root,text,tied",
    [
        (None, True, False),  # the root says nothing: Qwen3_5Config's false
        (False, True, False),
        (True, False, True),
    ],
)
def test_multimodal_head_ties_as_transformers_reads_the_folder(tmp_path, root, text, tied):
    torch.manual_seed(0)
    config = transformers.Qwen3_5Config(
        text_config={**TEXT, "tie_word_embeddings": text},
        vision_config=VISION,
        tie_word_embeddings=bool(root),
    )
    transformers.Qwen3_5ForConditionalGeneration(config).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    if root is None:
        del saved["tie_word_embeddings"]
    assert saved["text_config"]["tie_word_embeddings"] is text
    (tmp_path / "config.json").write_text(json.dumps(saved))
    # The oracle: transformers' own model of that folder.
    hf = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(tmp_path).eval()
    embedding = hf.model.language_model.embed_tokens.weight
    assert (hf.lm_head.weight.data_ptr() == embedding.data_ptr()) is tied
    assert torch.equal(hf.lm_head.weight, embedding) is tied

    ours_config = get_family("qwen3_8").resolve_config(path=str(tmp_path), from_config=None)
    assert ours_config.tie_word_embeddings is tied
    ours = materialize(
        build_model(ours_config, causal), torch.device("cpu"), seed=0, weights_from=str(tmp_path)
    ).eval()
    head, embed = ours.lm_head.weight, ours.model.embed_tokens.weight
    assert (head is embed) is tied
    torch.testing.assert_close(head, hf.lm_head.weight, rtol=0, atol=0)
    ids = torch.randint(0, VOCAB, (1, 24))
    with torch.no_grad():
        torch.testing.assert_close(
            ours(ids, torch.arange(24)), hf(input_ids=ids).logits, atol=2e-5, rtol=1e-4
        )


def test_a_tying_override_reaches_the_root(tmp_path):
    """model.config_overrides' tie_word_embeddings of a qwen3_5 config whose text_config holds
    it changes the root too, the value that is read."""
    folder = tmp_path / "config.json"
    folder.write_text(
        json.dumps(
            {
                "model_type": "qwen3_5",
                "text_config": {**TEXT, "tie_word_embeddings": False},
                "vision_config": VISION,
            }
        )
    )
    family = get_family("qwen3_8")
    assert family.resolve_config(path=None, from_config=str(folder)).tie_word_embeddings is False
    tied = family.resolve_config(
        path=None, from_config=str(folder), overrides={"tie_word_embeddings": True}
    )
    assert tied.tie_word_embeddings is True


def test_a_folder_tied_only_in_its_text_config_is_told_the_root_decides(tmp_path):
    """A tied folder (no lm_head.weight) whose root lost tie_word_embeddings while its
    text_config says true: the refusal said "says tie_word_embeddings: false" (it read the
    text_config's keys as the root's); it names the root and the text_config's unread value."""
    config = transformers.Qwen3_5Config(
        text_config={**TEXT, "tie_word_embeddings": True},
        vision_config=VISION,
        tie_word_embeddings=True,
    )
    transformers.Qwen3_5ForConditionalGeneration(config).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["tie_word_embeddings"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    ours_config = get_family("qwen3_8").resolve_config(path=str(tmp_path), from_config=None)
    with pytest.raises(DllmError) as refused:
        materialize(
            build_model(ours_config, causal),
            torch.device("cpu"),
            seed=0,
            weights_from=str(tmp_path),
        )
    message = refused.value.message
    assert "leaves out tie_word_embeddings at its root" in message
    assert "text_config's value does not tie" in message
    assert "says tie_word_embeddings: false" not in message
    assert "tie_word_embeddings: true" in refused.value.hint
