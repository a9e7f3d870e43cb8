"""Bad input: clear errors naming the record, on_error: skip counts, never a partial artifact."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest

from tests.data.helpers import (
    documents,
    leftovers,
    prepare_config,
    write_config,
    write_jsonl,
)
from tests.helpers import assert_user_error
from turbo_dllm.data.artifact import verify
from turbo_dllm.errors import DllmError


def _prepare_fails(cli, config, *needles):
    result = cli("data", "prepare", "--config", config)
    assert_user_error(result, *needles)
    folder = config.parent
    assert not (folder / "out").exists()
    assert leftovers(folder) == []
    return result


def test_malformed_json_names_file_and_line(cli, tmp_path):
    (tmp_path / "data.jsonl").write_text('{"text": "ok"}\n\n{"text": "a" "b"}\n{"text": "c"}\n')
    _prepare_fails(cli, write_config(tmp_path), "data.jsonl:3: malformed JSON", "on_error: skip")


@pytest.mark.parametrize("ending", ["\n", "\r\n"])
def test_a_line_cut_short_is_described_by_its_own_text(cli, tmp_path, ending):
    # A line ends in its newline, which is not part of the record: a string cut short was
    # 'Invalid control character' (the newline), and a value cut short after
    # its key 'Expecting value (column 1)' (a column of the line after the newline).
    (tmp_path / "data.jsonl").write_text(
        '{"text": "a"}' + ending + '{"text": "cut' + ending + '{"text":' + ending,
        newline="",
    )
    _prepare_fails(cli, write_config(tmp_path), "data.jsonl:2: malformed JSON: Unterminated string")
    (tmp_path / "data.jsonl").write_text('{"text": "a"}' + ending + '{"text":' + ending, newline="")
    _prepare_fails(
        cli, write_config(tmp_path), "data.jsonl:2: malformed JSON: Expecting value (column 9)"
    )


def test_on_error_skip_counts_every_reason(tmp_path):
    (tmp_path / "data.jsonl").write_text(
        '{"text": "good"}\n'
        "not json\n"
        '{"txt": "missing"}\n'
        '{"text": 5}\n'
        "[1, 2]\n"
        '{"text": "also good"}\n'
    )
    result = prepare_config(write_config(tmp_path, on_error="skip"))
    stats = result.manifest.stats
    assert stats.skipped == {"bad_field": 1, "malformed_json": 2, "missing_field": 1}
    assert (stats.records, stats.documents) == (6, 2)


def test_missing_field_names_the_path_and_the_keys(cli, tmp_path):
    write_jsonl(tmp_path / "data.jsonl", [{"meta": {"title": "t"}}])
    config = write_config(tmp_path, records={"kind": "text", "field": "meta.body"})
    _prepare_fails(cli, config, "data.jsonl:1", "missing field 'meta.body'", "keys: title")


def test_parquet_without_the_field_lists_its_columns(cli, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["a"], "id": [1]}), tmp_path / "t.parquet")
    config = write_config(tmp_path, source={"kind": "parquet", "paths": ["t.parquet"]})
    _prepare_fails(cli, config, "t.parquet row 0", "missing field 'text'", "keys: body, id")


def test_parquet_with_one_of_two_fields_lists_all_its_columns(cli, tmp_path):
    """prompt_field is a column, completion_field is not: the error lists every column (the
    misnamed one is among them), not only the columns that were read ('keys: question')."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = {"question": ["q"], "answer": ["a"], "id": [1]}
    pq.write_table(pa.table(table), tmp_path / "t.parquet")
    config = write_config(
        tmp_path,
        source={"kind": "parquet", "paths": ["t.parquet"]},
        records={
            "kind": "prompt_completion",
            "prompt_field": "question",
            "completion_field": "answr",
        },
    )
    _prepare_fails(cli, config, "missing field 'answr'", "keys: answer, id, question")


def test_a_misspelt_records_field_is_named_as_the_likely_fix(cli, tmp_path):
    """`records.field: txt` over records holding `text`: the hint said only "fix that record"
    (every record lacks it); it names the spec field and the close key."""
    write_jsonl(tmp_path / "data.jsonl", [{"meta": {"body": "b"}}])
    config = write_config(tmp_path, records={"kind": "text", "field": "meta.bdy"})
    _prepare_fails(
        cli, config, "missing field 'meta.bdy'", "did you mean records.field: meta.body?"
    )
    write_jsonl(tmp_path / "data.jsonl", [{"question": "q", "answer": "a"}])
    records = {"kind": "prompt_completion", "prompt_field": "question", "completion_field": "answr"}
    config = write_config(tmp_path, records=records)
    _prepare_fails(cli, config, "did you mean records.completion_field: answer?")
    config = write_config(tmp_path, records={"kind": "text", "field": "zzz"})
    result = _prepare_fails(cli, config, "missing field 'zzz'", "hint: fix that record")
    assert "did you mean" not in result.err


