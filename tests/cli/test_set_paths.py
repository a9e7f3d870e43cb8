"""A relative path given with `--set` is the shell's (taken against the current folder, as any
command-line path), one written in the YAML file is the file's (taken against its folder).
`dllm train --config runs/a/spec.yaml --set checkpoint.resume=runs/b/checkpoints` run from the
project folder looked for runs/a/runs/b/checkpoints and refused it as missing."""

from __future__ import annotations

import copy

import yaml

from tests.train.util import TINY, tiny_spec
from turbo_dllm.config.load import load_runspec


def _spec_file(folder, **sections):
    document = copy.deepcopy(TINY)
    for section, fields in sections.items():
        document.setdefault(section, {}).update(fields)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.yaml").write_text(yaml.safe_dump(document))
    return folder / "train.yaml"


def test_set_paths_are_taken_against_the_current_folder_and_file_paths_against_the_file(
    tmp_path, monkeypatch
):
    config = _spec_file(tmp_path / "runs/a", checkpoint={"dir": "ckpt"})
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    spec = load_runspec(
        config,
        [
            "checkpoint.resume=runs/b/checkpoints",
            "launch.run_dir=runs/c",
            "model.from_config=shapes/model.json",
        ],
    )
    here = tmp_path / "here"
    assert spec.checkpoint.resume == str(here / "runs/b/checkpoints")
    assert spec.launch.run_dir == str(here / "runs/c")
    assert spec.model.from_config == str(here / "shapes/model.json")
    assert spec.checkpoint.dir == str(tmp_path / "runs/a/ckpt")  # written in the file
    # Whole sections set from the command line are the shell's too; names are not paths.
    spec = load_runspec(config, ["checkpoint={resume: ../b, dir: out}", "model.from_config=tiny"])
    assert spec.checkpoint.resume == str(tmp_path / "b")
    assert spec.checkpoint.dir == str(here / "out")
    assert spec.model.from_config == "tiny"
    assert load_runspec(config, ["checkpoint.resume=never"]).checkpoint.resume == "never"


def test_train_resumes_from_a_set_path_relative_to_the_current_folder(cli, tmp_path, monkeypatch):
    from turbo_dllm.train.entry import train

    args = ("training.steps=2", "checkpoint.interval=2")
    train(tiny_spec(*args), tmp_path / "runs/a")
    config = _spec_file(tmp_path / "configs", training={"steps": 3}, checkpoint={"interval": 2})
    monkeypatch.chdir(tmp_path)
    result = cli(
        "train", "--config", config.relative_to(tmp_path), "--run-dir", "runs/b",
        "--set", "checkpoint.resume=runs/a/checkpoints",
    )  # fmt: skip
    assert result.code == 0, result.err
    assert f"resumed from {tmp_path / 'runs/a/checkpoints/step_00000002'} (step 2)" in result.err
