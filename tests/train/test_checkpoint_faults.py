"""Checkpoints under real faults: a `dllm train` process SIGKILLed at each point of a save (the
pause is patched in from the child's own script, not a hook in the trainer) and at random times,
a full disk (a small tmpfs, as root), a resume pointed at a torn folder, two processes training
into one run dir, SIGTERM. Each time the next `dllm train` resumes from the newest complete
checkpoint and no `step_*` folder is ever incomplete.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.helpers import assert_user_error
from tests.train.util import losses, metrics, write_config
from turbo_dllm.train.checkpoint import read_meta

pytestmark = pytest.mark.slow

# The child: argv[1] names where it pauses (prints PAUSED, then sleeps until killed), argv[2] at
# the save of which step; the rest is the dllm command line.
CHILD = """
import os, sys, time
import torch.distributed.checkpoint as dcp
from turbo_dllm.train import checkpoint

where, step = sys.argv[1], "step_%08d" % int(sys.argv[2])

def pause():
    sys.stdout.write("PAUSED\\n")
    sys.stdout.flush()
    time.sleep(300)

if where == "shards-written":  # the tensors are in the temp folder, no checkpoint.json yet
    real_save = dcp.save

    def save(state, checkpoint_id):
        real_save(state, checkpoint_id=checkpoint_id)
        if checkpoint_id.endswith(step):
            pause()

    dcp.save = save
elif where == "before-rename":  # the temp folder complete, not yet renamed into place
    real_replace = checkpoint._replace

    def replace(new, final):
        if final.name == step:
            pause()
        real_replace(new, final)

    checkpoint._replace = replace
else:  # between the two renames of a replaced step, or a prune's rename and its delete
    marker = {"between-renames": ".old-" + step, "mid-prune": ".tmp-step_pruned-"}[where]

    class Os:
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def replace(src, dst):
            os.replace(src, dst)
            if os.path.basename(os.fspath(dst)).startswith(marker):
                pause()

    checkpoint.os = Os()
from turbo_dllm.cli import main

sys.exit(main(sys.argv[3:]))
"""

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def start_child(where: str, step: int, *command) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, where, str(step), *map(str, command)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )


def wait_paused(process: subprocess.Popen) -> None:
    watchdog = threading.Timer(180, process.kill)
    watchdog.start()
    try:
        paused = any(line == "PAUSED\n" for line in process.stdout)
    finally:
        watchdog.cancel()
    if not paused:
        process.wait(timeout=60)
        pytest.fail(f"the child never paused (exit {process.returncode}): {process.stderr.read()}")


def kill(process: subprocess.Popen) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    process.stdout.close()
    process.stderr.close()
    assert process.returncode == -signal.SIGKILL


def killed_at(where: str, step: int, *command) -> None:
    process = start_child(where, step, *command)
    wait_paused(process)
    kill(process)


def dllm(*args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "turbo_dllm", *map(str, args)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=timeout,
    )


def steps_on_disk(checkpoints: Path) -> dict[str, bool]:
    """Every entry of the checkpoint folder: whether it holds a checkpoint.json. Every
    `step_*` must be complete, and read back."""
    found = {}
    for child in sorted(checkpoints.iterdir()):
        found[child.name] = (child / "checkpoint.json").is_file()
        if child.name.startswith("step_"):
            assert found[child.name], f"{child} is a step folder without its checkpoint.json"
            assert read_meta(child).step == int(child.name.removeprefix("step_"))
            assert (child / ".metadata").is_file() and (child / "rank_00000.pt").is_file()
    return found


def resumed_step(result: subprocess.CompletedProcess) -> int | None:
    assert result.returncode == 0, result.stderr
    match = re.search(r"resumed from \S+ \(step (\d+)\)", result.stdout + result.stderr)
    return int(match[1]) if match else None


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run's loss trace (6 steps, a checkpoint every 2, 2 kept)."""
    root = tmp_path_factory.mktemp("reference")
    config = config_file(root)
    result = dllm("train", "--config", config, "--run-dir", root / "run")
    assert result.returncode == 0, result.stderr
    return losses(root / "run")


def config_file(folder: Path, *overrides: str) -> Path:
    return write_config(
        folder / "train.yaml",
        "training.steps=6",
        "checkpoint.interval=2",
        "checkpoint.keep_last=2",
        *overrides,
    )


