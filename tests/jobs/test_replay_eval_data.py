"""A run manifest pins the held-out artifact its `eval:` section scores (`eval_data`): a replay
after the held-out data was prepared again from other documents is refused with a field diff
(its eval_loss would measure other sequences), as a changed training artifact is."""

from __future__ import annotations

import inspect
import json
import shutil
import textwrap

import pytest

from tests.data.helpers import prepare_config, write_jsonl
from tests.data.helpers import write_config as write_prepare_config
from tests.helpers import assert_user_error
from tests.jobs.test_replay_inputs import record
from turbo_dllm.jobs import provenance


def _held_out(folder, module):
    lines = inspect.getsource(module).splitlines()
    docs = ["\n".join(lines[i : i + 12]) for i in range(0, len(lines), 12)]
    write_jsonl(folder / "data.jsonl", [{"text": d} for d in docs if d.strip()])
    config = write_prepare_config(
        folder, packing={"seq_len": 64, "block_size": 16}, output={"path": "out", "overwrite": True}
    )
    prepare_config(config)
    return folder / "out"


@pytest.fixture
def pinned_code(monkeypatch):
    code = provenance.code_version()  # others may edit this checkout while the test runs
    monkeypatch.setattr(provenance, "code_version", lambda: dict(code))


def test_held_out_data_prepared_again_refuses_the_replay(cli, spec_file, workdir, pinned_code):
    heldout = _held_out(workdir / "heldout", textwrap)
    sets = ("--set", f"eval.artifact={heldout}", "--set", "eval.interval=2")
    path, manifest = record(cli, "--config", spec_file, *sets, "--run-dir", "a")
    fingerprint = json.loads((heldout / "manifest.json").read_text())["fingerprint"]
    assert manifest.eval_data.fingerprint == fingerprint and "eval_data" in manifest.recorded_inputs
    assert cli("launch", "--manifest", path, "--dry-run", "--json").code == 0

    _held_out(workdir / "heldout", json)  # other documents, the same folder
    result = cli("launch", "--manifest", path, "--dry-run")
    assert_user_error(result, "eval_data.fingerprint", "eval.artifact (held-out data)")
    shutil.rmtree(workdir / "heldout" / "out")  # gone: drift as well, not a traceback
    assert_user_error(cli("launch", "--manifest", path, "--dry-run"), "eval_data")


def test_a_run_without_evaluation_records_none(cli, spec_file, workdir):
    _, manifest = record(cli, "--config", spec_file, "--run-dir", "b")
    assert manifest.eval_data is None and "eval_data" in manifest.recorded_inputs


def test_held_out_arrays_changed_in_place_refuse_the_replay(cli, spec_file, workdir, pinned_code):
    """A replay re-hashed the training artifact's arrays but took the held-out artifact's
    recorded fingerprint on trust: bytes changed under its unchanged manifest.json replayed
    without a word. Its arrays are re-hashed the same way now."""
    heldout = _held_out(workdir / "heldout", textwrap)
    sets = ("--set", f"eval.artifact={heldout}", "--set", "eval.interval=2")
    path, _ = record(cli, "--config", spec_file, *sets, "--run-dir", "a")
    tokens = heldout / "tokens.bin"
    original = tokens.read_bytes()
    tokens.write_bytes(bytes([original[0] ^ 1]) + original[1:])  # manifest.json untouched

    refused = cli("launch", "--manifest", path, "--dry-run")
    assert_user_error(
        refused, "refused: 1 input drifted", "tokens.bin: sha256 mismatch", "eval.artifact"
    )
    # one line, as the count says, naming the held-out artifact and the group to restore
    [line] = [x for x in refused.err.splitlines() if x.startswith("  - ")]
    assert line.startswith("  - eval_data.content: matches its manifest -> ")
    assert str(heldout) in line
    assert "restore the recorded eval.artifact (held-out data)" in refused.err
    tokens.write_bytes(original)
    assert cli("launch", "--manifest", path, "--dry-run", "--json").code == 0
