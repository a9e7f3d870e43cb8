"""A launch that starts (or writes) its job prints the plan's notes, as `--dry-run` and `dllm
run show` do: before, a real launch said nothing of them (a tensor-parallel group across nodes,
CPUs oversubscribed, a SLURM job asking for CPUs only)."""

from __future__ import annotations


def test_a_launch_prints_the_notes_its_dry_run_prints(cli, spec_file, workdir):
    argv = ["launch", "--config", spec_file, "--backend", "slurm", "--nproc-per-node", "1"]
    dry = cli(*argv, "--run-dir", "runs/dry", "--dry-run")
    assert dry.code == 0, dry.err
    notes = [line.split("note", 1)[1].strip() for line in dry.out.splitlines()
             if line.startswith("note ")]  # fmt: skip
    assert any(note.startswith("slurm: no GPU on this host") for note in notes), dry.out

    launched = cli(*argv, "--run-dir", "runs/real")
    assert launched.code == 0, launched.err
    for note in notes:
        assert f"dllm: note: {note}\n" in launched.err, launched.err
