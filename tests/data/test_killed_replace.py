"""A `dllm data prepare` replacing an artifact (output.overwrite: true) SIGKILLed between its two
renames: the old artifact moved aside to `.out.backup-*`, the new one not yet moved in. The
output path is empty; the backup must be visible (validate, the trainer's error, doctor) with
the `mv` that restores it, and the next prepare to that output restores it before anything else.

The kill is real: prepare runs in a child whose os.rename (patched from the child's own script,
no hook in the writer) SIGKILLs the child at the rename of the staging folder into place.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys

import pytest

from tests.data.helpers import leftovers, prepare_config, write_config, write_jsonl
from tests.helpers import assert_user_error
from turbo_dllm.data.artifact import read_manifest, verify
from turbo_dllm.data.loader import ArtifactLoader
from turbo_dllm.errors import DllmError

CHILD = r"""
import os, signal, sys
from pathlib import Path

real_rename = os.rename

def rename(src, dst, *args, **kwargs):
    src, dst = Path(src), Path(dst)
    aside = list(dst.parent.glob(f".{dst.name}.backup-*"))
    if ".staging-" in src.name and aside and not dst.exists():
        os.kill(os.getpid(), signal.SIGKILL)  # the old artifact is aside, the new one not in
    return real_rename(src, dst, *args, **kwargs)

os.rename = rename
from turbo_dllm.cli import main

sys.exit(main(sys.argv[1:]))
"""


def killed_replacing(config) -> None:
    """Run `dllm data prepare --config CONFIG` in a child SIGKILLed between its renames."""
    process = subprocess.run(
        [sys.executable, "-c", CHILD, "data", "prepare", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert process.returncode == -signal.SIGKILL, (process.returncode, process.stderr)


@pytest.fixture
def killed(tmp_path):
    """(folder, config, the first artifact's fingerprint, the backup) after a killed replace."""
    write_jsonl(tmp_path / "data.jsonl", [{"text": "one"}])
    config = write_config(tmp_path, output={"path": "out", "overwrite": True})
    before = prepare_config(config).manifest.fingerprint
    write_jsonl(tmp_path / "data.jsonl", [{"text": "two"}])
    killed_replacing(config)
    assert not (tmp_path / "out").exists()
    backups = [p for p in tmp_path.iterdir() if p.name.startswith(".out.backup-")]
    assert len(backups) == 1
    assert verify(backups[0]).fingerprint == before
    return tmp_path, config, before, backups[0]


def _restore(backup, out) -> str:
    return f"mv {shlex.quote(str(backup))} {shlex.quote(str(out))}"


def test_validate_and_the_trainer_name_the_backup_and_how_to_restore_it(killed, cli):
    folder, _, before, backup = killed
    out = folder / "out"
    outcome = cli("data", "validate", out)
    assert_user_error(outcome, "not found", "backup of the previous artifact", str(backup))
    assert _restore(backup, out) in outcome.err
    # The trainer (build_data) and the loader read the manifest with read_manifest.
    for opening in (
        lambda: read_manifest(out),
        lambda: ArtifactLoader(out, seq_len=64, micro_batch_size=1, dp_rank=0, dp_size=1, seed=0),
    ):
        with pytest.raises(DllmError, match="not found") as error:
            opening()
        assert str(backup) in str(error.value) and _restore(backup, out) in error.value.hint
    # The command it gives does restore it.
    assert subprocess.run(shlex.split(_restore(backup, out))).returncode == 0
    assert cli("data", "validate", out).code == 0 and verify(out).fingerprint == before


def test_the_next_prepare_restores_the_backup_then_replaces_it(killed, cli):
    folder, config, before, backup = killed
    result = cli("data", "prepare", "--config", config)
    assert result.code == 0, result.err
    assert f"restored {folder / 'out'} from {backup}" in result.err
    after = verify(folder / "out").fingerprint
    assert after != before
    assert leftovers(folder) == []


def test_a_prepare_without_overwrite_restores_the_backup_and_says_so(killed, cli):
    folder, _, before, backup = killed
    config = write_config(folder, "again.yaml", output={"path": "out"})
    outcome = cli("data", "prepare", "--config", config)
    assert_user_error(outcome, "already exists", f"restored just now from {backup}", "overwrite")
    assert verify(folder / "out").fingerprint == before
    assert leftovers(folder) == []


def test_a_backup_is_never_removed_while_no_artifact_stands_in_its_place(killed, cli):
    """An empty folder made at the output path since (mkdir -p out) is no artifact: the
    backup is restored into its place, not thrown away as the leftover of a finished job."""
    folder, config, before, _ = killed
    (folder / "out").mkdir()
    write_config(folder, "again.yaml", output={"path": "out"})
    outcome = cli("data", "prepare", "--config", folder / "again.yaml")
    assert_user_error(outcome, "restored just now")
    assert verify(folder / "out").fingerprint == before
    assert leftovers(folder) == []


def test_backups_of_an_artifact_that_was_replaced_are_removed(tmp_path, cli):
    """Killed after the new artifact was moved in (while the old one was being deleted): the
    backup is the artifact the user asked to replace, and the next prepare removes it."""
    write_jsonl(tmp_path / "data.jsonl", [{"text": "one"}])
    config = write_config(tmp_path, output={"path": "out", "overwrite": True})
    fingerprint = prepare_config(config).manifest.fingerprint
    (tmp_path / ".out.backup-x").mkdir()
    assert cli("data", "validate", tmp_path / "out").code == 0
    assert "restored" not in (result := cli("data", "prepare", "--config", config)).err
    assert result.code == 0 and verify(tmp_path / "out").fingerprint == fingerprint
    assert leftovers(tmp_path) == []


def test_doctor_names_the_backup(killed, cli):
    folder, _, _, backup = killed
    train = folder / "train.yaml"
    assert cli("init", folder / "p").code == 0
    text = (folder / "p" / "train.yaml").read_text()
    train.write_text(text.replace("data/prepared", str(folder / "out")))
    doctor = json.loads(cli("doctor", "--config", train, "--json").out)
    check = {c["name"]: c for c in doctor["checks"]}["data artifact"]
    assert str(backup) in check["detail"]
    assert _restore(backup, folder / "out") in check["fix"]
