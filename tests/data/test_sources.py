"""Every source x record kind that applies: the artifact holds exactly the expected documents."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.data.helpers import (
    byte_doc,
    documents,
    prepare_config,
    write_config,
    write_jsonl,
)
from tests.helpers import assert_user_error
from turbo_dllm.errors import DllmError

TEXTS = ["alpha beta", "gamma", "délta ünïcode ✓", "x" * 30]


def _texts_back(path) -> list[bytes]:
    """Document contents without the trailing eos, as bytes (byte-level artifacts)."""
    out = []
    for tokens, _ in documents(path):
        assert tokens[-1] == 257
        out.append(bytes(tokens[:-1].tolist()))
    return out


# --- jsonl -------------------------------------------------------------------------------------


def test_jsonl_text_with_dotted_field(tmp_path):
    write_jsonl(
        tmp_path / "data.jsonl", [{"meta": {"body": t}, "id": i} for i, t in enumerate(TEXTS)]
    )
    config = write_config(tmp_path, records={"kind": "text", "field": "meta.body"})
    result = prepare_config(config)
    assert _texts_back(result.path) == [t.encode() for t in TEXTS]
    assert result.manifest.stats.records == len(TEXTS)
    assert result.manifest.source.records == "text"


def test_jsonl_gz_and_globs_read_in_sorted_order(tmp_path):
    write_jsonl(tmp_path / "d/b.jsonl.gz", [{"text": "second"}], gz=True)
    write_jsonl(tmp_path / "d/a.jsonl", [{"text": "first"}])
    write_jsonl(tmp_path / "d/sub/c.jsonl.gz", [{"text": "third"}], gz=True)
    config = write_config(tmp_path, source={"kind": "jsonl", "paths": ["d/**/*.jsonl*"]})
    result = prepare_config(config)
    assert _texts_back(result.path) == [b"first", b"second", b"third"]
    names = [f.name for f in result.manifest.source.files]
    assert names == ["a.jsonl", "b.jsonl.gz", "sub/c.jsonl.gz"]  # relative, no local paths
    assert all(len(f.sha256) == 64 for f in result.manifest.source.files)


def test_jsonl_prompt_completion_completion_only(tmp_path, hf_tokenizer):
    from transformers import AutoTokenizer

    rows = [{"q": "What is 2+2?", "a": " Four."}, {"q": "Say hello", "a": " hello world"}]
    write_jsonl(tmp_path / "data.jsonl", rows)
    config = write_config(
        tmp_path,
        records={"kind": "prompt_completion", "prompt_field": "q", "completion_field": "a"},
        tokenizer={"kind": "huggingface", "path": str(hf_tokenizer)},
        supervision="completion_only",
    )
    result = prepare_config(config)
    tok = AutoTokenizer.from_pretrained(str(hf_tokenizer))
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    for (tokens, mask), row in zip(documents(result.path), rows, strict=True):
        prompt = tok(row["q"], add_special_tokens=False)["input_ids"]
        completion = tok(row["a"], add_special_tokens=False)["input_ids"]
        assert tokens.tolist() == prompt + completion + [eos]
        assert mask.tolist() == [False] * len(prompt) + [True] * (len(completion) + 1)
    assert result.manifest.supervision == "completion_only"
    assert result.manifest.tokenizer.kind == "huggingface"


@pytest.mark.parametrize("workers", [1, 2])
def test_jsonl_chat_assistant_only_uses_the_template_mask(tmp_path, hf_tokenizer, workers):
    from transformers import AutoTokenizer

    chats = [
        [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "world test"},
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": "the quick fox"},
        ],
        [{"role": "system", "content": "be brief"}, {"role": "assistant", "content": "ok"}],
    ]
    write_jsonl(tmp_path / "data.jsonl", [{"messages": c} for c in chats])
    config = write_config(
        tmp_path,
        records={"kind": "chat"},
        tokenizer={"kind": "huggingface", "path": str(hf_tokenizer)},
        supervision="assistant_only",
        workers=workers,
    )
    result = prepare_config(config)
    tok = AutoTokenizer.from_pretrained(str(hf_tokenizer))
    for (tokens, mask), chat in zip(documents(result.path), chats, strict=True):
        expected = tok.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"]
        assert tokens[: len(expected)].tolist() == expected
        # The supervised text is exactly the assistant turns with their end-of-turn token; the
        # eos separator after the last turn is supervised like the token before it.
        edges = np.flatnonzero(np.diff(np.r_[0, mask.astype(int), 0]))
        spans = [
            tok.decode(tokens[a:b].tolist()) for a, b in zip(edges[::2], edges[1::2], strict=True)
        ]
        want = [m["content"] + "<|im_end|>" for m in chat if m["role"] == "assistant"]
        want[-1] += "<|endoftext|>"
        assert spans == want
        assert not mask[0]
    assert result.manifest.tokenizer.chat_template_sha256 is not None
    assert (result.path / "tokenizer" / "tokenizer.json").is_file()


def test_chat_full_supervision_with_byte_level_builtin_template(tmp_path):
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    write_jsonl(tmp_path / "data.jsonl", [{"messages": chat}])
    config = write_config(tmp_path, records={"kind": "chat"})
    ((tokens, mask),) = documents(prepare_config(config).path)
    expected = list(b"<|user|>\nhi") + [257] + list(b"<|assistant|>\nyo") + [257]
    assert tokens.tolist() == expected  # ends with eos already: no extra separator
    assert mask.all()


def test_chat_assistant_only_byte_level_spans_are_exact(tmp_path):
    chat = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": "ok!"},
    ]
    write_jsonl(tmp_path / "data.jsonl", [{"conv": {"turns": chat}}])
    config = write_config(
        tmp_path, records={"kind": "chat", "field": "conv.turns"}, supervision="assistant_only"
    )
    ((tokens, mask),) = documents(prepare_config(config).path)
    supervised = [t for t, m in zip(tokens.tolist(), mask.tolist(), strict=True) if m]
    assert supervised == list(b"yo") + [257] + list(b"ok!") + [257]


# --- parquet ------------------------------------------------------------------------------------


def _parquet(path, columns: dict):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path, row_group_size=2)
    return path


def test_parquet_text(tmp_path):
    _parquet(tmp_path / "p/0.parquet", {"text": TEXTS, "other": list(range(len(TEXTS)))})
    config = write_config(tmp_path, source={"kind": "parquet", "paths": ["p/*.parquet"]})
    assert _texts_back(prepare_config(config).path) == [t.encode() for t in TEXTS]


def test_parquet_prompt_completion_full(tmp_path):
    _parquet(tmp_path / "pc.parquet", {"prompt": ["Q: a?", "Q: b?"], "completion": [" A", " B"]})
    config = write_config(
        tmp_path,
        source={"kind": "parquet", "paths": "pc.parquet"},
        records={"kind": "prompt_completion"},
    )
    docs = documents(prepare_config(config).path)
    assert [t.tolist() for t, _ in docs] == [byte_doc("Q: a? A"), byte_doc("Q: b? B")]
    assert all(m.all() for _, m in docs)


def test_parquet_pretokenized_with_provided_loss_mask(tmp_path):
    ids = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    masks = [[0, 0, 1, 1], [1, 0], [0, 1, 1]]
    _parquet(tmp_path / "t.parquet", {"input_ids": ids, "loss_mask": masks})
    config = write_config(
        tmp_path,
        source={"kind": "parquet", "paths": ["t.parquet"]},
        records={"kind": "tokens", "loss_mask_field": "loss_mask"},
        supervision="provided",
    )
    docs = documents(prepare_config(config).path)
    assert [t.tolist() for t, _ in docs] == [i + [257] for i in ids]
    # The eos separator is supervised like the document's last token.
    assert [m.astype(int).tolist() for _, m in docs] == [m + [m[-1]] for m in masks]


@pytest.mark.parametrize("kind", ["parquet", "huggingface"])
def test_batches_of_long_rows_are_cut_into_chunks_by_bytes(tmp_path, monkeypatch, kind):
    """An Arrow batch of up to 1024 rows was one chunk whatever its size, so a batch of long
    documents went to one worker while the others waited (a file of fewer rows: no
    parallelism at all). It is cut into chunks of about CHUNK_BYTES, as JSONL is; the
    artifact and the rows errors name stay the same."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    from turbo_dllm.data import sources
    from turbo_dllm.data.spec import load_prepare_spec

    texts = [f"{i:03d} " + "x" * 96 for i in range(50)]  # 100 bytes each
    pq.write_table(pa.table({"text": texts}), tmp_path / "a.parquet")
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(tmp_path / "ds"))
    source = {"kind": "parquet", "paths": ["a.parquet"]}
    if kind == "huggingface":
        source = {"kind": "huggingface", "path": "ds"}
    config = write_config(tmp_path, source=source)
    whole = prepare_config(config).manifest.fingerprint  # 50 rows, one chunk

    monkeypatch.setattr(sources, "CHUNK_BYTES", 1000)
    spec = load_prepare_spec(config)
    chunks = list(sources.open_source(spec.source, ["text"]).chunks())
    assert len(chunks) > 1
    assert max(sum(len(row["text"]) for row in chunk.items) for chunk in chunks) <= 1000
    assert [n for chunk in chunks for n in chunk.numbers] == list(range(50))
    assert sum(chunk.advance for chunk in chunks) == 50
    cut = prepare_config(config, ["workers=2", f"output.path={tmp_path / 'cut'}"])
    assert cut.manifest.fingerprint == whole
    assert _texts_back(cut.path) == [t.encode() for t in texts]

    texts[37] = None  # a bad row in a later chunk is named by its row in the file
    pq.write_table(pa.table({"text": texts}), tmp_path / "a.parquet")
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(tmp_path / "ds"))
    name = "a.parquet" if kind == "parquet" else "ds"
    with pytest.raises(DllmError, match=rf"\b{re.escape(name)} row 37: field 'text'"):
        prepare_config(config, [f"output.path={tmp_path / 'bad'}"])


