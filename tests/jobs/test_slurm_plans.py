"""SLURM plans and scripts without a cluster: what the script asks for, its rendezvous port,
how sbatch failures read, and how `dllm run list` follows a job through (fake) SLURM commands.
A real cluster runs the jobs in test_slurm_cluster.py.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import assert_user_error
from tests.jobs.test_plans import dry_run
from turbo_dllm.jobs.backends.slurm import PORT_BASE, PORT_SPAN

SLURM = ("--backend", "slurm")
TWO_CPU_RANKS = ("--nproc-per-node", "2", "--set", "topology.dp=2")


def fake_command(bin_dir: Path, name: str, script: str) -> Path:
    """A stand-in for a SLURM command on PATH: a shell script."""
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def saved_step(run_dir: Path, step: int = 2) -> None:
    """A saved checkpoint as the trainer leaves it: checkpoints/step_<N>/checkpoint.json."""
    folder = run_dir / "checkpoints" / f"step_{step:08d}"
    folder.mkdir(parents=True)
    (folder / "checkpoint.json").write_text("{}")


def slurm_launch(cli, spec_file, *extra):
    result = cli("launch", "--config", spec_file, *SLURM, *TWO_CPU_RANKS, *extra)
    assert result.code == 0, result.err
    return result


def test_gpu_plan_and_script(cli, spec_file, gpus, workdir, monkeypatch):
    gpus(8)  # a submit host with GPUs stands for GPU nodes: one GPU per process
    plan, _ = dry_run(
        cli,
        "--config",
        spec_file,
        *SLURM,
        "--set",
        "topology.fsdp=16",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "8",
        "--partition",
        "h200",
        "--time",
        "02:00:00",
    )
    assert plan["backend"] == "slurm" and plan["device"] == "cuda"
    assert plan["slurm"]["nodes"] == "2" and plan["slurm"]["gpus_per_node"] == 8
    assert plan["slurm"]["cpus_per_task"] == 8  # one per process unless --cpus-per-task
    assert plan["rendezvous"]["endpoint"] == "$DLLM_HEAD_NODE:$DLLM_RDZV_PORT"
    assert not (workdir / "runs").exists()

    # The real launch writes the run dir and the script; without sbatch it only says how.
    monkeypatch.setenv("PATH", str(workdir / "bin"))
    result = cli(
        "launch",
        "--config",
        spec_file,
        *SLURM,
        "--set",
        "topology.fsdp=16",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "8",
        "--partition",
        "h200",
    )
    assert result.code == 0, result.err
    [run_dir] = (workdir / "runs").iterdir()
    script = (run_dir / "job.sbatch").read_text()
    assert f"submit with: sbatch {run_dir / 'job.sbatch'}" in result.out
    assert "`dllm run list` follows the job once it starts" in result.out
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --partition=h200",
        'scontrol show hostnames "$SLURM_JOB_NODELIST"',
        f"DLLM_RDZV_PORT=$(({PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN}))",
        '--rdzv-endpoint "$DLLM_HEAD_NODE:$DLLM_RDZV_PORT"',
        '--rdzv-id "$SLURM_JOB_ID"',
        "srun --kill-on-bad-exit=1 --cpus-per-task=8",
        "export OMP_NUM_THREADS=1",
    ):
        assert line in script, line
    assert (run_dir / "manifest.json").is_file() and (run_dir / "spec.yaml").is_file()
    assert not (run_dir / "result.json").exists()


def test_gpus_follow_the_topology_without_nproc_per_node(cli, spec_file, gpus):
    gpus(8)
    plan, _ = dry_run(cli, "--config", spec_file, *SLURM, "--set", "topology.fsdp=4")
    assert plan["nproc_per_node"] == 4 and plan["slurm"]["gpus_per_node"] == 4
    assert plan["device"] == "cuda" and plan["dist_backend"] == "nccl"


def test_cpu_host_asks_for_cpus_only(cli, spec_file, workdir):
    """Without GPUs here the job asks for none: --gpus-per-node on a CPU cluster is an invalid
    gres request that sbatch refuses."""
    plan, _ = dry_run(cli, "--config", spec_file, *SLURM, *TWO_CPU_RANKS)
    assert plan["device"] == "cpu" and plan["dist_backend"] == "gloo"
    assert plan["slurm"]["gpus_per_node"] == 0 and plan["slurm"]["cpus_per_task"] == 2
    assert any("--gpus-per-node G" in note for note in plan["notes"])

    slurm_launch(cli, spec_file, "--cpus-per-task", "6")
    [run_dir] = (workdir / "runs").iterdir()
    script = (run_dir / "job.sbatch").read_text()
    assert "--gpus-per-node" not in script
    assert "#SBATCH --cpus-per-task=6" in script and "export OMP_NUM_THREADS=3" in script
    assert "srun --kill-on-bad-exit=1 --cpus-per-task=6" in script
    plan, _ = dry_run(cli, "--config", spec_file, *SLURM, *TWO_CPU_RANKS, "--gpus-per-node", "4")
    assert plan["slurm"]["gpus_per_node"] == 4 and plan["device"] == "cuda"


def test_slurm_counts_are_checked(cli, spec_file, workdir):
    """A 0 CPU count once fell back to the default and a negative GPU count reached the script."""
    launch = ("launch", "--config", spec_file, *SLURM, "--dry-run")
    assert_user_error(cli(*launch, "--gpus-per-node", "-1"), "--gpus-per-node must be >= 0")
    assert_user_error(cli(*launch, "--cpus-per-task", "0"), "--cpus-per-task must be >= 1")
    plan, _ = dry_run(cli, "--config", spec_file, *SLURM, "--gpus-per-node", "0")
    assert plan["slurm"]["gpus_per_node"] == 0 and plan["device"] == "cpu"


def test_sbatch_lines_stay_one_word_in_the_start_command(cli, spec_file, workdir):
    """`--sbatch=--exclusive` written back as `--sbatch --exclusive` does not parse: the printed
    start command and the manifest's argv keep it one word."""
    args = ("--config", spec_file, *SLURM, *TWO_CPU_RANKS, "--sbatch=--exclusive")
    result = cli("launch", "--dry-run", "--json", *args)
    assert result.code == 0, result.err
    payload = json.loads(result.out)
    assert "--sbatch=--exclusive" in payload["manifest"]["argv"]
    words = shlex.split(payload["start_command"])
    plan, _ = dry_run(cli, *words[words.index("launch") + 1 :])  # the pasted line runs
    assert plan["slurm"]["extra"] == ["--exclusive"]