def test_empty_result_is_an_error(cli, tmp_path):
    (tmp_path / "data.jsonl").write_text('{"text": ""}\n\n')
    _prepare_fails(cli, write_config(tmp_path), "no documents")
    (tmp_path / "data.jsonl").write_text('{"x": 1}\n')
    _prepare_fails(cli, write_config(tmp_path, on_error="skip"), "no documents", "missing_field 1")


def test_chat_without_assistant_turn_under_assistant_only(cli, tmp_path, hf_tokenizer):
    write_jsonl(tmp_path / "data.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}])
    config = write_config(tmp_path, records={"kind": "chat"}, supervision="assistant_only")
    _prepare_fails(cli, config, "data.jsonl:1", "no assistant")
    config = write_config(
        tmp_path,
        records={"kind": "chat"},
        supervision="assistant_only",
        tokenizer={"kind": "huggingface", "path": str(hf_tokenizer)},
    )
    _prepare_fails(cli, config, "data.jsonl:1", "no assistant turn")


def test_a_chat_message_without_a_role_says_it_has_none(cli, tmp_path):
    # It read 'messages.1.role must be a string, got None', as if the role were null.
    chat = [{"role": "user", "content": "q"}, {"content": "a"}]
    write_jsonl(tmp_path / "data.jsonl", [{"messages": chat}, {"messages": chat[:1]}])
    config = write_config(tmp_path, records={"kind": "chat"})
    result = _prepare_fails(cli, config, "data.jsonl:1: messages.1 has no 'role' (keys: content)")
    assert "got None" not in result.err
    result = prepare_config(write_config(tmp_path, records={"kind": "chat"}, on_error="skip"))
    assert result.manifest.stats.skipped == {"missing_field": 1}


def test_template_without_generation_markers_is_refused(cli, tmp_path, hf_tokenizer_plain_template):
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    write_jsonl(tmp_path / "data.jsonl", [{"messages": chat}])
    tokenizer = {"kind": "huggingface", "path": str(hf_tokenizer_plain_template)}
    config = write_config(
        tmp_path, records={"kind": "chat"}, supervision="assistant_only", tokenizer=tokenizer
    )
    _prepare_fails(cli, config, "{% generation %}", "never guesses")
    # The same template is fine for full supervision.
    config = write_config(tmp_path, records={"kind": "chat"}, tokenizer=tokenizer)
    assert cli("data", "prepare", "--config", config).code == 0


def test_tokenizer_without_mask_token(cli, tmp_path, hf_tokenizer_no_mask):
    write_jsonl(tmp_path / "data.jsonl", [{"text": "hello"}])
    tokenizer = {"kind": "huggingface", "path": str(hf_tokenizer_no_mask)}
    _prepare_fails(cli, write_config(tmp_path, tokenizer=tokenizer), "has no mask token")
    # A spare id past the vocabulary works and widens the artifact's vocab.
    result = prepare_config(write_config(tmp_path, tokenizer={**tokenizer, "mask_token_id": 1000}))
    assert result.manifest.special_tokens["mask"] == 1000
    assert result.manifest.vocab_size == 1001


def test_tokenizer_folder_without_tokenizer_files_is_refused(cli, tmp_path):
    """A model folder's config.json alone loads in AutoTokenizer as a near-empty tokenizer
    (every text encodes to nothing): refused, naming the folder and the missing files."""
    write_jsonl(tmp_path / "data.jsonl", [{"text": "hello"}])
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "qwen2"}')
    tokenizer = {"kind": "huggingface", "path": str(folder), "mask_token_id": 5}
    _prepare_fails(
        cli,
        write_config(tmp_path, tokenizer=tokenizer),
        f"the tokenizer folder {str(folder)!r} has no tokenizer files",
        "tokenizer.json, tokenizer.model, vocab.json, vocab.txt",
    )
    tokenizer["path"] = str(folder / "config.json")
    _prepare_fails(cli, write_config(tmp_path, tokenizer=tokenizer), "is a file, not a folder")


def test_token_ids_outside_the_vocab_or_equal_to_mask(cli, tmp_path):
    write_jsonl(tmp_path / "data.jsonl", [[1, 2], [3, 300]])
    config = write_config(tmp_path, source={"kind": "token_ids", "paths": ["data.jsonl"]})
    _prepare_fails(cli, config, "data.jsonl:2", "token id 300 is outside the vocabulary (0..259)")
    np.save(tmp_path / "ids.npy", np.array([[1, 2], [259, 4]]))
    config = write_config(tmp_path, source={"kind": "token_ids", "paths": ["ids.npy"]})
    _prepare_fails(cli, config, "ids.npy row 1", "mask token")


