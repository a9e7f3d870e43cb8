"""A launch writes its run's spec.yaml in UTF-8 as the user wrote the names: a run dir
"runs/数据 é" read `"runs/\\u6570\\u636E \\xE9"` there (the file a user opens to launch the
spec again with changes). The file still loads to the recorded spec."""

from __future__ import annotations

import json

import yaml


def test_the_run_s_spec_yaml_keeps_non_ascii_names_readable(cli, spec_file, workdir):
    # long, with spaces: YAML folded such a path over two lines past 80 columns (the first
    # CI of this test, whose temp path was longer than the author's, failed on that)
    run = workdir / "runs" / " ".join(["数据 é"] * 12)
    # a SLURM script that is not submitted: the run dir is written, nothing runs
    result = cli("launch", "--config", spec_file, "--backend", "slurm", "--run-dir", run)
    assert result.code == 0, result.err
    text = (run / "spec.yaml").read_bytes().decode("utf-8")
    assert f"run_dir: {run}\n" in text
    assert "\\u" not in text and "\\x" not in text
    manifest = json.loads((run / "manifest.json").read_text())
    assert yaml.safe_load(text) == manifest["spec"]