def test_sbatch_values_stay_one_directive(cli, spec_file, workdir):
    """A line break in an #SBATCH value ended the directive and put a shell line in the script
    (sbatch then ignored every later directive); a run dir with a space or a # was cut short by
    sbatch, which splits a directive at white space and ends it at a #, unless double-quoted."""
    launch = ("launch", "--config", spec_file, *SLURM, "--dry-run")
    result = cli(*launch, "--sbatch", "--exclusive\necho hi")
    assert_user_error(result, "--sbatch '--exclusive\\necho hi'", "cannot hold a line break")
    assert_user_error(cli(*launch, "--time", "1:00\nx"), "--time '1:00\\nx'", "line break")
    assert_user_error(cli(*launch, "--run-dir", 'runs/a"b'), "cannot hold a double quote")
    slurm_launch(cli, spec_file, "--run-dir", "runs/my run #2", "--partition", "a,b")
    script = (workdir / "runs" / "my run #2" / "job.sbatch").read_text()
    assert '#SBATCH --job-name="dllm-my run #2"\n' in script
    assert f'#SBATCH --output="{workdir}/runs/my run #2/slurm-%j.out"\n' in script
    assert "#SBATCH --partition=a,b\n" in script


def test_a_percent_in_the_run_dir_stays_a_percent_in_the_output_path(cli, spec_file, workdir):
    """sbatch expands %-patterns in --output: runs/50%x named runs/50dllm-50%x/, which does not
    exist, and the job ended FAILED (JobLaunchFailure) before its first line ran. `%%` is a `%`.
    The job name has no patterns (test_slurm_cluster.py runs such a run dir)."""
    slurm_launch(cli, spec_file, "--run-dir", "runs/50%x 100%")
    script = (workdir / "runs" / "50%x 100%" / "job.sbatch").read_text()
    assert f'#SBATCH --output="{workdir}/runs/50%%x 100%%/slurm-%j.out"\n' in script
    assert '#SBATCH --job-name="dllm-50%x 100%"\n' in script


