"""A run dir that is a file, or whose path goes through one, is refused with the other run dir
problems, a dry run too. Before, the dry run printed a plan and a start line ("to run it (paste
into bash)") for a run dir that can never be made, and that line was then refused by the
launch's readiness checks."""

from __future__ import annotations

import json

import pytest

from tests.helpers import assert_user_error


@pytest.mark.parametrize("dry", [("--dry-run",), ("--dry-run", "--json"), ()])
@pytest.mark.parametrize("where", ["taken", "taken/run"])
def test_a_run_dir_through_a_file_is_refused(cli, spec_file, workdir, dry, where):
    (workdir / "taken").write_text("a file")
    result = cli("launch", "--config", spec_file, "--run-dir", where, *dry)
    detail = (
        "it is a file, not a folder"
        if where == "taken"
        else f"the path goes through {workdir / 'taken'}, which is a file, not a folder"
    )
    assert_user_error(
        result,
        f"dllm: error: cannot create run dir {workdir / where}: {detail}\n",
        f"hint: move the file {workdir / 'taken'} out of the way, or pass another --run-dir",
    )
    if "--json" in dry:
        assert set(json.loads(result.out)) == {"error", "hint"}
    else:
        assert result.out == ""
    assert (workdir / "taken").read_text() == "a file"
    assert sorted(p.name for p in workdir.iterdir()) == ["taken", "train.yaml"]
