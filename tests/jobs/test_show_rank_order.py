"""`dllm run show` lists each rank's coordinates in the mesh's order, as the dry run of the same
plan does (the manifest stores them with sorted keys, and show printed them alphabetically:
`clean_replica0 cp0 dp_replicate0 ...` against the dry run's `dp_replicate0 dp_shard0 ...`)."""

from __future__ import annotations


def _rank_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("rank ")]


def test_show_lists_rank_coordinates_as_the_dry_run_does(cli, spec_file, workdir):
    launch = ("launch", "--config", spec_file, "--backend", "slurm", "--run-dir", "runs/r")
    dry = cli(*launch, "--dry-run")
    assert dry.code == 0, dry.err
    assert cli(*launch).code == 0  # a SLURM launch without --submit writes the run, runs nothing
    shown = _rank_lines(cli("run", "show", "r").out)
    assert shown == _rank_lines(dry.out)
    assert shown[0].split()[-5:] == ["dp_replicate0", "dp_shard0", "clean_replica0", "cp0", "tp0"]