def test_the_commands_it_prints_paste_into_bash(cli, spec_file, workdir, monkeypatch):
    """A run dir with a space: `submit with: sbatch /x/my run/job.sbatch` and the refused
    relaunch's `dllm launch --manifest ...` / `dllm run show ...` were printed unquoted, and
    pasted into bash they named two files."""
    bin_dir = workdir / "bin"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    fake_command(bin_dir, "squeue", "echo '4242|CANCELLED'\n")
    run_dir = workdir / "runs" / "my run"
    result = slurm_launch(cli, spec_file, "--run-dir", run_dir)
    [line] = [x for x in result.out.splitlines() if x.startswith("submit with: ")]
    words = shlex.split(line.removeprefix("submit with: ").split(" (")[0])
    assert words == ["sbatch", str(run_dir / "job.sbatch")]

    again = cli("launch", "--config", spec_file, *SLURM, *TWO_CPU_RANKS, "--run-dir", run_dir)
    assert_user_error(again, "already holds run my run")
    manifest_way = again.err.split("into a new run dir: ")[1].split("\n")[0]
    assert shlex.split(manifest_way) == ["dllm", "launch", "--manifest", f"{run_dir}/manifest.json"]
    hint = again.err.split("hint: `")[1].split("`")[0]
    assert shlex.split(hint) == ["dllm", "run", "show", str(run_dir)]


