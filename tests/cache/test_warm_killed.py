"""`dllm cache pack --warm` stopped while its warm-up step runs: SIGTERM (`timeout`, a
scheduler's limit) ended the pack at once, leaving the step training on, orphaned, and its
folder (a run dir with a checkpoint of the model, and the caches) in TMPDIR; SIGKILL left both
too, and nothing ever removed `dllm-warm-*` folders. The step here is a stand-in that prints
its pid and sleeps (patched in from the pack's own script: no hook in the product)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.cache.conftest import clean_env
from tests.helpers import ROOT
from tests.train.util import write_config

PACK = r"""
import sys
from turbo_dllm.cache import warm

STEP = "import os, sys, time; print('STEP', os.getpid(), flush=True); time.sleep(120)"
if sys.argv[1] == "fails":
    STEP = "import sys; sys.exit(3)"
warm._command = lambda args, world_size: [sys.executable, "-c", STEP]
from turbo_dllm.cli import main

sys.exit(main(sys.argv[2:]))
"""


def _gone(pid: int, timeout: float = 20) -> bool:
    """Whether process `pid` ended (gone, or a zombie its new parent has yet to reap)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def _pack(tmp_path, behaviour: str) -> subprocess.Popen:
    config = write_config(tmp_path / "train.yaml")
    env = clean_env(TMPDIR=str(tmp_path / "tmp"), PYTHONPATH=str(ROOT))
    (tmp_path / "tmp").mkdir(exist_ok=True)
    command = ["cache", "pack", "--config", str(config), "--warm", "--out", str(tmp_path / "p")]
    return subprocess.Popen(
        [sys.executable, "-c", PACK, behaviour, *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _step_pid(pack: subprocess.Popen) -> int:
    for line in pack.stderr:  # the step's stdout goes to the pack's stderr
        if line.startswith("STEP "):
            return int(line.split()[1])
    pack.wait(timeout=60)
    pytest.fail(f"the warm-up step never started (exit {pack.returncode})")


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_pack_stopped_mid_warm_up_takes_its_step_and_folder_with_it(tmp_path, how):
    pack = _pack(tmp_path, "sleeps")
    try:
        step = _step_pid(pack)
        os.kill(pack.pid, how)
        pack.wait(timeout=60)
    finally:
        pack.kill()
        pack.wait()
        pack.stderr.close()
        pack.stdout.close()
    assert pack.returncode == -how
    assert _gone(step), "the warm-up step trains on without its pack"
    left = os.listdir(tmp_path / "tmp")
    if how == signal.SIGTERM:
        assert left == []
        return
    assert [name.startswith("dllm-warm-") for name in left] == [True]
    # The next --warm on this host removes the killed one's folder (its own goes too).
    again = _pack(tmp_path, "fails")
    _, err = again.communicate(timeout=120)
    assert again.returncode == 2 and "the warm-up step of" in err, err
    assert os.listdir(tmp_path / "tmp") == []