# --- text ---------------------------------------------------------------------------------------


def test_text_by_document_and_by_line(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t/a.txt").write_text("line one\nline two\n\n", encoding="utf-8")
    (tmp_path / "t/b.txt").write_text("solo", encoding="utf-8")
    config = write_config(tmp_path, source={"kind": "text", "paths": ["t/*.txt"]})
    assert _texts_back(prepare_config(config).path) == [b"line one\nline two\n\n", b"solo"]
    config = write_config(
        tmp_path,
        source={"kind": "text", "paths": ["t/*.txt"], "unit": "line"},
        output={"path": "out", "overwrite": True},
    )
    assert _texts_back(prepare_config(config).path) == [b"line one", b"line two", b"solo"]


def test_gzipped_text_reads_the_same_by_document_and_by_line(tmp_path):
    import gzip

    (tmp_path / "t").mkdir()
    with gzip.open(tmp_path / "t/a.txt.gz", "wb") as handle:
        handle.write(b"line one\nline two\n")
    config = write_config(tmp_path, source={"kind": "text", "paths": ["t/*.txt.gz"]})
    assert _texts_back(prepare_config(config).path) == [b"line one\nline two\n"]
    config = write_config(
        tmp_path,
        source={"kind": "text", "paths": ["t/*.txt.gz"], "unit": "line"},
        output={"path": "out", "overwrite": True},
    )
    assert _texts_back(prepare_config(config).path) == [b"line one", b"line two"]


@pytest.mark.parametrize("kind", ["jsonl", "huggingface"])
def test_a_file_named_with_glob_characters(tmp_path, kind):
    """`corpus[v2].jsonl` exists but, read as a pattern, matches nothing: "no file matches"."""
    write_jsonl(tmp_path / "corpus[v2].jsonl", [{"text": t} for t in TEXTS])
    key = "paths" if kind == "jsonl" else "data_files"
    config = write_config(tmp_path, source={"kind": kind, key: ["corpus[v2].jsonl"]})
    assert _texts_back(prepare_config(config).path) == [t.encode() for t in TEXTS]


@pytest.mark.parametrize("gz", [False, True])
def test_text_with_a_byte_order_mark(tmp_path, gz):
    """A UTF-8 byte order mark (Windows Notepad writes one) became the first three tokens of
    the document (or of the file's first line); it is dropped as the JSONL reader drops it.
    One that is not at the start of the file is text like any other."""
    import gzip

    (tmp_path / "t").mkdir()
    data = b"\xef\xbb\xbfline one\r\n\xef\xbb\xbfline two\r\n"
    name = "t/a.txt.gz" if gz else "t/a.txt"
    (tmp_path / name).write_bytes(gzip.compress(data) if gz else data)
    (tmp_path / "t/b.txt").write_bytes(b"\xef\xbb\xbf")  # nothing else: an empty document
    config = write_config(tmp_path, source={"kind": "text", "paths": [name, "t/b.txt"]})
    result = prepare_config(config)
    assert _texts_back(result.path) == [b"line one\r\n\xef\xbb\xbfline two\r\n"]
    assert result.manifest.stats.empty_documents == 1
    config = write_config(
        tmp_path,
        source={"kind": "text", "paths": [name, "t/b.txt"], "unit": "line"},
        output={"path": "out", "overwrite": True},
    )
    assert _texts_back(prepare_config(config).path) == [b"line one", b"\xef\xbb\xbfline two"]


# --- token ids ----------------------------------------------------------------------------------


def test_token_ids_npy_bin_and_jsonl(tmp_path):
    np.save(tmp_path / "a.npy", np.array([1, 2, 0, 3, 4, 5, 0, 6], dtype=np.int32))
    np.save(tmp_path / "b.npy", np.array([[7, 8], [9, 10]], dtype=np.uint16))
    np.array([11, 12, 13], dtype="<u2").tofile(tmp_path / "c.bin")
    write_jsonl(tmp_path / "d.jsonl", [[14, 15], [16]])
    config = write_config(
        tmp_path,
        source={
            "kind": "token_ids",
            "paths": ["a.npy", "b.npy", "c.bin", "d.jsonl"],
            "dtype": "uint16",
            "document_separator_id": 0,
        },
    )
    result = prepare_config(config)
    docs = [t.tolist() for t, _ in documents(result.path)]
    expected = [[1, 2], [3, 4, 5], [6], [7, 8], [9, 10], [11, 12, 13], [14, 15], [16]]
    assert docs == [d + [257] for d in expected]
    assert result.manifest.source.kind == "token_ids"


def test_token_ids_separator_at_the_start_or_end_of_a_file(tmp_path):
    """Files that end every document with the separator (or start every one with it) are
    the usual layout; the separator at the file's end (or start) made an empty document: one
    more record per file and 'dropped: 1 empty' in every summary."""
    eos = 257
    np.array([1, 2, eos, 3, eos], dtype="<u2").tofile(tmp_path / "a.bin")  # after every one
    np.save(tmp_path / "b.npy", np.array([eos, 4, eos, 5, 6], dtype=np.int32))  # before
    np.save(tmp_path / "c.npy", np.array([7, eos, eos, 8, eos], dtype=np.int64))  # one empty
    config = write_config(
        tmp_path,
        source={
            "kind": "token_ids",
            "paths": ["a.bin", "b.npy", "c.npy"],
            "dtype": "uint16",
            "document_separator_id": eos,
        },
    )
    result = prepare_config(config)
    docs = [t.tolist() for t, _ in documents(result.path)]
    assert docs == [[1, 2, eos], [3, eos], [4, eos], [5, 6, eos], [7, eos], [8, eos]]
    stats = result.manifest.stats
    assert (stats.records, stats.documents, stats.empty_documents) == (7, 6, 1)


# --- huggingface --------------------------------------------------------------------------------


def test_huggingface_save_to_disk_dataset_and_dict(tmp_path):
    import datasets

    rows = {"text": TEXTS, "n": list(range(len(TEXTS)))}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "ds"))
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(rows),
            "test": datasets.Dataset.from_dict({"text": ["t"], "n": [0]}),
        }
    ).save_to_disk(str(tmp_path / "dd"))
    config = write_config(tmp_path, source={"kind": "huggingface", "path": "ds"})
    result = prepare_config(config)
    assert _texts_back(result.path) == [t.encode() for t in TEXTS]
    assert result.manifest.source.dataset["num_rows"] == len(TEXTS)
    assert "fingerprint" in result.manifest.source.dataset
    config = write_config(
        tmp_path,
        source={"kind": "huggingface", "path": "dd", "split": "test", "streaming": True},
        output={"path": "out2"},
    )
    assert _texts_back(prepare_config(config).path) == [b"t"]


