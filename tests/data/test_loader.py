"""ArtifactLoader: batch protocol, sharding, shuffling, exact resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.data.helpers import prepare_config, write_config, write_jsonl
from turbo_dllm.data.artifact import DataArtifact
from turbo_dllm.data.loader import ArtifactLoader
from turbo_dllm.errors import DllmError


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    folder = tmp_path_factory.mktemp("loader")
    rows = [{"text": f"doc {i} " + "xy" * (i % 23)} for i in range(300)]
    write_jsonl(folder / "data.jsonl", rows)
    result = prepare_config(write_config(folder, packing={"seq_len": 32, "block_size": 8}))
    assert result.manifest.num_sequences % 6  # not a multiple of the global batch below
    return result.path


def _loader(path, **kwargs):
    options = dict(seq_len=32, micro_batch_size=3, dp_rank=0, dp_size=2, seed=7)
    options.update(kwargs)
    return ArtifactLoader(path, **options)


def test_batches_follow_the_protocol(artifact):
    loader = _loader(artifact)
    batch = next(loader)
    assert set(batch) == {"input_ids", "loss_mask", "doc_ids", "rows"}
    assert batch["input_ids"].dtype == torch.long and batch["input_ids"].shape == (3, 32)
    assert batch["loss_mask"].dtype == torch.bool and batch["doc_ids"].dtype == torch.int32
    data = DataArtifact(artifact)
    for row, index in enumerate(_loader(artifact).indices(0)):
        tokens, mask, docs = data.row(index)
        assert batch["input_ids"][row].tolist() == tokens.tolist()
        assert batch["loss_mask"][row].tolist() == mask.tolist()
        assert batch["doc_ids"][row].tolist() == docs.tolist()
        assert int(batch["rows"][row]) == index


def test_ranks_share_each_epoch_without_loss_or_repeat(artifact):
    ranks = [_loader(artifact, dp_rank=r) for r in range(2)]
    n = ranks[0].num_sequences
    seen: list[int] = []
    steps = 0
    while len(seen) < 2 * n:
        for loader in ranks:
            seen += loader.indices(loader.consumed)
            loader.consumed += loader.micro_batch_size * loader.dp_size
        steps += 1
    # The global stream visits every sequence once in epoch 0, once in epoch 1, ...
    assert sorted(seen[:n]) == list(range(n))
    assert sorted(seen[n : 2 * n]) == list(range(n))
    assert seen[:n] != seen[n : 2 * n]  # a fresh shuffle per epoch


def test_resume_reproduces_the_uninterrupted_stream(artifact):
    uninterrupted = _loader(artifact, dp_rank=1)
    total = 3 * uninterrupted.num_sequences // 12 + 1  # 1.5 epochs in global batches of 6
    reference = [next(uninterrupted) for _ in range(total)]
    assert uninterrupted.epoch == 1
    stop = total // 2 + 3
    first = _loader(artifact, dp_rank=1)
    for _ in range(stop):
        next(first)
    state = json.loads(json.dumps(first.state_dict()))  # plain JSON-able values
    resumed = _loader(artifact, dp_rank=1)
    resumed.load_state_dict(state)
    for step in range(stop, total):
        batch = next(resumed)
        for key in batch:
            assert torch.equal(batch[key], reference[step][key]), (step, key)


def test_resume_with_a_different_dp_size_continues_the_global_stream(artifact):
    single = _loader(artifact, dp_size=1, micro_batch_size=4)
    for _ in range(5):
        next(single)
    state = single.state_dict()
    expected = single.indices(single.consumed) + single.indices(single.consumed + 4)
    got = []
    for rank in range(2):
        loader = _loader(artifact, dp_rank=rank, dp_size=2, micro_batch_size=2)
        loader.load_state_dict(state)
        got.append(loader.indices(loader.consumed))
    first_step = got[0] + got[1]
    assert first_step == expected[:4]


def test_state_from_other_data_or_seed_is_refused(artifact):
    state = _loader(artifact).state_dict()
    with pytest.raises(DllmError, match="seed"):
        _loader(artifact, seed=8).load_state_dict(state)
    with pytest.raises(DllmError, match="different data"):
        _loader(artifact).load_state_dict({**state, "fingerprint": "0" * 64})


def test_seq_len_must_match_the_artifact(artifact):
    with pytest.raises(DllmError, match="holds sequences of 32"):
        _loader(artifact, seq_len=64)


def test_seed_changes_the_order(artifact):
    a = _loader(artifact, seed=1).indices(0)
    b = _loader(artifact, seed=2).indices(0)
    c = _loader(artifact, seed=1).indices(0)
    assert a == c and a != b
    assert np.unique(a).size == len(a)


def test_the_loader_reads_the_listed_files_whatever_else_the_folder_holds(tmp_path, monkeypatch):
    """A file added to the artifact since prepare changes no batch (`dllm data validate` names
    it, export hands on the listed tokenizer files only): the loader starts without hashing
    anything and yields the same batch with or without it."""
    write_jsonl(tmp_path / "data.jsonl", [{"text": f"doc {i}"} for i in range(20)])
    result = prepare_config(write_config(tmp_path, packing={"seq_len": 32, "block_size": 8}))
    want = next(_loader(result.path))["input_ids"]
    extra = result.path / "tokenizer" / "tokenizer.json"
    extra.parent.mkdir()
    extra.write_text("{}")

    def no_hashing(*args, **kwargs):
        raise AssertionError("the loader's start hashes nothing")

    monkeypatch.setattr("turbo_dllm.data.artifact.sha256_file", no_hashing)
    assert torch.equal(next(_loader(result.path))["input_ids"], want)