def test_a_globbed_bin_file_without_dtype_asks_for_it(cli, tmp_path):
    """The spec check sees only `ids/*`, not the .bin it matches: reading it said "not a whole
    number of None ids (8 bytes each)" (or "got float64"), never which field to set."""
    (tmp_path / "ids").mkdir()
    np.array([1, 2, 3], dtype="<u4").tofile(tmp_path / "ids/a.bin")
    config = write_config(tmp_path, source={"kind": "token_ids", "paths": ["ids/*"]})
    result = _prepare_fails(cli, config, "a.bin: a .bin token file needs its element type")
    assert "source.dtype" in result.err and "None" not in result.err


def test_token_ids_past_the_tokenizer_but_below_a_far_mask_id_are_refused(
    cli, tmp_path, hf_tokenizer
):
    """A mask_token_id past the tokenizer widens the artifact's vocab_size to cover it; the ids
    in between belong to no token and were accepted (decoded as nothing)."""
    from transformers import AutoTokenizer

    known = max(AutoTokenizer.from_pretrained(str(hf_tokenizer)).get_vocab().values()) + 1
    np.save(tmp_path / "ids.npy", np.array([[10, 11], [12, known + 5]]))
    tokenizer = {"kind": "huggingface", "path": str(hf_tokenizer), "mask_token_id": 1000}
    config = write_config(
        tmp_path, source={"kind": "token_ids", "paths": ["ids.npy"]}, tokenizer=tokenizer
    )
    _prepare_fails(cli, config, "ids.npy row 1", f"token id {known + 5} is outside the vocabulary")


def test_pretokenized_records_with_bad_ids(cli, tmp_path):
    (tmp_path / "data.jsonl").write_text(
        '{"input_ids": [1, 2]}\n{"input_ids": [1, 1180591620717411303424]}\n'
        '{"input_ids": [1, "a"]}\n{"input_ids": [-1]}\n'
    )
    config = write_config(tmp_path, records={"kind": "tokens"}, on_error="skip")
    stats = prepare_config(config).manifest.stats
    assert stats.skipped == {"bad_field": 1, "token_out_of_range": 2}
    assert stats.documents == 1


def test_too_long_documents_under_reject(cli, tmp_path):
    write_jsonl(tmp_path / "data.jsonl", [{"text": "ok"}, {"text": "x" * 80}])
    config = write_config(tmp_path, packing={"seq_len": 64, "block_size": 8, "overflow": "reject"})
    _prepare_fails(cli, config, "data.jsonl:2", "81 tokens", "packing.overflow")


def test_bad_files(cli, tmp_path):
    config = write_config(tmp_path, source={"kind": "jsonl", "paths": ["nothing/*.jsonl"]})
    _prepare_fails(cli, config, "no file matches")
    (tmp_path / "bad.txt").write_bytes(b"ok\xff\xfe")
    config = write_config(tmp_path, source={"kind": "text", "paths": ["bad.txt"]})
    _prepare_fails(cli, config, "bad.txt", "not UTF-8")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 nope")
    config = write_config(tmp_path, source={"kind": "parquet", "paths": ["bad.parquet"]})
    _prepare_fails(cli, config, "bad.parquet", "not a readable parquet file")
    config = write_config(tmp_path, source={"kind": "huggingface", "path": "no-such-folder"})
    _prepare_fails(cli, config, "dataset folder not found")


def test_a_data_file_given_as_a_dataset_folder_is_named_as_a_file(cli, tmp_path):
    # source.path: train.parquet (one file, where data_files reads it) read 'dataset folder
    # not found' for a file that is there.
    (tmp_path / "train.parquet").write_bytes(b"PAR1")
    config = write_config(tmp_path, source={"kind": "huggingface", "path": "train.parquet"})
    result = _prepare_fails(cli, config, "train.parquet' is a file, not a dataset folder")
    assert "not found" not in result.err
    assert "source.data_files" in result.err


def test_text_that_is_not_utf8_is_a_bad_record(cli, tmp_path):
    (tmp_path / "a.txt").write_bytes(b"hello\n\xff\xfe world\nthird\r\n")
    (tmp_path / "b.txt").write_bytes(b"fine")
    lines = {"kind": "text", "paths": ["a.txt"], "unit": "line"}
    _prepare_fails(cli, write_config(tmp_path, source=lines), "a.txt:2: not UTF-8", "skip")
    # Like a malformed JSON line, it is skipped and counted under on_error: skip.
    result = prepare_config(write_config(tmp_path, source=lines, on_error="skip"))
    assert result.manifest.stats.skipped == {"bad_text": 1}
    assert [bytes(t[:-1].tolist()) for t, _ in documents(result.path)] == [b"hello", b"third"]
    files = {"kind": "text", "paths": ["*.txt"]}
    config = write_config(tmp_path, source=files, on_error="skip", output={"path": "o2"})
    result = prepare_config(config)
    assert result.manifest.stats.skipped == {"bad_text": 1}
    assert [bytes(t[:-1].tolist()) for t, _ in documents(result.path)] == [b"fine"]


