"""Run dir flags as a shell hands them over. `--run-dir=~/runs/a` reaches dllm as it is (bash
expands no `~` after `=`): `~` is the home folder there, as in a spec's launch.run_dir (the
launch made a folder named `~` in the current one, and `dllm train` trained into it). And
`--run-dir "$DIR"` with DIR unset is an empty value, refused."""

from __future__ import annotations

import json

from tests.helpers import assert_user_error


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


def test_an_empty_run_dir_is_refused_not_dropped(cli, spec_file, workdir):
    """`--run-dir "$DIR"` with DIR unset: a launch took a fresh runs/<stamp>-<id> without a
    word, and `dllm train` trained into the current folder (checkpoints/, metrics.jsonl)."""
    for flag in ("--run-dir", "--run-root"):
        result = cli("launch", "--config", spec_file, flag, "", "--dry-run")
        assert_user_error(result, f"{flag} is empty (an unset shell variable?)")
    result = cli("train", "--config", spec_file, "--run-dir", "")
    assert_user_error(result, "--run-dir is empty (an unset shell variable?)")
    assert sorted(p.name for p in workdir.iterdir()) == ["train.yaml"]


def test_an_empty_config_or_manifest_is_refused(cli, spec_file, workdir):
    """`--manifest ""` read as no --manifest: a launch of no config, ending in a traceback."""
    for flag in ("--manifest", "--config"):
        for extra in ((), ("--dry-run",)):
            result = cli("launch", flag, "", *extra)
            assert_user_error(result, f"{flag} is empty (an unset shell variable?)")
    assert sorted(p.name for p in workdir.iterdir()) == ["train.yaml"]


def test_a_replay_of_a_moved_run_goes_next_to_where_the_run_is_now(cli, spec_file, workdir):
    """A run dir moved (an archive) or copied from another host: the replay's default run dir
    was next to where the run had been recorded, making that folder again (or failing where it
    cannot be made). It goes next to the run dir the manifest is in; a manifest kept on its own
    (its folder not the run's) still replays next to the recorded run dir."""
    import shutil

    result = cli("launch", "--config", spec_file, "--run-dir", workdir / "old" / "runs" / "a")
    assert result.code == 0, result.err
    (workdir / "archive").mkdir()
    shutil.move(workdir / "old" / "runs" / "a", workdir / "archive" / "a")
    shutil.rmtree(workdir / "old")
    args = ("--dry-run", "--json", "--allow-drift")
    result = cli("launch", "--manifest", workdir / "archive" / "a" / "manifest.json", *args)
    assert result.code == 0, result.err
    assert json.loads(result.out)["plan"]["run_dir"].startswith(f"{workdir / 'archive'}/")
    result = cli("launch", "--manifest", workdir / "archive" / "a", *args)  # the folder too
    assert json.loads(result.out)["plan"]["run_dir"].startswith(f"{workdir / 'archive'}/")
    assert not (workdir / "old").exists()
    (workdir / "loose").mkdir()
    shutil.copy(workdir / "archive" / "a" / "manifest.json", workdir / "loose")
    result = cli("launch", "--manifest", workdir / "loose" / "manifest.json", *args)
    assert result.code == 0, result.err
    assert json.loads(result.out)["plan"]["run_dir"].startswith(f"{workdir / 'old' / 'runs'}/")
