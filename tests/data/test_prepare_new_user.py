"""Found by the data-preparation docs-as-a-new-user audit: each test failed before its fix."""

from __future__ import annotations

import json
import os

import pytest

from tests.data.helpers import documents, prepare_config, write_config, write_jsonl
from tests.helpers import assert_failed_check, assert_user_error


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


def test_a_vocabulary_too_small_for_the_artifact_names_the_field_that_fixes_it(
    cli, tmp_path, hf_tokenizer
):
    """The starter's tiny model (512 ids) against data of a larger vocabulary: validate and
    train listed 'vocabulary of 512 (model.from_config tiny) is smaller than the artifact's 601
    token ids' with 'change the RunSpec fields above', naming no field; the one that fixes it
    (model.config_overrides.vocab_size) was only in the trainer's later hint, never reached."""
    project = tmp_path / "p"
    assert cli("init", project).code == 0
    overrides = [
        "--set",
        "tokenizer.kind=huggingface",
        "--set",
        f"tokenizer.path={hf_tokenizer}",
        "--set",
        "tokenizer.mask_token_id=600",
    ]
    assert cli("data", "prepare", "--config", project / "prepare.yaml", *overrides).code == 0
    artifact, train = project / "data/prepared", project / "train.yaml"
    result = cli("data", "validate", artifact, "--config", train)
    assert_failed_check(result, "set model.config_overrides.vocab_size: 601")
    # the fix, pasted, is the whole fix
    train.write_text(
        train.read_text().replace(
            "from_config: tiny", "from_config: tiny\n  config_overrides: {vocab_size: 601}"
        )
    )
    assert cli("data", "validate", artifact, "--config", train).code == 0
    # an override already there that is too small: raise it
    train.write_text(train.read_text().replace("vocab_size: 601", "vocab_size: 300"))
    result = cli("data", "validate", artifact, "--config", train)
    assert_failed_check(
        result,
        "vocabulary of 300 (model.config_overrides.vocab_size)",
        "set model.config_overrides.vocab_size: 601",
    )


@pytest.mark.parametrize("indent", [None, 2])
def test_a_json_array_given_as_jsonl_is_named_with_the_source_that_reads_it(cli, tmp_path, indent):
    """`alpaca_data.json` (a JSON array of records) as a jsonl source stopped at its first line
    ('expected a JSON object, got list', or 'malformed JSON' when pretty-printed) with 'fix that
    record, or set on_error: skip'; under skip every line was skipped ('no documents')."""
    rows = [{"text": "first record"}, {"text": "second record"}]
    (tmp_path / "alpaca.json").write_text(json.dumps(rows, indent=indent), encoding="utf-8")
    config = write_config(tmp_path, source={"kind": "jsonl", "paths": ["alpaca.json"]})
    for skip in ([], ["--set", "on_error=skip"]):
        result = cli("data", "prepare", "--config", config, *skip)
        assert_user_error(
            result, "alpaca.json: the file is a JSON array", "kind: huggingface", "jq -c"
        )
    # the way out the hint names reads it
    config = write_config(tmp_path, source={"kind": "huggingface", "data_files": ["alpaca.json"]})
    assert _texts(prepare_config(config).path) == [b"first record", b"second record"]


def test_a_pretty_printed_json_object_given_as_jsonl_is_named_as_such(cli, tmp_path):
    (tmp_path / "squad.json").write_text(
        json.dumps({"data": [{"text": "x"}]}, indent=2), encoding="utf-8"
    )
    config = write_config(tmp_path, source={"kind": "jsonl", "paths": ["squad.json"]})
    result = cli("data", "prepare", "--config", config)
    assert_user_error(result, "squad.json: the file is one JSON object written over", "jq -c")


def test_jsonl_whose_first_line_is_a_bad_record_is_still_a_bad_record(tmp_path):
    """Only a file that is a JSON document is refused whole: a JSONL file whose first line is
    cut short or mistyped is a bad record, skipped under on_error: skip."""
    (tmp_path / "data.jsonl").write_text('[1, 2\n{"text": "kept"}\n', encoding="utf-8")
    result = prepare_config(write_config(tmp_path, on_error="skip"))
    assert _texts(result.path) == [b"kept"]
    assert result.manifest.stats.skipped == {"malformed_json": 1}


