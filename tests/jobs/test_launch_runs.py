"""Real launches on CPU: a 2-process gloo run, its bitwise replay, drift refusals, a prepared-data
run whose artifact changes, and a killed worker that torchrun restarts from the last checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import turbo_dllm
from tests.helpers import assert_user_error
from turbo_dllm.jobs import provenance
from turbo_dllm.jobs.runs import summarize

pytestmark = pytest.mark.slow

SPEC = """
launch:
  seed: 3
model:
  family: qwen3
  from_config: tiny
objective:
  name: block_diffusion
  block_size: 16
data:
  synthetic:
    num_sequences: 32
    vocab_size: 512
  seq_len: 64
training:
  micro_batch_size: 2
  steps: 6
scheduler:
  warmup_steps: 1
checkpoint:
  interval: 2
"""

# The working tree can change while a long test session runs (edits elsewhere in the repo); pin
# the code version so each test sees exactly the drift it makes. tests/jobs/test_manifest.py
# checks that real code changes move these fields.
PINNED_CODE = {
    "package_version": turbo_dllm.__version__,
    "git_commit": "c0de" * 10,
    "diff_sha256": "0" * 64,
    "dirty": False,
}


def losses(run_dir: Path) -> list[tuple[int, float]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [(r["step"], r["loss"]) for r in map(json.loads, lines)]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One uninterrupted 2-process gloo run, shared by the replay, drift and restart tests."""
    root = tmp_path_factory.mktemp("recorded")
    spec = root / "train.yaml"
    spec.write_text(textwrap.dedent(SPEC))
    from turbo_dllm.cli import main

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DLLM_HOME", str(tmp_path_factory.mktemp("home")))
        mp.delenv("DLLM_OVERRIDE_GPUS", raising=False)
        mp.setattr(provenance, "code_version", lambda: dict(PINNED_CODE))
        run_dir = root / "original"
        args = ["launch", "--config", str(spec), "--nproc-per-node", "2", "--set", "topology.dp=2"]
        code = main([*args, "--run-dir", str(run_dir)])
    assert code == 0
    return spec, run_dir


@pytest.fixture
def pinned_code(monkeypatch):
    monkeypatch.setattr(provenance, "code_version", lambda: dict(PINNED_CODE))


def test_two_process_gloo_run_completes(recorded):
    _, run_dir = recorded
    assert [step for step, _ in losses(run_dir)] == [1, 2, 3, 4, 5, 6]
    assert json.loads((run_dir / "result.json").read_text())["exit_code"] == 0
    manifest = json.loads((run_dir / "manifest.json").read_text())
    plan = manifest["plan"]
    assert plan["backend"] == "torchrun" and plan["dist_backend"] == "gloo"
    assert plan["world_sizes"] == [2]
    assert (run_dir / "spec.yaml").is_file() and (run_dir / "console.log").stat().st_size > 0
    assert (run_dir / "checkpoints" / "step_00000006").is_dir()


def test_replay_reproduces_the_loss_column_bitwise(recorded, cli, pinned_code, tmp_path):
    _, run_dir = recorded
    replay_dir = tmp_path / "replay"
    result = cli("launch", "--manifest", run_dir / "manifest.json", "--run-dir", replay_dir)
    assert result.code == 0, result.err
    assert losses(replay_dir) == losses(run_dir)
    original = json.loads((run_dir / "manifest.json").read_text())
    replay = json.loads((replay_dir / "manifest.json").read_text())
    assert replay["spec_sha256"] == original["spec_sha256"]
    assert replay["replay_of"]["run_id"] == original["run_id"]
    assert replay["replay_of"]["drift"] == []
    assert replay["plan"]["nproc_per_node"] == 2


