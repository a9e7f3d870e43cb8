"""`--sbatch` lines read as sbatch reads them: getopt_long takes an unambiguous prefix of a long
option for it (`--ntasks-per-n=2` is --ntasks-per-node) and refuses an ambiguous one (`--node=2`:
--nodefile, --nodelist, --nodes), short options share a word (`-vN 2` is -v -N 2), and a value
left off takes the next #SBATCH line's first word. The guard checked exact names only: such
lines passed it, and sbatch then ran another allocation than the plan's or refused the script
once the run dir held it. Each case is held to real sbatch (a one-node cluster)."""

from __future__ import annotations

import pytest

from tests.helpers import assert_user_error

REFUSED = [
    # sbatch: "option '--node=2' is ambiguous; possibilities: '--nodefile' '--nodelist' ..."
    ("--node=2", ["reads --node as a prefix of 3 options (--nodefile, --nodelist, --nodes)"]),
    ("--ntask=2", ["reads --ntask as a prefix of 6 options", "write the option's whole name"]),
    ("--tim=10", ["(--time, --time-min)"]),
    ("--acc=x", ["(--account, --acctg-freq)"]),
    # a unique prefix is the option itself, which the plan sets
    ("--ntasks-per-n=2", ["the plan sets --ntasks-per-node itself (sbatch reads --ntasks-per-n"]),
    ("--cpus-per-t=2", ["the plan sets --cpus-per-task", "use dllm launch --cpus-per-task"]),
    ("--accou=x", ["the plan sets --account", "use dllm launch --account"]),
    ("--part=debug", ["the plan sets --partition", "use dllm launch --partition"]),
    ("--arr=0-1", ["the plan sets --array"]),
    ("--gpus-per-n=1", ["the plan sets --gpus-per-node", "use dllm launch --gpus-per-node"]),
    # sbatch's other name for --ntasks-per-node
    ("--tasks-per-node=2", ["the plan sets --tasks-per-node", "one task per node"]),
    # short options in one word
    ("-vN 2", ["the plan sets -N itself (sbatch reads -vN as -N)", "--nnodes"]),
    ("-Qc2", ["the plan sets -c itself", "--cpus-per-task"]),
    # a value left off: sbatch reads the next line's first word as it (or refuses the script)
    ("--comment", ["--comment takes a value, and this line gives none", "--comment=VALUE"]),
    ("--hold -d", ["-d takes a value", "'-d VALUE'"]),
    # a word after an option that takes none is no value of it
    ("--exclusive foo", ["'foo' is no sbatch option"]),
]


@pytest.mark.parametrize(("line", "needles"), REFUSED, ids=[line for line, _ in REFUSED])
def test_abbreviated_and_grouped_options_are_read_as_sbatch_reads_them(
    cli, spec_file, workdir, line, needles
):
    run_dir = workdir / "r"
    result = cli(
        "launch", "--config", spec_file, "--backend", "slurm", "--run-dir", run_dir,
        f"--sbatch={line}",
    )  # fmt: skip
    assert_user_error(result, *needles)
    assert not run_dir.exists()


ACCEPTED = [
    "--exclus", "--comm=x", "-dsingleton", "-vd singleton", "--comment -N", "--hold --wait"
]  # fmt: skip


@pytest.mark.parametrize("line", ACCEPTED)
def test_what_sbatch_takes_is_taken(cli, spec_file, workdir, slurm_cluster, line):
    """A unique prefix of an option the plan does not set, short options sharing a word, and a
    value that looks like an option (-N as a comment) make a script sbatch takes."""
    run_dir = workdir / "r"
    result = cli(
        "launch", "--config", spec_file, "--backend", "slurm", "--run-dir", run_dir,
        f"--sbatch={line}",
    )  # fmt: skip
    assert result.code == 0, result.err
    proc = slurm_cluster.run("sbatch", "--test-only", str(run_dir / "job.sbatch"))
    assert proc.returncode == 0, proc.stderr
    if line != "--exclus":  # --exclusive: the whole node
        assert "using 1 processors" in proc.stderr  # the plan's one task with one CPU


def test_what_is_refused_is_what_sbatch_refuses_or_reads_as_another_job(workdir, slurm_cluster):
    """The refused lines above after the plan's own (one node, one task, one CPU), checked
    against real sbatch: it refuses the script, or runs another allocation than the plan's."""
    script = workdir / "s.sbatch"
    plan = ("--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=1")

    def test_only(*lines: str):
        text = "".join(f"#SBATCH {x}\n" for x in (*plan, *lines))
        script.write_text("#!/bin/bash\n" + text + "true\n")
        return slurm_cluster.run("sbatch", "--test-only", str(script))

    assert "using 1 processors" in test_only().stderr
    for line in ("--node=2", "--ntask=2", "--tim=10", "--acc=x"):
        proc = test_only(line)
        assert proc.returncode != 0 and "is ambiguous" in proc.stderr, line
    for line in ("--ntasks-per-n=2", "--tasks-per-node=2", "--cpus-per-t=2", "-Qc2"):
        proc = test_only(line)
        assert proc.returncode == 0 and "using 2 processors" in proc.stderr, line
    two_nodes = test_only("-vN 2")  # -v -N 2: the one node's cluster has no two
    assert "Requested node configuration is not available" in two_nodes.stdout + two_nodes.stderr
    assert test_only("--part=debug", "--partition=nope").returncode != 0  # --part is --partition
    assert test_only("--job-name").returncode != 0  # "option requires an argument"
    # ... and before another line it takes that line's first word (here the job's name)
    assert "using 1 processors" in test_only("--job-name", "--ntasks-per-node=2").stderr
    assert "using 2 processors" in test_only("--ntasks-per-node=2").stderr
    assert "is ambiguous" in test_only("--excl").stderr  # --exclude, --exclusive
    assert "Invalid directive" in test_only("--exclusive foo").stderr
    for line in ACCEPTED:
        assert test_only(line).returncode == 0, line
