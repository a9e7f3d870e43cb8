"""Target feature i is entry `target_layer_ids[i] + 1` of transformers' hidden-state tuple
(`output_hidden_states`: the embeddings, then each layer's output, the last one after the
final norm), the features the original's HF paths hand a drafter (z-lab's
`extract_context_feature`, SpecForge's HF target backend). Training (`TargetFeatures`, online
and so the feature artifact) and `dllm dflash eval` (`speculative._step`) compute them so,
the target's last layer included; a feature artifact made before, which holds that layer's
output before the final norm, is refused."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from tests.dflash.helpers import drafter_document, drafter_spec, tiny_qwen3_config
from tests.helpers import assert_user_error


@pytest.fixture
def target(tmp_path):
    """A tiny random transformers Qwen3 of 3 layers whose final norm is far from the identity
    (as a trained one's is), saved as a target folder: (its model, the folder)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    shape = {**tiny_qwen3_config().to_dict(), "num_hidden_layers": 3, "layer_types": None}
    model = Qwen3ForCausalLM(Qwen3Config(**shape)).eval()
    with torch.no_grad():
        model.model.norm.weight.uniform_(0.2, 3.0)
    model.save_pretrained(tmp_path / "target")
    return model, tmp_path / "target"


def _config(folder, layers):
    from types import SimpleNamespace

    from turbo_dllm.families.dflash import read_target_config
    from turbo_dllm.families.dflash.config import DFlashConfig

    shape = SimpleNamespace(
        target_layer_ids=list(layers),
        num_layers=1,
        intermediate_size=None,
        block_size=4,
        mask_token_id=3,
        sample_from_anchor=False,
        architecture="DFlashDraftModel",
    )
    return DFlashConfig.from_target(read_target_config(str(folder)), shape, target_path=str(folder))


@pytest.mark.parametrize("layers", [(0, 2), (2,), (1,)], ids=["first-and-last", "last", "middle"])
def test_training_features_are_the_hf_hidden_state_tuple(target, layers):
    from turbo_dllm.families.dflash.target import TargetFeatures

    model, folder = target
    ids = torch.randint(64, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
    features, teacher = TargetFeatures(
        str(folder), _config(folder, layers), teacher=True, device=torch.device("cpu")
    )(ids, None)
    oracle = torch.cat([hidden[i + 1] for i in layers], dim=-1)
    torch.testing.assert_close(features, oracle, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(teacher, hidden[-1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layers", [(0, 2), (2,), (1,)], ids=["first-and-last", "last", "middle"])
def test_eval_features_are_the_hf_hidden_state_tuple(target, layers):
    """`dllm dflash eval` catches them in its cached forwards (prefill, then a verify block):
    the same numbers as the one uncached forward's tuple over the whole sequence."""
    from turbo_dllm.families.dflash import speculative

    model, _ = target
    ids = torch.randint(64, (14,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        hidden = model(input_ids=ids[None], output_hidden_states=True).hidden_states
        _, cache, first = speculative._step(model, ids[:10], layers=layers)
        _, _, second = speculative._step(model, ids[10:], cache, layers=layers)
    for layer, a, b in zip(layers, first, second, strict=True):
        torch.testing.assert_close(
            torch.cat([a, b], dim=1), hidden[layer + 1], rtol=1e-5, atol=1e-5
        )


def test_a_feature_artifact_of_the_unnormed_last_layer_is_refused(cli, world, tmp_path):
    """An artifact made before features followed the tuple at the last layer (features.json
    without `final_norm_at_last_layer`) holds other numbers than training computes, where the
    drafter reads the target's last layer (the world's: layer 1 of 2, the default): refused,
    naming the fix. Layers before the last were the same then: such an artifact still feeds."""
    args = ("training.steps=2", "checkpoint.interval=null", "objective.dflash_loss=paper_ce")
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(drafter_document(world["target"], world["artifact"], *args)))
    features = tmp_path / "features"
    assert cli("dflash", "prepare-features", "--config", config, "--out", features).code == 0
    manifest = features / "features.json"
    document = json.loads(manifest.read_text())
    assert document["target_layer_ids"] == [1] and document["final_norm_at_last_layer"] is True
    del document["final_norm_at_last_layer"]
    manifest.write_text(json.dumps(document))
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            drafter_document(
                world["target"], world["artifact"], *args, f"model.dflash.features={features}"
            )
        )
    )
    result = cli("train", "--config", bad, "--run-dir", tmp_path / "run")
    assert_user_error(result, "model.dflash.features", "before the final norm", "prepare-features")
    assert not (tmp_path / "run").exists()

    import dataclasses

    from turbo_dllm.families.dflash.features import feature_problems, read_features_manifest
    from turbo_dllm.registry import resolve_model_config

    spec = drafter_spec(world["target"], world["artifact"], *args)
    config = dataclasses.replace(resolve_model_config(spec.model), target_layer_ids=(0,))
    earlier = read_features_manifest(features).model_copy(update={"target_layer_ids": [0]})
    assert feature_problems(earlier, config, spec) == []