def test_replay_refuses_a_changed_package(recorded, cli, pinned_code, monkeypatch, tmp_path):
    _, run_dir = recorded
    real = provenance.installed_packages()
    changed = {**real, "numpy": "0.0.1"}
    monkeypatch.setattr(provenance, "installed_packages", lambda: changed)
    target = tmp_path / "refused"
    result = cli("launch", "--manifest", run_dir / "manifest.json", "--run-dir", target)
    assert_user_error(
        result, "replay of run original refused", f"packages.numpy: {real['numpy']} -> 0.0.1"
    )
    assert "--allow-drift" in result.err
    assert not target.exists()

    # --allow-drift runs it and the manifest records the drift (shown here by the dry run).
    result = cli(
        "launch", "--manifest", run_dir / "manifest.json", "--allow-drift", "--dry-run", "--json"
    )
    assert result.code == 0, result.err
    drift = json.loads(result.out)["manifest"]["replay_of"]["drift"]
    assert drift == [{"field": "packages.numpy", "recorded": real["numpy"], "current": "0.0.1"}]


def test_replay_refuses_changed_code(recorded, cli, monkeypatch, tmp_path):
    _, run_dir = recorded
    edited = {**PINNED_CODE, "diff_sha256": "e" * 64, "dirty": True}
    monkeypatch.setattr(provenance, "code_version", lambda: edited)
    result = cli("launch", "--manifest", run_dir / "manifest.json", "--run-dir", tmp_path / "x")
    assert_user_error(result, "code.diff_sha256: " + "0" * 64 + " -> " + "e" * 64)
    assert not (tmp_path / "x").exists()


def test_replay_refuses_another_kind_of_host(recorded, cli, pinned_code, monkeypatch, tmp_path):
    _, run_dir = recorded
    monkeypatch.setenv("DLLM_OVERRIDE_GLIBC", "9.99")
    result = cli("launch", "--manifest", run_dir / "manifest.json", "--run-dir", tmp_path / "x")
    recorded_glibc = json.loads((run_dir / "manifest.json").read_text())["host"]["glibc"]
    assert_user_error(result, f"host.glibc: {recorded_glibc} -> 9.99")
    assert not (tmp_path / "x").exists()


def test_replay_keeps_the_recorded_layout(recorded, cli):
    _, run_dir = recorded
    result = cli("launch", "--manifest", run_dir / "manifest.json", "--nproc-per-node", "4")
    assert_user_error(result, "a replay runs the recorded job", "--nproc-per-node")


# --- prepared data -----------------------------------------------------------------------------

PREPARE = """
source:
  kind: jsonl
  paths: [corpus.jsonl]
records:
  kind: text
  field: text
tokenizer:
  kind: byte_level
supervision: full
packing:
  seq_len: 64
  block_size: 16
  overflow: split
output:
  path: prepared
workers: 1
"""


def prepare(cli, folder: Path, word: str) -> None:
    import shutil

    shutil.rmtree(folder / "prepared", ignore_errors=True)
    with open(folder / "corpus.jsonl", "w") as handle:
        for i in range(24):
            handle.write(json.dumps({"text": f"{word} {i}: " + "a tiny corpus line. " * 3}) + "\n")
    (folder / "prepare.yaml").write_text(textwrap.dedent(PREPARE))
    result = cli("data", "prepare", "--config", folder / "prepare.yaml")
    assert result.code == 0, result.err


def artifact_spec(workdir, steps: int = 6):
    """train.yaml over the `prepared` artifact (SPEC's synthetic data replaced), `steps` long."""
    spec = workdir / "train.yaml"
    spec.write_text(
        textwrap.dedent(SPEC)
        .replace("  synthetic:\n    num_sequences: 32\n    vocab_size: 512\n", "")
        .replace("data:\n", "data:\n  artifact: prepared\n")
        .replace("steps: 6", f"steps: {steps}")
    )
    return spec


