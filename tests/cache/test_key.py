"""The pack key's spec digest: what shapes a compiled graph counts, what does not is left out,
and a model counts by its config.json, not by the folder it sits in."""

from __future__ import annotations

import json

from tests.train.util import tiny_spec
from turbo_dllm.cache.key import compile_relevant, spec_digest


def test_only_compile_relevant_fields_change_the_digest():
    base = spec_digest(tiny_spec())
    for irrelevant in ("optimizer.lr=0.1", "training.steps=99", "launch.seed=3",
                       "logging.jsonl=false", "scheduler.warmup_steps=0"):  # fmt: skip
        assert spec_digest(tiny_spec(irrelevant)) == base, irrelevant
    for relevant in ("data.seq_len=128", "training.micro_batch_size=2", "objective.block_size=16",
                     "model.dtype=bfloat16", "training.activation_checkpointing=true"):  # fmt: skip
        assert spec_digest(tiny_spec(relevant)) != base, relevant


def test_a_model_counts_by_its_config_not_its_folder(tmp_path):
    shape = {"model_type": "qwen3", "hidden_size": 64, "_name_or_path": "/somewhere"}
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "config.json").write_text(json.dumps(shape))
    document = tiny_spec().model_dump(mode="json")
    digests = []
    for folder in ("a", "b"):
        document["model"] = {**document["model"], "path": str(tmp_path / folder)}
        digests.append(spec_digest(document))
        assert compile_relevant(document)["model"]["config"] == {
            "hidden_size": 64,
            "model_type": "qwen3",
        }
    assert digests[0] == digests[1]
    (tmp_path / "b" / "config.json").write_text(json.dumps({**shape, "hidden_size": 128}))
    assert spec_digest(document) != digests[0]


def test_a_drafter_shape_and_linear_attention_kernels_count(tmp_path):
    """`model.dflash` (a drafter's layers, block size, its target's config.json) and
    `model.linear_attention` shape the compiled graph: a pack of a 1-layer drafter was offered
    to (and installed with --config for) a 3-layer one. A spec without them keeps its digest."""
    document = tiny_spec().model_dump(mode="json")
    base = spec_digest(document)

    def digest(**model) -> str:
        return spec_digest({**document, "model": {**document["model"], **model}})

    assert digest(linear_attention="torch") == base  # packs made before keep fitting
    assert digest(linear_attention="fla") != base
    shape = {"model_type": "qwen3", "hidden_size": 64}
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "config.json").write_text(json.dumps(shape))
    drafter = {"target": str(tmp_path / "a"), "num_layers": 1, "block_size": 4, "features": None}
    one_layer = digest(family="dflash", dflash=drafter)
    assert one_layer != base
    assert digest(family="dflash", dflash={**drafter, "num_layers": 3}) != one_layer
    # The target counts by its config.json, offline features not at all.
    moved = {**drafter, "target": str(tmp_path / "b"), "features": str(tmp_path / "features")}
    assert digest(family="dflash", dflash=moved) == one_layer
    (tmp_path / "b" / "config.json").write_text(json.dumps({**shape, "hidden_size": 128}))
    assert digest(family="dflash", dflash=moved) != one_layer