def test_huggingface_split_of_a_single_saved_dataset(cli, tmp_path):
    """A folder of one Dataset has no splits: `split: test` read all of it, silently."""
    import datasets

    datasets.Dataset.from_dict({"text": TEXTS}).save_to_disk(str(tmp_path / "ds"))
    source = {"kind": "huggingface", "path": "ds", "split": "test"}
    result = cli("data", "prepare", "--config", write_config(tmp_path, source=source))
    assert_user_error(result, "split 'test'", "one dataset without splits", "source.split")
    assert not (tmp_path / "out").exists()
    # The default split (also written out) reads it, as before.
    source["split"] = "train"
    result = prepare_config(write_config(tmp_path, source=source))
    assert _texts_back(result.path) == [t.encode() for t in TEXTS]


def test_huggingface_local_data_files_json_builder(tmp_path):
    write_jsonl(tmp_path / "f/x.jsonl", [{"body": t} for t in TEXTS])
    config = write_config(
        tmp_path,
        source={"kind": "huggingface", "data_files": ["f/*.jsonl"]},
        records={"kind": "text", "field": "body"},
    )
    result = prepare_config(config)
    assert _texts_back(result.path) == [t.encode() for t in TEXTS]
    assert result.manifest.source.dataset["builder"] == "json"
    assert [f.name for f in result.manifest.source.files] == ["x.jsonl"]


