"""Found by the data-preparation docs-as-a-new-user audit: each test failed before its fix."""

from __future__ import annotations

import os

from tests.data.helpers import documents, prepare_config, write_config, write_jsonl


def _texts(path) -> list[bytes]:
    """Document contents without the trailing eos (byte-level artifacts)."""
    return [bytes(tokens[:-1].tolist()) for tokens, _ in documents(path)]


def test_a_data_file_rewritten_with_the_same_mtime_is_read_again_not_from_the_cache(tmp_path):
    """datasets keys its cache of a local data file on the file's path and mtime alone: a file
    replaced by another with the same mtime (`cp -p`, `rsync -a`, `tar x` of a newer export,
    archives that fix every mtime) was read from the cache of the old one, so the artifact held
    the old records while its manifest recorded the new file's sha256."""
    data = tmp_path / "a.jsonl"
    write_jsonl(data, [{"text": "alpha alpha"}, {"text": "bravo bravo"}])
    stamp = (1_700_000_000, 1_700_000_000)
    os.utime(data, stamp)
    config = write_config(
        tmp_path,
        source={"kind": "huggingface", "data_files": ["a.jsonl"]},
        output={"path": "out", "overwrite": True},
    )
    assert _texts(prepare_config(config).path) == [b"alpha alpha", b"bravo bravo"]

    write_jsonl(data, [{"text": "a different and longer record"}])
    os.utime(data, stamp)
    result = prepare_config(config)
    assert _texts(result.path) == [b"a different and longer record"]
    import hashlib

    (recorded,) = result.manifest.source.files
    assert recorded.sha256 == hashlib.sha256(data.read_bytes()).hexdigest()
