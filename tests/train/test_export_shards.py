"""`dllm export` and `save_hf` shard the weights as transformers' `save_pretrained` does: the
same file names, index layout and grouping rule (huggingface_hub's splitter, which
save_pretrained calls), read back by transformers and by our own loaders."""

from __future__ import annotations

import dataclasses
import json
import weakref

import pytest
import torch
import transformers
from huggingface_hub import split_torch_state_dict_into_shards
from huggingface_hub.serialization._base import parse_size_to_int
from safetensors import safe_open

from tests.helpers import assert_user_error
from tests.train.util import tiny_spec
from turbo_dllm.errors import DllmError
from turbo_dllm.registry import get_family
from turbo_dllm.train import weights
from turbo_dllm.train.entry import train
from turbo_dllm.train.export import export_checkpoint
from turbo_dllm.train.weights import (
    DEFAULT_MAX_SHARD_SIZE,
    allocate,
    full_state_dict,
    load_hf_weights,
    parse_shard_size,
    save_hf,
)

INDEX = "model.safetensors.index.json"
SMALL = "100KB"  # the tiny model's fp32 weights are a few hundred KB: several shards
PROMPT = torch.tensor([[5, 6, 7, 8, 9]])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = tmp_path_factory.mktemp("shards") / "run"
    train(tiny_spec("training.steps=2", "checkpoint.interval=2"), run)
    return run


@pytest.fixture(scope="module")
def exports(run, tmp_path_factory):
    """The run's checkpoint exported unsharded (the default) and sharded at SMALL."""
    root = tmp_path_factory.mktemp("exports")
    single = export_checkpoint(run / "checkpoints", root / "single")
    sharded = export_checkpoint(run / "checkpoints", root / "sharded", max_shard_size=SMALL)
    return single, sharded


def weight_files(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("model"))


def read_all(folder) -> dict[str, torch.Tensor]:
    out = {}
    for name in weight_files(folder):
        if name.endswith(".safetensors"):
            with safe_open(str(folder / name), framework="pt") as handle:
                assert handle.metadata() == {"format": "pt"}, name
                out.update({key: handle.get_tensor(key) for key in handle.keys()})  # noqa: SIM118
    return out


def test_the_default_writes_one_model_safetensors_and_no_index(exports):
    single, _ = exports
    assert weight_files(single) == ["model.safetensors"]


def our_order(run) -> list[str]:
    """The tensors in the order export hands them to save_hf: our model's registration order."""
    from turbo_dllm.train.checkpoint import read_meta, resolve_checkpoint

    meta = read_meta(resolve_checkpoint(run / "checkpoints"))
    family = get_family(meta.family or "causal_lm")
    config = family.read_config(meta.model)
    model = family.runtime().build_model(config, None)
    return [name for name, _ in weights.named_parameters_clean(model)]


def test_the_shards_and_index_are_what_transformers_writes(run, exports, tmp_path):
    """Oracle: the unsharded export loaded in transformers and saved with the same
    max_shard_size. The grouping rule is the same (huggingface_hub's splitter: tensors in
    order, a new file when the next would pass the limit), but the order is each model's
    registration order, and transformers' Qwen3 layer registers its two norms after the MLP
    where ours registers input_layernorm first: so save_pretrained gives the same files, names
    and totals with the file boundaries elsewhere (given a state_dict in our order it still
    reorders it), and the splitter save_pretrained calls (huggingface_hub's
    split_torch_state_dict_into_shards), given the tensors in our order, assigns every tensor
    to the file we wrote it in."""
    single, sharded = exports
    files = weight_files(sharded)
    count = len(files) - 1
    assert count >= 3, files
    shards = [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]
    assert files == sorted([INDEX, *shards])
    ours = json.loads((sharded / INDEX).read_text())

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(single), dtype=torch.float32)
    hf.save_pretrained(str(tmp_path / "plain"), max_shard_size=SMALL)
    assert weight_files(tmp_path / "plain") == files
    theirs = json.loads((tmp_path / "plain" / INDEX).read_text())
    assert ours["metadata"] == theirs["metadata"]
    assert list(ours["weight_map"]) == list(theirs["weight_map"])  # same names, sorted alike

    state = hf.state_dict()
    ordered = {name: state[name] for name in our_order(run) if name in ours["weight_map"]}
    split = split_torch_state_dict_into_shards(
        ordered, filename_pattern="model{suffix}.safetensors", max_shard_size=SMALL
    )
    assert ours["weight_map"] == split.tensor_to_filename
    assert ours["metadata"]["total_size"] == split.metadata["total_size"]

    assert list(ours["weight_map"]) == sorted(ours["weight_map"])
    tensors = read_all(sharded)
    assert set(ours["weight_map"]) == set(tensors)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    assert ours["metadata"]["total_size"] == total
    for name in shards:  # each file holds what the index says, and no file is over the limit
        with safe_open(str(sharded / name), framework="pt") as handle:
            keys = set(handle.keys())  # noqa: SIM118
        assert keys == {k for k, v in ours["weight_map"].items() if v == name}
        size = sum(tensors[k].numel() * tensors[k].element_size() for k in keys)
        assert size <= parse_size_to_int(SMALL) or len(keys) == 1


