"""Artifact identity and integrity: fingerprints, verification, and what validate catches."""

from __future__ import annotations

import json

import pytest

from tests.data.helpers import prepare_config, write_config, write_jsonl
from tests.helpers import assert_failed_check, assert_user_error
from turbo_dllm.data.artifact import read_manifest, verify
from turbo_dllm.errors import DllmError


@pytest.fixture
def corpus(tmp_path):
    """Enough lines for several chunks (1024 records each), so 2 workers really interleave."""
    rows = [{"text": f"document {i}: " + "lorem ipsum " * (i % 17)} for i in range(2600)]
    write_jsonl(tmp_path / "data.jsonl", rows)
    return tmp_path


def test_fingerprint_is_identical_across_workers_and_output_paths(corpus, tmp_path):
    one = prepare_config(write_config(corpus, workers=1, output={"path": "a"}))
    two = prepare_config(write_config(corpus, "p2.yaml", workers=2, output={"path": "sub/b"}))
    assert two.workers == 2
    assert one.manifest.fingerprint == two.manifest.fingerprint
    # Nothing path- or run-dependent anywhere: the manifests are byte-identical.
    assert (one.path / "manifest.json").read_bytes() == (two.path / "manifest.json").read_bytes()
    for name in ("tokens.bin", "loss_mask.bin", "documents.bin"):
        assert (one.path / name).read_bytes() == (two.path / name).read_bytes()
    assert one.manifest.stats.records == 2600


def test_fingerprint_identical_with_a_hf_tokenizer_in_two_workers(corpus, hf_tokenizer):
    tokenizer = {"kind": "huggingface", "path": str(hf_tokenizer)}
    one = prepare_config(write_config(corpus, tokenizer=tokenizer, workers=1))
    two = prepare_config(
        write_config(corpus, "p2.yaml", tokenizer=tokenizer, workers=2, output={"path": "b"})
    )
    assert one.manifest.fingerprint == two.manifest.fingerprint
    assert one.manifest.vocab_size > 260 and one.manifest.special_tokens["mask"] >= 0


def test_spawned_workers_give_the_same_artifact(corpus, monkeypatch):
    """The start method used off Linux (spawn: workers load their own tokenizer)."""
    import multiprocessing

    import turbo_dllm.data.pipeline as pipeline

    one = prepare_config(write_config(corpus, workers=1))
    monkeypatch.setattr(pipeline, "_context", lambda: multiprocessing.get_context("spawn"))
    two = prepare_config(write_config(corpus, "p2.yaml", workers=2, output={"path": "b"}))
    assert one.manifest.fingerprint == two.manifest.fingerprint


def test_fingerprint_changes_with_content(corpus):
    base = prepare_config(write_config(corpus))
    other = prepare_config(
        write_config(
            corpus, "p2.yaml", packing={"seq_len": 64, "block_size": 16}, output={"path": "b"}
        )
    )
    assert base.manifest.fingerprint != other.manifest.fingerprint


@pytest.mark.parametrize("name", ["tokens.bin", "loss_mask.bin", "documents.bin"])
def test_validate_catches_a_flipped_byte_in_any_array(corpus, cli, name):
    result = prepare_config(write_config(corpus))
    assert cli("data", "validate", result.path).code == 0
    file = result.path / name
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0x01
    file.write_bytes(bytes(data))
    assert_failed_check(cli("data", "validate", result.path), name, "sha256 mismatch")


def test_a_cut_short_manifest_is_an_error_with_the_way_out(corpus, cli):
    """validate, inspect and stats said only "unreadable manifest", with no hint: the way out is
    to prepare it again, which output.overwrite: true now does for such an artifact."""
    result = prepare_config(write_config(corpus))
    manifest = result.path / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:40])
    # validate's failed check (exit 1); inspect and stats cannot read it (an error, exit 2)
    assert_failed_check(
        cli("data", "validate", result.path), "unreadable manifest", "output.overwrite: true"
    )
    for command in ("inspect", "stats"):
        outcome = cli("data", command, result.path)
        assert_user_error(outcome, "unreadable manifest", "hint:", "output.overwrite: true")
    config = write_config(corpus, "p2.yaml", output={"path": "out", "overwrite": True})
    assert cli("data", "prepare", "--config", config).code == 0
    assert cli("data", "validate", result.path).code == 0


