"""`dllm data validate` (and every reader: inspect, stats, the trainer) of an output whose
`dllm data prepare` was SIGKILLed mid-write said only 'data artifact not found ... create it',
while a hidden staging folder as large as the artifact sat beside it; and of one a prepare is
writing now, the same. The kill is real: the child's own script SIGKILLs it once rows are in
its staging folder (no hook in the product)."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys

from tests.data.helpers import leftovers, prepare_config, write_config, write_jsonl
from tests.helpers import assert_user_error

CHILD = r"""
import os, signal, sys
from turbo_dllm.data import writer

write = writer.ArrayWriter.write

def killed(self, array):
    write(self, array)
    self._handle.flush()
    os.kill(os.getpid(), signal.SIGKILL)  # rows are in the staging folder, no manifest yet

writer.ArrayWriter.write = killed
from turbo_dllm.cli import main

sys.exit(main(sys.argv[1:]))
"""


def test_validate_names_a_killed_prepare_s_staging_folder_and_a_running_one(tmp_path, cli):
    write_jsonl(tmp_path / "data.jsonl", [{"text": "one"}])
    config = write_config(tmp_path)
    child = subprocess.run(
        [sys.executable, "-c", CHILD, "data", "prepare", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    [left] = leftovers(tmp_path)
    staging = tmp_path / left
    outcome = cli("data", "validate", str(tmp_path / "out"))
    assert_user_error(
        outcome,
        "data artifact not found",
        "a `dllm data prepare` writing it was killed before it finished and left its staging "
        f"folder {staging} (",
        f"`rm -r {shlex.quote(str(staging))}` frees its space",
    )
    prepare_config(config)  # removes it
    assert leftovers(tmp_path) == []

    running = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "out2").mkdir()
        writing = tmp_path / f".out2.staging-{os.uname().nodename}-{running.pid}-0123456789ab"
        writing.mkdir()
        outcome = cli("data", "validate", str(tmp_path / "out2"))
        assert_user_error(
            outcome,
            f"a `dllm data prepare` (pid {running.pid}) is writing it ({writing})",
            "wait for that prepare to finish",
        )
    finally:
        running.kill()
        running.wait()
    # Another host's: its process cannot be asked, and was said to be writing it for ever.
    shutil.rmtree(writing)
    elsewhere = tmp_path / ".out2.staging-other-node-7-0123456789ab"
    elsewhere.mkdir()
    outcome = cli("data", "validate", str(tmp_path / "out2"))
    assert_user_error(
        outcome,
        f"a `dllm data prepare` on host other-node (pid 7) is writing it, or was killed there "
        f"({elsewhere})",
        f"where it is gone, `rm -r {shlex.quote(str(elsewhere))}` frees its space",
    )
