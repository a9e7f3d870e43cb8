"""`dllm run diff` of runs whose ids also stand as words in paths they share: runs `a` and `b`
under a folder named `x-b` showed `/tmp/.../x-<run_id>/...` for every shared path of run b
(each run's id was replaced wherever it stood as a word), and so listed paths that are the same
in both runs as differences."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.jobs.conftest import SMALL_SPEC


@pytest.mark.parametrize("folder", ["x-b", "x-a", "a-b"])
def test_paths_both_runs_share_are_no_difference(cli, workdir, monkeypatch, folder):
    from turbo_dllm.jobs import provenance

    code = provenance.code_version()  # others may edit this checkout between the two launches
    monkeypatch.setattr(provenance, "code_version", lambda: dict(code))
    home = workdir / folder
    home.mkdir()
    monkeypatch.chdir(home)
    (home / "train.yaml").write_text(textwrap.dedent(SMALL_SPEC))
    for name, extra in (("a", []), ("b", ["--set", "training.steps=6"])):
        launched = cli(
            "launch", "--config", "train.yaml", "--backend", "slurm", "--nproc-per-node", "1",
            "--run-dir", f"runs/{name}", *extra,
        )  # fmt: skip
        assert launched.code == 0, launched.err

    diff = json.loads(cli("run", "diff", "a", "b", "--json").out)["diff"]
    assert [item["field"] for item in diff["spec"]] == ["spec.training.steps"], diff["spec"]
    # The plan's fields that name each run (its dir, job name, rendezvous id) differ only by
    # the run: none is listed, and nothing shows a placeholder.
    assert diff["plan"] == [], diff["plan"]
    assert "<run_id>" not in json.dumps(diff) and "<run_dir>" not in json.dumps(diff)
    assert [item["field"] for item in diff["run"]][:2] == ["run_dir", "run_id"]
