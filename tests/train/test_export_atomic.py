"""An export folder is whole or absent: a second export to the same --out, a crash after the
rename and SIGTERM mid-write leave no half-written folder that looks complete."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.helpers import wait_for_file
from tests.train.util import tiny_spec
from turbo_dllm.errors import DllmError
from turbo_dllm.train import weights
from turbo_dllm.train.entry import train
from turbo_dllm.train.export import export_checkpoint


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = tmp_path_factory.mktemp("atomic") / "run"
    train(tiny_spec("training.steps=2", "checkpoint.interval=2"), run)
    return run


def test_a_second_export_to_the_same_out_does_not_publish_the_firsts_half(
    run, tmp_path, monkeypatch
):
    """Both used the staging folder `.hf.partial`: the second deleted the first's and wrote its
    own there, and the first renamed that half-written folder into place (here: weights and a
    config.json without the mask token the run denoised from) and said it wrote the export."""
    real_save = weights.save_hf
    second_writing, first_done = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def save_hf(*args, **kwargs):
        folder = real_save(*args, **kwargs)
        if threading.current_thread() is not threading.main_thread():  # the second export
            second_writing.set()
            first_done.wait(timeout=60)
        return folder

    def second() -> None:
        try:
            export_checkpoint(run / "checkpoints", tmp_path / "hf")
        except BaseException as error:  # noqa: BLE001 - asserted below
            failures.append(error)

    def finish(folder):  # the first export, its folder written, before its rename
        thread.start()
        assert second_writing.wait(timeout=60)

    monkeypatch.setattr(weights, "save_hf", save_hf)
    thread = threading.Thread(target=second)
    try:
        export_checkpoint(run / "checkpoints", tmp_path / "hf", finish=finish)
    finally:
        first_done.set()
        thread.join(timeout=60)
    assert json.loads((tmp_path / "hf/config.json").read_text())["mask_token_id"] == 511
    [error] = failures
    assert isinstance(error, DllmError) and "written while this export ran" in str(error)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no staging folder left


def test_the_folder_is_synced_before_it_is_renamed_into_place(run, tmp_path, monkeypatch):
    """Renamed unsynced, a crash or power loss could leave the folder in place with its
    config.json or weights still empty: an export that looks complete and does not load."""
    events: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd):
        events.append(("sync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def rename(src, dst, *args, **kwargs):
        events.append(("rename", os.path.abspath(dst)))
        return real_rename(src, dst, *args, **kwargs)

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc/self/fd")
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    out = export_checkpoint(run / "checkpoints", tmp_path / "hf")
    renamed = events.index(("rename", str(out.absolute())))
    synced = {Path(path).name for kind, path in events[:renamed] if kind == "sync"}
    assert {p.name for p in out.iterdir()} <= synced, (synced, events)
    assert ("sync", str(out.parent.resolve())) in events[renamed:]  # the rename itself


HELD = """
import sys, time
from pathlib import Path
from turbo_dllm.train import export

def held(meta, folder):
    (Path(sys.argv[2]) / "writing").write_text("")
    time.sleep(60)

export._copy_generation_files = held
export.export_checkpoint(sys.argv[1], Path(sys.argv[2]) / "hf")
"""


def test_sigterm_mid_export_leaves_no_staging_folder(run, tmp_path):
    """SIGTERM (`timeout`, a scheduler's time limit) ended the process on the spot, leaving a
    hidden copy of the weights beside --out."""
    child = subprocess.Popen(
        [sys.executable, "-c", HELD, str(run / "checkpoints"), str(tmp_path)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_file(child, tmp_path / "writing", "the export never reached its writing")
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=60) == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["writing"]


def test_the_next_export_removes_a_killed_exports_staging_folder_and_no_other(run, tmp_path):
    """A SIGKILLed or out-of-memory export runs no clean-up: its hidden, model-sized staging
    folder stayed forever. The next export to that --out removes one whose process is gone on
    this host; a running export's and another host's (shared storage) stay."""
    host = os.uname().nodename
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    names = {
        "killed": f".hf.partial-{host}-{gone.pid}-0a1b2c",
        "running": f".hf.partial-{host}-{os.getppid()}-3d4e5f",
        "other host": f".hf.partial-{host}x-{gone.pid}-6a7b8c",
    }
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"\0" * 64)
    export_checkpoint(run, tmp_path / "hf")
    assert (tmp_path / "hf" / "config.json").is_file()
    left = {p.name for p in tmp_path.iterdir()}
    assert names["killed"] not in left
    assert {names["running"], names["other host"]} <= left
    assert not [n for n in left if n.startswith(f".hf.partial-{host}-{os.getpid()}-")]
