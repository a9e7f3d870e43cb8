"""`dllm run list --root` pointed at the wrong folder says what it holds: a run dir itself
(`--root runs/<id>`) read "no recorded runs"; a folder of data artifacts (`--root data`) named
each artifact a run "with a record that cannot be read"."""

from __future__ import annotations

import json


def test_a_root_that_is_a_run_dir_names_the_run_and_its_folder(cli, spec_file, workdir):
    assert (
        cli("launch", "--config", spec_file, "--backend", "slurm", "--run-dir", "runs/s").code == 0
    )
    listed = cli("run", "list", "--root", "runs/s")
    assert listed.code == 0, listed.err
    assert (
        f"runs/s is a run dir itself, not a folder of runs: dllm run show runs/s (its folder: "
        f"--root {workdir / 'runs'})"
    ) in listed.out


def test_data_artifacts_are_not_named_unreadable_runs(cli, workdir):
    artifact = workdir / "data" / "prepared"
    artifact.mkdir(parents=True)
    (artifact / "manifest.json").write_text(json.dumps({"format": "turbo_dllm.data.v1"}))
    torn = workdir / "data" / "torn"
    torn.mkdir()
    (torn / "manifest.json").write_text("{")  # a torn record is still named
    listed = cli("run", "list", "--root", "data")
    assert "data artifacts, not runs (`dllm data inspect`): prepared" in listed.out, listed.out
    assert "cannot be read (manifest.json" in listed.out and ": torn\n" in listed.out
    assert json.loads(cli("run", "list", "--root", "data", "--json").out)[
        "unreadable_manifest"
    ] == ["data/torn"]
