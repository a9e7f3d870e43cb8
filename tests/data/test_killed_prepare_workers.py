"""A `dllm data prepare` with tokenizer workers SIGKILLed mid-job: its workers tokenized on,
orphaned, and each printed a BrokenPipeError traceback into the user's terminal as it handed
back its chunk. They now end with it. The workers here are slowed (a second a chunk, patched in
from the child's own script) so that the kill lands while they work."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.data.helpers import write_config, write_jsonl
from tests.helpers import ROOT

CHILD = r"""
import os, sys, time
from pathlib import Path
from turbo_dllm.data import pipeline

process = pipeline.ChunkProcessor.process

def slow(self, chunk):
    Path(sys.argv[1], f"busy-{os.getpid()}").touch()
    time.sleep(1.0)
    return process(self, chunk)

pipeline.ChunkProcessor.process = slow
from turbo_dllm.cli import main

sys.exit(main(sys.argv[2:]))
"""


def test_workers_end_with_a_prepare_killed_outright(tmp_path):
    write_jsonl(tmp_path / "data.jsonl", [{"text": f"document {i}"} for i in range(4000)])
    config = write_config(tmp_path, workers=2)
    (tmp_path / "marks").mkdir()
    command = [sys.executable, "-c", CHILD, str(tmp_path / "marks"), "data", "prepare"]
    job = subprocess.Popen(
        [*command, "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 120
        while len(os.listdir(tmp_path / "marks")) < 2:  # both workers hold a chunk
            assert job.poll() is None, job.communicate()
            assert time.monotonic() < deadline, "the workers never started"
            time.sleep(0.02)
        os.kill(job.pid, signal.SIGKILL)
        _, err = job.communicate(timeout=60)  # its stderr stays open while a worker lives
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == -signal.SIGKILL
    assert "Traceback" not in err, err
    # Its stderr closes as a worker's files close on exit, a moment before the kernel marks the
    # process dead (on a loaded host it read 'R' then): each gets a few seconds to be gone.
    for mark in os.listdir(tmp_path / "marks"):
        pid = mark.removeprefix("busy-")
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), f"worker {mark} outlived its prepare"


def _alive(pid: str) -> bool:
    """Whether process `pid` runs (not gone, not a zombie or dead)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