def test_replay_refuses_a_changed_data_artifact(cli, workdir, pinned_code):
    prepare(cli, workdir, "first")
    spec = artifact_spec(workdir, steps=2)
    result = cli("launch", "--config", spec, "--run-dir", workdir / "original")
    assert result.code == 0, result.err
    recorded = json.loads((workdir / "original" / "manifest.json").read_text())
    assert recorded["data"]["artifact"] == str(workdir / "prepared")
    manifest = workdir / "original" / "manifest.json"

    # Bytes changed under an unchanged data manifest: the replay re-hashes the arrays.
    tokens = workdir / "prepared" / "tokens.bin"
    original_bytes = tokens.read_bytes()
    tokens.write_bytes(bytes([original_bytes[0] ^ 1]) + original_bytes[1:])
    refused = cli("launch", "--manifest", manifest)
    assert_user_error(refused, "refused: 1 input drifted", "tokens.bin: sha256 mismatch")
    # One line per drifted input, as the count says (verify's file list was lines of its own).
    [line] = [x for x in refused.err.splitlines() if x.startswith("  - ")]
    assert line.startswith("  - data.content: matches its manifest -> ") and "tokens.bin" in line
    tokens.write_bytes(original_bytes)

    # The artifact prepared again from other text: a new fingerprint.
    prepare(cli, workdir, "second")
    result = cli("launch", "--manifest", manifest, "--run-dir", workdir / "refused")
    assert_user_error(result, "data.fingerprint: " + recorded["data"]["fingerprint"])
    assert not (workdir / "refused").exists()

    result = cli("launch", "--manifest", manifest, "--allow-drift", "--run-dir", workdir / "drift")
    assert result.code == 0, result.err
    replay = json.loads((workdir / "drift" / "manifest.json").read_text())
    fields = [item["field"] for item in replay["replay_of"]["drift"]]
    assert "data.fingerprint" in fields
    assert replay["data"]["fingerprint"] != recorded["data"]["fingerprint"]
    assert [step for step, _ in losses(workdir / "drift")] == [1, 2]

    # --allow-drift over a vanished artifact, or one that no longer fits the spec: refused
    # before the run dir exists, as a launch is (it was written, then the worker failed).
    (workdir / "prepared").rename(workdir / "moved")
    result = cli("launch", "--manifest", manifest, "--allow-drift", "--run-dir", workdir / "gone")
    assert_user_error(result, "data artifact not found", "prepared")
    assert not (workdir / "gone").exists()
    (workdir / "moved").rename(workdir / "prepared")


