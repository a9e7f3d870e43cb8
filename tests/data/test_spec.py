"""prepare.yaml: strict schema, readable errors, cross-section rules, path resolution."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest
import yaml

from tests.data.helpers import write_config
from turbo_dllm.data.spec import (
    JsonlSource,
    TokensRecords,
    load_prepare_spec,
    validate_prepare_document,
)
from turbo_dllm.errors import DllmError


def _problems(document) -> str:
    with pytest.raises(DllmError) as caught:
        validate_prepare_document(document, "prepare.yaml")
    return caught.value.message


BASE = {
    "source": {"kind": "jsonl", "paths": ["a.jsonl"]},
    "tokenizer": {"kind": "byte_level"},
    "packing": {"seq_len": 64, "block_size": 8},
    "output": {"path": "out"},
}


def test_the_starter_template_is_valid():
    template = resources.files("turbo_dllm") / "init_template" / "prepare.yaml"
    spec = validate_prepare_document(yaml.safe_load(template.read_text()), "prepare.yaml")
    assert isinstance(spec.source, JsonlSource)
    assert spec.record_spec.kind == "text" and spec.tokenizer.kind == "byte_level"


def test_unknown_keys_get_their_path_and_the_nearest_name():
    message = _problems({**BASE, "source": {"kind": "jsonl", "pathz": ["a"]}, "workerz": 2})
    assert "source.pathz: unknown key; did you mean 'paths'?" in message
    assert "workerz: unknown key; did you mean 'workers'?" in message
    message = _problems({**BASE, "records": {"kind": "chat", "feld": "m"}})
    assert "records.feld: unknown key; did you mean 'field'?" in message


def test_unknown_kind_suggests_the_nearest():
    message = _problems({**BASE, "source": {"kind": "parket", "paths": ["a"]}})
    assert "source.kind: unknown kind 'parket'; did you mean 'parquet'?" in message


def test_a_missing_or_non_string_kind_is_a_plain_problem():
    """A section without `kind` said pydantic's "Unable to extract tag using discriminator
    'kind'"; a list or map as the kind was a TypeError traceback (unhashable)."""
    message = _problems({**BASE, "source": {"paths": ["a"]}, "records": {"field": "body"}})
    assert "source.kind: missing (valid: huggingface, jsonl, parquet, text, token_ids)" in message
    assert "records.kind: missing (valid: chat, prompt_completion, text, tokens)" in message
    assert "discriminator" not in message
    message = _problems({**BASE, "tokenizer": {"kind": ["byte_level"]}, "records": {"kind": {}}})
    assert "tokenizer.kind: unknown kind ['byte_level']" in message
    assert "records.kind: unknown kind {}" in message


def test_bad_workers_is_one_plain_problem():
    message = _problems({**BASE, "workers": 0})
    assert "1 problem:" in message
    assert "workers: Input should be a positive integer or 'auto' (got 0)" in message
    assert "constrained-int" not in message and "literal" not in message
    for good, expected in ((4, 4), ("auto", "auto"), ("2", 2)):
        assert validate_prepare_document({**BASE, "workers": good}, "p").workers == expected


def test_an_empty_list_of_files_is_a_problem_for_every_source():
    """`paths: []` was refused but `data_files: []` passed, and prepare then said
    "source.data_files:  are all empty" (no file named)."""
    message = _problems({**BASE, "source": {"kind": "huggingface", "data_files": []}})
    assert "source.data_files: List should have at least 1 item" in message
    message = _problems({**BASE, "source": {"kind": "jsonl", "paths": []}})
    assert "source.paths: List should have at least 1 item" in message


def test_mask_token_id_is_bounded_by_the_largest_storable_id():
    tokenizer = {"kind": "huggingface", "path": "tok"}
    message = _problems({**BASE, "tokenizer": {**tokenizer, "mask_token_id": 1 << 32}})
    assert "tokenizer.mask_token_id: Input should be less than or equal to 4294967295" in message
    spec = validate_prepare_document(
        {**BASE, "tokenizer": {**tokenizer, "mask_token_id": (1 << 32) - 1}}, "p"
    )
    assert spec.tokenizer.mask_token_id == (1 << 32) - 1


def test_cross_section_rules_are_all_reported():
    message = _problems(
        {
            **BASE,
            "packing": {"seq_len": 60, "block_size": 8},
            "supervision": "assistant_only",
        }
    )
    assert "2 problems" in message
    assert "packing.seq_len: 60 is not a multiple" in message
    assert "'assistant_only' does not apply to text records" in message
    message = _problems({**BASE, "records": {"kind": "tokens"}, "supervision": "provided"})
    assert "loss_mask_field" in message
    message = _problems({**BASE, "source": {"kind": "token_ids", "paths": ["x.bin"]}})
    assert "source.dtype" in message
    message = _problems({**BASE, "source": {"kind": "huggingface"}})
    assert "exactly one of source.path" in message


def test_token_ids_source_defaults_to_token_records():
    spec = validate_prepare_document(
        {**BASE, "source": {"kind": "token_ids", "paths": ["x.npy"]}}, "p"
    )
    assert isinstance(spec.record_spec, TokensRecords)


def test_relative_paths_resolve_against_the_config_folder(tmp_path, monkeypatch):
    config = write_config(
        tmp_path / "proj",
        tokenizer={"kind": "huggingface", "path": "tok"},
        source={"kind": "jsonl", "paths": "data/*.jsonl"},
    )
    monkeypatch.chdir(tmp_path)
    spec = load_prepare_spec(config, ["output.path=elsewhere"])
    assert spec.source.paths == [str(tmp_path / "proj/data/*.jsonl")]
    assert spec.tokenizer.path == str(tmp_path / "proj/tok")
    assert spec.output.path == str(tmp_path / "elsewhere")  # a --set path: the current folder's


def test_docs_examples_are_valid_prepare_files():
    """Every ```yaml block in docs/data.md that has a `source:` is a valid prepare.yaml."""
    docs = Path(__file__).resolve().parents[2] / "docs" / "data.md"
    text = docs.read_text(encoding="utf-8")
    blocks = [b.split("```", 1)[0] for b in text.split("```yaml\n")[1:]]
    examples = [yaml.safe_load(b) for b in blocks]
    examples = [e for e in examples if isinstance(e, dict) and "source" in e]
    assert len(examples) >= 9
    kinds = set()
    for example in examples:
        spec = validate_prepare_document(example, "docs/data.md")
        kinds.add(("source", spec.source.kind))
        kinds.add(("records", spec.record_spec.kind))
        kinds.add(("supervision", spec.supervision))
    for source in ("huggingface", "jsonl", "parquet", "text", "token_ids"):
        assert ("source", source) in kinds
    for mode in ("full", "assistant_only", "completion_only", "provided"):
        assert ("supervision", mode) in kinds
