"""A run dir whose name is not UTF-8 (a Latin-1 folder `caf\\xe9`, which Python reads with a
lone surrogate) is refused before anything is written. The launch wrote its manifest and
spec.yaml anyway, escaped, and every worker then refused that manifest ("unable to parse raw
data as a unicode string"): the run failed with exit 2 and left its run dir behind."""

from __future__ import annotations

import os

import pytest

from tests.helpers import assert_user_error


@pytest.mark.parametrize("dry", [(), ("--dry-run",)])
def test_a_run_dir_that_is_not_utf8_is_refused_before_anything_is_written(
    cli, spec_file, workdir, dry
):
    run_dir = os.fsdecode(b"runs/caf\xe9")
    result = cli("launch", "--config", spec_file, "--backend", "slurm", "--run-dir", run_dir, *dry)
    assert_user_error(result, "not valid UTF-8", "spec.launch.run_dir", "caf\\udce9", "rename")
    assert not (workdir / "runs").exists()