@pytest.mark.parametrize(
    ("where", "newest"),
    [("shards-written", 4), ("before-rename", 4), ("mid-prune", 6)],
)
def test_a_save_killed_midway_resumes_from_the_newest_complete_step(
    tmp_path, reference, where, newest
):
    """Killed while step 6 is saved: step 2 and 4 are both still there until step 6 is in
    place (keep_last never deletes before), and the next run resumes from the newest complete
    one, with the uninterrupted loss trace."""
    config, run = config_file(tmp_path), tmp_path / "run"
    killed_at(where, 6, "train", "--config", config, "--run-dir", run)
    found = steps_on_disk(run / "checkpoints")
    complete = sorted(name for name, done in found.items() if name.startswith("step_"))
    if newest == 4:
        assert complete == ["step_00000002", "step_00000004"]
    else:  # step 6 is in; step 2 was renamed away for deletion
        assert complete == ["step_00000004", "step_00000006"]
    result = dllm("train", "--config", config, "--run-dir", run)
    assert resumed_step(result) == newest
    assert losses(run) == reference
    found = steps_on_disk(run / "checkpoints")
    assert sorted(found) == ["step_00000004", "step_00000006"]  # temp folders swept


def test_a_replacement_killed_between_its_renames_resumes_from_the_aside_copy(tmp_path):
    """A resume from step 2 of a run that reached step 4 saves step 4 again: killed after the
    old step 4 moved aside and before the new one moved in, the aside copy is step 4."""
    config, run = config_file(tmp_path, "training.steps=4"), tmp_path / "run"
    assert dllm("train", "--config", config, "--run-dir", run).returncode == 0
    older = run / "checkpoints/step_00000002"
    command = ("train", "--config", config, "--run-dir", run, "--set")
    killed_at("between-renames", 4, *command, f"checkpoint.resume={older}")
    found = steps_on_disk(run / "checkpoints")
    assert found == {
        ".old-step_00000004": True,
        ".tmp-step_00000004": True,
        "step_00000002": True,
    } or found == {".old-step_00000004": True, "step_00000002": True, "step_00000004": True}
    result = dllm("train", "--config", config, "--run-dir", run, "--set", "training.steps=6")
    assert resumed_step(result) == 4
    assert sorted(steps_on_disk(run / "checkpoints")) == ["step_00000004", "step_00000006"]


def test_killed_at_random_times_every_step_folder_is_complete(tmp_path, reference):
    """SIGKILL at random moments of a run that saves every step: after each kill every
    `step_*` is complete, and `resume: auto` takes the newest; the run then ends with the
    uninterrupted loss trace."""
    config = config_file(tmp_path, "checkpoint.interval=1")
    run = tmp_path / "run"
    command = [sys.executable, "-m", "turbo_dllm", "train", "--config", config, "--run-dir", run]
    rng = random.Random(0)
    for _ in range(4):
        process = subprocess.Popen(
            [str(a) for a in command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=ENV
        )
        # wait for training to start (the first step prints nothing: poll the metrics file)
        deadline = time.monotonic() + 120
        while not (run / "metrics.jsonl").exists() and process.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 1.5))
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
        process.stdout.close()
        if (run / "checkpoints").is_dir():
            steps_on_disk(run / "checkpoints")
    result = dllm("train", "--config", config, "--run-dir", run)
    assert result.returncode == 0, result.stderr
    assert losses(run) == reference
    assert sorted(steps_on_disk(run / "checkpoints")) == ["step_00000005", "step_00000006"]


def test_resume_from_a_torn_step_folder_is_refused(tmp_path):
    """`resume:` naming a save's temp folder, or a step folder without its checkpoint.json:
    an error naming it, nothing trained."""
    config, run = config_file(tmp_path, "training.steps=2"), tmp_path / "run"
    killed_at("shards-written", 2, "train", "--config", config, "--run-dir", run)
    torn = run / "checkpoints/.tmp-step_00000002"
    assert (torn / ".metadata").is_file() and not (torn / "checkpoint.json").exists()
    fake = shutil.copytree(torn, run / "checkpoints/step_00000002")  # as if renamed by hand
    for path in (torn, fake):
        result = dllm(
            "train", "--config", config, "--run-dir", run, "--set", f"checkpoint.resume={path}"
        )
        # refused with the spec's inputs, before the run dir is touched (jobs.launcher.check_inputs)
        assert_user_error(
            result_of(result), f"checkpoint.resume: {path} holds no complete checkpoint"
        )
    assert not (run / "checkpoints/step_00000002/checkpoint.json").exists()


def result_of(proc: subprocess.CompletedProcess):
    """For `assert_user_error`: stderr from the error on (the lines training printed before
    it are not the error)."""
    start = proc.stderr.find("dllm: error:")

    class Result:
        code, out, err = proc.returncode, proc.stdout, proc.stderr[max(start, 0) :]

    return Result