def test_the_dry_run_says_what_its_start_line_does_for_a_slurm_job(
    cli, spec_file, workdir, monkeypatch
):
    """Its start line writes the run dir and job.sbatch, and submits only with --submit: it said
    "then runs the command(s) above" of a line that started nothing. Run as printed: it writes
    the script and submits nothing; with --submit, sbatch gets it."""
    bin_dir = workdir / "bin"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    fake_command(bin_dir, "sbatch", f'echo "$@" >> {workdir / "sbatch.log"}; echo 4244\n')
    for submit in ((), ("--submit",)):
        result = slurm_launch(cli, spec_file, "--dry-run", *submit)
        lines = result.out.splitlines()
        [at] = [i for i, line in enumerate(lines) if line.startswith("# to run it")]
        assert "then runs the command(s) above" not in lines[at]
        assert "writes the run dir's spec.yaml, manifest.json and job.sbatch" in lines[at]
        proc = subprocess.run(["bash", "-c", lines[at + 1]], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        submitted = (workdir / "sbatch.log").read_text() if submit else ""
        if submit:
            assert "then submits job.sbatch (sbatch)" in lines[at]
            assert "job.sbatch" in submitted
        else:
            assert "and submits nothing (add --submit" in lines[at]
            assert not (workdir / "sbatch.log").exists()
    dry = cli("launch", "--config", spec_file, "--dry-run")
    assert "then runs the command(s) above" in dry.out


def test_the_head_node_of_a_long_node_list(cli, spec_file, workdir):
    """The script took the first node with `scontrol show hostnames ... | head -n 1`: head left
    after one line, scontrol died writing the rest of a long list (SIGPIPE), and under `set -euo
    pipefail` that ended the job script before srun."""
    slurm_launch(cli, spec_file, "--run-dir", "runs/big")
    script = (workdir / "runs" / "big" / "job.sbatch").read_text()
    [line] = [x for x in script.splitlines() if x.startswith("DLLM_HEAD_NODE=")]
    nodes = workdir / "nodes.py"  # one write per node: scontrol's stdout flushes in blocks
    nodes.write_text("import sys\nfor i in range(20000):\n    print(f'gpu{i:05d}', flush=True)\n")
    python = shlex.quote(sys.executable)
    fake_command(workdir / "bin", "scontrol", f"exec {python} {shlex.quote(str(nodes))}\n")
    shell = (
        f"set -euo pipefail; SLURM_JOB_NODELIST='gpu[00000-19999]'; {line}; echo $DLLM_HEAD_NODE"
    )
    env = {**os.environ, "PATH": f"{workdir / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, env=env)
    assert (proc.returncode, proc.stdout) == (0, "gpu00000\n"), proc.stderr[-500:]


def port_for(script: str, job_id: int) -> int:
    """What the script's port line computes for a job id, run by bash."""
    [line] = [x for x in script.splitlines() if x.startswith("DLLM_RDZV_PORT=")]
    shell = f"SLURM_JOB_ID={job_id}; {line}; echo $DLLM_RDZV_PORT"
    return int(subprocess.run(["bash", "-c", shell], capture_output=True, text=True).stdout)


def test_rendezvous_port_follows_the_job_id(cli, spec_file, workdir):
    slurm_launch(cli, spec_file, "--run-dir", "runs/derived")
    script = (workdir / "runs" / "derived" / "job.sbatch").read_text()
    ports = {port_for(script, job_id) for job_id in (41, 42, 43)}
    assert len(ports) == 3 and all(PORT_BASE <= p < PORT_BASE + PORT_SPAN for p in ports)
    assert port_for(script, 41 + PORT_SPAN) == port_for(script, 41)

    slurm_launch(cli, spec_file, "--master-port", "29511", "--run-dir", "runs/fixed")
    script = (workdir / "runs" / "fixed" / "job.sbatch").read_text()
    assert "DLLM_RDZV_PORT" not in script
    assert '--rdzv-endpoint "$DLLM_HEAD_NODE:29511"' in script


def test_replay_keeps_how_the_port_is_chosen(cli, spec_file, workdir):
    for name, extra in (("derived", ()), ("fixed", ("--master-port", "29511"))):
        slurm_launch(cli, spec_file, "--run-dir", f"runs/{name}", *extra)
        manifest = workdir / "runs" / name / "manifest.json"
        plan, _ = dry_run(cli, "--manifest", manifest, "--run-dir", f"runs/{name}-again")
        expected = "$DLLM_RDZV_PORT" if name == "derived" else "29511"
        assert plan["rendezvous"]["endpoint"] == f"$DLLM_HEAD_NODE:{expected}"


def test_dry_run_prints_the_srun_line_as_the_script_runs_it(cli, spec_file):
    result = cli("launch", "--config", spec_file, *SLURM, *TWO_CPU_RANKS, "--dry-run")
    assert result.code == 0, result.err
    assert '--rdzv-endpoint "$DLLM_HEAD_NODE:$DLLM_RDZV_PORT" --rdzv-id "$SLURM_JOB_ID"' in (
        result.out
    )
    assert "'$" not in result.out  # nothing single-quoted that the script expands


def test_script_records_how_srun_ended(cli, spec_file, workdir):
    """The batch script itself writes result.json (its launcher only submitted it)."""
    slurm_launch(cli, spec_file, "--run-dir", "runs/scripted")
    run_dir = workdir / "runs" / "scripted"
    bin_dir = workdir / "bin"
    fake_command(bin_dir, "scontrol", "echo node7\n")
    fake_command(bin_dir, "srun", 'echo "$@" > srun.args\nexit 3\n')
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NODELIST": "node7",
    }
    proc = subprocess.run(["bash", run_dir / "job.sbatch"], env=env, capture_output=True)
    assert proc.returncode == 3, proc.stderr
    srun_args = (workdir / "srun.args").read_text()
    assert f"--rdzv-endpoint node7:{port_for((run_dir / 'job.sbatch').read_text(), 77)}" in (
        srun_args
    )
    assert "--rdzv-id 77" in srun_args
    result = json.loads((run_dir / "result.json").read_text())
    assert result["exit_code"] == 3 and result["slurm_job_id"] == "77"
    assert result["backend"] == "slurm" and result["format"] == "turbo_dllm.run_result.v1"


def test_a_resubmitted_script_is_the_runs_latest_attempt(cli, spec_file, workdir, monkeypatch):
    """`sbatch job.sbatch` by hand (the script written without --submit, or submitted again
    after a cancelled or failed job) records its job as the run's when it starts and removes the
    earlier attempt's result.json. Before, the run read `not submitted`, or the cancelled
    job's state, or the earlier attempt's exit status, while the new job trained."""
    slurm_launch(cli, spec_file, "--run-dir", "runs/again")
    run_dir = workdir / "runs" / "again"
    bin_dir = workdir / "bin"
    fake_command(bin_dir, "scontrol", "echo node7\n")
    # What the run looks like while srun trains: its submission record and result.json.
    fake_command(
        bin_dir,
        "srun",
        f"cat {run_dir / 'slurm_job.json'} > during.json\n"
        f"test -e {run_dir / 'result.json'} && echo stale > during.result\nexit 0\n",
    )
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "PATH": path, "SLURM_JOB_NODELIST": "node7"}

    def run_job(job_id: str) -> None:
        proc = subprocess.run(["bash", run_dir / "job.sbatch"], env={**env, "SLURM_JOB_ID": job_id})
        assert proc.returncode == 0

    run_job("77")  # never --submit-ted: the job records itself
    assert json.loads((workdir / "during.json").read_text())["job_id"] == "77"
    # An earlier attempt that failed, then the script submitted again as job 78.
    from turbo_dllm.jobs.result import write_result

    write_result(run_dir, 1, "2026-01-01T00:00:00+00:00", "slurm", slurm_job_id="77")
    run_job("78")
    assert json.loads((workdir / "during.json").read_text())["job_id"] == "78"
    assert not (workdir / "during.result").exists()  # no stale exit 1 while it trained
    assert json.loads((run_dir / "slurm_job.json").read_text())["job_id"] == "78"
    assert json.loads((run_dir / "result.json").read_text())["slurm_job_id"] == "78"

    # `dllm run list` follows job 78, not 77.
    fake_command(bin_dir, "squeue", 'echo "$@" > squeue.args\necho "78|RUNNING"\n')
    fake_command(bin_dir, "sacct", "exit 1\n")
    monkeypatch.setenv("PATH", path)
    (run_dir / "result.json").unlink()
    listing = json.loads(cli("run", "list", "--json").out)
    [run] = listing["runs"]
    assert run["status"] == "running" and run["slurm_job_id"] == "78"


