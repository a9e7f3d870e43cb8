"""Two `dllm data prepare` jobs writing one output. Ones that the DLLM_HOME lock does not
serialise (another user's or a node-local DLLM_HOME, another host): the second's clean-up
removed the first's staging folder while it was written (the first then failed with 'No such
file ... check free space'), and a job without output.overwrite replaced an artifact the other
published while it ran. Ones that share it: the second waited without a word for as long as
the first ran."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading

import pytest

from tests.data.helpers import leftovers, prepare_config, write_config, write_jsonl
from turbo_dllm.data.artifact import verify
from turbo_dllm.data.writer import _lock_for, staged_artifact
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


HOLDER = (
    "import fcntl, os, sys\n"
    "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('HELD', flush=True)\n"
    "sys.stdin.read()\n"
)


def test_a_job_waiting_for_another_writing_the_output_says_so(tmp_path):
    write_jsonl(tmp_path / "data.jsonl", [{"text": "one"}])
    config = write_config(tmp_path)
    out = (tmp_path / "out").resolve()
    lock = _lock_for(out).lock_file  # the lock another job writing `out` holds
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, lock],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    job = None
    try:
        assert holder.stdout.readline() == "HELD\n"
        job = subprocess.Popen(
            [sys.executable, "-m", "turbo_dllm", "data", "prepare", "--config", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        watchdog = threading.Timer(120, job.kill)
        watchdog.start()
        try:
            said = next((line for line in job.stderr if "waiting" in line), "")
        finally:
            watchdog.cancel()
        assert said == (
            f"dllm: waiting for another `dllm data prepare` writing {out} (pid {holder.pid}) "
            "to finish\n"
        )
        assert job.poll() is None and not out.exists()
        holder.stdin.close()  # the other job ends
        holder.wait(timeout=60)
        _, err = job.communicate(timeout=120)
        assert job.returncode == 0, err
        assert verify(out).num_sequences == 1
    finally:
        for process in (holder, job):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