@pytest.mark.parametrize("streaming", [False, True])
def test_huggingface_chat_records(tmp_path, streaming):
    import datasets

    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    datasets.Dataset.from_list([{"messages": chat}, {"messages": chat}]).save_to_disk(
        str(tmp_path / "ds")
    )
    config = write_config(
        tmp_path,
        source={"kind": "huggingface", "path": "ds", "streaming": streaming},
        records={"kind": "chat"},
        supervision="assistant_only",
    )
    docs = documents(prepare_config(config).path)
    assert len(docs) == 2
    assert [t for t, m in zip(*docs[0], strict=True) if m] == [ord("a"), 257]


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("saved_format", ["numpy", "torch", "pandas"])
def test_huggingface_dataset_saved_with_a_format(tmp_path, saved_format, streaming):
    """A dataset saved after set_format is read as plain values: its rows came as numpy
    arrays, torch tensors or a DataFrame, and every chat or token record was a bad one."""
    import datasets

    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    saved = datasets.Dataset.from_list(
        [
            {"messages": chat, "input_ids": [1, 2, 3], "text": "hi"},
            {"messages": chat, "input_ids": [4], "text": "yo"},
        ]
    )
    saved.set_format(saved_format)
    saved.save_to_disk(str(tmp_path / "ds"))
    source = {"kind": "huggingface", "path": "ds", "streaming": streaming}
    config = write_config(
        tmp_path, source=source, records={"kind": "chat"}, supervision="assistant_only"
    )
    docs = documents(prepare_config(config).path)
    assert [[t for t, m in zip(*doc, strict=True) if m] for doc in docs] == [[ord("a"), 257]] * 2
    config = write_config(
        tmp_path, source=source, records={"kind": "tokens"}, output={"path": "ids"}
    )
    assert [t.tolist() for t, _ in documents(prepare_config(config).path)] == [
        [1, 2, 3, 257],
        [4, 257],
    ]
    config = write_config(tmp_path, source=source, output={"path": "text"})
    assert _texts_back(prepare_config(config).path) == [b"hi", b"yo"]