def test_a_stopped_slurm_run_is_refused_with_its_script_to_resubmit(
    cli, spec_file, workdir, monkeypatch
):
    """The same launch into a cancelled SLURM run's dir names the line that resumes it as a
    SLURM job (its script); it offered `dllm train ... (under torchrun)`, which runs on the
    submit host, not on the cluster."""
    bin_dir = workdir / "bin"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    fake_command(bin_dir, "sbatch", "echo 4242\n")
    fake_command(bin_dir, "squeue", "echo '4242|CANCELLED'\n")
    args = ("--run-dir", "runs/cancelled", "--submit")
    slurm_launch(cli, spec_file, *args)
    result = cli("launch", "--config", spec_file, *SLURM, *TWO_CPU_RANKS, *args)
    script = workdir / "runs" / "cancelled" / "job.sbatch"
    assert_user_error(
        result,
        "already holds run cancelled (cancelled, no steps yet)",
        f"continue it from its last checkpoint as a SLURM job: sbatch {script}",
    )
    assert "dllm train" not in result.err


def test_submit_calls_sbatch_or_explains(cli, spec_file, workdir, monkeypatch):
    bin_dir = workdir / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    args = ("launch", "--config", spec_file, *SLURM, "--nproc-per-node", "1")
    result = cli(*args, "--submit")
    assert_user_error(result, "sbatch, which is not on PATH", "drop --submit")
    assert not (workdir / "runs").exists()

    log = workdir / "sbatch.log"
    fake_command(bin_dir, "sbatch", f'echo "$@" > {log}\necho "4242;cluster-a"\n')
    result = cli(*args, "--submit")
    assert result.code == 0, result.err
    assert "Submitted batch job 4242" in result.out
    assert log.read_text().split() == ["--parsable", str(next(workdir.glob("runs/*/job.sbatch")))]
    [record] = workdir.glob("runs/*/slurm_job.json")
    submitted = json.loads(record.read_text())
    assert submitted["job_id"] == "4242" and submitted["cluster"] == "cluster-a"


