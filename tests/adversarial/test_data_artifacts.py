"""A hostile artifact folder: `data inspect`, `stats` and `validate` check the manifest against
itself before mapping any array, so a negative, huge or mismatched shape is an error naming the
field, never an mmap of the wrong size or a traceback."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.data.helpers import prepare_config, write_config, write_jsonl
from tests.helpers import assert_failed_check, assert_user_error

COMMANDS = [("inspect",), ("stats",), ("validate",)]


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    folder = tmp_path_factory.mktemp("good")
    write_jsonl(folder / "data.jsonl", [{"text": "hello world"}, {"text": "more text"}])
    return prepare_config(write_config(folder, packing={"seq_len": 16, "block_size": 8})).path


@pytest.fixture
def broken(artifact, tmp_path):
    """A copy of the artifact whose manifest `change(manifest)` edits in place."""

    def make(change):
        copy = tmp_path / "artifact"
        shutil.copytree(artifact, copy)
        manifest = json.loads((copy / "manifest.json").read_text())
        change(manifest)
        (copy / "manifest.json").write_text(json.dumps(manifest))
        return copy

    return make


def _tokens(**fields):
    return lambda m: m["arrays"]["tokens"].update(fields)


CASES = {
    "negative shape": (_tokens(shape=[-2, -16]), "arrays.tokens.shape.0"),
    "huge shape": (_tokens(shape=[2**40, 2**40]), "arrays.tokens.bytes: 64, but shape"),
    "3-D shape": (_tokens(shape=[2, 4, 4]), "arrays.tokens.shape"),
    "seq_len 0": (lambda m: m.update(seq_len=0), "seq_len"),
    "block_size 0": (lambda m: m.update(block_size=0), "block_size"),
    "more sequences than rows": (
        lambda m: m.update(num_sequences=10**6),
        "arrays.tokens.shape: [2, 16], expected [1000000, 16]",
    ),
    "negative documents": (
        lambda m: m["arrays"]["documents"].update(shape=[-1, 2]),
        "arrays.documents.shape.0",
    ),
    "file outside the folder": (
        _tokens(file="../../tokens.bin"),
        "arrays.tokens.file: '../../tokens.bin', expected 'tokens.bin'",
    ),
    "wrong dtype": (_tokens(dtype="int64", shape=[2, 4], bytes=64), "arrays.tokens.dtype"),
    "negative stats": (lambda m: m["stats"].update(tokens=-5), "stats.tokens"),
}


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_manifest_is_named_before_anything_is_mapped(cli, broken, case, command):
    change, needle = CASES[case]
    result = cli("data", *command, broken(change))
    # `validate` checks it: a damaged artifact is its failed check (exit 1), an error elsewhere
    (assert_failed_check if command == ("validate",) else assert_user_error)(result, needle)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_manifest_nested_too_deeply(cli, broken, command):
    folder = broken(lambda m: None)
    (folder / "manifest.json").write_text("[" * 100_000)
    check = assert_failed_check if command == ("validate",) else assert_user_error
    check(cli("data", *command, folder), "unreadable manifest")


@pytest.mark.parametrize("command", [("inspect",), ("stats",)], ids=lambda c: c[0])
def test_a_scrambled_document_index_is_refused(cli, broken, command):
    folder = broken(lambda m: None)
    index = np.array([[0, -3], [2**62, 2**62]], dtype="<i8")  # same size as the real one
    (folder / "documents.bin").write_bytes(index.tobytes())
    result = cli("data", *command, folder)
    assert_user_error(result, "documents: the index is not a sorted, non-overlapping cover")


@pytest.fixture(scope="module")
def hf_artifact(tmp_path_factory):
    from tests.data.conftest import CHAT_TEMPLATE, _train_tokenizer

    folder = tmp_path_factory.mktemp("hf")
    tokenizer = _train_tokenizer(folder / "tokenizer", CHAT_TEMPLATE)
    write_jsonl(folder / "data.jsonl", [{"text": "hello world"}])
    config = write_config(
        folder,
        tokenizer={"kind": "huggingface", "path": str(tokenizer)},
        packing={"seq_len": 16, "block_size": 8},
    )
    return prepare_config(config).path


@pytest.mark.parametrize("listed", [True, False], ids=["listed", "unlisted"])
def test_inspect_with_a_broken_tokenizer_copy(cli, hf_artifact, tmp_path, listed):
    copy = tmp_path / "artifact"
    shutil.copytree(hf_artifact, copy)
    (copy / "tokenizer" / "tokenizer.json").write_text("garbage")
    if not listed:  # the manifest does not know the file: loading it is what fails
        manifest = json.loads((copy / "manifest.json").read_text())
        manifest["tokenizer_files"] = {}
        (copy / "manifest.json").write_text(json.dumps(manifest))
    result = cli("data", "inspect", copy)
    needle = "tokenizer/tokenizer.json is missing or changed" if listed else "cannot load its"
    assert_user_error(result, needle)
