"""`dllm data validate`'s exit codes follow the CLI contract (README, docs/architecture.md
"Contracts"): 0 the artifact checked clean, 1 a failed check (an artifact that is there but
damaged, or does not fit `--config`), 2 bad input (no artifact at the path, a RunSpec that does
not load), as `dllm bundle verify` and `dllm mirror verify` exit 1 for a failed check. A damaged
artifact exited 2, as if the command had been misused."""

from __future__ import annotations

import json

import pytest

from tests.data.helpers import prepare_config, write_config, write_jsonl
from tests.helpers import assert_failed_check, assert_user_error


@pytest.fixture
def artifact(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "data.jsonl", [{"text": f"document {i} " * 5} for i in range(12)])
    return prepare_config(write_config(tmp_path, packing={"seq_len": 32, "block_size": 8})).path


def _damage(artifact) -> None:
    tokens = artifact / "tokens.bin"
    data = bytearray(tokens.read_bytes())
    data[3] ^= 0x01
    tokens.write_bytes(bytes(data))


def test_a_damaged_artifact_is_a_failed_check(cli, artifact):
    assert cli("data", "validate", artifact).code == 0
    _damage(artifact)
    result = cli("data", "validate", artifact)
    assert_failed_check(result, "failed verification", "tokens.bin: sha256 mismatch")
    assert "fix: re-create it with `dllm data prepare --config" in result.err
    assert "dllm: error" not in result.err

    report = cli("data", "validate", artifact, "--json")
    assert report.code == 1, report.err
    shown = json.loads(report.out)  # the one object: the report, not an error object
    assert shown["valid"] is False and shown["artifact"] == str(artifact)
    assert shown["problems"] == [
        "tokens.bin: sha256 mismatch (the file changed after it was written)"
    ]
    assert "--set output.overwrite=true" in shown["fix"]


def test_a_torn_manifest_is_a_failed_check_and_a_missing_one_bad_input(cli, artifact, tmp_path):
    manifest = artifact / "manifest.json"
    text = manifest.read_text()
    manifest.write_text(text[: len(text) // 2])
    assert_failed_check(cli("data", "validate", artifact), "unreadable manifest")
    # Of this format, a field no artifact can have (edited by hand): damaged too.
    document = json.loads(text)
    document["seq_len"] = -1
    manifest.write_text(json.dumps(document))
    assert_failed_check(cli("data", "validate", artifact), "seq_len")
    # No artifact there at all, or a folder that holds none: the input is wrong, exit 2.
    assert_user_error(cli("data", "validate", tmp_path / "nothing"), "data artifact not found")
    (tmp_path / "empty").mkdir()
    assert_user_error(cli("data", "validate", tmp_path / "empty"), "no data artifact at")
    result = cli("data", "validate", tmp_path / "nothing", "--json")
    assert result.code == 2 and "data artifact not found" in json.loads(result.out)["error"]


def test_an_artifact_that_does_not_fit_the_runspec_is_a_failed_check(cli, artifact, tmp_path):
    from tests.train.util import write_config as write_train

    train = write_train(tmp_path / "train.yaml", f"data.artifact={artifact}", "data.synthetic=null")
    result = cli("data", "validate", artifact, "--config", train)
    assert_failed_check(result, "does not fit", "data.seq_len: 64")
    report = json.loads(cli("data", "validate", artifact, "--config", train, "--json").out)
    assert report["valid"] is False and report["config"] == str(train)
    assert any(p.startswith("data.seq_len: 64") for p in report["problems"])
    # A RunSpec that does not load is bad input (exit 2), not a finding about the artifact.
    train.write_text("model: {family: qwen3, from_config: tiny}\ntraining: {stepz: 3}\n")
    assert_user_error(cli("data", "validate", artifact, "--config", train), "stepz")


def test_in_a_real_process_the_exit_status_is_1(cli_process, artifact):
    _damage(artifact)
    result = cli_process("data", "validate", artifact)
    assert result.code == 1, result.err
    assert result.out.startswith("FAIL: ") and result.err.startswith("fix: ")


def test_the_help_states_the_exit_codes(cli):
    text = " ".join(cli("data", "validate", "--help").out.split())
    assert "Exit status: 0 every check passed, 1 a check failed" in text
    assert "2 bad input" in text