def test_existing_output_needs_overwrite(cli, tmp_path):
    write_jsonl(tmp_path / "data.jsonl", [{"text": "one"}])
    config = write_config(tmp_path)
    assert cli("data", "prepare", "--config", config).code == 0
    assert_user_error(cli("data", "prepare", "--config", config), "already exists", "overwrite")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine/notes.txt").write_text("precious")
    other = write_config(tmp_path, "p2.yaml", output={"path": "mine", "overwrite": True})
    assert_user_error(cli("data", "prepare", "--config", other), "not a data artifact")
    assert (tmp_path / "mine/notes.txt").read_text() == "precious"
    # Without overwrite the same folder is refused for what it is: the hint to set
    # output.overwrite only led to the error above.
    other = write_config(tmp_path, "p3.yaml", output={"path": "mine"})
    result = cli("data", "prepare", "--config", other)
    assert_user_error(result, "not a data artifact", "choose another output.path")
    assert "overwrite" not in result.err


def test_overwrite_replaces_an_artifact_whose_manifest_is_damaged(cli, tmp_path):
    """An artifact whose manifest.json was cut short was "a non-empty folder that is not a data
    artifact" even with output.overwrite: true, so it had to be deleted by hand. A folder that
    holds only an artifact's files, an array among them, is ours to replace; one that holds
    anything else, or a manifest of another format, is still refused and kept."""
    write_jsonl(tmp_path / "data.jsonl", [{"text": "one"}])
    config = write_config(tmp_path)
    fingerprint = prepare_config(config).manifest.fingerprint
    manifest = tmp_path / "out/manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:40])
    # Without overwrite: refused as the artifact it is, with the way to replace it.
    result = cli("data", "prepare", "--config", config)
    assert_user_error(result, "already exists", "manifest.json is not valid JSON", "overwrite")
    config = write_config(tmp_path, output={"path": "out", "overwrite": True})
    assert cli("data", "prepare", "--config", config).code == 0
    assert verify(tmp_path / "out").fingerprint == fingerprint
    assert leftovers(tmp_path) == []
    # Not ours: a damaged manifest beside a file no artifact holds, a manifest alone, or a
    # readable manifest of something else beside an array's name.
    for name, files in [
        ("a", {"manifest.json": b"{", "tokens.bin": b"", "notes.txt": b"precious"}),
        ("b", {"manifest.json": b"{"}),
        ("c", {"manifest.json": b'{"format": "other"}', "tokens.bin": b"precious"}),
    ]:
        (tmp_path / name).mkdir()
        for file, data in files.items():
            (tmp_path / name / file).write_bytes(data)
        other = write_config(tmp_path, "p2.yaml", output={"path": name, "overwrite": True})
        result = cli("data", "prepare", "--config", other)
        assert_user_error(result, "not a data artifact")
        assert {p.name: p.read_bytes() for p in (tmp_path / name).iterdir()} == files


@pytest.mark.parametrize("kind", ["text", "huggingface"])
def test_a_rerun_does_not_read_the_artifact_it_replaces(cli, tmp_path, kind):
    """A source pattern that reaches into output.path (text `data/**/*`, data_files
    `data/**/*.json` with output `data/prepared`) read the last run's manifest.json and
    tokenizer files as documents: every rerun of the same config made another artifact."""
    from tests.data.conftest import CORPUS

    (tmp_path / "data").mkdir()
    for i, text in enumerate(CORPUS[:5]):
        (tmp_path / f"data/{i}.json").write_text(json.dumps({"text": text}))
    source = {"kind": "text", "paths": ["data/**/*"]}
    if kind == "huggingface":
        source = {"kind": "huggingface", "data_files": ["data/**/*.json"]}
    config = write_config(
        tmp_path, source=source, output={"path": "data/prepared", "overwrite": True}
    )
    first = prepare_config(config).manifest
    again = prepare_config(config).manifest
    assert again.fingerprint == first.fingerprint
    assert [f.name for f in again.source.files] == [f"{i}.json" for i in range(5)]
    # A pattern that matches nothing else, or a file of the artifact named outright.
    for paths in (["data/prepared/*"], ["data/prepared/manifest.json"]):
        source = {"kind": "text", "paths": paths}
        if kind == "huggingface":
            source = {"kind": "huggingface", "data_files": paths, "name": "json"}
        other = write_config(
            tmp_path, source=source, output={"path": "data/prepared", "overwrite": True}
        )
        result = cli("data", "prepare", "--config", other)
        assert_user_error(result, "inside output.path", "the artifact this job replaces")
    assert verify(tmp_path / "data/prepared").fingerprint == first.fingerprint


