"""Hostile sources and records for `dllm data prepare`: a located error (or a counted skip).

Each case ends in `dllm: error: FILE:LINE ...` (or `FILE row N`, or the path) with exit 2 and no
traceback; under `on_error: skip` a bad record is counted by reason and the job goes on. Inputs
built to exhaust memory or disk run in a capped child process (`bounded_run`).
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from tests.adversarial.bounded_run import run_dllm
from tests.data.helpers import documents, prepare_config, write_config, write_jsonl
from tests.helpers import assert_user_error


def _token_source(*paths, **extra):
    return {"kind": "token_ids", "paths": list(paths), **extra}


# --- records that are not text --------------------------------------------------------------


@pytest.mark.parametrize(
    ("records", "line", "field"),
    [
        ({"kind": "text"}, '{"text": "a\\ud800b"}', "'text'"),
        ({"kind": "prompt_completion"}, '{"prompt": "q", "completion": "\\udfff"}', "'completion'"),
        (
            {"kind": "chat"},
            '{"messages": [{"role": "user", "content": "x\\uDC00"}]}',
            "'messages.0.content'",
        ),
    ],
)
def test_a_lone_surrogate_is_a_bad_record(cli, tmp_path, records, line, field):
    chat = [{"role": "user", "content": "hi"}]
    good = {"text": "ok", "prompt": "p", "completion": "c", "messages": chat}
    (tmp_path / "data.jsonl").write_text(json.dumps(good) + "\n" + line + "\n")
    config = write_config(tmp_path, records=records)
    result = cli("data", "prepare", "--config", config)
    assert_user_error(result, "data.jsonl:2", field, "lone surrogate")
    config = write_config(tmp_path, records=records, on_error="skip")
    assert prepare_config(config).manifest.stats.skipped == {"bad_text": 1}


def test_a_surrogate_pair_is_text(tmp_path):
    write_jsonl(tmp_path / "data.jsonl", [{"text": "\U0001f600"}])  # json.dumps writes \ud83d\ude00
    assert "\\ud83d" in (tmp_path / "data.jsonl").read_text()
    result = prepare_config(write_config(tmp_path))
    assert result.manifest.stats.skipped == {}
    assert documents(result.path)[0][0][:4].tolist() == list("\U0001f600".encode())


@pytest.mark.parametrize("source", ["jsonl", "token_ids"])
def test_deeply_nested_json_is_a_bad_record(cli, tmp_path, source):
    good = '{"text": "ok"}' if source == "jsonl" else "[1, 2]"
    (tmp_path / "data.jsonl").write_text(good + "\n" + "[" * 100_000 + "\n")
    kind = {"source": _token_source("data.jsonl")} if source == "token_ids" else {}
    result = cli("data", "prepare", "--config", write_config(tmp_path, **kind))
    assert_user_error(result, "data.jsonl:2: malformed JSON: nested too deeply")
    stats = prepare_config(write_config(tmp_path, on_error="skip", **kind)).manifest.stats
    assert stats.skipped == {"malformed_json": 1}


def test_a_bad_field_value_is_shown_briefly(cli, tmp_path):
    deep = "[" * 900 + "]" * 900
    line = '{"messages": [{"role": "user", "content": ' + deep + "}]}"
    (tmp_path / "data.jsonl").write_text(line + "\n")
    result = cli("data", "prepare", "--config", write_config(tmp_path, records={"kind": "chat"}))
    assert_user_error(result, "data.jsonl:1", "messages.0.content must be a string, got [[[...]]]")
    assert len(result.err) < 400


# --- token id files -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"", "not a readable .npy array"),
        (b"\x93NUMPY\x01\x00", "not a readable .npy array"),
        (b"not an array at all", "not a readable .npy array"),
    ],
)
def test_a_broken_npy_file(cli, tmp_path, content, needle):
    (tmp_path / "ids.npy").write_bytes(content)
    config = write_config(tmp_path, source=_token_source("ids.npy"))
    assert_user_error(cli("data", "prepare", "--config", config), "ids.npy", needle)


def test_an_npz_archive_named_npy(cli, tmp_path):
    with open(tmp_path / "ids.npy", "wb") as handle:
        np.savez(handle, ids=np.arange(4))
    config = write_config(tmp_path, source=_token_source("ids.npy"))
    assert_user_error(cli("data", "prepare", "--config", config), "ids.npy", "npz")


@pytest.mark.parametrize(
    ("size", "needle"), [(0, "empty file"), (3, "3 bytes is not a whole number of uint16 ids")]
)
def test_a_bin_file_of_the_wrong_size(cli, tmp_path, size, needle):
    (tmp_path / "ids.bin").write_bytes(b"\x01" * size)
    config = write_config(tmp_path, source=_token_source("ids.bin", dtype="uint16"))
    assert_user_error(cli("data", "prepare", "--config", config), "ids.bin", needle)


def test_an_id_past_2_63_is_printed_as_it_is(cli, tmp_path):
    np.save(tmp_path / "ids.npy", np.array([[1, 2], [3, 2**63 + 5]], dtype=np.uint64))
    config = write_config(tmp_path, source=_token_source("ids.npy"))
    result = cli("data", "prepare", "--config", config)
    assert_user_error(result, "ids.npy row 1", f"token id {2**63 + 5}")
    assert "-92233" not in result.err
    (tmp_path / "ids.jsonl").write_text("[1, 2]\n[1, 18446744073709551615]\n")
    config = write_config(tmp_path, source=_token_source("ids.jsonl"))
    result = cli("data", "prepare", "--config", config)
    assert_user_error(result, "ids.jsonl:2", "token id 18446744073709551615")
    write_jsonl(tmp_path / "data.jsonl", [{"input_ids": [1, -(2**64)]}])
    config = write_config(tmp_path, records={"kind": "tokens"})
    result = cli("data", "prepare", "--config", config)
    assert_user_error(result, "data.jsonl:1", "field 'input_ids'", f"token id {-(2**64)}")


# --- paths that are not files -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["jsonl", "text", "token_ids"])
def test_a_device_as_source_is_named_for_what_it_is(cli, tmp_path, kind):
    config = write_config(tmp_path, source={"kind": kind, "paths": ["/dev/zero"]})
    result = cli("data", "prepare", "--config", config)
    assert_user_error(result, "'/dev/zero' is a character device, not a regular file")
    assert "not found" not in result.err


def test_a_folder_as_source_suggests_a_glob(cli, tmp_path):
    (tmp_path / "corpus").mkdir()
    config = write_config(tmp_path, source={"kind": "jsonl", "paths": ["corpus"]})
    result = cli("data", "prepare", "--config", config)
    assert_user_error(result, "is a directory", "corpus/*.jsonl")


@pytest.mark.parametrize(
    "kind, names, glob",
    [
        ("text", ["a.txt", "b.txt", "notes.md"], "books/*.txt"),  # the files it holds
        ("jsonl", ["a.jsonl.gz", "b.jsonl.gz"], "books/*.jsonl.gz"),
        ("parquet", [], "books/*.parquet"),  # empty: the source kind's files
        ("text", ["sub/"], "books/**/*.txt"),  # folders only
    ],
)
def test_a_folder_as_source_suggests_a_glob_of_its_files(cli, tmp_path, kind, names, glob):
    """The hint said `*.jsonl` whatever the source and the folder held: a folder of text files
    named as a text source was told to glob `books/*.jsonl`, which matches nothing."""
    (tmp_path / "books").mkdir()
    for name in names:
        if name.endswith("/"):
            (tmp_path / "books" / name).mkdir()
        else:
            (tmp_path / "books" / name).write_text("text\n")
    source = {"kind": kind, "paths": ["books"]}
    result = cli("data", "prepare", "--config", write_config(tmp_path, source=source))
    assert_user_error(
        result, "is a directory", f"name the files inside it, e.g. '{tmp_path / glob}'"
    )


def test_a_path_too_long_for_the_os(cli, tmp_path):
    config = write_config(tmp_path, source={"kind": "jsonl", "paths": ["x" * 5000]})
    result = cli("data", "prepare", "--config", config)
    assert_user_error(result, "cannot read '/", "chars): File name too long")
    assert len(result.err) < 400


# --- sizes --------------------------------------------------------------------------------------


def _gzip_with_a_long_line(path, mib: int) -> None:
    """A small .jsonl.gz whose second line decompresses to `mib` MiB: gzip members concatenate,
    so one compressed MiB of "a" repeated is the whole line, written in milliseconds."""
    block = gzip.compress(b"a" * (1 << 20), compresslevel=9)
    with open(path, "wb") as handle:
        handle.write(gzip.compress(b'{"text": "before"}\n{"text": "'))
        for _ in range(mib):
            handle.write(block)
        handle.write(gzip.compress(b'"}\n{"text": "after"}\n'))


def test_a_huge_line_in_a_gzip_is_refused_in_bounded_memory(tmp_path):
    source = {"kind": "jsonl", "paths": ["data.jsonl.gz"]}
    _gzip_with_a_long_line(tmp_path / "data.jsonl.gz", mib=40)
    result = run_dllm("data", "prepare", "--config", write_config(tmp_path, source=source))
    assert_user_error(result, "data.jsonl.gz:2", "more than the 32 MiB a record may have")
    # Past the memory cap: the line is skipped while it streams, never held whole.
    _gzip_with_a_long_line(tmp_path / "data.jsonl.gz", mib=450)
    assert (tmp_path / "data.jsonl.gz").stat().st_size < 1 << 20
    config = write_config(tmp_path, source=source, on_error="skip")
    result = run_dllm("data", "prepare", "--config", config, "--json", memory_mib=400)
    assert result.code == 0, result.err
    stats = json.loads(result.out)["stats"]
    assert (stats["records"], stats["documents"], stats["skipped"]) == (3, 2, {"too_large": 1})


def test_a_huge_text_document_is_a_bad_record(cli, tmp_path):
    with open(tmp_path / "big.txt", "wb") as handle:  # sparse: 33 MiB of NUL, instantly
        handle.truncate(33 << 20)
    (tmp_path / "small.txt").write_text("fine")
    source = {"kind": "text", "paths": ["big.txt", "small.txt"]}
    result = cli("data", "prepare", "--config", write_config(tmp_path, source=source))
    assert_user_error(result, "big.txt", "34,603,008 bytes, more than the 32 MiB")
    result = prepare_config(write_config(tmp_path, source=source, on_error="skip"))
    assert result.manifest.stats.skipped == {"too_large": 1}


def test_seq_len_is_bounded_before_anything_is_written(tmp_path):
    write_jsonl(tmp_path / "data.jsonl", [{"text": "tiny input"}])
    config = write_config(tmp_path, packing={"seq_len": 2**31, "block_size": 8})
    result = run_dllm("data", "prepare", "--config", config, memory_mib=600, file_mib=64)
    assert_user_error(result, "packing.seq_len", "4194304")
    assert not (tmp_path / "out").exists()


# --- output paths -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "needles"),
    [
        ("/proc/no-such/out", ["cannot create the folder of output path", "No such file"]),
        ("/proc/self/out", ["cannot write next to output path"]),
        ("y" * 300, ["output path", "(", "chars): File name too long"]),
        ("a/" + "y" * 5000, ["chars): File name too long"]),
    ],
)
def test_an_output_path_that_cannot_be_written(cli, tmp_path, path, needles):
    write_jsonl(tmp_path / "data.jsonl", [{"text": "x"}])
    result = cli("data", "prepare", "--config", write_config(tmp_path, output={"path": path}))
    assert_user_error(result, *needles)
    assert len(result.err) < 600


def test_a_full_disk_mid_job_is_an_error_and_leaves_nothing(cli, tmp_path, monkeypatch):
    import errno

    from turbo_dllm.data import writer

    def full(self, array):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

    monkeypatch.setattr(writer.ArrayWriter, "write", full)
    write_jsonl(tmp_path / "data.jsonl", [{"text": "x"}])
    result = cli("data", "prepare", "--config", write_config(tmp_path))
    assert_user_error(result, "tokens.bin: No space left on device", "no artifact was written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl", "prepare.yaml"]