def test_validate_catches_a_truncated_array_and_an_edited_manifest(corpus, cli):
    result = prepare_config(write_config(corpus))
    manifest_file = result.path / "manifest.json"
    document = json.loads(manifest_file.read_text())
    document["special_tokens"]["mask"] = 5
    manifest_file.write_text(json.dumps(document))
    assert_failed_check(cli("data", "validate", result.path), "fingerprint mismatch")
    (result.path / "tokens.bin").write_bytes(b"\0" * 10)
    assert_failed_check(cli("data", "validate", result.path), "tokens.bin", "10 bytes")


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda f: f.write_bytes(f.read_bytes()[:-2]), "fewer than the {n} its manifest says"),
        (lambda f: f.write_bytes(f.read_bytes() + b"\0\0"), "more than the {n} its manifest"),
        (lambda f: f.unlink(), "missing"),
    ],
    ids=["truncated", "grown", "missing"],
)
def test_stats_and_inspect_say_how_an_array_differs_from_its_manifest(corpus, cli, change, said):
    """An array longer than its manifest says was called "missing or truncated"."""
    result = prepare_config(write_config(corpus))
    tokens = result.path / "tokens.bin"
    expected = tokens.stat().st_size
    change(tokens)
    for command in ("stats", "inspect"):
        assert_user_error(
            cli("data", command, result.path), "tokens.bin: ", said.format(n=expected)
        )


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        (("stats", "tokens"), 1, "stats.tokens: 1, but the documents hold"),
        (("stats", "padding_tokens"), 0, "stats.padding_tokens: 0, but the rows have"),
        (("stats", "supervised_tokens"), 7, "stats.supervised_tokens: 7, but the loss mask"),
        (("packing", "align"), "block", "packing.align: block, but document 1 starts at"),
        (("packing", "overflow"), "truncate", "runs across a row boundary"),
        (("supervision",), "full", "supervision: full, but"),
    ],
)
def test_validate_catches_manifest_claims_the_arrays_contradict(corpus, cli, field, value, named):
    """The fingerprint covers the arrays, not the manifest's counts, packing or supervision:
    an artifact whose manifest said other than its arrays hold was 'ok' (validate --config
    trusts packing.align)."""
    write_jsonl(
        corpus / "pairs.jsonl", [{"prompt": f"q{i} " * 9, "completion": "a"} for i in range(9)]
    )
    config = write_config(
        corpus,
        source={"kind": "jsonl", "paths": ["pairs.jsonl"]},
        records={"kind": "prompt_completion"},
        supervision="completion_only",
        packing={"seq_len": 64, "block_size": 8, "align": "none"},
    )
    result = prepare_config(config)
    assert cli("data", "validate", result.path).code == 0
    manifest_file = result.path / "manifest.json"
    document = json.loads(manifest_file.read_text())
    *parents, name = field
    section = document
    for parent in parents:
        section = section[parent]
    section[name] = value
    manifest_file.write_text(json.dumps(document))
    assert_failed_check(cli("data", "validate", result.path), "failed verification", named)


def test_validate_catches_a_changed_tokenizer_file(corpus, cli, hf_tokenizer):
    tokenizer = {"kind": "huggingface", "path": str(hf_tokenizer)}
    result = prepare_config(write_config(corpus, tokenizer=tokenizer))
    copied = result.path / "tokenizer" / "tokenizer.json"
    copied.write_text(copied.read_text() + " ")
    assert_failed_check(cli("data", "validate", result.path), "tokenizer/tokenizer.json")


def test_read_manifest_errors_are_user_errors(tmp_path):
    with pytest.raises(DllmError, match="not found"):
        read_manifest(tmp_path / "nope")
    (tmp_path / "x").mkdir()
    (tmp_path / "x/manifest.json").write_text(json.dumps({"format": "other.v1"}))
    with pytest.raises(
        DllmError,
        match="is not a data artifact manifest .format .other.v1., expected .turbo_dllm.data.v1.",
    ):
        read_manifest(tmp_path / "x")
    (tmp_path / "x/manifest.json").write_text(json.dumps({"format": "turbo_dllm.data.v1"}))
    with pytest.raises(DllmError, match="is not a valid data artifact manifest"):
        verify(tmp_path / "x")


