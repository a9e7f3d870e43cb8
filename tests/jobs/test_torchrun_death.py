"""Workers do not outlive their torchrun: torchrun starts each in a session of its own, so a
torchrun that dies without stopping them (SIGKILL, the OOM killer, a crash) used to leave them
training on, orphaned. Each worker now saves the step under way and ends (train/stop.py
`stop_with_parent`), and the run resumes from that step."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.jobs.test_launch_runs import SPEC, _processes_of, _workers_of

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG and /proc are Linux's"),
]


def _torchrun_of(run_dir: Path) -> list[int]:
    """PIDs of the torchrun processes whose workers train into run_dir."""
    return [pid for pid, argv in _processes_of(run_dir) if "torch.distributed.run" in argv]


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent's wait has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


STEPS = 100_000  # more than any test trains: every stop here is a stop, not the end


def _wait_for_step_2(run_dir: Path, started: subprocess.Popen, log: Path) -> None:
    """Wait until the run saved step 2 (`started`, the launch, still running)."""
    deadline = time.monotonic() + 240
    while not (run_dir / "checkpoints" / "step_00000002").is_dir():
        assert started.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.02)


def _wait_for_sigterm_passed_on(log: Path, workers: int) -> None:
    """Until torchrun says it sent its workers SIGTERM (or 2 s): the SIGKILL then lands while
    they act on it (finishing the step, saving). A fixed 0.3 s wait let an idle host's workers
    save and end first, and they never saw torchrun die."""
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        if log.read_text().count("closing signal SIGTERM") >= workers:
            return
        time.sleep(0.005)


def _kill_what_is_left(workers: list[int], started: subprocess.Popen) -> None:
    """The cleanup: workers still alive, and the launch `started` with its process group."""
    for pid in workers:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    if started.poll() is None:
        os.killpg(started.pid, signal.SIGKILL)
        started.wait()


def _assert_all_end(workers: list[int]) -> None:
    """Every worker ends, within a bound (a tiny CPU step and its save take well under a second;
    the bound leaves room for a loaded host): none stays on, orphaned."""
    killed = time.monotonic()
    while any(map(_alive, workers)) and time.monotonic() - killed < 60:
        time.sleep(0.1)
    left = [pid for pid in workers if _alive(pid)]
    assert not left, f"workers {left} outlived torchrun by 60 s"


@pytest.mark.parametrize("sigterm_first", [False, True], ids=["SIGKILL", "SIGTERM-then-SIGKILL"])
def test_sigkill_to_torchrun_saves_the_step_under_way_and_ends_every_worker(
    tmp_path, sigterm_first
):
    """torchrun SIGKILLed while the workers train, or in its own shutdown: after it passed a
    SIGTERM on, which the workers are acting on (finishing the step, saving). Its end is then
    never their second SIGTERM, which would end them at once, mid-save."""
    spec = tmp_path / "train.yaml"
    spec.write_text(textwrap.dedent(SPEC))
    run_dir = tmp_path / "run"
    env = {**os.environ, "DLLM_HOME": str(tmp_path / "home")}
    env.pop("DLLM_OVERRIDE_GPUS", None)
    launch = [sys.executable, "-m", "turbo_dllm", "launch", "--config", str(spec)]
    launch += ["--nproc-per-node", "2", "--set", "topology.dp=2"]
    launch += ["--set", f"training.steps={STEPS}"]
    launched = tmp_path / "launch.log"  # a file: a pipe no one reads would fill and block
    with open(launched, "w") as sink:
        launcher = subprocess.Popen(
            [*launch, "--run-dir", str(run_dir)],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, for the cleanup
        )
    workers: list[int] = []
    try:
        _wait_for_step_2(run_dir, launcher, launched)
        workers, (torchrun,) = _workers_of(run_dir), _torchrun_of(run_dir)
        assert len(workers) == 2, workers
        if sigterm_first:
            os.kill(torchrun, signal.SIGTERM)
            _wait_for_sigterm_passed_on(launched, len(workers))
        os.kill(torchrun, signal.SIGKILL)
        _assert_all_end(workers)
        assert _workers_of(run_dir) == []
        launcher.wait(timeout=60)  # it read the workers' output to its end
    finally:
        _kill_what_is_left(workers, launcher)
    console = (run_dir / "console.log").read_text()
    # Each rank said why, and both saved the same step (the ranks vote on the stop).
    for rank in (0, 1):
        assert f"dllm: rank {rank}: its torchrun (pid {torchrun}) ended without stopping it" in (
            console
        ), console
    stopped = re.search(
        r"stopping after step (\d+): SIGTERM received \(checkpoint saved\)", console
    )
    assert stopped, console
    step = int(stopped[1])
    saved = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert saved[-1] == f"step_{step:08d}", saved
    assert (run_dir / "checkpoints" / saved[-1] / "checkpoint.json").is_file()
    assert "Traceback" not in console, console
    # Resumable: the next run (the recorded spec, as docs/reproducibility.md says) goes on from
    # that step; it is stopped by SIGTERM once it trained the next one.
    resume = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    resume += ["2", "-m", "turbo_dllm", "train", "--config", str(run_dir / "spec.yaml")]
    log = tmp_path / "resume.log"
    with open(log, "w") as sink:
        resumed = subprocess.Popen(
            [*resume, "--run-dir", str(run_dir)], env=env, stdout=sink, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 240
        while f"step {step + 1:>{len(str(STEPS))}}/{STEPS}" not in log.read_text():
            assert resumed.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        resumed.send_signal(signal.SIGTERM)
        resumed.wait(timeout=120)
    finally:
        if resumed.poll() is None:
            resumed.kill()
            resumed.wait()
        for pid in _workers_of(run_dir):
            os.kill(pid, signal.SIGKILL)
    out = log.read_text()
    assert f"resumed from {run_dir / 'checkpoints' / saved[-1]} (step {step})" in out, out
    assert f"steps {step + 1}..{STEPS}" in out, out


def test_sigkill_to_a_hand_run_torchrun_saves_the_step_under_way(tmp_path):
    """`torchrun -m turbo_dllm train` written by hand (no `dllm launch`): its ranks stop with
    torchrun too, each saving the step under way, and say why."""
    spec = tmp_path / "train.yaml"
    spec.write_text(textwrap.dedent(SPEC))
    run_dir = tmp_path / "run"
    env = {**os.environ, "DLLM_HOME": str(tmp_path / "home")}
    env.pop("DLLM_OVERRIDE_GPUS", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    command += ["2", "-m", "turbo_dllm", "train", "--config", str(spec), "--run-dir", str(run_dir)]
    command += ["--set", "topology.dp=2", "--set", f"training.steps={STEPS}"]
    log = tmp_path / "torchrun.log"  # the ranks write here too, after torchrun is gone
    with open(log, "w") as sink:
        torchrun = subprocess.Popen(
            command, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    ranks: list[int] = []
    try:
        _wait_for_step_2(run_dir, torchrun, log)
        ranks = [pid for pid, argv in _naming(run_dir) if "torch.distributed.run" not in argv]
        assert len(ranks) == 2, ranks
        torchrun.kill()
        torchrun.wait()
        _assert_all_end(ranks)
    finally:
        _kill_what_is_left(ranks, torchrun)
    out = log.read_text()
    for rank in (0, 1):
        said = f"dllm: rank {rank}: its torchrun (pid {torchrun.pid}) ended without stopping it"
        assert said in out, out
    stopped = re.search(r"stopping after step (\d+): SIGTERM received \(checkpoint saved\)", out)
    assert stopped, out
    saved = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert saved[-1] == f"step_{int(stopped[1]):08d}", saved
    assert "Traceback" not in out, out


def _naming(run_dir: Path) -> list[tuple[int, list[str]]]:
    """(pid, argv) of the processes whose command line names run_dir (`--run-dir`)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if entry.name.isdigit() and str(run_dir) in argv:
            found.append((int(entry.name), argv))
    return found