def test_token_id_lines_that_are_objects_name_the_source_that_reads_them(cli, tmp_path):
    """`{"input_ids": [...]}` lines in a token_ids source read 'the line must be a list of
    integer token ids' with 'fix that record': every line was written so, and the source that
    reads them (jsonl + records tokens) went unnamed."""
    write_jsonl(tmp_path / "ids.jsonl", [{"input_ids": [72, 105]}, {"input_ids": [33]}])
    config = write_config(tmp_path, source={"kind": "token_ids", "paths": ["ids.jsonl"]})
    result = cli("data", "prepare", "--config", config)
    assert_user_error(
        result,
        "ids.jsonl:1: the line is a JSON object (keys: input_ids)",
        "source {kind: jsonl} with records {kind: tokens, field: KEY}",
    )
    # which reads them
    config = write_config(
        tmp_path,
        source={"kind": "jsonl", "paths": ["ids.jsonl"]},
        records={"kind": "tokens", "field": "input_ids"},
    )
    assert _texts(prepare_config(config).path) == [b"Hi", b"!"]


@pytest.mark.parametrize(
    ("setting", "said", "fix"),
    [
        ({"pad_token": "<|mask|>"}, "'<|mask|>' (id ", "set tokenizer.pad_token to another"),
        ({"mask_token": "<|endoftext|>"}, "is also the eos token", "set tokenizer.mask_token"),
        ({"mask_token_id": 0}, "'<|endoftext|>' (id 0) is also the eos", "tokenizer.mask_token"),
    ],
)
def test_a_mask_token_shared_with_another_role_names_it_and_the_setting_to_change(
    cli, tmp_path, hf_tokenizer, setting, said, fix
):
    """'the mask token id 4 is also the eos/pad/bos token' named neither the token nor which
    role it shared, and always hinted tokenizer.mask_token, also where prepare.yaml had set
    pad_token to the tokenizer's mask token (the setting to change)."""
    write_jsonl(tmp_path / "data.jsonl", [{"text": "hello"}])
    tokenizer = {"kind": "huggingface", "path": str(hf_tokenizer), **setting}
    result = cli("data", "prepare", "--config", write_config(tmp_path, tokenizer=tokenizer))
    assert_user_error(result, said, fix)
    assert "eos/pad/bos" not in result.err


def test_data_commands_on_a_missing_or_damaged_artifact_name_the_prepare_config_from_here(
    cli, tmp_path, monkeypatch
):
    """`dllm data validate / stats / inspect p/data/prepared` run outside the project hinted
    `dllm data prepare --config prepare.yaml`, a file the working folder does not have (train
    and launch name the project's own since an earlier fix)."""
    project = tmp_path / "p"
    assert cli("init", project).code == 0
    monkeypatch.chdir(tmp_path)
    for command in ("validate", "stats", "inspect"):
        result = cli("data", command, "p/data/prepared")
        assert_user_error(result, "create it with `dllm data prepare --config p/prepare.yaml`")
    result = cli("data", "stats", "elsewhere")
    assert_user_error(
        result,
        "`dllm data prepare --config PREPARE.yaml` (a prepare.yaml with output.path: "
        f"{tmp_path / 'elsewhere'})",
    )
    # a damaged one: the same config, with the overwrite it needs to replace it
    assert cli("data", "prepare", "--config", "p/prepare.yaml").code == 0
    with open(project / "data/prepared/tokens.bin", "ab") as handle:
        handle.write(b"\0\0")
    result = cli("data", "validate", "p/data/prepared")
    assert_failed_check(
        result,
        "re-create it with `dllm data prepare --config p/prepare.yaml --set output.overwrite=true`",
    )
    result = cli("data", "prepare", "--config", "p/prepare.yaml", "--set", "output.overwrite=true")
    assert result.code == 0 and cli("data", "validate", "p/data/prepared").code == 0


def test_a_file_named_twice_is_read_once_and_the_user_is_told(cli, tmp_path):
    """`paths: [a.jsonl, a.jsonl]` (a file listed twice to weight it) was read once, silently:
    half the records the list asked for were not in the artifact, and nothing said so."""
    write_jsonl(tmp_path / "a.jsonl", [{"text": "weighted"}])
    write_jsonl(tmp_path / "b.jsonl", [{"text": "other"}])
    config = write_config(
        tmp_path, source={"kind": "jsonl", "paths": ["a.jsonl", "*.jsonl", "a.jsonl"]}
    )
    result = cli("data", "prepare", "--config", config, "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["stats"]["records"] == 2  # as documented: each file once
    assert result.err.count("dllm: note:") == 1  # the glob overlapping a.jsonl is not told
    assert "'" + str(tmp_path / "a.jsonl") + "' names a file listed before" in result.err
    assert "name a copy of it" in result.err