def test_worker_reports_a_user_error_in_training_as_dllm_does(cli, workdir, capsys):
    """A DllmError raised while a worker trains (here: the data artifact moved away after the
    launch recorded it) is `dllm: error:` with its hint and exit 2, as `dllm train` says it; under
    torchrun and SLURM every rank printed a traceback ending in `turbo_dllm.errors.DllmError`."""
    from turbo_dllm.jobs import worker

    prepare(cli, workdir, "first")
    spec = artifact_spec(workdir)
    result = cli("launch", "--config", spec, "--backend", "slurm", "--run-dir", "run")
    assert result.code == 0, result.err  # the manifest and script only: nothing ran
    (workdir / "prepared").rename(workdir / "moved")
    capsys.readouterr()
    assert worker.main(["--manifest", str(workdir / "run" / "manifest.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dllm: error: data artifact not found"), err
    assert "\nhint: " in err


# --- restarts ----------------------------------------------------------------------------------


def _processes_of(run_dir: Path) -> list[tuple[int, list[str]]]:
    """(pid, argv) of the processes whose command line names run_dir's manifest."""
    found = []
    manifest = str(run_dir / "manifest.json")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if manifest in argv:
            found.append((int(entry.name), argv))
    return found


def _workers_of(run_dir: Path) -> list[int]:
    """PIDs of trainer worker processes (not torchrun, not the launcher) writing into run_dir."""
    return [
        pid
        for pid, argv in _processes_of(run_dir)
        if "turbo_dllm.jobs.worker" in argv and "torch.distributed.run" not in argv
    ]


def _two_rank_launch(spec, run_dir, tmp_path, *options):
    """A 2-process launch (`_launch`)."""
    return _launch(
        spec, run_dir, tmp_path, "--nproc-per-node", "2", "--set", "topology.dp=2", *options
    )


@contextlib.contextmanager
def _launch(spec, run_dir, tmp_path, *options):
    """A launch in its own process group, yielded once its step-2 checkpoint exists (the
    launcher's and every worker's group is killed on the way out if still running)."""
    env = {**os.environ, "DLLM_HOME": str(tmp_path / "home")}
    env.pop("DLLM_OVERRIDE_GPUS", None)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "turbo_dllm", "launch", "--config", str(spec), *options]
        + ["--run-dir", str(run_dir)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: cleanup reaches torchrun and workers
    )
    try:
        deadline = time.monotonic() + 240
        while not (run_dir / "checkpoints" / "step_00000002").is_dir():
            assert launcher.poll() is None, launcher.stdout.read()
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.02)
        yield launcher
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds workers through /proc")
def test_killed_worker_resumes_from_last_checkpoint(recorded, tmp_path):
    spec, original = recorded
    run_dir = tmp_path / "killed"
    with _two_rank_launch(spec, run_dir, tmp_path, "--max-restarts", "1") as launcher:
        victims = _workers_of(run_dir)
        assert len(victims) == 2, victims
        os.kill(victims[-1], signal.SIGKILL)
        output, _ = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, output
    assert "resumed from" in output, output
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["plan"]["env"]["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    # No step lost or repeated, and the restarted run computes exactly the uninterrupted one.
    assert [step for step, _ in losses(run_dir)] == [1, 2, 3, 4, 5, 6]
    assert losses(run_dir) == losses(original)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds workers through /proc")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_launch_ends_like_a_one_process_launch(recorded, tmp_path, signum):
    """Ctrl-C (or SIGTERM) to a 2-process launch: no traceback per rank and none from torchrun,
    no workers stay, and no result.json says the run failed with exit 1. Ctrl-C ends it as
    interrupted (130, no result); on SIGTERM the workers save the step under way and the launch
    ends with 143, its result.json says so: resumable from that step."""
    spec, _ = recorded
    run_dir = tmp_path / "interrupted"
    with _two_rank_launch(spec, run_dir, tmp_path, "--set", "training.steps=500") as launcher:
        launcher.send_signal(signum)
        output, _ = launcher.communicate(timeout=120)
    if signum == signal.SIGINT:
        assert launcher.returncode == 130, output
        assert output.rstrip().endswith("dllm: interrupted"), output
        assert not (run_dir / "result.json").exists()
        assert summarize(run_dir).status == "interrupted"  # `dllm run list`: not "died"
    else:
        # torchrun passed it on: the workers saved the step under way before they ended (what
        # follows the signal is in console.log only), and the launch ends with 143, recorded
        assert launcher.returncode == 143, output
        console = (run_dir / "console.log").read_text()
        stopped = re.search(r"stopping after step (\d+): SIGTERM received", console)
        assert stopped, console
        assert (
            run_dir / "checkpoints" / f"step_{int(stopped[1]):08d}" / "checkpoint.json"
        ).is_file()
        assert "stopped by SIGTERM (exit 143; the step under way was saved" in output, output
        assert json.loads((run_dir / "result.json").read_text())["exit_code"] == 143
    assert "Traceback" not in output and "failed (exit" not in output, output
    assert "SignalException" in (run_dir / "console.log").read_text()  # kept in the log
    assert _workers_of(run_dir) == []


# --- elastic -----------------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_elastic_launch_sizes_data_parallel_from_the_world(recorded, cli, tmp_path):
    """--nnodes 1:2 on one host: the spec says dp=1, the shim makes it dp=2 for the 2 processes
    that joined, which is exactly the recorded 2-process job."""
    spec, original = recorded
    run_dir = tmp_path / "elastic"

    def launch():
        return cli(
            "launch",
            "--config",
            spec,
            "--nnodes",
            "1:2",
            "--nproc-per-node",
            "2",
            "--rdzv-endpoint",
            f"127.0.0.1:{_free_port()}",
            "--rdzv-conf",
            "last_call_timeout=1",
            "--run-dir",
            run_dir,
        )

    result = launch()
    assert result.code == 0, result.err
    plan = json.loads((run_dir / "manifest.json").read_text())["plan"]
    assert plan["elastic_axis"] == "dp" and plan["world_sizes"] == [2, 4]
    assert "--rdzv-conf" in plan["commands"][0]["argv"]
    assert losses(run_dir) == losses(original)
    # No node's launcher sees a multi-node job end: rank 0 records it, and the same launch
    # again is refused as a finished run (it used to join it as a node of a running one).
    recorded_result = json.loads((run_dir / "result.json").read_text())
    assert recorded_result["exit_code"] == 0 and recorded_result["recorded_by"] == "rank 0"
    logs = {p.name: p.read_bytes() for p in run_dir.glob("console*.log")}
    again = launch()
    assert_user_error(again, f"{run_dir} already holds run", "(ok, step")
    assert {p.name: p.read_bytes() for p in run_dir.glob("console*.log")} == logs


def test_dry_run_prints_a_command_that_runs_as_pasted(recorded, cli, workdir):
    """The plan's torchrun line reads <run dir>/manifest.json, which a dry run does not write; the
    line it prints to run the plan does, and trains exactly the printed job."""
    spec, original = recorded
    args = ("--config", spec, "--backend", "torchrun", "--nproc-per-node", "2")
    result = cli("launch", *args, "--set", "topology.dp=2", "--dry-run")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    command = lines[lines.index(next(x for x in lines if x.startswith("# to run it"))) + 1]
    run_dir = Path(next(x for x in lines if x.startswith("run dir")).split()[-1])
    assert not run_dir.exists()

    proc = subprocess.run(["bash", "-c", command], cwd="/", capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert losses(run_dir) == losses(original)
    assert json.loads((run_dir / "result.json").read_text())["exit_code"] == 0


def test_worker_reports_a_file_system_error_in_training_as_dllm_does(
    cli, workdir, capsys, monkeypatch
):
    """The file system refusing a write while a worker trains (here: the run's checkpoint folder
    is a file) is `dllm: error:` naming the path, with a hint, and exit 2, as `dllm train` says it:
    it was a traceback from every rank. A socket error is no path to fix: it stays a traceback."""
    from turbo_dllm.jobs import worker

    spec = workdir / "train.yaml"
    spec.write_text(textwrap.dedent(SPEC))
    result = cli("launch", "--config", spec, "--backend", "slurm", "--run-dir", "run")
    assert result.code == 0, result.err  # the manifest and script only: nothing ran
    (workdir / "run" / "checkpoints").write_text("not a folder")
    capsys.readouterr()
    assert worker.main(["--manifest", str(workdir / "run" / "manifest.json")]) == 2
    err = capsys.readouterr().err
    error = err[err.index("dllm: error: ") :]  # after the step lines of steps 1-2
    assert error.startswith(f"dllm: error: '{workdir / 'run' / 'checkpoints'}': "), err
    assert "is a file, not a folder" in error
    assert "\nhint: " in error and "Traceback" not in err

    import turbo_dllm.train.entry

    def lost_peer(*args, **kwargs):
        raise ConnectionResetError(104, "Connection reset by peer")

    monkeypatch.setattr(turbo_dllm.train.entry, "train", lost_peer)
    with pytest.raises(ConnectionResetError):
        worker.main(["--manifest", str(workdir / "run" / "manifest.json")])


def test_sigterm_to_a_one_process_launch_saves_and_records_143(recorded, tmp_path):
    """A one-process launch trains in the launcher itself: SIGTERM (a scheduler's time limit)
    saves the step under way and the launch ends with 143, recorded in result.json."""
    spec, _ = recorded
    run_dir = tmp_path / "stopped"
    with _launch(spec, run_dir, tmp_path, "--set", "training.steps=500") as launcher:
        launcher.send_signal(signal.SIGTERM)
        output, _ = launcher.communicate(timeout=120)
    assert launcher.returncode == 143, output
    stopped = re.search(r"stopping after step (\d+): SIGTERM received \(checkpoint saved\)", output)
    assert stopped, output
    assert (run_dir / "checkpoints" / f"step_{int(stopped[1]):08d}" / "checkpoint.json").is_file()
    assert "stopped by SIGTERM (exit 143" in output and "Traceback" not in output, output
    assert json.loads((run_dir / "result.json").read_text())["exit_code"] == 143
    # `dllm run list` says what happened (it read "exit 143", as a failure would)
    assert summarize(run_dir).status == "stopped"
    assert "the step under way saved, resumable" in summarize(run_dir).status_detail
