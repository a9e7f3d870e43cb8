"""`dllm run list` tells a run that trains (its launcher alive on this host) from one whose
launcher was killed before it wrote result.json (SIGKILL, the OOM killer, a reboot): both read
`no result` before. Real processes: a launch in its own process group, SIGKILLed while it trains.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from turbo_dllm.errors import DllmError
from turbo_dllm.jobs import result as result_mod
from turbo_dllm.jobs.result import read_launchers, record_launcher
from turbo_dllm.jobs.runs import summarize

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "DLLM_HOME": str(tmp_path / "home")}
    env.pop("DLLM_OVERRIDE_GPUS", None)
    return env


def _start(args: list[str], tmp_path: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "turbo_dllm", *args],
        cwd=tmp_path,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: SIGKILL reaches everything it started
    )


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _wait_for_step(proc: subprocess.Popen, run_dir: Path, step: int = 1) -> None:
    deadline = time.monotonic() + 240
    metrics = run_dir / "metrics.jsonl"
    while True:
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        if sum(1 for line in lines if '"step"' in line) >= step:
            return
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "no step was written"
        time.sleep(0.05)


def _listed(cli, root: Path) -> dict:
    result = cli("run", "list", "--root", root, "--json")
    assert result.code == 0, result.err
    (run,) = json.loads(result.out)["runs"]
    return run


def _table_row(cli, root: Path) -> str:
    result = cli("run", "list", "--root", root)
    assert result.code == 0, result.err
    return result.out.splitlines()[-1]


@pytest.mark.slow
def test_killed_launcher_reads_died_and_a_live_one_running(cli, spec_file, workdir, tmp_path):
    run_dir = workdir / "runs" / "long"
    launch = ["launch", "--config", spec_file, "--run-dir", run_dir]
    proc = _start(
        [*launch, "--set", "training.steps=100000", "--set", "checkpoint.interval=1"], tmp_path
    )
    try:
        _wait_for_step(proc, run_dir)
        run = _listed(cli, workdir / "runs")
        assert run["status"] == "running", run
        assert run["exit_code"] is None
        row = _table_row(cli, workdir / "runs")
        assert row.split()[-2:] == ["running", "-"], row
        record = json.loads((run_dir / "launcher.json").read_text())
        assert record["pid"] == proc.pid and record["host"] == os.uname()[1]
    finally:
        _kill(proc)
    assert not (run_dir / "result.json").exists()
    run = _listed(cli, workdir / "runs")
    assert run["status"] == "died", run
    assert run["launcher_hosts"] == [os.uname()[1]]
    written = run["last_written_at"]
    assert written and written.endswith("+00:00"), run
    assert f"died (last wrote a step at {written}; no launcher alive, no result)" in _table_row(
        cli, workdir / "runs"
    )
    show = cli("run", "show", "long", "--root", workdir / "runs")
    assert show.code == 0 and "; died (last wrote a step at" in show.out, show.out

    # A `dllm train --run-dir` resume records itself as the launcher: running, not died.
    resume = _start(["train", "--config", run_dir / "spec.yaml", "--run-dir", "runs/long"], workdir)
    try:
        deadline = time.monotonic() + 240
        while _listed(cli, workdir / "runs")["status"] != "running":
            assert resume.poll() is None, resume.stdout.read()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert "running (`dllm train` resume)" in _table_row(cli, workdir / "runs")
        record = json.loads((run_dir / "launcher.json").read_text())
        assert record["pid"] == resume.pid and record["by"] == "dllm train"
    finally:
        _kill(resume)
    assert _listed(cli, workdir / "runs")["status"] == "died"


@pytest.mark.slow
def test_a_finished_run_still_reads_ok(cli, spec_file, workdir, tmp_path):
    run_dir = workdir / "runs" / "short"
    proc = _start(["launch", "--config", spec_file, "--run-dir", run_dir], tmp_path)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    assert (run_dir / "launcher.json").is_file()
    run = _listed(cli, workdir / "runs")
    assert run["status"] == "ok" and run["exit_code"] == 0, run


@pytest.mark.slow
def test_killed_torchrun_launch_reads_died(cli, spec_file, workdir, tmp_path):
    run_dir = workdir / "runs" / "two"
    proc = _start(
        ["launch", "--config", spec_file, "--run-dir", run_dir, "--nproc-per-node", "2"]
        + ["--set", "topology.dp=2", "--set", "training.steps=100000"],
        tmp_path,
    )
    try:
        _wait_for_step(proc, run_dir)
        assert _listed(cli, workdir / "runs")["status"] == "running"
    finally:
        _kill(proc)
    run = _listed(cli, workdir / "runs")
    assert run["status"] == "died" and run["backend"] == "torchrun", run


# --- the record, without training ---------------------------------------------------------


@pytest.fixture
def recorded_run(cli, spec_file, workdir, monkeypatch):
    """A finished one-process run whose result.json is then removed: what a killed launcher
    leaves, with a launcher record the tests rewrite."""
    run_dir = workdir / "runs" / "r"
    assert cli("launch", "--config", spec_file, "--run-dir", run_dir).code == 0
    (run_dir / "result.json").unlink()
    return run_dir


def _rewrite(run_dir: Path, name: str = "launcher.json", **changes) -> None:
    path = run_dir / name
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, **changes}))


def test_the_launcher_record_of_this_process_reads_running(recorded_run):
    record_launcher(recorded_run)  # this test's process: alive
    assert summarize(recorded_run).status == "running"


def test_a_reused_pid_reads_died(recorded_run):
    # This process's pid, but another start time: a later process took the dead one's pid.
    record_launcher(recorded_run)
    ticks = json.loads((recorded_run / "launcher.json").read_text())["start_ticks"]
    _rewrite(recorded_run, start_ticks=ticks - 1)
    assert summarize(recorded_run).status == "died"


def test_a_reboot_reads_died(recorded_run):
    record_launcher(recorded_run)
    _rewrite(recorded_run, boot_id="00000000-0000-0000-0000-000000000000")
    assert summarize(recorded_run).status == "died"


def test_an_ended_launch_in_a_live_process_reads_died(recorded_run):
    """The fixture's launch ran in this (live) process and returned: its record says it ended,
    so without its result the run is not `running`."""
    assert json.loads((recorded_run / "launcher.json").read_text())["ended_at"]
    run = summarize(recorded_run)
    assert run.status == "died"
    assert "died (last wrote a step at " in run.status_detail


def test_a_launch_ended_by_ctrl_c_reads_interrupted_not_died(recorded_run, cli, workdir):
    """An interrupted launch writes no result (by design: nothing failed); its record says
    Ctrl-C ended it, so the run is not called dead like a killed one."""
    from turbo_dllm.jobs.result import end_launcher

    record_launcher(recorded_run)
    end_launcher(recorded_run, interrupted=True)
    run = summarize(recorded_run)
    assert run.status == "interrupted"
    assert run.status_detail.startswith("interrupted (last wrote a step at ")
    assert run.status_detail.endswith("; stopped by Ctrl-C, no result)")
    assert _listed(cli, workdir / "runs")["status"] == "interrupted"
    assert "interrupted (last wrote a step at" in cli("run", "show", recorded_run).out


def test_a_launcher_on_another_host_reads_unknown(recorded_run):
    record_launcher(recorded_run)
    _rewrite(recorded_run, host="node-b.cluster")
    run = summarize(recorded_run)
    assert run.status == "unknown"
    assert run.status_detail == "unknown (launched on node-b.cluster)"
    assert run.to_json()["launcher_hosts"] == ["node-b.cluster"]


def test_a_multi_node_job_reads_running_while_this_nodes_launcher_lives(recorded_run):
    (recorded_run / "launcher.json").unlink(missing_ok=True)
    record_launcher(recorded_run, multi_node=True)
    host = os.uname()[1]
    assert (recorded_run / f"launcher-{host}.json").is_file()
    mine = json.loads((recorded_run / f"launcher-{host}.json").read_text())
    (recorded_run / "launcher-node-b.json").write_text(json.dumps({**mine, "host": "node-b"}))
    assert len(read_launchers(recorded_run)) == 2
    assert summarize(recorded_run).status == "running"
    # This node's launcher gone, the other's out of sight: unknown, naming the other host.
    _rewrite(recorded_run, name=f"launcher-{host}.json", pid=_dead_pid())
    run = summarize(recorded_run)
    assert run.status_detail == "unknown (launched on node-b)", run


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_zombie_launcher_reads_died(recorded_run):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        record_launcher(recorded_run)
        _rewrite(recorded_run, pid=proc.pid, start_ticks=None)
        assert summarize(recorded_run).status == "died"
    finally:
        proc.wait()


def test_a_damaged_record_is_named_not_read_as_no_record(recorded_run):
    """A torn launcher record was left out: the run read `no result`, as if no launcher had
    started. It is now a DllmError naming the file (tests/jobs/test_runs_damaged.py: through
    `dllm run list | show`)."""
    (recorded_run / "launcher.json").write_text("{torn")
    for read in (read_launchers, summarize):
        with pytest.raises(DllmError, match="cannot read launcher record .*launcher.json"):
            read(recorded_run)


def test_start_ticks_reads_a_command_name_with_spaces_and_parentheses(monkeypatch, tmp_path):
    stat = "4242 (a ) b) S " + " ".join(str(n) for n in range(4, 60))
    real = Path.read_text

    def fake(self, *args, **kwargs):
        return stat if str(self) == "/proc/4242/stat" else real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", fake)
    assert result_mod._start_ticks(4242) == 22


def test_a_resume_of_a_run_still_running_is_refused_and_leaves_its_records(recorded_run, cli):
    """`dllm train --run-dir` on a run whose launcher still trains it: refused before it touches
    the run's records. It replaced the live launcher's record with its own and, refused later
    by the checkpoint folder's lock, wrote `exit 2` as the result of the run still training."""
    record_launcher(recorded_run)  # this test's process: a live launcher of the run
    record = (recorded_run / "launcher.json").read_text()
    resume = cli("train", "--config", recorded_run / "spec.yaml", "--run-dir", recorded_run)
    assert resume.code == 2
    assert f"{recorded_run} is not over: its dllm launch runs as pid {os.getpid()}" in (
        resume.err
    ), resume.err
    assert "a resume would train beside it" in resume.err
    assert (recorded_run / "launcher.json").read_text() == record
    assert not (recorded_run / "result.json").exists()
    assert summarize(recorded_run).status == "running"


def test_a_resume_of_a_run_whose_launcher_died_still_runs(recorded_run, cli):
    record_launcher(recorded_run)
    _rewrite(recorded_run, pid=_dead_pid())
    resume = cli("train", "--config", recorded_run / "spec.yaml", "--run-dir", recorded_run)
    assert resume.code == 0, resume.err
    assert summarize(recorded_run).status == "ok"