def test_transformers_loads_the_sharded_export_to_the_same_logits(exports):
    single, sharded = exports
    logits = []
    for folder in exports:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
        with torch.no_grad():
            logits.append(model.eval()(input_ids=PROMPT).logits)
    assert torch.equal(*logits)
    one, many = read_all(single), read_all(sharded)
    assert one.keys() == many.keys()
    assert all(torch.equal(one[k], many[k]) for k in one)


def test_our_loader_reads_the_sharded_export_back(run, exports):
    from turbo_dllm.train.checkpoint import read_meta, resolve_checkpoint

    single, sharded = exports
    meta = read_meta(resolve_checkpoint(run / "checkpoints"))
    family = get_family(meta.family or "causal_lm")
    config = family.read_config(meta.model)
    loaded = {}
    for folder in exports:
        model = allocate(family.runtime().build_model(config, None), torch.device("cpu"))
        load_hf_weights(model, config, folder)
        loaded[folder.name] = full_state_dict(model)
    assert loaded["single"].keys() == loaded["sharded"].keys()
    for name, tensor in loaded["single"].items():
        assert torch.equal(tensor, loaded["sharded"][name]), name
    # and the index is what _safetensors_index and export's source reader go through
    where = weights._safetensors_index(sharded)
    assert {path.name for path in where.values()} == set(weight_files(sharded)) - {INDEX}


def test_export_reads_a_sharded_source_folders_tensors(exports):
    """`_source_tensors` (a family's hf_source_prefixes, copied from model.path) reads a
    sharded folder through its index, from every file that holds a wanted tensor."""
    import types

    from turbo_dllm.train.export import _source_tensors

    single, sharded = exports
    meta = types.SimpleNamespace(model_path=str(sharded))
    got = _source_tensors(meta, ("model.layers.1.", "model.norm."))
    index = json.loads((sharded / INDEX).read_text())["weight_map"]
    wanted = [k for k in index if k.startswith(("model.layers.1.", "model.norm."))]
    assert sorted(got) == wanted
    assert len({index[k] for k in wanted}) > 1  # spread over several files
    one = read_all(single)
    assert all(torch.equal(got[k], one[k]) for k in wanted)


def test_a_bfloat16_export_is_sized_in_bfloat16(run, exports, tmp_path):
    """The grouping counts the bytes as written: bf16 tensors are half the fp32 ones, so the
    same limit gives fewer files, as transformers' save of the bf16 model does."""
    out = export_checkpoint(
        run / "checkpoints", tmp_path / "bf16", "bfloat16", max_shard_size=SMALL
    )
    tensors = read_all(out)
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.bfloat16)
    hf.save_pretrained(str(tmp_path / "hf"), max_shard_size=SMALL)
    assert weight_files(out) == weight_files(tmp_path / "hf")
    assert len(weight_files(out)) < len(weight_files(exports[1]))  # the fp32 export's
    ours = json.loads((out / INDEX).read_text())
    assert ours["metadata"] == json.loads((tmp_path / "hf" / INDEX).read_text())["metadata"]
    state = hf.state_dict()
    ordered = {name: state[name] for name in our_order(run) if name in tensors}
    split = split_torch_state_dict_into_shards(
        ordered, filename_pattern="model{suffix}.safetensors", max_shard_size=SMALL
    )
    assert ours["weight_map"] == split.tensor_to_filename


@dataclasses.dataclass(frozen=True)
class StubConfig:
    tie_word_embeddings: bool = False

    def to_hf_dict(self):
        return {"model_type": "stub"}


def test_a_tensor_past_the_limit_has_a_file_of_its_own(tmp_path):
    """Grouped as huggingface_hub's splitter (transformers' save_pretrained) groups: in order,
    and a tensor past the limit alone, placed when met, before the file still being filled."""
    state = {
        "a.weight": torch.randn(100),  # 400 bytes
        "big.weight": torch.randn(1000),  # 4000 bytes, past the 1000-byte limit
        "b.weight": torch.randn(100),
        "c.weight": torch.randn(100),
        "d.weight": torch.randn(100),
    }
    save_hf(state, StubConfig(), tmp_path, max_shard_size=1000)
    index = json.loads((tmp_path / INDEX).read_text())
    split = split_torch_state_dict_into_shards(
        state, filename_pattern="model{suffix}.safetensors", max_shard_size=1000
    )
    assert index["weight_map"] == split.tensor_to_filename
    assert index["metadata"]["total_size"] == split.metadata["total_size"] == 5600
    assert index["weight_map"]["big.weight"] == "model-00001-of-00003.safetensors"
    assert [k for k, v in index["weight_map"].items() if v.startswith("model-00002")] == [
        "a.weight",
        "b.weight",
    ]
    back = read_all(tmp_path)
    assert all(torch.equal(back[k], v) for k, v in state.items())


