"""Ctrl-C or SIGTERM reaching a `dllm data prepare` (output.overwrite: true) between its two
renames: the old artifact moved aside to its backup, the new one not yet in. The interrupt was
raised there: the output was left empty, the old artifact in the backup, and the complete new
one deleted with the staging folder. Now it waits for the renames: the new artifact is in place,
no backup is left, and the job still ends by the signal. The signal is real: the child's own
script (no hook in the product) sends it to itself as the old artifact is moved aside."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.data.helpers import leftovers, prepare_config, write_config, write_jsonl
from turbo_dllm.data.artifact import verify

CHILD = r"""
import os, signal, sys

real_rename = os.rename
how = int(sys.argv[1])

def rename(src, dst, *args, **kwargs):
    real_rename(src, dst, *args, **kwargs)
    if ".backup-" in os.path.basename(os.fspath(dst)):
        os.kill(os.getpid(), how)  # the old artifact is aside, the new one not in yet

os.rename = rename
from turbo_dllm.cli import main

sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_between_the_renames_lands_after_them(tmp_path, how):
    write_jsonl(tmp_path / "data.jsonl", [{"text": "one"}])
    config = write_config(tmp_path, output={"path": "out", "overwrite": True})
    prepare_config(config)
    write_jsonl(tmp_path / "data.jsonl", [{"text": "two"}])
    command = [sys.executable, "-c", CHILD, str(int(how)), "data", "prepare", "--config"]
    child = subprocess.run([*command, str(config)], capture_output=True, text=True, timeout=300)
    assert child.returncode == (130 if how == signal.SIGINT else -how), child.stderr
    assert "Traceback" not in child.stderr
    new = prepare_config(write_config(tmp_path, output={"path": "check"})).manifest.fingerprint
    assert verify(tmp_path / "out").fingerprint == new
    assert leftovers(tmp_path) == []
