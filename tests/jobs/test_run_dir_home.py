"""A run dir flag written `--run-dir=~/runs/a` reaches dllm as it is (bash expands no `~` after
`=`): `~` is the home folder there, as in a spec's launch.run_dir. The launch made a folder
named `~` in the current one (and `dllm train` trained into it)."""

from __future__ import annotations

import json


def test_a_launch_s_run_dir_and_run_root_start_at_home(cli, spec_file, workdir, monkeypatch):
    home = workdir / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    result = cli("launch", "--config", spec_file, "--run-dir=~/runs/a", "--dry-run", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["plan"]["run_dir"] == str(home / "runs" / "a")
    result = cli("launch", "--config", spec_file, "--run-root=~/runs", "--dry-run", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["plan"]["run_dir"].startswith(f"{home / 'runs'}/")
    assert cli("launch", "--config", spec_file, "--run-dir=~/runs/b").code == 0
    assert (home / "runs" / "b" / "manifest.json").is_file()
    assert not (workdir / "~").exists()


def test_dllm_train_s_run_dir_starts_at_home(cli, spec_file, workdir, monkeypatch):
    home = workdir / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    result = cli("train", "--config", spec_file, "--run-dir=~/t")
    assert result.code == 0, result.err
    assert (home / "t" / "metrics.jsonl").is_file()
    assert not (workdir / "~").exists()
