"""`dllm launch --backend slurm --submit` on a real one-node SLURM cluster (slurm_cluster.py):
a 2-rank CPU job trains exactly like the torchrun run, `dllm run list/show` follow its state
through SLURM, two jobs share the node at once, and a cancelled job is reported cancelled.
"""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SPEC = """
launch:
  seed: 5
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
  steps: 3
scheduler:
  warmup_steps: 1
"""
TWO_RANKS = ("--nproc-per-node", "2", "--set", "topology.dp=2")


def losses(run_dir: Path) -> list[tuple[int, float]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [(r["step"], r["loss"]) for r in map(json.loads, lines)]


@pytest.fixture(scope="module")
def torchrun_losses(tmp_path_factory):
    """The same job under torchrun on this host: the trace every SLURM run must reproduce."""
    root = tmp_path_factory.mktemp("torchrun")
    (root / "train.yaml").write_text(textwrap.dedent(SPEC))
    from turbo_dllm.cli import main

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("DLLM_HOME", str(tmp_path_factory.mktemp("home")))
        mp.delenv("DLLM_OVERRIDE_GPUS", raising=False)
        code = main(["launch", "--config", "train.yaml", *TWO_RANKS, "--run-dir", "ref"])
    assert code == 0
    return losses(root / "ref")


@pytest.fixture
def submit(cli, workdir, slurm_cluster, monkeypatch):
    """`dllm launch --backend slurm --submit` into runs/NAME; returns (run dir, job id)."""
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    (workdir / "train.yaml").write_text(textwrap.dedent(SPEC))

    def run(name: str, *extra: str) -> tuple[Path, str]:
        run_dir = workdir / "runs" / name
        args = ("--config", "train.yaml", "--backend", "slurm", "--submit", *TWO_RANKS)
        result = cli("launch", *args, "--run-dir", run_dir, *extra)
        assert result.code == 0, result.err
        job_id = json.loads((run_dir / "slurm_job.json").read_text())["job_id"]
        assert f"Submitted batch job {job_id}" in result.out
        return run_dir, job_id

    return run


def statuses(cli) -> dict[str, str]:
    listing = json.loads(cli("run", "list", "--json").out)
    return {run["run_id"]: run["status"] for run in listing["runs"]}


def test_submitted_job_trains_like_torchrun(submit, slurm_cluster, torchrun_losses, cli):
    # As many CPUs as this host has, so the workers' OMP_NUM_THREADS equal torchrun's.
    cpus = str(len(os.sched_getaffinity(0)))
    run_dir, job_id = submit("one", "--cpus-per-task", cpus)
    assert statuses(cli)["one"] in ("pending", "running")

    slurm_cluster.wait_for(job_id, {"COMPLETED", "FAILED"})
    output = (run_dir / f"slurm-{job_id}.out").read_text()
    assert slurm_cluster.state(job_id) == "COMPLETED", output
    assert losses(run_dir) == torchrun_losses
    result = json.loads((run_dir / "result.json").read_text())
    assert result["exit_code"] == 0 and result["slurm_job_id"] == job_id

    listing = json.loads(cli("run", "list", "--json").out)
    [run] = listing["runs"]
    assert run["status"] == "ok" and run["slurm_job_id"] == job_id
    assert run["steps_done"] == 3 and run["backend"] == "slurm"
    shown = cli("run", "show", "one")
    assert "progress     3/3 steps" in shown.out and "; ok" in shown.out
    assert f"slurm job    {job_id}" in shown.out


def test_two_jobs_share_the_node(submit, slurm_cluster, cli):
    # One CPU each, so both fit on the node at once; held, then released together. The second
    # runs longer: on a shared rendezvous port it would lose its store when the first ends.
    hold = ("--cpus-per-task", "1", "--sbatch=--hold")
    first, first_id = submit("first", *hold)
    second, second_id = submit("second", *hold, "--set", "training.steps=12")
    assert statuses(cli) == {"first": "pending", "second": "pending"}
    released = slurm_cluster.run("scontrol", "release", f"{first_id},{second_id}")
    assert released.returncode == 0, released.stderr
    deadline = time.monotonic() + 120
    together = False
    while time.monotonic() < deadline and not together:
        states = {slurm_cluster.state(first_id), slurm_cluster.state(second_id)}
        together = states == {"RUNNING"}
        if "COMPLETED" in states or "FAILED" in states:
            break
        time.sleep(0.2)
    assert together, f"the two jobs never ran at once: {states}"
    for run_dir, job_id in ((first, first_id), (second, second_id)):
        slurm_cluster.wait_for(job_id, {"COMPLETED", "FAILED"})
        output = (run_dir / f"slurm-{job_id}.out").read_text()
        assert slurm_cluster.state(job_id) == "COMPLETED", output
    assert [step for step, _ in losses(first)] == [1, 2, 3]
    assert [step for step, _ in losses(second)] == list(range(1, 13))
    assert statuses(cli) == {"first": "ok", "second": "ok"}


def test_cancelled_job_is_reported_cancelled(submit, slurm_cluster, cli):
    run_dir, job_id = submit("long", "--cpus-per-task", "1", "--set", "training.steps=100000")
    slurm_cluster.wait_for(job_id, {"RUNNING"})
    assert statuses(cli)["long"] == "running"
    cancel = slurm_cluster.run("scancel", job_id)
    assert cancel.returncode == 0, cancel.stderr
    slurm_cluster.wait_for(job_id, {"CANCELLED"})
    assert statuses(cli)["long"] == "cancelled"
    shown = cli("run", "show", "long")
    # the progress line, then how to go on (bd3302a: a job SLURM ended resumes from its
    # script), then SLURM's own word on the job
    resume = f"resume       sbatch {run_dir / 'job.sbatch'}"
    assert f"; cancelled\n{resume}\nslurm job    {job_id} (CANCELLED)\n" in shown.out, shown.out


def test_a_run_dir_with_spaces_quotes_a_hash_and_a_percent_runs(submit, slurm_cluster, cli):
    """The #SBATCH lines name the run dir: sbatch refused the job when they split at a space
    (unless the value is double-quoted, which also keeps a # from starting a comment), and a
    `%x` in --output became the job name, a folder that does not exist: the job FAILED
    (JobLaunchFailure) before its first line ran, with no output file."""
    name = "my run #2 'b' 50%x"
    run_dir, job_id = submit(name, "--cpus-per-task", "1", "--set", "training.steps=2")
    slurm_cluster.wait_for(job_id, {"COMPLETED", "FAILED"})
    assert slurm_cluster.state(job_id) == "COMPLETED", slurm_cluster.run(
        "scontrol", "show", "job", job_id
    ).stdout
    assert "step 2/2" in (run_dir / f"slurm-{job_id}.out").read_text()
    assert statuses(cli)[name] == "ok"


def test_cancelled_job_resumes_when_its_script_is_submitted_again(submit, slurm_cluster, cli):
    """scancel mid-run saves the step under way, then `sbatch job.sbatch` (the way on the
    refused relaunch names): the new job resumes from it, reads `running` (not the cancelled
    job's state) while it trains, and ends `ok` with every step once.

    Seen before: plain scancel has SLURM signal every process of the step, and torchrun passes
    its SIGTERM on too, so each worker got two at once; the second ended it mid-step, and every
    step since the last periodic checkpoint was lost (train/stop.py: REPEAT_WINDOW_S)."""
    from turbo_dllm.train.checkpoint import find_latest, read_meta

    # no periodic checkpoint before the cancel: the one it leaves is the stop's own save
    steps = ("--set", "training.steps=40", "--set", "checkpoint.interval=1000")
    run_dir, job_id = submit("resumed", "--cpus-per-task", "1", *steps)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (
        (run_dir / "metrics.jsonl").is_file() and len(losses(run_dir)) >= 2
    ):
        time.sleep(0.2)
    assert slurm_cluster.run("scancel", job_id).returncode == 0
    slurm_cluster.wait_for(job_id, {"CANCELLED"})
    assert statuses(cli)["resumed"] == "cancelled"
    trained = losses(run_dir)[-1][0]
    assert trained < 40, "the job finished before it was cancelled"
    log = (run_dir / f"slurm-{job_id}.out").read_text()
    latest = find_latest(run_dir / "checkpoints")
    assert latest is not None and read_meta(latest).step == trained, log[-3000:]
    assert f"stopping after step {trained}: SIGTERM received (checkpoint saved)" in log

    refused = cli(
        "launch",
        "--config",
        "train.yaml",
        "--backend",
        "slurm",
        *TWO_RANKS,
        *steps,
        "--cpus-per-task",
        "1",
        "--run-dir",
        run_dir,
    )
    assert refused.code == 2 and f"sbatch {run_dir / 'job.sbatch'}" in refused.err
    again = slurm_cluster.run("sbatch", "--parsable", str(run_dir / "job.sbatch"))
    assert again.returncode == 0, again.stderr
    new_id = again.stdout.strip().split(";")[0]
    slurm_cluster.wait_for(new_id, {"RUNNING"})
    seen = set()
    while slurm_cluster.state(new_id) == "RUNNING" and "running" not in seen:
        seen.add(statuses(cli)["resumed"])  # the job records itself as its script starts
    assert "running" in seen, seen
    slurm_cluster.wait_for(new_id, {"COMPLETED", "FAILED"})
    output = (run_dir / f"slurm-{new_id}.out").read_text()
    assert slurm_cluster.state(new_id) == "COMPLETED", output
    assert "resumed from" in output and f"(step {trained})" in output, output[-3000:]
    assert [step for step, _ in losses(run_dir)] == list(range(1, 41))
    assert statuses(cli)["resumed"] == "ok"
