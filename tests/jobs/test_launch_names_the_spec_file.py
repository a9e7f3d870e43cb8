"""`dllm launch` names the spec file in a process-count mismatch, as `dllm config validate`
does. Before, launch said "RunSpec has 1 problem" where validate said "conf/train.yaml has 1
problem"."""

from __future__ import annotations

import pytest

from tests.helpers import assert_user_error


@pytest.mark.parametrize("dry", [("--dry-run",), ()])
def test_a_process_count_mismatch_names_the_spec_file_as_validate_does(
    cli, spec_file, workdir, dry
):
    (workdir / "conf").mkdir()
    spec_file.rename(workdir / "conf" / "train.yaml")
    validate = cli("config", "validate", "--config", "conf/train.yaml", "--world-size", "2")
    assert_user_error(validate, "dllm: error: conf/train.yaml has 1 problem:\n")
    launch = cli("launch", "--config", "conf/train.yaml", "--nproc-per-node", "2", *dry)
    assert_user_error(launch, "dllm: error: conf/train.yaml has 1 problem:\n", "topology.dp=2")
    assert "RunSpec" not in launch.err
    assert not (workdir / "runs").exists()