@pytest.mark.parametrize("launcher_alive", [True, False], ids=["torchrun-alive", "torchrun-gone"])
def test_a_worker_whose_torchrun_ended_before_it_looked_stops_before_training(
    tmp_path, launcher_alive
):
    """A worker that starts as its torchrun dies (its parent is then whoever adopted it, whose own
    parent is not the launcher that started torchrun) stops at once, without training; one whose
    parent is the launcher's torchrun goes on (here: to read the missing manifest and say so). This
    process plays torchrun, its parent the launcher."""
    launcher = os.getppid() if launcher_alive else 2**22 + 1  # no pid of a live process
    env = {**os.environ, "TORCHELASTIC_RUN_ID": "test", "RANK": "1"}
    env["DLLM_LAUNCHER_PID"] = str(launcher)
    manifest = tmp_path / "missing" / "manifest.json"
    worker = [sys.executable, "-m", "turbo_dllm.jobs.worker", "--manifest", str(manifest)]
    ended = subprocess.run(worker, env=env, capture_output=True, text=True, timeout=120)
    if launcher_alive:
        assert ended.returncode == 2 and "dllm: error:" in ended.stderr, ended.stderr
    else:
        assert ended.returncode == 143, ended.stderr
        assert ended.stderr.startswith(
            f"dllm: rank 1: its torchrun (pid {os.getpid()}) ended before the worker started"
        ), ended.stderr


def test_sigkill_to_the_launcher_saves_the_step_under_way_into_console_log(tmp_path):
    """`kill -9` of `dllm launch` itself: torchrun dies with it (a SIGTERM, which it passes on),
    and the workers' pipes lose their reader. Each worker's next line (the step under way) failed
    with BrokenPipeError, a traceback instead of the save: every step since the last checkpoint
    was lost. They now write on into console.log and save the step under way."""
    spec = tmp_path / "train.yaml"
    spec.write_text(textwrap.dedent(SPEC))
    run_dir = tmp_path / "run"
    env = {**os.environ, "DLLM_HOME": str(tmp_path / "home")}
    env.pop("DLLM_OVERRIDE_GPUS", None)
    launch = [sys.executable, "-m", "turbo_dllm", "launch", "--config", str(spec)]
    launch += ["--nproc-per-node", "2", "--set", "topology.dp=2"]
    launch += ["--set", f"training.steps={STEPS}", "--set", "checkpoint.interval=1000"]
    launched = tmp_path / "launch.log"
    with open(launched, "w") as sink:
        launcher = subprocess.Popen(
            [*launch, "--run-dir", str(run_dir)],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 240
        metrics = run_dir / "metrics.jsonl"
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):
            assert launcher.poll() is None, launched.read_text()
            assert time.monotonic() < deadline, "no step trained"
            time.sleep(0.05)
        workers = _workers_of(run_dir)
        assert len(workers) == 2, workers
        launcher.kill()
        launcher.wait()
        _assert_all_end(workers)
    finally:
        _kill_what_is_left(workers, launcher)
    console = (run_dir / "console.log").read_text()
    stopped = re.search(
        r"stopping after step (\d+): SIGTERM received \(checkpoint saved\)", console
    )
    assert stopped, console
    saved = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert saved[-1] == f"step_{int(stopped[1]):08d}", saved
    assert "Traceback" not in console, console