def test_manifest_carries_the_contract_fields(corpus):
    manifest = prepare_config(write_config(corpus)).manifest
    assert manifest.format == "turbo_dllm.data.v1"
    assert len(manifest.fingerprint) == 64
    assert (manifest.seq_len, manifest.block_size, manifest.vocab_size) == (64, 8, 260)
    assert manifest.special_tokens == {"bos": 256, "eos": 257, "mask": 259, "pad": 258}
    assert manifest.num_sequences == manifest.arrays["tokens"].shape[0]
    assert manifest.num_documents == 2600
    assert manifest.tokenizer.kind == "byte_level" and len(manifest.tokenizer.vocab_sha256) == 64


def test_every_file_and_folder_of_an_artifact_is_synced_before_it_is_published(
    corpus, hf_tokenizer, monkeypatch
):
    """Complete or invisible also across a power loss: each file (the tokenizer copies too, which
    export hands on beside a model) and the folders' entries reach the disk before the staging
    folder is renamed into place, and the rename itself is synced (the output's parent)."""
    import os
    import stat

    import turbo_dllm.data.writer as writer

    synced: list[str] = []
    real_fsync, real_rename = os.fsync, os.rename

    def recording_fsync(fd):
        kind = "dir:" if stat.S_ISDIR(os.fstat(fd).st_mode) else ""
        synced.append(kind + os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    renames: list[tuple[str, list[str]]] = []

    def recording_rename(source, target):
        renames.append((str(source), list(synced)))
        return real_rename(source, target)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(writer.os, "rename", recording_rename)
    tokenizer = {"kind": "huggingface", "path": str(hf_tokenizer)}
    result = prepare_config(write_config(corpus, tokenizer=tokenizer, workers=1))
    staging, before = renames[-1]
    before = {s.replace(staging, str(result.path)) for s in before}
    files = [p for p in result.path.rglob("*") if p.is_file()]
    assert len(files) > 4  # the arrays, the manifest, the tokenizer's files
    for path in files:
        assert str(path) in before, (path, sorted(before))
    assert f"dir:{result.path}" in before and f"dir:{result.path / 'tokenizer'}" in before
    assert f"dir:{result.path.parent}" in synced[len(renames[-1][1]) :]  # the rename into place


@pytest.mark.parametrize(
    "extra",
    [
        "tokenizer/added_tokens.json",
        "tokenizer/special_tokens_map.json",
        "notes.txt",
        "tokenizer/sub/x",
    ],
)
def test_validate_flags_a_file_the_manifest_does_not_list(corpus, cli, hf_tokenizer, extra):
    """The manifest lists every tokenizer file with its size and sha256, but validate passed an
    artifact with one more: export hands tokenizer/'s files on beside a model, and
    transformers loads an added_tokens.json or special_tokens_map.json it finds there."""
    tokenizer = {"kind": "huggingface", "path": str(hf_tokenizer)}
    result = prepare_config(write_config(corpus, tokenizer=tokenizer))
    assert cli("data", "validate", result.path).code == 0
    file = result.path / extra
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text("{}")
    shown = extra if "/sub/" not in extra else "tokenizer/sub"
    outcome = cli("data", "validate", result.path)
    assert_failed_check(outcome, f"{shown}: not listed in the manifest", "fix:", "remove", "rm ")
    assert str(result.path / shown) in outcome.err  # the rm names the file itself
    assert "sha256 mismatch" not in outcome.err and "fingerprint" not in outcome.err


def test_validate_flags_a_tokenizer_folder_added_to_a_byte_level_artifact(corpus, cli):
    """A byte-level artifact has no tokenizer/ (its manifest lists no file): one holding a
    tokenizer.json would be copied beside an exported model as the model's tokenizer."""
    result = prepare_config(write_config(corpus))
    assert not (result.path / "tokenizer").exists()
    (result.path / "tokenizer").mkdir()
    # An empty tokenizer/ holds nothing export could hand on: left alone.
    assert cli("data", "validate", result.path).code == 0
    (result.path / "tokenizer" / "tokenizer.json").write_text("{}")
    assert_failed_check(
        cli("data", "validate", result.path), "tokenizer/tokenizer.json: not listed in the manifest"
    )


def test_only_unlisted_files_change_validate_s_hint(corpus, cli):
    result = prepare_config(write_config(corpus))
    (result.path / "notes.txt").write_text("mine")
    outcome = cli("data", "validate", result.path)
    assert_failed_check(
        outcome, "notes.txt: not listed in the manifest", "--set output.overwrite=true"
    )
    (result.path / "notes.txt").unlink()
    assert cli("data", "validate", result.path).code == 0