def test_output_path_through_a_file_names_the_file(cli, tmp_path):
    write_jsonl(tmp_path / "data.jsonl", [{"text": "one"}])
    (tmp_path / "afile").write_text("x")
    for output in ("afile/sub", "afile/sub/deeper"):
        config = write_config(tmp_path, output={"path": output})
        result = cli("data", "prepare", "--config", config)
        assert_user_error(result, f"goes through {str(tmp_path / 'afile')!r}", "not a folder")
    assert (tmp_path / "afile").read_text() == "x"
    assert leftovers(tmp_path) == []
    # The file itself as the output: refused, with what to do (it had no hint).
    result = cli("data", "prepare", "--config", write_config(tmp_path, output={"path": "afile"}))
    assert_user_error(result, "exists and is not a folder", "hint: choose another output.path")
    assert (tmp_path / "afile").read_text() == "x"


def test_a_gzip_file_cut_short_is_named_with_what_to_do(cli, tmp_path):
    import gzip

    whole = gzip.compress(b'{"text": "one"}\n' * 1000)
    (tmp_path / "data.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    config = write_config(tmp_path, source={"kind": "jsonl", "paths": ["data.jsonl.gz"]})
    _prepare_fails(cli, config, "data.jsonl.gz: cannot read", "hint:", "gzip -t")
    (tmp_path / "a.txt.gz").write_bytes(whole[: len(whole) // 2])
    config = write_config(tmp_path, source={"kind": "text", "paths": ["a.txt.gz"]})
    _prepare_fails(cli, config, "a.txt.gz: cannot read", "hint:", "gzip -t")


def test_failed_overwrite_keeps_the_old_artifact(cli, tmp_path):
    write_jsonl(tmp_path / "data.jsonl", [{"text": "one"}])
    config = write_config(tmp_path, output={"path": "out", "overwrite": True})
    before = prepare_config(config).manifest.fingerprint
    (tmp_path / "data.jsonl").write_text('{"text": "two"}\n{broken\n')
    assert_user_error(cli("data", "prepare", "--config", config), "data.jsonl:2")
    assert verify(tmp_path / "out").fingerprint == before
    assert leftovers(tmp_path) == []
    (tmp_path / "data.jsonl").write_text('{"text": "two"}\n')
    after = prepare_config(config).manifest.fingerprint
    assert after != before and verify(tmp_path / "out").fingerprint == after
    assert leftovers(tmp_path) == []


def test_interrupt_midway_leaves_nothing(tmp_path, monkeypatch):
    import turbo_dllm.data.packing as packing

    write_jsonl(tmp_path / "data.jsonl", [{"text": "x" * 50}] * 20)
    calls = {"n": 0}
    original = packing.Packer._flush

    def flaky(self, rows):
        calls["n"] += 1
        if calls["n"] == 1:
            original(self, rows)  # some rows are already on disk in staging
            raise KeyboardInterrupt
        return original(self, rows)

    monkeypatch.setattr(packing.Packer, "_flush", flaky)
    with pytest.raises(KeyboardInterrupt):
        prepare_config(write_config(tmp_path))
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def _worker_config():
    from turbo_dllm.data.pipeline import WorkerConfig
    from turbo_dllm.data.spec import ByteLevelTokenizerSpec, TextRecords
    from turbo_dllm.data.tokenizers import ByteLevelTokenizer

    return WorkerConfig(
        tokenizer=ByteLevelTokenizerSpec(kind="byte_level"),
        records=TextRecords(kind="text"),
        supervision="full",
        seq_len=64,
        overflow="split",
        separator="eos",
        prepend_bos=False,
        special_tokens=ByteLevelTokenizer.special_tokens,
        vocab_size=ByteLevelTokenizer.vocab_size,
        token_dtype="uint16",
        on_error="stop",
    )


def test_ctrl_c_is_handled_by_the_parent_alone_with_several_workers():
    """Ctrl-C reaches every process of the group: each worker printed a KeyboardInterrupt
    traceback above `dllm: interrupted`. Workers ignore it; the parent ends the pool."""
    from turbo_dllm.data.pipeline import TokenizePool

    # Python's own handler, or SIG_IGN where the suite runs as a shell's background job (a
    # non-interactive shell starts those ignoring SIGINT): the parent's stays whichever it is.
    before = signal.getsignal(signal.SIGINT)
    with TokenizePool(_worker_config(), 2) as pool:
        handlers = [pool._pool.apply(signal.getsignal, (signal.SIGINT,)) for _ in range(4)]
    assert handlers == [signal.SIG_IGN] * 4
    assert signal.getsignal(signal.SIGINT) is before


_MASK_AT_START: set = set()


def _init_recording_the_mask(config) -> None:
    from turbo_dllm.data import pipeline

    _MASK_AT_START.update(signal.pthread_sigmask(signal.SIG_BLOCK, []))
    pipeline._REAL_INIT(config)


def _masks() -> tuple[set, set]:
    return _MASK_AT_START, set(signal.pthread_sigmask(signal.SIG_BLOCK, []))


def test_workers_take_sigint_and_sigterm_only_once_their_handlers_are_set(monkeypatch):
    """A SIGTERM that reached a worker between its fork and its initializer was dropped (the C
    handler took it; the disposition then became SIG_DFL before Python ran the handler): that
    worker outlived terminate() and `dllm data prepare` waited for it forever (seen in a test
    run on a loaded host). Workers now start with both blocked and unblock them once set."""
    from turbo_dllm.data import pipeline

    monkeypatch.setattr(pipeline, "_REAL_INIT", pipeline._init_worker, raising=False)
    monkeypatch.setattr(pipeline, "_init_worker", _init_recording_the_mask)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with pipeline.TokenizePool(_worker_config(), 2) as pool:
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before  # the parent's, as it was
        for at_start, now in [pool._pool.apply(_masks) for _ in range(4)]:
            assert {signal.SIGINT, signal.SIGTERM} <= at_start
            assert not {signal.SIGINT, signal.SIGTERM} & now


def test_leftovers_of_a_killed_job_are_recovered(tmp_path):
    write_jsonl(tmp_path / "data.jsonl", [{"text": "one"}])
    config = write_config(tmp_path, output={"path": "out", "overwrite": True})
    fingerprint = prepare_config(config).manifest.fingerprint
    # Killed between "move the old artifact aside" and "move the new one in":
    (tmp_path / "out").rename(tmp_path / ".out.backup-abc")
    (tmp_path / ".out.staging-def").mkdir()
    (tmp_path / ".out.staging-def/tokens.bin").write_bytes(b"partial")
    (tmp_path / "data.jsonl").write_text("{broken\n")
    with pytest.raises(DllmError):
        prepare_config(config)
    # The backup was restored as the artifact and the stale staging folder removed.
    assert verify(tmp_path / "out").fingerprint == fingerprint
    assert leftovers(tmp_path) == []


def test_leftovers_are_found_when_the_output_name_has_glob_characters(tmp_path):
    """The leftovers were found by a glob of the output name: `out[v2]` matched none of its own
    (the killed job's backup stayed hidden, no artifact), and `out*` matched other outputs'."""
    write_jsonl(tmp_path / "data.jsonl", [{"text": "one"}])
    config = write_config(tmp_path, output={"path": "out[v2]", "overwrite": True})
    fingerprint = prepare_config(config).manifest.fingerprint
    (tmp_path / "out[v2]").rename(tmp_path / ".out[v2].backup-abc")
    (tmp_path / ".out[v2].staging-def").mkdir()
    (tmp_path / ".outv.staging-other").mkdir()  # another output's, which is not ours to remove
    (tmp_path / "data.jsonl").write_text("{broken\n")
    with pytest.raises(DllmError):
        prepare_config(config)
    assert verify(tmp_path / "out[v2]").fingerprint == fingerprint
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [
        ".outv.staging-other"
    ]


def test_hub_dataset_without_network_is_a_clear_error(cli_process, tmp_path):
    config = write_config(tmp_path, source={"kind": "huggingface", "name": "someone/no-such-set"})
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    result = cli_process("data", "prepare", "--config", config, env=env, timeout=120)
    assert_user_error(result, "cannot load the dataset 'someone/no-such-set'", "network")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("streaming", [False, True])
def test_huggingface_data_files_that_are_all_empty(cli, tmp_path, streaming):
    """Empty data files made the json builder stop with a bare `StopIteration: ` (streaming or
    not) and the csv builder with "An error occurred while generating the dataset": the error
    now names the files and says they are empty."""
    (tmp_path / "f").mkdir()
    (tmp_path / "f/a.jsonl").write_bytes(b"")
    (tmp_path / "f/b.jsonl").write_bytes(b"\n \n")
    source = {"kind": "huggingface", "data_files": ["f/*.jsonl"], "streaming": streaming}
    result = _prepare_fails(cli, write_config(tmp_path, source=source), "are all empty")
    assert "a.jsonl" in result.err and "b.jsonl" in result.err
    assert "StopIteration" not in result.err
    (tmp_path / "f/c.csv").write_bytes(b"")
    source = {"kind": "huggingface", "data_files": ["f/c.csv"], "streaming": streaming}
    _prepare_fails(cli, write_config(tmp_path, source=source), "c.csv' is empty")


def test_huggingface_empty_data_file_beside_others_is_left_out(tmp_path):
    """One empty CSV among others failed the whole load ("An error occurred while generating
    the dataset"); it holds no records, so the others are read and it stays in provenance."""
    (tmp_path / "f").mkdir()
    (tmp_path / "f/a.csv").write_bytes(b"")
    (tmp_path / "f/b.csv").write_text("text\nhello\nworld\n")
    source = {"kind": "huggingface", "data_files": ["f/*.csv"]}
    result = prepare_config(write_config(tmp_path, source=source))
    assert [bytes(t[:-1].tolist()) for t, _ in documents(result.path)] == [b"hello", b"world"]
    assert [f.name for f in result.manifest.source.files] == ["a.csv", "b.csv"]


def test_huggingface_data_files_without_rows(cli, tmp_path):
    """A CSV with only its header gave `ValueError: Instruction "train" corresponds to no
    data!`; the error now says the files hold no records. Another failure of a builder names
    its cause, not only "An error occurred while generating the dataset"."""
    (tmp_path / "h.csv").write_text("text\n")
    source = {"kind": "huggingface", "data_files": ["h.csv"]}
    _prepare_fails(cli, write_config(tmp_path, source=source), "h.csv' holds no records")
    (tmp_path / "h.csv").write_text('text\nhello\n"unterminated\n')
    _prepare_fails(cli, write_config(tmp_path, source=source), "caused by ParserError")


def test_huggingface_load_error_hint_fits_the_source(cli, tmp_path):
    """Every failed load hinted that "Hub datasets need network access", also for local files
    and save_to_disk folders, where the network has nothing to do with it."""
    (tmp_path / "h.csv").write_text('text\nhello\n"unterminated\n')
    source = {"kind": "huggingface", "data_files": ["h.csv"]}
    result = _prepare_fails(cli, write_config(tmp_path, source=source), "h.csv' (csv builder)")
    assert "are csv files (source.name sets the builder)" in result.err
    assert "network" not in result.err and "Hub" not in result.err
    (tmp_path / "ds").mkdir()  # not a save_to_disk folder (one cut short by a failed copy)
    (tmp_path / "ds/state.json").write_text("{")
    source = {"kind": "huggingface", "path": "ds"}
    result = _prepare_fails(cli, write_config(tmp_path, source=source), "ds': FileNotFound")
    assert "written by Dataset.save_to_disk" in result.err
    assert "network" not in result.err and "Hub" not in result.err


def test_mask_token_id_past_uint32_is_refused(cli, tmp_path, hf_tokenizer_no_mask):
    """mask_token_id 2**32 made an artifact with uint32 tokens and vocab_size 2**32 + 1 (its
    mask id cannot be stored in them); it is refused when the config is read, before any work.
    The largest id uint32 holds is accepted."""
    write_jsonl(tmp_path / "data.jsonl", [{"text": "hello"}])
    tokenizer = {"kind": "huggingface", "path": str(hf_tokenizer_no_mask)}
    config = write_config(tmp_path, tokenizer={**tokenizer, "mask_token_id": 1 << 32})
    _prepare_fails(cli, config, "tokenizer.mask_token_id", "4294967296")
    config = write_config(tmp_path, tokenizer={**tokenizer, "mask_token_id": (1 << 32) - 1})
    manifest = prepare_config(config).manifest
    assert (manifest.vocab_size, manifest.arrays["tokens"].dtype) == (1 << 32, "uint32")


def test_token_dtype_covers_every_id_or_refuses():
    """The token type holds every id of the vocabulary; past uint32 is an error naming the
    token that widened it, never a silent wrap-around."""
    from turbo_dllm.data.prepare import token_dtype_for

    specials = {"eos": 0, "pad": 1}
    assert token_dtype_for(1 << 16, {**specials, "mask": (1 << 16) - 1}) == "uint16"
    assert token_dtype_for((1 << 16) + 1, {**specials, "mask": 1 << 16}) == "uint32"
    assert token_dtype_for(1 << 32, {**specials, "mask": (1 << 32) - 1}) == "uint32"
    with pytest.raises(DllmError, match="the mask token is 4,294,967,296"):
        token_dtype_for((1 << 32) + 1, {**specials, "mask": 1 << 32})


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32"])
def test_a_utf16_or_utf32_file_is_refused_naming_its_encoding(cli, tmp_path, encoding):
    """A UTF-16 file (PowerShell 5's `>`, Notepad's "Unicode") read as UTF-8 gave a puzzling
    "'utf-16-le' codec can't decode ... truncated data" for its first JSON line while json
    decoded the next as UTF-16-BE; under on_error: skip half its records got in, and a text
    source by line took `\\x00w\\x00o...` (NUL between every character) as documents. A file
    that starts with a UTF-16 or UTF-32 byte order mark now stops the job, named."""
    import gzip

    name = encoding.upper()
    lines = '{"text": "hello"}\r\n{"text": "world"}\r\n'.encode(encoding)
    (tmp_path / "data.jsonl").write_bytes(lines)
    for on_error in ("stop", "skip"):
        config = write_config(tmp_path, on_error=on_error)
        _prepare_fails(cli, config, f"data.jsonl: the file is {name} text", f"iconv -f {name}")
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress("hello\r\nworld\r\n".encode(encoding)))
    for unit in ("document", "line"):
        source = {"kind": "text", "paths": ["a.txt.gz"], "unit": unit}
        config = write_config(tmp_path, source=source, on_error="skip")
        _prepare_fails(cli, config, f"a.txt.gz: the file is {name} text")


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_midway_leaves_nothing(tmp_path, workers):
    """SIGTERM (a scheduler's time limit, `kill`, `timeout`) ended prepare on the spot: its
    staging folder with the arrays written so far stayed beside the output, and the pool's
    workers printed BrokenPipeError tracebacks. Now the job unwinds as on Ctrl-C (staging
    removed, pool ended) and the process still ends by SIGTERM."""
    import os
    import subprocess
    import sys
    import time

    from tests.helpers import ROOT

    write_jsonl(tmp_path / "data.jsonl", [{"text": f"document {i}"} for i in range(20 * 1024)])
    config = write_config(tmp_path, workers=workers)
    script = (
        "import sys, time\n"
        "from turbo_dllm.data import pipeline\n"
        "process = pipeline.ChunkProcessor.process\n"
        "def slow(self, chunk):\n"
        "    time.sleep(0.3)\n"
        "    return process(self, chunk)\n"
        "pipeline.ChunkProcessor.process = slow\n"
        "from turbo_dllm.cli import main\n"
        "sys.exit(main(['data', 'prepare', '--config', sys.argv[1]]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(config)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not any(p.name.startswith(".out.staging-") for p in tmp_path.iterdir()):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "prepare never started writing"
            time.sleep(0.05)
        time.sleep(1.0)  # some chunks written
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, err)
    assert "Traceback" not in err, err
    assert not (tmp_path / "out").exists()
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("streaming", [False, True])
def test_huggingface_data_files_error_names_the_file(cli, tmp_path, streaming):
    """A bad row read through a builder was located as `json row 3`, counted across every
    data file, so nothing said which file held it. A load that records how many rows each file
    gave names the file and the row within it; a streaming load of several files does not
    learn that, and says the row is counted across source.data_files."""
    write_jsonl(tmp_path / "f/a.jsonl", [{"text": "one"}, {"text": "two"}])
    (tmp_path / "f/b.jsonl").write_text("\n")  # empty: left out of the load
    write_jsonl(tmp_path / "f/c.jsonl", [{"text": "three"}, {"text": None}])
    source = {"kind": "huggingface", "data_files": ["f/*.jsonl"], "streaming": streaming}
    result = _prepare_fails(cli, write_config(tmp_path, source=source), "'text'")
    where = "source.data_files row 3:" if streaming else "f/c.jsonl row 1:"
    assert where in result.err
    # One data file is named whether or not the load streams.
    source["data_files"] = ["f/c.jsonl"]
    _prepare_fails(cli, write_config(tmp_path, source=source), "f/c.jsonl row 1:")


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
@pytest.mark.parametrize("change", ["append", "replace"])
def test_a_source_file_that_changes_during_prepare_is_refused(
    cli, tmp_path, monkeypatch, kind, change
):
    """Provenance hashed every source file after tokenizing it, so a file written meanwhile got
    a hash of what it became, not of what the artifact holds. The file is hashed as it is read
    (JSONL, text) or, where the reader does not read it whole (parquet), is checked against how
    it looked before reading: a change is an error, and nothing is written."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    import turbo_dllm.data.packing as packing

    name = "data.jsonl" if kind == "jsonl" else "data.parquet"
    path = tmp_path / name

    def write(texts: list[str]) -> None:
        if kind == "jsonl":
            write_jsonl(path, [{"text": t} for t in texts])
        else:
            pq.write_table(pa.table({"text": texts}), path)

    write(["one", "two"])
    original = packing.Packer.finish

    def finish_after_a_change(self):
        if change == "append":
            write(["one", "two", "three"])
        else:  # written beside it and renamed over it, as editors and exports do
            write_to = tmp_path / "new"
            os.rename(path, write_to)
            write(["one", "two"])
            os.unlink(write_to)
        return original(self)

    monkeypatch.setattr(packing.Packer, "finish", finish_after_a_change)
    config = write_config(tmp_path, source={"kind": kind, "paths": [name]})
    _prepare_fails(cli, config, f"{name}: the source file changed while prepare read it")