def test_failed_sbatch_names_options_that_exist(cli, spec_file, workdir, monkeypatch):
    bin_dir = workdir / "bin"
    fake_command(bin_dir, "sbatch", "echo 'sbatch: error: Invalid generic resource' >&2\nexit 1\n")
    monkeypatch.setenv("PATH", str(bin_dir))
    result = cli("launch", "--config", spec_file, *SLURM, "--nproc-per-node", "1", "--submit")
    assert result.code == 2 and "Traceback" not in result.err
    error = result.err[result.err.index("dllm: error:") :]  # after the launch's own lines
    assert error.startswith("dllm: error: sbatch failed (exit 1): sbatch: error: Invalid generic")
    hint = error.split("hint:", 1)[1]
    named = set(re.findall(r"--[a-z][a-z-]+", hint))
    assert {"--partition", "--gpus-per-node", "--cpus-per-task", "--sbatch"} <= named
    help_text = cli("launch", "--help").out
    assert all(re.search(rf"{flag}\b", help_text) for flag in named), named


@pytest.mark.parametrize(
    "said",
    [
        "sbatch: error: Batch job submission failed: Unable to contact slurm controller "
        "(connect failure)",
        "sbatch: error: _establish_config_source: failed to fetch config\n"
        "sbatch: fatal: Could not establish a configuration source",
    ],
    ids=["controller-down", "no-configuration"],
)
def test_sbatch_without_a_controller_is_not_blamed_on_job_options(
    cli, spec_file, workdir, monkeypatch, said
):
    """What sbatch says (real SLURM 22.05) with the controller down or no configuration: the hint
    sent the user to change --partition, --time, ... which sbatch never got to read."""
    bin_dir = workdir / "bin"
    fake_command(bin_dir, "sbatch", f"printf '%s\\n' {shlex.quote(said)} >&2\nexit 1\n")
    monkeypatch.setenv("PATH", str(bin_dir))
    result = cli("launch", "--config", spec_file, *SLURM, "--nproc-per-node", "1", "--submit")
    assert result.code == 2 and "Traceback" not in result.err
    error = result.err[result.err.index("dllm: error:") :]
    assert error.startswith(f"dllm: error: sbatch failed (exit 1): {said}\n"), error
    hint = error.split("hint:", 1)[1]
    assert "sbatch reached no SLURM controller" in hint and "SLURM_CONF" in hint
    assert "--partition" not in hint
    assert not (workdir / "runs").exists() or not any((workdir / "runs").iterdir())