def test_jsonl_with_a_byte_order_mark_and_crlf_lines(tmp_path):
    (tmp_path / "data.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "one"}\r\n{"text": "two"}\r\n')
    assert _texts_back(prepare_config(write_config(tmp_path)).path) == [b"one", b"two"]


@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("d.jsonl", {"kind": "jsonl"}),
        ("d.jsonl.gz", {"kind": "jsonl"}),
        ("d.txt", {"kind": "text", "unit": "document"}),
        ("d.txt.gz", {"kind": "text", "unit": "line"}),
        ("d.jsonl", {"kind": "token_ids"}),
    ],
)
def test_source_files_are_hashed_as_they_are_read(tmp_path, monkeypatch, name, source):
    """Provenance read every source file a second time, after tokenizing, to hash it: twice
    the reading for a large corpus. Files read whole are hashed as they are read; the
    manifest holds the same name, size and sha256 as before."""
    import gzip
    import hashlib
    import json

    import turbo_dllm.data.sources as sources

    body = (
        "".join(json.dumps([65 + i, 66]) + "\n" for i in range(50))
        if source["kind"] == "token_ids"
        else "".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(50))
    ).encode()
    data = gzip.compress(body) if name.endswith(".gz") else body
    (tmp_path / name).write_bytes(data)
    opened: list[str] = []

    def counting_open(file, *args, **kwargs):
        opened.append(str(file))
        return open(file, *args, **kwargs)

    monkeypatch.setattr(sources, "open", counting_open, raising=False)
    result = prepare_config(write_config(tmp_path, source={**source, "paths": [name]}))
    assert opened == [str(tmp_path / name)]
    (entry,) = result.manifest.source.files
    assert (entry.name, entry.bytes, entry.sha256) == (
        name,
        len(data),
        hashlib.sha256(data).hexdigest(),
    )