def test_a_second_process_training_into_a_run_dir_in_use_is_refused(tmp_path):
    """While one `dllm train` runs in a run dir, a second one there is refused by name (it
    would interleave its checkpoints and metrics with the first's); once the first is gone
    (even by SIGKILL, which leaves its lock file) the run dir trains again."""
    config, run = config_file(tmp_path), tmp_path / "run"
    first = start_child("shards-written", 4, "train", "--config", config, "--run-dir", run)
    try:
        wait_paused(first)
        before = steps_on_disk(run / "checkpoints")
        second = dllm("train", "--config", config, "--run-dir", run)
        assert_user_error(
            result_of(second), "is in use by another dllm train", str(run / "checkpoints")
        )
        assert f"pid {first.pid}" in second.stderr
        assert steps_on_disk(run / "checkpoints") == before
    finally:
        kill(first)
    result = dllm("train", "--config", config, "--run-dir", run)
    assert resumed_step(result) == 2


# The child for SIGTERM at a step boundary: it sends itself a real SIGTERM once step 3 is read.
SIGTERM_CHILD = """
import os, signal, sys
from turbo_dllm.train.trainer import Trainer

real_report = Trainer._report

def report(self, queued, *args):
    real_report(self, queued, *args)
    if queued.step + 1 == 3:
        os.kill(os.getpid(), signal.SIGTERM)

Trainer._report = report
from turbo_dllm.cli import main

sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_saves_the_step_it_arrives_in_and_ends_with_143(tmp_path, reference):
    """SIGTERM (a scheduler's time limit or preemption, torchrun passing it on, `kill`) is noted:
    the step in progress finishes, is saved, and `dllm train` ends with 143 (128 + SIGTERM);
    the next run resumes from that step and the loss trace is the uninterrupted one."""
    config, run = config_file(tmp_path), tmp_path / "run"
    process = subprocess.run(
        [sys.executable, "-c", SIGTERM_CHILD, "train", "--config", str(config), "--run-dir",
         str(run)],
        capture_output=True, text=True, env=ENV, timeout=300,
    )  # fmt: skip
    assert process.returncode == 143, process.stderr
    stopped = re.search(r"stopping after step (\d+): SIGTERM received \(checkpoint saved\)",
                        process.stdout + process.stderr)  # fmt: skip
    assert stopped, process.stdout + process.stderr
    step = int(stopped[1])
    assert 3 <= step < 6  # the step queued when it arrived, not the run's last
    assert steps_on_disk(run / "checkpoints")[f"step_{step:08d}"]
    assert metrics(run)[-1]["step"] == step
    result = dllm("train", "--config", config, "--run-dir", run)
    assert resumed_step(result) == step
    assert losses(run) == reference


def test_a_second_sigterm_ends_a_run_at_once_and_the_next_resumes(tmp_path, reference):
    """The first SIGTERM is noted while a save is under way (here paused in it), and so is a
    repeat within `REPEAT_WINDOW_S` (torchrun or SLURM passing the same stop on); a SIGTERM after
    that window ends `dllm train` at once by that signal, with no save of its own; the next run
    resumes from the last complete checkpoint."""
    from turbo_dllm.train.stop import REPEAT_WINDOW_S

    config, run = config_file(tmp_path), tmp_path / "run"
    process = start_child("shards-written", 4, "train", "--config", config, "--run-dir", run)
    wait_paused(process)
    os.kill(process.pid, signal.SIGTERM)
    noted = time.monotonic()
    time.sleep(0.5)
    assert process.poll() is None  # noted, not ended: the save goes on
    os.kill(process.pid, signal.SIGTERM)  # a repeat: the same stop
    time.sleep(0.5)
    assert process.poll() is None
    time.sleep(max(0.0, noted + REPEAT_WINDOW_S + 1 - time.monotonic()))
    os.kill(process.pid, signal.SIGTERM)
    process.wait(timeout=60)
    process.stdout.close()
    process.stderr.close()
    assert process.returncode == -signal.SIGTERM
    result = dllm("train", "--config", config, "--run-dir", run)
    assert resumed_step(result) == 2
    assert losses(run) == reference


def can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs (one tiny checkpoint is 1.6 MB): root only; unmounted after."""
    if not can_mount():
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)])
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_during_a_save_is_a_user_error_and_the_run_resumes(tmp_path, small_disk):
    """Step 2 fits, step 4 does not: `dllm: error:` naming the checkpoint and the full disk, no
    traceback, step 2 intact and the temp folder gone (its space given back); with the space
    there (a copy of the run dir on a larger disk) the run resumes from step 2."""
    config, run = config_file(tmp_path, "training.steps=4"), small_disk / "run"
    result = dllm("train", "--config", config, "--run-dir", run)
    assert_user_error(
        result_of(result), f"cannot write the checkpoint {str(run / 'checkpoints/step_00000004')!r}"
    )
    assert "disk is full" in result.stderr
    assert steps_on_disk(run / "checkpoints") == {"step_00000002": True}
    moved = shutil.copytree(run, tmp_path / "run")
    result = dllm("train", "--config", config, "--run-dir", moved)
    assert resumed_step(result) == 2
    assert sorted(steps_on_disk(moved / "checkpoints")) == ["step_00000002", "step_00000004"]