def test_a_refused_submission_leaves_no_run(cli, spec_file, workdir, monkeypatch):
    """sbatch refusing the job (a partition the cluster lacks) left its run dir with a manifest
    and script: `dllm run list` showed a run that never ran (`not submitted`), and the same
    launch with a partition that exists was refused ("already holds run ..."). Now the launch
    removes what it wrote, and the corrected launch into the same run dir is submitted."""
    bin_dir = workdir / "bin"
    fake_command(
        bin_dir,
        "sbatch",
        'case "$(cat "$2")" in *--partition=nope*) '
        "echo 'sbatch: error: invalid partition specified: nope' >&2; exit 1;; esac\n"
        "echo 4242\n",
    )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    args = ("launch", "--config", spec_file, *SLURM, "--nproc-per-node", "1", "--submit")
    for run_dir, made in ((workdir / "runs" / "new", True), (workdir / "mine", False)):
        if not made:
            run_dir.mkdir()
            (run_dir / "notes.txt").write_text("the user's\n")
        result = cli(*args, "--run-dir", run_dir, "--partition", "nope")
        assert result.code == 2 and "Traceback" not in result.err
        error = result.err[result.err.index("dllm: error:") :]  # after the launch's own lines
        for needle in ("invalid partition", "Nothing was submitted", "hint: launch again"):
            assert needle in error, error
        if made:
            assert not run_dir.exists()
        else:
            assert sorted(p.name for p in run_dir.iterdir()) == ["notes.txt"]
        result = cli(*args, "--run-dir", run_dir, "--partition", "debug")
        assert result.code == 0, result.err
        assert json.loads((run_dir / "slurm_job.json").read_text())["job_id"] == "4242"
    assert "not submitted" not in cli("run", "list").out


def test_list_follows_the_job_through_slurm(cli, spec_file, workdir, monkeypatch):
    bin_dir = workdir / "bin"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    fake_command(bin_dir, "sbatch", "echo 4242\n")
    slurm_launch(cli, spec_file, "--run-dir", "runs/submitted", "--submit")
    slurm_launch(cli, spec_file, "--run-dir", "runs/written")
    run_dir = workdir / "runs" / "submitted"

    def status(squeue: str, sacct: str) -> dict:
        fake_command(bin_dir, "squeue", squeue)
        fake_command(bin_dir, "sacct", sacct)
        listing = json.loads(cli("run", "list", "--json").out)
        return {run["run_id"]: run for run in listing["runs"]}

    forgotten = "echo 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n"
    no_accounting = "echo 'Slurm accounting storage is disabled' >&2\nexit 1\n"
    runs = status("echo '4242|PENDING'\n", no_accounting)
    assert runs["submitted"]["status"] == "pending" and runs["submitted"]["slurm_job_id"] == "4242"
    assert runs["written"]["status"] == "not submitted"
    assert status("echo '4242|RUNNING'\n", no_accounting)["submitted"]["status"] == "running"
    # squeue forgets finished jobs after MinJobAge; accounting remembers them.
    runs = status(forgotten, "echo '4242|CANCELLED by 0'\n")
    assert runs["submitted"]["status"] == "cancelled"
    assert runs["submitted"]["slurm_state"] == "CANCELLED"
    assert status(forgotten, no_accounting)["submitted"]["status"] == "unknown"

    from turbo_dllm.jobs.result import write_result

    write_result(run_dir, 0, "2026-01-01T00:00:00+00:00", "slurm", slurm_job_id="4242")
    assert status(forgotten, no_accounting)["submitted"]["status"] == "ok"
    # A job SLURM killed after srun returned still reads as SLURM ended it.
    write_result(run_dir, 143, "2026-01-01T00:00:00+00:00", "slurm", slurm_job_id="4242")
    assert status("echo '4242|TIMEOUT'\n", no_accounting)["submitted"]["status"] == "timeout"
    # 143: stopped on SLURM's time-limit warning (or SIGTERM), the step under way saved.
    assert status("echo '4242|FAILED'\n", no_accounting)["submitted"]["status"] == "stopped"

    saved_step(run_dir)  # what a stop on the warning leaves (test_slurm_stop_before_first_step)
    shown = cli("run", "show", "submitted")
    stopped = "; stopped (exit 143: the step under way saved, resumable)\n"
    assert stopped + "ended        exit status 143 at " in shown.out, shown.out
    assert "\nslurm job    4242 (FAILED)\n" in shown.out, shown.out