def test_a_tied_head_is_left_out_and_counted_nowhere(tmp_path):
    embed = torch.randn(50, 10)
    state = {
        "model.embed_tokens.weight": embed,
        "x.weight": torch.randn(50, 10),
        "lm_head.weight": embed,
    }
    save_hf(state, StubConfig(tie_word_embeddings=True), tmp_path, max_shard_size=2000)
    index = json.loads((tmp_path / INDEX).read_text())
    assert set(index["weight_map"]) == {"model.embed_tokens.weight", "x.weight"}
    assert index["metadata"] == {"total_parameters": 1000, "total_size": 4000}


def test_shards_are_converted_one_file_at_a_time(tmp_path, monkeypatch):
    """The bf16 copies of one file are gone before the next file's are made: the extra memory
    is one file's, not the whole model's."""
    import turbo_dllm.fsutil as fsutil

    real = fsutil.save_safetensors
    earlier: list[weakref.ref] = []
    calls = []

    def watching(tensors, path, metadata=None):
        assert all(ref() is None for ref in earlier), "an earlier file's tensors are still alive"
        calls.append(sorted(tensors))
        real(tensors, path, metadata=metadata)
        earlier.extend(weakref.ref(t) for t in tensors.values())

    monkeypatch.setattr(fsutil, "save_safetensors", watching)
    state = {f"layer{i}.weight": torch.randn(256) for i in range(6)}  # 512 bytes each in bf16
    save_hf(state, StubConfig(), tmp_path, dtype=torch.bfloat16, max_shard_size=1024)
    assert len(calls) == 3
    assert {t.dtype for t in read_all(tmp_path).values()} == {torch.bfloat16}


def test_saving_again_leaves_no_stale_weight_files(tmp_path):
    state = {f"layer{i}.weight": torch.randn(256) for i in range(6)}
    save_hf(state, StubConfig(), tmp_path, max_shard_size=1024)
    assert len(weight_files(tmp_path)) == 7
    (tmp_path / "tokenizer.json").write_text("{}")
    save_hf(state, StubConfig(), tmp_path)
    assert weight_files(tmp_path) == ["model.safetensors"]
    assert (tmp_path / "tokenizer.json").is_file()
    save_hf(state, StubConfig(), tmp_path, max_shard_size=2048)
    assert len(weight_files(tmp_path)) == 4  # 3 files + the index, model.safetensors gone


@pytest.mark.parametrize("text", ["5GB", "500MB", "200KB", "1TB", "1.5GB", " 3mb ", "0.5kb"])
def test_sizes_are_read_as_transformers_reads_them(text):
    assert parse_shard_size(text) == parse_size_to_int(text)


def test_a_size_is_an_int_of_bytes_or_digits():
    assert parse_shard_size(123456) == parse_shard_size("123456") == 123456
    assert parse_shard_size(DEFAULT_MAX_SHARD_SIZE) == 50 * 10**9


@pytest.mark.parametrize(
    "bad", ["5GiB", "5G", "GB", "lots", "-1GB", "0", 0, -5, "nanGB", "infGB", True]
)
def test_a_bad_size_is_refused_with_a_hint(bad):
    with pytest.raises(DllmError, match="is not a size") as error:
        parse_shard_size(bad)
    assert "decimal" in error.value.hint


def test_the_cli_default_is_the_libraries(cli):
    from turbo_dllm.cli import export as cli_export

    assert cli_export.DEFAULT_MAX_SHARD_SIZE == DEFAULT_MAX_SHARD_SIZE
    result = cli("export", "--help")
    assert "--max-shard-size" in result.out and "50GB" in result.out


def test_the_cli_shards_and_refuses_a_bad_size(cli, run, tmp_path):
    result = cli(
        "export", "--checkpoint", run, "--out", tmp_path / "bad", "--max-shard-size", "5GiB"
    )
    assert_user_error(result, "max shard size '5GiB' is not a size", "decimal")
    assert not (tmp_path / "bad").exists()
    result = cli(
        "export", "--checkpoint", run, "--out", tmp_path / "hf", "--max-shard-size", SMALL, "--json"
    )
    assert result.code == 0, result.err
    files = json.loads(result.out)["files"]
    assert INDEX in files and "model.safetensors" not in files
    assert "model-00001-of-" in " ".join(files)
    assert not list(tmp_path.glob(".*partial"))
