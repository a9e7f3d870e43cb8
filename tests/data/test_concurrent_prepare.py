"""Two `dllm data prepare` jobs writing one output that the DLLM_HOME lock does not serialise
(another user's or a node-local DLLM_HOME, another host): the second's clean-up removed the
first's staging folder while it was written (the first then failed with 'No such file ...
check free space'), and a job without output.overwrite replaced an artifact the other
published while it ran."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.data.helpers import leftovers, prepare_config, write_config, write_jsonl
from turbo_dllm.data.artifact import verify
from turbo_dllm.data.writer import staged_artifact
from turbo_dllm.errors import DllmError


def _staging(folder, pid: int):
    path = folder / f".out.staging-{os.uname().nodename}-{pid}-0123456789ab"
    path.mkdir()
    (path / "tokens.bin").write_bytes(b"half")
    return path


def test_a_running_jobs_staging_folder_is_left_and_a_killed_ones_removed(tmp_path):
    write_jsonl(tmp_path / "data.jsonl", [{"text": "one"}])
    config = write_config(tmp_path)
    running = subprocess.Popen(["sleep", "60"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        live = _staging(tmp_path, running.pid)
        _staging(tmp_path, gone.pid)
        (tmp_path / ".out.staging-0123456789ab").mkdir()  # an older turbo-dllm's, killed
        prepare_config(config)
        assert verify(tmp_path / "out").num_sequences == 1
        assert leftovers(tmp_path) == [live.name]
        assert (live / "tokens.bin").read_bytes() == b"half"
    finally:
        running.kill()
        running.wait()


def test_an_artifact_written_while_the_job_ran_is_not_replaced_without_overwrite(tmp_path):
    write_jsonl(tmp_path / "data.jsonl", [{"text": "one"}])
    other = prepare_config(write_config(tmp_path, output={"path": "other"})).manifest
    out = tmp_path / "out"
    with pytest.raises(DllmError, match="it was written while this job ran"):
        with staged_artifact(out, overwrite=False) as staging:
            shutil.copytree(tmp_path / "other", out)  # the other job publishes first
            (staging / "manifest.json").write_text("{}")
    assert verify(out).fingerprint == other.fingerprint
    assert leftovers(tmp_path) == []