def test_result_module_writes_result_json(tmp_path):
    from turbo_dllm.jobs.result import main, read_result

    args = ["--run-dir", str(tmp_path), "--exit-code", "0", "--started", "2026-01-01T00:00:00Z"]
    assert main([*args, "--backend", "slurm", "--slurm-job-id", "9"]) == 0
    result = read_result(tmp_path)
    assert result["exit_code"] == 0 and result["slurm_job_id"] == "9"
    assert result["python"] == sys.executable


@pytest.mark.parametrize(
    "limit, seconds",
    [
        ("90", 90 * 60),
        ("30:15", 30 * 60 + 15),
        ("04:00:00", 4 * 3600),
        ("2-00", 2 * 86400),
        ("1-12:30", 86400 + 12 * 3600 + 30 * 60),
        ("1-00:00:07", 86400 + 7),
        ("UNLIMITED", None),
        ("infinite", None),
        ("0", None),  # sbatch: no limit
    ],
)
def test_time_limits_in_seconds(limit, seconds):
    from turbo_dllm.jobs.backends.slurm import time_limit_s

    assert time_limit_s(limit) == seconds


def test_a_time_limit_asks_slurm_to_warn_the_steps_before_it(cli, spec_file, workdir):
    """At its time limit SLURM killed the job mid-save (every step since the last checkpoint
    lost: test_slurm_time_limit.py); with a --time the script asks for SIGUSR1 to every step
    5 minutes before it (a quarter of a short limit), which slurm_step turns into one SIGTERM
    per worker. A --sbatch=--signal of the user's own comes later, and sbatch takes it."""
    cases = {
        "four-hours": (("--time", "04:00:00"), 300),
        "two-minutes": (("--time", "2"), 30),
        "unlimited": (("--time", "UNLIMITED"), None),
        "none": ((), None),
    }
    for name, (flags, warning) in cases.items():
        slurm_launch(cli, spec_file, "--run-dir", f"runs/{name}", *flags, "--sbatch=--exclusive")
        run_dir = workdir / "runs" / name
        plan = json.loads((run_dir / "manifest.json").read_text())["plan"]
        assert plan["slurm"]["stop_warning_s"] == warning, name
        script = (run_dir / "job.sbatch").read_text()
        srun = next(c["argv"] for c in plan["commands"] if c["argv"][0] == "srun")
        at = srun.index("turbo_dllm.jobs.backends.slurm_step")
        assert srun[at - 1 : at + 4] == [
            "-m",
            "turbo_dllm.jobs.backends.slurm_step",
            sys.executable,
            "-m",
            "torch.distributed.run",
        ]
        if warning is None:
            assert "#SBATCH --signal" not in script, name
        else:
            directive = f"#SBATCH --signal=USR1@{warning}\n"
            assert directive in script, name
            assert script.index(directive) < script.index("#SBATCH --exclusive\n")


def test_a_job_stopped_on_the_warning_says_how_to_continue(cli, spec_file, workdir):
    """slurm_step ends with 143 once the workers saved the step under way: the script says the
    run stopped before its time limit and how to continue it, and records 143."""
    slurm_launch(cli, spec_file, "--run-dir", "runs/warned", "--time", "1:00:00")
    run_dir = workdir / "runs" / "warned"
    bin_dir = workdir / "bin"
    fake_command(bin_dir, "scontrol", "echo node7\n")
    fake_command(bin_dir, "srun", "exit 143\n")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_ID": "78",
        "SLURM_JOB_NODELIST": "node7",
    }
    saved_step(run_dir)  # the workers' save (without one: test_slurm_stop_before_first_step)
    proc = subprocess.run(["bash", run_dir / "job.sbatch"], env=env, capture_output=True, text=True)
    assert proc.returncode == 143, proc.stderr
    assert "dllm: run warned stopped before its time limit" in proc.stderr
    assert f"continue it from there with: sbatch {run_dir / 'job.sbatch'}" in proc.stderr
    assert json.loads((run_dir / "result.json").read_text())["exit_code"] == 143
